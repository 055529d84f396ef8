"""The lookahead at the optimizer's real step: each part of AdamW's next update (``adamstep``), taken at its own size.

At a snapshot that holds AdamW's state, the next update u of the recurrent weights splits exactly into attention's
part, the recurrent part, the carried momentum and the weight decay (``adamstep.update_parts``). Each part is
stepped alone, at the size it has inside the real update (no normalisation: attention's part at attention's
share), and so is the whole update; the rows give each part's size as a fraction of |u|. Targets: the training loss
on held-out training batches (``<=L``) and the state loss in each window of stream positions beyond the training
length, ``(L, 2L]``, ``(2L, 4L]``, ... up to ``max_factor`` x L (``probe.windows``: one pass over sequences of the
longest length scores every window). For each part and target: the first-order change ``-<grad T, u_part>`` and
the change actually taken, ``T(theta - u_part) - T(theta)`` on a float64 copy, both per evaluation batch (paired
across parts).

**The matched random baseline.** ``n_random`` directions r with |r| = |u_att| and ``<r, grad T_m> = <u_att, grad
T_m>`` for one loss T_m, otherwise random (the rest drawn isotropically orthogonal to grad T_m after scaling by the
step's preconditioner 1/denom, so its coordinates are sized as an AdamW step's are). Matching on the target itself
would make the comparison first-order trivial: u_att and r would change the target equally to first order by
construction, and their difference would be the curvature term alone. So T_m is the training loss (``match``
"train"): r is as long as attention's part and lowers the training loss as much (to first order), and its change of
a beyond-range loss comes from its share of the training gradient plus a random rest. Attention's part "raises the
beyond-range loss" is then supported only where its measured change exceeds r's: a raise that any step as long and
as useful for fitting would cause is attributed to fitting, not to attention's direction. What it cannot refute: a
harm that builds up over many steps (the 50-step rollout is the check for that), or one carried by the momentum
term (its own rows). ``match`` may name a beyond-range window instead, for the curvature-only comparison.

``real_step_report`` is one snapshot's whole measurement, what ``python -m probe.gradients --real-step [--rollout
STEPS]`` reports: the rows, the verdict per window, the checks, and with a rollout its rows and its two checks (the
kept branch's first step is the update computed here; its last weights are the run's own later snapshot, where
there is one).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from probe.checkpoint import Checkpoint, load_checkpoint
from probe.core.gates import attention_gates
from probe.core.rows import CONTROL, check_row, threshold_row
from probe.gradients.adamstep import PARTS, next_update
from probe.gradients.decomposition import (
    Cut,
    attention_inputs_detached,
    check_has_lstm,
    flat_grad,
    lstm_parameter_names,
)
from probe.gradients.inputs import add_step, lookahead_seed
from probe.tasks import IGNORE_INDEX, Batch, TaskConfig
from probe.training.batches import BatchDraw
from probe.training.rollout import continue_run, weight_difference
from probe.training.state import schedule_gate, step_state
from probe.windows import windows_for

DIRECTIONS = (*PARTS, "full")
Z_DETECT = 2.0
"""|z| above which a change counts as detected."""
SUM_TOL = 1e-9
"""|sum of the parts - u| / |u|: float64 rounding only."""
MATCH_TOL = 1e-9
"""The matched random directions' norm and projection against the requested ones, relative: float64 rounding."""
ADAMW_TOL = 1e-3
"""|first step of the kept rollout - computed update| / |update|: float32 (and a fused kernel's) rounding against
the float64 update; a wrong batch, lr, clip or moment misses by order 1."""


@dataclass(frozen=True)
class RealStepConfig:
    """Sizes of the real-step lookahead."""

    batch_size: int = 64
    train_eval_batches: int = 8  # held-out training-distribution batches (the training-loss target)
    eval_batches: int = 4        # batches of sequences at max_factor x L (every beyond-range window)
    max_factor: int = 16         # the longest window ends at max_factor x L
    n_random: int = 4            # matched random directions
    match: str = "train"         # the target whose gradient the random directions' projection matches


@dataclass
class Targets:
    """The targets' batches: ``names[i]`` is (loss, positions, lo, hi); target 0 is the training loss on ``train``,
    the others the state loss in one window each on ``state`` (``masks[b][i - 1]``: batch b, window i)."""

    names: list[tuple[str, str, int, int]]
    train: list[Batch]
    state: list[Batch]
    masks: list[list[Tensor]]

    def per_batch(self, model: Any) -> list[list[Tensor]]:
        """Per target, each batch's loss (graph kept: differentiate or wrap in ``no_grad``)."""
        out: list[list[Tensor]] = [[model(b.tokens, labels=b.labels) for b in self.train]]
        window = [[] for _ in self.names[1:]]
        for b, masks in zip(self.state, self.masks, strict=True):
            logits = model(b.tokens)
            for i, m in enumerate(masks):
                window[i].append(masked_ce(logits, b, m))
        return out + window

    def losses(self, model: Any) -> list[Tensor]:
        with torch.no_grad():
            return [torch.stack(t).double() for t in self.per_batch(model)]

    def grads(self, model: Any, theta: list[torch.nn.Parameter]) -> list[Tensor]:
        """Per target, (n_batches, n_theta) in float64."""
        out: list[list[Tensor]] = [[] for _ in self.names]
        with torch.enable_grad():
            for b in self.train:
                out[0].append(flat_grad(model(b.tokens, labels=b.labels), theta))
            for b, masks in zip(self.state, self.masks, strict=True):
                logits = model(b.tokens)
                for i, m in enumerate(masks):
                    out[i + 1].append(flat_grad(masked_ce(logits, b, m), theta, retain=i + 1 < len(masks)))
        return [torch.stack(g).double() for g in out]


def masked_ce(logits: Tensor, batch: Batch, mask: Tensor) -> Tensor:
    """Mean cross-entropy over the answers in ``mask``."""
    # at least float32, and float64 on the float64 copy, so that a small change is resolved
    flat = logits.flatten(0, 1)
    ce = F.cross_entropy(flat if flat.dtype == torch.float64 else flat.float(), batch.labels.flatten(),
                         ignore_index=IGNORE_INDEX, reduction="none").view_as(batch.labels)
    return (ce * mask).sum() / mask.sum().clamp(min=1)


def window_targets(task: TaskConfig, cfg: RealStepConfig, seed: int, device: torch.device | str,
                   draw: BatchDraw) -> Targets:
    """The training loss on held-out training batches and the state loss in every window beyond L."""
    L = task.train_length
    base = lookahead_seed(seed)
    train = [draw(task, cfg.batch_size, base + 5_000_000 + j).to(device) for j in range(cfg.train_eval_batches)]
    length = cfg.max_factor * L
    windows = [w for w in windows_for(L, length) if w.beyond]
    state = [task.sample(length, cfg.batch_size, base + 9_000_000 + length * 1000 + j).to(device)
             for j in range(cfg.eval_batches)]
    masks = []
    for b in state:
        t = torch.arange(b.tokens.shape[1], device=b.tokens.device) - b.prefix_len + 1
        answers = b.masks["state"] & b.answer_mask
        masks.append([answers & ((t > w.lo) & (t <= w.hi))[None, :] for w in windows])
    names = [("train", "<=L", 0, L)] + [("state", w.name, w.lo, w.hi) for w in windows]
    return Targets(names, train, state, masks)


def matched_random(u: Tensor, g: Tensor, n: int, seed: int, shape: Tensor | None = None) -> list[Tensor]:
    """``n`` directions r with |r| = |u| and <r, g> = <u, g>: r = a g^ + b z, a = <u, g^>, b = sqrt(|u|^2 - a^2),
    z a unit vector orthogonal to g drawn from ``shape * xi`` (xi standard normal, ``shape`` default 1), seeded."""
    u, g = u.double(), g.double()
    gen = torch.Generator().manual_seed(seed)
    gn = float(g.norm())
    gh = g / gn if gn > 0 else torch.zeros_like(g)
    a = float(u @ gh)
    b = math.sqrt(max(float(u @ u) - a * a, 0.0))
    out = []
    for _ in range(n):
        xi = torch.randn(u.shape, generator=gen, dtype=torch.float64)
        if shape is not None:
            xi = xi * shape.double().cpu()
        xi = xi.to(u.device)
        xi = xi - (xi @ gh) * gh
        out.append(a * gh + b * xi / xi.norm())
    return out


def _se(x: Tensor) -> float:
    return float(x.std()) / math.sqrt(len(x)) if len(x) > 1 else math.nan


def _z(mean: float, se: float) -> float:
    if math.isnan(se):
        return math.nan
    return mean / se if se > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))


def measure_real_step(ckpt: Checkpoint, cfg: RealStepConfig | None = None, seed: int = 0,
                      device: torch.device | str = "cpu", cut: Cut = attention_inputs_detached,
                      ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Rows per direction (the four parts, ``full``, ``matched_random``) and target, and what the checks need: the
    ``RealStep``, the ``Targets``, the sum and matching errors. Columns: ``part``, ``loss``, ``positions`` (``<=L``
    or a window), ``lo``/``hi``, ``step_norm`` and ``fraction_of_update`` (|u_part| / |u|), ``dL`` (taken) and
    ``dL_first`` (first order) with their standard errors over evaluation batches, ``z`` (dL / dL_se), on
    attention's rows ``vs_matched`` (dL minus the matched random's, paired) with ``vs_matched_se`` and
    ``vs_matched_z``, and the step's ``moments`` (its source), ``adam_step``, ``lr``, ``weight_decay``, ``clip``,
    ``update_norm`` (|u|) and ``step_loss`` (the training loss of the step's own batch)."""
    cfg = cfg or RealStepConfig()
    model = ckpt.build_model(device)
    step = next_update(ckpt, model, cut)
    at = step_state(ckpt)
    targets = window_targets(ckpt.task_config, cfg, seed, device, at.draw)
    theta = check_has_lstm(model)
    with attention_gates(model, schedule_gate(ckpt)):
        grads = targets.grads(model, theta)
        model64 = copy.deepcopy(model).double()
        theta64 = check_has_lstm(model64)
        original = [p.detach().clone() for p in theta64]
        before = targets.losses(model64)
        match = [i for i, n in enumerate(targets.names) if cfg.match in (n[0], n[1])]
        if not match:
            raise ValueError(f"match {cfg.match!r}: name the training loss ('train') or a window ({targets.names})")
        g_match = grads[match[0]].mean(0)
        randoms = matched_random(step.parts["att"], g_match, cfg.n_random, lookahead_seed(seed) + 8_500_000,
                                 shape=1 / step.denom)
        directions = {**{p: step.parts[p] for p in DIRECTIONS},
                      **{f"matched{i}": r for i, r in enumerate(randoms)}}
        taken: dict[str, list[Tensor]] = {}
        for name, d in directions.items():
            with torch.no_grad():
                add_step(theta64, -d.to(original[0].device))
            taken[name] = [a - b for a, b in zip(targets.losses(model64), before, strict=True)]
            with torch.no_grad():
                for p, o in zip(theta64, original, strict=True):
                    p.copy_(o)
    first = {name: [-(g @ d.to(g)) for g in grads] for name, d in directions.items()}
    full_norm = float(step.parts["full"].norm())
    att_norm = float(step.parts["att"].norm())
    rows = []
    for ti, (loss, positions, lo, hi) in enumerate(targets.names):
        common = {"loss": loss, "positions": positions, "lo": lo, "hi": hi, "loss_before": float(before[ti].mean()),
                  "n_eval_sequences": len(before[ti]) * cfg.batch_size}
        for part in DIRECTIONS:
            e, f = taken[part][ti], first[part][ti]
            norm = float(directions[part].norm())
            rows.append({"part": part, **common, "step_norm": norm,
                         "fraction_of_update": norm / full_norm if full_norm > 0 else math.nan,
                         "dL": float(e.mean()), "dL_se": _se(e), "dL_first": float(f.mean()), "dL_first_se": _se(f)})
        if randoms:
            draws = torch.stack([taken[f"matched{i}"][ti] for i in range(len(randoms))])  # (n, batches)
            draws_first = torch.stack([first[f"matched{i}"][ti] for i in range(len(randoms))])
            mean, spread = draws.mean(0), float(draws.mean(1).std()) if len(randoms) > 1 else 0.0
            rows.append({"part": "matched_random", **common, "step_norm": att_norm,
                         "fraction_of_update": att_norm / full_norm if full_norm > 0 else math.nan,
                         "dL": float(mean.mean()), "dL_se": math.hypot(_se(mean), spread / math.sqrt(len(randoms))),
                         "dL_first": float(draws_first.mean()), "dL_first_se": _se(draws_first.mean(0))})
            att = next(r for r in rows if r["part"] == "att" and r["positions"] == positions)
            diff = taken["att"][ti] - mean
            se = math.hypot(_se(diff), spread / math.sqrt(len(randoms)))
            att.update(vs_matched=float(diff.mean()), vs_matched_se=se, vs_matched_z=_z(float(diff.mean()), se))
    df = pd.DataFrame(rows)
    df["z"] = [_z(m, s) for m, s in zip(df.dL, df.dL_se, strict=True)]
    st = step.state
    df = df.assign(moments=st.source, adam_step=st.step + 1, lr=st.lr, weight_decay=st.weight_decay,
                   clip=step.clip, update_norm=full_norm, match=cfg.match, n_random=cfg.n_random,
                   step_loss=step.loss)
    parts_sum = sum(step.parts[p] for p in PARTS)
    # the baseline's promise: |r| = |u_att| and <r, g_m> = <u_att, g_m>, each relative to its natural scale
    scale = att_norm * float(g_match.norm())
    norm_err = max((abs(float(r.norm()) - att_norm) / att_norm for r in randoms), default=0.0) if att_norm else 0.0
    proj_err = max((abs(float((r - step.parts["att"]) @ g_match)) / scale for r in randoms),
                   default=0.0) if scale else 0.0
    return df, {"step": step, "targets": targets, "sum_error": float((parts_sum - step.parts["full"]).norm())
                / max(full_norm, 1e-30), "match_error": max(norm_err, proj_err)}


def verdicts(rows: pd.DataFrame) -> pd.DataFrame:
    """Per beyond-range window: what attention's part, taken at its real size, does to the state loss there
    (``raises`` / ``lowers`` / ``no effect detected``: |z| against 2; ``no attention path`` when the part is 0),
    and against the matched random (``baseline``: which way attention's change of the state loss differs from the
    matched random step's, |vs_matched_z| against 2, in the words of ``probe.gradients.beyond``'s baseline)."""
    out = []
    att = rows[rows.part == "att"]
    train = att[att.loss == "train"].iloc[0]
    for r in att[att.loss == "state"].itertuples():
        if r.step_norm == 0:
            v = "no attention path"
        else:
            v = "raises" if r.z > Z_DETECT else "lowers" if r.z < -Z_DETECT else "no effect detected"
        zm = getattr(r, "vs_matched_z", math.nan)
        base = ("no attention path" if v == "no attention path" else "no matched baseline" if pd.isna(zm) else
                "raises the state loss more than a matched random step" if zm > Z_DETECT else
                "lowers the state loss more than a matched random step" if zm < -Z_DETECT else
                "no difference from a matched random step detected on the state loss")
        out.append({"positions": r.positions, "verdict": v, "baseline": base, "dL_att": r.dL, "z_att": r.z,
                    "vs_matched": getattr(r, "vs_matched", math.nan), "vs_matched_z": zm,
                    "fraction_att": r.fraction_of_update, "dL_train_att": train.dL, "z_train_att": train.z})
    return pd.DataFrame(out)


def controls(checkpoint: str, info: dict[str, Any], verdict_rows: pd.DataFrame) -> list[dict[str, Any]]:
    """The sanity identities (parts sum to u; the matched directions' norm and projection) and, per window, the
    verdict against the matched random: a claimed raise must exceed the matched random's, a claimed lowering fall
    below it; no claim, nothing to refute."""
    out = [threshold_row(checkpoint, "realstep_parts_sum", info["sum_error"], SUM_TOL,
                         "|att + rec + momentum + decay - u| / |u|: an identity of the split (a sanity check)"),
           threshold_row(checkpoint, "realstep_matched_random", info["match_error"], MATCH_TOL,
                         "the matched random directions' norm and projection on the matched loss's gradient against "
                         "attention's part's, relative: fails if the baseline is not matched as stated")]
    for r in verdict_rows.itertuples():
        passed = (r.vs_matched_z > Z_DETECT if r.verdict == "raises" else
                  r.vs_matched_z < -Z_DETECT if r.verdict == "lowers" else True)
        out.append({"checkpoint": checkpoint, "positions": r.positions, **check_row(
            "realstep_vs_matched_random", CONTROL, bool(passed), value=float(r.vs_matched_z), threshold=Z_DETECT,
            verdict=r.verdict, what="z of (change along attention's part - change along random directions as long "
                                    "and as useful for the training loss): fails when the verdict's raise or "
                                    "lowering is no larger than such a random step's")})
    return out


def rollout_rows(models: dict[str, Any], targets: Targets, gates: Any = None) -> pd.DataFrame:
    """Each target's loss after each rollout branch (``kept``, ``cut``) on the same batches, and ``cut - kept``
    per batch: negative where removing attention's gradient path from the recurrent weights lowered that loss."""
    losses = {}
    for name, model in models.items():
        with attention_gates(model, gates):
            losses[name] = targets.losses(model)
    rows = []
    for ti, (loss, positions, lo, hi) in enumerate(targets.names):
        diff = losses["cut"][ti] - losses["kept"][ti]
        rows.append({"loss": loss, "positions": positions, "lo": lo, "hi": hi,
                     "loss_kept": float(losses["kept"][ti].mean()), "loss_cut": float(losses["cut"][ti].mean()),
                     "cut_minus_kept": float(diff.mean()), "cut_minus_kept_se": _se(diff),
                     "cut_minus_kept_z": _z(float(diff.mean()), _se(diff))})
    return pd.DataFrame(rows)


def outcome(z: float) -> str:
    """The rollout's reading of one target: what removing attention's path for the rollout's steps did to it."""
    if math.isnan(z):
        return "not measured"
    return "cut lowers the loss" if z < -Z_DETECT else "cut raises the loss" if z > Z_DETECT else \
        "no difference detected"


@dataclass
class RealStepReport:
    """One snapshot's real-step lookahead: ``rows`` (``measure_real_step``), ``verdicts`` (``verdicts``, with the
    moments' source, each part's share of the update and, after a rollout, its outcome per window), ``rollout``
    (``rollout_rows``; empty without one) and ``controls``."""

    rows: pd.DataFrame
    verdicts: pd.DataFrame
    rollout: pd.DataFrame
    controls: list[dict[str, Any]]


def real_step_report(ckpt: Checkpoint, cfg: RealStepConfig | None = None, seed: int = 0,
                     device: torch.device | str = "cpu", rollout: int = 0, name: str | None = None,
                     ) -> RealStepReport:
    """The real step at ``ckpt`` with its verdicts and controls, and, for ``rollout`` > 0, the run continued that
    many steps from the same state with attention's gradient path into the recurrent sublayers kept and cut
    (``probe.training.rollout``): each target's loss after both, and two checks, ``realstep_matches_adamw`` (the
    kept branch's first step, taken by torch's AdamW, against the update computed here) and, where the trajectory
    holds the snapshot ``rollout`` steps later, ``rollout_reproduces_run`` (the kept branch's weights against it,
    bit for bit: it holds on the machine, precision and thread count that trained the run)."""
    name = name or (str(ckpt.path) if ckpt.path is not None else ckpt.name)
    rows, info = measure_real_step(ckpt, cfg, seed, device)
    verdict = verdicts(rows)
    checks = controls(name, info, verdict)
    shares = rows[rows.positions == "<=L"].set_index("part").fraction_of_update
    verdict = verdict.assign(moments=rows.moments.iloc[0],
                             **{f"fraction_{p}": float(shares[p]) for p in ("rec", "momentum", "decay")})
    if rollout <= 0:
        return RealStepReport(rows, verdict, pd.DataFrame(), checks)

    kept, cut = continue_run(ckpt, rollout, "kept", device), continue_run(ckpt, rollout, "cut", device)
    names = lstm_parameter_names(kept.model)
    first = torch.cat([(ckpt.state_dict[n].double() - kept.first_step[n].double()).flatten() for n in names])
    full = info["step"].parts["full"].to(first)
    checks.append(threshold_row(name, "realstep_matches_adamw", float((first - full).norm() / full.norm()),
                                ADAMW_TOL, "|the kept rollout's first step (torch's AdamW) - the computed update| / "
                                "|update|: fails if the batch, lr, clipping, moments or bias correction differ"))
    later = ckpt.path.parent / f"step_{ckpt.step + rollout:06d}.pt" if ckpt.path is not None else None
    reproduced = None
    if later is not None and later.is_file():
        diff = weight_difference(kept.model.state_dict(), load_checkpoint(later))
        reproduced = diff == 0.0
        checks.append(threshold_row(name, "rollout_reproduces_run", diff, 0.0,
                                    f"largest |weight| difference between the kept rollout and the run's own "
                                    f"snapshot {rollout} steps later: fails if the rollout is not the run (or runs "
                                    "on another machine, precision or thread count than the run trained on)"))
    roll = rollout_rows({"kept": kept.model, "cut": cut.model}, info["targets"]).assign(rollout_steps=rollout)
    by_window = roll.set_index("positions")
    verdict = verdict.assign(rollout_steps=rollout,
                             rollout_cut_minus_kept=[float(by_window.cut_minus_kept[w]) for w in verdict.positions],
                             rollout_z=[float(by_window.cut_minus_kept_z[w]) for w in verdict.positions],
                             rollout_reproduced=reproduced)
    verdict["rollout_outcome"] = verdict.rollout_z.map(outcome)
    return RealStepReport(rows, verdict, roll, checks)
