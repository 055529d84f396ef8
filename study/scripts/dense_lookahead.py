"""The beyond-range lookahead (``probe.gradients``) over the early window of several runs, into small CSVs.

Usage: ``python study/scripts/dense_lookahead.py DENSE_DIR/joint-seed5 ... [--steps 0 50 ... 500] [--work DIR] [--out
study/results/gradients/dense] [--processes N]``. Each argument is a trajectory folder written by ``python -m
probe.retrain RUN --until 500 --steps $(seq 0 25 500) --out DENSE_DIR`` (the first 500 steps of a grid's run, a snapshot
every 25 steps, checked bit for bit against the run's own snapshots). For each snapshot at ``--steps`` it runs the
lookahead at its defaults (``probe.gradients.analysis.analyze_checkpoint``: 24 direction batches, 8 evaluation batches
per target, step scales 0, 0.01, 0.1, 0.3 and 1 x the optimizer's next update) and keeps every row in
``--work/<run>/step_XXXXXX.json`` (a rerun skips those: about 2 min of one core each). After each snapshot it rewrites,
in ``--out``:

- ``lookahead.csv``: the lookahead rows (one per run, step, direction, target and step scale), floats to 4
  significant digits;
- ``verdicts.csv``: one verdict row per snapshot (``probe.gradients``' rule at ``step_scale`` 1, a step as long as
  the real update);
- ``checks.csv``: every instrument check and control, per snapshot: its value, threshold and whether it passed.

The grid's accuracies are not copied here: ``doc_blocks.py`` joins them from ``study/results/mechanism`` by variant
and seed. The question this answers (fixed before the runs): does the lookahead order the joint runs by the
depth of their cliff? Its statistic per run is the mean, over the snapshots at steps 50-500, of attention's part's
beyond-range effect per unit of step (``part`` att, ``positions`` >L, ``step_scale`` 1: as long as the real update),
and its paired difference from the rest's (``vs_rec``); the cliff's depth is the run's state accuracy at 3x; the test is
Spearman's rank correlation over the joint runs.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from probe.checkpoint import load_checkpoint
from probe.core import interrupts
from probe.core.files import write_text_atomically
from probe.core.progress import progress_iter
from probe.errors import ProbeError
from probe.gradients.analysis import analyze_checkpoint, builtin_controls

STUDY = Path(__file__).resolve().parent.parent
STEPS = list(range(0, 501, 50))
LOOKAHEAD_COLUMNS = ["variant", "schedule", "seed", "step", "part", "loss", "positions", "step_scale", "effect",
                     "effect_se", "z", "vs_random", "vs_random_z", "vs_rec", "vs_rec_z", "rel_update", "update_source",
                     "direction_norm", "loss_before"]
VERDICT_COLUMNS = ["variant", "schedule", "seed", "step", "gate", "verdict", "baseline", "baseline_train",
                   "effect_beyond_L_att", "z_beyond_L_att", "z_beyond_2L_att", "effect_train_att", "z_train_att",
                   "z_vs_random_beyond_L", "z_att_vs_rec_beyond_L"]


def round4(df: pd.DataFrame) -> pd.DataFrame:
    """Floats to 4 significant digits: the committed CSVs stay small, and no reading here needs more."""
    out = df.copy()
    for col in out.columns:
        if pd.api.types.is_float_dtype(out[col]):
            out[col] = out[col].map(lambda x: float(f"{x:.4g}") if pd.notna(x) else x)
    return out


def cached(cache: Path, compute: Callable[[], dict]) -> dict:
    """``compute()``'s JSON object, written once to ``cache`` and read back from it on every later call."""
    if not cache.is_file():
        obj = compute()
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(cache, json.dumps(obj, default=str))  # a killed run leaves no half-written cache
    return json.loads(cache.read_text())  # the same object a rerun reads


def measure(snapshot: Path, cache: Path, **kwargs: Any) -> dict:
    """The lookahead's rows and checks for one snapshot (``analyze_checkpoint``'s defaults unless ``kwargs`` say
    otherwise), from ``cache`` when it is there."""
    def compute() -> dict:
        report = analyze_checkpoint(load_checkpoint(snapshot), **kwargs)
        return {"results": report.rows(), "controls": report.controls}
    return cached(cache, compute)


def measure_builtin(cache: Path) -> dict:
    """The checks on hand-built models whose answer is known (``known_split``), once for the whole run."""
    return cached(cache, lambda: {"results": [], "controls": builtin_controls()})


def collect(objs: list[dict], out: Path) -> None:
    rows = pd.DataFrame([r for o in objs for r in o["results"]])
    # the grid's variant, from the folder probe.retrain names <variant>-seed<k> (the checkpoint itself
    # records only its schedule's kind: stopgrad-rnn's is "stopgrad")
    rows["variant"] = rows.run.map(lambda run: Path(str(run)).name.rsplit("-seed", 1)[0])
    la = rows[rows.analysis == "lookahead"].reindex(columns=LOOKAHEAD_COLUMNS)
    verdicts = rows[rows.analysis == "lookahead_verdict"].reindex(columns=VERDICT_COLUMNS)
    meta = rows[rows.analysis == "lookahead_verdict"][["checkpoint", "variant", "schedule", "seed", "step"]]
    checks = pd.DataFrame([c for o in objs for c in o["controls"]])
    checks = checks.merge(meta, on="checkpoint", how="left").reindex(
        columns=["variant", "schedule", "seed", "step", "control", "kind", "value", "threshold", "passed"])
    out.mkdir(parents=True, exist_ok=True)
    key = ["variant", "seed", "step"]
    for df in (la, verdicts, checks):
        df[["seed", "step"]] = df[["seed", "step"]].astype("Int64")  # the run-wide checks have none
    write_csv(round4(la).sort_values(key + ["step_scale", "loss", "positions", "part"]), out / "lookahead.csv")
    write_csv(round4(verdicts).sort_values(key), out / "verdicts.csv")
    write_csv(round4(checks).sort_values(key + ["control"], na_position="first"), out / "checks.csv")


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """``df.to_csv(path, index=False)``, whole or not at all: the scripts rewrite their CSVs after every snapshot, and
    a kill mid-write must leave the previous ones."""
    write_text_atomically(path, df.to_csv(index=False))


def snapshot_jobs(roots: list[Path], steps: list[int], snapshot: Callable[[Path, int], Path],
                  cache: Callable[[Path, int], Path], hint: str) -> list[tuple[Path, Path]]:
    """``(snapshot, cache)`` for every root and step, coarse to fine (every other step first), each step across all
    roots: a run cut short still covers every root over the whole window, at half the resolution. A missing snapshot
    is a ProbeError before any work, ending with ``hint`` (how to write it)."""
    steps = sorted(set(steps))
    jobs: dict[Path, Path] = {}  # cache -> snapshot: a root named twice is measured once
    for step in steps[::2] + steps[1::2]:
        for root in roots:
            snap = snapshot(root, step)
            if not snap.is_file():
                raise ProbeError(f"{snap}: no snapshot at step {step}; {hint}")
            c = cache(root, step)
            if c in jobs and jobs[c].resolve() != snap.resolve():
                raise ProbeError(f"{jobs[c]} and {snap} would share the cache {c}: give runs with distinct folder "
                                 "names, or measure them with separate --work folders")
            jobs.setdefault(c, snap)
    return [(snap, c) for c, snap in jobs.items()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="trajectory folders (step_XXXXXX.pt)")
    p.add_argument("--steps", nargs="+", type=int, default=STEPS)
    p.add_argument("--work", type=Path, default=Path("runs/dense-lookahead"), help="per-snapshot cache")
    p.add_argument("--out", type=Path, default=STUDY / "results" / "gradients" / "dense")
    p.add_argument("--processes", type=int, default=1, help="snapshots measured at a time, one thread each")
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error(f"--processes must be at least 1, got {args.processes}")
    torch.set_num_threads(1)
    return measure_snapshots(
        lambda: snapshot_jobs(args.folders, args.steps, lambda f, step: f / f"step_{step:06d}.pt",
                              lambda f, step: args.work / f.name / f"step_{step:06d}.json",
                              "write the folder with python -m probe.retrain --steps covering it"),
        measure, collect, args.out, first=lambda: [measure_builtin(args.work / "builtin.json")],
        processes=args.processes)


def _worker() -> None:
    """A pool worker: one thread; Ctrl-C left to the main process, which ends the pool (a worker that caught it would
    go on to its next snapshot), and SIGTERM, the main process's way to end it, at its default (a fork inherits the
    main process's handler)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.set_num_threads(1)


def measure_snapshots(jobs: Callable[[], list[tuple[Path, Path]]], measure_one: Callable[[Path, Path], dict],
                      collect_all: Callable[[list[dict], Path], None], out: Path,
                      first: Callable[[], list[dict]] = list, processes: int = 1) -> int:
    """The scripts' main loop: every ``(snapshot, cache)`` of ``jobs()`` measured, and the CSVs in ``out`` rewritten
    after each, so a run cut short leaves every finished snapshot collected. With ``processes`` > 1 the snapshots are
    measured that many at a time, one thread each (``measure_one`` must then pickle: a module-level function or a
    ``functools.partial`` of one), and this process alone writes ``out``, as each finishes: two scripts started on
    one ``out`` would overwrite each other's CSVs. Bad input: one line, 2. SIGINT or SIGTERM (even where the shell
    started the script with SIGINT ignored, as it does a background job) stops it at once: one line, 130."""
    objs: list[dict] = []
    try:
        with interrupts.handling():
            _measure_all(jobs, measure_one, collect_all, out, first, processes, objs)
    except ProbeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except interrupts.Interrupted:
        print(f"interrupted: {len(objs)} snapshots collected into {out}; each one finished is in its cache, and a "
              "rerun goes on from there", file=sys.stderr)
        return 130
    failed = pd.read_csv(out / "checks.csv").query("passed == False")
    print(f"{len(objs)} snapshots into {out}; checks failed: {len(failed)}", file=sys.stderr)
    return 0


def _measure_all(jobs: Callable[[], list[tuple[Path, Path]]], measure_one: Callable[[Path, Path], dict],
                 collect_all: Callable[[list[dict], Path], None], out: Path, first: Callable[[], list[dict]],
                 processes: int, objs: list[dict]) -> None:
    """measure_snapshots' loop, appending to ``objs`` as each snapshot is collected."""
    pending = jobs()
    objs.extend(first())
    if processes <= 1:
        for snap, cache in progress_iter(pending, "snapshots", True):
            objs.append(measure_one(snap, cache))
            collect_all(objs, out)
    else:
        # concurrent.futures, not multiprocessing.Pool: a worker that dies (killed for memory) breaks the pool
        # with an error here, where Pool's imap waits for it forever
        pool = ProcessPoolExecutor(processes, initializer=_worker)
        try:
            futures = [pool.submit(measure_one, snap, cache) for snap, cache in pending]
            for done in progress_iter(as_completed(futures), "snapshots", True, total=len(futures)):
                objs.append(done.result())
                collect_all(objs, out)
        except BaseException:
            # Ctrl-C or a worker's error: end the workers now rather than after the snapshots they hold (and the
            # one queued next); what they finished is in its cache (``cached`` writes it whole). The executor has
            # no public way to stop a running worker, hence its private process table.
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


if __name__ == "__main__":
    sys.exit(main())
