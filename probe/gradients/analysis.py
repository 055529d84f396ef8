"""Run the decomposition, the lookahead, the real-step lookahead (on request) and their controls on checkpoints and
trajectories."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from probe.checkpoint import Checkpoint, load_checkpoint, resolve_checkpoints
from probe.core.batches import analysis_batch
from probe.core.gates import attention_gates
from probe.core.inputs import check_inputs
from probe.core.lengths import multiples
from probe.core.meta import checkpoint_meta
from probe.core.progress import note, progress_iter
from probe.core.rows import threshold_row
from probe.core.task import as_batch, as_sampler, is_batch, need_train_length, take_rows
from probe.errors import ProbeError
from probe.gradients.adamstep import check_real_step
from probe.gradients.beyond import (
    first_order_check,
    measure_beyond_range,
    positions_check,
    random_baseline_control,
    verdict_beyond,
)
from probe.gradients.controls import (
    ROUTE_TOL,
    builtin_controls,
    loss_split_control,
    path_sum_residual,
    route_disagreement,
)
from probe.gradients.decomposition import interference
from probe.gradients.inputs import LookaheadConfig, adam_moments
from probe.gradients.realstep import RealStepConfig, real_step_report
from probe.memory import check_lengths
from probe.models import HookedSequenceModel, ModelConfig
from probe.training.state import schedule_gate, step_state
from probe.wrapped import WrappedModel

DEFAULT_LOOKAHEAD = LookaheadConfig()
DEFAULT_FACTORS = (1, 3)
"""Interference is reported at the training length and at 3x (the length-generalization range's end)."""


def check_family(ckpt: Checkpoint | ModelConfig, name: str) -> None:
    cfg = ckpt.model_config if isinstance(ckpt, Checkpoint) else ckpt
    if not cfg.has_lstm:
        raise ProbeError(f"{name}: a {cfg.family} checkpoint has no recurrent sublayer, so there is no recurrent-"
                         "weight gradient to split into attention and recurrent paths; run it on a hybrid or lstm "
                         "checkpoint")


@dataclass
class GradientReport:
    """Everything one invocation measured: tidy frames plus control rows. ``real_step``, ``real_step_verdicts`` and
    ``rollout`` are empty unless the real step was asked for (``probe.gradients.realstep``)."""

    interference: pd.DataFrame
    lookahead: pd.DataFrame = field(default_factory=pd.DataFrame)
    verdicts: pd.DataFrame = field(default_factory=pd.DataFrame)
    controls: list[dict[str, Any]] = field(default_factory=list)
    real_step: pd.DataFrame = field(default_factory=pd.DataFrame)
    real_step_verdicts: pd.DataFrame = field(default_factory=pd.DataFrame)
    rollout: pd.DataFrame = field(default_factory=pd.DataFrame)

    FRAMES = (("interference", "interference"), ("lookahead", "lookahead"), ("verdicts", "lookahead_verdict"),
              ("real_step", "real_step"), ("real_step_verdicts", "real_step_verdict"),
              ("rollout", "real_step_rollout"))
    """(attribute, the rows' ``analysis`` value)."""

    def rows(self) -> list[dict[str, Any]]:
        frames = [(getattr(self, attr), kind) for attr, kind in self.FRAMES]
        return [{"analysis": kind, **r} for df, kind in frames if not df.empty for r in df.to_dict("records")]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> GradientReport:
        """The report back from the CLI's ``--json`` output (``results.json``)."""
        rows = pd.DataFrame(obj["results"])
        if rows.empty:
            raise ProbeError("the JSON holds no result rows; write it with python -m probe.gradients --json")

        def part(kind: str) -> pd.DataFrame:
            df = rows[rows.analysis == kind].drop(columns="analysis").dropna(axis=1, how="all")
            return df.reset_index(drop=True)

        return cls(controls=list(obj.get("controls", [])), **{attr: part(kind) for attr, kind in cls.FRAMES})


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def split_with_checks(model: HookedSequenceModel | WrappedModel, task: Any, lengths: Sequence[int],
                      batch_size: int = 64, seed: int = 0, device: torch.device | str = "cpu",
                      meta: dict[str, Any] | None = None, parts: Any = None,
                      batch: Any = None) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The interference table at each length and its exactness checks: the loss parts' gradients sum to the
    gradient of the whole loss computed in a pass of its own (``loss_split``), g_rec by the method's cut
    agrees with g_rec by another route (``g_rec_two_routes``), and g_rec plus g_att computed on its own, without
    any cut, is g (``parts_sum_to_whole``). ``task``: probe's task or any sampler (``probe.core.task``); ``batch``:
    one batch of the user's instead (then ``task`` and ``lengths`` are not read); ``parts``: the two named parts of
    the loss (``decompose``). ``meta``: columns every row carries."""
    where = "probe.gradients.split_with_checks"
    check_inputs(where, model=model)
    meta = meta or {"checkpoint": "<model>"}
    if batch is not None:
        one = as_batch(batch, where).to(device)
        drawn = [(one.length, one)]
        small = take_rows(one, slice(0, 16))  # exactness does not depend on the batch size: a small batch
    else:
        sampler = as_sampler(task, where)
        drawn = [(length, analysis_batch(sampler, length, batch_size, seed, device)) for length in lengths]
        # exactness does not depend on the batch size, so this check uses a small batch
        small = analysis_batch(sampler, lengths[0], min(batch_size, 16), seed, device)
    table = pd.concat([interference(model, b, parts).assign(**meta, length=length) for length, b in drawn],
                      ignore_index=True)
    return table, [loss_split_control(meta["checkpoint"], table), threshold_row(
        meta["checkpoint"], "g_rec_two_routes", route_disagreement(model, small), ROUTE_TOL,
        "|g_rec(attention's inputs detached) - g_rec(route)| / |g| for the model's stopgrad route and a detached "
        "attention output: fails if the method's cut leaves a path through attention open or cuts another"),
        threshold_row(
        meta["checkpoint"], "parts_sum_to_whole", path_sum_residual(model, small), ROUTE_TOL,
        "|g_rec + g_att' - g| / |g|, g_att' = sum over attention outputs a_k of (da_k/dtheta)^T dL/da_k along "
        "paths crossing no later attention, g from a plain pass, each computed on its own: fails if the cut "
        "leaves a path through attention open or cuts a recurrent one")]


def analyze_model(model: HookedSequenceModel | WrappedModel, task: Any = None,
                  lengths: Sequence[int] | None = None, batch_size: int = 64, seed: int = 0,
                  name: str = "<model>", *, batch: Any = None, parts: Any = None,
                  train_length: int | None = None) -> GradientReport:
    """The gradient split of a live model -- probe's own or one from ``probe.wrap`` -- at each length (default the
    training length and 3x), with its exactness checks and the hand-built control; no lookahead (it needs the
    optimizer's moments, which a checkpoint carries: ``analyze_checkpoint``).

    The data, any task's (``probe.core.task``): ``batch`` (one batch of yours: the split at its length; a batch
    passed as ``task`` is read as one), or ``task`` (probe's task or a sampler ``f(length, batch_size, seed)``;
    default the model's own, ``probe.wrap(..., task=)``); a sampler that does not know its training length needs
    ``lengths`` or ``train_length``. ``parts``: the two named parts of the loss (``decompose``)."""
    where = "probe.gradients.analyze_model"
    check_inputs(where, model=model)
    if batch is None and is_batch(task):
        batch, task = task, None
    cfg = model.cfg
    if not cfg.has_lstm:
        raise ProbeError(f"{name}: the model has no recurrent module, so there is no recurrent-weight gradient to "
                         "split; wrap it with recurrent=[...]")
    sampler = None
    if batch is None:
        task = task if task is not None else getattr(model, "task", None)
        if task is None:
            raise ProbeError(f"{where}: no data: pass batch= (a batch of your task) or task= (a sampler f(length, "
                             "batch_size, seed), or probe.tasks.make_task(...))")
        sampler = as_sampler(task, where, train_length)
        if not lengths:
            lengths = multiples(need_train_length(sampler, where), DEFAULT_FACTORS)
    device = next(model.parameters()).device
    meta = {"checkpoint": name, "family": cfg.family}
    gates = model.attention_gates()
    table, controls = split_with_checks(model.eval(), sampler, list(lengths or []), batch_size, seed, device,
                                        {**meta, "gate": gates[0] if gates else 0.0}, parts, batch)
    return GradientReport(table, controls=controls + builtin_controls())


def analyze_checkpoint(ckpt: Checkpoint, lengths: Sequence[int] | None = None, batch_size: int = 64, seed: int = 0,
                       device: torch.device | str = "cpu", stored_gate: bool = False,
                       lookahead_cfg: LookaheadConfig | None = DEFAULT_LOOKAHEAD, progress: bool = False,
                       real_step: RealStepConfig | None = None, rollout: int = 0) -> GradientReport:
    """Interference at each length, the lookahead (unless ``lookahead_cfg`` is None), the real-step lookahead
    (``real_step_report``, when ``real_step`` is given; with a ``rollout`` of that many steps when > 0) and the
    per-checkpoint controls, for one checkpoint."""
    check_inputs("probe.gradients.analyze_checkpoint", ckpt=ckpt)
    check_family(ckpt, ckpt.name)
    meta = checkpoint_meta(ckpt)
    model = ckpt.build_model(device)
    gate = None if stored_gate else schedule_gate(ckpt)
    task = ckpt.task_config
    lengths = list(lengths or multiples(task.train_length, DEFAULT_FACTORS))
    la, verdicts = pd.DataFrame(), pd.DataFrame()
    with attention_gates(model, gate):
        gates = model.attention_gates()
        meta_g = {**meta, "gate": gates[0] if gates else 0.0}
        table, controls = split_with_checks(model, task, lengths, batch_size, seed, device, meta_g)
        if lookahead_cfg is not None:
            note(f"{meta['checkpoint']}: lookahead (step {ckpt.step})", progress)
            moments = adam_moments(ckpt, model)
            state = step_state(ckpt)  # the run's learning rate at this step and its batch draw, as recorded
            la, checks = measure_beyond_range(model, task, moments, lookahead_cfg, seed, device,
                                              train_lr=state.lr, draw=state.draw, progress=progress)
            la = la.assign(**meta_g)
            v = verdict_beyond(la)
            controls += [first_order_check(meta["checkpoint"], checks["first_order_error"]),
                         positions_check(meta["checkpoint"], la, checks["starts"]),
                         random_baseline_control(meta["checkpoint"], v)]
            verdicts = pd.DataFrame([{**meta_g, **v}])
    report = GradientReport(table, la, verdicts, controls)
    if real_step is not None:
        note(f"{meta['checkpoint']}: real step (step {ckpt.step})"
             + (f", two {rollout}-step rollouts" if rollout > 0 else ""), progress)
        rs = real_step_report(ckpt, real_step, seed, device, rollout, meta["checkpoint"])
        run_gates = schedule_gate(ckpt)  # the real step is the run's: its gate, whatever --stored-gate says
        meta_rs = {**meta, "gate": run_gates[0] if run_gates else 0.0}
        report.real_step, report.real_step_verdicts = rs.rows.assign(**meta_rs), rs.verdicts.assign(**meta_rs)
        report.rollout = rs.rollout.assign(**meta_rs) if not rs.rollout.empty else rs.rollout
        report.controls += rs.controls
    return report


def analyze(paths: Sequence[str | Path], lengths: Sequence[int] | None = None, batch_size: int = 64, seed: int = 0,
            device: torch.device | str = "cpu", stored_gate: bool = False,
            lookahead_cfg: LookaheadConfig | None = DEFAULT_LOOKAHEAD, progress: bool = False,
            real_step: RealStepConfig | None = None, rollout: int = 0) -> GradientReport:
    """Every checkpoint in ``paths`` (files, trajectory or run directories, globs), plus the built-in control;
    ``real_step`` and ``rollout`` as in ``analyze_checkpoint``."""
    check_inputs("probe.gradients.analyze", paths=paths)
    files = resolve_checkpoints([str(p) for p in paths])
    ckpts = [load_checkpoint(p) for p in files]  # validate every file and length before spending time on any
    for c in ckpts:
        check_family(c, str(c.path))
        if real_step is not None:
            check_real_step(c, name=str(c.path))
        task = c.task_config
        check_lengths(c.model_config, task, list(lengths or multiples(task.train_length, DEFAULT_FACTORS)), device,
                      grad=True, name=str(c.path))
    it: Any = progress_iter(ckpts, "checkpoints", progress and len(ckpts) > 1)
    reports = [analyze_checkpoint(c, lengths, batch_size, seed, device, stored_gate, lookahead_cfg, progress,
                                  real_step, rollout) for c in it]
    return GradientReport(controls=[c for r in reports for c in r.controls] + builtin_controls(),
                          **{attr: _concat([getattr(r, attr) for r in reports]) for attr, _ in GradientReport.FRAMES})

