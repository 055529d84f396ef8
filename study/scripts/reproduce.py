"""Rerun the paper reproduction: ``python -m probe.sweep study/sweeps/reproduction.toml --out runs`` (more arguments
pass on, e.g. ``--seeds 0 1 2 3 4`` or ``--executor ray``); then ``python study/scripts/ship.py``."""

import sys

from probe.sweep.cli import main

sys.exit(main(["study/sweeps/reproduction.toml", "--out", "runs", *sys.argv[1:]]))
