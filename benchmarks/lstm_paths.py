"""Forward+backward time of the hybrid's LSTM paths: fused (no hooks), cache-only, unrolled, and causal edits.

Usage: ``python benchmarks/lstm_paths.py [--reps 10] [--threads 1] [--lengths 25 100]``. For each stream length,
interleaved repetitions in one process, median of each, as a ratio to the no-hook forward+backward (the fused
kernel, what training runs):

- ``cache all hooks``: ``run_with_cache`` on every hook point (the LSTM stays fused; gates and c_t are read out);
- ``unrolled loop``: every LSTM forced onto the step-by-step loop (``force_unrolled``), no hooks;
- ``patch h at L/2``: a hook that writes block 0's ``lstm.hook_h`` at the middle position (fused, then the loop from
  that position on: two hook calls);
- ``steer h everywhere``: a hook that adds a vector to block 0's ``lstm.hook_h`` at every position (an edit that
  depends on its input: up to L + 1 passes, the worst case).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from probe.models import HookedSequenceModel, ModelConfig
from probe.tasks import IGNORE_INDEX, Batch, make_task


def time_paths(model: HookedSequenceModel, batch: Batch, reps: int) -> dict[str, float]:
    """Median forward+backward seconds of each path on ``batch``, interleaved repetitions."""
    t_mid = batch.tokens.shape[1] // 2
    clean = model.run_with_cache(batch.tokens, names_filter="blocks.0.lstm.hook_h")[1]["blocks.0.lstm.hook_h"]
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))

    def patch(a, hook):
        a[:, t_mid] = clean[:, t_mid].flip(0)  # another sequence's state
        return a

    def steer(a, hook):
        return a + direction

    def loss_of(logits):
        return F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)

    def unrolled():
        for lstm in model.lstm_layers:
            lstm.force_unrolled = True
        try:
            return model(batch.tokens)
        finally:
            for lstm in model.lstm_layers:
                lstm.force_unrolled = False

    cases = {
        "no hooks (fused)": lambda: model(batch.tokens),
        "cache all hooks": lambda: model.run_with_cache(batch.tokens)[0],
        "unrolled loop": unrolled,
        f"patch h at {t_mid}": lambda: model.run_with_hooks(batch.tokens, fwd_hooks=[("blocks.0.lstm.hook_h", patch)]),
        "steer h everywhere": lambda: model.run_with_hooks(batch.tokens, fwd_hooks=[("blocks.0.lstm.hook_h", steer)]),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for i in range(reps + 1):
        order = list(cases.items())
        for name, forward in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            loss_of(forward()).backward()
            if i:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lengths", type=int, nargs="+", default=[25, 100])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = make_task("interleaved")
    torch.manual_seed(0)
    model = HookedSequenceModel(ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=128, n_layers=2))
    for length in args.lengths:
        times = time_paths(model, task.sample(length, args.batch, 0), args.reps)
        base = times["no hooks (fused)"]
        print(f"hybrid d_model 128 x 2 blocks, batch {args.batch}, stream length {length} (+{task.prefix_len} prefix),"
              f" {args.threads} thread(s), {args.reps} interleaved reps, forward+backward")
        for name, t in times.items():
            print(f"  {name:22s} {1000 * t:9.2f} ms median   {t / base:6.2f}x fused")


if __name__ == "__main__":
    main()
