"""The lookahead: what a real step along each gradient part does to the state loss beyond the training range.

Directions ``d_part`` (att, rec, full) are the training-loss gradient parts averaged over batches drawn as the trainer
drew them (the draw the checkpoint names) and preconditioned by AdamW's second moments when the checkpoint holds them
(``inputs.Moments``), plus ``n_random`` random directions shaped by the same preconditioner (``P(xi)``, xi standard
normal). Every direction is normalised, so that all take a step of the same length ``h = scale * U``, U the size of
the optimizer's update at that snapshot (``update_size``). Targets: the state loss at stream positions t > L and t >
2L of fixed evaluation sequences at ``factor * L``, and the training loss on held-out training batches. Each effect is
a change per unit of step length, ``(T(theta - h d^) - T(theta)) / h`` (scale 0: the first-order ``-<grad T, d^>``),
measured on the same evaluation batches for every direction, so that differences between directions are paired.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from probe.core.inputs import check_inputs
from probe.core.progress import progress_iter
from probe.core.rows import CONTROL, check_row, threshold_row
from probe.gradients.controls import FIRST_ORDER_TOL
from probe.gradients.decomposition import Cut, attention_inputs_detached, check_has_lstm, flat_grad
from probe.gradients.inputs import LookaheadConfig, Moments, add_step, lookahead_seed
from probe.models import HookedSequenceModel
from probe.tasks import IGNORE_INDEX, Batch, TaskConfig
from probe.training.batches import BatchDraw, training_batch

PARTS = ("att", "rec", "full")
Z_DETECT = 2.0
"""|z| above which an effect counts as detected; at or below it the verdict is "no effect detected"."""
FALLBACK_REL_UPDATE = 1e-2
"""Update size, relative to |theta|, used only when the checkpoint holds neither moments nor a learning rate."""
POSITIONS_TOL = 0
"""Answers at in-range positions a beyond-range target may use."""


@dataclass
class TargetGroup:
    """Evaluation batches shared by one or more targets: ``fn(model, batch)`` returns one loss per target, in the
    order of ``names`` ((loss, positions, length) each); ``starts[i]`` is the last stream position target i must
    leave out (0: none), ``min_position[i]`` the smallest stream position target i actually used (the
    ``lookahead_positions`` check reads it)."""

    names: list[tuple[str, str, int | None]]
    batches: list[Any]
    fn: Callable[[Any, Any], Tensor]
    starts: list[int]
    min_position: list[int]


def beyond_mask(batch: Batch, start: int) -> Tensor:
    """State answers at stream positions t > ``start`` (t counts from 1 after the dictionary prefix)."""
    t = torch.arange(batch.tokens.shape[1], device=batch.tokens.device) - batch.prefix_len + 1
    return batch.masks["state"] & batch.answer_mask & (t > start)[None, :]


def _masked_ce(logits: Tensor, batch: Batch, mask: Tensor) -> Tensor:
    ce = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX,
                         reduction="none").view_as(batch.labels)
    return (ce * mask).sum() / mask.sum().clamp(min=1)


def model_targets(task: TaskConfig, cfg: LookaheadConfig, seed: int, device: torch.device | str,
                  draw: BatchDraw = training_batch) -> list[TargetGroup]:
    """The training loss on held-out training batches, and the state loss beyond L and beyond 2L on the same fixed
    sequences at ``cfg.factor * L``."""
    L = task.train_length
    base = lookahead_seed(seed)
    train = [draw(task, cfg.batch_size, base + 5_000_000 + j).to(device)
             for j in range(cfg.train_eval_batches)]
    length = cfg.factor * L
    state = [task.sample(length, cfg.batch_size, base + 7_000_000 + length * 1000 + j).to(device)
             for j in range(cfg.eval_batches)]
    starts = [L, 2 * L]
    masks = [[beyond_mask(b, s) for s in starts] for b in state]
    min_pos = []
    for i in range(len(starts)):
        used = [torch.nonzero(m[i].any(0)).flatten() for m in masks]
        first = [int(u[0]) - state[0].prefix_len + 1 for u in used if len(u)]
        min_pos.append(min(first) if first else length + 1)
    index = {id(b): k for k, b in enumerate(state)}

    def state_fn(model: Any, b: Batch) -> Tensor:
        logits = model(b.tokens)
        return torch.stack([_masked_ce(logits, b, m) for m in masks[index[id(b)]]])

    return [TargetGroup([("train", "<=L", None)], train,
                        lambda model, b: model(b.tokens, labels=b.labels).reshape(1), [0], [1]),
            TargetGroup([("state", ">L", length), ("state", ">2L", length)], state, state_fn, starts, min_pos)]


def gradient_parts(theta: list[torch.nn.Parameter], losses: Iterable[Callable[[], Tensor]],
                   cut: Callable[[], AbstractContextManager[Any]], precondition: Callable[[Tensor], Tensor],
                   ) -> dict[str, Tensor]:
    """d_att, d_rec, d_full: each batch's loss differentiated twice (as is, and inside ``cut``), averaged, then
    preconditioned."""
    sums: dict[str, Tensor] = {}
    n = 0
    for loss in losses:
        with torch.enable_grad():
            g = flat_grad(loss(), theta)
            with cut():
                r = flat_grad(loss(), theta)
        for part, vec in (("att", g - r), ("rec", r), ("full", g)):
            sums[part] = sums.get(part, 0) + vec
        n += 1
    return {p: precondition(s / n) for p, s in sums.items()}


def random_directions(like: Tensor, n: int, precondition: Callable[[Tensor], Tensor], seed: int) -> list[Tensor]:
    """``n`` draws ``P(xi)``, xi standard normal: random, but scaled per coordinate as the preconditioned parts are."""
    g = torch.Generator().manual_seed(seed)
    return [precondition(torch.randn(like.shape, generator=g, dtype=torch.float64).to(like)) for _ in range(n)]


def update_size(moments: Moments | None, d_full: Tensor, theta_norm: float, n: int,
                train_lr: float | None) -> tuple[float, str]:
    """U = |lr * m_hat / (sqrt(v_hat) + eps)|, the next AdamW update's size on theta (weight decay left out), and
    where it came from. Trajectory snapshots hold v but not m: m_hat is then the mean full gradient, so U = lr
    |d_full|. Without moments, an Adam step whose every coordinate moves by lr (its first step, and a bound later):
    lr sqrt(n), lr the run's scheduled learning rate at the checkpoint's step. Without a learning rate either:
    1e-2 |theta|."""
    if moments is not None and moments.lr is not None:
        if moments.m is not None:
            m_hat = moments.m.to(d_full) / (1 - moments.beta1 ** moments.step)
            return moments.lr * float(moments.precondition(m_hat).norm()), "adam m and v"
        return moments.lr * float(d_full.norm()), "adam v, m = mean gradient"
    if train_lr:
        return train_lr * math.sqrt(n), "no moments: lr sqrt(n)"
    return FALLBACK_REL_UPDATE * theta_norm, "no moments or lr: 1e-2 |theta|"


def _z(mean: float, se: float) -> float:
    if math.isnan(se):  # one evaluation batch: no standard error, so nothing can count as detected
        return math.nan
    if se > 0:
        return mean / se
    return 0.0 if mean == 0 else math.copysign(math.inf, mean)


def _power(e: Tensor) -> dict[str, Any]:
    """Whether an arm could detect anything at this size: ``z_if_consistent`` is the z its batches would give if
    every one moved the loss the same way by the amount it did (mean |e| / se of |e|). At or below Z_DETECT, not even
    an effect of one sign in every batch would count: one batch carries the mean (a trained model's training loss
    after a real-size step is such an arm: z near +-1 for every direction), so its z says nothing either way."""
    z = _z(float(e.abs().mean()), _se(e.abs()))
    return {"z_if_consistent": z, "powered": bool(z > Z_DETECT)}


def _se(x: Tensor) -> float:
    return float(x.std()) / math.sqrt(len(x)) if len(x) > 1 else math.nan


def measure_steps(model: Any, model_step: Any, theta: list[torch.nn.Parameter],
                  theta_step: list[torch.nn.Parameter], groups: list[TargetGroup], directions: dict[str, Tensor],
                  randoms: list[Tensor], scales: tuple[float, ...], update_norm: float, check_length: float,
                  progress: bool = False) -> tuple[pd.DataFrame, float]:
    """Rows per direction (att, rec, full, random), target and scale; and the first-order check's error. Gradients
    are taken on ``model``, steps on ``model_step`` (a float64 copy, so that a small step is resolved). ``progress``:
    a bar over the directions (each one float64 pass per step size over every evaluation batch)."""
    grads = []
    with torch.enable_grad():
        for grp in groups:
            per = []
            for b in grp.batches:
                losses = grp.fn(model, b)
                per.append(torch.stack([flat_grad(losses[i], theta, retain=i + 1 < len(losses))
                                        for i in range(len(losses))]))
            grads.append(torch.stack(per).double())  # (B, k, n)
    original = [p.detach().clone() for p in theta_step]

    def losses() -> list[Tensor]:
        with torch.no_grad():
            return [torch.stack([grp.fn(model_step, b) for b in grp.batches]).double() for grp in groups]

    before = losses()
    units = {**{p: d.double() for p, d in directions.items()}, **{f"random{i}": r.double()
                                                                   for i, r in enumerate(randoms)}}
    norms = {k: float(u.norm()) for k, u in units.items()}
    units = {k: u / norms[k] if norms[k] > 0 else u for k, u in units.items()}

    def stepped(unit: Tensor, h: float) -> list[Tensor]:
        with torch.no_grad():
            add_step(theta_step, -h * unit)
        out = [(a - b) / h for a, b in zip(losses(), before, strict=True)]
        with torch.no_grad():
            for p, o in zip(theta_step, original, strict=True):
                p.copy_(o)
        return out

    effects: dict[tuple[str, float], list[Tensor]] = {}
    tiny_steps: dict[str, list[Tensor]] = {}
    for k, u in progress_iter(list(units.items()), "lookahead directions", progress):
        effects[(k, 0.0)] = [-(g @ u) for g in grads]  # (B, k) per group
        for s in scales:
            effects[(k, s)] = stepped(u, s * update_norm) if norms[k] > 0 else [torch.zeros_like(b) for b in before]
        if norms[k] > 0:  # the instrument check: a tiny real step must agree with the first-order prediction
            tiny_steps[k] = stepped(u, check_length)
    errors = []
    for gi in range(len(groups)):
        tiny = {k: t[gi].mean(0) for k, t in tiny_steps.items()}
        first = {k: effects[(k, 0.0)][gi].mean(0) for k in tiny}
        if tiny:
            scale = torch.stack([f.abs() for f in first.values()]).max(0).values
            for k in tiny:
                err = ((tiny[k] - first[k]).abs() / scale.where(scale > 0, torch.ones_like(scale)))
                errors.append(float(err.max()))
    n_rand = len(randoms)
    rows = []
    for s in (0.0, *scales):
        for gi, grp in enumerate(groups):
            rand = torch.stack([effects[(f"random{i}", s)][gi] for i in range(n_rand)]) if n_rand else None
            for ti, (loss, positions, length) in enumerate(grp.names):
                common = {"loss": loss, "positions": positions, "length": length, "step_scale": s,
                          "step_length": s * update_norm, "n_eval_batches": len(grp.batches),
                          "loss_before": float(before[gi][:, ti].mean()), "min_position": grp.min_position[ti]}
                rand_b = rand[:, :, ti].mean(0) if rand is not None else None
                draw_sd = float(rand[:, :, ti].mean(1).std()) if rand is not None and n_rand > 1 else 0.0
                for part in PARTS:
                    e = effects[(part, s)][gi][:, ti]
                    row = {"part": part, **common, "direction_norm": norms[part], "effect": float(e.mean()),
                           "effect_se": _se(e), **_power(e)}
                    if rand_b is not None:
                        diff = e - rand_b
                        se = math.hypot(_se(diff), draw_sd / math.sqrt(n_rand))
                        row.update(vs_random=float(diff.mean()), vs_random_se=se, vs_random_z=_z(float(diff.mean()),
                                                                                                  se))
                    if part == "att":  # attention's part against the rest, per unit of step, same batches
                        diff = e - effects[("rec", s)][gi][:, ti]
                        row.update(vs_rec=float(diff.mean()), vs_rec_se=_se(diff),
                                   vs_rec_z=_z(float(diff.mean()), _se(diff)))
                    rows.append(row)
                if rand_b is not None:
                    se = math.hypot(_se(rand_b), draw_sd / math.sqrt(n_rand))
                    rows.append({"part": "random", **common, "direction_norm": norms["random0"],
                                 "effect": float(rand_b.mean()), "effect_se": se, **_power(rand_b)})
    df = pd.DataFrame(rows)
    df["z"] = [_z(m, se) for m, se in zip(df.effect, df.effect_se, strict=True)]
    df["dL"] = df.effect * df.step_length
    return df, max(errors, default=0.0)


def measure_beyond_range(model: HookedSequenceModel, task: TaskConfig, moments: Moments | None = None,
                         cfg: LookaheadConfig | None = None, seed: int = 0,
                         device: torch.device | str = "cpu", cut: Cut = attention_inputs_detached,
                         train_lr: float | None = None, draw: BatchDraw = training_batch, progress: bool = False,
                         ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The lookahead's rows on one model (columns in the CLI's --help) and what its checks need. ``train_lr`` and
    ``draw`` are the run's, as its checkpoint records them (``probe.training.state.step_state``): the learning rate
    at the checkpoint's step and the function that drew its training batches. ``progress``: a bar over the
    directions stepped along (most of the time)."""
    check_inputs("probe.gradients.measure_beyond_range", model=model, task=task)
    cfg = cfg or LookaheadConfig()
    theta = check_has_lstm(model)
    if moments is not None:
        moments.v = moments.v.to(next(model.parameters()).device)
        if moments.m is not None:
            moments.m = moments.m.to(moments.v.device)
    precondition = moments.precondition if moments is not None else (lambda g: g)
    base = lookahead_seed(seed)
    train = [draw(task, cfg.batch_size, base + k).to(device) for k in range(cfg.n_batches)]
    directions = gradient_parts(theta, [lambda b=b: model(b.tokens, labels=b.labels) for b in train],
                                lambda: cut(model), precondition)
    randoms = random_directions(directions["full"], cfg.n_random, precondition, base + 8_000_000)
    theta_norm = float(torch.cat([p.detach().flatten() for p in theta]).norm())
    n = sum(p.numel() for p in theta)
    update_norm, source = update_size(moments, directions["full"], theta_norm, n, train_lr)
    groups = model_targets(task, cfg, seed, device, draw)
    model64 = copy.deepcopy(model).double()
    df, err = measure_steps(model, model64, theta, check_has_lstm(model64), groups, directions, randoms,
                            cfg.scales, update_norm, cfg.rel_step * theta_norm, progress)
    df = df.assign(update_norm=update_norm, update_source=source, rel_update=update_norm / theta_norm,
                   preconditioned=moments is not None,
                   moments=moments.source if moments is not None else "none", n_batches=cfg.n_batches,
                   n_random=cfg.n_random, n_eval_sequences=[n_ * cfg.batch_size for n_ in df.n_eval_batches])
    checks = {"first_order_error": err, "starts": {(t[1]): s for g in groups for t, s in zip(g.names, g.starts,
                                                                                              strict=True)}}
    return df, checks


# --- verdict and checks --------------------------------------------------------------------------------------------
def _pick(rows: pd.DataFrame, part: str, positions: str, scale: float) -> pd.Series | None:
    sel = rows[(rows.part == part) & (rows.positions == positions) & (rows.step_scale == scale)]
    return sel.iloc[0] if len(sel) else None


def verdict_beyond(rows: pd.DataFrame, scale: float | None = None) -> dict[str, Any]:
    """Does a step along -d_att raise the state loss beyond L while lowering the training loss, at the real
    update's size (``scale`` 1, else the largest measured)? And does it raise that loss more than a random step as
    long does?"""
    scale = scale if scale is not None else (1.0 if (rows.step_scale == 1.0).any() else float(rows.step_scale.max()))
    far, train, far2 = (_pick(rows, "att", p, scale) for p in (">L", "<=L", ">2L"))
    if far is None or train is None:
        return {"verdict": "not measured", "detail": "the lookahead has no beyond-range row at this step size"}
    out: dict[str, Any] = {"verdict_scale": scale, "effect_beyond_L_att": far.effect, "z_beyond_L_att": far.z,
                           "z_beyond_2L_att": far2.z if far2 is not None else math.nan,
                           "effect_train_att": train.effect, "z_train_att": train.z,
                           "z_vs_random_beyond_L": far.get("vs_random_z", math.nan),
                           "z_vs_random_train": train.get("vs_random_z", math.nan),
                           "z_att_vs_rec_beyond_L": far.get("vs_rec_z", math.nan)}
    if far.direction_norm == 0:
        out["verdict"] = "no attention path"
    elif far.z > Z_DETECT and train.z < -Z_DETECT:
        out["verdict"] = "supports"
    elif far.z > Z_DETECT:
        out["verdict"] = "neither"
    elif far.z < -Z_DETECT:
        out["verdict"] = "lowers"
    else:
        out["verdict"] = "no effect detected"
    out = {k: float(v) if isinstance(v, (int, float)) else v for k, v in out.items()}
    zr = out["z_vs_random_beyond_L"]
    # the words say which loss moved which way, against a random step as long (not "harmful", which read oddly
    # for a step that lowers the loss)
    out["baseline"] = ("no attention path" if out["verdict"] == "no attention path" else
                       "no random baseline" if math.isnan(zr) else
                       "raises the state loss beyond L more than a random step" if zr > Z_DETECT else
                       "lowers the state loss beyond L more than a random step" if zr < -Z_DETECT else
                       "no difference from a random step detected beyond L")
    zt = out["z_vs_random_train"]
    out["baseline_train"] = ("no attention path" if out["verdict"] == "no attention path" else
                             "no random baseline" if math.isnan(zt) else
                             "lowers the training loss more than a random step" if zt < -Z_DETECT else
                             "lowers the training loss less than a random step" if zt > Z_DETECT else
                             "no difference from a random step detected on the training loss")
    out["train_arm_powered"] = bool(train.get("powered", True))
    out["detail"] = {
        "supports": "a real-size step along -g_att raises the state loss beyond L and lowers the training loss: "
                    "attention's gradient trades the state beyond L for the training loss, the harm the README's "
                    "findings name",
        "neither": "a real-size step along -g_att raises the state loss beyond L but does not lower the training "
                   "loss",
        "lowers": "a real-size step along -g_att lowers the state loss beyond L: one step of attention's gradient "
                  "does not harm the state beyond L at this checkpoint (no effect of the kind the README's findings "
                  "name is detected here; their evidence is the training-time cut)",
        "no effect detected": "a real-size step along -g_att changes the state loss beyond L by at most 2 "
                              "standard errors: no effect detected",
        "no attention path": "attention is gated off: g_att is exactly 0"}[out["verdict"]]
    if not out["train_arm_powered"] and out["verdict"] != "no attention path":
        out["detail"] += ("; the training-loss arm has no power at this size (z would stay within 2 even if every "
                          "batch moved the same way), so its z says nothing")
    return out


def first_order_check(checkpoint: str, error: float) -> dict[str, Any]:
    return threshold_row(checkpoint, "lookahead_first_order", error, FIRST_ORDER_TOL,
                         "max |effect after a tiny real step - first-order effect| / max over directions |first-order "
                         "effect|: fails if the gradient, the preconditioner or the step used for the prediction "
                         "are not the ones that change the loss")


def positions_check(checkpoint: str, rows: pd.DataFrame, starts: dict[str, int]) -> dict[str, Any]:
    """Answers at in-range positions used by a beyond-range target: must be none."""
    state = rows[rows["loss"] == "state"].drop_duplicates("positions")
    bad = sum(int(r.min_position <= starts[r.positions]) for r in state.itertuples())
    return threshold_row(checkpoint, "lookahead_positions", bad, POSITIONS_TOL,
                         "beyond-range targets whose answers include a position t <= L (or <= 2L): fails if the "
                         "target mask lets in-range answers in")


def random_baseline_control(checkpoint: str, v: dict[str, Any]) -> dict[str, Any]:
    """The verdict's claim against the random baseline: a claimed raise (``supports``, ``neither``) must be larger
    than a random step's of the same length, a claimed lowering smaller; no claim, nothing to refute."""
    z = float(v.get("z_vs_random_beyond_L", math.nan))
    claim = v.get("verdict")
    if claim in ("supports", "neither"):
        passed = z > Z_DETECT
    elif claim == "lowers":
        passed = z < -Z_DETECT
    else:
        passed = True
    return {"checkpoint": checkpoint, **check_row(
        "lookahead_vs_random", CONTROL, passed, value=z, threshold=Z_DETECT, verdict=claim,
        what="z of (effect along -g_att - effect along random directions of equal length, same preconditioner) "
             "beyond L: fails when the verdict's raise (or lowering) is no larger than a random step's, i.e. "
             "not specific to attention")}
