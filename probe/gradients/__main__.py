"""``python -m probe.gradients``."""

import sys

from probe.gradients.cli import main

sys.exit(main())
