"""Time ``probe.gradients``'s default analysis on one checkpoint on one CPU thread, by phase (budget: <= 30 s).

The default is the command's quick lookahead; ``benchmarks/cli_defaults.py`` times the command itself, imports included.

Usage: ``python benchmarks/gradients_speed.py [ckpt.pt]``. Without an argument it uses ``checkpoints/hybrid-joint.pt``
if shipped, else a randomly initialised model of the ``hybrid-joint`` preset's size (same cost).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from probe import gradients as G
from probe.checkpoint import checkpoint_from_model, load_checkpoint, save_checkpoint
from probe.core.batches import analysis_batch
from probe.core.lengths import multiples
from probe.gradients import controls as C
from probe.gradients.cli import QUICK_BATCHES, QUICK_EVAL_BATCHES, QUICK_RANDOM, QUICK_SCALES
from probe.models import HookedSequenceModel
from probe.train import build_configs

BUDGET_S = 30.0


def preset_checkpoint(folder: Path) -> Path:
    model_cfg, task, train_cfg = build_configs("hybrid-joint")
    torch.manual_seed(0)
    path = folder / "hybrid-joint-random.pt"
    save_checkpoint(path, checkpoint_from_model(HookedSequenceModel(model_cfg), task, train_config=train_cfg.to_dict()))
    return path


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        default = Path("checkpoints/hybrid-joint.pt")
        path = Path(argv[0]) if argv else (default if default.exists() else preset_checkpoint(Path(tmp)))
        # the command's default lookahead (python -m probe.gradients without --full-lookahead)
        cfg = G.LookaheadConfig(n_batches=QUICK_BATCHES, eval_batches=QUICK_EVAL_BATCHES,
                                train_eval_batches=QUICK_EVAL_BATCHES, scales=QUICK_SCALES, n_random=QUICK_RANDOM)
        t0 = time.perf_counter()
        report = G.analyze([path], lookahead_cfg=cfg)
        total = time.perf_counter() - t0

        ckpt = load_checkpoint(path)
        model = ckpt.build_model()
        phases: dict[str, float] = {}
        for length in multiples(ckpt.task_config.train_length, G.DEFAULT_FACTORS):
            t = time.perf_counter()
            G.interference(model, analysis_batch(ckpt.task_config, length, 64, 0))
            phases[f"interference L={length}"] = time.perf_counter() - t
        t = time.perf_counter()
        G.measure_lookahead(model, ckpt.task_config)
        phases["lookahead"] = time.perf_counter() - t
        t = time.perf_counter()
        C.route_disagreement(model, analysis_batch(ckpt.task_config, ckpt.task_config.train_length, 16, 0))
        C.builtin_controls()
        phases["controls"] = time.perf_counter() - t

    cfg = ckpt.model_config
    print(f"checkpoint: {path} ({cfg.family}, d_model {cfg.d_model}, {cfg.n_layers} blocks), torch threads: "
          f"{torch.get_num_threads()}")
    lengths = multiples(ckpt.task_config.train_length, G.DEFAULT_FACTORS)
    print(f"default analysis (batch 64, lengths {lengths}, lookahead over "
          f"{cfg.n_batches} batches, step scale {cfg.scales}): {total:.2f} s; budget {BUDGET_S:.0f} s: "
          f"{'ok' if total <= BUDGET_S else 'OVER'}")
    for name, secs in phases.items():
        print(f"  {name:<28} {secs:6.2f} s")
    print(f"rows: {len(report.rows())}, controls passed: {sum(c['passed'] for c in report.controls)}/"
          f"{len(report.controls)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
