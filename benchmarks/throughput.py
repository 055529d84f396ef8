"""Training throughput against this CPU's own limit: matmul peaks, FLOPs per step, and step time per speed option.

Usage: ``python benchmarks/throughput.py [--presets hybrid-joint lstm transformer] [--steps 30] [--threads 1]``.

Prints, for one core (or ``--threads``): the fp32 and bf16 matmul peaks (1024^3 ``torch.mm``), then per preset and
speed option (``TrainConfig`` fields: ``precision``, ``optimizer_impl``, ``compile``) the FLOPs of one training step
(matmuls counted by ``torch.utils.flop_counter``; the LSTM's, which the counter does not see inside the fused
kernel, from its shapes; mean over the timed batches), the median step time and the achieved fraction of the fp32
peak. Options are interleaved
step by step on the same batches, so machine noise hits them alike; the ``plain`` row is a hand-written PyTorch loop
of the same model (benchmarks/train_step.py's twin) for reference.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from probe import hardware
from probe.tasks import IGNORE_INDEX
from probe.train import Trainer, build_configs, train_batch_seed

OPTIONS: dict[str, list[str]] = {
    "fp32": [],
    "fp32+fused-adamw": ["train.optimizer_impl=fused"],
    "fp32+foreach-adamw": ["train.optimizer_impl=foreach"],
    "bf16": ["train.precision=bf16"],
    "bf16+fused-adamw": ["train.precision=bf16", "train.optimizer_impl=fused"],
    "fp32+compile": ["train.compile=true"],
}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_flags() -> list[str]:
    return sorted(hardware.cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})


def matmul_peak(dtype: torch.dtype, n: int = 1024, reps: int = 10) -> float:
    """GFLOP/s of an n^3 matrix product (best of ``reps``: the peak, not the mean)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    for _ in range(3):
        torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def step_flops(trainer: Trainer, step: int) -> tuple[float, float]:
    """(matmul FLOPs counted by torch, LSTM FLOPs from shapes) of one forward+backward at ``step``'s batch."""
    g = torch.Generator().manual_seed(train_batch_seed(trainer.cfg.seed, step))
    length = int(torch.randint(1, trainer.task.train_length + 1, (1,), generator=g))
    batch = trainer.task.sample(length, trainer.cfg.batch_size, g)
    counter = FlopCounterMode(display=False)
    with counter:
        loss = torch.nn.functional.cross_entropy(
            trainer.model(batch.tokens).flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
    trainer.model.zero_grad(set_to_none=True)
    b, t = batch.tokens.shape
    d = trainer.model_cfg.d_model
    n_lstm = len(trainer.model.lstm_layers)
    # per token and layer: gates = W_ih x + W_hh h, 2 * (4d x 2d) multiply-adds forward; backward ~2x forward
    lstm = 3 * 2 * (4 * d) * (2 * d) * b * t * n_lstm
    return float(counter.get_total_flops()), float(lstm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["hybrid-joint", "lstm", "transformer"])
    parser.add_argument("--options", nargs="+", default=list(OPTIONS), choices=list(OPTIONS))
    parser.add_argument("--steps", type=int, default=30, help="timed steps per option (after 5 warm-up steps)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_name()}; flags: {' '.join(cpu_flags()) or 'none of avx2/avx512/amx'}; "
          f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, threads {args.threads}")
    used, note = hardware.precision_used("bf16", torch.device("cpu"))
    print(f"bf16 options run as {used}" + (f" ({note})" if note else ""))
    peak32, peak16 = matmul_peak(torch.float32), matmul_peak(torch.bfloat16)
    print(f"matmul peak (1024^3, best of 10): fp32 {peak32:.0f} GFLOP/s, bf16 {peak16:.0f} GFLOP/s "
          f"({peak16 / peak32:.1f}x)\n")
    print("| preset | option | step (ms, median) | vs fp32 | GFLOP / step (matmul + LSTM) | GFLOP/s | of fp32 peak |")
    print("|---|---|---|---|---|---|---|")
    for preset in args.presets:
        trainers = {}
        for name in args.options:
            trainers[name] = Trainer(*build_configs(preset, "interleaved", OPTIONS[name]), tempfile.mkdtemp(),
                                     progress=False)
        first = next(iter(trainers.values()))
        # every option trains on the same batch at step i, so the FLOPs of step i are counted once, for all
        flops = {i: step_flops(first, i) for i in range(5, 5 + args.steps)}
        mm = sum(f[0] for f in flops.values()) / len(flops)
        lstm = sum(f[1] for f in flops.values()) / len(flops)
        times: dict[str, list[float]] = {name: [] for name in trainers}
        for i in range(5 + args.steps):
            order = list(trainers) if i % 2 == 0 else list(reversed(trainers))
            for name in order:
                t0 = time.perf_counter()
                trainers[name].train_step(i)
                if i >= 5:
                    times[name].append(time.perf_counter() - t0)
        base = statistics.median(times[args.options[0]])
        for name, ts in times.items():
            med = statistics.median(ts)
            rate = (mm + lstm) * len(ts) / sum(ts) / 1e9  # all timed steps' FLOPs over all their time
            print(f"| {preset} | {name} | {med * 1e3:.1f} | {med / base:.2f}x | {mm / 1e9:.2f} + {lstm / 1e9:.2f} "
                  f"| {rate:.0f} | {rate / peak32:.2f} |")
        sys.stdout.flush()
    print("\nGFLOP / step: mean over the timed steps' batches (each draws its own length); GFLOP/s: those steps' "
          "FLOPs over their summed time; fraction of the fp32 matmul peak measured above")


if __name__ == "__main__":
    main()
