"""Does bf16 autocast with fused AdamW change what the hybrids learn? A paired check over seeds, on one CPU.

For ``hybrid-joint`` and ``hybrid-dat``, seeds 0-4, both trained on this machine's CPU from the same seed (same
initial weights, same batches, same evaluation sequences):

- fp32 with default AdamW: the ``joint-fp32``/``dat-fp32`` runs of ``results/precision/`` (``sweeps/precision.toml``);
- bf16 autocast with fused AdamW: the ``joint``/``dat`` runs of ``results/mechanism/`` (``sweeps/mechanism.toml``).

Both grids are read through ``probe.results`` (run folders or the committed compact form). Prints state and recall
token accuracy at 1x-4x per seed and pair, and a paired test over seeds of the 3x state accuracy: the exact
sign-flip test of the mean difference over all 2^n sign patterns (``probe.core.stats.sign_flip_p``; with 5 pairs
the smallest two-sided p is 2/32 = 0.0625, so "no difference detected" is all five seeds can say, never "equal")
and the paired t interval of the difference. Also the Spearman correlation of the pairs: whether a seed that does
well in one precision does well in the other.

Usage: ``python study/scripts/precision_check.py`` → prints the tables, writes ``study/results/precision_check.json``
and ``study/results/precision/precision_3x.png``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from probe.core.stats import describe_difference, paired_interval, sign_flip_p, sign_flip_p_min
from probe.results import load_grid

STUDY = Path(__file__).resolve().parent.parent
LENGTHS = (25, 50, 75, 100)
SOURCES = {"fp32": ("precision", "{v}-fp32"), "bf16+fused": ("mechanism", "{v}")}
VARIANTS = {"joint": "hybrid-joint", "dat": "hybrid-dat"}


def load_rows(root: Path = STUDY / "results") -> pd.DataFrame:
    rows = []
    grids = {name: load_grid(root / name) for name in {grid for grid, _ in SOURCES.values()}}
    for variant in VARIANTS:
        for precision, (grid, pattern) in SOURCES.items():
            c = grids[grid].curves
            part = c[(c.variant == pattern.format(v=variant)) & c.length.isin(LENGTHS)
                     & c.subtask.isin(["state", "recall"])]
            rows += [{"variant": variant, "precision": precision, "seed": int(r.seed), "subtask": r.subtask,
                      "length": int(r.length), "token_acc": r.token_acc} for r in part.itertuples()]
    if not rows:
        raise SystemExit("no runs in study/results/precision or study/results/mechanism: run the two sweeps first")
    return pd.DataFrame(rows)


def paired_test(fp32: np.ndarray, bf16: np.ndarray) -> dict:
    """Exact sign-flip test of mean(bf16 - fp32) over seeds, the paired t interval, and the pairs' rank
    correlation."""
    diff = bf16 - fp32
    ci = paired_interval(bf16, fp32)
    p = sign_flip_p(diff)
    rho = stats.spearmanr(fp32, bf16).statistic if len(diff) > 2 else float("nan")
    return {"n_pairs": len(diff), "mean_fp32": fp32.mean(), "mean_bf16": bf16.mean(), "mean_difference": diff.mean(),
            "difference_ci95_t": [float(ci.low), float(ci.high)],
            "differences": diff.tolist(), "p_paired_permutation": float(p),
            "smallest_attainable_p": sign_flip_p_min(len(diff)), "spearman_pairs": float(rho),
            "verdict": describe_difference(ci, p)}


def plot(pairs: pd.DataFrame, out: Path) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(7, 3.4))  # own y scales: DAT lives within 2 points
    for ax, variant in zip(axes, VARIANTS, strict=True):
        part = pairs[pairs.variant == variant]
        for r in part.itertuples():
            ax.plot([0, 1], [100 * r.fp32, 100 * r.bf16], "-o", color="0.35", ms=4)
            ax.annotate(f"s{r.seed}", (1.04, 100 * r.bf16), fontsize=7, va="center")
        ax.set_xticks([0, 1], ["fp32\ndefault AdamW", "bf16 autocast\nfused AdamW"])
        ax.set_xlim(-0.3, 1.35)
        ax.set_title(f"{VARIANTS[variant]} (n = {len(part)} seeds)", fontsize=9)
    axes[0].set_ylabel("state token accuracy at 3x L_train (%)")
    fig.suptitle("Same seed, same CPU, two precisions: 3x state accuracy per seed", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)


def main() -> None:
    frame = load_rows()
    table = frame.pivot_table(index=["variant", "seed", "precision"], columns=["subtask", "length"],
                              values="token_acc")
    print((100 * table).round(1).to_string())
    at3 = frame[(frame.subtask == "state") & (frame.length == 75)]
    pairs = at3.pivot_table(index=["variant", "seed"], columns="precision", values="token_acc").dropna().reset_index()
    pairs.columns = [{"bf16+fused": "bf16"}.get(c, c) for c in pairs.columns]
    tests = []
    for variant in VARIANTS:
        part = pairs[pairs.variant == variant]
        if len(part) < 2:
            print(f"{variant}: fewer than 2 seeds with both precisions; no test")
            continue
        test = {"variant": variant, "seeds": part.seed.tolist(),
                **paired_test(part.fp32.to_numpy(), part.bf16.to_numpy())}
        tests.append(test)
        print(f"{variant}: 3x state, fp32 {100 * test['mean_fp32']:.1f} % vs bf16+fused "
              f"{100 * test['mean_bf16']:.1f} % over seeds {test['seeds']}; mean paired difference "
              f"{100 * test['mean_difference']:+.1f} points [95 % t interval "
              f"{100 * test['difference_ci95_t'][0]:+.1f}, {100 * test['difference_ci95_t'][1]:+.1f}] "
              f"(per seed {', '.join(f'{100 * d:+.1f}' for d in test['differences'])}); exact paired permutation "
              f"p = {test['p_paired_permutation']:.3f} (smallest attainable {test['smallest_attainable_p']:.4f}); "
              f"Spearman of the pairs {test['spearman_pairs']:+.2f}; {test['verdict']}")
    plot(pairs, STUDY / "results" / "precision" / "precision_3x.png")
    out = {"fp32": "study/results/precision, variants {joint,dat}-fp32 (study/sweeps/precision.toml)",
           "bf16+fused": "study/results/mechanism, variants {joint,dat} (study/sweeps/mechanism.toml)",
           "tests": tests}  # the per-seed values are in the grids' runs.jsonl
    (STUDY / "results" / "precision_check.json").write_text(
        json.dumps(out, separators=(",", ":"), default=float) + "\n")


if __name__ == "__main__":
    main()
