"""``python -m probe.sweep``."""

import sys

from probe.sweep.cli import main

sys.exit(main())
