"""Forward+backward time of the hooked hybrid (HookPoints, no hooks attached) vs its plain-PyTorch twin.

Usage: ``python benchmarks/hook_overhead.py [--reps 30] [--threads 1]``. Interleaved repetitions in one process,
median of each; prints the ratio (target <= 1.05x).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from plain_twin import plain_forward  # noqa: E402

from probe.models import HookedSequenceModel, ModelConfig  # noqa: E402
from probe.tasks import IGNORE_INDEX, make_task  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = make_task("interleaved")
    torch.manual_seed(0)
    model = HookedSequenceModel(ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=128, n_layers=2))
    batch = task.sample(args.length, args.batch, 0)

    def step(forward) -> float:
        t0 = time.perf_counter()
        logits = forward(batch.tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    hooked_fn, plain_fn = model, lambda x: plain_forward(model, x)
    torch.testing.assert_close(hooked_fn(batch.tokens), plain_fn(batch.tokens))
    for _ in range(3):
        step(hooked_fn), step(plain_fn)
    hooked, plain = [], []
    for i in range(args.reps):
        order = (hooked_fn, plain_fn) if i % 2 == 0 else (plain_fn, hooked_fn)
        for fn in order:
            (hooked if fn is hooked_fn else plain).append(step(fn))
    h, p = statistics.median(hooked), statistics.median(plain)
    print(f"hybrid d_model 128 x 2 blocks, batch {args.batch}, stream length {args.length} "
          f"(+{task.prefix_len} prefix), {args.threads} thread(s), {args.reps} interleaved reps")
    print(f"  hooked (no hooks attached): {1000 * h:8.2f} ms median forward+backward")
    print(f"  plain PyTorch twin:         {1000 * p:8.2f} ms median forward+backward")
    print(f"  ratio hooked / plain:       {h / p:8.3f}x (target <= 1.05x)")


if __name__ == "__main__":
    main()
