"""``python -m probe.attributions``: the options, the run (one report over every checkpoint), its text and figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from probe.cli import positive_int, resolve_device
from probe.core.rows import control_line
from probe.runner import (
    CheckpointOptions,
    Command,
    Report,
    lengths_option,
    option,
    samples_option,
    stored_gate_option,
    threads_option,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from probe.attributions.analysis import AttributionReport

DESCRIPTION = """\
Which inputs and sublayers the answers use, measured exactly: resample one token at a time (labels recomputed) and
see whether the state answers follow, along all paths, along paths that avoid attention and along paths that avoid
every recurrent module; where attention reads from (value-weighted attention by distance); the effect of zeroing
each sublayer; optionally integrated gradients per position, shown only where they converge.

Usage: python -m probe.attributions ckpt.pt [ckpt.pt ...] [--ig]. Definitions and controls: docs/guides/gradients.md."""

HELP_COLUMNS = """\
JSON rows (--json): every row has "analysis", "checkpoint", "run", "schedule", "label" (the variant), "seed", "step",
"family", "gate",
"length".
  analysis "occlusion": kind (number | query | prefix: which token was resampled), distance (t - s; null for the
    prefix), in_prefix, condition (total | recurrent_only: attention outputs held clean | attention_only:
    recurrent outputs held clean), follow (state answers whose prediction equals the recomputed label),
    follow_ci_low/high (95 % over sequences), flip (prediction changed), clean_acc, n_answers, n_sequences.
  analysis "occlusion_far" (numbers; answers pooled per sequence): k, range (near: distance 1..k | far: > k),
    condition, follow, follow_ci_low/high, flip, clean_acc, n_answers, n_sequences.
  analysis "reads": block, distance (null for the prefix), in_prefix, mass (mean share of value-weighted attention
    of the state answers). "reads_far": block, k, prefix, near, far, n_answers (answers at t > k).
  analysis "components": subtask, block, module (blocks.{i}.lstm | blocks.{i}.attn, or the name given to
    probe.wrap), component (attn, or the recurrent cell: lstm | gru | ssm | the module's class), hook, effect
    (correct logit minus the same with the output zeroed), share, logit, acc, acc_ablated.
  analysis "ig" (--ig; converged answers only): distance, ig, effect (exact occlusion effect of the token 0), n.
    "ig_far": k, far_share, n_answers.
controls rows: checkpoint, control, kind (instrument: every row here checks the method), value, threshold, passed,
what (what failure it reveals)."""


@dataclass
class AttributionOptions(CheckpointOptions):
    lengths: list[int] | None = lengths_option("the training length and 3x", aliases=["--length"])
    samples: int = samples_option(32, aliases=["--batch"])
    far: int | None = option(None, "k for the near/far split (default: a third of the training length)",
                             type=positive_int)
    ig: bool = option(False, "add integrated gradients per position: up to --ig-max-steps forward+backward passes "
                             "per explained answer at each length, about 18x the default run's time "
                             "(benchmarks/cli_defaults.py)")
    ig_sequences: int = option(4, "sequences explained by IG (default 4)", type=positive_int)
    ig_targets: int = option(2, "answers per sequence explained by IG (default 2)", type=positive_int)
    ig_max_steps: int = option(256, "largest number of IG steps (default 256)", type=positive_int)
    threads: int = threads_option(1)
    stored_gate: bool = stored_gate_option()


def run(opts: AttributionOptions) -> Report:
    from probe.attributions.analysis import analyze

    report = analyze(opts.checkpoints, opts.lengths, opts.samples, opts.seed, resolve_device(opts.device),
                     opts.far, opts.ig, opts.ig_sequences, opts.ig_targets, opts.ig_max_steps, opts.stored_gate,
                     progress=opts.progress)
    rows = report.rows()
    return Report(sorted({r["checkpoint"] for r in rows}), rows, report.controls, format_report(report),
                  figures=lambda: figures(report))


COMMAND = Command("attributions", AttributionOptions, run, DESCRIPTION, HELP_COLUMNS)
main, build_parser = COMMAND.main, COMMAND.build_parser


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
        lines.append(c.pivot_table(index=["checkpoint", "length", "subtask"], columns=["module", "component"],
                                   values="effect").to_string(float_format=lambda x: f"{x:.3f}"))
    if not report.ig_far.empty:
        lines.append("\nintegrated gradients (converged answers only): share of |IG| from numbers > k back:")
        lines.append(report.ig_far.set_index(["checkpoint", "length"])[["k", "far_share", "n_answers"]].to_string())
    lines.append("\ncontrols (every row is in the JSON):")
    lines += [f"{control_line(ctl)} [{ctl['checkpoint']}]" for ctl in report.controls]
    return "\n".join(lines)


def figures(report: AttributionReport) -> dict[str, Figure]:
    from probe.attributions.plots import plot_components, plot_occlusion, plot_reads

    figs = {"occlusion.png": plot_occlusion(report.occlusion), "components.png": plot_components(report.components)}
    if not report.reads.empty:
        figs["attention_reads.png"] = plot_reads(report.reads)
    return figs
