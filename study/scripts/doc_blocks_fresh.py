"""The blocks of study/docs/fresh.md (and the README's findings) that quote results/fresh/ (sweeps/fresh.toml: the
four headline presets on fresh seeds 10-19, in bf16 and in fp32, judged per window of positions) and results/replay/
(sweeps/replay.toml: seeds 0-4 of the joint hybrid retrained beside them): each a function of the committed results
only, so a seed that lands changes every number here on the next render and none by hand."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from doc_format import can_reach, descriptive, grid_of, min_adjusted_text, p_text, pct, per_seed, results_dir, table

from probe.core.stats import fisher_p, permutation_p, welch_interval
from probe.sweep.compare import RECIPE_TARGET, meets_target, newcombe_interval, parse_target

PRESETS = {"joint": "`hybrid-joint` (2 blocks)", "dat": "`hybrid-dat` (2 blocks)",
           "joint4": "`hybrid-recipe` (4 blocks, joint)", "dat4": "`hybrid-4block-dat` (4 blocks)"}
"""The fresh grid's presets by variant stem; each is trained as STEM-bf16 and STEM-fp32."""
PRECISIONS = ("bf16", "fp32")
WINDOWS = (("0x_1x", "in range"), ("1x_2x", "(1x, 2x]"), ("2x_4x", "(2x, 4x]"), ("4x_8x", "(4x, 8x]"),
           ("8x_16x", "(8x, 16x]"))
HOLDS = 0.95
"""A seed holds a window when its token accuracy there is at least this (the claims' "holds")."""
NEEDED = 18
"""The recipe's bar: the target met on at least this many of 20 fresh seeds (10 per precision)."""
TARGET = parse_target(RECIPE_TARGET)


def _fresh(root: Path) -> pd.DataFrame | None:
    path = results_dir(root) / "fresh" / "runs.jsonl"
    return grid_of(root, "fresh").runs if path.is_file() else None


def _of(runs: pd.DataFrame, variant: str) -> pd.DataFrame:
    return runs[runs.variant == variant].sort_values("seed")


def _variants(runs: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """("preset, precision", its runs) for every variant of the grid with a committed run, presets in order."""
    out = [(f"{name}, {prec}", _of(runs, f"{stem}-{prec}")) for stem, name in PRESETS.items() for prec in PRECISIONS]
    return [(label, r) for label, r in out if not r.empty]


def _window_cell(values: pd.Series) -> str:
    v = values.dropna()
    if v.empty:
        return "–"
    return f"{pct(v.mean())} · {int((v >= HOLDS).sum())}/{len(v)}"


def fresh_windows(root: Path) -> str:
    """Per variant: the state's token accuracy in each window (mean over seeds · seeds holding it), then the last
    window's parity and mod-5 parts, and recall there, each beside its chance floor."""
    runs = _fresh(root)
    if runs is None:
        return "No run of `study/sweeps/fresh.toml` is committed yet."
    rows = [[label, len(r), *[_window_cell(r[f"state_win_{w}"]) for w, _ in WINDOWS],
             _window_cell(r["state_mod2_win_8x_16x"]), _window_cell(r["state_mod5_win_8x_16x"]),
             _window_cell(r["recall_win_8x_16x"])] for label, r in _variants(runs)]
    return table(["preset, precision", "seeds", *[f"state {label}" for _, label in WINDOWS],
                  "parity (8x, 16x] (chance 50)", "mod 5 (8x, 16x] (chance 20)", "recall (8x, 16x] (chance 6.2)"],
                 rows)


def fresh_seeds(root: Path) -> str:
    """Every seed: state in (2x, 4x] and in (8x, 16x], the mod-5 part in (8x, 16x], and whether it meets the
    recipe's target."""
    runs = _fresh(root)
    if runs is None:
        return "No run of `study/sweeps/fresh.toml` is committed yet."
    rows = [[label, " ".join(str(s) for s in r.seed), per_seed(r.state_win_2x_4x), per_seed(r.state_win_8x_16x),
             per_seed(r.state_mod5_win_8x_16x), per_seed(r.state_mod2_win_8x_16x),
             "".join("y" if m is True else "n" if m is False else "?" for m in meets_target(r, TARGET))]
            for label, r in _variants(runs)]
    text = table(["preset, precision", "seeds", "state (2x, 4x], each seed", "state (8x, 16x], each seed",
                  "mod 5 (8x, 16x], each seed", "parity (8x, 16x], each seed", "target met, each seed"], rows)
    failing = runs[runs.state_win_8x_16x < HOLDS]
    if failing.empty:
        return text
    parity, mod5 = failing.state_mod2_win_8x_16x, failing.state_mod5_win_8x_16x
    worst = failing.loc[parity.idxmin()]
    return text + (f"\n\nOf the {len(failing)} runs below {pct(HOLDS)} % in (8x, 16x], {int((parity >= 0.99).sum())} "
                   f"keep parity at 99 % or more and {int((mod5 < 0.95).sum())} have the mod-5 part below "
                   f"{pct(HOLDS)} %; the lowest parity is {pct(worst.state_mod2_win_8x_16x)} % "
                   f"({worst.variant}, seed {worst.seed}). Recall in (8x, 16x] is at least "
                   f"{pct(runs.recall_win_8x_16x.min())} % in every run.")


def fresh_precision(root: Path) -> str:
    """Precision's effect per preset, four pairs decided in advance (a family of 4): the state in (8x, 16x] (Welch
    interval, exact permutation p) and the seeds meeting the recipe's target (Newcombe interval, Fisher's p). A pair
    whose seeds cannot reach adjusted p < 0.05 is descriptive. The design rule is the permutation test's (2 /
    C(n + m, n)), which is Fisher's too at equal seed counts and above it otherwise: conservative."""
    runs = _fresh(root)
    if runs is None:
        return "No run of `study/sweeps/fresh.toml` is committed yet."
    family = len(PRESETS)
    rows, target_rows = [], []
    for stem, name in PRESETS.items():
        a, b = _of(runs, f"{stem}-fp32"), _of(runs, f"{stem}-bf16")
        if a.empty or b.empty:
            continue
        x, y = a.state_win_8x_16x.to_numpy(), b.state_win_8x_16x.to_numpy()
        n, m = len(x), len(y)
        diff = welch_interval(x, y)
        testable = can_reach("seeds", n, m, family)
        p = permutation_p(x, y) if testable else float("nan")
        verdict = "tested" if testable else descriptive("seeds", n, m, family)
        rows.append([name, f"{n} vs {m}", pct(x.mean()), pct(y.mean()),
                     f"{100 * diff.estimate:+.1f} [{100 * diff.low:+.1f}, {100 * diff.high:+.1f}]", p_text(p),
                     min_adjusted_text("seeds", n, m, family), verdict])
        ka, kb = (int(meets_target(r, TARGET).eq(True).sum()) for r in (a, b))
        lo, hi = newcombe_interval(ka, n, kb, m)
        fp = fisher_p(ka, n, kb, m) if testable else float("nan")
        target_rows.append([name, f"{n} vs {m}", f"{ka} of {n}", f"{kb} of {m}",
                            f"{100 * (ka / n - kb / m):+.0f} [{100 * lo:+.0f}, {100 * hi:+.0f}]", p_text(fp),
                            min_adjusted_text("seeds", n, m, family), verdict])
    head = ["preset", "seeds", "fp32", "bf16", "fp32 − bf16 [95 % CI]"]
    return ("State in (8x, 16x] (%), mean over seeds; Welch interval; exact two-sided permutation p:\n\n"
            + table([*head, "p", "min. adj. p", "design"], rows)
            + "\n\nSeeds meeting the recipe's target; Newcombe's interval for the difference of rates (points); "
            "Fisher's exact two-sided p:\n\n"
            + table(["preset", "seeds", "fp32 meets", "bf16 meets", "fp32 − bf16 [95 % CI]", "Fisher p",
                     "min. adj. p", "design"], target_rows))


def fresh_recipe(root: Path) -> str:
    """The recipe re-judged: per 4-block preset, the seeds meeting the target in each precision, against the bar
    (NEEDED of 20 fresh seeds, in both precisions, and above depth-matched DAT)."""
    runs = _fresh(root)
    if runs is None:
        return "No run of `study/sweeps/fresh.toml` is committed yet."
    rows = []
    for stem in ("joint4", "dat4", "joint", "dat"):
        counts = []
        for prec in PRECISIONS:
            r = _of(runs, f"{stem}-{prec}")
            counts.append((int(meets_target(r, TARGET).eq(True).sum()), len(r)))
        k, n = sum(c[0] for c in counts), sum(c[1] for c in counts)
        left = 20 - n
        status = ("meets the bar" if k >= NEEDED else "cannot reach the bar" if k + left < NEEDED
                  else f"open: {NEEDED - k} more needed of {left} seeds to run")
        rows.append([PRESETS[stem], *[f"{c[0]} of {c[1]}" for c in counts], f"{k} of {n}", status])
    return table(["preset", "bf16: seeds meeting the target", "fp32", "both", f"against {NEEDED} of 20"], rows)


def fresh_replay(root: Path) -> str:
    """The joint hybrid's rate of seeds holding (8x, 16x] (state >= 95 %): seeds 0-9 as trained in `long`, seeds 0-4
    retrained beside the fresh grid (`replay`), and the fresh seeds; Fisher's exact two-sided p of long against
    fresh in bf16 (one pre-stated test)."""
    runs = _fresh(root)
    if runs is None:
        return "No run of `study/sweeps/fresh.toml` is committed yet."
    rows = []
    long_path = results_dir(root) / "long" / "runs.jsonl"
    long = _of(grid_of(root, "long").runs, "joint") if long_path.is_file() else pd.DataFrame()
    # long was evaluated at lengths, not windows: a seed holds (8x, 16x] only if its all-position mean at 16x is
    # at least HOLDS x 15/16 + 1/16 (every in-range position right, the 15/16 beyond at least HOLDS): a necessary
    # bound, so this count can only overstate long's rate
    if not long.empty:
        bound = HOLDS * 15 / 16 + 1 / 16
        k_long = int((long.state_acc_16x >= bound).sum())
        rows.append(["`long` (trained earlier, on another CPU)", " ".join(str(s) for s in long.seed), "bf16",
                     f"at most {k_long} of {len(long)}", per_seed(long.state_acc_16x) + " (all positions, 16x)"])
    replay_path = results_dir(root) / "replay" / "runs.jsonl"
    if replay_path.is_file():
        rep = _of(grid_of(root, "replay").runs, "joint-bf16")
        rows.append(["`replay` (the fresh grid's CPU)", " ".join(str(s) for s in rep.seed), "bf16",
                     f"{int((rep.state_win_8x_16x >= HOLDS).sum())} of {len(rep)}", per_seed(rep.state_win_8x_16x)])
    for prec in PRECISIONS:
        r = _of(runs, f"joint-{prec}")
        rows.append([f"`fresh` ({prec})", " ".join(str(s) for s in r.seed), prec,
                     f"{int((r.state_win_8x_16x >= HOLDS).sum())} of {len(r)}", per_seed(r.state_win_8x_16x)])
    text = table(["grid", "seeds", "precision", "seeds holding (8x, 16x]", "state, each seed"], rows)
    fresh = _of(runs, "joint-bf16")
    if not long.empty and not fresh.empty:
        k_f, n_f, n_l = int((fresh.state_win_8x_16x >= HOLDS).sum()), len(fresh), len(long)
        lo, hi = newcombe_interval(k_f, n_f, k_long, n_l)
        test = (f"Fisher p {p_text(fisher_p(k_long, n_l, k_f, n_f))}" if can_reach("seeds", n_f, n_l)
                else descriptive("seeds", n_f, n_l))
        text += (f"\n\nFresh against `long` in bf16 (one test, a family of 1; {n_f} vs {n_l} seeds): "
                 f"{k_f} of {n_f} against at most {k_long} of {n_l}, difference of rates "
                 f"{100 * (k_f / n_f - k_long / n_l):+.0f} points [{100 * lo:+.0f}, {100 * hi:+.0f}], {test}.")
    return text


BLOCKS = {
    "fresh-windows": fresh_windows,
    "fresh-seeds": fresh_seeds,
    "fresh-precision": fresh_precision,
    "fresh-recipe": fresh_recipe,
    "fresh-replay": fresh_replay,
}
