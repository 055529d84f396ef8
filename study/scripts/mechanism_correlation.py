"""Over the joint seeds of the mechanism grid: does early training's attention path predict the final cliff?

Usage: ``python study/scripts/mechanism_correlation.py``, after, for each seed S, ``python -m probe.gradients
runs/mechanism/joint/seedS/trajectory/step_000{250,500,750,1000}.pt --json``
``> study/results/gradients/mechanism_joint_seedS.json`` (full trajectories work too).
For each seed: the mean over steps 250-1000 of the attention path's
share of the LSTM weights' gradient (‖g_att‖ / ‖g‖, all blocks, L_train) and of the lookahead's z for a step along
-g_att on the 3x state loss, against the final state accuracy at 3x L_train (the mechanism grid, read through
``probe.results``: run folders or the committed compact form). Spearman's rank
correlation with an exact permutation p over seeds; with n = 5 seeds no claim beyond its sign is made.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import permutation_test, spearmanr

from probe.results import load_grid

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_format import read_envelope  # noqa: E402  (beside this file)

STUDY = Path(__file__).resolve().parent.parent
EARLY = (250, 500, 750, 1000)


def per_seed() -> pd.DataFrame:
    rows = []
    finals = load_grid(STUDY / "results" / "mechanism").runs.set_index("run")
    for path in sorted((STUDY / "results" / "gradients").glob("mechanism_joint_seed*.json")):
        seed = int(path.stem.rsplit("seed", 1)[1])
        frame = pd.DataFrame(read_envelope(path)["results"])
        early = frame[frame.step.isin(EARLY)]
        share = early[(early.analysis == "interference") & (early.block.astype(str) == "all") & (early.length == 25)]
        verdict = early[early.analysis == "lookahead_verdict"]
        if f"joint/seed{seed}" not in finals.index or share.empty:
            continue
        acc = finals.loc[f"joint/seed{seed}", "state_acc_3x"]
        rows.append({"seed": seed, "att_share_early": share.att_ratio.mean(),
                     "z_state_3x_att_early": verdict.z_state_3x_att.mean() if len(verdict) else np.nan,
                     "state_acc_3x": acc, "snapshots": int(share.step.nunique())})
    return pd.DataFrame(rows)


def rank_correlation(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Spearman's rho with an exact two-sided permutation p over all pairings (n! of them). A bootstrap CI is not
    reported: with n = 4-5 seeds most resamples repeat a seed, ties make rho undefined, and the interval degenerates;
    the exact p and the smallest p n allows say what such an n can support."""
    res = permutation_test((x, y), lambda a, b: spearmanr(a, b).statistic, permutation_type="pairings",
                           n_resamples=np.inf, alternative="two-sided")
    return {"n": len(x), "spearman": float(res.statistic), "p_permutation": float(res.pvalue),
            "p_min_attainable": 2 / math.factorial(len(x))}


def main() -> None:
    seeds = per_seed()
    print(seeds.to_string(index=False))
    out = {"per_seed": seeds.to_dict("records"), "correlations": []}
    for col in ("att_share_early", "z_state_3x_att_early"):
        ok = seeds[[col, "state_acc_3x"]].dropna()
        if len(ok) >= 3:
            row = {"quantity": col, **rank_correlation(ok[col].to_numpy(), ok.state_acc_3x.to_numpy())}
            out["correlations"].append(row)
            print(f"{col} vs state_acc_3x: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                                            for k, v in row.items() if k != "quantity"))
    text = json.dumps(out, separators=(",", ":"), default=float)
    (STUDY / "results" / "mechanism" / "correlation.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
