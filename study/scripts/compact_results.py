"""Keep study/results/ in proportion: what a reader needs, in compact form; what a command regenerates, left out.

Usage: ``python study/scripts/compact_results.py [--check]`` after an analysis, ``probe.results collect`` or a report
writes into study/results/. A second run changes nothing. With ``--check`` it changes nothing and exits 1, saying
what it would change, or when the folder is over its budget (BUDGET in all, FILE_BUDGET a file).

- An analysis's JSON envelope keeps its metadata and controls; its ``results`` rows become tables (consecutive rows
  with the same keys share one list of columns: ``{"tables": [{"columns": [...], "rows": [[...], ...]}]}``) with
  floats to 6 significant digits; ``doc_format.read_envelope`` gives the rows back as dicts. Envelopes the package
  reads itself (READ_BY_THE_PACKAGE) stay as they are, as does every file under LEFT_AS_WRITTEN.
- Rows the docs do not quote are dropped where PRUNE says so, and why: detail of analyses of the shipped checkpoints
  (``analyze_shipped.sh`` reruns them), and measures of grid runs that no doc reads (the runs' checkpoints are not
  committed: these rows are gone for good). The envelope records it under ``"compacted"``.
- A grid's report (``results.json`` and figures beside ``runs.jsonl``) is deleted: ``python -m probe.sweep DIR
  --report`` makes it again from the compact files in seconds; its table, ``results.md``, stays.
- A grid's compact files (``runs.jsonl``, ``curves.csv``, ``training.csv``, ``windows.csv``) are rewritten as
  ``probe.results`` writes them now (``grid_texts`` of the grid they load as), so a grid collected before the
  compact form last shrank takes the smaller form too, losing nothing the loader gives back.
- Figures (``*.png``) are deleted except those the docs show (KEEP_FIGURES): each is remade by the command that
  wrote it (an analysis's ``--out``, a grid's ``--report``, a study script). So are CSV extracts of an analysis's
  JSON (EXTRACTS), which its ``--out`` writes beside it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_blocks_analyses import PROBE_BUCKETS  # noqa: E402  (beside this file)
from doc_format import rows_of  # noqa: E402

from probe.results import grid_texts, load_grid  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
# 7.5 MiB, from 6: rounding the run summaries and leaving out curves.csv's sum columns freed 0.47 MB (5.98 -> 5.51 MB),
# and the grids still to come need more than the 0.78 MB that left. Written in the smaller form, at the committed
# grids' bytes per run: the SSM grids (71 runs to 16x with the mod-2/5 factors, like recurrent/: ~15 KB a run) ~1.1
# MB, coadaptation2 (64 runs, like fresh/: ~5.2 KB a run) ~0.35 MB, fresh's last 22 runs ~0.1 MB, the real-step
# lookahead's CSVs up to ~0.4 MB (gradients/dense/'s are 0.38 MB): ~7.5 MB in all. coadaptation2_fp32 (16 runs, ~0.09
# MB) was added later and fits in what the SSM grids left (7.41 MB committed when it started). 8 MiB, from 7.5: the
# transfer (48 runs) and bridged (25 runs) grids of the second task and the bridged cells were not in that plan; they
# take 0.41 MB complete (~5.6 KB a run, the fresh/ form), which put the folder at 7.6 MB.
BUDGET, FILE_BUDGET = 8 * 1024 * 1024, 1024 * 1024
DIGITS = 6
READ_BY_THE_PACKAGE = {"gradients/trajectories_shipped.json"}  # scripts/figures.py and notebook 03 read it as written
KEEP_FIGURES = {"mechanism/seeds_3x.png", "switch/switch_timing.png"}  # shown in study/docs/mechanism.md
EXTRACTS = ("shortcuts/*.csv",)  # what python -m probe.shortcuts --out writes beside results.json, from the same rows
LEFT_AS_WRITTEN = ("fresh/*",)  # the fresh-seed confirmation (study/claims.toml) reads its own report and claims


def _probes(r: dict[str, Any]) -> bool:
    if r.get("analysis") != "probe":
        return True
    if r.get("control_target", "permuted") != "permuted":
        return False
    return r["scope"] == "length" or (r["length"] == PROBE_BUCKETS[-1][1]
                                      and (r["position_lo"], r["position_hi"]) in PROBE_BUCKETS)


PRUNE: dict[str, tuple[Callable[[dict[str, Any]], bool], str]] = {
    "probes/results.json": (_probes, "probe rows of the window control targets (their verdicts are in the controls) "
                                     "and position rows other than the buckets of length-100 sequences the docs show"),
    "attributions/final_shipped.json": (
        lambda r: r.get("analysis") != "occlusion" or bool(r.get("in_prefix")),
        "occlusion by distance back (the attribution_distance figure computes it); the near/far and prefix rows stay"),
    "attributions/final_ig_L25_shipped.json": (
        lambda r: r.get("analysis") in ("ig", "ig_far"),
        "the rows that repeat final_shipped.json's analyses at L 25; the integrated-gradients rows stay"),
    # measures of grid runs: the docs quote one part of each; the controls stay whole
    "mechanism/shortcuts/*.json": (
        lambda r: str(r.get("test", "")).split("_pooled")[0] in ("attention_knockout", "sum_preserving"),
        "every test but the knock-out and the sum-preserving perturbation, the two study/docs/mechanism.md quotes"),
    "sharpness/*/results.json": (
        lambda r: r.get("target") != "key",
        "the mass on the queried key (the docs read the value's; the shipped checkpoints' key rows, in "
        "sharpness/results.json, stay)"),
}
REGENERATE = {"probes/results.json": "study/scripts/analyze_shipped.sh probes",
              "attributions/*": "study/scripts/analyze_shipped.sh attributions"}


# --- the compact envelope ------------------------------------------------------------------------------------------
def _round(x: Any) -> Any:
    if isinstance(x, float):
        return x if x == 0 or not math.isfinite(x) else float(f"{x:.{DIGITS}g}")
    if isinstance(x, list):
        return [_round(v) for v in x]
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def tables_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tables: list[dict[str, Any]] = []
    for r in rows:
        columns = list(r)
        if not tables or tables[-1]["columns"] != columns:
            tables.append({"columns": columns, "rows": []})
        tables[-1]["rows"].append([_round(r[c]) for c in columns])
    return {"tables": tables}


def _match(rules: dict[str, Any], name: str) -> Any:
    return next((v for pattern, v in rules.items() if fnmatch.fnmatch(name, pattern)), None)


def compact(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """``obj`` (an envelope, in either form) compacted: its rows as tables, pruned where PRUNE says."""
    rows = rows_of(obj["results"])
    out = dict(obj)
    if rule := _match(PRUNE, name):
        keep, why = rule
        kept = [r for r in rows if keep(r)]
        dropped = len(rows) - len(kept) + obj.get("compacted", {}).get("rows_dropped", 0)
        rows = kept
        out["compacted"] = {"rows_dropped": dropped, "dropped": why,
                            "regenerate": _match(REGENERATE, name) or "no: the runs' checkpoints are not committed"}
    out["results"] = tables_of(rows)
    return out


def _text(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


# --- the folder ----------------------------------------------------------------------------------------------------
def _is_envelope(obj: Any) -> bool:
    return isinstance(obj, dict) and "results" in obj and isinstance(obj["results"], (list, dict))


def plan(root: Path = RESULTS) -> tuple[dict[Path, str | None], list[str]]:
    """What to write (path -> text) or delete (path -> None), and what is over budget after that."""
    changes: dict[Path, str | None] = {}
    grids = {p.parent for p in root.rglob("runs.jsonl")}
    for grid in sorted(grids):
        if any(fnmatch.fnmatch(f"{grid.relative_to(root).as_posix()}/runs.jsonl", pattern)
               for pattern in LEFT_AS_WRITTEN):
            continue
        for name, text in grid_texts(load_grid(grid)).items():
            if (grid / name).is_file() and (grid / name).read_text() != text:
                changes[grid / name] = text
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        name = path.relative_to(root).as_posix()
        if any(fnmatch.fnmatch(name, pattern) for pattern in LEFT_AS_WRITTEN):
            continue
        if (path.suffix == ".png" and name not in KEEP_FIGURES) or any(fnmatch.fnmatch(name, e) for e in EXTRACTS):
            changes[path] = None
        elif path.name == "results.json" and path.parent in grids:
            changes[path] = None
        elif path.suffix == ".json" and name not in READ_BY_THE_PACKAGE:
            obj = json.loads(path.read_text())
            if _is_envelope(obj) and (text := _text(compact(obj, name))) != path.read_text():
                changes[path] = text
    sizes = {p: (len(changes[p].encode()) if p in changes else p.stat().st_size)
             for p in root.rglob("*") if p.is_file() and changes.get(p, "") is not None}
    over = [f"{p.relative_to(root)}: {n / 1024:.0f} KB" for p, n in sizes.items() if n > FILE_BUDGET]
    if sum(sizes.values()) > BUDGET:
        over.append(f"{root.name}/ in all: {sum(sizes.values()) / 2**20:.1f} MB")
    return changes, over


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything would change")
    p.add_argument("--root", type=Path, default=RESULTS, help="the results folder (default: study/results)")
    args = p.parse_args(argv)
    changes, over = plan(args.root)
    for path, text in changes.items():
        what = "delete" if text is None else "compact"
        print(f"{what} {path.relative_to(args.root)}", file=sys.stderr)
        if not args.check:
            path.unlink() if text is None else path.write_text(text)
    for line in over:
        print(f"over budget: {line}", file=sys.stderr)
    return 1 if over or (args.check and changes) else 0


if __name__ == "__main__":
    sys.exit(main())
