"""When should attention come on? State and recall accuracy at 3x L_train against DAT's switch step.

Usage: ``python study/scripts/switch_timing.py`` after ``python -m probe.sweep study/sweeps/switch.toml --out
runs/switch`` and ``python -m probe.results collect runs/switch study/results/switch``. Switch 0 is the mechanism grid's
`joint` variant and switch 2000 its `dat` variant (identical configs). For every DAT run with a switch, the step at
which its LSTM-only phase's state accuracy at 3x first reached 95 % (the training log, every 250 steps, 128 sequences)
is marked. Reads both grids through ``probe.results`` (run folders or the committed compact form). Writes
``study/results/switch/switch_timing.png`` and ``study/results/switch/switch_timing.json`` and prints the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from probe.results import load_grid

STUDY = Path(__file__).resolve().parent.parent
SOURCES = {0: ("mechanism", "joint"), 2000: ("mechanism", "dat")}


def _lstm_phase_95(training: pd.DataFrame, variant: str, seed: int, until: int | None) -> int | None:
    """The first logged step (every 250) at which the run's state accuracy at 3x reached 95 %, up to ``until``."""
    if training.empty:
        return None
    log = training[(training.variant == variant) & (training.seed == seed) & (training.state_acc_3x >= 0.95)]
    if until is not None:
        log = log[log.step <= until]
    return int(log.step.min()) if len(log) else None


def runs(root: Path = STUDY / "results") -> pd.DataFrame:
    """One row per run: its switch step, state and recall accuracy at 3x, and when its LSTM phase reached 95 %."""
    mechanism, switch = load_grid(root / "mechanism"), load_grid(root / "switch")
    rows = []
    for grid, variants in ((mechanism, {v: s for s, (_, v) in SOURCES.items()}), (switch, None)):
        for r in grid.runs.itertuples():
            if variants is not None and r.variant not in variants:
                continue
            adaptive = r.variant == "adaptive"
            step = variants[r.variant] if variants is not None else int(r.switch_step)
            rows.append({"variant": "adaptive" if adaptive else f"switch-{step}", "switch": step, "seed": r.seed,
                         "state_acc_3x": r.state_acc_3x, "recall_acc_3x": r.recall_acc_3x,
                         "lstm_phase_95_at_3x": _lstm_phase_95(grid.training, r.variant, r.seed,
                                                               None if adaptive else step) if step else None})
    frame = pd.DataFrame(rows)
    order = frame.assign(_a=frame.variant == "adaptive").sort_values(["_a", "switch", "seed"], kind="stable")
    return order.drop(columns="_a").reset_index(drop=True)


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
    out = STUDY / "results" / "switch"
    out.mkdir(parents=True, exist_ok=True)
    records = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
               for r in frame.to_dict("records")]
    (out / "switch_timing.json").write_text(json.dumps(records, separators=(",", ":")) + "\n")
    fig = plot(frame)
    fig.savefig(out / "switch_timing.png", dpi=130)


if __name__ == "__main__":
    main()
