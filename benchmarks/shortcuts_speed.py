"""Wall time of ``python -m probe.shortcuts``'s default run on one checkpoint, stage by stage.

Usage: ``python benchmarks/shortcuts_speed.py [ckpt.pt ...] [--threads 1] [--device cpu] [--repeats 1]``. Without a
checkpoint it times the four shipped ones (``checkpoints/*.pt``). Prints the time of each stage with the CLI's
defaults (256 sequences per length, lengths 1x-4x L_train), then of ``analyze`` as a whole and of the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from probe import shortcuts as sc  # noqa: E402
from probe.attention import entropy_vs_length, head_diagnostics  # noqa: E402
from probe.checkpoint import load_checkpoint  # noqa: E402
from probe.core.lengths import multiples  # noqa: E402
from probe.shortcuts.runs import DEFAULT_RUNS  # noqa: E402
from probe.shortcuts.sampling import DEFAULT_FACTORS, baselines  # noqa: E402


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench(path: Path, device: str, repeats: int) -> None:
    ckpt = load_checkpoint(path)
    model = ckpt.build_model(device)
    task = ckpt.task_config
    lt = task.train_length
    lengths = multiples(task.train_length, DEFAULT_FACTORS)
    print(f"checkpoint {path} ({ckpt.label}, {model.cfg.family}, pos {model.cfg.pos_encoding}), device {device}, "
          f"{torch.get_num_threads()} thread(s), median of {repeats}")
    base = baselines(model, task, sorted({*lengths, lt, *(lt + r for r in DEFAULT_RUNS)}), 256, 0)
    stages: list[tuple[str, Callable[[], Any]]] = [
        ("unperturbed answers (shared)", lambda: baselines(model, task, sorted(
            {*lengths, lt, *(lt + r for r in DEFAULT_RUNS)}), 256, 0)),
        ("attention knock-out", lambda: sc.attention_knockout(model, task, lengths, 256, 0, base)),
        ("sum-preserving", lambda: sc.sum_preserving(model, task, lengths, baseline=base)),
        ("identity run", lambda: sc.identity_run(model, task, baseline=base)),
        ("positional offset + dependence", lambda: sc.positional_tests(model, task, baseline=base)),
        ("window test (256 seqs)", lambda: sc.window_test(model, task)),
    ]
    if model.cfg.has_attention:
        stages += [("head diagnostics (256 seqs)", lambda: head_diagnostics(model, task)),
                   ("entropy vs length", lambda: entropy_vs_length(model, task, sorted(
                       {max(1, lt // 2), lt, 2 * lt, 3 * lt, 4 * lt})))]
    for name, fn in stages:
        seconds, _ = timed(fn, repeats)
        print(f"  {name:<42s} {seconds:7.2f} s")
    seconds, report = timed(lambda: sc.analyze(path, device), repeats)
    print(f"  {'analyze() total, controls included':<42s} {seconds:7.2f} s")

    def figures() -> None:
        with tempfile.TemporaryDirectory() as out:
            for name, fig in sc.report_figures([report]).items():
                fig.savefig(Path(out) / f"{name}.png", dpi=150)

    seconds, _ = timed(figures, repeats)
    print(f"  {'five figures (--out)':<42s} {seconds:7.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="*", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    paths = [Path(p) for p in args.checkpoints] or sorted((ROOT / "checkpoints").glob("*.pt"))
    for path in paths:
        bench(path, args.device, args.repeats)


if __name__ == "__main__":
    main()
