"""Run occlusion, attention reads, component ablation and (optionally) integrated gradients on checkpoints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from probe.attributions.components import component_ablation
from probe.attributions.ig import choose_answers, ig_far, ig_profile, position_ig
from probe.attributions.occlusion import resample_occlusion
from probe.attributions.reads import read_profile
from probe.checkpoint import Checkpoint, load_checkpoint, resolve_checkpoints
from probe.core.batches import analysis_batch
from probe.core.extras import require
from probe.core.gates import attention_gates
from probe.core.lengths import multiples
from probe.core.meta import checkpoint_meta
from probe.core.progress import progress_iter
from probe.core.rows import threshold_row
from probe.errors import ProbeError
from probe.memory import check_lengths
from probe.models import HookedSequenceModel
from probe.training.state import schedule_gate

DEFAULT_FACTORS = (1, 3)
"""Attributions are reported at the training length and at 3x, as the gradient analysis's interference."""

IG_DROP_TOL = 0.2
"""At most this fraction of the explained answers may be dropped for a delta that did not converge."""


@dataclass
class AttributionReport:
    """Tidy frames (one per analysis) plus control rows."""

    occlusion: pd.DataFrame = field(default_factory=pd.DataFrame)
    occlusion_far: pd.DataFrame = field(default_factory=pd.DataFrame)
    reads: pd.DataFrame = field(default_factory=pd.DataFrame)
    reads_far: pd.DataFrame = field(default_factory=pd.DataFrame)
    components: pd.DataFrame = field(default_factory=pd.DataFrame)
    ig: pd.DataFrame = field(default_factory=pd.DataFrame)
    ig_far: pd.DataFrame = field(default_factory=pd.DataFrame)
    controls: list[dict[str, Any]] = field(default_factory=list)

    FRAMES = ("occlusion", "occlusion_far", "reads", "reads_far", "components", "ig", "ig_far")

    def rows(self) -> list[dict[str, Any]]:
        return [{"analysis": name, **r} for name in self.FRAMES for r in getattr(self, name).to_dict("records")]


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def analyze_checkpoint(ckpt: Checkpoint, lengths: Sequence[int] | None = None, batch_size: int = 32, seed: int = 0,
                       device: torch.device | str = "cpu", far: int | None = None, ig: bool = False,
                       ig_sequences: int = 4, ig_targets: int = 2, ig_max_steps: int = 256,
                       stored_gate: bool = False, progress: bool = False) -> AttributionReport:
    """Every attribution of one checkpoint at each length (default: the training length and 3x)."""
    meta = checkpoint_meta(ckpt)
    name = meta["checkpoint"]
    model = ckpt.build_model(device)
    task = ckpt.task_config
    own = isinstance(model, HookedSequenceModel)  # a wrapped model exposes module outputs, not probe's blocks
    if ig:
        require("captum.attr")
    if ig and not own:
        raise ProbeError(f"{name}: integrated gradients put the embedding through probe's hook_embed, which a wrapped "
                         "model does not have; run without --ig (occlusion and path patching work on it)")
    k = far if far is not None else max(1, task.train_length // 3)
    parts: dict[str, list[pd.DataFrame]] = {f: [] for f in AttributionReport.FRAMES}
    controls = []
    with attention_gates(model, None if stored_gate else schedule_gate(ckpt)):
        gates = model.attention_gates()
        m = {**meta, "gate": gates[0] if gates else 0.0}
        for length in progress_iter(list(lengths or multiples(task.train_length, DEFAULT_FACTORS)),
                                    f"{ckpt.name} lengths", progress):
            batch = analysis_batch(task, length, batch_size, seed, device)
            occ = resample_occlusion(model, batch, task, seed=seed + length, progress=progress)
            parts["occlusion"].append(occ.profile().assign(**m, length=length))
            parts["occlusion_far"].append(occ.far(k).assign(**m, length=length))
            controls.append(threshold_row(
                name, f"occlusion_causal_L{length}", occ.causal_max, 0.0,
                "max |logit change| at positions before the resampled token (the next token included, distance "
                "-1): fails if any answer can see a later token"))
            controls.append(threshold_row(
                name, f"patching_cross_position_L{length}", occ.cross_position_max, 0.0,
                "max |logit change| after the resampled token with every recurrent and attention output held at its "
                "clean value: fails if the path patching does not hold the sublayers it claims to hold, or (a "
                "wrapped model) if a module that mixes positions was not named"))
            if own and model.attention_blocks:  # reads need attention patterns, which a wrapped model hides
                prof, rfar = read_profile(model, batch, k)
                parts["reads"].append(prof.assign(**m, length=length))
                parts["reads_far"].append(rfar.assign(**m, length=length))
            parts["components"].append(component_ablation(model, batch).assign(**m, length=length))
            if ig:
                res = position_ig(model, batch, choose_answers(batch, ig_sequences, ig_targets), ig_max_steps)
                parts["ig"].append(ig_profile(res).assign(**m, length=length))
                parts["ig_far"].append(ig_far(res, k).assign(**m, length=length))
                frac = res.n_dropped / res.n_answers if res.n_answers else 0.0
                controls.append(threshold_row(
                    name, f"ig_converged_L{length}", frac, IG_DROP_TOL,
                    f"fraction of answers dropped because |sum of IG - exact occlusion effect| stayed above "
                    f"5 % + 0.02 logit at {ig_max_steps} steps ({res.n_dropped} of {res.n_answers}); dropped "
                    "answers are never shown", n_dropped=res.n_dropped, n_answers=res.n_answers))
    return AttributionReport(**{f: _concat(v) for f, v in parts.items()}, controls=controls)


def analyze(paths: Sequence[str | Path], lengths: Sequence[int] | None = None, batch_size: int = 32, seed: int = 0,
            device: torch.device | str = "cpu", far: int | None = None, ig: bool = False, ig_sequences: int = 4,
            ig_targets: int = 2, ig_max_steps: int = 256, stored_gate: bool = False,
            progress: bool = False) -> AttributionReport:
    """Every checkpoint in ``paths`` (files, directories, globs)."""
    if ig:
        require("captum.attr")  # an install without the [attributions] extra is refused before any work
    ckpts = [load_checkpoint(p) for p in resolve_checkpoints([str(p) for p in paths])]
    for c in ckpts:  # every file and length is checked before any work
        task = c.task_config
        check_lengths(c.model_config, task, list(lengths or multiples(task.train_length, DEFAULT_FACTORS)), device,
                      grad=ig, name=str(c.path))
    it: Any = progress_iter(ckpts, "checkpoints", progress and len(ckpts) > 1)
    reports = [analyze_checkpoint(c, lengths, batch_size, seed, device, far, ig, ig_sequences, ig_targets,
                                  ig_max_steps, stored_gate, progress) for c in it]
    return AttributionReport(**{f: _concat([getattr(r, f) for r in reports]) for f in AttributionReport.FRAMES},
                             controls=[c for r in reports for c in r.controls])
