"""Attention knock-out: state and recall accuracy with one block's attention gate, or every gate, set to 0."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch

from probe.core.gates import attention_gates
from probe.core.inputs import check_inputs
from probe.core.lengths import multiples
from probe.core.progress import progress_iter
from probe.shortcuts.effects import drop_row, na_row
from probe.shortcuts.oracles import GatedRecall
from probe.shortcuts.sampling import DEFAULT_FACTORS, Forward, Sampled, baselines, counts, predict
from probe.tasks import SUBTASKS, TaskConfig

TEST = "attention_knockout"


def knockout_configs(model: Any) -> list[tuple[str, list[float]]]:
    """``(name, gates)``: each attention block's gate at 0 alone (``"0"``, ``"1"``, ...), then all (``"all"``)."""
    gates = model.attention_gates()
    out = [(str(i), [0.0 if j == i else g for j, g in enumerate(gates)]) for i in range(len(gates))]
    return out + [("all", [0.0] * len(gates))] if len(gates) > 1 else out


def attention_knockout(model: Forward, task: TaskConfig, lengths: Sequence[int] | None = None,
                       n_sequences: int = 256, seed: int = 0, baseline: dict[int, Sampled] | None = None,
                       progress: bool = False) -> pd.DataFrame:
    """One row per (length, knocked-out blocks, subtask): ``test, length, blocks, subtask, baseline_acc, acc,
    effect (= baseline_acc - acc), ci_low, ci_high`` (paired bootstrap over sequences), ``n_sequences, n_answers,
    applicable, reason``. ``model`` needs ``attention_gates()`` / ``set_attention_gate()``; a model without
    attention gets one not-applicable row per length and subtask."""
    check_inputs("probe.shortcuts.attention_knockout", forward=model, task=task)
    lengths = [int(x) for x in (lengths or multiples(task.train_length, DEFAULT_FACTORS))]
    cfg = getattr(model, "cfg", None)
    if cfg is None or not cfg.has_attention:
        family = getattr(cfg, "family", "this")
        return pd.DataFrame([{"test": TEST, "length": L, "blocks": None, "subtask": s,
                              **na_row(f"not applicable: a {family} model has no attention")}
                             for L in lengths for s in SUBTASKS])
    base = baseline or {}
    rows: list[dict[str, Any]] = []
    for length in progress_iter(lengths, "attention knock-out", progress):
        ref = base.get(length) or baselines(model, task, [length], n_sequences, seed)[length]
        batch = ref.batch
        base_right = ref.pred == batch.labels
        for name, gates in knockout_configs(model):
            with attention_gates(model, gates):
                right = predict(model, batch.tokens) == batch.labels
            for s in SUBTASKS:
                n, b = counts(base_right, batch.masks[s])
                _, r = counts(right, batch.masks[s])
                if n.sum() == 0:
                    rows.append({"test": TEST, "length": length, "blocks": name, "subtask": s,
                                 **na_row(f"not applicable: the task asks no {s} questions")})
                    continue
                rows.append({"test": TEST, "length": length, "blocks": name, "subtask": s, "applicable": True,
                             "reason": f"attention gate(s) {name} set to 0", **drop_row(n, b, r, seed=seed)})
    return pd.DataFrame(rows)


Method = Callable[..., pd.DataFrame]


def knockout_controls(model: Forward, task: TaskConfig, seed: int = 0, n_sequences: int = 64,
                      method: Method = attention_knockout) -> list[dict[str, Any]]:
    """Controls that ``method`` (the knock-out) can fail.

    - a stand-in hybrid whose recall passes only through block 1's attention: knocking out block 1 must cost
      recall (>= 0.5) and nothing else; block 0 must cost nothing (a knock-out that sets no gate, or the wrong one,
      fails);
    - the checkpoint's own model with every attention output weight zeroed (attention it cannot use): every
      knock-out changes exactly no answer (a knock-out that also removes something else, or compares different
      sequences, fails);
    - the gates are the same after the test as before it.
    """
    length = task.train_length
    oracle = GatedRecall(task)
    rows: list[dict[str, Any]] = []
    table = method(oracle, task, [length], n_sequences, seed).set_index(["blocks", "subtask"]).effect
    recall = float(table.get(("1", "recall"), math.nan))
    if math.isfinite(recall):  # tasks without recall questions have nothing to knock out
        others = [float(table[(b, s)]) for b, s in table.index if (b, s) not in (("1", "recall"), ("all", "recall"))]
        rows.append({"control": "knockout_recall_oracle_block1", "value": recall,
                     "expected": ">= 0.5 recall drop with block 1 off; 0 for block 0 and for state",
                     "passed": bool(recall >= 0.5 and all(abs(o) == 0 for o in others))})
    cfg = getattr(model, "cfg", None)
    if cfg is not None and cfg.has_attention and isinstance(model, torch.nn.Module):
        silent = copy.deepcopy(model)
        with torch.no_grad():
            for block in silent.attention_blocks:
                block.attn.W_O.weight.zero_()
                block.attn.W_O.bias.zero_()
        before = model.attention_gates()
        effects = method(silent, task, [length], n_sequences, seed).effect.abs().dropna()  # N/A: nothing asked
        rows.append({"control": "knockout_unused_attention_changes_nothing", "value": float(effects.max()),
                     "expected": "== 0 (attention output weights zeroed)",
                     "passed": bool(len(effects) and (effects == 0).all())})
        method(model, task, [length], 8, seed)
        rows.append({"control": "knockout_restores_gates", "value": str(model.attention_gates()),
                     "expected": f"== {before}", "passed": model.attention_gates() == before})
    return rows
