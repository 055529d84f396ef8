"""The lookahead at AdamW's real step and its rollouts (``probe.gradients.realstep``) over runs' snapshots, into CSVs.

Usage: ``python study/scripts/realstep_lookahead.py RUN [RUN ...] [--steps 250 300 ... 1500] [--rollout 50] [--work DIR]
[--out study/results/gradients/realstep] [--processes N]``. Each RUN is a run folder whose ``trajectory/`` holds
snapshots written with ``train.traj_optimizer=true`` (``study/sweeps/realstep.toml`` trains such runs). For each
snapshot at ``--steps`` (default every 50 steps over 250-1500, where the early-cut grid places the counter's forming:
``rnn0-until250`` fails 2 of 5 seeds, ``rnn0-until1000`` holds 5 of 5), ``real_step_report`` measures:

- the real step (``measure_real_step`` at its defaults): AdamW's next update from the snapshot's own optimizer
  state, split into attention's part, the recurrent part, the carried momentum and the weight decay, each stepped
  at its own size (its ``fraction_of_update`` recorded), and the whole update; the change of the held-out training
  loss and of the state loss per window beyond L (to 16 L), first order and taken; a random step matched to
  attention's part in norm and in its projection on the training-loss gradient;
- two rollouts of ``--rollout`` steps from the snapshot on the run's own batches: ``kept`` (the run itself) and
  ``cut`` (the recurrent sublayers without their gradient through attention); the same losses after each.

Its checks, per snapshot: the parts sum to the update (an identity); the matched random has the norm and projection
asked for; the kept rollout's first step is the computed update (``realstep_matches_adamw``: fails if the batch,
learning rate, clipping, moments or bias correction are not the run's) and its last weights are the run's own
snapshot ``--rollout`` steps later, bit for bit (``rollout_reproduces_run``, only where the trajectory holds that
snapshot; without it the row is left out and ``rollout_reproduced`` is empty); per window, a verdict that attention's
part raises or lowers the loss must exceed the matched random's change (``realstep_vs_matched_random``, a control).
Every snapshot's rows go to ``--work/<run>/step_XXXXXX.json`` (a rerun skips those), and after each snapshot the
script rewrites in ``--out``: ``realstep.csv`` (per run, step, part and target), ``verdicts.csv`` (per run, step and
window: the moments' source, each part's fraction of the update, the verdict, the matched baseline and the rollout's
outcome), ``rollout.csv`` (per run, step and target) and ``checks.csv``.

The question, fixed before the runs: in which joint runs, at which steps, does attention's part of the real update
raise the state loss beyond the training range by more than a matched random step, and does removing it for 50
steps lower that loss? Read per window and per run (every seed shown): the share of snapshots with a ``raises``
verdict that passes its control, and the rollout's ``cut - kept`` change with its z.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from probe.checkpoint import load_checkpoint
from probe.core.meta import checkpoint_meta
from probe.gradients.realstep import RealStepConfig, real_step_report

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dense_lookahead import cached, measure_snapshots, round4, snapshot_jobs, write_csv  # noqa: E402  (beside this file)

STUDY = Path(__file__).resolve().parent.parent
STEPS = list(range(250, 1501, 50))
ROLLOUT = 50
META = ["variant", "seed", "step"]
REALSTEP_COLUMNS = META + ["part", "loss", "positions", "step_norm", "fraction_of_update", "dL", "dL_se", "z",
                           "dL_first", "dL_first_se", "vs_matched", "vs_matched_se", "vs_matched_z", "loss_before",
                           "moments", "adam_step", "lr", "clip", "update_norm"]
VERDICT_COLUMNS = META + ["positions", "moments", "fraction_att", "fraction_rec", "fraction_momentum",
                          "fraction_decay", "verdict", "baseline", "dL_att", "z_att", "vs_matched", "vs_matched_z",
                          "dL_train_att", "z_train_att", "rollout_cut_minus_kept", "rollout_z", "rollout_outcome",
                          "rollout_reproduced"]
ROLLOUT_COLUMNS = META + ["loss", "positions", "loss_kept", "loss_cut", "cut_minus_kept", "cut_minus_kept_se",
                          "cut_minus_kept_z", "rollout_steps"]


def measure(snapshot: Path, cache: Path, rollout: int = ROLLOUT, cfg: RealStepConfig | None = None) -> dict:
    """Every row and check of one snapshot (``real_step_report``), from ``cache`` when it is there."""
    def compute() -> dict:
        ckpt = load_checkpoint(snapshot)
        meta = checkpoint_meta(ckpt)
        meta["variant"] = ckpt.variant
        report = real_step_report(ckpt, cfg, rollout=rollout, name=meta["checkpoint"])
        keep = {k: meta[k] for k in ("checkpoint", "run", "variant", "seed", "step")}
        return {"realstep": [{**keep, **r} for r in report.rows.to_dict("records")],
                "verdicts": [{**keep, **r} for r in report.verdicts.to_dict("records")],
                "rollout": [{**keep, **r} for r in report.rollout.to_dict("records")],
                "controls": [{**keep, **c} for c in report.controls]}
    return cached(cache, compute)


def collect(objs: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    frames = {"realstep": REALSTEP_COLUMNS, "verdicts": VERDICT_COLUMNS, "rollout": ROLLOUT_COLUMNS,
              "checks": META + ["control", "kind", "positions", "value", "threshold", "passed"]}
    for key, columns in frames.items():
        rows = pd.DataFrame([r for o in objs for r in o["controls" if key == "checks" else key]])
        df = rows.reindex(columns=columns).sort_values(META, kind="stable")
        write_csv(round4(df), out / f"{key}.csv")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders whose trajectory/ carries the optimizer state")
    p.add_argument("--steps", nargs="+", type=int, default=STEPS)
    p.add_argument("--rollout", type=int, default=ROLLOUT, help="steps of each rollout branch")
    p.add_argument("--work", type=Path, default=Path("runs/realstep-lookahead"), help="per-snapshot cache")
    p.add_argument("--out", type=Path, default=STUDY / "results" / "gradients" / "realstep")
    p.add_argument("--processes", type=int, default=1, help="snapshots measured at a time, one thread each")
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error(f"--processes must be at least 1, got {args.processes}")
    if args.rollout < 1:  # the kept rollout's first step is the check that the update is the run's own
        p.error(f"--rollout must be at least 1 step, got {args.rollout}")
    torch.set_num_threads(1)
    return measure_snapshots(
        lambda: snapshot_jobs(args.runs, args.steps, lambda run, step: run / "trajectory" / f"step_{step:06d}.pt",
                              lambda run, step: args.work / f"{run.parent.name}-{run.name}" / f"step_{step:06d}.json",
                              "train the run with --set train.traj_every=50 --set train.traj_optimizer=true --set "
                              "train.traj_dtype=float32"),
        partial(measure, rollout=args.rollout), collect, args.out, processes=args.processes)

if __name__ == "__main__":
    sys.exit(main())
