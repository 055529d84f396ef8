"""The blocks of study/docs/transfer.md that quote results/transfer/ (sweeps/transfer.toml: joint, DAT and the block-0
cut on two task variants, pre-registered in claims_transfer.toml): each a function of the committed results only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import tomllib

from probe.core.chance import chance
from probe.tasks import make_task

GRID = "transfer"
WINDOWS = [("in range", "0x_1x"), ("(1x, 2x]", "1x_2x"), ("(2x, 4x]", "2x_4x"), ("(4x, 8x]", "4x_8x"),
           ("(8x, 16x]", "8x_16x")]
TASKS = {"m7": "interleaved, m = 7", "coupled": "coupled, m = 10"}
SCHEDULES = {"joint": "joint", "dat": "DAT", "cut": "block-0 cut (`stopgrad-rnn0`)"}


def _design(root: Path) -> tuple[list[str], list[int]]:
    """The grid's variants and seeds, from its sweep file: a variant with no run yet still gets its row."""
    sweep = tomllib.loads((root / "study" / "sweeps" / f"{GRID}.toml").read_text())
    return [v["name"] for v in sweep["variant"]], list(sweep["seeds"])


def _runs(root: Path) -> pd.DataFrame:
    path = root / "study" / "results" / GRID / "runs.jsonl"
    return pd.read_json(path, lines=True) if path.is_file() else pd.DataFrame(columns=["variant", "seed"])


def _chance(root: Path) -> dict[tuple[str, str], float]:
    """Each task's floors, from the task each variant trains (its sweep entry), by probe's own rule: the runs'
    windows.csv carries the floor of the code that evaluated them, and coupled's was 1/m before it became 1/n_values."""
    sweep = tomllib.loads((root / "study" / "sweeps" / f"{GRID}.toml").read_text())
    out = {}
    for v in sweep["variant"]:
        fields = dict(item.removeprefix("task.").split("=", 1) for item in v.get("set", []) if item.startswith("task."))
        task = make_task(v.get("task", sweep.get("task", "interleaved")), **{k: int(x) for k, x in fields.items()})
        for subtask in ("state", "recall"):
            out[(v["name"].split("-")[0], subtask)] = chance(task, subtask)
    return out


def _seeds(values: pd.Series) -> str:
    return " / ".join(f"{100 * v:.1f}" for v in values) if len(values) else "—"


def transfer_seeds(root: Path) -> str:
    """Per variant, the token accuracy (%) of each committed seed (in seed order) in each window of stream positions,
    the state (coupled: the answer, the value bound to s_t) and recall beyond range, beside their chance floors."""
    variants, seeds = _design(root)
    runs = _runs(root).sort_values("seed") if len(_runs(root)) else _runs(root)
    chance = _chance(root)
    head = ["task", "schedule", "seeds in"] + [f"state {w}" for w, _ in WINDOWS] + [
        "recall (2x, 4x]", "recall (8x, 16x]", "chance: state / recall"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in variants:
        task, schedule = v.split("-", 1)
        r = runs[runs.variant == v] if len(runs) else runs
        cells = [TASKS.get(task, task), SCHEDULES.get(schedule, schedule),
                 ", ".join(str(int(s)) for s in r.seed) if len(r) else "none yet"]
        cells += [_seeds(r[f"state_win_{key}"]) if len(r) else "—" for _, key in WINDOWS]
        cells += [_seeds(r[f"recall_win_{key}"]) if len(r) else "—" for key in ("2x_4x", "8x_16x")]
        floors = [chance.get((task, s)) for s in ("state", "recall")]
        cells.append(" / ".join("—" if f is None else f"{100 * f:.1f}" for f in floors))
        lines.append("| " + " | ".join(cells) + " |")
    done = len(runs)
    lines.append("")
    lines.append(f"{done} of {len(variants) * len(seeds)} runs committed (seeds {seeds[0]}-{seeds[-1]}); values in "
                 "seed order, as listed in the third column. On `coupled` both masks ask every position, so its "
                 "state and recall columns are the same answers.")
    return "\n".join(lines)


BLOCKS = {"transfer-seeds": transfer_seeds}
