"""``python -m probe.shortcuts``: parse arguments, run ``analyze`` per checkpoint, print tables or JSON, save."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from probe.cli import (
    add_checkpoints,
    add_common_args,
    add_lengths,
    add_samples,
    add_threads,
    envelope,
    int_list,
    lengths_arg,
    make_parser,
    positive_float,
    positive_int,
    resolve_device,
    run_cli,
    say,
    seed_and_threads,
    tidy,
    write_outputs,
)
from probe.errors import ProbeError

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


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("python -m probe.shortcuts", DESCRIPTION, HELP_JSON)
    add_checkpoints(parser)
    add_lengths(parser, "1x-4x L_train")
    add_samples(parser, 256, "sequences per length (at least 2: an interval needs two)", aliases=["--sequences"])
    parser.add_argument("--sum-ks", type=int_list(2), default=None,
                        help="sum-preserving spans k (default " + ",".join(map(str, DEFAULT_KS)) + ")")
    parser.add_argument("--runs", type=int_list(1), default=None,
                        help="identity-run lengths r (default " + ",".join(map(str, DEFAULT_RUNS)) + ")")
    parser.add_argument("--offsets", type=int_list(1), default=None,
                        help="position offsets k in [1, L_train) (default 1,L/5,L/2)")
    parser.add_argument("--window-ks", type=int_list(0), default=None,
                        help="window test k values (default 0,2,8,16,... < L-1)")
    parser.add_argument("--window-length", type=positive_int, default=None,
                        help="stream length of the window test (L_train)")
    parser.add_argument("--window-samples", type=positive_int, default=256,
                        help="sequences for the window test (256)")
    parser.add_argument("--entropy-lengths", type=lengths_arg, default=None,
                        help="lengths for entropy vs length, in the --lengths grammar (L/2,L,2L,3L,4L)")
    parser.add_argument("--threshold", type=positive_float, default=FLAG_THRESHOLD,
                        help=f"flag when the offset score exceeds this (default {FLAG_THRESHOLD})")
    add_threads(parser)
    add_common_args(parser)
    return parser


def _lengths_used(task: Any, args: argparse.Namespace) -> list[int]:
    """Every stream length the tests will run at, for the memory check before any work."""
    from probe.core.lengths import multiples

    L = task.train_length
    runs = args.runs or DEFAULT_RUNS
    return [*(args.lengths or multiples(L)), *(args.entropy_lengths or [4 * L]), args.window_length or L,
            L + max(runs), 2 * L]


def main(argv: list[str] | None = None) -> int:
    def body(args: argparse.Namespace) -> dict[str, Any]:
        import pandas as pd

        from probe.attention import attention_controls
        from probe.checkpoint import load_checkpoint, resolve_checkpoints
        from probe.core.rows import labelled
        from probe.memory import check_lengths
        from probe.shortcuts.report import (
            analyze,
            drops_table,
            effects_table,
            pooled_rows,
            report_rows,
            summary_table,
        )

        if args.samples < 2:
            raise ProbeError("--samples must be at least 2 (an interval needs two)")
        seed_and_threads(args)
        device = resolve_device(args.device)
        paths = resolve_checkpoints(args.checkpoints)
        ckpts = [load_checkpoint(p) for p in paths]  # every file and length is checked before any work
        for path, ckpt in zip(paths, ckpts, strict=True):
            check_lengths(ckpt.model_config, ckpt.task_config, _lengths_used(ckpt.task_config, args), device,
                          name=str(path))
        kw = dict(n_sequences=args.samples, lengths=args.lengths, sum_ks=args.sum_ks or DEFAULT_KS,
                  runs=args.runs or DEFAULT_RUNS, offsets=args.offsets, window_ks=args.window_ks,
                  window_length=args.window_length, window_samples=args.window_samples,
                  entropy_lengths=args.entropy_lengths, threshold=args.threshold)
        reports = []
        for path, ckpt in zip(paths, ckpts, strict=True):
            say(args, f"analysing {path} ...")
            reports.append(analyze(ckpt, device, args.seed, progress=not args.json, **kw))
        rows = [row for r in reports for row in report_rows(r)] + pooled_rows(reports)
        controls = [{"checkpoint": r.checkpoint, **c} for r in reports for c in r.controls]
        controls += [{"checkpoint": "synthetic patterns", **c} for c in attention_controls()]
        # every shortcut row checks the instrument: an oracle built to take (or not take) the shortcut, an identity
        # perturbation, the gates left as found; the tests themselves are the experiments on the checkpoint
        controls = labelled(controls, {})
        with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_rows", 500):
            say(args, "\n" + summary_table(reports).to_string(index=False))
            say(args, "\neffect [95% CI] by length (knock-out, identity run: accuracy drop; sum-preserving: fraction "
                "of answers changed; offset score: fraction of above-chance accuracy lost):")
            say(args, effects_table(reports).to_string())
            say(args, "\nposition tests at L_train, accuracy drop (points, ± 95% CI half-width):")
            say(args, drops_table(reports).to_string())
            win = pd.DataFrame({r.label or r.checkpoint: {int(w.k): f"{w.acc_new:.2f} / {w.agree_old:.2f}"
                                                          for w in r.window.table.itertuples()}
                                for r in reports if r.window.applicable})
            say(args, "\nwindow test, accuracy on new labels / agreement with old predictions, by k:")
            say(args, win.to_string())
        failed = [c for c in controls if not c["passed"]]
        say(args, f"\ncontrols: {len(controls) - len(failed)}/{len(controls)} passed"
            + "".join(f"\n  FAILED {c['checkpoint']}: {c['control']} = {c['value']} (expected {c['expected']})"
                      for c in failed))
        result = envelope("shortcuts", [str(p) for p in paths], rows, controls)
        if args.out:
            _save(Path(args.out), result, reports)
            say(args, f"wrote results.json, tests.csv, window.csv, attention.csv, controls.csv and figures in "
                f"{args.out}")
        return result

    return run_cli(build_parser(), body, argv)


def _save(out: Path, result: dict[str, Any], reports: list) -> None:
    """``results.json``, CSV extracts of it (one per kind of row) and every figure."""
    import pandas as pd

    from probe.shortcuts.plots import report_figures
    from probe.shortcuts.report import TESTS

    write_outputs(out, result, {f"{name}.png": fig for name, fig in report_figures(reports).items()}, dpi=150)
    rows = pd.DataFrame(tidy(result["results"]))
    kinds = {"tests": [*TESTS, *(f"{t}_pooled" for t in TESTS), "run_time"], "window": ["window", "window_score"],
             "attention": ["head", "entropy"]}
    for name, tests in kinds.items():
        part = rows[rows.test.isin(tests)].dropna(axis=1, how="all")
        part.to_csv(out / f"{name}.csv", index=False, float_format="%.4f")
    pd.DataFrame(result["controls"]).to_csv(out / "controls.csv", index=False, float_format="%.4f")
