"""When should attention come on? State and recall accuracy at 3x L_train against DAT's switch step.

Usage: ``python scripts/switch_timing.py`` after ``python -m probe.sweep sweeps/switch.toml --out runs/switch`` and
``scripts/collect_runs.sh runs/switch results/switch``. Switch 0 is the mechanism grid's `joint` variant and switch
2000 its `dat` variant (identical configs). For every DAT run with a switch, the step at which its LSTM-only phase's
state accuracy at 3x first reached 95 % (``metrics.jsonl``, every 250 steps, 128 sequences) is marked. Writes
``results/switch/switch_timing.png`` and ``results/switch/switch_timing.json`` and prints the table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {0: ROOT / "results" / "mechanism" / "joint", 2000: ROOT / "results" / "mechanism" / "dat"}


def runs() -> pd.DataFrame:
    folders = dict(SOURCES)
    for d in sorted((ROOT / "results" / "switch").glob("switch-*")):
        folders[int(d.name.split("-")[1])] = d
    rows = []
    for ev in sorted((ROOT / "results" / "switch" / "adaptive").glob("seed*/eval.json")):
        log = [json.loads(line) for line in (ev.parent / "metrics.jsonl").read_text().splitlines() if line]
        switched = next(r["step"] for r in log if r.get("event") == "attention switched on")
        res = {(r["subtask"], r["length"]): r["token_acc"] for r in json.loads(ev.read_text())["results"]
               if r.get("length") == 75}
        rows.append({"variant": "adaptive", "switch": switched, "seed": int(ev.parent.name[4:]),
                     "state_acc_3x": res[("state", 75)], "recall_acc_3x": res[("recall", 75)],
                     "lstm_phase_95_at_3x": next((r["step"] for r in log if r["state_acc_3x"] >= 0.95), None)})
    for switch, folder in sorted(folders.items()):
        for ev in sorted(folder.glob("seed*/eval.json")):
            seed = int(re.search(r"seed(\d+)", ev.parent.name).group(1))
            res = {(r["subtask"], r["length"]): r["token_acc"] for r in json.loads(ev.read_text())["results"]
                   if r.get("length") == 75}
            log = [json.loads(line) for line in (ev.parent / "metrics.jsonl").read_text().splitlines() if line]
            found = next((r["step"] for r in log if r["state_acc_3x"] >= 0.95 and r["step"] <= switch), None)
            rows.append({"variant": f"switch-{switch}", "switch": switch, "seed": seed,
                         "state_acc_3x": res[("state", 75)], "recall_acc_3x": res[("recall", 75)],
                         "lstm_phase_95_at_3x": found if switch else None})
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame):
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    fig, ax = plt.subplots(figsize=(6, 3.4))
    fixed, adaptive = frame[frame.variant != "adaptive"], frame[frame.variant == "adaptive"]
    for col, color, name in (("state_acc_3x", "C0", "state"), ("recall_acc_3x", "C1", "recall")):
        ax.scatter(fixed.switch, fixed[col], color=color, s=18, alpha=0.7, label=f"{name}, each seed")
        ax.scatter(adaptive.switch, adaptive[col], color=color, marker="x", s=30, label=f"{name}, adaptive")
        mean = fixed.groupby("switch")[col].mean()
        ax.plot(mean.index, mean.values, color=color, lw=1.5, label=f"{name}, mean over seeds")
    for step in frame.lstm_phase_95_at_3x.dropna().unique():
        ax.axvline(step, color="0.5", lw=0.6, ls=":")
    ax.set(xlabel="step at which attention comes on (of 4500; 0 = joint)", ylabel="token accuracy at 3x L_train",
           ylim=(-0.02, 1.02), title="DAT switch timing (dotted: LSTM-only phase first ≥ 95 % state at 3x)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def main() -> None:
    frame = runs()
    print(frame.to_string(index=False))
    print(frame.groupby("variant", sort=False)[["state_acc_3x", "recall_acc_3x"]].agg(["mean", "min", "count"])
          .round(3))
    out = ROOT / "results" / "switch"
    out.mkdir(parents=True, exist_ok=True)
    (out / "switch_timing.json").write_text(json.dumps(frame.to_dict("records"), indent=1) + "\n")
    fig = plot(frame)
    fig.savefig(out / "switch_timing.png", dpi=130)


if __name__ == "__main__":
    main()
