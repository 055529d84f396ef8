"""First-order lookahead over every state answer (kept for notebook 03's record; the CLI runs ``beyond``).

For the recurrent weights theta (each block's cell, ``lstm_parameters``), ``d_part`` is the descent direction of the
*training* loss part (part in att, rec, full), averaged over batches drawn as the trainer draws them (length uniform
in 1..L_train, one length per batch), and preconditioned by AdamW's second moments when the checkpoint holds them:
``d = g / (sqrt(v / (1 - beta2**t)) + eps)`` (the first moment is left out: the question is what a step along each
gradient part alone would do). For a target loss T (the training loss over held-out training batches, or the
state-subtask loss at an evaluation length L) the first-order change after the step ``theta - eta * d_part`` is
``-eta <grad T, d_part>``; the change is also measured by taking that step (in float64, on the same batches).
``eta`` is one number per checkpoint, chosen so that the full-gradient step moves theta by ``rel_step * |theta|``,
so the three parts are compared at the same step size and the first-order change of ``full`` is the sum of the
other two.

The paper's interference hypothesis predicts that a step along the attention-path part raises the state loss at 3x
the training length while it lowers the training loss. A step that lowers the 3x state loss speaks against it at that
checkpoint, to first order and at this step size; a change within two standard errors is "no effect detected", which
refutes nothing (a small step cannot see an effect that only a real optimizer step, or many, would show).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from probe.core.inputs import check_inputs
from probe.core.progress import progress_iter
from probe.gradients.beyond import verdict_beyond
from probe.gradients.decomposition import Cut, attention_inputs_detached, check_has_lstm, flat_grad, state_loss
from probe.gradients.inputs import (  # noqa: F401  (re-exported: notebook 03, old imports)
    LOOKAHEAD_SEED_BASE,
    LookaheadConfig,
    Moments,
    adam_moments,
    add_step,
    lookahead_seed,
)
from probe.models import HookedSequenceModel
from probe.tasks import Batch, TaskConfig
from probe.training.batches import BatchDraw, training_batch

PARTS = ("att", "rec", "full")
Z_SUPPORT = 2.0
"""|first-order change| / standard error above which a change counts as detected in the verdict."""


@dataclass
class Target:
    name: str       # "train" or "state"
    length: int | None
    batches: list[Batch]

    def loss(self, model: HookedSequenceModel, batch: Batch) -> Tensor:
        if self.name == "train":
            return model(batch.tokens, labels=batch.labels)  # the trainer's loss
        return state_loss(model(batch.tokens), batch)


def _targets(task: TaskConfig, cfg: LookaheadConfig, seed: int, device: torch.device | str,
             draw: BatchDraw) -> list[Target]:
    base = lookahead_seed(seed)
    train = [draw(task, cfg.batch_size, base + 5_000_000 + j).to(device)
             for j in range(cfg.train_eval_batches)]
    out = [Target("train", None, train)]
    lengths = cfg.lengths or (task.train_length, 3 * task.train_length)
    for length in lengths:
        out.append(Target("state", length, [task.sample(length, cfg.batch_size, base + 6_000_000 + length * 1000 + j)
                                            .to(device) for j in range(cfg.eval_batches)]))
    return out


def measure_lookahead(model: HookedSequenceModel, task: TaskConfig, moments: Moments | None = None,
              cfg: LookaheadConfig | None = None, seed: int = 0, device: torch.device | str = "cpu",
              cut: Cut = attention_inputs_detached, progress: bool = False,
              draw: BatchDraw = training_batch) -> pd.DataFrame:
    """One row per part (att, rec, full) and target (``loss`` train or state, ``length``); columns in the CLI's
    --help. ``cut`` is a parameter so that the tests can break the method; ``draw`` draws training batches as the
    run did (a checkpoint's ``probe.training.state.step_state(ckpt).draw``)."""
    check_inputs("probe.gradients.measure_lookahead", model=model, task=task)
    cfg = cfg or LookaheadConfig()
    theta = check_has_lstm(model)
    targets = _targets(task, cfg, seed, device, draw)
    precondition = moments.precondition if moments is not None else (lambda g: g)
    if moments is not None:
        moments.v = moments.v.to(next(model.parameters()).device)

    # gradients of each target, per evaluation batch
    grads: list[Tensor] = []
    with torch.enable_grad():
        for tgt in targets:
            per = [flat_grad(tgt.loss(model, b), theta) for b in tgt.batches]
            grads.append(torch.stack(per))
    mean_grad = [g.mean(0) for g in grads]

    # the directions, batch by batch: per-batch projections give the standard error over direction batches
    base = lookahead_seed(seed)
    sums = {p: torch.zeros_like(mean_grad[0]) for p in PARTS}
    proj = {p: [] for p in PARTS}  # (n_batches, n_targets)
    for k in progress_iter(range(cfg.n_batches), "lookahead batches", progress):
        batch = draw(task, cfg.batch_size, base + k).to(device)
        with torch.enable_grad():
            g = flat_grad(model(batch.tokens, labels=batch.labels), theta)
            with cut(model):
                r = flat_grad(model(batch.tokens, labels=batch.labels), theta)
        for part, vec in (("att", g - r), ("rec", r), ("full", g)):
            d = precondition(vec)
            sums[part] += d
            proj[part].append(torch.stack([d @ m for m in mean_grad]))
    directions = {p: s / cfg.n_batches for p, s in sums.items()}
    theta_norm = float(torch.cat([p.detach().flatten() for p in theta]).norm())
    full_norm = float(directions["full"].norm())
    eta = cfg.rel_step * theta_norm / full_norm if full_norm > 0 else 0.0

    # the real step, in float64 so that a change of 1e-8 is resolved
    model64 = copy.deepcopy(model).double()
    theta64 = check_has_lstm(model64)
    original = [p.detach().clone() for p in theta64]

    def losses64() -> list[float]:
        with torch.no_grad():
            return [float(torch.stack([t.loss(model64, b) for b in t.batches]).mean()) for t in targets]

    before = losses64()
    after: dict[str, list[float]] = {}
    with torch.no_grad():
        for part, d in directions.items():
            add_step(theta64, -eta * d.double())
            after[part] = losses64()
            for p, o in zip(theta64, original, strict=True):
                p.copy_(o)

    rows = []
    for part in PARTS:
        per_batch = torch.stack(proj[part])  # (K, n_targets)
        for i, tgt in enumerate(targets):
            first = -eta * float(directions[part] @ mean_grad[i])
            se_dir = eta * float(per_batch[:, i].std()) / math.sqrt(cfg.n_batches) if cfg.n_batches > 1 else math.nan
            per_eval = grads[i] @ directions[part]
            se_eval = eta * float(per_eval.std()) / math.sqrt(len(per_eval)) if len(per_eval) > 1 else math.nan
            rows.append({"part": part, "loss": tgt.name, "length": tgt.length,
                         "preconditioned": moments is not None,
                         "moments": moments.source if moments is not None else "none",
                         "eta": eta, "rel_step": cfg.rel_step,
                         "dL_first": first, "dL_se": math.hypot(se_dir, se_eval), "dL_se_batches": se_dir,
                         "dL_se_eval": se_eval, "dL_measured": after[part][i] - before[i],
                         "loss_before": before[i], "n_batches": cfg.n_batches,
                         "n_eval_sequences": len(tgt.batches) * cfg.batch_size})
    df = pd.DataFrame(rows)
    df["z"] = df.dL_first / df.dL_se
    scale = df.groupby(["loss", "length"], dropna=False).dL_first.transform(lambda s: s.abs().max())
    df["first_order_error"] = ((df.dL_measured - df.dL_first).abs() / scale.where(scale > 0)).fillna(0.0)
    return df


def verdict(rows: pd.DataFrame, train_length: int) -> dict[str, Any]:
    """Does a step along -g_att raise the 3x state loss while lowering the training loss? One flat row. Rows with a
    ``positions`` column (the beyond-range lookahead) get ``beyond.verdict_beyond``'s rule."""
    if "positions" in rows.columns:
        return verdict_beyond(rows)

    def row(loss: str, length: int | None) -> pd.Series | None:
        sel = rows[(rows.part == "att") & (rows.loss == loss)]
        sel = sel[sel.length.isna()] if length is None else sel[sel.length == length]
        return sel.iloc[0] if len(sel) else None

    far, train = row("state", 3 * train_length), row("train", None)
    if far is None or train is None:
        return {"verdict": "not measured", "detail": f"the lookahead did not evaluate length {3 * train_length}"}
    out = {"dL_state_3x_att": far.dL_first, "z_state_3x_att": far.z, "dL_train_att": train.dL_first,
           "z_train_att": train.z}
    if far.dL_first == 0 and train.dL_first == 0:
        out["verdict"] = "no attention path"  # gate 0 (or no attention): the part is exactly 0
    elif far.z > Z_SUPPORT and train.z < -Z_SUPPORT:
        out["verdict"] = "supports"
    elif far.z > Z_SUPPORT:
        out["verdict"] = "neither"  # raises the 3x loss without lowering the training loss: not a trade-off
    elif far.z < -Z_SUPPORT:
        out["verdict"] = "lowers"  # evidence against the hypothesis at this checkpoint, to first order
    else:
        out["verdict"] = "no effect detected"  # absence of evidence, never a refutation
    out["detail"] = {"supports": "the attention-path step raises the 3x state loss and lowers the training loss",
                     "neither": "the attention-path step raises the 3x state loss but does not lower the training "
                                "loss",
                     "lowers": "the attention-path step lowers the 3x state loss (first order, this step size)",
                     "no effect detected": "the attention-path step changes the 3x state loss by less than 2 "
                                           "standard errors",
                     "no attention path": "attention is gated off: g_att is exactly 0"}[out["verdict"]]
    return out
