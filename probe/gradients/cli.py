"""``python -m probe.gradients``: parse, analyse, print the tables and controls, save JSON and figures."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe.cli import (
    add_checkpoints,
    add_common_args,
    add_lengths,
    add_samples,
    add_threads_and_gate_args,
    envelope,
    make_parser,
    positive_float,
    positive_int,
    resolve_device,
    run_cli,
    say,
    seed_and_threads,
)
from probe.cli import write_outputs as save_outputs

if TYPE_CHECKING:
    from probe.gradients.analysis import GradientReport

LOOKAHEAD_BATCHES, LOOKAHEAD_EVAL_BATCHES, LOOKAHEAD_STEP = 24, 4, 1e-6
"""``LookaheadConfig``'s defaults, repeated here so that ``--help`` needs no import of the models (a test checks
that they agree)."""

DESCRIPTION = """\
Attention-gradient interference on the recurrent weights: how much of their gradient arrives through attention, and
what a small step along that part would do to the state loss at the training length and at 3x.

Usage: python -m probe.gradients ckpt.pt (one checkpoint), python -m probe.gradients DIR [DIR ...] (trajectory or
run directories: curves over training), or a glob. g = dL/dtheta for the recurrent weights theta (each block's
cell: the LSTM's four tensors, the GRU's, the SSM's projections and A_log); g_rec = the same with attention's q, k, v
detached (every path through attention cut); g_att = g - g_rec. Definitions and what each control catches:
docs/gradients.md."""

HELP_COLUMNS = """\
JSON rows (--json): every row has "analysis", "checkpoint", "run", "schedule", "label" (the variant), "seed", "step",
"family", "gate".
  analysis "interference" (per checkpoint, length and block; block "all" = every block together), on one batch at
    "length": block, g_norm, g_rec_norm, g_att_norm, att_ratio (=|g_att|/|g|), cos_att_rec, cos_att_rec_state,
    cos_att_state_rec_state, cos_att_recall_rec_state, g_att_state_norm, g_att_recall_norm, loss_split_residual,
    loss, loss_state, loss_recall, n_state, n_recall. Cosines are null where a vector is 0.
  analysis "lookahead" (per checkpoint, part and target): part (att | rec | full: the step is -eta * d_part, d_part
    the training-loss gradient part averaged over n_batches batches drawn as the trainer draws them, AdamW-
    preconditioned when preconditioned is true), loss (train: the training loss on held-out training batches |
    state: the state-subtask loss), length (the evaluation length; null for train), moments (trajectory |
    optimizer | none), eta, rel_step (|eta d_full| / |theta|), dL_first (first-order change -eta <grad, d_part>),
    dL_se (its standard error: dL_se_batches over direction batches and dL_se_eval over evaluation batches, in
    quadrature), z (= dL_first / dL_se), dL_measured (the change after the real step, float64), first_order_error,
    loss_before, n_batches, n_eval_sequences.
  analysis "lookahead_verdict" (per checkpoint): verdict (supports | lowers | no effect detected | neither |
    no attention path), detail, dL_state_3x_att, z_state_3x_att, dL_train_att, z_train_att. "supports": the
    attention-path step raises the 3x state loss (z > 2) and lowers the training loss (z < -2); "lowers": it
    lowers the 3x state loss (z < -2); "no effect detected": |z| <= 2 (absence of evidence, not a refutation).
controls rows: checkpoint, control, kind (instrument: every row here checks the method), value, threshold, passed,
what (what failure it reveals)."""


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("python -m probe.gradients", DESCRIPTION, HELP_COLUMNS)
    add_checkpoints(parser)
    add_lengths(parser, "the training length and 3x", aliases=["--length"])
    add_samples(parser, 64, "sequences per batch, at each length and in each lookahead batch", aliases=["--batch"])
    parser.add_argument("--no-lookahead", action="store_true", help="only the interference table (fast)")
    parser.add_argument("--la-batches", type=positive_int, default=LOOKAHEAD_BATCHES,
                        help=f"training-distribution batches averaged into each step direction "
                             f"(default {LOOKAHEAD_BATCHES})")
    parser.add_argument("--la-eval-batches", type=positive_int, default=LOOKAHEAD_EVAL_BATCHES,
                        help=f"batches per evaluation length, and of held-out training batches "
                             f"(default {LOOKAHEAD_EVAL_BATCHES})")
    parser.add_argument("--la-step", type=positive_float, default=LOOKAHEAD_STEP,
                        help=f"size of the lookahead step, |eta d_full| / |theta| (default {LOOKAHEAD_STEP:g})")
    add_threads_and_gate_args(parser)
    add_common_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    def body(args: argparse.Namespace) -> dict[str, Any]:
        from probe.gradients.analysis import analyze
        from probe.gradients.lookahead import LookaheadConfig

        seed_and_threads(args)
        cfg = None if args.no_lookahead else LookaheadConfig(
            n_batches=args.la_batches, batch_size=args.samples, eval_batches=args.la_eval_batches,
            train_eval_batches=args.la_eval_batches, rel_step=args.la_step)
        report = analyze(args.checkpoints, args.lengths, args.samples, args.seed, resolve_device(args.device),
                         args.stored_gate, cfg, progress=not args.json)
        result = envelope("gradients", sorted(report.interference.checkpoint.unique().tolist()), report.rows(),
                          report.controls)
        say(args, format_report(report))
        if args.out:
            write_outputs(report, result, Path(args.out))
            say(args, f"\nwrote figures and results.json to {args.out}")
        return result

    return run_cli(build_parser(), body, argv)


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def format_report(report: GradientReport) -> str:
    import pandas as pd

    t = report.interference
    cols = ["step", "gate", "length", "block", "att_ratio", "cos_att_rec", "cos_att_rec_state", "g_norm"]
    lines = []
    for ckpt, df in t.groupby("checkpoint", sort=False):
        lines.append(f"\n{ckpt}  ({df.family.iloc[0]}, schedule {df.schedule.iloc[0]}, seed {df.seed.iloc[0]})")
        lines.append(df[cols].to_string(index=False, float_format=_fmt))
        if df.family.iloc[0] == "lstm":
            lines.append("  lstm model: no attention sublayer, so g_att = 0 and g = g_rec by construction")
    la = report.lookahead
    if not la.empty:
        lines.append("\nlookahead: first-order change of each loss after a step -eta * d_part (measured: after the "
                     "real step); +- = standard error")
        for ckpt, df in la.groupby("checkpoint", sort=False):
            pre = df.moments.iloc[0]
            lines.append(f"{ckpt}  step {df.step.iloc[0]}, gate {df.gate.iloc[0]:g}, "
                         f"{'AdamW-preconditioned (' + pre + ' moments)' if pre != 'none' else 'raw gradient'}, "
                         f"eta {df.eta.iloc[0]:.3g}")
            for _, r in df.iterrows():
                target = "train loss    " if r["loss"] == "train" else f"state L {int(r['length']):<5d} "
                lines.append(f"  {r.part:<4} {target} {r.dL_first:+.3e} +- {r.dL_se:.1e}  (z {r.z:+.1f})  "
                             f"measured {r.dL_measured:+.3e}")
        for _, v in report.verdicts.iterrows():
            lines.append(f"verdict {v.checkpoint}: {v.verdict} ({v.detail})")
    lines.append("\ncontrols (worst value over checkpoints; every row is in the JSON):")
    ctl = pd.DataFrame(report.controls)
    for name, g in ctl.groupby("control", sort=False):
        worst = g.loc[g.value.idxmax()]
        lines.append(f"  {'ok  ' if g.passed.all() else 'FAIL'} {name:<22} {worst.value:.3g} (<= {worst.threshold:g})"
                     f"  {int(g.passed.sum())}/{len(g)} passed  {worst.what}")
    return "\n".join(lines)


def write_outputs(report: GradientReport, result: dict[str, Any], out: Path) -> None:
    from probe.gradients.plots import plot_blocks, plot_lookahead, plot_over_training

    figs = {"blocks.png": plot_blocks(report.interference)}
    if report.interference.step.nunique() > 1:
        figs["interference_over_training.png"] = plot_over_training(report.interference)
        if not report.lookahead.empty:
            figs["lookahead_over_training.png"] = plot_lookahead(report.lookahead)
    save_outputs(out, result, figs)
