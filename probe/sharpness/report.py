"""The diagnostic on one checkpoint with its controls, and the table of its recall head per scale and length."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from probe.core.inputs import check_inputs
from probe.core.lengths import multiples
from probe.core.meta import variant_name
from probe.memory import check_lengths
from probe.sharpness.controls import sharpness_controls
from probe.sharpness.measure import not_applicable, recall_head, sharpness_curve

if TYPE_CHECKING:
    from probe.checkpoint import Checkpoint


@dataclass
class SharpnessResult:
    """Everything about one checkpoint: ``mass`` and ``accuracy`` frames (with ``checkpoint, label, seed``),
    ``controls`` rows, and ``note`` (one line) when the diagnostic does not apply."""

    checkpoint: str
    mass: pd.DataFrame
    accuracy: pd.DataFrame
    controls: list[dict[str, Any]]
    note: str | None = None


def analyze(ckpt: Checkpoint, lengths: Sequence[int] | None = None, n_samples: int = 64, seed: int = 0,
            scales: Sequence[str] = ("none",), device: torch.device | str = "cpu",
            control_samples: int = 32, progress: bool = False) -> SharpnessResult:
    """The diagnostic on one checkpoint at ``lengths`` (default 1x, 4x, 8x, 16x L_train) under each of ``scales``,
    with its instrument check and controls (``probe.sharpness.controls``); ``progress``: a bar over the lengths."""
    check_inputs("probe.sharpness.analyze", ckpt=ckpt)
    name = str(ckpt.path or ckpt.name)
    task = ckpt.task_config
    why = not_applicable(ckpt.model_config, task)
    if why:
        return SharpnessResult(name, pd.DataFrame(), pd.DataFrame(), [], note=why)
    lengths = list(lengths or multiples(task.train_length, (1, 4, 8, 16)))
    check_lengths(ckpt.model_config, task, [*lengths, task.train_length], device, name=name)
    model = ckpt.build_model(device)
    masses, accs = [], []
    for scale in scales:
        m, a = sharpness_curve(model, task, lengths, n_samples, seed, scale, progress)
        masses.append(m)
        accs.append(a)
    mass, acc = pd.concat(masses, ignore_index=True), pd.concat(accs, ignore_index=True)
    meta = {"checkpoint": name, "label": variant_name(ckpt), "seed": ckpt.seed, "train_length": task.train_length}
    for frame in (mass, acc):
        for i, (k, v) in enumerate(meta.items()):
            frame.insert(i, k, v)
    controls = [{"checkpoint": name, **c} for c in
                sharpness_controls(model, task, mass, min(n_samples, control_samples), seed)]
    return SharpnessResult(name, mass, acc, controls)


def summary_table(mass: pd.DataFrame, accuracy: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint, scale and length: recall accuracy and the recall head's mass [interval], its dilution
    reference and its placebo (same-role mass on another pair)."""
    rows = []
    for name, part in mass.groupby("checkpoint", sort=False):
        head = recall_head(part, int(part.train_length.iloc[0]))
        if head is None:
            continue
        layer, h, target = head
        sel = part[(part.layer == layer) & (part["head"] == h) & (part.target == target)]
        for r in sel.itertuples():
            acc = accuracy[(accuracy.checkpoint == name) & (accuracy.scale == r.scale) & (accuracy.length == r.length)
                           & (accuracy.subtask == "recall")]
            rows.append({"checkpoint": name, "label": r.label, "scale": r.scale, "length": r.length,
                         "recall_acc": float(acc.token_acc.iloc[0]) if len(acc) else math.nan,
                         "head": f"L{layer}H{h} {target}", "mass": r.mass, "ci": f"[{r.ci_low:.3f}, {r.ci_high:.3f}]",
                         "reference": r.reference, "wrong_mass": r.wrong_mass, "uniform": r.uniform_mass,
                         "gap": r.gap})
    return pd.DataFrame(rows)
