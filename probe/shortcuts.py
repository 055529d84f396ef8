"""Shortcut tests: positional-code randomization, attention diagnostics and the window test, per checkpoint.

Usage: ``python -m probe.shortcuts ckpt.pt [more.pt ...] [--json] [--out DIR]``. Method and results: docs/shortcuts.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from scipy import stats
from torch import Tensor

from probe.attention import attention_controls, entropy_vs_length, head_diagnostics, plot_entropy, plot_head_map
from probe.checkpoint import Checkpoint, load_checkpoint, resolve_checkpoints
from probe.cli import add_common_args, envelope, resolve_device, run_cli, say
from probe.errors import ProbeError
from probe.models import HookedSequenceModel
from probe.tasks import IGNORE_INDEX, SUBTASKS, TaskConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure

POSITIONAL_SEED_BASE = 8_200_000_000
WINDOW_SEED_BASE = 8_300_000_000
FLAG_THRESHOLD = 0.1
"""A model is flagged when in-distribution position perturbations cost it more than this fraction of its
above-chance accuracy (mean over perturbations and learned subtasks)."""
MIN_SKILL = 0.1
"""A subtask counts as learned (and enters the score) when its baseline accuracy is this far above chance."""
Forward = Callable[[Tensor], Tensor]


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t confidence interval (NaN bounds with fewer than two finite values)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def chance(task: TaskConfig, subtask: str) -> float:
    """Accuracy of a uniform guess among the possible answers: a residue (state) or a dictionary value (recall)."""
    if subtask == "recall" and hasattr(task, "n_pairs"):
        return 1.0 / task.n_pairs
    return 1.0 / task.m


# --- 1. positional randomization ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Perturbation:
    """``random``: the positional code of every position replaced by a random vector of the same norm (rope: by
    i.i.d. random integer positions in the training range); ``permute``: positions shuffled across the sequence;
    ``offset``: every position shifted by ``k``."""

    test: str
    k: int | None = None

    @property
    def name(self) -> str:
        return f"offset+{self.k}" if self.test == "offset" else self.test


def perturbations(offsets: Sequence[int]) -> list[Perturbation]:
    return [Perturbation("random"), Perturbation("permute"), *(Perturbation("offset", int(k)) for k in offsets)]


def default_offsets(task: TaskConfig) -> list[int]:
    """1, L_train / 5 and L_train: a nudge, a shift within the training range, and one past it."""
    lt = task.train_length
    return sorted({1, max(2, lt // 5), lt})


def in_distribution_lengths(task: TaskConfig, n_batches: int) -> list[int]:
    """One stream length per batch, evenly over [ceil(L_train / 2), L_train]: lengths seen in training, long
    enough to ask many questions."""
    lt = task.train_length
    return [int(round(x)) for x in np.linspace(math.ceil(lt / 2), lt, n_batches)]


def positional_applicability(model: HookedSequenceModel) -> tuple[bool, str]:
    """Whether the model reads positions at all, and why not if it does not."""
    cfg = model.cfg
    if hasattr(model, "pos_embed"):
        return True, f"additive {cfg.pos_encoding} code (hook_pos_embed)"
    if cfg.pos_encoding == "rope" and cfg.has_attention:
        return True, "rope in attention (no additive code: random = random integer positions)"
    if cfg.pos_encoding == "none":
        return False, f"not applicable: {cfg.family} model without positional encoding (pos_encoding='none')"
    return False, f"not applicable: a {cfg.family} model ignores pos_encoding='{cfg.pos_encoding}'"


def perturbed_logits(model: HookedSequenceModel, tokens: Int[Tensor, "batch pos"], pert: Perturbation,
                     g: torch.Generator, train_positions: int) -> Float[Tensor, "batch pos vocab"] | None:
    """Logits with the positional information perturbed; None when the perturbation does not exist for this model
    (an offset that leaves a learned table). Random draws come from ``g`` on the CPU (same result on any device).
    ``train_positions`` bounds the random integer positions used for rope."""
    b, t = tokens.shape
    device = tokens.device
    arange = torch.arange(t).expand(b, t)
    if pert.test == "random":
        if hasattr(model, "pos_embed"):
            def randomize(x: Tensor, hook: Any) -> Tensor:
                r = torch.randn(x.shape, generator=g).to(x)
                return r * (x.norm(dim=-1, keepdim=True) / r.norm(dim=-1, keepdim=True).clamp(min=1e-12))

            return model.run_with_hooks(tokens, fwd_hooks=[("hook_pos_embed", randomize)])
        positions = torch.randint(train_positions, (b, t), generator=g)
    elif pert.test == "permute":
        positions = torch.rand(b, t, generator=g).argsort(dim=1)
    elif pert.test == "offset":
        positions = arange + int(pert.k or 0)
        if model.cfg.pos_encoding == "learned" and hasattr(model, "pos_embed") and \
                int(positions.max()) >= model.cfg.max_len:
            return None
    else:
        raise ProbeError(f"unknown perturbation {pert.test!r}; choose random, permute or offset")
    return model(tokens, positions=positions.to(device))


@dataclass
class PositionalResult:
    """Accuracy drops under each perturbation (``drops``: one row per perturbation and subtask) and the shortcut
    score (``score``: one row per subtask and ``all``): the mean normalised drop, i.e. the fraction of above-chance
    accuracy lost, over perturbations (and learned subtasks for ``all``), with a CI over batches."""

    applicable: bool
    reason: str
    drops: pd.DataFrame
    score: pd.DataFrame
    threshold: float = FLAG_THRESHOLD

    @property
    def flagged(self) -> bool:
        row = self.score[self.score.subtask == "all"]
        return bool(self.applicable and len(row) and float(row.score.iloc[0]) > self.threshold)

    @property
    def overall(self) -> float:
        row = self.score[self.score.subtask == "all"]
        return float(row.score.iloc[0]) if len(row) else math.nan


def _na_result(perts: list[Perturbation], reason: str, threshold: float) -> PositionalResult:
    nan = math.nan
    drops = pd.DataFrame([{"perturbation": p.name, "test": p.test, "k": p.k, "subtask": s, "applicable": False,
                           "reason": reason, "baseline_acc": nan, "acc": nan, "drop": nan, "drop_ci_low": nan,
                           "drop_ci_high": nan, "chance": nan, "norm_drop": nan, "n_batches": 0, "n_tokens": 0}
                          for p in perts for s in SUBTASKS])
    score = pd.DataFrame([{"subtask": s, "applicable": False, "reason": reason, "score": nan, "score_ci_low": nan,
                           "score_ci_high": nan, "flagged": False} for s in (*SUBTASKS, "all")])
    return PositionalResult(False, reason, drops, score, threshold)


@torch.no_grad()
def positional_randomization(model: HookedSequenceModel, task: TaskConfig, offsets: Sequence[int] | None = None,
                             n_batches: int = 8, batch_size: int = 128, seed: int = 0,
                             threshold: float = FLAG_THRESHOLD, progress: bool = False) -> PositionalResult:
    """Per perturbation and subtask, the drop in token accuracy on in-distribution lengths, paired on the same
    batches (drop = baseline - perturbed, mean over batches, Student-t CI over batches)."""
    perts = perturbations(default_offsets(task) if offsets is None else offsets)
    applicable, reason = positional_applicability(model)
    if not applicable:
        return _na_result(perts, reason, threshold)
    if n_batches < 2:
        raise ProbeError(f"n_batches={n_batches}: need at least 2 batches for a confidence interval")
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(POSITIONAL_SEED_BASE - 1000 - seed)  # apart from the batch seeds
    train_positions = task.prefix_len + task.train_length
    lengths = in_distribution_lengths(task, n_batches)
    records: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    it: Sequence[int] = lengths
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(lengths, desc="positional", leave=False)
    for i, length in enumerate(it):
        batch = task.sample(length, batch_size, POSITIONAL_SEED_BASE + seed * 10_000 + i).to(device)
        base = model(batch.tokens).argmax(-1) == batch.labels
        for pert in perts:
            logits = perturbed_logits(model, batch.tokens, pert, g, train_positions)
            if logits is None:
                missing[pert.name] = (f"not applicable: positions up to {batch.tokens.shape[1] + (pert.k or 0) - 1} "
                                      f"leave the learned table (max_len={model.cfg.max_len})")
                continue
            correct = logits.argmax(-1) == batch.labels
            for s in SUBTASKS:
                mask = batch.masks[s]
                n = int(mask.sum())
                if n:
                    records.append({"batch": i, "perturbation": pert.name, "subtask": s, "n": n,
                                    "base": float((base & mask).sum()) / n, "acc": float((correct & mask).sum()) / n})
    rec = pd.DataFrame(records)
    rows: list[dict[str, Any]] = []
    skill: dict[str, float] = {}
    for pert in perts:
        for s in SUBTASKS:
            part = rec[(rec.perturbation == pert.name) & (rec.subtask == s)] if len(rec) else rec
            if pert.name in missing or part.empty:
                why = missing.get(pert.name, f"not applicable: the task asks no {s} questions")
                rows.append({"perturbation": pert.name, "test": pert.test, "k": pert.k, "subtask": s,
                             "applicable": False, "reason": why, "baseline_acc": math.nan, "acc": math.nan,
                             "drop": math.nan, "drop_ci_low": math.nan, "drop_ci_high": math.nan,
                             "chance": chance(task, s), "norm_drop": math.nan, "n_batches": 0, "n_tokens": 0})
                continue
            base_acc = float(part.base.mean())
            drop, lo, hi = mean_ci(list(part.base - part.acc))
            skill[s] = base_acc - chance(task, s)
            norm = drop / skill[s] if skill[s] >= MIN_SKILL else math.nan
            rows.append({"perturbation": pert.name, "test": pert.test, "k": pert.k, "subtask": s,
                         "applicable": True, "reason": reason, "baseline_acc": base_acc, "acc": float(part.acc.mean()),
                         "drop": drop, "drop_ci_low": lo, "drop_ci_high": hi, "chance": chance(task, s),
                         "norm_drop": norm, "n_batches": len(part), "n_tokens": int(part.n.sum())})
    drops = pd.DataFrame(rows)
    return PositionalResult(True, reason, drops, _score(rec, skill, missing, threshold, reason), threshold)


def _score(rec: pd.DataFrame, skill: dict[str, float], missing: dict[str, str], threshold: float,
           reason: str) -> pd.DataFrame:
    """Per batch, the mean normalised drop over perturbations (per subtask, and over learned subtasks for
    ``all``); then mean and CI over batches."""
    learned = [s for s in SUBTASKS if skill.get(s, -1.0) >= MIN_SKILL]
    rows = []
    if len(rec):
        rec = rec[~rec.perturbation.isin(list(missing))]
        rec = rec.assign(norm=(rec.base - rec.acc) / rec.subtask.map(lambda s: skill.get(s, math.nan)))
    for s in (*SUBTASKS, "all"):
        subs = learned if s == "all" else [s] if s in learned else []
        if not subs:
            why = "no subtask above chance" if s == "all" else f"{s} not learned (or not asked): no score"
            rows.append({"subtask": s, "applicable": True, "reason": why, "score": math.nan,
                         "score_ci_low": math.nan, "score_ci_high": math.nan, "flagged": False})
            continue
        per_batch = rec[rec.subtask.isin(subs)].groupby("batch").norm.mean()
        score, lo, hi = mean_ci(list(per_batch))
        rows.append({"subtask": s, "applicable": True, "reason": reason, "score": score, "score_ci_low": lo,
                     "score_ci_high": hi, "flagged": bool(score > threshold)})
    return pd.DataFrame(rows)


# --- 2. window test ---------------------------------------------------------------------------------------------
def running_sum_labels(task: TaskConfig, tokens: Int[Tensor, "batch pos"], prefix_len: int,
                       window: int | None = None) -> Int[Tensor, "batch pos"]:
    """The state-subtask label at every stream position, recomputed from the tokens (``IGNORE_INDEX`` in the
    prefix): the running sum of the numbers mod m (``coupled``: the value the dictionary binds to it). With
    ``window=w`` only the numbers at positions ``t-w .. t`` count: what a model that sees the last w+1 tokens
    would answer."""
    if task.name == "recall":
        raise ProbeError("the recall task asks no state questions: the window test does not apply")
    stream = tokens[:, prefix_len:]
    x = torch.where(stream < task.m, stream, 0)
    csum = x.cumsum(dim=1)
    if window is not None:
        shifted = torch.nn.functional.pad(csum, (window + 1, 0))[:, : csum.shape[1]]
        csum = csum - shifted
    sums = csum % task.m
    if task.name == "coupled":
        keys, values = tokens[:, 0 : 2 * task.m : 2], tokens[:, 1 : 2 * task.m : 2]
        table = torch.zeros_like(keys).scatter(1, keys, values)
        sums = table.gather(1, sums)
    out = torch.full_like(tokens, IGNORE_INDEX)
    out[:, prefix_len:] = sums
    return out


def oracle_forward(task: TaskConfig, prefix_len: int, window: int | None = None) -> Forward:
    """A perfect state tracker (``window=None``) or a perfect last-(w+1)-tokens model, as logits (one-hot)."""
    def forward(tokens: Tensor) -> Tensor:
        labels = running_sum_labels(task, tokens, prefix_len, window).clamp(min=0)
        return torch.nn.functional.one_hot(labels, task.vocab_size).float()

    return forward


def default_window_ks(length: int) -> list[int]:
    """0 and the powers of two up to length - 2 (so that something is always resampled)."""
    return [0] + [2**i for i in range(8) if 2**i <= length - 2]


@dataclass
class WindowResult:
    """``table``: one row per k: ``k, acc_old, acc_new, agree_old, p_label_same, chance, retained, n,
    mean_resampled``. ``retained = (acc_new - chance) / (acc_old - chance)``: 1 for a state tracker, 0 for a model
    that only sees the last k tokens. ``score = 1 - mean retained`` over k; ``windowed`` when above 0.5."""

    applicable: bool
    reason: str
    table: pd.DataFrame
    score: float = math.nan

    @property
    def windowed(self) -> bool:
        return bool(self.applicable and math.isfinite(self.score) and self.score > 0.5)


@torch.no_grad()
def window_test(forward: Forward, task: TaskConfig, ks: Sequence[int] | None = None, length: int | None = None,
                n_samples: int = 512, batch_size: int = 256, seed: int = 0,
                device: torch.device | str = "cpu") -> WindowResult:
    """For the last state answer t of each sequence, resample every number more than k positions back (queries
    and dictionary fixed), recompute the label, and compare the new prediction with the new label and with the
    old prediction. ``forward`` is a model or any tokens -> logits function."""
    if task.name == "recall":
        return WindowResult(False, "not applicable: the recall task asks no state questions", pd.DataFrame())
    length = length or task.train_length
    ks = list(default_window_ks(length) if ks is None else ks)
    g = torch.Generator().manual_seed(WINDOW_SEED_BASE - 1000 - seed)  # apart from the batch seeds
    tallies = {k: np.zeros(5) for k in ks}  # new right, agree, label same, n, resampled
    old_right = 0
    done, chunk = 0, 0
    while done < n_samples:
        b = min(batch_size, n_samples - done)
        batch = task.sample(length, b, WINDOW_SEED_BASE + seed * 10_000 + chunk)
        tokens, state = batch.tokens, batch.masks["state"]
        keep = state.any(dim=1)
        tokens, state, labels = tokens[keep], state[keep], batch.labels[keep]
        rows = torch.arange(len(tokens))
        t_len = tokens.shape[1]
        target = t_len - 1 - state.flip(1).to(torch.int8).argmax(dim=1)
        old_pred = forward(tokens.to(device))[rows, target].argmax(-1).cpu()
        old_right += int((old_pred == labels[rows, target]).sum())
        pos = torch.arange(t_len)[None]
        numbers = (pos >= batch.prefix_len) & (tokens < task.m)
        for k in ks:
            resample = numbers & (pos < (target - k)[:, None])
            new_tokens = torch.where(resample, torch.randint(task.m, tokens.shape, generator=g), tokens)
            new_label = running_sum_labels(task, new_tokens, batch.prefix_len)[rows, target]
            new_pred = forward(new_tokens.to(device))[rows, target].argmax(-1).cpu()
            tallies[k] += [int((new_pred == new_label).sum()), int((new_pred == old_pred).sum()),
                           int((new_label == labels[rows, target]).sum()), len(tokens), int(resample.sum())]
        done += b
        chunk += 1
    n = tallies[ks[0]][3] if ks else 0
    acc_old = old_right / n if n else math.nan
    c = chance(task, "state")
    out = []
    for k in ks:
        right, agree, same, n_k, resampled = tallies[k]
        acc_new = right / n_k
        retained = (acc_new - c) / (acc_old - c) if acc_old - c >= MIN_SKILL else math.nan
        out.append({"k": k, "acc_old": acc_old, "acc_new": acc_new, "agree_old": agree / n_k,
                    "p_label_same": same / n_k, "chance": c, "retained": retained, "n": int(n_k),
                    "mean_resampled": resampled / n_k})
    table = pd.DataFrame(out)
    used = table[table.mean_resampled > 0].retained if len(table) else pd.Series(dtype=float)
    score = 1 - float(used.mean()) if used.notna().any() else math.nan
    reason = "ok" if math.isfinite(score) else "state subtask not above chance at this length: no score"
    return WindowResult(True, reason, table, score)


def window_controls(task: TaskConfig, ks: Sequence[int] | None = None, length: int | None = None,
                    seed: int = 0) -> list[dict[str, Any]]:
    """The window test on two oracles: an exact state tracker keeps accuracy 1 on the new labels at every k; a
    model that sees only the last 2 numbers' window (w = 1) keeps all its old predictions and drops to chance for
    every k >= 1."""
    if task.name == "recall":
        return []
    length = length or task.train_length
    ks = list(default_window_ks(length) if ks is None else ks)
    p, c = task.prefix_len, chance(task, "state")
    tracker = window_test(oracle_forward(task, p), task, ks, length, 256, 256, seed).table
    windowed = window_test(oracle_forward(task, p, window=1), task, ks, length, 256, 256, seed).table
    windowed = windowed[windowed.k >= 1]
    rows = [{"control": "window_tracker_oracle_acc_new", "value": float(tracker.acc_new.min()),
             "expected": "== 1 at every k", "passed": bool(tracker.acc_new.min() == 1.0)},
            {"control": "window_resampling_changes_labels", "value": float(tracker.p_label_same.max()),
             "expected": f"P(new label == old) within 0.1 of chance {c:.2f}",
             "passed": bool((tracker.p_label_same - c).abs().max() < 0.1)}]
    if len(windowed):
        rows += [{"control": "window_windowed_oracle_agree_old", "value": float(windowed.agree_old.min()),
                  "expected": "== 1 for k >= 1", "passed": bool(windowed.agree_old.min() == 1.0)},
                 {"control": "window_windowed_oracle_acc_new", "value": float(windowed.acc_new.max()),
                  "expected": f"within 0.1 of chance {c:.2f}",
                  "passed": bool(abs(windowed.acc_new - c).max() < 0.1)}]
    return rows


# --- 3. one checkpoint, all tests ---------------------------------------------------------------------------
@dataclass
class ShortcutReport:
    """Every shortcut test on one checkpoint. ``heads`` / ``entropy`` are empty (and ``attention_reason`` says
    why) for models without attention."""

    checkpoint: str
    label: str
    pos_encoding: str
    seed: int | None
    positional: PositionalResult
    window: WindowResult
    heads: pd.DataFrame
    entropy: pd.DataFrame
    attention_reason: str
    controls: list[dict[str, Any]] = field(default_factory=list)


@torch.no_grad()
def position_controls(model: HookedSequenceModel, task: TaskConfig, offsets: Sequence[int], seed: int = 0
                      ) -> list[dict[str, Any]]:
    """The identity perturbation changes nothing (exactly); each real perturbation changes the logits of a model
    that reads positions and leaves those of a position-free model exactly unchanged."""
    device = next(model.parameters()).device
    batch = task.sample(task.train_length, 32, POSITIONAL_SEED_BASE - 1 - seed).to(device)
    base = model(batch.tokens)
    t = batch.tokens.shape[1]
    identity = model.run_with_hooks(batch.tokens, positions=torch.arange(t, device=device),
                                    fwd_hooks=[("hook_pos_embed", lambda x, hook: x.clone())]
                                    if hasattr(model, "pos_embed") else [])
    g = torch.Generator().manual_seed(seed)
    diffs = [float((out - base).abs().max()) for pert in perturbations(offsets)
             if (out := perturbed_logits(model, batch.tokens, pert, g, task.prefix_len + task.train_length))
             is not None]
    applicable, _ = positional_applicability(model)
    reach = max(diffs) if diffs else math.nan
    return [
        {"control": "identity_perturbation_max_abs_diff", "value": float((identity - base).abs().max()),
         "expected": "== 0", "passed": bool(torch.equal(identity, base))},
        {"control": "perturbation_max_abs_logit_diff", "value": reach,
         "expected": "> 0 (model reads positions)" if applicable else "== 0 (position-free model)",
         "passed": bool(reach > 0) if applicable else bool(reach == 0)},
    ]


def analyze(ckpt: Checkpoint | str | Path, device: torch.device | str = "cpu", seed: int = 0, n_batches: int = 8,
            batch_size: int = 128, offsets: Sequence[int] | None = None, window_ks: Sequence[int] | None = None,
            window_length: int | None = None, window_samples: int = 512, entropy_lengths: Sequence[int] | None = None,
            threshold: float = FLAG_THRESHOLD, progress: bool = False) -> ShortcutReport:
    """Run every shortcut test on one checkpoint (a path or a loaded ``Checkpoint``)."""
    if not isinstance(ckpt, Checkpoint):
        ckpt = load_checkpoint(ckpt)
    model = ckpt.build_model(device)
    task = ckpt.task_config
    offsets = default_offsets(task) if offsets is None else list(offsets)
    name = str(ckpt.path) if ckpt.path else "<memory>"
    torch.manual_seed(seed)
    positional = positional_randomization(model, task, offsets, n_batches, batch_size, seed, threshold, progress)
    window = window_test(model, task, window_ks, window_length, window_samples, 256, seed, device)
    lt = task.train_length
    lengths = entropy_lengths or sorted({max(1, lt // 2), lt, 2 * lt, 3 * lt, 4 * lt})
    if model.cfg.has_attention:
        heads = head_diagnostics(model, task, seed=seed)
        entropy = entropy_vs_length(model, task, lengths, seed=seed)
        attention_reason = "ok"
    else:
        heads, entropy = pd.DataFrame(), pd.DataFrame()
        attention_reason = f"not applicable: a {model.cfg.family} model has no attention"
    controls = position_controls(model, task, offsets, seed) + window_controls(task, window_ks, window_length, seed)
    return ShortcutReport(name, ckpt.label, model.cfg.pos_encoding, ckpt.seed,
                          positional, window, heads, entropy, attention_reason, controls)


# --- 4. tidy rows -----------------------------------------------------------------------------------------------
def report_rows(report: ShortcutReport) -> list[dict[str, Any]]:
    """Flat JSON rows (the ``analysis`` column says which test; see ``--help``)."""
    base = {"checkpoint": report.checkpoint, "label": report.label, "seed": report.seed,
            "pos_encoding": report.pos_encoding}
    rows = [{**base, "analysis": "positional", **r} for r in report.positional.drops.to_dict("records")]
    rows += [{**base, "analysis": "shortcut_score", **r} for r in report.positional.score.to_dict("records")]
    if report.window.applicable:
        rows += [{**base, "analysis": "window", "applicable": True, **r}
                 for r in report.window.table.to_dict("records")]
    rows.append({**base, "analysis": "window_score", "applicable": report.window.applicable,
                 "reason": report.window.reason, "score": report.window.score, "windowed": report.window.windowed})
    if report.heads.empty:
        rows += [{**base, "analysis": a, "applicable": False, "reason": report.attention_reason}
                 for a in ("head", "entropy")]
    else:
        rows += [{**base, "analysis": "head", "applicable": True, **r} for r in report.heads.to_dict("records")]
        rows += [{**base, "analysis": "entropy", "applicable": True, **r} for r in report.entropy.to_dict("records")]
    return rows


def pooled_rows(reports: Sequence[ShortcutReport]) -> list[dict[str, Any]]:
    """For each label with several checkpoints (seeds): drop and score averaged over them, CI over seeds."""
    rows: list[dict[str, Any]] = []
    groups: dict[tuple[str, str], list[ShortcutReport]] = {}
    for r in reports:
        groups.setdefault((r.label, r.pos_encoding), []).append(r)
    for (label, pos), members in groups.items():
        if len(members) < 2:
            continue
        base = {"checkpoint": f"{label} (pooled over {len(members)} checkpoints)", "label": label,
                "pos_encoding": pos, "members": ",".join(m.checkpoint for m in members), "n_seeds": len(members)}
        if not members[0].positional.applicable:
            rows.append({**base, "analysis": "shortcut_score_pooled", "subtask": "all", "applicable": False,
                         "reason": members[0].positional.reason, "score": math.nan})
            continue
        drops = pd.concat([m.positional.drops for m in members])
        for (pert, s), part in drops.groupby(["perturbation", "subtask"], sort=False):
            mean, lo, hi = mean_ci(list(part["drop"]))
            rows.append({**base, "analysis": "positional_pooled", "perturbation": pert, "subtask": s,
                         "applicable": bool(part.applicable.all()), "drop": mean, "drop_ci_low": lo,
                         "drop_ci_high": hi})
        scores = pd.concat([m.positional.score for m in members])
        for s, part in scores.groupby("subtask", sort=False):
            mean, lo, hi = mean_ci(list(part.score))
            rows.append({**base, "analysis": "shortcut_score_pooled", "subtask": s, "applicable": True,
                         "score": mean, "score_ci_low": lo, "score_ci_high": hi})
    return rows


def summary_table(reports: Sequence[ShortcutReport]) -> pd.DataFrame:
    """One line per checkpoint: shortcut score (all, with CI), flag, window score, head statistics."""
    out = []
    for r in reports:
        sc = r.positional.score.set_index("subtask")
        row: dict[str, Any] = {"checkpoint": r.checkpoint, "label": r.label, "pos": r.pos_encoding}
        if r.positional.applicable:
            a = sc.loc["all"]
            row["pos. score"] = f"{a.score:.3f} [{a.score_ci_low:.3f}, {a.score_ci_high:.3f}]"
            row["flagged"] = "YES" if r.positional.flagged else "no"
        else:
            row["pos. score"], row["flagged"] = "N/A (no positional code)", "N/A"
        row["window score"] = f"{r.window.score:.3f}" if math.isfinite(r.window.score) else "N/A"
        row["windowed"] = ("YES" if r.window.windowed else "no") if r.window.applicable else "N/A"
        if r.heads.empty:
            row["max pos share"] = row["max recall mass"] = row["entropy L->4L"] = "N/A"
        else:
            row["max pos share"] = f"{r.heads.pos_share.max():.2f}"
            row["max recall mass"] = f"{r.heads.recall_value_mass.max():.2f}"
            e = r.entropy.groupby("length").entropy.mean()
            row["entropy L->4L"] = f"{e.iloc[1 if len(e) > 1 else 0]:.2f}->{e.iloc[-1]:.2f}"
        out.append(row)
    return pd.DataFrame(out)


def drops_table(reports: Sequence[ShortcutReport]) -> pd.DataFrame:
    """Drop (percentage points, ± CI half-width) per perturbation and subtask, one column per checkpoint."""
    cols: dict[str, dict[tuple[str, str], str]] = {}
    for r in reports:
        col = {}
        for d in r.positional.drops.itertuples():
            col[(d.perturbation, d.subtask)] = (f"{100 * d.drop:+.1f} ± {50 * (d.drop_ci_high - d.drop_ci_low):.1f}"
                                                if d.applicable else "N/A")
        cols[r.checkpoint] = col
    return pd.DataFrame(cols)


# --- 5. plots ---------------------------------------------------------------------------------------------------
def plot_drops(reports: Sequence[ShortcutReport]) -> Figure:
    """Accuracy drop per perturbation (bars, 95% CI over batches), one panel per subtask, one colour per
    checkpoint; checkpoints without a positional code are named as N/A."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(1, len(SUBTASKS), figsize=(5.5 * len(SUBTASKS), 3.8), squeeze=False)
    shown = [r for r in reports if r.positional.applicable]
    na = [r.checkpoint for r in reports if not r.positional.applicable]
    colors = sns.color_palette(n_colors=max(1, len(shown)))
    width = 0.8 / max(1, len(shown))
    for ax, s in zip(axes[0], SUBTASKS, strict=True):
        names: list[str] = []
        for j, r in enumerate(shown):
            d = r.positional.drops[(r.positional.drops.subtask == s)].reset_index(drop=True)
            names = list(d.perturbation)
            x = np.arange(len(d)) + (j - (len(shown) - 1) / 2) * width
            err = np.vstack([d["drop"] - d.drop_ci_low, d.drop_ci_high - d["drop"]]).clip(min=0)
            ax.bar(x, d["drop"].fillna(0), width, yerr=np.nan_to_num(err), color=colors[j], capsize=2,
                   label=f"{r.label} ({r.checkpoint})")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(names)), names)
        ax.set(title=f"{s} subtask", xlabel="perturbation of the positions", ylabel="accuracy drop (95% CI)")
        if shown:
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "no checkpoint reads positions", ha="center", va="center", transform=ax.transAxes)
    if na:
        fig.text(0.01, 0.005, "not applicable (no positional code): " + ", ".join(na), fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, 0.04 if na else 0, 1, 1))
    return fig


def plot_window(reports: Sequence[ShortcutReport]) -> Figure:
    """Window test: accuracy on the new labels and agreement with the old predictions vs k, one line per
    checkpoint; chance dashed."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    fig, (ax_a, ax_g) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    c, ks = math.nan, set()
    for r in reports:
        if not r.window.applicable:
            continue
        tbl = r.window.table
        c = float(tbl.chance.iloc[0])
        ks |= set(tbl.k)
        (line,) = ax_a.plot(tbl.k, tbl.acc_new, marker="o", label=f"{r.label} ({r.checkpoint})")
        ax_a.axhline(float(tbl.acc_old.iloc[0]), color=line.get_color(), ls=":", lw=1)
        ax_g.plot(tbl.k, tbl.agree_old, marker="o", label=f"{r.label} ({r.checkpoint})")
    for ax in (ax_a, ax_g):
        if math.isfinite(c):
            ax.axhline(c, color="k", ls="--", lw=1, label="chance 1/m")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks(sorted(ks), [str(k) for k in sorted(ks)])
        ax.legend(fontsize=6)
    ax_a.text(0.01, 0.02, "dotted: accuracy on the original labels", transform=ax_a.transAxes, fontsize=6)
    ax_a.set(title="accuracy on the new labels (tracker: stays high)", xlabel="k (numbers > k back resampled)",
             ylabel="fraction of state answers", ylim=(-0.02, 1.02))
    ax_g.set(title="agreement with the old predictions (windowed: stays 1)", xlabel="k (numbers > k back resampled)")
    fig.tight_layout()
    return fig


# --- 6. CLI -------------------------------------------------------------------------------------------------------
_HELP_JSON = """JSON (--json): every results row has checkpoint, label, seed, pos_encoding and analysis:
  positional: perturbation (random|permute|offset+k), test, k, subtask (state|recall), applicable, reason,
    baseline_acc, acc, drop (= baseline_acc - acc, mean over batches), drop_ci_low/high (95% Student-t over
    batches), chance, norm_drop (drop / (baseline_acc - chance)), n_batches, n_tokens;
  shortcut_score: subtask (state|recall|all), applicable, reason, score (mean norm_drop over perturbations; all:
    over learned subtasks), score_ci_low/high (over batches), flagged (score > --threshold);
  window: k, acc_old, acc_new, agree_old, p_label_same, chance, retained, n, mean_resampled;
  window_score: score (1 - mean retained), windowed (score > 0.5), applicable, reason;
  head: layer, head, gate, pos_share, rel_share, content_share, recall_value_mass, recall_key_mass,
    recall_uniform_mass, n_recall, entropy, uniform_entropy, norm_entropy, mean_distance (tokens), uniform_distance;
  entropy: length, layer, head, entropy, uniform_entropy, norm_entropy, mean_distance, uniform_distance,
    recall_value_mass, recall_uniform_mass;
  positional_pooled / shortcut_score_pooled (labels with several checkpoints): members, n_seeds, drop or score
    with a 95% CI over seeds.
Models without a positional code (lstm, the hybrid presets) and without attention (lstm) get rows with applicable
false and the reason. controls rows: checkpoint, control, value, expected, passed."""


def report_figures(reports: Sequence[ShortcutReport]) -> dict[str, Figure]:
    """Every figure of the shortcut tests, by name: ``drops``, ``window``, ``entropy``, ``heads``."""
    heads = pd.concat([r.heads.assign(checkpoint=r.checkpoint) for r in reports if not r.heads.empty]
                      or [pd.DataFrame()])
    entropy = pd.concat([r.entropy.assign(checkpoint=r.checkpoint) for r in reports if not r.entropy.empty]
                        or [pd.DataFrame()])
    return {"drops": plot_drops(reports), "window": plot_window(reports), "entropy": plot_entropy(entropy),
            "heads": plot_head_map(heads)}


def _ints(spec: str | None, what: str) -> list[int] | None:
    if spec is None:
        return None
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ProbeError(f"bad {what} {spec!r}: use a comma list of integers such as 1,5,25") from None
    if not out or min(out) < 0:
        raise ProbeError(f"bad {what} {spec!r}: use non-negative integers")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probe.shortcuts", description=__doc__.split("\n\n")[0],
                                     epilog=_HELP_JSON, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files, directories of *.pt, or globs")
    parser.add_argument("--batches", type=int, default=8, help="batches for the positional tests (default 8)")
    parser.add_argument("--batch-size", type=int, default=128, help="sequences per batch (default 128)")
    parser.add_argument("--offsets", default=None, help="position offsets k, comma list (default 1,L/5,L)")
    parser.add_argument("--window-ks", default=None, help="window test k values (default 0,1,2,4,... < L-1)")
    parser.add_argument("--window-length", type=int, default=None, help="stream length of the window test (L_train)")
    parser.add_argument("--window-samples", type=int, default=512, help="sequences for the window test (512)")
    parser.add_argument("--entropy-lengths", default=None, help="lengths for entropy vs length (L/2,L,2L,3L,4L)")
    parser.add_argument("--threshold", type=float, default=FLAG_THRESHOLD,
                        help=f"flag when the shortcut score exceeds this (default {FLAG_THRESHOLD})")
    add_common_args(parser)

    def body(args: argparse.Namespace) -> dict[str, Any]:
        paths = resolve_checkpoints(args.checkpoints)
        device = resolve_device(args.device)
        if args.batches < 2 or args.batch_size < 1 or args.window_samples < 1:
            raise ProbeError("--batches must be at least 2, --batch-size and --window-samples positive")
        reports = []
        for path in paths:
            say(args, f"analysing {path} ...")
            reports.append(analyze(path, device, args.seed, args.batches, args.batch_size,
                                   _ints(args.offsets, "--offsets"), _ints(args.window_ks, "--window-ks"),
                                   args.window_length, args.window_samples,
                                   _ints(args.entropy_lengths, "--entropy-lengths"), args.threshold,
                                   progress=not args.json))
        rows = [row for r in reports for row in report_rows(r)] + pooled_rows(reports)
        controls = [{"checkpoint": r.checkpoint, **c} for r in reports for c in r.controls]
        controls += [{"checkpoint": "synthetic patterns", **c} for c in attention_controls()]
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            say(args, "\n" + summary_table(reports).to_string(index=False))
            say(args, "\naccuracy drop under position perturbations (points, ± 95% CI half-width):")
            say(args, drops_table(reports).to_string())
            win = pd.DataFrame({r.checkpoint: {int(w.k): f"{w.acc_new:.2f} / {w.agree_old:.2f}"
                                               for w in r.window.table.itertuples()}
                                for r in reports if r.window.applicable})
            say(args, "\nwindow test, accuracy on new labels / agreement with old predictions, by k:")
            say(args, win.to_string())
        pooled = [r for r in rows if r["analysis"] == "shortcut_score_pooled" and r["subtask"] == "all"]
        for r in pooled:
            say(args, f"\n{r['checkpoint']}: shortcut score " + (
                f"{r['score']:.3f} [{r['score_ci_low']:.3f}, {r['score_ci_high']:.3f}] (95% CI over seeds)"
                if r["applicable"] else "N/A (no positional code)"))
        failed = [c for c in controls if not c["passed"]]
        say(args, f"\ncontrols: {len(controls) - len(failed)}/{len(controls)} passed"
            + "".join(f"\n  FAILED {c['checkpoint']}: {c['control']} = {c['value']} (expected {c['expected']})"
                      for c in failed))
        result = envelope("shortcuts", [str(p) for p in paths], rows, controls)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "shortcuts.json").write_text(json.dumps(result, indent=1))
            figures = report_figures(reports)
            for fname, fig in figures.items():
                fig.savefig(out / f"{fname}.png", dpi=150)
            say(args, f"wrote {out / 'shortcuts.json'} and {', '.join(f + '.png' for f in figures)} in {out}")
        return result

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
