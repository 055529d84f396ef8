"""Wall time of ``python -m probe.shortcuts``'s default run on one checkpoint, stage by stage.

Usage: ``python benchmarks/shortcuts_speed.py [ckpt.pt] [--threads 1] [--device cpu] [--repeats 1]``. Without a
checkpoint it uses the first of ``checkpoints/transformer.pt``, ``runs/transformer/seed0/final.pt``, or else an
untrained model of the ``transformer`` preset (the only preset whose positional tests all run). Prints the time of
each stage with the CLI's defaults, then of ``analyze`` as a whole and of the figures.
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
from probe.attention import entropy_vs_length, head_diagnostics, plot_entropy, plot_head_map  # noqa: E402
from probe.checkpoint import checkpoint_from_model, load_checkpoint, save_checkpoint  # noqa: E402
from probe.models import HookedSequenceModel  # noqa: E402


def default_checkpoint() -> Path:
    for candidate in (ROOT / "checkpoints/transformer.pt", ROOT / "runs/transformer/seed0/final.pt"):
        if candidate.exists():
            return candidate
    from probe.train import build_configs

    model_cfg, task, train_cfg = build_configs("transformer")
    torch.manual_seed(0)
    path = Path(tempfile.mkdtemp()) / "untrained-transformer.pt"
    save_checkpoint(path, checkpoint_from_model(HookedSequenceModel(model_cfg), task,
                                                train_config=train_cfg.to_dict()))
    return path


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", nargs="?", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = Path(args.checkpoint) if args.checkpoint else default_checkpoint()
    ckpt = load_checkpoint(path)
    model = ckpt.build_model(args.device)
    task = ckpt.task_config
    lt = task.train_length
    offsets = sc.default_offsets(task)
    print(f"checkpoint {path} ({ckpt.label}, pos {model.cfg.pos_encoding}, d_model {model.cfg.d_model}, "
          f"{model.cfg.n_layers} blocks), device {args.device}, {args.threads} thread(s), median of {args.repeats}")
    stages: list[tuple[str, Callable[[], Any]]] = [
        ("positional randomization (8 x 128 seqs)", lambda: sc.positional_randomization(model, task, offsets)),
        ("window test (512 seqs)", lambda: sc.window_test(model, task, device=args.device)),
        ("position controls", lambda: sc.position_controls(model, task, offsets)),
        ("window oracle controls", lambda: sc.window_controls(task)),
    ]
    if model.cfg.has_attention:
        stages += [("head diagnostics (256 seqs)", lambda: head_diagnostics(model, task)),
                   ("entropy vs length", lambda: entropy_vs_length(model, task, sorted(
                       {max(1, lt // 2), lt, 2 * lt, 3 * lt, 4 * lt})))]
    for name, fn in stages:
        seconds, _ = timed(fn, args.repeats)
        print(f"  {name:<42s} {seconds:7.2f} s")
    seconds, report = timed(lambda: sc.analyze(path, args.device), args.repeats)
    print(f"  {'analyze() total (default run)':<42s} {seconds:7.2f} s")

    def figures() -> None:
        heads = report.heads.assign(checkpoint=report.checkpoint)
        entropy = report.entropy.assign(checkpoint=report.checkpoint)
        figs = (sc.plot_drops([report]), sc.plot_window([report]), plot_entropy(entropy), plot_head_map(heads))
        with tempfile.TemporaryDirectory() as out:
            for i, fig in enumerate(figs):
                fig.savefig(Path(out) / f"{i}.png", dpi=150)

    seconds, _ = timed(figures, args.repeats)
    print(f"  {'four figures (--out)':<42s} {seconds:7.2f} s")


if __name__ == "__main__":
    main()
