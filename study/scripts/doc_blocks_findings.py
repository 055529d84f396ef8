"""The README's findings (README.md, between `<!-- findings -->` and `<!-- /findings -->`): five lines rendered from
the committed results through the same functions as the write-ups they link, so the front page cannot say more, or
other numbers, than the study's documents."""

from __future__ import annotations

import textwrap
from pathlib import Path

import doc_blocks_coadaptation as co
import doc_blocks_transfer as transfer
import numpy as np
import pandas as pd
from doc_blocks_claims import confirmed_by_rule, rule_rows
from doc_blocks_fresh import (
    EARLY,
    HOLDS,
    PER_PRECISION,
    PRESETS,
    TARGET,
    _fresh,
    _long_window,
    _met,
    _of,
)
from doc_format import grid_of, p_text, pct, read_envelope, results_dir
from doc_format import runs_of as _runs

from probe.core.stats import fisher_p, holm, permutation_p, welch_interval
from probe.sweep.claims import judge, load_claims
from probe.sweep.compare import meets_target

WIDTH = 118
"""The README's line width, less the bullet."""
SHORT = {"joint-cliff": "cliff", "joint-mod5-chance": "mod 5 at chance", "joint-parity": "parity",
         "dat-4x": "DAT holds 4x", "dat-16x": "16x", "dat-beats-joint": "beats joint",
         "recipe-target": "recipe target", "recipe-beats-dat4": "recipe beats 4-block DAT"}
"""Each claim of study/claims.toml by its stem (the id without its precision), as the front page names it."""


def _bullet(text: str) -> str:
    return textwrap.fill(text, width=WIDTH + 2, initial_indent="- ", subsequent_indent="  ",
                         break_on_hyphens=False, break_long_words=False)


def _holds_3x(runs: pd.DataFrame) -> tuple[int, int]:
    ok = (runs.state_acc_3x >= HOLDS) & (runs.recall_acc_3x >= HOLDS)
    return int(ok.sum()), len(runs)


def reproduced(root: Path) -> str:
    rep, mech = grid_of(root, "reproduction"), grid_of(root, "mechanism")
    lstm, tr = _runs(rep, "lstm"), _runs(rep, "transformer")
    (k32, n32), (k16, n16) = _holds_3x(_runs(rep, "hybrid-dat")), _holds_3x(_runs(mech, "dat"))
    every = "in every seed" if (k32, k16) == (n32, n16) else f"in {k32} of {n32} and {k16} of {n16} seeds"
    return (f"**Reproduced** ([reproduction](study/docs/reproduction.md); 3x, all positions): state / recall "
            f"{pct(lstm.state_acc_3x.mean())} / {pct(lstm.recall_acc_3x.mean())} % for the LSTM, "
            f"{pct(tr.state_acc_3x.mean())} / {pct(tr.recall_acc_3x.mean())} % for the Transformer; 2-block DAT holds "
            f"both ≥ {100 * HOLDS:.0f} % {every} ({n32} fp32, {n16} bf16).")


def _shipped_window(root: Path, subtask: str, window: str = "(8x, 16x]") -> tuple[float, int]:
    """The shipped joint checkpoint's token accuracy in a window, and its seed."""
    rows = read_envelope(results_dir(root) / "shipped_windows.json")["results"]
    row = next(r for r in rows if r.get("metric") == "window" and r.get("label") == "hybrid-joint"
               and r["window"] == window and r["subtask"] == subtask)
    return row["token_acc"], int(row["seed"])


def cliff_lands(root: Path, runs: pd.DataFrame) -> str:
    (state, seed), (parity, _), (mod5, _) = (_shipped_window(root, s) for s in ("state", "state_mod2", "state_mod5"))
    failing = runs[runs.state_win_8x_16x < HOLDS]
    lost = int((failing.state_mod5_win_8x_16x < HOLDS).sum())
    return (f"**Where the cliff lands** (shipped joint checkpoint, seed {seed}, (8x, 16x]): state {pct(state)} % "
            f"(floor 10), parity {pct(parity)} %, mod 5 {pct(mod5)} % (chance 20); {lost} of the {len(failing)} fresh "
            f"runs below {100 * HOLDS:.0f} % there have mod 5 below {100 * HOLDS:.0f} % too.")


def _holding(runs: pd.DataFrame, variant: str) -> tuple[int, int]:
    w = _of(runs, variant).state_win_8x_16x.dropna()
    return int((w >= HOLDS).sum()), len(w)


def cliff_common(root: Path, runs: pd.DataFrame) -> str:
    (kb, nb), (kf, nf) = _holding(runs, "joint-bf16"), _holding(runs, "joint-fp32")
    long = _long_window(_of(grid_of(root, "long").runs, "joint"))
    rep = _of(grid_of(root, "replay").runs, "joint-bf16").state_win_8x_16x.dropna()
    kr, nr = int((rep >= HOLDS).sum()), len(rep)
    p = fisher_p(kb, nb, kr, nr)
    lead = ("**The cliff is common, not universal**" if 0 < kb + kf < (nb + nf) / 2 else "**The cliff**")
    return (f"{lead} ([fresh](study/docs/fresh.md)): joint holds (8x, 16x] in {kb} of {nb} fresh seeds "
            f"(bf16), {kf} of {nf} (fp32), {int((long >= HOLDS).sum())} of {len(long)} of seeds 0-9 (estimated); "
            f"0-4 retrained on the fresh machine hold {kr} of {nr}, no difference detected (Fisher p {p_text(p)}): "
            "machine and seed are not told apart.")


def no_recipe(root: Path, runs: pd.DataFrame) -> str:
    (kb, nb), (kf, nf) = (_met(_of(runs, f"joint4-{p}")) for p in ("bf16", "fp32"))
    (db, dnb), (df, dnf) = (_met(_of(runs, f"dat-{p}")) for p in ("bf16", "fp32"))
    r = runs[runs.variant.str.startswith("joint4-")]
    fail = r[meets_target(r, TARGET).eq(False)]
    w, bar, label = EARLY
    early = fail[fail[[f"state_win_{w}", f"recall_win_{w}"]].min(axis=1) < bar]
    low, near = early[early[f"state_win_{w}"] < HOLDS], early[early[f"state_win_{w}"] >= HOLDS]
    rows = {row["claim"]: row for row in judge(load_claims(root / "study" / "claims.toml"), runs)}
    diffs = [rows[f"recipe-beats-dat4-{p}"] for p in ("bf16", "fp32")]
    said = ", ".join(f"{100 * x['difference']:+.1f} [{100 * x['difference_ci_low']:+.1f}, "
                     f"{100 * x['difference_ci_high']:+.1f}] {p}" for x, p in zip(diffs, ("bf16", "fp32"), strict=True))
    found = "no difference detected" if not any(x["confirmed"] for x in diffs) else "detected in one precision"
    text = (f"**No recipe**: 4-block joint meets its target in {kb} of {nb} fresh seeds (bf16), {kf} (fp32; "
            f"bar {PER_PRECISION}); of {len(fail)} misses {len(low)} fall below {100 * HOLDS:.0f} % in {label}")
    if len(near):
        text += (f", {len(near)} miss {100 * bar:.0f} % there narrowly ({pct(near[f'state_win_{w}'].min())}–"
                 f"{pct(near[f'state_win_{w}'].max())} %) and lose mod 5 further out")
    return text + f"; against 4-block DAT in (8x, 16x] {found} ({said}). 2-block DAT: {df} (fp32), {db} (bf16)."


def _both(ids: list[str]) -> bool:
    """Whether every claim named holds, or fails, in both precisions alike (then said once, after the lists)."""
    stems = [c.rsplit("-", 1)[0] for c in ids]
    return all(stems.count(s) == 2 for s in stems)


def _named(ids: list[str]) -> str:
    """Claims by their front-page names, each with the precisions it holds in ("both" where it holds in both)."""
    out: dict[str, list[str]] = {}
    for c in ids:
        stem, prec = c.rsplit("-", 1)
        out.setdefault(stem, []).append(prec)
    if all(len(p) == 2 for p in out.values()):
        return ", ".join(SHORT.get(s, s) for s in out)
    return ", ".join(f"{SHORT.get(s, s)} ({'both' if len(p) == 2 else p[0]})" for s, p in out.items())


def precision_and_claims(root: Path, runs: pd.DataFrame) -> str:
    ps, diffs = [], {}
    for stem in PRESETS:
        x = _of(runs, f"{stem}-fp32").state_win_8x_16x.dropna().to_numpy()
        y = _of(runs, f"{stem}-bf16").state_win_8x_16x.dropna().to_numpy()
        ps.append(permutation_p(x, y))
        diffs[stem] = welch_interval(x, y)
    adj = holm(ps)
    span = (f"every Holm p {p_text(min(adj))}" if np.isclose(min(adj), max(adj))
            else f"Holm p {p_text(min(adj))}–{p_text(max(adj))}")
    dat = diffs["dat"]
    detected = min(adj) < 0.05
    n = len(_of(runs, "dat-fp32"))
    text = (f"**Precision** ({n} vs {n} seeds): "
            + ("a difference detected" if detected else "no difference detected")
            + f" ({span}; DAT in (8x, 16x] {100 * dat.estimate:+.1f} [{100 * dat.low:+.1f}, {100 * dat.high:+.1f}]).")
    got = confirmed_by_rule(root)
    rows = rule_rows(root) or []
    if got is None:
        return text
    yes, no = got
    total = len(judge(load_claims(root / "study" / "claims.toml"), runs))
    filed = sum(1 for r in judge(load_claims(root / "study" / "claims.toml"), runs) if r["confirmed"])
    moved = [r["claim"] for r in rows if r["filed"] != r["ruled"]]
    return text + (f" **Confirmed** (file's rule): {len(yes)} of {total} ({filed} "
                   "as filed" + (f"; {', '.join(f'`{c}`' for c in moved)} changes" if moved else "")
                   + f"): {_named(yes)}; not confirmed ({len(no)}): {_named(no)}"
                   + ("; each in both precisions." if _both(yes + no) else "."))


def why(root: Path) -> str:
    v = co.values(root)
    if v is None:
        return "**Why** ([mechanism](study/docs/mechanism.md)): its grid is not yet run."
    result, _, beyond, _ = co.verdict(v)
    ends = beyond.get((co.JOINT, co.CUT, "beyond"))
    seeds = f"fresh seeds {co.GRID_SEEDS[0]}-{co.GRID_SEEDS[-1]}"
    text = (f"**Why** ([mechanism](study/docs/mechanism.md)): cutting attention's gradient into block 0's LSTM, "
            f"{seeds}, bf16: joint − cut in (2x, 4x] {100 * ends.estimate:+.1f} [{100 * ends.low:+.1f}, "
            f"{100 * ends.high:+.1f}] points, {co._result(ends)}")
    r8 = co.precision_reading(root)
    if r8 is not None and r8.comparison is not None and r8.reading == "re-measured":
        c = r8.comparison
        text += (f"; re-measured in fp32 on the same seeds (not a replication): {100 * c.estimate:+.1f} "
                 f"[{100 * c.low:+.1f}, {100 * c.high:+.1f}]")
    elif r8 is not None:
        text += f"; fp32 (R8): {r8.reading}"
    return text + f". {result.text.split(':', 1)[0]}."


def readme_findings(root: Path) -> str:
    """The README's findings, one bullet each: the reproduction, where the cliff lands, how common it is, the
    recipe, precision and the pre-registered claims, the mechanism, and whether the story transfers."""
    runs = _fresh(root)
    if runs is None:
        return _bullet(reproduced(root)) + "\n- The fresh-seed grid is not committed yet."
    bullets = [reproduced(root), cliff_lands(root, runs), cliff_common(root, runs), no_recipe(root, runs),
               precision_and_claims(root, runs), why(root), transfer.readme_line(root)]
    return "\n".join(_bullet(t) for t in bullets if t is not None)


BLOCKS = {"readme-findings": readme_findings}
