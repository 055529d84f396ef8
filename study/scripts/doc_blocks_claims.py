"""The block of study/docs/fresh.md that judges study/claims.toml's target claims by the rule the file states ("Seeds
needed are the found rate rounded down over 10 fresh seeds"), beside the bars the file sets: each bar recomputed from
the runs of the seeds a claim was found on, the verdicts judged again by probe.sweep.claims with those bars.

The bars in claims.toml are history and stay as they were filed; this block says where they sit below the file's own
rule and which verdicts that changes. The judge's semantics are probe's (``probe.sweep.claims.judge``); only
``seeds_needed`` is replaced."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pandas as pd
from doc_blocks_fresh import SEEDS, _fresh
from doc_format import grid_of, read_envelope, results_dir, table

from probe.sweep.claims import Claim, judge, load_claims

FOUND = {
    "joint-cliff-bf16": ("long", "joint"),
    "joint-cliff-fp32": ("precision", "joint-fp32"),
    "joint-mod5-chance-bf16": ("shipped", "hybrid-joint"),
    "joint-mod5-chance-fp32": ("shipped", "hybrid-joint"),
    "joint-parity-bf16": ("shipped", "hybrid-joint"),
    "joint-parity-fp32": ("shipped", "hybrid-joint"),
    "dat-4x-bf16": ("long", "dat"),
    "dat-4x-fp32": ("precision", "dat-fp32"),
    "dat-16x-bf16": ("long", "dat"),
    "dat-16x-fp32": ("precision", "dat-fp32"),
    "recipe-target-bf16": ("recipe", "joint-4block"),
    "recipe-target-fp32": ("recipe", "joint-4block"),
}
"""Where each target claim's found_on seeds were run, as claims.toml's comments name them: (grid, variant), or the
shipped checkpoints' windows (study/results/shipped_windows.json; the shipped joint checkpoint is seed 4). Seeds 0-9
of the 4-block joint hybrid were run in bf16 only (`recipe`), so its fp32 claim's found rate is theirs."""
SHIPPED = "shipped_windows.json"
WINDOW = re.compile(r"(?P<sub>\w+?)_win_(?P<lo>\d+)x_(?P<hi>\d+)x")


def rule_bar(k: int, n: int, fresh: int = len(SEEDS)) -> int:
    """The file's rule: the found rate k / n, over ``fresh`` seeds, rounded down (in integers: no float rounding)."""
    return (fresh * k) // n


def estimated_window(runs: pd.DataFrame, metric: str) -> pd.Series:
    """A window metric (``state_win_2x_4x``) from a grid evaluated at lengths only: positions (a L, b L] are the last
    b - a of b L positions, and position t is distributed alike at every length (``probe.windows``), so the window
    is (b acc_b - a acc_a) / (b - a) up to sampling noise; NaN where a length was not evaluated (or the metric is a
    factor, which all-position columns do not carry)."""
    m = WINDOW.fullmatch(metric)
    if m is None:
        return pd.Series(np.nan, index=runs.index)
    sub, lo, hi = m["sub"], int(m["lo"]), int(m["hi"])
    acc = {f: runs.get(f"{sub}_acc_{f}x") for f in (lo, hi) if f}
    if any(v is None for v in acc.values()):
        return pd.Series(np.nan, index=runs.index)
    if not lo:
        return acc[hi].astype(float)
    return (hi * acc[hi] - lo * acc[lo]) / (hi - lo)


def _shipped(root: Path, label: str) -> pd.DataFrame:
    """The shipped checkpoint's measured windows, one row (indexed by its seed) with a column per window metric."""
    rows = [r for r in read_envelope(results_dir(root) / SHIPPED)["results"]
            if r.get("metric") == "window" and r.get("label") == label]
    if not rows:
        return pd.DataFrame()
    key = {"in range": "0x_1x"} | {r["window"]: r["window"].strip("(]").replace(", ", "_") for r in rows}
    out = {f"{r['subtask']}_win_{key[r['window']]}": r["token_acc"] for r in rows}
    return pd.DataFrame([out], index=[int(rows[0]["seed"])])


def found_meets(root: Path, claim: Claim) -> tuple[pd.Series, bool]:
    """Per found_on seed, 1.0 where it meets the claim's own criterion, 0.0 where not, NaN where not measured; and
    whether the values were estimated from all-position means rather than measured per window."""
    grid, variant = FOUND[claim.id]
    if grid == "shipped":
        values, estimated = _shipped(root, variant), False
        values = values.reindex(list(claim.found_on))
    else:
        runs = grid_of(root, grid).runs
        runs = runs[runs.variant == variant].set_index("seed").reindex(list(claim.found_on))
        values = pd.DataFrame({m: estimated_window(runs, m) for m in claim.metrics()}, index=runs.index)
        estimated = True
    meets = pd.Series(1.0, index=values.index)  # 1 meets, 0 misses, NaN not measured
    for bounds, holds in ((claim.target, lambda v, x: v >= x), (claim.below, lambda v, x: v < x)):
        for metric, bound in bounds.items():
            v = values[metric] if metric in values else pd.Series(np.nan, index=values.index)
            meets = meets.where(holds(v, bound), 0.0).where(v.notna())
    return meets, estimated


def rule_rows(root: Path) -> list[dict] | None:
    """Per target claim: the found rate on its own criterion, the file's bar and the rule's, and the verdict with
    each (probe's judge, only seeds_needed replaced); None before the fresh grid is committed. A claim whose found
    seeds were not measured where it looks keeps the file's bar (``rule_bar`` None)."""
    runs = _fresh(root)
    if runs is None:
        return None
    claims = load_claims(root / "study" / "claims.toml")
    found = {}
    for c in claims.claims:
        if c.kind != "target":
            continue
        meets, estimated = found_meets(root, c)
        k, n = int(meets.eq(1.0).sum()), len(meets)
        found[c.id] = (k, n, estimated, rule_bar(k, n) if meets.notna().all() else None)
    ruled = dataclasses.replace(claims, claims=tuple(
        dataclasses.replace(c, seeds_needed=found[c.id][3] or c.seeds_needed) if c.id in found else c
        for c in claims.claims))
    as_filed = {r["claim"]: r for r in judge(claims, runs)}
    out = []
    for r in judge(ruled, runs):
        if r["claim"] not in found:
            continue
        k, n, estimated, bar = found[r["claim"]]
        filed = as_filed[r["claim"]]
        grid, variant = FOUND[r["claim"]]
        out.append({"claim": r["claim"], "grid": grid, "variant": variant, "found_k": k, "found_n": n,
                    "estimated": estimated, "file_bar": filed["seeds_needed"], "rule_bar": bar,
                    "fresh_k": r["seeds_meeting"], "fresh_n": r["n_seeds"],
                    "filed": filed["confirmed"], "ruled": r["confirmed"], "verdict": r["verdict"]})
    return out


def _verdict(ok: bool | None) -> str:
    return "confirmed" if ok else "pending" if ok is None else "not confirmed"


def _names(rows) -> list[str]:
    return [f"`{r['claim']}`" for r in rows]


def changed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["filed"] != r["ruled"]]


def fresh_claims_rule(root: Path) -> str:
    """The target claims judged by the rule as written, beside the bars as filed, and the verdicts that change."""
    rows = rule_rows(root)
    if rows is None:
        return "No run of `study/sweeps/fresh.toml` is committed yet: every claim is pending."
    body = []
    for r in rows:
        where = ("the shipped joint checkpoint (measured windows)" if r["grid"] == "shipped"
                 else f"`{r['grid']}` {r['variant']}" + (" (windows estimated)" if r["estimated"] else ""))
        rate = f"{r['found_k']} of {r['found_n']}" if r["rule_bar"] is not None else "not measured there"
        bar = str(r["rule_bar"]) if r["rule_bar"] is not None else f"none (the file's {r['file_bar']} kept)"
        body.append([f"`{r['claim']}`", where, rate, str(r["file_bar"]), bar, f"{r['fresh_k']} of {r['fresh_n']}",
                     _verdict(r["filed"]), _verdict(r["ruled"])])
    text = table(["claim", "found on", "found seeds meeting the claim", "bar as filed", "bar by the rule",
                  "fresh seeds meeting it", "verdict as filed", "verdict by the rule"], body)
    ruled = [r for r in rows if r["rule_bar"] is not None]
    above = _names(r for r in ruled if r["rule_bar"] > r["file_bar"])
    below = _names(r for r in ruled if r["rule_bar"] < r["file_bar"])
    none = _names(r for r in rows if r["rule_bar"] is None)
    moved = changed(rows)
    text += (f"\n\nBy the rule as written the bar is above the filed one for {len(above)} of the {len(rows)} target "
             f"claims ({', '.join(above) or 'none'})"
             + (f", below it for {len(below)} ({', '.join(below)})" if below else "")
             + f", and not computable for {len(none)}"
             + (f" ({', '.join(none)}: its found seeds were not evaluated in that window)" if none else "") + ". ")
    if moved:
        text += "Verdicts that change: " + "; ".join(
            f"`{r['claim']}` from {_verdict(r['filed'])} to {_verdict(r['ruled'])} ({r['verdict']})"
            for r in moved) + "."
    else:
        text += "No verdict changes."
    missed = [r for r in rows if r["fresh_k"] < r["file_bar"]]
    return text + (f" The {len(missed)} claims whose fresh seeds miss the filed bar miss every higher bar too, so no "
                   "reading of their found rate changes their verdict.")


def confirmed_by_rule(root: Path) -> tuple[list[str], list[str]] | None:
    """(claims confirmed, claims not confirmed) over the whole file, target claims by the rule's bar and comparison
    claims as judged (they have no bar); None before the fresh grid is committed."""
    runs = _fresh(root)
    rows = rule_rows(root)
    if runs is None or rows is None:
        return None
    ruled = {r["claim"]: r["ruled"] for r in rows}
    allrows = judge(load_claims(root / "study" / "claims.toml"), runs)
    verdict = {r["claim"]: ruled.get(r["claim"], r["confirmed"]) for r in allrows}
    return [c for c, ok in verdict.items() if ok], [c for c, ok in verdict.items() if ok is False]


BLOCKS = {"fresh-claims-rule": fresh_claims_rule}
