"""``python -m probe.train``: train one run. The training core lives in ``probe.training``; the names below are
importable from here as well, since scripts, notebooks and benchmarks import them from ``probe.train``."""

from __future__ import annotations

import sys

from probe.schedules.settings import ScheduleConfig
from probe.training.batches import train_batch_seed, training_batch
from probe.training.cli import main
from probe.training.config import OPTIMIZER_IMPLS, PRECISIONS, TrainConfig, lr_at
from probe.training.overrides import build_configs, override_configs
from probe.training.presets import PRESETS
from probe.training.schedule import Schedule
from probe.training.trainer import Trainer, config_diff, train

__all__ = ["OPTIMIZER_IMPLS", "PRECISIONS", "PRESETS", "Schedule", "ScheduleConfig", "TrainConfig", "Trainer",
           "build_configs", "config_diff", "lr_at", "main", "override_configs", "train", "train_batch_seed",
           "training_batch"]

if __name__ == "__main__":
    sys.exit(main())
