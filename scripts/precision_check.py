"""Does bf16 autocast with fused AdamW change what the hybrids learn? Per seed, state and recall token accuracy at
1x-4x of the fp32 runs (``results/evaluate.json``: the reproduction, seeds 0-2, fp32, default AdamW, trained on an
earlier machine's CPU) and of the bf16 runs (``results/mechanism/{joint,dat}/seedS/eval.json``: the mechanism grid,
seeds 0-4, bf16 autocast + fused AdamW, this machine's CPU), and an exact permutation test over seeds on 3x state
accuracy. Unpaired: the same seed on another CPU already follows another trajectory (fp32 alone, the weights differ
after 250 steps), so seed-to-seed pairing carries no information here.

Usage: ``python scripts/precision_check.py`` → prints the table, writes ``results/precision_check.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from probe.sweep.compare import permutation_p

ROOT = Path(__file__).resolve().parent.parent
LENGTHS = (25, 50, 75, 100)


def main() -> None:
    rows = []
    fp32 = pd.DataFrame(json.loads((ROOT / "results" / "evaluate.json").read_text())["results"])
    for label, variant in (("hybrid-joint", "joint"), ("hybrid-dat", "dat")):
        part = fp32[(fp32.label == label) & fp32.length.isin(LENGTHS)]
        for r in part.itertuples():
            if r.subtask in ("state", "recall"):
                rows.append({"variant": variant, "precision": "fp32", "seed": r.seed, "subtask": r.subtask,
                             "length": int(r.length), "token_acc": r.token_acc})
        for ev in sorted((ROOT / "results" / "mechanism" / variant).glob("seed*/eval.json")):
            for r in json.loads(ev.read_text())["results"]:
                if r.get("length") in LENGTHS and r.get("subtask") in ("state", "recall"):
                    rows.append({"variant": variant, "precision": "bf16+fused", "seed": r["seed"],
                                 "subtask": r["subtask"], "length": r["length"], "token_acc": r["token_acc"]})
    frame = pd.DataFrame(rows)
    table = frame.pivot_table(index=["variant", "precision", "seed"], columns=["subtask", "length"],
                              values="token_acc")
    print((100 * table).round(1).to_string())
    tests = []
    for variant in ("joint", "dat"):
        at = frame[(frame.variant == variant) & (frame.subtask == "state") & (frame.length == 75)]
        a = at[at.precision == "bf16+fused"].token_acc.to_numpy()
        b = at[at.precision == "fp32"].token_acc.to_numpy()
        test = {"variant": variant, "n_bf16": len(a), "n_fp32": len(b), "mean_bf16": a.mean(), "mean_fp32": b.mean(),
                "difference": a.mean() - b.mean(), "p_permutation": permutation_p(a, b)}
        tests.append(test)
        print(f"{variant}: state at 3x, bf16+fused {100 * a.mean():.1f} % (n={len(a)}) vs fp32 {100 * b.mean():.1f} % "
              f"(n={len(b)}), difference {100 * test['difference']:+.1f} points, permutation p = "
              f"{test['p_permutation']:.3f}")
    out = {"per_seed": frame.to_dict("records"), "tests": tests}
    (ROOT / "results" / "precision_check.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
