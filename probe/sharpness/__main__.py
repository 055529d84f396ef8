"""``python -m probe.sharpness``."""

import sys

from probe.sharpness.cli import main

sys.exit(main())
