"""The metric of record: accuracy per window of stream positions beyond the training length, per subtask and factor.

An all-position mean at length k x L_train mixes the in-range positions into every number (a model right up to
L_train and guessing beyond scores 40 % "at 3x" on a mod-10 state, not 10 %). Claims about length generalization
are made from windows of positions instead: in range ``[1, L]``, then ``(L, 2L]``, ``(2L, 4L]``, ``(4L, 8L]``,
``(8L, 16L]``, ``(16L, 32L]``, each beside its chance floor. A causal model's answer at stream position t depends
only on the first t positions, and every task draws its stream positions independently, so position t of a length-T
sequence (T >= t) is distributed exactly as the last position of a length-t one: one pass over sequences of the
longest length measures every window at once.

For a modulus with factors (m = 10 = 2 x 5) each state answer is also scored modulo each prime-power factor q
(``state_mod2``: parity; ``state_mod5``): a model can keep one factor of the counter and lose the other, and its
state accuracy alone cannot say which. Chance floors: 1/m for the state, 1/q for its factor q, 1/n_values for recall.

The accuracy of one length (``accuracy_at_length``) lives here too, a floor below the trainer that evaluates with it
and ``probe.evaluate`` that draws curves from it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from probe.core.chance import chance
from probe.core.inputs import check_inputs
from probe.core.seeds import EVALUATE
from probe.core.task import IGNORE_INDEX, as_sampler, need_train_length
from probe.errors import ProbeError
from probe.tasks import SUBTASKS

if TYPE_CHECKING:
    from probe.models import HookedSequenceModel
    from probe.tasks import TaskConfig

__all__ = ["WINDOW_MULTIPLES", "Window", "accuracy_at_length", "eval_seed", "evaluate", "factor_subtask",
           "label_chance", "position_counts",
           "state_factors", "window_chance", "window_key", "window_table", "windows_for", "windows_of"]

EVAL_SEED_BASE = EVALUATE
"""Evaluation batches come from seeds far from the training seeds (which are ``seed * 1_000_003 + step``)."""


def eval_seed(seed: int, length: int, chunk: int) -> int:
    """The seed of chunk ``chunk`` of the evaluation sequences of one length: every evaluation (a length's curve
    point, its windows) draws the same sequences for the same (seed, length)."""
    return EVAL_SEED_BASE + seed * 1_000_000 + length * 1_000 + chunk

WINDOW_MULTIPLES = (1, 2, 4, 8, 16, 32)
"""Window ends as multiples of L_train: in range (0, 1x], then (1x, 2x], (2x, 4x], ... (16x, 32x]."""


WINDOW_TABLE_COLUMNS = ["window", "lo", "hi", "beyond", "subtask", "token_acc", "seq_acc", "n_tokens", "chance",
                        "above_chance_by"]


@dataclass(frozen=True)
class Window:
    """Stream positions ``lo < t <= hi`` (1-based); ``name`` as reports print it: ``in range``, ``(1x, 2x]``."""

    lo: int
    hi: int
    name: str

    @property
    def key(self) -> str:
        """The window as a column suffix: ``0x_1x`` in range, ``4x_8x`` for (4x, 8x] (``state_win_4x_8x``)."""
        return window_key(self.name)

    @property
    def beyond(self) -> bool:
        """Whether every position lies beyond the training length (the only windows a claim about length
        generalization may rest on)."""
        return self.lo > 0


def window_key(name: str) -> str:
    """A window's name as reports print it (``in range``, ``(4x, 8x]``) as the suffix of the columns that carry one
    number a window (``0x_1x``, ``4x_8x``: ``state_win_4x_8x`` in a run's summary)."""
    if name == "in range":
        return "0x_1x"
    match = re.fullmatch(r"\((\d+)x, (\d+)x\]", name)
    lo, hi = (int(match[1]), int(match[2])) if match else (0, 0)
    # windows_for names only consecutive multiples: (2x, 8x] would key a column no report writes
    if not match or lo not in WINDOW_MULTIPLES or hi not in WINDOW_MULTIPLES or WINDOW_MULTIPLES.index(hi) != \
            WINDOW_MULTIPLES.index(lo) + 1:
        raise ProbeError(f"{name!r} is not a window name (in range, or (Ax, Bx] with B the multiple after A in "
                         f"{', '.join(map(str, WINDOW_MULTIPLES))})")
    return f"{lo}x_{hi}x"


def windows_for(train_length: int, max_length: int) -> list[Window]:
    """Every complete window of positions that sequences of ``max_length`` cover (a window is reported only whole,
    so that its number means the same in every table)."""
    if train_length < 1 or max_length < 1:
        raise ProbeError(f"windows need positive lengths, got L_train {train_length} and length {max_length}")
    out, lo_mult = [], 0
    for hi_mult in WINDOW_MULTIPLES:
        hi = hi_mult * train_length
        if hi > max_length:
            break
        name = "in range" if lo_mult == 0 else f"({lo_mult}x, {hi_mult}x]"
        out.append(Window(lo_mult * train_length, hi, name))
        lo_mult = hi_mult
    return out


def state_factors(m: int) -> list[int]:
    """The prime-power factors of the modulus m (10 -> [2, 5]): Z_m is the product of Z_q over them (the Chinese
    remainder theorem), so a state answer is right iff it is right modulo every q. Empty when m is a prime power
    (there is nothing smaller to be right about)."""
    out, p, rest = [], 2, m
    while rest > 1:
        if p * p > rest:
            out.append(rest)
            break
        if rest % p == 0:
            q = 1
            while rest % p == 0:
                rest //= p
                q *= p
            out.append(q)
        p += 1
    return out if len(out) > 1 else []


def factor_subtask(q: int) -> str:
    """The subtask name under which the state answers' accuracy modulo q is reported (``state_mod2``)."""
    return f"state_mod{q}"


@torch.no_grad()
def accuracy_at_length(
    model: HookedSequenceModel, task: TaskConfig, length: int, n_samples: int = 256, batch_size: int = 256,
    seed: int = 0, device: torch.device | str | None = None, forward_batch: int | None = None,
    factors: bool = False,
) -> dict[str, dict[str, float]]:
    """Token and sequence accuracy per subtask (and ``all``) on ``n_samples`` fresh sequences of one length.
    ``task``: probe's task or any sampler (``probe.core.task``): each named mask of its batches is a subtask.

    ``factors``: also the state answers' accuracy modulo each prime-power factor q of the modulus
    (``state_factors``), as subtasks ``state_mod{q}``: a state answer counts as right modulo q when the predicted
    token is a number congruent to the running sum mod q. For m = 10 this separates parity (Z_2) from Z_5, the
    factors that linear recurrences with negative or complex transitions can and cannot track.
    Sequences are drawn ``batch_size`` at a time and run through the model ``forward_batch`` at a time (default:
    all at once), so the draws, and the numbers, do not depend on how much memory the forward pass may use.
    Sequence accuracy of a subtask counts only sequences that ask that subtask at least once (NaN if none does).
    """
    check_inputs("probe.evaluate.accuracy_at_length", forward=model, task=task)
    if n_samples < 1 or batch_size < 1:
        raise ProbeError(f"n_samples={n_samples}, batch_size={batch_size}: both must be at least 1")
    device = device or next(model.parameters()).device
    step = forward_batch or batch_size
    draw = as_sampler(task, "probe.evaluate.accuracy_at_length").sample  # probe's task, or a user's sampler
    qs = state_factors(task.m) if factors else []
    # probe's subtasks first (their rows exist even where a task asks none); a user's masks join as they come
    right = {s: 0 for s in (*SUBTASKS, "all", *map(factor_subtask, qs))}
    asked = dict(right)
    seq_right = dict(right)
    seq_asked = dict(right)
    done, chunk = 0, 0
    while done < n_samples:
        b = min(batch_size, n_samples - done)
        batch = draw(length, b, eval_seed(seed, length, chunk)).to(device)
        pred = torch.cat([model(batch.tokens[i:i + step]).argmax(-1) for i in range(0, b, step)])
        correct = pred == batch.labels
        masks = {**batch.masks, "all": batch.answer_mask}
        hits = dict.fromkeys(masks, correct)
        if qs and bool((batch.labels[batch.masks["state"]] >= task.m).any()):
            raise ProbeError(f"--factors: the state answers of task {task.name} are not numbers mod {task.m}, so "
                             "they have no factors to score")
        for q in qs:
            # a number token congruent to the answer modulo q; anything else (a key, a value) is wrong
            hits[factor_subtask(q)] = (pred < task.m) & (pred % q == batch.labels % q)
            masks[factor_subtask(q)] = batch.masks["state"]
        for s, mask in masks.items():
            correct = hits[s]
            right[s] = right.get(s, 0) + int((correct & mask).sum())
            asked[s] = asked.get(s, 0) + int(mask.sum())
            has = mask.any(dim=1)
            seq_right[s] = seq_right.get(s, 0) + int(((correct | ~mask).all(dim=1) & has).sum())
            seq_asked[s] = seq_asked.get(s, 0) + int(has.sum())
        done += b
        chunk += 1
    return {
        s: {
            "token_acc": right[s] / asked[s] if asked[s] else math.nan,
            "seq_acc": seq_right[s] / seq_asked[s] if seq_asked[s] else math.nan,
            "n_tokens": asked[s],
        }
        for s in right
    }


def window_chance(task: TaskConfig, subtask: str) -> float:
    """The floor beside each window's number: a uniform guess over the answer space, scored as the subtask is."""
    if subtask.startswith("state_mod"):
        return 1.0 / int(subtask.removeprefix("state_mod"))
    return chance(task, subtask)


@torch.no_grad()
def position_counts(model: HookedSequenceModel, task: Any, length: int, n_samples: int, seed: int,
                    batch_size: int = 256, forward_batch: int | None = None, factors: bool = True) -> pd.DataFrame:
    """Per stream position (1-based) and named mask, over ``n_samples`` sequences of ``length``: answers asked,
    answers right, and the per-sequence right/asked matrices needed for a window's exact match.

    ``task``: probe's task or any sampler (``probe.core.task``); each of its batch's masks is a ``subtask`` here
    (probe's: ``state``, ``recall``; a batch without masks: ``all``, every labelled position). Returns ``position,
    subtask, asked, right`` plus ``seq`` (a (n_samples, length) bool tensor per subtask kept in
    ``.attrs["matrices"]`` for ``window_table``'s sequence accuracy) and, in ``.attrs["label_values"]``, how many
    distinct labels each mask asked (a chance floor for a task that gives none). Sequences are drawn exactly as
    ``probe.evaluate.accuracy_at_length`` draws them for that length and ``seed``, so the two agree at ``length``."""
    if n_samples < 1 or batch_size < 1:
        raise ProbeError(f"n_samples={n_samples}, batch_size={batch_size}: both must be at least 1")
    sampler = as_sampler(task, "probe.windows.position_counts")
    own = sampler.task  # probe's TaskConfig, whose state answers may be residues with factors to score
    device = next(model.parameters()).device
    step = forward_batch or batch_size
    # a task whose state answers are not residues (coupled's are values bound to s_t) has no factors to score
    qs = state_factors(own.m) if own is not None and factors and own.residue_answers else []
    hit_rows: dict[str, list[torch.Tensor]] = {}
    ask_rows: dict[str, list[torch.Tensor]] = {}
    values: dict[str, set[int]] = {}
    done, chunk = 0, 0
    while done < n_samples:
        b = min(batch_size, n_samples - done)
        batch = sampler.sample(length, b, eval_seed(seed, length, chunk)).to(device)
        pred = torch.cat([model(batch.tokens[i:i + step]).argmax(-1) for i in range(0, b, step)])
        p = batch.prefix_len
        pred, labels = pred[:, p:], batch.labels[:, p:]
        masks = {s: m[:, p:] for s, m in batch.masks.items()} or {"all": batch.answer_mask[:, p:]}
        hits = dict.fromkeys(masks, pred == labels)
        for q in qs:
            # a number token congruent to the answer modulo q; anything else (a key, a value) is wrong
            hits[factor_subtask(q)] = (pred < own.m) & (pred % q == labels % q)
            masks[factor_subtask(q)] = masks["state"]
        for s in masks:
            hit_rows.setdefault(s, []).append((hits[s] & masks[s]).cpu())
            ask_rows.setdefault(s, []).append(masks[s].cpu())
            values.setdefault(s, set()).update(labels[masks[s] & (labels != IGNORE_INDEX)].unique().tolist())
        done += b
        chunk += 1
    rows, matrices = [], {}
    for s in hit_rows:
        right, asked = torch.cat(hit_rows[s]), torch.cat(ask_rows[s])
        matrices[s] = (right, asked)
        for t, (a, r) in enumerate(zip(asked.sum(0).tolist(), right.sum(0).tolist(), strict=True), start=1):
            rows.append({"position": t, "subtask": s, "asked": a, "right": r})
    out = pd.DataFrame(rows)
    out.attrs["matrices"] = matrices
    out.attrs["length"] = length
    out.attrs["label_values"] = {s: len(v) for s, v in values.items()}
    return out


def label_chance(counts: pd.DataFrame, subtask: str) -> float:
    """The floor of a task that states none: a uniform guess over the distinct labels the mask asked in the
    evaluation sequences (NaN where it asked nothing)."""
    n = counts.attrs.get("label_values", {}).get(subtask, 0)
    return 1.0 / n if n else math.nan


def window_table(counts: pd.DataFrame, task: Any, train_length: int,
                 chance: Mapping[str, float] | None = None) -> pd.DataFrame:
    """One row per (window, subtask): ``window, lo, hi, beyond, subtask, token_acc, seq_acc, n_tokens, chance,
    above_chance_by``. ``token_acc``: answers right / asked at positions in the window; ``seq_acc``: the fraction of
    sequences that ask the subtask in the window and answer every such question right; ``chance``: ``chance[subtask]``
    when given, else probe's task's floor (``window_chance``), else ``label_chance``; ``above_chance_by``: token_acc
    minus the floor (NaN where nothing was asked)."""
    own = task if hasattr(task, "vocab_size") else getattr(task, "task", None)
    length = int(counts.attrs.get("length", counts.position.max()))
    matrices: dict[str, tuple[torch.Tensor, torch.Tensor]] = counts.attrs.get("matrices", {})
    rows: list[dict[str, Any]] = []
    for w in windows_for(train_length, length):
        part = counts[(counts.position > w.lo) & (counts.position <= w.hi)]
        for subtask, g in part.groupby("subtask", sort=False):
            asked, right = int(g.asked.sum()), int(g.right.sum())
            acc = right / asked if asked else math.nan
            seq = math.nan
            if subtask in matrices:
                r, a = (x[:, w.lo:w.hi] for x in matrices[subtask])
                has = a.any(dim=1)
                seq = float(((r == a).all(dim=1) & has).sum()) / int(has.sum()) if bool(has.any()) else math.nan
            if chance and subtask in chance:
                floor = float(chance[str(subtask)])
            elif own is not None:
                floor = window_chance(own, str(subtask))
            else:
                floor = label_chance(counts, str(subtask))
            rows.append({"window": w.name, "lo": w.lo, "hi": w.hi, "beyond": w.beyond, "subtask": subtask,
                         "token_acc": acc, "seq_acc": seq, "n_tokens": asked, "chance": floor,
                         "above_chance_by": acc - floor})
    return pd.DataFrame(rows, columns=WINDOW_TABLE_COLUMNS)


def windows_of(model: HookedSequenceModel, task: Any, train_length: int, max_length: int,
               n_samples: int = 256, seed: int = 0, batch_size: int = 256,
               forward_batch: int | None = None, chance: Mapping[str, float] | None = None) -> pd.DataFrame:
    """``window_table`` of one model on sequences of ``max_length`` (see the module's docstring for why one length
    measures every window)."""
    counts = position_counts(model, task, max_length, n_samples, seed, batch_size, forward_batch)
    return window_table(counts, task, train_length, chance)


def evaluate(model: HookedSequenceModel, task: Any, train_length: int | None = None, max_length: int | None = None,
             n_samples: int = 256, seed: int = 0, batch_size: int = 256,
             chance: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Accuracy per named mask and per window of positions beyond the training length, beside each mask's chance
    floor: the metric of record for any task. ``task``: probe's task or a sampler ``f(length, batch_size, seed)``
    (``probe.core.task``); ``train_length``: L_train (probe's tasks know theirs); ``max_length``: the length of the
    evaluation sequences (default 4 x L_train: windows in range, (1x, 2x], (2x, 4x]); ``chance``: a floor per mask
    name (default: probe's task's, else a uniform guess over the labels each mask asked). Columns as
    ``window_table``'s, ``subtask`` holding the mask's name."""
    where = "probe.windows.evaluate"
    check_inputs(where, forward=model)
    sampler = as_sampler(task, where, train_length)
    L = need_train_length(sampler, where, train_length)
    return windows_of(model, sampler, L, max_length or 4 * L, n_samples, seed, batch_size, chance=chance)
