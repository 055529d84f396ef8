"""``python -m probe.gradients``: the options, the run (one report over every checkpoint), its text and figures."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from probe.cli import nonnegative_int, positive_float, positive_int, resolve_device
from probe.errors import ProbeError
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
REAL_STEP_TRAIN_BATCHES, REAL_STEP_EVAL_BATCHES, REAL_STEP_MAX_FACTOR, REAL_STEP_RANDOM = 8, 4, 16, 4
"""``RealStepConfig``'s defaults (``--real-step``), repeated for ``--help`` as above (a test checks them)."""
REAL_STEP_COST_S, ROLLOUT_COST_S = "146", "20-30"
"""What ``--real-step`` and ``--rollout 50`` add in CPU seconds of one thread on the busy 2-core Xeon VM, on a snapshot
of the shipped hybrid-joint's size (d_model 128, 2 blocks, L 25, --samples 64), measured as the command runs
(``benchmarks/cli_defaults.py --group options``: 20.3 s without either flag, 166.0 s with --real-step, 193.1 s with
--rollout 50 as well) and by timing the library calls alone (``measure_real_step`` with its verdicts 146 s, the two
50-step rollouts 17 s). Mostly float64 forward passes over 4 batches of 64 sequences at 16 L (400 positions), one
per direction (5 parts and 4 random steps) and one before."""

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
every control, at less power. --full-lookahead runs it at every step size on more batches and directions;
--no-lookahead the table alone.
--real-step adds the lookahead at AdamW's real next update, split into its parts, on a snapshot that holds the
optimizer's state (train with --set train.traj_optimizer=true --set train.traj_dtype=float32, or a run's last.pt;
the shipped checkpoints hold none); --rollout STEPS adds the run continued from there with and without attention's
gradient path into the recurrent weights."""

HELP_COLUMNS = """\
JSON rows (--json): every row has "analysis", "checkpoint", "run", "schedule", "label" (the variant), "seed", "step",
"family", "gate".
  analysis "interference" (per checkpoint, length and block; block "all" = every block together), on one batch at
    "length": block (counts the recurrent modules), module (its path as the model names it: blocks.i.lstm, or your
    module's), cell (lstm | gru | ssm | the module's class), g_norm, g_rec_norm, g_att_norm, att_ratio
    (=|g_att|/|g|), cos_att_rec, cos_att_rec_state,
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
    loss_before, min_position (the first stream position the target uses), z_if_consistent (the z if every
    batch had moved the loss the same way by its amount), powered (z_if_consistent > 2: false = the arm has no
    power at this size, its z says nothing), moments, preconditioned, n_batches,
    n_random, n_eval_sequences.
  analysis "lookahead_verdict" (per checkpoint, at step_scale verdict_scale = 1, a real update): verdict (supports
    | lowers | no effect detected | neither | no attention path), detail, baseline (raises | lowers the state loss
    beyond L more than a random step | no difference from a random step detected beyond L), baseline_train (lowers
    the training loss more | less than a random step | no difference ...), train_arm_powered (false: the
    training-loss arm has no power at this size), effect_beyond_L_att, z_beyond_L_att, z_beyond_2L_att,
    effect_train_att, z_train_att,
    z_vs_random_beyond_L, z_vs_random_train, z_att_vs_rec_beyond_L. "supports": the attention-path step raises
    the state loss beyond L (z > 2) and lowers the training loss (z < -2); "lowers": z < -2 beyond L; "no effect
    detected": |z| <= 2 (absence of evidence, not a refutation).
  analysis "real_step" (--real-step; per checkpoint, part and target): part (att | rec | momentum | decay: the
    additive parts of AdamW's next update u of theta, from the snapshot's own optimizer state, each at the size it
    has inside u | full: u | matched_random: n_random random steps as long as att and with its first-order change
    of the training loss, averaged), loss (train | state), positions ("<=L": held-out training batches; "(1x, 2x]",
    "(2x, 4x]", ...: the state answers in that window of stream positions, to 16 L), lo, hi, step_norm,
    fraction_of_update (step_norm / |u|; the parts' vectors sum to u), dL (the loss's change after theta - part,
    float64), dL_se (paired over evaluation batches), z, dL_first (first order, -<grad, part>), dL_first_se, on att
    rows vs_matched, vs_matched_se, vs_matched_z (dL minus the matched random's), loss_before, n_eval_sequences,
    moments ("adamw-state"), adam_step, lr, weight_decay, clip, update_norm (|u|), match, n_random, step_loss.
  analysis "real_step_verdict" (per checkpoint and window beyond L): verdict (raises | lowers | no effect detected |
    no attention path: attention's part at its real size, |z| against 2), baseline (raises | lowers the state loss
    more than a matched random step | no difference from a matched random step detected on the state loss; results
    written before this wording say more | less harmful than matched random), dL_att, z_att, vs_matched,
    vs_matched_z, fraction_att, fraction_rec, fraction_momentum, fraction_decay, dL_train_att, z_train_att, moments;
    with --rollout: rollout_steps, rollout_cut_minus_kept, rollout_z, rollout_outcome (cut lowers | cut raises the
    loss | no difference detected), rollout_reproduced (null without the run's snapshot rollout_steps later).
  analysis "real_step_rollout" (--rollout; per checkpoint and target): loss, positions, lo, hi, loss_kept, loss_cut
    (each target's loss after rollout_steps steps of the run from the snapshot, attention's gradient path into the
    recurrent weights kept or cut), cut_minus_kept, cut_minus_kept_se, cut_minus_kept_z, rollout_steps.
controls rows: checkpoint, control, kind (instrument: the method computes what it says | control: lookahead_vs_random,
the verdict's claim against random directions of equal length; realstep_vs_matched_random, each real-step verdict's
claim against the matched random), value, threshold, passed, what (what failure it reveals); --real-step adds
realstep_parts_sum, realstep_matched_random and, with --rollout, realstep_matches_adamw and rollout_reproduces_run
(where the trajectory holds the later snapshot)."""


@dataclass
class GradientOptions(CheckpointOptions):
    lengths: list[int] | None = lengths_option("the training length and 3x", aliases=["--length"])
    samples: int = samples_option(64, "sequences per batch, at each length and in each lookahead batch",
                                  aliases=["--batch"])
    no_lookahead: bool = option(False, "only the interference table and its checks (about a quarter of the default "
                                       "run's time)")
    full_lookahead: bool = option(False, "the lookahead at full power: step sizes "
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
    real_step: bool = option(False, "add the lookahead at AdamW's real next update (rows real_step, "
                             "real_step_verdict): its parts (attention's, the recurrent, momentum, weight decay) each "
                             "stepped at its own size beside a matched random step, on the training loss and the "
                             f"state loss per window to {REAL_STEP_MAX_FACTOR}x L ({REAL_STEP_TRAIN_BATCHES} held-out "
                             f"training batches and {REAL_STEP_EVAL_BATCHES} at {REAL_STEP_MAX_FACTOR}x L of --samples "
                             f"sequences, {REAL_STEP_RANDOM} random steps; --la-eval-batches sets both counts). Needs "
                             "a snapshot that holds AdamW's state (train with --set train.traj_optimizer=true --set "
                             "train.traj_dtype=float32, or a run's last.pt; the shipped checkpoints hold none). Adds "
                             f"about {REAL_STEP_COST_S} s of CPU per d_model-128 snapshot, one thread of a 2-core Xeon "
                             "VM (benchmarks/cli_defaults.py)")
    rollout: int = option(0, "with --real-step: also continue the run STEPS steps from the snapshot's state, as it "
                             "trained and with attention's gradient path into the recurrent weights cut (rows "
                             "real_step_rollout: each target's loss after both); --rollout 50 adds about "
                             f"{ROLLOUT_COST_S} s of CPU per d_model-128 snapshot (default 0: none)",
                          type=nonnegative_int, metavar="STEPS")
    la_step: float = option(LOOKAHEAD_STEP, "size of the tiny step that checks the first-order prediction, / |theta| "
                                             f"(default {LOOKAHEAD_STEP:g})", type=positive_float)
    threads: int = threads_option(1)
    stored_gate: bool = stored_gate_option()


def run(opts: GradientOptions) -> Report:
    if opts.rollout and not opts.real_step:
        raise ProbeError("--rollout continues the run from the real step's snapshot: give --real-step as well")
    from probe.gradients.analysis import analyze
    from probe.gradients.lookahead import LookaheadConfig
    from probe.gradients.realstep import RealStepConfig

    full = opts.full_lookahead
    n_batches = opts.la_batches or (LOOKAHEAD_BATCHES if full else QUICK_BATCHES)
    n_eval = opts.la_eval_batches or (LOOKAHEAD_EVAL_BATCHES if full else QUICK_EVAL_BATCHES)
    cfg = None if opts.no_lookahead else LookaheadConfig(
        n_batches=n_batches, batch_size=opts.samples, eval_batches=n_eval, train_eval_batches=n_eval,
        rel_step=opts.la_step, scales=LOOKAHEAD_SCALES if full else QUICK_SCALES,
        n_random=LOOKAHEAD_RANDOM if full else QUICK_RANDOM)
    real = None if not opts.real_step else RealStepConfig(batch_size=opts.samples, **(
        {"train_eval_batches": opts.la_eval_batches, "eval_batches": opts.la_eval_batches}
        if opts.la_eval_batches else {}))
    report = analyze(opts.checkpoints, opts.lengths, opts.samples, opts.seed, resolve_device(opts.device),
                     opts.stored_gate, cfg, progress=opts.progress, real_step=real, rollout=opts.rollout)
    return Report(sorted(report.interference.checkpoint.unique().tolist()), report.rows(), report.controls,
                  format_report(report), figures=lambda: figures(report))


COMMAND = Command("gradients", GradientOptions, run, DESCRIPTION, HELP_COLUMNS)
main, build_parser = COMMAND.main, COMMAND.build_parser


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def format_report(report: GradientReport) -> str:
    import pandas as pd

    t = report.interference
    cols = ["step", "gate", "length", "module", "cell", "att_ratio", "cos_att_rec", "cos_att_rec_state", "g_norm"]
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
                weak = "  no power at this size" if r.get("powered", True) is False else ""
                lines.append(f"  x{r.step_scale:<5g} {r.part:<6} {r['loss']:<5} t {r.positions:<4} "
                             f"{r.effect:+.3e} +- {r.effect_se:.1e}  (z {r.z:+.1f}){vs}{weak}")
        if "powered" in la and not la.powered.astype(bool).all():
            lines.append("  no power at this size: z would stay within 2 even if every batch moved the loss the same "
                         "way (one batch carries the mean), so that row's z says nothing either way")
        for _, v in report.verdicts.iterrows():
            lines.append(f"verdict {v.checkpoint} ({v.verdict}): {v.detail}; against a random step as long: "
                         f"{v.baseline} (z {v.z_vs_random_beyond_L:+.1f})")
    if not report.real_step.empty:
        lines += format_real_step(report)
    lines.append("\ncontrols (worst value over checkpoints; every row is in the JSON):")
    ctl = pd.DataFrame(report.controls)
    for name, g in ctl.groupby("control", sort=False):
        worst = g.loc[g.value.fillna(-math.inf).idxmax()]
        # a control passes when its z clears the threshold in the claimed direction, an instrument when it stays below
        rule = f"|z| > {worst.threshold:g} if claimed" if worst.get("kind") == "control" else f"<= {worst.threshold:g}"
        lines.append(f"  {'ok  ' if g.passed.all() else 'FAIL'} {name:<22} {worst.value:.3g} ({rule})"
                     f"  {int(g.passed.sum())}/{len(g)} passed  {worst.what}")
    return "\n".join(lines)


def format_real_step(report: GradientReport) -> list[str]:
    """The real-step lookahead's text: per checkpoint the update, each part's share and change of each loss, the
    verdict per window and the rollout."""
    lines = ["\nreal step: AdamW's next update u from the snapshot's state, each part stepped at its own size; share "
             "= |part| / |u|; dL = change of the loss after the step (float64) +- paired standard error; vs matched = "
             "att minus a random step as long and as useful for the training loss (z)"]
    for ckpt, df in report.real_step.groupby("checkpoint", sort=False):
        lines.append(f"{ckpt}  adam step {df.adam_step.iloc[0]}, lr {df.lr.iloc[0]:.3g}, |u| "
                     f"{df.update_norm.iloc[0]:.3g}, clip {df['clip'].iloc[0]:.3g}")
        for _, r in df.iterrows():
            vs = f"  vs matched z {r.vs_matched_z:+.1f}" if r.part == "att" and "vs_matched_z" in r else ""
            lines.append(f"  {r.part:<14} share {r.fraction_of_update:6.3f}  {r['loss']:<5} t {r.positions:<10} "
                         f"dL {r.dL:+.3e} +- {r.dL_se:.1e} (z {r.z:+.1f}){vs}")
        for _, v in report.real_step_verdicts[report.real_step_verdicts.checkpoint == ckpt].iterrows():
            roll = f"; {v.rollout_steps}-step rollout: {v.rollout_outcome}" if "rollout_outcome" in v else ""
            lines.append(f"  verdict t {v.positions}: {v.verdict}; {v.baseline}{roll}")
    for ckpt, df in (report.rollout.groupby("checkpoint", sort=False) if not report.rollout.empty else ()):
        lines.append(f"{ckpt}  rollout, {df.rollout_steps.iloc[0]} steps: loss with attention's path cut minus kept")
        for _, r in df.iterrows():
            lines.append(f"  {r['loss']:<5} t {r.positions:<10} {r.loss_kept:.4f} -> {r.loss_cut:.4f}  "
                         f"{r.cut_minus_kept:+.3e} +- {r.cut_minus_kept_se:.1e} (z {r.cut_minus_kept_z:+.1f})")
    return lines


def figures(report: GradientReport) -> dict[str, Figure]:
    from probe.gradients.plots import plot_blocks, plot_lookahead, plot_over_training

    figs = {"blocks.png": plot_blocks(report.interference)}
    if report.interference.step.nunique() > 1:
        figs["interference_over_training.png"] = plot_over_training(report.interference)
        if not report.lookahead.empty:
            figs["lookahead_over_training.png"] = plot_lookahead(report.lookahead)
    return figs

