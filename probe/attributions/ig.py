"""Integrated gradients per input position from a token baseline, kept only where the integral converges.

For a state answer at t and a number position s, only the embedding at s moves, on the straight line from the
embedding of the baseline token (the number 0) to that of x_s; every other position keeps its token. By
completeness the attributions then sum to ``logit(x) - logit(x with x_s replaced by 0)``, an occlusion effect that
is computed exactly by running the model on the replaced tokens. ``delta`` = sum of attributions minus that
effect. The number of steps doubles (16 to ``max_steps``, Gauss-Legendre) for the positions whose delta exceeds
``rel_tol * |effect| + abs_tol``; an answer with any position still above it is dropped and counted, never shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from probe.core.extras import require
from probe.models import HookedSequenceModel
from probe.tasks import Batch

BASELINE_TOKEN = 0
REL_TOL = 0.05
ABS_TOL = 0.02
"""logits: the answers' logits are of order 10, so 0.02 is far below any effect worth reading."""


class PositionLogit:
    """captum ``forward_func``: ``f(e, tokens, position, target, label) -> (rows,)``, the logit of ``label`` at
    ``target`` when the embedding at ``position`` is ``e`` (each row its own sequence and position)."""

    def __init__(self, model: HookedSequenceModel) -> None:
        self.model = model

    def __call__(self, e: Tensor, tokens: Tensor, position: Tensor, target: Tensor, label: Tensor) -> Tensor:
        rows = torch.arange(len(tokens), device=tokens.device)

        def put(x: Tensor, hook: Any) -> Tensor:
            x = x.clone()
            x[rows, position] = e.to(x.dtype)
            return x

        with self.model.hooks(fwd_hooks=[("hook_embed", put)]):
            logits = self.model(tokens)
        return logits[rows, target, label]


@dataclass
class PositionIG:
    """One row per (answer, position) and the answer-level counts."""

    table: pd.DataFrame  # answer, sequence, t, position, distance, ig, effect, delta, steps, converged
    n_answers: int
    n_dropped: int

    def kept(self) -> pd.DataFrame:
        """Rows of the answers whose every position converged."""
        bad = set(self.table.loc[~self.table.converged, "answer"])
        return self.table[~self.table.answer.isin(bad)]


def choose_answers(batch: Batch, n_sequences: int, per_sequence: int) -> list[tuple[int, int]]:
    """(sequence, position) of state answers: for each of the first ``n_sequences`` sequences, ``per_sequence``
    evenly spaced state answers ending with the last one (so the far distances are covered)."""
    state = (batch.masks["state"] & batch.answer_mask).cpu()
    out = []
    for i in range(min(n_sequences, state.shape[0])):
        pos = state[i].nonzero().flatten().tolist()
        if not pos:
            continue
        idx = torch.linspace(len(pos) - 1, 0, per_sequence + 1)[:per_sequence].round().long().unique()
        out.extend((i, pos[j]) for j in idx.tolist())
    return out


def position_ig(model: HookedSequenceModel, batch: Batch, answers: Sequence[tuple[int, int]],
                max_steps: int = 256, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL,
                reference: Tensor | None = None, internal_rows: int = 512) -> PositionIG:
    """IG of each answer's correct logit to each earlier number position (see the module docstring).
    ``reference`` overrides the start of the path (the tests break the method with it); the completeness check
    always uses the exact effect of the baseline token."""
    state = (batch.masks["state"] & batch.answer_mask)
    tokens, labels, p = batch.tokens, batch.labels, batch.prefix_len
    device = tokens.device
    recs = []
    for a, (i, t) in enumerate(answers):
        for s in range(p, t + 1):
            if bool(state[i, s]) and int(tokens[i, s]) != BASELINE_TOKEN:
                recs.append((a, i, t, s))
    if not recs:
        return PositionIG(pd.DataFrame(columns=["answer", "sequence", "t", "position", "distance", "ig", "effect",
                                                "delta", "steps", "converged"]), len(answers), 0)
    a_idx, seq, tgt, pos = (torch.tensor(c, device=device) for c in zip(*recs, strict=True))
    tok = tokens[seq]
    lab = labels[seq, tgt]
    emb = model.embed.weight.detach()
    e_x = emb[tok[torch.arange(len(seq)), pos]]
    e_b = emb[BASELINE_TOKEN].expand_as(e_x) if reference is None else reference.expand_as(e_x)
    replaced = tok.clone()
    replaced[torch.arange(len(seq)), pos] = BASELINE_TOKEN
    with torch.no_grad():
        rows = torch.arange(len(seq), device=device)
        effect = model(tok)[rows, tgt, lab] - model(replaced)[rows, tgt, lab]
    fwd = PositionLogit(model)
    ig = require("captum.attr").IntegratedGradients(fwd)  # captum: the [attributions] extra, used here alone
    attr = torch.zeros(len(seq), device=device)
    delta = torch.full((len(seq),), float("inf"), device=device)
    steps = torch.zeros(len(seq), dtype=torch.long)
    pending = torch.arange(len(seq), device=device)
    n = 16
    while len(pending) and n <= max_steps:
        a = ig.attribute(e_x[pending], baselines=e_b[pending], n_steps=n, method="gausslegendre",
                         additional_forward_args=(tok[pending], pos[pending], tgt[pending], lab[pending]),
                         internal_batch_size=internal_rows)
        attr[pending] = a.sum(dim=-1).detach()
        delta[pending] = attr[pending] - effect[pending]
        steps[pending.cpu()] = n
        ok = delta[pending].abs() <= rel_tol * effect[pending].abs() + abs_tol
        pending = pending[~ok]
        n *= 2
    converged = delta.abs() <= rel_tol * effect.abs() + abs_tol
    table = pd.DataFrame({"answer": a_idx.cpu().numpy(), "sequence": seq.cpu().numpy(),
                          "t": (tgt - p).cpu().numpy(), "position": (pos - p).cpu().numpy(),
                          "distance": (tgt - pos).cpu().numpy(), "ig": attr.cpu().numpy(),
                          "effect": effect.cpu().numpy(), "delta": delta.cpu().numpy(),
                          "steps": steps.numpy(), "converged": converged.cpu().numpy()})
    dropped = table.loc[~table.converged, "answer"].nunique()
    return PositionIG(table, len(answers), int(dropped))


def ig_profile(res: PositionIG) -> pd.DataFrame:
    """Kept answers only: rows ``distance, ig, effect, n`` (means over the answers' positions at each distance)."""
    kept = res.kept()
    if kept.empty:
        return pd.DataFrame()
    return kept.groupby("distance").agg(ig=("ig", "mean"), effect=("effect", "mean"), n=("ig", "size")).reset_index()


def ig_far(res: PositionIG, k: int) -> pd.DataFrame:
    """Kept answers at t > k: one row ``k, far_share`` = mean over answers of the share of |ig| from numbers more
    than k back, ``n_answers``."""
    kept = res.kept()
    kept = kept[kept.t > k]
    if kept.empty:
        return pd.DataFrame()
    share = kept.assign(mag=kept.ig.abs(), far=(kept.distance > k) * kept.ig.abs()).groupby("answer")[["mag", "far"]]
    per = share.sum()
    per = per[per.mag > 0]
    return pd.DataFrame([{"k": k, "far_share": float((per.far / per.mag).mean()), "n_answers": len(per)}])
