"""Pre-registered confirmation: claims written down with the seeds they were found on, judged on fresh seeds.

A claims file (TOML) names the sweep whose variants it is about and, per claim, the metric, the threshold or the
comparison, and the seeds the claim was found on::

    sweep = "sweeps/fresh.toml"      # relative to this file; its seeds are the fresh ones
    alpha = 0.05

    [[claim]]
    id = "dat-holds-16x"
    text = "DAT keeps both subtasks >= 95 % in (8x, 16x] in at least 9 of 10 seeds"
    variant = "dat-bf16"
    found_on = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    target = { state_win_8x_16x = 0.95, recall_win_8x_16x = 0.95 }   # a seed meets it when every one holds
    seeds_needed = 9

    [[claim]]
    id = "dat-beats-joint"
    variant = "dat-bf16"
    versus = "joint-bf16"
    metric = "state_win_2x_4x"
    direction = "greater"
    found_on = [0, 1, 2, 3, 4]

Metrics are columns of a run's summary (``runs.jsonl``): ``{subtask}_win_{lo}x_{hi}x`` (the metric of record),
``{subtask}_acc_{f}x`` and the like. A *target* claim holds on the fresh seeds when at least ``seeds_needed`` of
them meet every ``target`` (>=) and every ``below`` (<) bound. A *comparison* claim is an exact permutation test of
``variant`` against ``versus`` in the claimed direction, Holm-adjusted over the file's comparisons; it is run only if
its design can reach an adjusted p below ``alpha`` (else it is reported as *not testable*, never as refuted). A claim
whose fresh seeds overlap the seeds it was found on is refused before anything runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probe.core.stats import can_reject, clopper_pearson, holm, min_attainable_p, permutation_p, welch_interval
from probe.core.tables import pipe_table
from probe.errors import ProbeError
from probe.results.config import SweepConfig, load_config, read_toml

_TOP = {"sweep", "alpha", "claim"}
_CLAIM = {"id", "text", "variant", "found_on", "target", "below", "seeds_needed", "versus", "metric", "direction"}
DIRECTIONS = ("greater", "less")


@dataclass(frozen=True)
class Claim:
    """One pre-registered claim (see the module docstring for the fields)."""

    id: str
    variant: str
    found_on: tuple[int, ...]
    text: str = ""
    target: dict[str, float] = field(default_factory=dict)
    below: dict[str, float] = field(default_factory=dict)
    seeds_needed: int | None = None
    versus: str | None = None
    metric: str | None = None
    direction: str = "greater"

    @property
    def kind(self) -> str:
        return "comparison" if self.versus else "target"

    def metrics(self) -> list[str]:
        return [self.metric] if self.metric else [*self.target, *self.below]


@dataclass(frozen=True)
class Claims:
    """A claims file: its claims, the sweep that trains their fresh seeds, and alpha."""

    claims: tuple[Claim, ...]
    sweep: SweepConfig
    alpha: float = 0.05
    path: Path | None = None

    def fresh_seeds(self, variant: str) -> list[int]:
        v = next(v for v in self.sweep.variants if v.name == variant)
        return list(self.sweep.seeds if v.seeds is None else v.seeds)


def load_claims(path: str | Path) -> Claims:
    """Read and check a claims file: every claim names a variant of its sweep, a metric, a threshold or a
    comparison, and fresh seeds disjoint from the seeds it was found on."""
    path = Path(path)
    d = read_toml(path, "claims file")
    unknown = set(d) - _TOP
    if unknown:
        raise ProbeError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_TOP))}")
    if "sweep" not in d:
        raise ProbeError(f"{path}: needs sweep = \"PATH.toml\" (the sweep whose variants the claims are about)")
    sweep = load_config(path.parent / d["sweep"])
    alpha = float(d.get("alpha", 0.05))
    if not 0 < alpha < 1:
        raise ProbeError(f"{path}: alpha {alpha} must lie in (0, 1)")
    raw = d.get("claim", [])
    if not raw:
        raise ProbeError(f"{path}: no [[claim]] to confirm")
    claims = tuple(_claim(c, f"{path}: claim {i + 1}") for i, c in enumerate(raw))
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ProbeError(f"{path}: claim ids repeat ({', '.join(sorted({i for i in ids if ids.count(i) > 1}))})")
    out = Claims(claims, sweep, alpha, path)
    names = {v.name for v in sweep.variants}
    for c in claims:
        for v in filter(None, (c.variant, c.versus)):
            if v not in names:
                raise ProbeError(f"{path}: claim {c.id!r} names variant {v!r}, which sweep {sweep.name!r} does not "
                                 f"have ({', '.join(sorted(names))})")
        reused = sorted(set(out.fresh_seeds(c.variant)) & set(c.found_on))
        if reused:
            raise ProbeError(f"{path}: claim {c.id!r} would be confirmed on seeds {reused} it was found on; "
                             "confirmation needs fresh seeds")
        if c.seeds_needed is not None and c.seeds_needed > len(out.fresh_seeds(c.variant)):
            raise ProbeError(f"{path}: claim {c.id!r} needs {c.seeds_needed} seeds but its sweep runs "
                             f"{len(out.fresh_seeds(c.variant))}")
    return out


def _claim(c: Any, where: str) -> Claim:
    if not isinstance(c, dict):
        raise ProbeError(f"{where}: must be a table")
    unknown = set(c) - _CLAIM
    if unknown:
        raise ProbeError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_CLAIM))}")
    for key in ("id", "variant", "found_on"):
        if key not in c:
            raise ProbeError(f"{where}: needs {key}")
    found = c["found_on"]
    if not isinstance(found, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in found):
        raise ProbeError(f"{where}: found_on must be a list of seeds")
    claim = Claim(id=str(c["id"]), variant=str(c["variant"]), found_on=tuple(found), text=str(c.get("text", "")),
                  target={k: float(v) for k, v in c.get("target", {}).items()},
                  below={k: float(v) for k, v in c.get("below", {}).items()},
                  seeds_needed=c.get("seeds_needed"), versus=c.get("versus"), metric=c.get("metric"),
                  direction=str(c.get("direction", "greater")))
    if claim.kind == "comparison":
        if not claim.metric or claim.target or claim.below:
            raise ProbeError(f"{where}: a comparison (versus) takes one metric and no target/below")
        if claim.direction not in DIRECTIONS:
            raise ProbeError(f"{where}: direction {claim.direction!r}: use greater or less")
    else:
        if not (claim.target or claim.below) or claim.metric:
            raise ProbeError(f"{where}: a claim needs target = {{METRIC = VALUE}} and/or below = {{...}}, or versus "
                             "and metric for a comparison")
        if not isinstance(claim.seeds_needed, int) or claim.seeds_needed < 1:
            raise ProbeError(f"{where}: seeds_needed must be a positive integer")
    return claim


def _values(runs: pd.DataFrame, variant: str, seeds: list[int], metric: str) -> pd.Series:
    part = runs[(runs.variant == variant) & runs.seed.isin(seeds)].set_index("seed")
    if metric not in runs.columns:
        raise ProbeError(f"metric {metric!r} is not in the runs' summaries (is the evaluation long enough for that "
                         f"window?); known: {', '.join(c for c in runs.columns if '_win_' in c) or 'none'}")
    return part[metric].astype(float)


def judge(claims: Claims, runs: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per claim: ``claim, kind, variant, versus, metric, fresh_seeds, n_seeds, missing_seeds, ...,
    confirmed, verdict``. A claim is judged on every fresh seed that has finished; with seeds missing, a target
    claim can still be decided when the finished ones settle it either way, else it is ``pending``."""
    rows = []
    comparisons = [c for c in claims.claims if c.kind == "comparison"]
    pvalues: dict[str, float] = {}
    for c in claims.claims:
        seeds = claims.fresh_seeds(c.variant)
        done = set(runs[runs.variant == c.variant].seed) if len(runs) else set()
        if c.versus:
            done &= set(runs[runs.variant == c.versus].seed) if len(runs) else set()
        have = [s for s in seeds if s in done]
        row: dict[str, Any] = {"claim": c.id, "kind": c.kind, "text": c.text, "variant": c.variant,
                               "versus": c.versus, "metric": ",".join(c.metrics()), "found_on": _seeds(c.found_on),
                               "fresh_seeds": _seeds(seeds), "n_seeds": len(have),
                               "missing_seeds": _seeds(sorted(set(seeds) - set(have)))}
        if c.kind == "target":
            meets = pd.Series(True, index=have)
            known = pd.Series(True, index=have)  # a seed whose metric is NaN (a window not measured) is not judged
            for bounds, holds in ((c.target, lambda v, x: v >= x), (c.below, lambda v, x: v < x)):
                for metric, bound in bounds.items():
                    values = _values(runs, c.variant, have, metric).reindex(have)
                    known &= values.notna()
                    meets &= holds(values, bound)
            have = [s for s in have if known[s]]
            meets = meets[have]
            k, n, missing = int(meets.sum()), len(have), len(seeds) - len(have)
            row["n_seeds"] = n
            low, high = clopper_pearson(k, n) if n else (math.nan, math.nan)
            row |= {"seeds_meeting": k, "seeds_needed": c.seeds_needed, "rate_ci_low": low, "rate_ci_high": high,
                    "per_seed": " / ".join(f"{s}:{'y' if meets[s] else 'n'}" for s in have)}
            if k >= c.seeds_needed:
                row |= {"confirmed": True, "verdict": f"confirmed: {k} of {n} fresh seeds meet it"}
            elif k + missing < c.seeds_needed:
                row |= {"confirmed": False, "verdict": f"not confirmed: {k} of {n} fresh seeds meet it, "
                                                       f"{c.seeds_needed} needed"}
            else:
                row |= {"confirmed": None, "verdict": f"pending: {k} of {n} so far, {_to_run(missing)}"}
        else:
            a = _values(runs, c.variant, have, c.metric).to_numpy()
            b = _values(runs, c.versus, have, c.metric).to_numpy()
            diff = welch_interval(a, b)  # two-sided 95 %: the verdict quotes the size, not only the p
            row |= {"mean": float(np.mean(a)) if len(a) else math.nan,
                    "mean_versus": float(np.mean(b)) if len(b) else math.nan,
                    "difference": diff.estimate, "difference_ci_low": diff.low, "difference_ci_high": diff.high,
                    "p_min_attainable": min_attainable_p(len(a), len(b), alternative=c.direction),
                    "family": len(comparisons),
                    "per_seed": " / ".join(f"{s}:{x:.3f}-{y:.3f}" for s, x, y in zip(have, a, b, strict=True))}
            if len(have) < len(seeds):
                row |= {"confirmed": None, "verdict": f"pending: {_to_run(len(seeds) - len(have))}"}
            elif not can_reject(len(a), len(b), family=len(comparisons), alpha=claims.alpha,
                                alternative=c.direction):
                row |= {"confirmed": None, "verdict": f"not testable: the smallest attainable p "
                                                      f"{row['p_min_attainable']:.3g} x {len(comparisons)} tests is "
                                                      f"not below {claims.alpha}; add seeds"}
            else:
                pvalues[c.id] = permutation_p(a, b, alternative=c.direction)
        rows.append(row)
    # Holm over the whole pre-registered family: a comparison not run (pending, or not testable) stands in with p = 1,
    # so a verdict reached while part of the family waits for seeds is never adjusted over fewer tests than it says
    adjusted = dict(zip(pvalues, holm(list(pvalues.values()), family=len(comparisons)), strict=True))
    for row in rows:
        if row["claim"] in adjusted:
            p, q = pvalues[row["claim"]], float(adjusted[row["claim"]])
            ok = q < claims.alpha
            # the interval is the two-sided 95 % Welch interval (it sizes the difference either way); the test is
            # one-sided, so the interval is named as what it is rather than read as the test's own bound
            size = (f"difference {_points(row['difference'])} points, two-sided 95 % CI "
                    f"[{_points(row['difference_ci_low'])}, {_points(row['difference_ci_high'])}]")
            row |= {"p_permutation": p, "p_holm": q, "confirmed": ok,
                    "verdict": (f"confirmed: {size}" if ok else f"not confirmed: no difference detected in the claimed "
                                                                  f"direction, {size}")
                    + f" (one-sided exact permutation p {p:.3g}, Holm {q:.3g} over a family of {row['family']}; "
                      f"{row['n_seeds']} vs {row['n_seeds']} seeds, smallest attainable adjusted p "
                      f"{row['family']} × {row['p_min_attainable']:.2g} = "
                      f"{row['family'] * row['p_min_attainable']:.2g})"}
    return rows


def _to_run(n: int) -> str:
    return f"{n} seed{'' if n == 1 else 's'} to run"


def _points(x: float) -> str:
    """A difference of accuracies (fractions) in signed percentage points, one decimal."""
    return f"{100 * x:+.1f}" if math.isfinite(x) else "nan"


def _seeds(seeds: Any) -> str:
    return " ".join(str(s) for s in seeds)


def claims_markdown(rows: list[dict[str, Any]], source: str) -> str:
    """The claims as a Markdown table: claim, what it says, fresh seeds, verdict."""
    cells = [[f"`{r['claim']}`", r["text"], r["variant"] + (f" vs {r['versus']}" if r["versus"] else ""), r["metric"],
              r["fresh_seeds"], r["verdict"]] for r in rows]
    table = pipe_table(["claim", "says", "variant", "metric", "fresh seeds", "verdict"], cells)
    return f"Pre-registered claims judged on fresh seeds ({source}).\n\n{table}\n"
