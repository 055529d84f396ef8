"""``python -m probe.shortcuts``: the options, and a run that tests every checkpoint into one report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.cli import int_list, lengths_arg, positive_float, positive_int, resolve_device, tidy
from probe.errors import ProbeError
from probe.runner import CheckpointOptions, Command, Report, lengths_option, option, samples_option

DEFAULT_KS = (3, 10)  # = probe.shortcuts.sums.DEFAULT_KS
DEFAULT_RUNS = (25, 50, 75)  # = probe.shortcuts.runs.DEFAULT_RUNS
FLAG_THRESHOLD = 0.1  # = probe.shortcuts.positional.FLAG_THRESHOLD
"""Repeated here so that ``--help`` needs no import of the models (a test checks that they agree)."""

DESCRIPTION = ("Shortcut tests per checkpoint: attention knock-out, sum-preserving perturbation, identity run, "
               "positional offset (and position dependence), window test and attention diagnostics, with controls.")
HELP_JSON = """JSON (--json): every results row has checkpoint, label, seed, family, pos_encoding and test.
The perturbation tests share length, subtask (state|recall|all), effect, ci_low, ci_high (95%), ci_method,
applicable, reason, n_sequences, n_answers, and mostly baseline_acc and acc:
  attention_knockout: blocks ("0", "1", "all": whose gate is set to 0); effect = baseline_acc - acc, paired
    bootstrap over sequences. N/A for a model without attention.
  sum_preserving: k (span: both moved numbers in the last k positions before the last state answer); effect =
    fraction of those answers that change (Wilson interval: one answer per sequence), flagged (ci_low > 0.02),
    changed_if_right / n_right (among the answers that were right), n_skipped (fewer than two numbers).
  identity_run: run (r zeros), head (stream positions before the run: 0 or 5), where (inside|after),
    length = L_train + r; effect = baseline_acc (same sequences without the run) - acc, paired bootstrap;
    flagged (ci_low > 0.02).
  positional_offset: method (index: positional code shifted; pad: k zeros before the stream), offset k, at
    L_train, answers whose moved position stays below L_train; effect = drop, norm_drop = drop / (baseline -
    chance). index is N/A without a positional code.
  offset_score: method, subtask; effect = mean norm_drop over offsets (all: over learned subtasks), bootstrap CI,
    flagged (effect > --threshold).
  position_dependence: perturbation (random|permute); drop at L_train (not scored: it also destroys legitimate
    use of position). N/A without a positional code.
  window: k, acc_old, acc_new, agree_old, p_label_same, chance, retained, n, mean_resampled;
  window_score: effect (1 - mean retained), windowed (> 0.5);
  head / entropy: attention statistics per head (probe.attention); N/A without attention;
  run_time: seconds of analyze() for the checkpoint;
  *_pooled (labels with several checkpoints): effect averaged over them, Student-t CI over seeds.
controls rows: checkpoint, control, kind (instrument: each checks a test on an oracle or an identity), value,
expected, passed."""


@dataclass
class ShortcutOptions(CheckpointOptions):
    lengths: list[int] | None = lengths_option("1x-4x L_train")
    samples: int = samples_option(256, "sequences per length (at least 2: an interval needs two)",
                                  aliases=["--sequences"])
    sum_ks: list[int] | None = option(None, "sum-preserving spans k (default " + ",".join(map(str, DEFAULT_KS)) + ")",
                                      type=int_list(2))
    runs: list[int] | None = option(None, "identity-run lengths r (default " + ",".join(map(str, DEFAULT_RUNS)) + ")",
                                    type=int_list(1))
    offsets: list[int] | None = option(None, "position offsets k in [1, L_train) (default 1,L/5,L/2)",
                                       type=int_list(1))
    window_ks: list[int] | None = option(None, "window test k values (default 0,2,8,16,... < L-1)", type=int_list(0))
    window_length: int | None = option(None, "stream length of the window test (L_train)", type=positive_int)
    window_samples: int = option(256, "sequences for the window test (256)", type=positive_int)
    entropy_lengths: list[int] | None = option(None, "lengths for entropy vs length, in the --lengths grammar "
                                                     "(L/2,L,2L,3L,4L)", type=lengths_arg)
    threshold: float = option(FLAG_THRESHOLD, f"flag when the offset score exceeds this (default {FLAG_THRESHOLD})",
                              type=positive_float)


def _lengths_used(task: Any, opts: ShortcutOptions) -> list[int]:
    """Every stream length the tests will run at, for the memory check before any work."""
    from probe.core.lengths import multiples

    L = task.train_length
    runs = opts.runs or DEFAULT_RUNS
    return [*(opts.lengths or multiples(L)), *(opts.entropy_lengths or [4 * L]), opts.window_length or L,
            L + max(runs), 2 * L]


def run(opts: ShortcutOptions) -> Report:
    import pandas as pd

    from probe.attention import attention_controls
    from probe.checkpoint import load_checkpoint, resolve_checkpoints
    from probe.core.progress import note
    from probe.core.rows import control_line, labelled
    from probe.memory import check_lengths
    from probe.shortcuts.plots import report_figures
    from probe.shortcuts.report import analyze, drops_table, effects_table, pooled_rows, report_rows, summary_table
    from probe.wrapped import refuse_wrapped

    if opts.samples < 2:
        raise ProbeError("--samples must be at least 2 (an interval needs two)")
    device = resolve_device(opts.device)
    paths = resolve_checkpoints(opts.checkpoints)
    ckpts = [load_checkpoint(p) for p in paths]  # every file and length is checked before any work
    for path, ckpt in zip(paths, ckpts, strict=True):
        refuse_wrapped(str(path), ckpt.model_config, "probe's attention patterns and positional embedding")
        check_lengths(ckpt.model_config, ckpt.task_config, _lengths_used(ckpt.task_config, opts), device,
                      name=str(path))
    kw = dict(n_sequences=opts.samples, lengths=opts.lengths, sum_ks=opts.sum_ks or DEFAULT_KS,
              runs=opts.runs or DEFAULT_RUNS, offsets=opts.offsets, window_ks=opts.window_ks,
              window_length=opts.window_length, window_samples=opts.window_samples,
              entropy_lengths=opts.entropy_lengths, threshold=opts.threshold)
    reports = []
    for path, ckpt in zip(paths, ckpts, strict=True):
        note(f"analysing {path} ...", opts.progress)
        reports.append(analyze(ckpt, device, opts.seed, progress=opts.progress, **kw))
    rows = [row for r in reports for row in report_rows(r)] + pooled_rows(reports)
    controls = [{"checkpoint": r.checkpoint, **c} for r in reports for c in r.controls]
    controls += [{"checkpoint": "synthetic patterns", **c} for c in attention_controls()]
    # every shortcut row checks the instrument: an oracle built to take (or not take) the shortcut, an identity
    # perturbation, the gates left as found; the tests themselves are the experiments on the checkpoint
    controls = labelled(controls, {})
    for c in controls:  # what a failure of any of them means, said once here (each is an instrument check)
        c.setdefault("what", "an instrument check on an oracle, an identity or the gates: a fail means the test "
                             "itself is broken, not that the model takes or avoids a shortcut")
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_rows", 500):
        win = pd.DataFrame({r.label or r.checkpoint: {int(w.k): f"{w.acc_new:.2f} / {w.agree_old:.2f}"
                                                      for w in r.window.table.itertuples()}
                            for r in reports if r.window.applicable})
        text = ["\n" + summary_table(reports).to_string(index=False),
                "\neffect [95% CI] by length (knock-out, identity run: accuracy drop; sum-preserving: fraction "
                "of answers changed; offset score: fraction of above-chance accuracy lost):",
                effects_table(reports).to_string(),
                "\nposition tests at L_train, accuracy drop (points, ± 95% CI half-width):",
                drops_table(reports).to_string(),
                "\nwindow test, accuracy on new labels / agreement with old predictions, by k:", win.to_string()]
    failed = [c for c in controls if not c["passed"]]
    text.append(f"\ncontrols: {len(controls) - len(failed)}/{len(controls)} passed"
                + "".join(f"\n{control_line(c)} [{c['checkpoint']}]" for c in failed))
    return Report([str(p) for p in paths], rows, controls, "\n".join(text), dpi=150, save=_save,
                  figures=lambda: {f"{name}.png": fig for name, fig in report_figures(reports).items()})


COMMAND = Command("shortcuts", ShortcutOptions, run, DESCRIPTION, HELP_JSON)
main, build_parser = COMMAND.main, COMMAND.build_parser


def _save(out: Path, result: dict[str, Any]) -> list[str]:
    """CSV extracts of ``results.json``, one per kind of row, and of the controls."""
    import pandas as pd

    from probe.shortcuts.report import TESTS

    rows = pd.DataFrame(tidy(result["results"]))
    kinds = {"tests": [*TESTS, *(f"{t}_pooled" for t in TESTS), "run_time"], "window": ["window", "window_score"],
             "attention": ["head", "entropy"]}
    for name, tests in kinds.items():
        part = rows[rows.test.isin(tests)].dropna(axis=1, how="all")
        part.to_csv(out / f"{name}.csv", index=False, float_format="%.4f")
    pd.DataFrame(result["controls"]).to_csv(out / "controls.csv", index=False, float_format="%.4f")
    return [f"{name}.csv" for name in (*kinds, "controls")]
