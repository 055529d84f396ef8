"""Does bf16 autocast with fused AdamW change what the hybrids learn? A paired check over seeds, on one CPU.

For ``hybrid-joint`` and ``hybrid-dat``, seeds 0-4, both trained on this machine's CPU from the same seed (same
initial weights, same batches, same evaluation sequences):

- fp32 with default AdamW: ``results/precision/{joint,dat}-fp32/seedS/eval.json`` (``sweeps/precision.toml``);
- bf16 autocast with fused AdamW: ``results/mechanism/{joint,dat}/seedS/eval.json`` (``sweeps/mechanism.toml``).

Prints state and recall token accuracy at 1x-4x per seed and pair, and a paired test over seeds of the 3x state
accuracy: the exact sign-flip permutation test of the mean difference (``scipy.stats.permutation_test`` with
``permutation_type="samples"``, which enumerates all 2^n sign patterns when n is small; with 5 pairs the smallest
two-sided p is 2/32 = 0.0625, so "no detectable difference" is all five seeds can say, never "equal"). Also the
Spearman correlation of the pairs: whether a seed that does well in one precision does well in the other.

Usage: ``python scripts/precision_check.py`` → prints the tables, writes ``results/precision_check.json`` and
``results/precision/precision_3x.png``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
LENGTHS = (25, 50, 75, 100)
SOURCES = {"fp32": ("precision", "{v}-fp32"), "bf16+fused": ("mechanism", "{v}")}
VARIANTS = {"joint": "hybrid-joint", "dat": "hybrid-dat"}


def load_rows() -> pd.DataFrame:
    rows = []
    for variant in VARIANTS:
        for precision, (grid, pattern) in SOURCES.items():
            for ev in sorted((ROOT / "results" / grid / pattern.format(v=variant)).glob("seed*/eval.json")):
                for r in json.loads(ev.read_text())["results"]:
                    if r.get("length") in LENGTHS and r.get("subtask") in ("state", "recall"):
                        rows.append({"variant": variant, "precision": precision, "seed": r["seed"],
                                     "subtask": r["subtask"], "length": r["length"], "token_acc": r["token_acc"]})
    if not rows:
        raise SystemExit("no eval.json under results/precision or results/mechanism: run the two sweeps first")
    return pd.DataFrame(rows)


def paired_test(fp32: np.ndarray, bf16: np.ndarray) -> dict:
    """Exact sign-flip permutation test of mean(bf16 - fp32) over seeds, and the pairs' rank correlation."""
    diff = bf16 - fp32
    res = stats.permutation_test((bf16, fp32), lambda a, b, axis: np.mean(a - b, axis=axis),
                                 permutation_type="samples", alternative="two-sided", n_resamples=100_000)
    rho = stats.spearmanr(fp32, bf16).statistic if len(diff) > 2 else float("nan")
    # how large a systematic shift the pairs leave room for: the paired t interval of the mean difference
    ci = stats.ttest_rel(bf16, fp32).confidence_interval(0.95)
    return {"n_pairs": len(diff), "mean_fp32": fp32.mean(), "mean_bf16": bf16.mean(), "mean_difference": diff.mean(),
            "difference_ci95_t": [float(ci.low), float(ci.high)],
            "differences": diff.tolist(), "p_paired_permutation": float(res.pvalue),
            "smallest_attainable_p": 2 / 2 ** len(diff), "spearman_pairs": float(rho)}


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
              f"Spearman of the pairs {test['spearman_pairs']:+.2f}")
    plot(pairs, ROOT / "results" / "precision" / "precision_3x.png")
    out = {"fp32": "results/precision/{joint,dat}-fp32 (sweeps/precision.toml)",
           "bf16+fused": "results/mechanism/{joint,dat} (sweeps/mechanism.toml)",
           "per_seed": frame.to_dict("records"), "tests": tests}
    (ROOT / "results" / "precision_check.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
