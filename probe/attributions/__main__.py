"""``python -m probe.attributions``."""

import sys

from probe.attributions.cli import main

sys.exit(main())
