"""Forward+backward time of each recurrent cell as a hooked sublayer, side by side with a plain ``nn.LSTM``.

Usage: ``python benchmarks/cells_speed.py [--reps 15] [--threads 1] [--batch 64] [--d-model 128] [--lengths 25 100]``.
For each length, every cell (``HookedLSTM``, ``HookedGRU``, ``HookedSSM`` positive / negative / complex, at its
default size: ``ssm_state = d_model``) runs forward and backward on one random input with no hook attached (the
path training takes), next to ``nn.LSTM(d_model, d_model)`` (and a plain ``nn.GRU``, which shows what of the GRU's
time is PyTorch's kernel); repetitions are interleaved, and the median of each is
printed with its ratio to ``nn.LSTM``. The target is a ratio of at most 2. Not a timed test: timings depend on the
machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from probe.models import HookedGRU, HookedLSTM, HookedSSM


def cells(d_model: int) -> dict[str, nn.Module]:
    """The sublayers to time, by name; the plain ``nn.LSTM`` first (the reference)."""
    return {
        "nn.LSTM (reference)": nn.LSTM(d_model, d_model, batch_first=True),
        "lstm": HookedLSTM(d_model),
        "nn.GRU (plain kernel)": nn.GRU(d_model, d_model, batch_first=True),
        "gru": HookedGRU(d_model),
        "ssm positive": HookedSSM(d_model, kind="positive"),
        "ssm negative": HookedSSM(d_model, kind="negative"),
        "ssm complex": HookedSSM(d_model, kind="complex"),
    }


def forward_backward(module: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        out = module(x)
        out = out[0] if isinstance(out, tuple) else out
        out.square().mean().backward()
    return run


def time_cells(batch: int, d_model: int, length: int, reps: int) -> dict[str, float]:
    """Median forward+backward seconds of each cell at one length (interleaved repetitions, one warm-up)."""
    torch.manual_seed(0)
    modules = cells(d_model)
    x = torch.randn(batch, length, d_model, requires_grad=True)
    runs = {name: forward_backward(m, x) for name, m in modules.items()}
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--lengths", type=int, nargs="+", default=[25, 100])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"forward+backward, batch {args.batch}, d_model {args.d_model}, {args.threads} thread(s), "
          f"median of {args.reps}; torch {torch.__version__}")
    for length in args.lengths:
        times = time_cells(args.batch, args.d_model, length, args.reps)
        reference = times["nn.LSTM (reference)"]
        print(f"\nL = {length}")
        print(f"  {'cell':<22}{'ms':>9}{'x nn.LSTM':>11}")
        for name, seconds in times.items():
            print(f"  {name:<22}{1e3 * seconds:>9.1f}{seconds / reference:>11.2f}")


if __name__ == "__main__":
    main()
