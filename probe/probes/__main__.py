"""``python -m probe.probes``."""

from probe.probes.cli import main

raise SystemExit(main())
