"""What one training step of a bridged hybrid costs against probe's own 2-block hybrid of the same width.

Usage: ``python benchmarks/bridge_step.py [--steps 10] [--threads 1] [--presets bridge-jamba-dat,...]``; an entry of
``--presets`` may carry ``probe.train --set`` overrides after spaces, e.g. ``"bridge-nemotron-h-dat model.arch=bamba"``
for a bridged architecture that has no preset of its own.
Each model is the one ``python -m probe.train`` trains for its preset (``hybrid-dat`` and every ``bridge-*-dat`` preset,
``bridge-nemotron-h-lstm-dat``'s nn.LSTM in Nemotron-H's layout among them: width 128, 2 layers;
``probe.bridge.ARCHS`` states the transformers configs). A step is the trainer's own
(``Trainer.train_step``): the batch of that step (lengths drawn from 1..L_train, batch 64), the schedule's gate and
trainable parameters, forward, cross-entropy, backward, gradient clipping, AdamW. Each step index is run by every
model in turn (A B C D A B C D ...), so all see the same batch and machine noise hits all alike; two warm-up rounds
are dropped; medians are printed, with the ratio to probe's hybrid, in both phases of DAT: delayed (attention gate 0,
attention held out of the optimizer) and after the switch (every parameter trains).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
import warnings

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from probe.training import PRESETS, Trainer, build_configs  # noqa: E402

BASE = "hybrid-dat"
BRIDGED = tuple(name for name in PRESETS if name.startswith("bridge-") and name.endswith("-dat"))


def timed_steps(trainers: dict[str, Trainer], first: int, steps: int) -> dict[str, float]:
    """The median seconds of ``Trainer.train_step`` per trainer over step indices first + 2 .. first + 2 + steps,
    interleaved (after two warm-up rounds)."""
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for i in range(steps + 2):
        for name, trainer in trainers.items():
            t0 = time.perf_counter()
            trainer.train_step(first + i)
            if i >= 2:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model and phase (after 2 warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--presets", default=",".join(BRIDGED),
                        help="the bridged presets, comma-separated; each may add --set overrides after spaces")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    names = [BASE, *args.presets.split(",")]
    trainers = {}
    for name in names:
        preset, *overrides = name.split()
        model_cfg, task, cfg = build_configs(preset, overrides=overrides)
        with contextlib.redirect_stderr(io.StringIO()):
            trainers[name] = Trainer(model_cfg, task, cfg, tempfile.mkdtemp(), progress=False)
    switch = trainers[BASE].schedule.switch_step
    phases = {"delayed": timed_steps(trainers, 0, args.steps),
              "attention on": timed_steps(trainers, switch, args.steps)}
    cfg = trainers[BASE].cfg
    print(f"one training step (Trainer.train_step), batch {cfg.batch_size}, lengths 1..{task.train_length} (+ the "
          f"dictionary prefix), {args.threads} thread(s), torch {torch.__version__}; median of {args.steps} "
          "interleaved steps per phase")
    width = max(map(len, trainers))
    print(f"{'preset':<{width}} {'parameters':>10} {'delayed (ms)':>13} {'x hybrid':>9} {'on (ms)':>9} {'x hybrid':>9}")
    for name, trainer in trainers.items():
        n = sum(p.numel() for p in trainer.model.parameters())
        cells = [f"{1000 * phases[p][name]:>{w}.1f} {phases[p][name] / phases[p][BASE]:>9.2f}"
                 for p, w in (("delayed", 13), ("attention on", 9))]
        print(f"{name:<{width}} {n:>10,} {' '.join(cells)}")


if __name__ == "__main__":
    main()
