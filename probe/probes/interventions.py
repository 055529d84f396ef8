"""Interventions on the recurrent state: whole-state interchange, same-sum control, probe-subspace interchange and its
random-subspace baseline."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from probe.core.inputs import check_inputs
from probe.core.seeds import PATCHING
from probe.errors import ProbeError
from probe.models import HookedSequenceModel
from probe.probes.fit import lstm_blocks, recurrent_cell, state_names
from probe.tasks import Batch, TaskConfig

PATCH_SEED_BASE = PATCHING
"""Patching pairs: the ``patching`` entry of ``probe.core.seeds`` (it shares its value with ``lookahead``)."""

PATCH_FRACTIONS = (0.25, 0.5, 0.75)
"""Patch positions, as fractions of the stream length: early, middle and late states."""

KINDS = ("full", "same_sum", "subspace", "subspace_random")
"""``full``: the whole recurrent state (``fit.state_names``: the LSTM's (h, c)) of a source with another s_t.
``same_sum``: the whole state of a source with the *same* s_t and another history. ``subspace``: only the component
of each state vector that the s_t probe on it reads, from the ``full`` source. ``subspace_random`` (only with
``random_draws``): the same interchange through random subspaces of the same rank, pooled over the draws."""

States = dict[int, tuple[Tensor, ...]]
"""Per block, its recurrent state at one position: the cell's ``STATES`` in order (the LSTM's (h, c), the GRU's
(h,), the SSM's (h, state)), each ``(batch, width)``: what ``override_state`` takes."""

IDENTITY_TOL = 1e-3
"""Largest logit change allowed when a sequence's own state is patched back in (unrolled vs fused float error)."""

SAME_SUM_MAX = 0.02
"""The same-sum control passes when at most this fraction of later answers change: a model whose recurrent state is
s_t alone changes none (a state read off the unrolled path differs from the fused one by float error only)."""


RANDOM_SUBSPACE_MARGIN = 0.2
"""The random-subspace control passes when the probe's subspace moves at least this much more of the later answers to
the counterfactual than random subspaces of the same rank do."""

RANDOM_SUBSPACE_SALT = 0x5AB5
"""Separates the random subspaces' stream from the patching pairs' (same base seed)."""


@dataclass
class InterchangePair:
    """A base batch, a source batch that differs only in the numbers at stream positions ``<= t``, and the
    counterfactual state labels: base numbers after t added to the source's s_t.

    ``position`` is the absolute index (prefix included) of stream position t; ``later`` marks the state answers
    after it, the ones an intervention at t can move. With ``same_sum`` the source's s_t equals the base's (so the
    counterfactual is the base's own label), otherwise it never does.
    """

    base: Batch
    source: Batch
    position: int
    later: Tensor
    counterfactual: Tensor


def _check_task(task: TaskConfig, batch: Batch) -> None:
    state = batch.masks["state"]
    if not state.any():
        raise ProbeError(f"task {task.name} asks no state questions; patching needs the running-sum subtask")
    if not (batch.labels[state] == batch.sums[state]).all():
        raise ProbeError(f"task {task.name}: its state answers are not the running sums; "
                         "patching supports modsum and interleaved")


def interchange_pair(task: TaskConfig, length: int, t: int, n: int, seed: int,
                     same_sum: bool = False) -> InterchangePair:
    """Sequences of ``length`` whose stream position ``t`` (1-based) is a number, paired with their sources.

    The source keeps the base's dictionary, query positions and every token after t, and redraws the numbers at
    positions ``<= t``; then x_t is shifted so that the source's s_t differs from the base's (``same_sum``: equals
    it; where the redrawn history would equal the base's, its first number is shifted the other way so the
    history still differs). The same seed gives the same base and the same redraw for both kinds.
    """
    if not 1 <= t < length:
        raise ProbeError(f"patch position {t} must lie in [1, {length - 1}] for length {length}")
    g = torch.Generator().manual_seed(seed)
    base = task.sample(length, 4 * n, g)  # 4x oversampling: position t is a number with probability 1 - q
    _check_task(task, base)
    p = base.prefix_len
    pos = p + t - 1
    keep = base.masks["state"][:, pos].nonzero().squeeze(1)[:n]
    if len(keep) == 0:
        raise ProbeError(f"no sampled sequence has a number at stream position {t}")
    base = Batch(base.tokens[keep], base.labels[keep], {k: v[keep] for k, v in base.masks.items()},
                 base.sums[keep], p, length)
    state, m = base.masks["state"], task.m
    before = state.clone()
    before[:, pos + 1:] = False
    tokens = base.tokens.clone()
    fresh = torch.randint(m, tokens.shape, generator=g)
    tokens = torch.where(before, fresh, tokens)
    src_sum = torch.where(before, tokens, 0).sum(dim=1) % m
    base_sum = base.sums[:, pos]
    shift = torch.randint(1, m, (len(keep),), generator=g)
    if same_sum:
        # Shifting x_t by k shifts s_t by k: k = base - source makes the sums equal.
        tokens[:, pos] = (tokens[:, pos] + base_sum - src_sum) % m
        same_history = (tokens == base.tokens).all(dim=1)
        first = before.float().argmax(dim=1)
        movable = same_history & (before.sum(dim=1) > 1)  # with one number before t the history is s_t itself
        rows = movable.nonzero().squeeze(1)
        tokens[rows, first[rows]] = (tokens[rows, first[rows]] + 1) % m
        tokens[rows, pos] = (tokens[rows, pos] - 1) % m
        src_sum = base_sum.clone()
    else:
        # choose k so that the source's s_t is never the base's
        fix = torch.where(src_sum == base_sum, shift, 0)
        tokens[:, pos] = (tokens[:, pos] + fix) % m
        src_sum = (src_sum + fix) % m
    numbers = torch.where(state, tokens, 0)
    sums = torch.where(base.sums >= 0, numbers.cumsum(dim=1) % m, base.sums)
    labels = torch.where(state, sums, base.labels)
    source = Batch(tokens, labels, {k: v.clone() for k, v in base.masks.items()}, sums, p, length)
    later = state.clone()
    later[:, : pos + 1] = False
    counterfactual = (src_sum[:, None] + base.sums - base_sum[:, None]) % m
    return InterchangePair(base, source, pos, later, counterfactual)


@torch.no_grad()
def lstm_states_at(model: HookedSequenceModel, tokens: Tensor, position: int) -> States:
    """The recurrent state of every block with a recurrent sublayer after absolute ``position``, read from the
    hooks (``fit.state_names``)."""
    names = {i: state_names(model, i) for i in lstm_blocks(model)}
    _, cache = model.run_with_cache(tokens, names_filter=[n for ns in names.values() for n in ns])
    return {i: tuple(cache[n][:, position] for n in ns) for i, ns in names.items()}


def subspace_interchange(base: States, source: States, blocks: Sequence[int], bases: dict[str, Tensor],
                         names: Mapping[int, Sequence[str]]) -> States:
    """The base's state of ``blocks`` with the component in each vector's probe subspace replaced by the source's:
    ``bases[hook]`` is the orthonormal ``(d, r)`` readout basis of the s_t probe on that state vector, and
    ``names[i]`` the hooks of block i's state vectors in order (``fit.state_names``); a vector without a basis
    keeps the base's value."""
    out = {}
    for i in blocks:
        edited = []
        for name, vb, vs in zip(names[i], base[i], source[i], strict=True):
            q = bases.get(name)
            edited.append(vb if q is None else vb + (vs - vb) @ q.to(vb) @ q.to(vb).T)
        out[i] = tuple(edited)
    return out


def random_bases(bases: Mapping[str, np.ndarray], draws: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``draws`` sets of random orthonormal bases, each of the shape ``(d, r)`` of ``bases[hook]``: uniform random
    r-dimensional subspaces of the same state vector (QR of a Gaussian matrix), fixed by ``seed``. The baseline of
    the subspace interchange: swapping any r directions of a state moves some answers; the probe's directions must
    move more."""
    rng = np.random.default_rng([PATCH_SEED_BASE, seed, RANDOM_SUBSPACE_SALT])
    out = []
    for _ in range(draws):
        drawn = {}
        for hook in sorted(bases):
            d, r = bases[hook].shape
            q, _ = np.linalg.qr(rng.standard_normal((d, r)))
            drawn[hook] = q
        out.append(drawn)
    return out


@torch.no_grad()
def patched_logits(model: HookedSequenceModel, tokens: Tensor, position: int, states: States) -> Tensor:
    """Logits of ``tokens`` with block i's recurrent state after ``position`` set to ``states[i]``; the recurrence
    continues from the set state (the cell's ``override_state``)."""
    with contextlib.ExitStack() as stack:
        for i, state in states.items():
            stack.enter_context(recurrent_cell(model, i).override_state(position, *state))
        return model(tokens)


def _cat_states(parts: list[States]) -> States:
    return {i: tuple(torch.cat([p[i][k] for p in parts]) for k in range(len(parts[0][i]))) for i in parts[0]}


def _rows(states: States, rows: slice) -> States:
    return {i: tuple(v[rows] for v in state) for i, state in states.items()}


def interchange_pairs(task: TaskConfig, lengths: Iterable[int], n: int, seed: int,
                      fractions: Iterable[float] = PATCH_FRACTIONS,
                      ) -> Iterator[tuple[int, int, int, InterchangePair, InterchangePair]]:
    """Per length and patch position t (``fractions`` of the length): ``(length, k, count, full, same)``, the k-th of
    ``count`` positions, a pair with another s_t and one with the same s_t, from the same seed (so the same bases)."""
    fractions = list(fractions)
    for length in lengths:
        ts = sorted({min(length - 1, max(1, round(f * length))) for f in fractions}) if length > 1 else []
        for k, t in enumerate(ts):
            pair_seed = PATCH_SEED_BASE + seed * 1_000_000 + length * 100 + k
            yield (length, k, len(ts), interchange_pair(task, length, t, n, pair_seed),
                   interchange_pair(task, length, t, n, pair_seed, same_sum=True))


Tally = dict[tuple[Any, ...], dict[str, float]]
"""Answer counts per (kind, block, length, band): what ``tally_rows`` turns into result rows."""


def answer_bands(pair: InterchangePair, train_length: int, device: torch.device | str) -> dict[str, Tensor]:
    """The later state answers of ``pair`` by band: ``in`` (stream position <= L_train), ``beyond``, ``all``."""
    later = pair.later.to(device)
    stream_pos = torch.arange(later.shape[1], device=device) - pair.base.prefix_len + 1
    return {"in": later & (stream_pos <= train_length), "beyond": later & (stream_pos > train_length), "all": later}


def count_answers(tally: Tally, key: tuple[Any, ...], pred: Tensor, pred0: Tensor, cf: Tensor, base_labels: Tensor,
                  bands: Mapping[str, Tensor]) -> None:
    """Add one patched run's answers (``pred``; ``pred0`` unpatched) to ``tally[(*key, band)]`` for every band."""
    right = pred0 == base_labels
    for band, mask in bands.items():
        row = tally.setdefault((*key, band), dict.fromkeys(
            ("n", "iia", "changed", "base_follow", "unpatched_cf", "model_acc", "cf_right"), 0.0))
        row["n"] += float(mask.sum())
        row["iia"] += float(((pred == cf) & mask).sum())
        row["changed"] += float(((pred != pred0) & mask).sum())
        row["cf_right"] += float(((pred == cf) & right & mask).sum())
        row["base_follow"] += float(((pred == base_labels) & mask).sum())
        row["unpatched_cf"] += float(((pred0 == cf) & mask).sum())
        row["model_acc"] += float((right & mask).sum())


def tally_rows(tally: Tally, repeats: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """One result row per tally key with answers (see ``interchange_intervention``); ``repeats[kind]`` pooled draws
    count once in ``n``."""
    rows = []
    for (kind, block, length, band), r in tally.items():
        if r["n"] == 0:
            continue
        rows.append({"kind": kind, "block": block, "length": length, "test_positions": band,
                     "n": int(r["n"]) // (repeats or {}).get(kind, 1),
                     "iia": r["iia"] / r["n"], "changed_frac": r["changed"] / r["n"],
                     **{c: r[c] / r["n"] for c in ("base_follow", "unpatched_cf", "model_acc")},
                     "iia_correct": r["cf_right"] / r["model_acc"] if r["model_acc"] else float("nan")})
    return rows


def same_sum_controls(tally: Tally, kind: str, block: int) -> list[dict[str, Any]]:
    """Per length, the ``kind`` (a same-sum source) control of ``block`` over all later answers: passes when at most
    ``SAME_SUM_MAX`` of them change."""
    rows = []
    for (k, b, length, band), r in tally.items():
        if k == kind and b == block and band == "all" and r["n"]:
            frac = r["changed"] / r["n"]
            rows.append({"control": kind, "length": length, "block": block, "n": int(r["n"]),
                         "changed_frac": frac, "passed": frac <= SAME_SUM_MAX, "value": frac,
                         "threshold": SAME_SUM_MAX, "passes_if": "<=",
                         "what": "share of later answers changed by a source with the same s_t; a fail means the "
                                 "state carries more than s_t (the model keeps more than the running sum), not a "
                                 "broken tool"})
    return rows


@torch.no_grad()
def interchange_intervention(
    model: HookedSequenceModel, task: TaskConfig, lengths: Iterable[int], n: int = 48, seed: int = 0,
    fractions: Iterable[float] = PATCH_FRACTIONS, bases: dict[str, np.ndarray] | None = None,
    random_draws: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Interventions per kind, recurrent block (``block = -1``: every block at once), length and position band.

    ``bases[hook]`` is the readout basis (``fit.readout_basis``) of the s_t probe on one vector of a block's state
    (``fit.state_names``: ``blocks.{i}.lstm.hook_h`` or ``hook_c`` for the LSTM); ``subspace`` edits each targeted
    vector within its own basis (without any basis: no ``subspace`` rows). One joint probe on several redundant
    copies of s_t spreads its weight over them, so editing its readout moves each copy only part of the way: each
    vector gets its own probe. ``random_draws`` > 0 adds ``subspace_random``: the same interchange through
    ``random_bases`` of the same ranks, every draw on the same pairs, pooled (``n`` counts the answers of one draw).

    Returns ``(results, controls)``. A results row: ``kind, block, length, test_positions`` (band of the later
    answers: ``in`` = t <= L_train, ``beyond``, ``all``), ``n``, ``iia`` (patched answers equal to the
    counterfactual label; for ``same_sum`` that is the base's label), ``changed_frac`` (patched answers that differ
    from the unpatched ones), ``base_follow``, ``unpatched_cf`` (the chance floor of ``iia``), ``model_acc`` and
    ``iia_correct`` (``iia`` among the answers the unpatched model gets right). Controls: ``identity_patch`` (the
    base's own state patched back in changes nothing) and ``same_sum`` (all blocks, per length: passes when at most
    ``SAME_SUM_MAX`` of the later answers change); with ``random_draws``, ``random_subspace`` (all blocks, per
    length: the probe's subspace moves at least ``RANDOM_SUBSPACE_MARGIN`` more of the later answers to the
    counterfactual than the random subspaces).
    """
    check_inputs("probe.probes.interchange_intervention", model=model, task=task)
    blocks = lstm_blocks(model)
    if not blocks:
        return pd.DataFrame(), pd.DataFrame()
    names = {i: state_names(model, i) for i in blocks}
    device = next(model.parameters()).device
    targets: list[tuple[int, list[int]]] = [(i, [i]) for i in blocks] + ([(-1, blocks)] if len(blocks) > 1 else [])
    basis_t = {k: torch.as_tensor(v, dtype=torch.float32, device=device) for k, v in (bases or {}).items()}
    random_t = [{k: torch.as_tensor(v, dtype=torch.float32, device=device) for k, v in drawn.items()}
                for drawn in random_bases(bases or {}, random_draws if basis_t else 0, seed)]
    repeats = {"subspace_random": max(len(random_t), 1)}  # draws pooled into one row per key
    tally: Tally = {}
    identity: dict[tuple[int, int], dict[str, float]] = {}
    L = task.train_length
    for length, k, count, full, same in interchange_pairs(task, lengths, n, seed, fractions):
        pos, b = full.position, full.base.tokens.shape[0]
        base_tok = full.base.tokens.to(device)
        states = lstm_states_at(model, torch.cat([base_tok, full.source.tokens.to(device),
                                                  same.source.tokens.to(device)]), pos)
        own, src, same_src = (_rows(states, slice(0, b)), _rows(states, slice(b, 2 * b)),
                               _rows(states, slice(2 * b, None)))
        clean = model(base_tok)
        pred0 = clean.argmax(-1)
        later = full.later.to(device)
        bands = answer_bands(full, L, device)
        base_labels = full.base.labels.to(device)
        if k == count // 2:  # identity check, once per length (at the middle patch position)
            for i in blocks:
                logits = patched_logits(model, base_tok, pos, {i: own[i]})
                identity[(length, i)] = {"changed": float(((logits.argmax(-1) != pred0) & later).sum()),
                                         "n": float(later.sum()),
                                         "max_diff": float((logits - clean).abs().max())}
        for block, patched in targets:
            runs: list[tuple[str, States, Tensor]] = [
                ("full", {i: src[i] for i in patched}, full.counterfactual),
                ("same_sum", {i: same_src[i] for i in patched}, same.counterfactual)]
            if basis_t:
                runs.append(("subspace", subspace_interchange(own, src, patched, basis_t, names),
                             full.counterfactual))
            runs += [("subspace_random", subspace_interchange(own, src, patched, drawn, names), full.counterfactual)
                     for drawn in random_t]
            # one forward for every kind: the kinds' edited states stacked along the batch
            logits = patched_logits(model, base_tok.repeat(len(runs), 1), pos,
                                    _cat_states([r[1] for r in runs]))
            for j, (kind, _, cf) in enumerate(runs):
                count_answers(tally, (kind, block, length), logits[j * b:(j + 1) * b].argmax(-1), pred0,
                              cf.to(device), base_labels, bands)
    results = tally_rows(tally, repeats)
    controls: list[dict[str, Any]] = [
        {"control": "identity_patch", "length": length, "block": block, "n": int(r["n"]),
         "changed_frac": r["changed"] / max(r["n"], 1.0), "max_abs_logit_diff": r["max_diff"],
         "passed": r["changed"] == 0 and r["max_diff"] < IDENTITY_TOL, "value": r["max_diff"],
         "threshold": IDENTITY_TOL, "passes_if": "<",
         "what": "largest logit change when a run is patched with its own state; a fail means the intervention "
                 "itself changes the model: a broken tool"}
        for (length, block), r in identity.items()]
    whole = -1 if len(blocks) > 1 else blocks[0]
    controls += same_sum_controls(tally, "same_sum", whole)
    for (kind, block, length, band), r in tally.items():
        probe_run = tally.get(("subspace", block, length, band))
        if kind == "subspace_random" and block == whole and band == "all" and r["n"] and probe_run:
            iia, iia_random = probe_run["iia"] / probe_run["n"], r["iia"] / r["n"]
            controls.append({"control": "random_subspace", "length": length, "block": block,
                             "n": int(probe_run["n"]), "draws": len(random_t), "iia_subspace": iia,
                             "iia_random": iia_random, "changed_subspace": probe_run["changed"] / probe_run["n"],
                             "changed_random": r["changed"] / r["n"],
                             "passed": iia - iia_random >= RANDOM_SUBSPACE_MARGIN, "value": iia - iia_random,
                             "threshold": RANDOM_SUBSPACE_MARGIN, "passes_if": ">=",
                             "what": "interchange accuracy of the probe's subspace minus a random one of its rank; a "
                                     "fail means the probe's subspace carries s_t no better than a random one: s_t is "
                                     "not isolated there (a model property), or the probe found nothing"})
    return pd.DataFrame(results), pd.DataFrame(controls)
