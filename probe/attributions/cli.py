"""``python -m probe.attributions``: parse, attribute, print the tables and controls, save JSON and figures."""

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
    positive_int,
    resolve_device,
    run_cli,
    say,
    seed_and_threads,
)
from probe.cli import write_outputs as save_outputs

if TYPE_CHECKING:
    from probe.attributions.analysis import AttributionReport

DESCRIPTION = """\
Which inputs and sublayers the answers use, measured exactly: resample one token at a time (labels recomputed) and
see whether the state answers follow, along all paths, along paths that avoid attention and along paths that avoid
every LSTM; where attention reads from (value-weighted attention by distance); the effect of zeroing each sublayer;
optionally integrated gradients per position, shown only where they converge.

Usage: python -m probe.attributions ckpt.pt [ckpt.pt ...] [--ig]. Definitions and controls: docs/gradients.md."""

HELP_COLUMNS = """\
JSON rows (--json): every row has "analysis", "checkpoint", "run", "schedule", "label" (the variant), "seed", "step",
"family", "gate",
"length".
  analysis "occlusion": kind (number | query | prefix: which token was resampled), distance (t - s; null for the
    prefix), in_prefix, condition (total | recurrent_only: attention outputs held clean | attention_only: LSTM
    outputs held clean), follow (state answers whose prediction equals the recomputed label), follow_ci_low/high
    (95 % over sequences), flip (prediction changed), clean_acc, n_answers, n_sequences.
  analysis "occlusion_far" (numbers; answers pooled per sequence): k, range (near: distance 1..k | far: > k),
    condition, follow, follow_ci_low/high, flip, clean_acc, n_answers, n_sequences.
  analysis "reads": block, distance (null for the prefix), in_prefix, mass (mean share of value-weighted attention
    of the state answers). "reads_far": block, k, prefix, near, far, n_answers (answers at t > k).
  analysis "components": subtask, block, component (lstm | attn), hook, effect (correct logit minus the same with
    the output zeroed), share, logit, acc, acc_ablated.
  analysis "ig" (--ig; converged answers only): distance, ig, effect (exact occlusion effect of the token 0), n.
    "ig_far": k, far_share, n_answers.
controls rows: checkpoint, control, kind (instrument: every row here checks the method), value, threshold, passed,
what (what failure it reveals)."""


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("python -m probe.attributions", DESCRIPTION, HELP_COLUMNS)
    add_checkpoints(parser)
    add_lengths(parser, "the training length and 3x", aliases=["--length"])
    add_samples(parser, 32, aliases=["--batch"])
    parser.add_argument("--far", type=positive_int, default=None,
                        help="k for the near/far split (default: a third of the training length)")
    parser.add_argument("--ig", action="store_true", help="add integrated gradients per position (slow)")
    parser.add_argument("--ig-sequences", type=positive_int, default=4, help="sequences explained by IG (default 4)")
    parser.add_argument("--ig-targets", type=positive_int, default=2,
                        help="answers per sequence explained by IG (default 2)")
    parser.add_argument("--ig-max-steps", type=positive_int, default=256,
                        help="largest number of IG steps (default 256)")
    add_threads_and_gate_args(parser)
    add_common_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    def body(args: argparse.Namespace) -> dict[str, Any]:
        from probe.attributions.analysis import analyze

        seed_and_threads(args)
        report = analyze(args.checkpoints, args.lengths, args.samples, args.seed, resolve_device(args.device),
                         args.far, args.ig, args.ig_sequences, args.ig_targets, args.ig_max_steps, args.stored_gate,
                         progress=not args.json)
        names = sorted({r["checkpoint"] for r in report.rows()})
        result = envelope("attributions", names, report.rows(), report.controls)
        say(args, format_report(report))
        if args.out:
            write_outputs(report, result, Path(args.out))
            say(args, f"\nwrote figures and results.json to {args.out}")
        return result

    return run_cli(build_parser(), body, argv)


def format_report(report: AttributionReport) -> str:
    lines = []
    f = report.occlusion_far
    if not f.empty:
        lines.append(f"\nstate answers following a resampled number (k = {int(f.k.iloc[0])}; near: 1..k back, far: "
                     "> k back; 95 % interval over sequences):")
        piv = f.assign(cell=[f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, lo, hi in
                             zip(f.follow, f.follow_ci_low, f.follow_ci_high, strict=True)])
        lines.append(piv.pivot_table(index=["checkpoint", "length", "range"], columns="condition", values="cell",
                                     aggfunc="first").to_string())
    r = report.reads_far
    if not r.empty:
        lines.append("\nwhere attention reads from (value-weighted attention of the state answers at t > k):")
        lines.append(r.set_index(["checkpoint", "length", "block"])[["prefix", "near", "far"]]
                     .to_string(float_format=lambda x: f"{x:.3f}"))
    c = report.components
    if not c.empty:
        lines.append("\ncorrect-answer logit drop when one sublayer output is zeroed:")
        lines.append(c.pivot_table(index=["checkpoint", "length", "subtask"], columns=["block", "component"],
                                   values="effect").to_string(float_format=lambda x: f"{x:.3f}"))
    if not report.ig_far.empty:
        lines.append("\nintegrated gradients (converged answers only): share of |IG| from numbers > k back:")
        lines.append(report.ig_far.set_index(["checkpoint", "length"])[["k", "far_share", "n_answers"]].to_string())
    lines.append("\ncontrols (every row is in the JSON):")
    for ctl in report.controls:
        lines.append(f"  {'ok  ' if ctl['passed'] else 'FAIL'} {ctl['control']:<30} {ctl['value']:.3g} "
                     f"(<= {ctl['threshold']:g})  {ctl['checkpoint']}")
    return "\n".join(lines)


def write_outputs(report: AttributionReport, result: dict[str, Any], out: Path) -> None:
    from probe.attributions.plots import plot_components, plot_occlusion, plot_reads

    figs = {"occlusion.png": plot_occlusion(report.occlusion), "components.png": plot_components(report.components)}
    if not report.reads.empty:
        figs["attention_reads.png"] = plot_reads(report.reads)
    save_outputs(out, result, figs)

