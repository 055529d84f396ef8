"""Every shortcut test on one checkpoint (``analyze``), and the report as flat JSON rows and summary tables."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from probe.attention import entropy_vs_length, head_diagnostics
from probe.checkpoint import Checkpoint, load_checkpoint
from probe.core.lengths import multiples
from probe.core.meta import variant_name
from probe.core.stats import t_interval
from probe.shortcuts.knockout import attention_knockout, knockout_controls
from probe.shortcuts.positional import (
    FLAG_THRESHOLD,
    PositionalResult,
    default_offsets,
    offset_controls,
    position_controls,
    positional_tests,
)
from probe.shortcuts.runs import DEFAULT_RUNS, identity_run, identity_run_controls
from probe.shortcuts.sampling import DEFAULT_FACTORS, baselines
from probe.shortcuts.sums import DEFAULT_KS, sum_preserving, sum_preserving_controls
from probe.shortcuts.window import WindowResult, window_controls, window_test

TESTS = ("attention_knockout", "sum_preserving", "identity_run", "positional_offset", "offset_score",
         "position_dependence")
"""The tests whose rows share ``length, subtask, effect, ci_low, ci_high``."""
_KEYS = ["test", "length", "subtask", "blocks", "k", "run", "head", "where", "method", "offset", "perturbation"]


@dataclass
class ShortcutReport:
    """Every shortcut test on one checkpoint. ``tests`` holds the rows of the perturbation tests (see ``TESTS``);
    ``heads`` / ``entropy`` are empty (and ``attention_reason`` says why) for models without attention;
    ``seconds`` is the wall time of ``analyze``."""

    checkpoint: str
    label: str
    seed: int | None
    family: str
    pos_encoding: str
    knockout: pd.DataFrame
    sum_preserving: pd.DataFrame
    identity_run: pd.DataFrame
    positional: PositionalResult
    window: WindowResult
    heads: pd.DataFrame
    entropy: pd.DataFrame
    attention_reason: str
    controls: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = math.nan

    @property
    def tests(self) -> pd.DataFrame:
        parts = [self.knockout, self.sum_preserving, self.identity_run, self.positional.offset,
                 self.positional.score, self.positional.dependence]
        return pd.concat([p for p in parts if not p.empty], ignore_index=True)


def analyze(ckpt: Checkpoint | str | Path, device: torch.device | str = "cpu", seed: int = 0,
            n_sequences: int = 256, lengths: Sequence[int] | None = None, sum_ks: Sequence[int] = DEFAULT_KS,
            runs: Sequence[int] = DEFAULT_RUNS, offsets: Sequence[int] | None = None,
            window_ks: Sequence[int] | None = None, window_length: int | None = None, window_samples: int = 256,
            entropy_lengths: Sequence[int] | None = None, threshold: float = FLAG_THRESHOLD,
            progress: bool = False) -> ShortcutReport:
    """Run every shortcut test and its controls on one checkpoint (a path or a loaded ``Checkpoint``).
    ``n_sequences`` sequences per length (the same ones for every test at that length); ``lengths`` default to
    1x-4x L_train."""
    t0 = time.perf_counter()
    if not isinstance(ckpt, Checkpoint):
        ckpt = load_checkpoint(ckpt)
    model = ckpt.build_model(device)
    task = ckpt.task_config
    lengths = [int(x) for x in (lengths or multiples(task.train_length, DEFAULT_FACTORS))]
    offsets = default_offsets(task) if offsets is None else [int(k) for k in offsets]
    gates = model.attention_gates() if model.cfg.has_attention else []
    torch.manual_seed(seed)
    shared = sorted({*lengths, task.train_length, *(task.train_length + r for r in runs)})
    base = baselines(model, task, shared, n_sequences, seed)
    knockout = attention_knockout(model, task, lengths, n_sequences, seed, base, progress)
    summed = sum_preserving(model, task, lengths, sum_ks, n_sequences, seed, base, progress=progress)
    run = identity_run(model, task, runs, n_sequences=n_sequences, seed=seed, baseline=base, progress=progress)
    positional = positional_tests(model, task, offsets, n_sequences, seed, threshold, base, progress=progress)
    window = window_test(model, task, window_ks, window_length, window_samples, seed=seed)
    lt = task.train_length
    if model.cfg.has_attention:
        heads = head_diagnostics(model, task, seed=seed)
        entropy = entropy_vs_length(model, task, entropy_lengths or sorted({max(1, lt // 2), lt, 2 * lt, 3 * lt,
                                                                             4 * lt}), seed=seed)
        attention_reason = "ok"
    else:
        heads, entropy = pd.DataFrame(), pd.DataFrame()
        attention_reason = f"not applicable: a {model.cfg.family} model has no attention"
    controls = (knockout_controls(model, task, seed)
                + sum_preserving_controls(task, [lt, 3 * lt], sum_ks, seed=seed, result=summed)
                + identity_run_controls(task, runs, seed=seed, result=run)
                + position_controls(model, task, offsets, seed) + offset_controls(task, offsets, seed=seed)
                + window_controls(task, window_ks, window_length, seed))
    if gates:
        controls.append({"control": "gates_unchanged_by_analysis", "value": str(model.attention_gates()),
                         "expected": f"== {gates}", "passed": model.attention_gates() == gates})
    name = str(ckpt.path) if ckpt.path else "<memory>"
    return ShortcutReport(name, variant_name(ckpt), ckpt.seed, model.cfg.family, model.cfg.pos_encoding, knockout,
                          summed.table, run.table, positional, window, heads, entropy, attention_reason, controls,
                          time.perf_counter() - t0)


# --- rows and tables ----------------------------------------------------------------------------------------------
def report_rows(report: ShortcutReport) -> list[dict[str, Any]]:
    """Flat JSON rows; the ``test`` column says which test (see the CLI's ``--help``)."""
    base = {"checkpoint": report.checkpoint, "label": report.label, "seed": report.seed, "family": report.family,
            "pos_encoding": report.pos_encoding}
    rows = [{**base, **r} for r in report.tests.to_dict("records")]
    if report.window.applicable:
        rows += [{**base, "test": "window", "applicable": True, **r} for r in report.window.table.to_dict("records")]
    rows.append({**base, "test": "window_score", "applicable": report.window.applicable,
                 "reason": report.window.reason, "effect": report.window.score, "windowed": report.window.windowed})
    if report.heads.empty:
        rows += [{**base, "test": t, "applicable": False, "reason": report.attention_reason}
                 for t in ("head", "entropy")]
    else:
        rows += [{**base, "test": "head", "applicable": True, **r} for r in report.heads.to_dict("records")]
        rows += [{**base, "test": "entropy", "applicable": True, **r} for r in report.entropy.to_dict("records")]
    rows.append({**base, "test": "run_time", "seconds": report.seconds})
    return rows


def pooled_rows(reports: Sequence[ShortcutReport]) -> list[dict[str, Any]]:
    """For each label with several checkpoints (seeds): every test's effect averaged over them, with a Student-t
    interval over seeds (``test`` gets the suffix ``_pooled``)."""
    groups: dict[str, list[ShortcutReport]] = {}
    for r in reports:
        groups.setdefault(r.label, []).append(r)
    rows: list[dict[str, Any]] = []
    for label, members in groups.items():
        if len(members) < 2:
            continue
        frame = pd.concat([m.tests for m in members], ignore_index=True)
        keys = [k for k in _KEYS if k in frame.columns]
        for key, part in frame.groupby(keys, dropna=False, sort=False):
            ci = t_interval(list(part.effect))
            mean, lo, hi = ci.estimate, ci.low, ci.high
            rows.append({"checkpoint": f"{label} (pooled over {len(members)} checkpoints)", "label": label,
                         **{k: (None if isinstance(v, float) and math.isnan(v) else v)
                            for k, v in zip(keys, key, strict=True)},
                         "test": f"{key[0]}_pooled", "applicable": bool(part.applicable.all()), "effect": mean,
                         "ci_low": lo, "ci_high": hi, "ci_method": "t over seeds", "n_seeds": len(members),
                         "members": ",".join(m.checkpoint for m in members)})
    return rows


def _cell(row: pd.Series) -> str:
    if not row.applicable:
        return "N/A"
    if not math.isfinite(row.ci_low):
        return f"{row.effect:.3f}"
    return f"{row.effect:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}]"


def effects_table(reports: Sequence[ShortcutReport]) -> pd.DataFrame:
    """The four tests per checkpoint, one column per length: ``effect [95% CI]`` (knock-out and identity run:
    accuracy drop; sum-preserving: fraction of answers changed; offset score: fraction of above-chance accuracy
    lost). Knock-out rows per subtask and block; identity-run rows per subtask, place and head (the run of r = L -
    L_train zeros starts after ``head`` stream positions)."""
    out: dict[tuple[str, str, str], dict[int, str]] = {}
    for rep in reports:
        t = rep.tests
        for row in t.itertuples():
            if row.test == "attention_knockout":
                off = "all blocks" if row.blocks == "all" else f"block {row.blocks}"
                what = f"{row.subtask}, {off} off" if row.applicable else row.subtask
            elif row.test == "sum_preserving":
                what = f"state, k={int(row.k)}"
            elif row.test == "identity_run":
                what = f"{row.subtask} {row.where}, run after {int(row.head)}"
            elif row.test == "offset_score":
                what = f"{row.subtask}, by {row.method}"
            else:
                continue
            key = (rep.label or rep.checkpoint, row.test, what)
            out.setdefault(key, {})[int(row.length)] = _cell(pd.Series(row._asdict()))
    table = pd.DataFrame.from_dict(out, orient="index")
    table = table.reindex(sorted(table.columns), axis=1).fillna("—")
    table.index = pd.MultiIndex.from_tuples(table.index, names=["checkpoint", "test", "answers"])
    return table


def summary_table(reports: Sequence[ShortcutReport]) -> pd.DataFrame:
    """One line per checkpoint: offset score and flag, the largest effect of each perturbation test beyond the
    training length, the window score, the largest position share and recall mass of its heads, and run time."""
    out = []
    for r in reports:
        row: dict[str, Any] = {"checkpoint": r.checkpoint, "label": r.label, "pos": r.pos_encoding}
        score = r.positional.score_of()
        row["offset score"] = (f"{score.effect:.3f} [{score.ci_low:.3f}, {score.ci_high:.3f}] ({score.method})"
                               if score is not None and score.applicable else "N/A")
        row["flagged"] = "YES" if r.positional.flagged else "no"
        t = r.tests
        ko = t[(t.test == "attention_knockout") & (t.subtask == "state") & t.applicable]
        row["max state drop, knock-out"] = f"{ko.effect.max():.3f}" if len(ko) else "N/A"
        sp = t[(t.test == "sum_preserving") & t.applicable]
        row["max changed, sum-preserving"] = f"{sp.effect.max():.3f}" if len(sp) else "N/A"
        ir = t[(t.test == "identity_run") & (t["where"] == "after") & (t.subtask == "state") & t.applicable] \
            if "where" in t.columns else t.iloc[:0]
        row["max state drop, identity run"] = f"{ir.effect.max():.3f}" if len(ir) else "N/A"
        row["window score"] = f"{r.window.score:.3f}" if math.isfinite(r.window.score) else "N/A"
        if r.heads.empty:
            row["max pos share"] = row["max recall mass"] = "N/A"
        else:
            row["max pos share"] = f"{r.heads.pos_share.max():.2f}"
            row["max recall mass"] = f"{r.heads.recall_value_mass.max():.2f}"
        row["seconds"] = f"{r.seconds:.1f}"
        out.append(row)
    return pd.DataFrame(out)


def drops_table(reports: Sequence[ShortcutReport]) -> pd.DataFrame:
    """Position tests: drop in points (95% CI half-width) per perturbation and subtask, one column per checkpoint."""
    cols: dict[str, dict[tuple[str, str], str]] = {}
    for r in reports:
        col = {}
        frames = [r.positional.dependence, r.positional.offset]
        for d in pd.concat([f for f in frames if not f.empty], ignore_index=True).itertuples():
            name = d.perturbation if d.test == "position_dependence" else f"{d.method}+{int(d.offset)}"
            col[(name, d.subtask)] = (f"{100 * d.effect:+.1f} ± {50 * (d.ci_high - d.ci_low):.1f}"
                                      if d.applicable and math.isfinite(d.ci_low) else
                                      f"{100 * d.effect:+.1f}" if d.applicable else "N/A")
        cols[r.label or r.checkpoint] = col
    return pd.DataFrame(cols)
