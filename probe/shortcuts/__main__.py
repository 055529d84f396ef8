"""``python -m probe.shortcuts``."""

import sys

from probe.shortcuts.cli import main

sys.exit(main())
