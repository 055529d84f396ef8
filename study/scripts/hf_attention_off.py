"""Where the transformers hybrids' state comes from: the metric of record with attention on and off.

Usage: ``python study/scripts/hf_attention_off.py runs/hf --out study/results/hf/attention_off.csv``.
For every run of ``study/sweeps/hf.toml`` (RecurrentGemma, joint and DAT), the windows of stream positions to 16x of
its ``final.pt`` twice: as trained (attention's gate 1) and with every attention gate at 0 (the RG-LRU blocks and the
MLPs alone; the model is not retrained). For DAT runs also the last trajectory snapshot before the switch, when the
recurrence had trained alone with attention off (gate 0): what the RG-LRU learns by itself. One row per checkpoint,
gate, window and subtask (state, recall, and the state's factors mod 2 and mod 5), beside its chance floor.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from probe.checkpoint import load_checkpoint
from probe.training import step_state
from probe.windows import windows_of

SUBTASKS = ("state", "recall", "state_mod2", "state_mod5")


def rows(path: Path, gate: float, what: str, n_samples: int) -> pd.DataFrame:
    ckpt = load_checkpoint(path)
    model = ckpt.build_model()
    model.set_attention_gate(gate)
    task = ckpt.task_config
    with torch.no_grad():
        table = windows_of(model, task, task.train_length, 16 * task.train_length, n_samples, seed=0, batch_size=64)
    table = table[table.subtask.isin(SUBTASKS)]
    return table.assign(label=ckpt.label, seed=ckpt.seed, step=ckpt.step, checkpoint=what, gate=gate)[
        ["label", "seed", "checkpoint", "step", "gate", "window", "subtask", "token_acc", "n_tokens", "chance"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    frames = []
    for final in sorted(args.runs.glob("*/seed*/final.pt")):
        for gate in (1.0, 0.0):
            frames.append(rows(final, gate, "final", args.samples))
        ckpt = load_checkpoint(final)
        if ckpt.variant == "dat":
            snapshots = sorted((final.parent / "trajectory").glob("step_*.pt"))
            before = [p for p in snapshots if max(step_state(load_checkpoint(p)).gates) == 0.0]
            if before:  # the snapshot's state is that of its next step: gate 0 there means it trained alone so far
                frames.append(rows(before[-1], 0.0, "recurrence alone (before the switch)", args.samples))
    out = pd.concat(frames, ignore_index=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False, float_format="%.4f")
    wide = out.pivot_table(index=["label", "checkpoint", "gate", "subtask"], columns="window", values="token_acc",
                           aggfunc="mean", sort=False)
    print(f"token accuracy, mean over {out.seed.nunique()} seeds")
    print((100 * wide).round(1).to_string())


if __name__ == "__main__":
    main()
