"""What one training step costs in the transformers hybrids against probe's own 2-block hybrid of the same width.

Usage: ``python benchmarks/hf_train_step.py [--steps 10] [--width 128] [--batch 32] [--length 40] [--threads 1]``.
Each model is the one ``python -m probe.train`` trains for its preset (``hybrid-joint``, ``hf-recurrentgemma-joint``,
``hf-jamba-joint``, ``hf-falcon-h1-joint``; probe/external.py states the transformers configs) at the given width.
A step is what the trainer does: forward on one fixed batch (``--batch`` sequences of ``--length`` stream tokens),
cross-entropy, backward, gradient clipping, AdamW. Steps are interleaved across the models (one step of each in turn)
so that machine noise hits all alike; two warm-up rounds are dropped; medians are printed, with the ratio to probe's
hybrid.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from probe.tasks import IGNORE_INDEX
from probe.train import Trainer, build_configs

PRESETS = ("hybrid-joint", "hf-recurrentgemma-joint", "hf-jamba-joint", "hf-falcon-h1-joint")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model (after 2 warm-up steps)")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    trainers = {}
    for preset in PRESETS:
        model_cfg, task, cfg = build_configs(preset, overrides=[f"model.d_model={args.width}"])
        trainers[preset] = Trainer(model_cfg, task, cfg, tempfile.mkdtemp(), progress=False)
    batch = task.sample(args.length, args.batch, 0)

    def step(trainer: Trainer) -> float:
        t0 = time.perf_counter()
        trainer.model.train()
        trainer.optimizer.zero_grad(set_to_none=True)
        logits = trainer.model(batch.tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.cfg.grad_clip)
        trainer.optimizer.step()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {p: [] for p in PRESETS}
    for i in range(args.steps + 2):
        for preset, trainer in trainers.items():
            took = step(trainer)
            if i >= 2:
                times[preset].append(took)
    base = statistics.median(times[PRESETS[0]])
    print(f"one training step, batch {args.batch} x length {args.length}, width {args.width}, "
          f"{args.threads} thread(s), torch {torch.__version__}; median of {args.steps} interleaved steps")
    print(f"{'model':<26} {'parameters':>10} {'step (ms)':>10} {'x hybrid':>9}")
    for preset, trainer in trainers.items():
        n = sum(p.numel() for p in trainer.model.parameters())
        median = statistics.median(times[preset])
        print(f"{preset:<26} {n:>10,} {1000 * median:>10.1f} {median / base:>9.2f}")


if __name__ == "__main__":
    main()
