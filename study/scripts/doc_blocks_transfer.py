"""The blocks of study/docs/transfer.md that quote results/transfer/ (sweeps/transfer.toml: joint, DAT and the block-0
cut on two task variants, pre-registered in claims_transfer.toml): each a function of the committed results only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import tomllib

from probe.core.chance import chance
from probe.sweep.claims import judge, load_claims
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


def _runs(root: Path, grid: str = GRID) -> pd.DataFrame:
    path = root / "study" / "results" / grid / "runs.jsonl"
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
    runs = _runs(root)
    runs = runs.sort_values("seed") if len(runs) else runs
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


FITS = 0.95
"""A seed fits the training lengths when both subtasks reach this in range (the claims' own threshold for holding)."""
PARTS = {"joint-cliff": "the cliff", "dat-4x": "DAT's fix, (2x, 4x]", "dat-16x": "DAT to (8x, 16x]",
         "dat-beats-joint": "DAT above joint, (2x, 4x]", "cut-holds": "the cause: the block-0 cut holds, (2x, 4x]",
         "cut-beats-joint": "the block-0 cut above joint, (2x, 4x]"}
"""The parts of the mod-10 story, by the stem of their claims in claims_transfer.toml (the id less its task)."""


def _fit(runs: pd.DataFrame, variant: str) -> str:
    """How many of a variant's committed seeds fit the training lengths: a seed that does not leaves the parts that
    look beyond range untested for it."""
    r = runs[runs.variant == variant] if len(runs) else runs
    if not len(r):
        return "—"
    ok = (r.state_win_0x_1x >= FITS) & (r.recall_win_0x_1x >= FITS)
    return f"{int(ok.sum())} of {len(r)}"


def _verdict(row: dict[str, Any]) -> str:
    """The judge's verdict, its first clause and its numbers: the seeds, or the difference with its interval."""
    word = row["verdict"].split(":", 1)[0]
    if row["kind"] == "target":
        if not row["n_seeds"]:
            return f"{word}: no seed yet, {row['seeds_needed']} needed"
        return (f"{word}: {row['seeds_meeting']} of {row['n_seeds']} seeds meet it, {row['seeds_needed']} of "
                f"{len(row['fresh_seeds'].split())} needed; rate {100 * row['seeds_meeting'] / row['n_seeds']:.0f} %, "
                f"95 % CI [{100 * row['rate_ci_low']:.0f}, {100 * row['rate_ci_high']:.0f}]")
    if row["confirmed"] is None:
        return row["verdict"]
    return (f"{word}: {100 * row['difference']:+.1f} points, 95 % CI [{100 * row['difference_ci_low']:+.1f}, "
            f"{100 * row['difference_ci_high']:+.1f}]; one-sided exact p {row['p_permutation']:.2g}, Holm "
            f"{row['p_holm']:.2g} (a Holm family of {row['family']}; {row['n_seeds']} vs {row['n_seeds']} seeds)")


def _judged(root: Path, claims: str, grid: str) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    runs = _runs(root, grid)
    if not len(runs):  # the judge reads the metrics from the runs' columns: none before the first run
        return [], runs
    return judge(load_claims(root / "study" / claims), runs), runs


def transfer_answer(root: Path) -> str:
    """Per task and part of the story, its pre-registered claim as probe's judge reads it on the committed seeds
    (``probe.sweep --confirm``): how many seeds fit the training lengths, how many meet the claim with the rate's
    exact (Clopper-Pearson) 95 % interval, or the comparison's difference with its Welch interval and Holm-adjusted
    exact p, and the verdict."""
    rows, runs = _judged(root, "claims_transfer.toml", GRID)
    if not rows:
        return "No run of the grid is committed yet."
    head = ["task", "part", "claim", "seeds that fit in range", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        task, stem = row["claim"].split("-", 1)
        fit = _fit(runs, row["variant"])
        if row["versus"]:
            fit += f" / {_fit(runs, row['versus'])} (joint)"
        lines.append(f"| {TASKS.get(task, task)} | {PARTS.get(stem, stem)} | `{row['claim']}` | {fit} | "
                     f"{_verdict(row)} |")
    return "\n".join(lines)


READING = [("The cliff", "joint-cliff", "joint seeds fall below 90 % in (2x, 4x]"),
           ("DAT's fix", "dat-4x", "DAT seeds hold both subtasks >= 95 % in (2x, 4x]"),
           ("The cause", "cut-holds", "block-0 cut seeds hold both subtasks >= 95 % in (2x, 4x]")]
"""The three parts of the story, each by its claim's stem and what a seed meeting it does."""


def transfer_reading(root: Path) -> str:
    """One bullet per part of the story: per task, how many seeds fit, how many meet the part's claim, and the
    verdict's word, so that the page's reading is the committed seeds' and moves with them."""
    rows, runs = _judged(root, "claims_transfer.toml", GRID)
    if not rows:
        return "No run of the grid is committed yet."
    by_id = {row["claim"]: row for row in rows}
    out = []
    for title, stem, meets in READING:
        parts = []
        for task, name in TASKS.items():
            row = by_id.get(f"{task}-{stem}")
            if row is None or not row["n_seeds"]:
                parts.append(f"{name}: no seed yet")
                continue
            parts.append(f"{name}: {row['seeds_meeting']} of {row['n_seeds']} {meets} ({_fit(runs, row['variant'])} "
                         f"fit in range), {row['verdict'].split(':', 1)[0]}")
        out.append(f"- **{title}.** " + "; ".join(parts) + ".")
    return "\n".join(out)


BRIDGED = "bridged"
CELLS = {"lstm-joint": ("an `nn.LSTM` in Nemotron-H's layout, joint", "LSTM"),
         "lstm-dat": ("an `nn.LSTM` in Nemotron-H's layout, DAT", "LSTM"),
         "nemotron-h-joint": ("Nemotron-H, joint", "Mamba-2"), "mamba2-alone": ("Mamba-2 alone", "Mamba-2"),
         "qwen3-next-joint": ("Qwen3-Next, joint", "gated DeltaNet"), "bamba-joint": ("Bamba, joint", "Mamba-2"),
         "jamba-joint": ("Jamba, joint", "Mamba-1")}
"""The bridged grid's variants (sweeps/bridged.toml) as the page names them, with their recurrence."""


def _transitions(root: Path) -> pd.DataFrame:
    """The bridged grid's transitions.csv (study/scripts/bridged_transitions.py): a row per run and recurrent layer
    (and ``all``); empty before any run is read."""
    path = root / "study" / "results" / BRIDGED / "transitions.csv"
    return pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=["variant", "seed", "layer", "note"])


def _diagnostic(root: Path) -> dict[tuple[str, int], str]:
    """Each trained model's "can this recurrence count?" over all its recurrent layers, from transitions.csv
    (study/scripts/bridged_transitions.py): "cannot" or "can", or the reason there is no reading."""
    table = _transitions(root)
    out = {}
    for (variant, seed), g in table.groupby(["variant", "seed"]):
        notes = g.note.dropna()
        notes = notes[notes != ""]
        if len(notes):
            out[(variant, int(seed))] = "no linear transition"
            continue
        every = g[g.layer == "all"] if (g.layer == "all").any() else g
        out[(variant, int(seed))] = "can" if every.can_count.astype(str).str.lower().eq("true").any() else "cannot"
    return out


def _readings(values: list[str]) -> str:
    """Per seed, in seed order, as the other columns are; one reading shared by every seed is said once."""
    if len(values) > 1 and len(set(values)) == 1:
        return f"{values[0]} (all {len(values)})"
    return " / ".join(values)


def bridged_answer(root: Path) -> str:
    """Per bridged cell: its committed seeds, the state in range and beyond (with its parity beyond, the factor the
    theory says a positive-eigenvalue recurrence cannot keep), each trained model's own diagnostic, and the claim's
    verdict as probe's judge reads it."""
    rows, runs = _judged(root, "claims_bridged.toml", BRIDGED)
    sweep = tomllib.loads((root / "study" / "sweeps" / f"{BRIDGED}.toml").read_text())
    diagnostic = _diagnostic(root)
    head = ["cell", "recurrence", "seeds in", "state in range", "state (2x, 4x]", "parity (2x, 4x]",
            "state (8x, 16x]", "recall in range", "trained model's diagnostic"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in (v["name"] for v in sweep["variant"]):
        r = runs[runs.variant == v].sort_values("seed") if len(runs) else runs
        name, cell = CELLS.get(v, (v, "?"))
        cells = [name, cell, ", ".join(str(int(s)) for s in r.seed) if len(r) else "none yet"]
        for col in ("state_win_0x_1x", "state_win_2x_4x", "state_mod2_win_2x_4x", "state_win_8x_16x",
                    "recall_win_0x_1x"):
            cells.append(_seeds(r[col]) if len(r) and col in r else "—")
        cells.append(_readings([diagnostic.get((v, int(s)), "not read") for s in r.seed]) if len(r) else "—")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Token accuracy (%) per seed, in seed order; chance: state 10, parity 50, recall 6.2. Claims "
              "(claims_bridged.toml) as judged on these seeds:", ""]
    lines += [f"- `{row['claim']}`: {_verdict(row)}" for row in rows] or ["- no run committed yet"]
    return "\n".join(lines)


def _span(values: pd.Series) -> str:
    return f"{100 * values.min():.1f}-{100 * values.max():.1f} %" if len(values) else "—"


def bridged_reading(root: Path) -> str:
    """The bridged recurrences (every cell but the LSTM layouts) read together: how many seeds fit the state in range,
    where they sit beyond it against chance, and what each trained model's own diagnostic and its checks say."""
    runs = _runs(root, BRIDGED)
    native = runs[~runs.variant.str.startswith("lstm-")] if len(runs) else runs
    if not len(native):
        return "- no run of a bridged recurrence committed yet"
    cells = [CELLS.get(v, (v, "?"))[0].removesuffix(", joint") for v in dict.fromkeys(native.variant)]
    fits = int((native.state_win_0x_1x >= FITS).sum())
    lines = [f"- **Fit.** {fits} of {len(native)} seeds ({', '.join(cells)}) reach {100 * FITS:.0f} % on the state in "
             f"range: {_span(native.state_win_0x_1x)}.",
             f"- **Beyond range.** State in (2x, 4x] {_span(native.state_win_2x_4x)} (chance 10 %), its parity "
             f"{_span(native.state_mod2_win_2x_4x)} (chance 50 %); state in (8x, 16x] "
             f"{_span(native.state_win_8x_16x)}."]
    recall = native.recall_win_0x_1x
    lines.append(f"- **Recall in range** (a lookup, no counting): {int((recall >= FITS).sum())} of {len(native)} seeds "
                 f"reach {100 * FITS:.0f} %; the rest {_span(recall[recall < FITS])} (chance 6.2 %).")
    diagnostic = _diagnostic(root)  # the bridged table's own reading of each model, so the two cannot disagree
    seeds = list(zip(native.variant, native.seed.astype(int), strict=True))
    cannot = sum(diagnostic.get(key) == "cannot" for key in seeds)
    table = _transitions(root)
    read = table[table.layer == "all"].merge(native[["variant", "seed"]], on=["variant", "seed"])
    checks = read.reindex(columns=["state_reproduction", "negated", "longer_sequences"])
    passed = int(checks.apply(lambda row: all(str(v).lower() == "true" for v in row.dropna()), axis=1).sum())
    lines.append(f"- **The trained models' diagnostic.** \"cannot\" in {cannot} of {len(native)} seeds "
                 f"({len(native) - len(read)} not read); its checks pass in {passed} of {len(read)} read.")
    return "\n".join(lines)


SHORT = {"joint-cliff": "cliff", "dat-4x": "DAT's fix", "cut-holds": "block-0 cut holds"}
"""The three parts of the story as the README's line names them, by their claims' stems."""


def readme_line(root: Path) -> str | None:
    """The README's findings line on the transfer page: per task, the seeds meeting each part's pre-registered claim
    (and how many fit in range where not all do); per bridged cell kind, how many seeds fit in range. None before any
    run of the task grid is committed."""
    rows, runs = _judged(root, "claims_transfer.toml", GRID)
    if not rows:
        return None
    by_id = {row["claim"]: row for row in rows}
    tasks = []
    for task in TASKS:
        parts = []
        for stem, word in SHORT.items():
            row = by_id.get(f"{task}-{stem}")
            if row is None or not row["n_seeds"]:
                continue
            fit = _fit(runs, row["variant"])
            unfit = "" if fit.split(" of ")[0] == fit.split(" of ")[1] else f" ({fit.split(' of ')[0]} fit)"
            parts.append(f"{word} {row['seeds_meeting']} of {row['n_seeds']}{unfit}")
        if parts:
            tasks.append(f"{'m = 7' if task == 'm7' else task}: " + ", ".join(parts))
    text = ("**Other tasks** ([transfer](study/docs/transfer.md), fresh seeds, claims filed first), seeds meeting "
            "each part: " + "; ".join(tasks))
    bridged = _runs(root, BRIDGED)
    native = bridged[~bridged.variant.str.startswith("lstm-")] if len(bridged) else bridged
    if len(native):  # a seed below FITS in range leaves "fits, then falls" untested for it
        fits = int((native.state_win_0x_1x >= FITS).sum())
        text += f"; bridged Mamba / DeltaNet cells: {fits} of {len(native)} seeds fit in range"
    return text + "."


BLOCKS = {"transfer-seeds": transfer_seeds, "transfer-answer": transfer_answer, "transfer-reading": transfer_reading,
          "bridged-answer": bridged_answer, "bridged-reading": bridged_reading}
