"""Position tests at the training length: ``positional_offset`` (every answer moved k positions later, by shifting
the positional code's indices or by k leading zeros; the shortcut score) and ``position_dependence`` (random or
permuted positional code, which also destroys legitimate use of position; reported, not scored)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from probe.core.chance import chance
from probe.core.inputs import check_inputs
from probe.core.progress import progress_iter
from probe.core.seeds import SHORTCUT_POSITIONAL
from probe.core.stats import bootstrap_ci
from probe.errors import ProbeError
from probe.shortcuts.effects import drop_row, na_row
from probe.shortcuts.oracles import position_limited, tracker
from probe.shortcuts.sampling import Forward, Sampled, baselines, counts, device_of, predict
from probe.tasks import SUBTASKS, TaskConfig

FLAG_THRESHOLD = 0.1
"""A model is flagged when moving its answers a few positions later (within the trained range) costs it more than
this fraction of its above-chance accuracy (mean over offsets)."""
MIN_SKILL = 0.1
"""A subtask counts as learned (and enters the score) when its baseline accuracy is this far above chance."""
METHODS = ("index", "pad")
_SEED = SHORTCUT_POSITIONAL


@dataclass(frozen=True)
class Perturbation:
    """``random``: the positional code of every position replaced by a random vector of the same norm (rope: i.i.d.
    random integer positions in the training range); ``permute``: positions shuffled across the sequence;
    ``offset``: every position index shifted by ``k``; ``pad``: ``k`` zeros inserted before the stream (every answer
    moves k positions later, no label changes; a model without a positional code can still count positions)."""

    kind: str
    k: int | None = None

    @property
    def name(self) -> str:
        return f"{self.kind}+{self.k}" if self.k is not None else self.kind

    @property
    def method(self) -> str:
        return "pad" if self.kind == "pad" else "index"


def perturbations(offsets: Sequence[int]) -> list[Perturbation]:
    """The index perturbations: random, permute, then one offset per k."""
    return [Perturbation("random"), Perturbation("permute"), *(Perturbation("offset", int(k)) for k in offsets)]


def default_offsets(task: TaskConfig) -> list[int]:
    """1, L_train / 5 and L_train / 2: a nudge and two shifts that keep some answers inside the training range."""
    lt = task.train_length
    return sorted({1, max(2, lt // 5), max(2, lt // 2)})


def positional_applicability(model: Forward) -> tuple[bool, str]:
    """Whether the model has position indices to perturb, and why not if it has none."""
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        return (True, "oracle reads positions") if getattr(model, "reads_positions", False) else (
            False, "not applicable: this function takes no positions")
    if hasattr(model, "pos_embed"):
        return True, f"additive {cfg.pos_encoding} code (hook_pos_embed)"
    if cfg.pos_encoding == "rope" and cfg.has_attention:
        return True, "rope in attention (no additive code: random = random integer positions)"
    if cfg.pos_encoding == "none":
        return False, f"not applicable: {cfg.family} model without positional encoding (pos_encoding='none')"
    return False, f"not applicable: a {cfg.family} model ignores pos_encoding='{cfg.pos_encoding}'"


def perturbed_logits(model: Forward, tokens: Int[Tensor, "batch pos"], pert: Perturbation, g: torch.Generator,
                     train_positions: int) -> Float[Tensor, "batch pos vocab"] | None:
    """Logits with the position indices perturbed; None when the perturbation does not exist for this model (an
    offset that leaves a learned table). Random draws come from ``g`` on the CPU (same result on any device).
    ``train_positions`` bounds the random integer positions used for rope."""
    b, t = tokens.shape
    device = tokens.device
    if pert.kind == "random":
        if hasattr(model, "pos_embed"):
            def randomize(x: Tensor, hook: Any) -> Tensor:
                r = torch.randn(x.shape, generator=g).to(x)
                return r * (x.norm(dim=-1, keepdim=True) / r.norm(dim=-1, keepdim=True).clamp(min=1e-12))

            return model.run_with_hooks(tokens, fwd_hooks=[("hook_pos_embed", randomize)])
        positions = torch.randint(train_positions, (b, t), generator=g)
    elif pert.kind == "permute":
        positions = torch.rand(b, t, generator=g).argsort(dim=1)
    elif pert.kind == "offset":
        positions = torch.arange(t).expand(b, t) + int(pert.k or 0)
        cfg = getattr(model, "cfg", None)
        if cfg is not None and cfg.pos_encoding == "learned" and hasattr(model, "pos_embed") and \
                int(positions.max()) >= cfg.max_len:
            return None
    else:
        raise ProbeError(f"unknown perturbation {pert.kind!r}; choose random, permute or offset")
    return model(tokens, positions=positions.to(device))


def pad_stream(tokens: Int[Tensor, "batch pos"], prefix_len: int, k: int) -> Int[Tensor, "batch pos"]:
    """``k`` zeros (the identity of the running sum) between the dictionary and the stream."""
    zeros = torch.zeros(len(tokens), k, dtype=tokens.dtype)
    return torch.cat([tokens[:, :prefix_len], zeros, tokens[:, prefix_len:]], dim=1)


Pad = Callable[[Tensor, int, int], Tensor]


@dataclass
class PositionalResult:
    """``offset``: one row per (method, k, subtask); ``dependence``: one row per (random | permute, subtask);
    ``score``: per method and subtask (and ``all`` learned subtasks), the mean over offsets of the normalised drop
    ``drop / (baseline_acc - chance)``, i.e. the fraction of above-chance accuracy lost when answers move a few
    positions later, with a bootstrap CI over sequences. ``applicable``/``reason`` say whether the model has
    position indices (the ``index`` method and the dependence tests); ``pad`` applies to every model."""

    applicable: bool
    reason: str
    offset: pd.DataFrame
    dependence: pd.DataFrame
    score: pd.DataFrame
    threshold: float = FLAG_THRESHOLD

    @property
    def headline(self) -> str:
        """The score that says the most: the index shift where there are indices (it moves nothing else), else the
        padding."""
        return "index" if self.applicable else "pad"

    def score_of(self, method: str | None = None, subtask: str = "all") -> pd.Series | None:
        method = method or self.headline
        part = self.score[(self.score.method == method) & (self.score.subtask == subtask)]
        return part.iloc[0] if len(part) else None

    @property
    def overall(self) -> float:
        row = self.score_of()
        return float(row.effect) if row is not None and row.applicable else math.nan

    @property
    def flagged(self) -> bool:
        return bool(math.isfinite(self.overall) and self.overall > self.threshold)


def _in_range(batch_len: int, prefix_len: int, k: int) -> Tensor:
    """Answers whose shifted position stays inside the sequence's own range, so that an offset tests absolute
    position and not positions never seen in training."""
    pos = torch.arange(batch_len)[None]
    return (pos >= prefix_len) & (pos - prefix_len + k < batch_len - prefix_len)


def positional_tests(model: Forward, task: TaskConfig, offsets: Sequence[int] | None = None,
                     n_sequences: int = 256, seed: int = 0, threshold: float = FLAG_THRESHOLD,
                     baseline: dict[int, Sampled] | None = None, methods: Sequence[str] = METHODS,
                     pad: Pad = pad_stream, progress: bool = False) -> PositionalResult:
    """The position tests at L_train, each paired with the unperturbed answers on the same sequences. Offsets
    score only answers whose moved position stays below L_train."""
    check_inputs("probe.shortcuts.positional_tests", forward=model, task=task)
    offsets = [int(k) for k in (default_offsets(task) if offsets is None else offsets)]
    if any(k < 1 or k >= task.train_length for k in offsets):
        raise ProbeError(f"offsets {offsets}: each must lie in [1, L_train - 1 = {task.train_length - 1}] so that "
                         "some answers stay inside the training range")
    applicable, reason = positional_applicability(model)
    length = task.train_length
    ref = (baseline or {}).get(length) or baselines(model, task, [length], n_sequences, seed)[length]
    batch, p = ref.batch, ref.batch.prefix_len
    base_right = ref.pred == batch.labels
    g = torch.Generator().manual_seed(_SEED + seed)
    perts = ([q for q in perturbations(offsets) if applicable] if "index" in methods else []) + (
        [Perturbation("pad", k) for k in offsets] if "pad" in methods else [])
    dep_rows, off_rows = [], []
    arrays: dict[tuple[str, int, str], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for pert in progress_iter(perts, "positional", progress):
        if pert.kind == "pad":
            k = int(pert.k or 0)
            right = torch.zeros_like(base_right)
            shifted = predict(model, pad(batch.tokens, p, k))
            end = batch.tokens.shape[1]
            right[:, p: end - k] = shifted[:, p + k: end] == batch.labels[:, p: end - k]
            why = f"{k} zeros before the stream"
        else:
            with torch.no_grad():
                logits = perturbed_logits(model, batch.tokens.to(device_of(model)), pert, g, p + length)
            if logits is None:
                off_rows += [{"test": "positional_offset", "method": "index", "offset": pert.k, "length": length,
                              "subtask": s, **na_row(f"not applicable: positions up to {p + length + (pert.k or 0) - 1}"
                                                     f" leave the learned table")} for s in SUBTASKS]
                continue
            right = logits.argmax(-1).cpu() == batch.labels
            why = reason
        window = _in_range(batch.tokens.shape[1], p, int(pert.k)) if pert.k is not None else None
        for s in SUBTASKS:
            mask = batch.masks[s] if window is None else batch.masks[s] & window
            n, b = counts(base_right, mask)
            _, r = counts(right, mask)
            test = "position_dependence" if pert.k is None else "positional_offset"
            head = {"test": test, "length": length, "subtask": s}
            head.update({"perturbation": pert.kind} if pert.k is None else {"method": pert.method, "offset": pert.k})
            if n.sum() == 0:
                (dep_rows if pert.k is None else off_rows).append({**head, **na_row(
                    f"not applicable: the task asks no {s} questions")})
                continue
            row = drop_row(n, b, r, seed=seed)
            skill = row["baseline_acc"] - chance(task, s)
            row["norm_drop"] = row["effect"] / skill if skill >= MIN_SKILL else math.nan
            (dep_rows if pert.k is None else off_rows).append({**head, "applicable": True, "reason": why, **row})
            if pert.k is not None:
                arrays[(pert.method, int(pert.k), s)] = (n, b, r)
    for kind in ("random", "permute"):
        if not applicable and "index" in methods:
            dep_rows += [{"test": "position_dependence", "length": length, "subtask": s, "perturbation": kind,
                          **na_row(reason)} for s in SUBTASKS]
    if not applicable and "index" in methods:
        off_rows += [{"test": "positional_offset", "method": "index", "offset": k, "length": length, "subtask": s,
                      **na_row(reason)} for k in offsets for s in SUBTASKS]
    learned = [s for s in SUBTASKS if batch.masks[s].any() and
               float((base_right & batch.masks[s]).sum() / batch.masks[s].sum()) - chance(task, s) >= MIN_SKILL]
    score = _score(arrays, learned, task, length, threshold, methods, applicable, reason, seed)
    return PositionalResult(applicable, reason, pd.DataFrame(off_rows), pd.DataFrame(dep_rows), score, threshold)


def _score(arrays: dict[tuple[str, int, str], tuple[np.ndarray, np.ndarray, np.ndarray]], learned: list[str],
           task: TaskConfig, length: int, threshold: float, methods: Sequence[str], applicable: bool, reason: str,
           seed: int) -> pd.DataFrame:
    """Mean normalised drop over offsets (and learned subtasks for ``all``), with a bootstrap CI over sequences that
    resamples every offset's answers together (they are the same sequences)."""
    rows = []
    for method in methods:
        for s in (*SUBTASKS, "all"):
            head = {"test": "offset_score", "method": method, "length": length, "subtask": s}
            if method == "index" and not applicable:
                rows.append({**head, **na_row(reason), "flagged": False})
                continue
            subs = learned if s == "all" else [s] if s in learned else []
            keys = [key for key in arrays if key[0] == method and key[2] in subs]
            if not keys:
                why = "no subtask above chance" if s == "all" else f"{s} not learned (or not asked): no score"
                rows.append({**head, **na_row(why), "flagged": False})
                continue
            parts = [arrays[key] for key in keys]
            skills = [b.sum() / n.sum() - chance(task, key[2]) for key, (n, b, _) in zip(keys, parts, strict=True)]

            def stat(idx: np.ndarray, parts: list = parts, skills: list = skills) -> np.ndarray:
                drops = [(b[idx].sum(1) - r[idx].sum(1)) / np.maximum(n[idx].sum(1), 1) / sk
                         for (n, b, r), sk in zip(parts, skills, strict=True)]
                return np.mean(drops, axis=0)

            value = float(stat(np.arange(len(parts[0][0]))[None])[0])
            lo, hi = bootstrap_ci(stat, len(parts[0][0]), seed=seed)
            rows.append({**head, "applicable": True, "reason": f"mean normalised drop over {len(keys)} offset rows",
                         "effect": value, "ci_low": lo, "ci_high": hi, "ci_method": "bootstrap",
                         "n_sequences": len(parts[0][0]), "n_answers": int(sum(n.sum() for n, _, _ in parts)),
                         "flagged": bool(value > threshold)})
    return pd.DataFrame(rows)


@torch.no_grad()
def position_controls(model: Forward, task: TaskConfig, offsets: Sequence[int], seed: int = 0
                      ) -> list[dict[str, Any]]:
    """On the model: the identity perturbation changes nothing (exactly); each index perturbation changes the
    logits of a model that reads positions and leaves those of a position-free model exactly unchanged."""
    device = next(model.parameters()).device
    batch = task.sample(task.train_length, 32, _SEED - 1 - seed).to(device)
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


def offset_controls(task: TaskConfig, offsets: Sequence[int] | None = None, n_sequences: int = 64, seed: int = 0,
                    pad: Pad = pad_stream, threshold: float = FLAG_THRESHOLD) -> list[dict[str, Any]]:
    """Controls that the offset test (and its ``pad``) can fail: an exact tracker loses nothing when its answers
    move (padding is an identity, and answers are compared where they moved to); a model that is right only before
    stream position L_train / 2 (the absolute-position shortcut) is flagged by both methods."""
    exact = positional_tests(tracker(task), task, offsets, n_sequences, seed, threshold, methods=("pad",), pad=pad)
    shortcut = positional_tests(position_limited(task), task, offsets, n_sequences, seed, threshold, pad=pad)
    state = shortcut.score[shortcut.score.subtask == "state"].set_index("method").effect
    effects = exact.offset.effect.dropna()  # N/A rows: a subtask the task does not ask
    return [
        {"control": "offset_tracker_oracle", "value": float(effects.abs().max()),
         "expected": "== 0 accuracy lost", "passed": bool(len(effects) and (effects == 0).all())},
        {"control": "offset_position_oracle", "value": float(state.min()),
         "expected": f"state score > {threshold} by index and by pad",
         "passed": bool(len(state) == 2 and (state > threshold).all())},
    ]
