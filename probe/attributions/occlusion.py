"""Per-position effects by resampling one input token, exact, split into paths by patching sublayer outputs.

For each sequence and each position s, one token is resampled and the state labels are recomputed: a number x_s
becomes another number (the running sums from s on shift by the difference), a query key another key of the same
dictionary, a dictionary token another key outside the dictionary or another value (state labels unchanged). Then,
for every state answer at t, ``follow`` = the model's prediction equals the recomputed label and ``flip`` = the
prediction changed. A model that tracks the state follows every number at every distance; a model that reads only
the last k tokens follows nothing beyond k. Conditions (path patching): ``total`` (the corrupted input as it is),
``recurrent_only`` (every ``blocks.{i}.hook_attn_out`` held at its clean value, so the change reaches t only along
paths that avoid attention) and ``attention_only`` (every ``blocks.{i}.hook_lstm_out`` held clean: only paths that
avoid every LSTM). What neither carries alone needs both: for example a token read by the LSTM and then by attention
at a nearby position. On a wrapped model the held outputs are its named modules' (``sublayer_outputs``): every
attention module's ``hook_out`` for ``recurrent_only``, every recurrent module's for ``attention_only``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from probe.core.inputs import check_inputs
from probe.core.progress import progress_iter
from probe.errors import ProbeError
from probe.memory import fit_batch_size
from probe.models import HookedSequenceModel
from probe.models.hooked import Sublayer
from probe.tasks import Batch, TaskConfig
from probe.wrapped import WrappedModel

CONDITIONS = ("total", "recurrent_only", "attention_only")
KINDS = ("number", "query", "prefix")
FROZEN = {"recurrent_only": ("attn",), "attention_only": ("recurrent",), "both_frozen": ("attn", "recurrent")}
"""Which kinds of sublayer output (``model.sublayer_outputs()``) a condition holds at their clean values."""


def corrupt(batch: Batch, task: TaskConfig, gen: torch.Generator,
            positions: Sequence[int] | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Every (sequence, position) pair with one token resampled: (row's sequence index, position, kind index into
    ``KINDS``, corrupted tokens (rows, T), recomputed labels (rows, T)). Dictionary SEP tokens are skipped."""
    tokens, labels, p = batch.tokens.cpu(), batch.labels.cpu(), batch.prefix_len
    state = (batch.masks["state"] & batch.answer_mask).cpu()
    if state.any() and not bool((labels[state] == batch.sums.cpu()[state]).all()):
        raise ProbeError(f"task {task.name}: occlusion recomputes state labels as running sums, which this task's "
                         "answers are not; use modsum or interleaved")
    b, t_len = tokens.shape
    positions = list(range(t_len)) if positions is None else list(positions)
    seq = torch.arange(b).repeat_interleave(len(positions))
    pos = torch.tensor(positions).repeat(b)
    old = tokens[seq, pos]
    new = old.clone()
    kind = torch.full_like(old, -1)
    n_pairs = getattr(task, "n_pairs", 0)
    m, ko, vo = task.m, task.key_offset, task.value_offset
    dict_keys = tokens[:, 0:2 * n_pairs:2] if p else tokens[:, :0]  # (B, P) key tokens of each dictionary
    is_key = (old >= ko) & (old < vo)
    is_value = (old >= vo) & (old < vo + task.n_values)
    in_prefix = pos < p
    # numbers in the stream: shift by 1..m-1, so the token always changes
    num = ~in_prefix & (old < m)
    new[num] = (old[num] + torch.randint(1, m, (int(num.sum()),), generator=gen)) % m
    kind[num] = 0
    # query keys in the stream: another key of the same dictionary
    query = ~in_prefix & is_key
    if query.any() and n_pairs > 1:
        choices = dict_keys[seq[query]]  # (q, P)
        same = choices == old[query][:, None]
        pick = torch.rand(choices.shape, generator=gen).masked_fill(same, -1).argmax(dim=1)
        new[query] = choices[torch.arange(len(pick)), pick]
        kind[query] = 1
    # dictionary keys: a key outside the dictionary; dictionary values: another value
    pkey = in_prefix & is_key
    if pkey.any() and task.n_keys > n_pairs:
        used = torch.zeros(int(pkey.sum()), task.n_keys, dtype=torch.bool)
        used.scatter_(1, dict_keys[seq[pkey]] - ko, True)
        pick = torch.rand(used.shape, generator=gen).masked_fill(used, -1).argmax(dim=1)
        new[pkey] = pick + ko
        kind[pkey] = 2
    pval = in_prefix & is_value
    if pval.any() and task.n_values > 1:
        new[pval] = (old[pval] - vo + torch.randint(1, task.n_values, (int(pval.sum()),), generator=gen)) \
            % task.n_values + vo
        kind[pval] = 2
    keep = kind >= 0
    seq, pos, kind, old, new = seq[keep], pos[keep], kind[keep], old[keep], new[keep]
    rows = torch.arange(len(seq))
    tok = tokens[seq].clone()
    tok[rows, pos] = new
    lab = labels[seq].clone()
    shift = torch.where(kind == 0, new - old, torch.zeros_like(new))
    after = torch.arange(t_len)[None, :] >= pos[:, None]
    st = state[seq] & after
    lab = torch.where(st, (lab + shift[:, None]) % m, lab)
    return seq, pos, kind, tok, lab


def _frozen_hooks(sublayers: dict[str, Sublayer], condition: str, clean: dict[str, Tensor], rows: Tensor,
                  ) -> list[tuple[str, Any]]:
    hooks = []
    for name, value in clean.items():
        kind, dim = sublayers[name]
        if kind in FROZEN.get(condition, ()):
            hooks.append((name, lambda x, hook, v=value, d=dim: v.index_select(d, rows).to(x.dtype)))
    return hooks


@dataclass
class Occlusion:
    """Per-sequence sums by (condition, kind, distance): ``follow``, ``flip``, ``count`` are (B, kinds, T) tensors
    per condition (prefix kinds use distance 0), ``clean_correct`` the same for the unintervened model, and the
    controls' raw values."""

    follow: dict[str, Tensor]
    flip: dict[str, Tensor]
    count: Tensor
    clean_correct: Tensor
    causal_max: float          # max |logit change| at positions before the corrupted one (total condition)
    cross_position_max: float  # max |logit change| after it with every LSTM and attention output held clean
    n_pairs: int

    def profile(self) -> pd.DataFrame:
        """Rows ``kind, distance, in_prefix, condition, follow, follow_ci_low, follow_ci_high, flip, clean_acc,
        n_answers, n_sequences``; prefix rows have distance null and ``in_prefix`` true."""
        rows = []
        for k, kind in enumerate(KINDS):
            dists = [None] if kind == "prefix" else range(self.count.shape[2])
            for d in dists:
                di = 0 if d is None else d
                count = self.count[:, k, di]
                if count.sum() == 0:
                    continue
                for cond in self.follow:
                    rows.append({"kind": kind, "distance": d, "in_prefix": kind == "prefix", "condition": cond,
                                 **_mean_ci(self.follow[cond][:, k, di], count, "follow"),
                                 "flip": _mean_ci(self.flip[cond][:, k, di], count, "flip")["flip"],
                                 "clean_acc": _mean_ci(self.clean_correct[:, k, di], count, "a")["a"],
                                 "n_answers": int(count.sum()), "n_sequences": int((count > 0).sum())})
        return pd.DataFrame(rows)

    def far(self, k: int) -> pd.DataFrame:
        """Numbers only: rows ``k, range (near: distance 1..k | far: > k), condition, follow, CI, flip, clean_acc``,
        pooled per sequence over the distances of the range."""
        rows = []
        for name, sl in (("near", slice(1, k + 1)), ("far", slice(k + 1, None))):
            count = self.count[:, 0, sl].sum(dim=1)
            if count.sum() == 0:
                continue
            for cond in self.follow:
                rows.append({"k": k, "range": name, "condition": cond,
                             **_mean_ci(self.follow[cond][:, 0, sl].sum(dim=1), count, "follow"),
                             "flip": _mean_ci(self.flip[cond][:, 0, sl].sum(dim=1), count, "flip")["flip"],
                             "clean_acc": _mean_ci(self.clean_correct[:, 0, sl].sum(dim=1), count, "a")["a"],
                             "n_answers": int(count.sum()), "n_sequences": int((count > 0).sum())})
        return pd.DataFrame(rows)


def _mean_ci(total: Tensor, count: Tensor, name: str) -> dict[str, float]:
    """Mean over sequences of each sequence's mean (a fraction), with a normal 95 % interval over sequences, clipped
    to [0, 1]."""
    have = count > 0
    per = (total[have] / count[have]).double()
    n = len(per)
    mean = float(per.mean()) if n else math.nan
    half = 1.96 * float(per.std()) / math.sqrt(n) if n > 1 else math.nan
    return {name: mean, f"{name}_ci_low": max(0.0, mean - half), f"{name}_ci_high": min(1.0, mean + half)}


def _max(x: Tensor) -> float:
    return float(x.max()) if x.numel() else 0.0


def resample_occlusion(model: HookedSequenceModel | WrappedModel, batch: Batch, task: TaskConfig, seed: int = 0,
              conditions: Sequence[str] = CONDITIONS, chunk: int = 256, progress: bool = False) -> Occlusion:
    """Resample every input token once per sequence and record, for every state answer, whether the model
    follows the change, under each path condition (see the module docstring). Corrupted sequences run ``chunk``
    at a time, fewer where that many would not fit in memory."""
    check_inputs("probe.attributions.resample_occlusion", model=model, batch=batch, task=task, masks=("state",))
    device = batch.tokens.device
    chunk = fit_batch_size(model.cfg, batch.tokens.shape[1], chunk, device)
    gen = torch.Generator().manual_seed(seed)
    seq, pos, kind, tok, lab = corrupt(batch, task, gen)
    sublayers = model.sublayer_outputs()
    names = list(sublayers)
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.tokens, names_filter=names)
    clean = {n: cache[n] for n in names}
    pred_clean = logits.argmax(-1).cpu()
    b, t_len = batch.tokens.shape
    state = (batch.masks["state"] & batch.answer_mask).cpu()
    correct_clean = (pred_clean == batch.labels.cpu()) & state
    zeros = torch.zeros(b, len(KINDS), t_len)
    follow = {c: zeros.clone() for c in conditions}
    flip = {c: zeros.clone() for c in conditions}
    count, clean_correct = zeros.clone(), zeros.clone()
    causal, cross = 0.0, 0.0
    tgrid = torch.arange(t_len)
    for lo in progress_iter(range(0, len(seq), chunk), f"occlusion L={batch.length}", progress):
        r = slice(lo, lo + chunk)
        s_rows, p_rows, k_rows = seq[r], pos[r], kind[r]
        answers = state[s_rows] & (tgrid[None, :] >= p_rows[:, None])  # state answers at or after the change
        answers |= state[s_rows] & (k_rows == 2)[:, None]              # every state answer for the prefix
        dist = torch.where(k_rows[:, None] == 2, 0, tgrid[None, :] - p_rows[:, None]).clamp(min=0)
        flat = (s_rows[:, None] * len(KINDS) + k_rows[:, None]) * t_len + dist  # index into (B, kinds, T)
        idx, w = flat[answers], torch.ones(int(answers.sum()))
        count.view(-1).index_add_(0, idx, w)
        clean_correct.view(-1).index_add_(0, idx, correct_clean[s_rows][answers].float())
        rows_dev = s_rows.to(device)
        for cond in [*conditions, "both_frozen"]:
            if cond == "both_frozen" and lo > 0:
                continue  # the cross-position control needs one chunk only
            with torch.no_grad(), model.hooks(fwd_hooks=_frozen_hooks(sublayers, cond, clean, rows_dev)):
                out = model(tok[r].to(device)).cpu()
            change = (out - logits.cpu()[s_rows]).abs().amax(dim=-1)  # (rows, T)
            if cond == "both_frozen":
                cross = max(cross, _max(change[tgrid[None, :] > p_rows[:, None]]))
                continue
            if cond == "total":
                causal = max(causal, _max(change[tgrid[None, :] < p_rows[:, None]]))
            pred = out.argmax(-1)
            follow[cond].view(-1).index_add_(0, idx, (pred == lab[r])[answers].float())
            flip[cond].view(-1).index_add_(0, idx, (pred != pred_clean[s_rows])[answers].float())
    return Occlusion(follow, flip, count, clean_correct, causal, cross, len(seq))
