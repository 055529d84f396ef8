"""``python -m probe.gradients``: the options, the run (one report over every checkpoint), its text and figures."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from probe.cli import positive_float, positive_int, resolve_device
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

    from probe.gradients.analysis import GradientReport

LOOKAHEAD_BATCHES, LOOKAHEAD_EVAL_BATCHES, LOOKAHEAD_STEP = 24, 8, 1e-6
LOOKAHEAD_SCALES, LOOKAHEAD_RANDOM = (0.01, 0.1, 0.3, 1.0), 4
"""``LookaheadConfig``'s defaults (the full lookahead, ``--full-lookahead``), repeated here so that ``--help`` needs
no import of the models (a test checks that they agree)."""
QUICK_BATCHES, QUICK_EVAL_BATCHES, QUICK_SCALES, QUICK_RANDOM = 8, 4, (1.0,), 2
"""The default run's lookahead: the verdict's step size alone (a real update, scale 1), a third of the direction
batches, half the evaluation batches and two random directions. Its cost is mostly float64 forward passes, one per
(direction, step size) over every evaluation batch: 11 passes over 8 batches here against 36 over 16 in full, so the
default run answers within ~30 s on one core (``benchmarks/cli_defaults.py``) while keeping every control."""

DESCRIPTION = """\
Attention-gradient interference on the recurrent weights: how much of their gradient arrives through attention, and
what a step along that part, up to a real AdamW update, does to the state loss beyond the training range.

Usage: python -m probe.gradients ckpt.pt (one checkpoint), python -m probe.gradients DIR [DIR ...] (trajectory or
run directories: curves over training), or a glob. g = dL/dtheta for the recurrent weights theta (each block's
cell: the LSTM's four tensors, the GRU's, the SSM's projections and A_log); g_rec = the same with attention's q, k, v
detached (every path through attention cut); g_att = g - g_rec. Definitions and what each control catches:
docs/guides/gradients.md.

The default run (24 s of CPU on one thread of a 2-core Xeon VM: benchmarks/cli_defaults.py): the interference table,
and the lookahead at the real update's step size alone on fewer batches and two random directions: its verdict with
every control, at less power. --full-lookahead is the lookahead the study reports; --no-lookahead the table alone."""

HELP_COLUMNS = """\
JSON rows (--json): every row has "analysis", "checkpoint", "run", "schedule", "label" (the variant), "seed", "step",
"family", "gate".
  analysis "interference" (per checkpoint, length and block; block "all" = every block together), on one batch at
    "length": block, g_norm, g_rec_norm, g_att_norm, att_ratio (=|g_att|/|g|), cos_att_rec, cos_att_rec_state,
    cos_att_state_rec_state, cos_att_recall_rec_state, g_att_state_norm, g_att_recall_norm, loss_split_residual,
    loss, loss_state, loss_recall, n_state, n_recall. Cosines are null where a vector is 0.
  analysis "lookahead" (per checkpoint, direction, target and step size): part (att | rec | full: the
    normalised, AdamW-preconditioned (when preconditioned is true) training-loss gradient part averaged over
    n_batches batches drawn as the trainer draws them | random: n_random random directions shaped by the same
    preconditioner, averaged), loss (train | state), positions (train: "<=L", held-out training batches; state:
    ">L" or ">2L", the state answers at stream positions t > L or t > 2L of fixed sequences of length "length" =
    3 L), step_scale (0: first order; else the step length as a multiple of update_norm), step_length, update_norm
    (the optimizer's update size |lr m_hat / (sqrt(v_hat) + eps)| on theta), update_source (how it was obtained:
    "adam m and v" | "adam v, m = mean gradient" | "no moments: lr sqrt(n)" | "no moments or lr: 1e-2 |theta|"),
    rel_update (update_norm / |theta|), effect (change of the loss per unit of step length after the real step
    -step_length * d/|d|, float64; first-order at scale 0), effect_se (paired standard error over the n_eval_batches
    evaluation batches; random: with the spread over draws in quadrature), z, dL (= effect * step_length),
    vs_random, vs_random_se, vs_random_z (effect minus the random directions' on the same batches), vs_rec,
    vs_rec_se, vs_rec_z (att rows: attention's effect minus the rest's, same batches), direction_norm,
    loss_before, min_position (the first stream position the target uses), moments, preconditioned, n_batches,
    n_random, n_eval_sequences.
  analysis "lookahead_verdict" (per checkpoint, at step_scale verdict_scale = 1, a real update): verdict (supports
    | lowers | no effect detected | neither | no attention path), detail, baseline (more harmful than random |
    less harmful than random | no difference from random detected), baseline_train (more useful | less useful |
    no difference ...), effect_beyond_L_att, z_beyond_L_att, z_beyond_2L_att, effect_train_att, z_train_att,
    z_vs_random_beyond_L, z_vs_random_train, z_att_vs_rec_beyond_L. "supports": the attention-path step raises
    the state loss beyond L (z > 2) and lowers the training loss (z < -2); "lowers": z < -2 beyond L; "no effect
    detected": |z| <= 2 (absence of evidence, not a refutation).
controls rows: checkpoint, control, kind (instrument: the method computes what it says | control: lookahead_vs_random,
the verdict's claim against random directions of equal length), value, threshold, passed, what (what failure it
reveals)."""


@dataclass
class GradientOptions(CheckpointOptions):
    lengths: list[int] | None = lengths_option("the training length and 3x", aliases=["--length"])
    samples: int = samples_option(64, "sequences per batch, at each length and in each lookahead batch",
                                  aliases=["--batch"])
    no_lookahead: bool = option(False, "only the interference table and its checks (about a quarter of the default "
                                       "run's time)")
    full_lookahead: bool = option(False, "the lookahead the study reports: step sizes "
                                  + ", ".join(f"{s:g}" for s in LOOKAHEAD_SCALES) + " x the update (the default "
                                  + "takes the real update, 1, alone), "
                                  f"{LOOKAHEAD_BATCHES} direction batches, {LOOKAHEAD_EVAL_BATCHES} + "
                                  f"{LOOKAHEAD_EVAL_BATCHES} evaluation batches and {LOOKAHEAD_RANDOM} random "
                                  f"directions (default {QUICK_BATCHES}, {QUICK_EVAL_BATCHES} + {QUICK_EVAL_BATCHES}, "
                                  f"{QUICK_RANDOM}): the effect at every step size and tighter intervals; about 5x "
                                  "the default run's time (benchmarks/cli_defaults.py)")
    la_batches: int | None = option(None, "training-distribution batches averaged into each step direction "
                                          f"(default {QUICK_BATCHES}; {LOOKAHEAD_BATCHES} with --full-lookahead)",
                                    type=positive_int)
    la_eval_batches: int | None = option(None, "evaluation batches beyond the training range, and of held-out "
                                               f"training batches (default {QUICK_EVAL_BATCHES}; "
                                               f"{LOOKAHEAD_EVAL_BATCHES} with --full-lookahead)", type=positive_int)
    la_step: float = option(LOOKAHEAD_STEP, "size of the tiny step that checks the first-order prediction, / |theta| "
                                             f"(default {LOOKAHEAD_STEP:g})", type=positive_float)
    threads: int = threads_option(1)
    stored_gate: bool = stored_gate_option()


def run(opts: GradientOptions) -> Report:
    from probe.gradients.analysis import analyze
    from probe.gradients.lookahead import LookaheadConfig

    full = opts.full_lookahead
    n_batches = opts.la_batches or (LOOKAHEAD_BATCHES if full else QUICK_BATCHES)
    n_eval = opts.la_eval_batches or (LOOKAHEAD_EVAL_BATCHES if full else QUICK_EVAL_BATCHES)
    cfg = None if opts.no_lookahead else LookaheadConfig(
        n_batches=n_batches, batch_size=opts.samples, eval_batches=n_eval, train_eval_batches=n_eval,
        rel_step=opts.la_step, scales=LOOKAHEAD_SCALES if full else QUICK_SCALES,
        n_random=LOOKAHEAD_RANDOM if full else QUICK_RANDOM)
    report = analyze(opts.checkpoints, opts.lengths, opts.samples, opts.seed, resolve_device(opts.device),
                     opts.stored_gate, cfg, progress=opts.progress)
    return Report(sorted(report.interference.checkpoint.unique().tolist()), report.rows(), report.controls,
                  format_report(report), figures=lambda: figures(report))


COMMAND = Command("gradients", GradientOptions, run, DESCRIPTION, HELP_COLUMNS)
main, build_parser = COMMAND.main, COMMAND.build_parser


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
        lines.append("\nlookahead: change of each loss per unit of step length after a step along -d (d normalised); "
                     "+- = paired standard error; vs random = minus random directions' effect (z); step sizes x0 "
                     "(first order) and the largest (x1: a real update)")
        for ckpt, df in la.groupby("checkpoint", sort=False):
            pre = df.moments.iloc[0]
            lines.append(f"{ckpt}  step {df.step.iloc[0]}, gate {df.gate.iloc[0]:g}, "
                         f"{'AdamW-preconditioned (' + pre + ' moments)' if pre != 'none' else 'raw gradient'}, "
                         f"update {df.update_norm.iloc[0]:.3g} ({df.update_source.iloc[0]})")
            shown = df[df.step_scale.isin([0.0, df.step_scale.max()])]  # every step size is in the JSON
            for _, r in shown.iterrows():
                vs = "" if r.part == "random" else f"  vs random z {r.vs_random_z:+.1f}"
                lines.append(f"  x{r.step_scale:<5g} {r.part:<6} {r['loss']:<5} t {r.positions:<4} "
                             f"{r.effect:+.3e} +- {r.effect_se:.1e}  (z {r.z:+.1f}){vs}")
        for _, v in report.verdicts.iterrows():
            lines.append(f"verdict {v.checkpoint}: {v.verdict}; {v.baseline} ({v.detail})")
    lines.append("\ncontrols (worst value over checkpoints; every row is in the JSON):")
    ctl = pd.DataFrame(report.controls)
    for name, g in ctl.groupby("control", sort=False):
        worst = g.loc[g.value.fillna(-math.inf).idxmax()]
        # a control passes when its z clears the threshold in the claimed direction, an instrument when it stays below
        rule = f"|z| > {worst.threshold:g} if claimed" if worst.get("kind") == "control" else f"<= {worst.threshold:g}"
        lines.append(f"  {'ok  ' if g.passed.all() else 'FAIL'} {name:<22} {worst.value:.3g} ({rule})"
                     f"  {int(g.passed.sum())}/{len(g)} passed  {worst.what}")
    return "\n".join(lines)


def figures(report: GradientReport) -> dict[str, Figure]:
    from probe.gradients.plots import plot_blocks, plot_lookahead, plot_over_training

    figs = {"blocks.png": plot_blocks(report.interference)}
    if report.interference.step.nunique() > 1:
        figs["interference_over_training.png"] = plot_over_training(report.interference)
        if not report.lookahead.empty:
            figs["lookahead_over_training.png"] = plot_lookahead(report.lookahead)
    return figs

