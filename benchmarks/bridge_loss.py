"""The training loss of a run before and after: the step-0 snapshot and ``final.pt`` on the same held-out batches.

Usage: ``python benchmarks/bridge_loss.py RUN_DIR [--batches 8] [--batch-size 64]``. ``RUN_DIR`` is what
``python -m probe.train --out RUN_DIR`` wrote (``trajectory/step_000000.pt`` and ``final.pt``). Each batch is drawn as
the trainer draws one (``probe.training.batches.training_batch``: a length uniform in 1..L_train, then the batch) from
seeds 10**9 + i, which no training step draws (a step's seed is train.seed * 1000003 + step); the loss is the mean
cross-entropy over the labelled positions of every batch, with the attention gate each checkpoint was saved with.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from probe.checkpoint import load_checkpoint  # noqa: E402
from probe.training.batches import training_batch  # noqa: E402

HELD_OUT = 10**9
"""The first held-out batch seed: above any step's seed of a run seeded below 999."""


@torch.no_grad()
def mean_loss(path: Path, batches: int, batch_size: int) -> float:
    """The mean cross-entropy of the checkpoint at ``path`` over ``batches`` held-out training-distribution batches."""
    ckpt = load_checkpoint(path)
    model, task = ckpt.build_model("cpu").eval(), ckpt.task_config
    losses = [float(model(b.tokens, b.labels, return_type="loss"))
              for b in (training_batch(task, batch_size, HELD_OUT + i) for i in range(batches))]
    return sum(losses) / len(losses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    for name in ("trajectory/step_000000.pt", "final.pt"):
        print(f"{name:<28} {mean_loss(args.run / name, args.batches, args.batch_size):.3f}")


if __name__ == "__main__":
    main()
