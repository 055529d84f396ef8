"""``python -m probe.shortcuts``: parse arguments, run ``analyze`` per checkpoint, print tables or JSON, save."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd

from probe.attention import attention_controls
from probe.checkpoint import resolve_checkpoints
from probe.cli import add_common_args, envelope, resolve_device, run_cli, say, tidy
from probe.errors import ProbeError
from probe.shortcuts.plots import report_figures
from probe.shortcuts.positional import FLAG_THRESHOLD
from probe.shortcuts.report import TESTS, analyze, drops_table, effects_table, pooled_rows, report_rows, summary_table
from probe.shortcuts.runs import DEFAULT_RUNS
from probe.shortcuts.sums import DEFAULT_KS

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
controls rows: checkpoint, control, value, expected, passed."""


def _ints(spec: str | None, what: str, minimum: int = 0) -> list[int] | None:
    if spec is None:
        return None
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ProbeError(f"bad {what} {spec!r}: use a comma list of integers such as 1,5,12") from None
    if not out or min(out) < minimum:
        raise ProbeError(f"bad {what} {spec!r}: use integers >= {minimum}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probe.shortcuts", description=DESCRIPTION, epilog=HELP_JSON,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files, directories of *.pt, or globs")
    parser.add_argument("--sequences", type=int, default=256, help="sequences per length (default 256)")
    parser.add_argument("--lengths", default=None, help="stream lengths, comma list (default 1x-4x L_train)")
    parser.add_argument("--sum-ks", default=None, help="sum-preserving spans k (default "
                        + ",".join(map(str, DEFAULT_KS)) + ")")
    parser.add_argument("--runs", default=None, help="identity-run lengths r (default "
                        + ",".join(map(str, DEFAULT_RUNS)) + ")")
    parser.add_argument("--offsets", default=None, help="position offsets k in [1, L_train) (default 1,L/5,L/2)")
    parser.add_argument("--window-ks", default=None, help="window test k values (default 0,2,8,16,... < L-1)")
    parser.add_argument("--window-length", type=int, default=None, help="stream length of the window test (L_train)")
    parser.add_argument("--window-samples", type=int, default=256, help="sequences for the window test (256)")
    parser.add_argument("--entropy-lengths", default=None, help="lengths for entropy vs length (L/2,L,2L,3L,4L)")
    parser.add_argument("--threshold", type=float, default=FLAG_THRESHOLD,
                        help=f"flag when the offset score exceeds this (default {FLAG_THRESHOLD})")
    add_common_args(parser)

    def body(args: argparse.Namespace) -> dict[str, Any]:
        paths = resolve_checkpoints(args.checkpoints)
        device = resolve_device(args.device)
        if args.sequences < 2 or args.window_samples < 1:
            raise ProbeError("--sequences must be at least 2 (an interval needs two) and --window-samples positive")
        kw = dict(n_sequences=args.sequences, lengths=_ints(args.lengths, "--lengths", 1),
                  sum_ks=_ints(args.sum_ks, "--sum-ks", 2) or DEFAULT_KS, runs=_ints(args.runs, "--runs", 1)
                  or DEFAULT_RUNS, offsets=_ints(args.offsets, "--offsets", 1),
                  window_ks=_ints(args.window_ks, "--window-ks"), window_length=args.window_length,
                  window_samples=args.window_samples, entropy_lengths=_ints(args.entropy_lengths,
                                                                            "--entropy-lengths", 1),
                  threshold=args.threshold)
        reports = []
        for path in paths:
            say(args, f"analysing {path} ...")
            reports.append(analyze(path, device, args.seed, progress=not args.json, **kw))
        rows = [row for r in reports for row in report_rows(r)] + pooled_rows(reports)
        controls = [{"checkpoint": r.checkpoint, **c} for r in reports for c in r.controls]
        controls += [{"checkpoint": "synthetic patterns", **c} for c in attention_controls()]
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
            say(args, f"wrote shortcuts.json, tests.csv, window.csv, attention.csv, controls.csv and figures in "
                f"{args.out}")
        return result

    return run_cli(parser, body, argv)


def _save(out: Path, result: dict[str, Any], reports: list) -> None:
    """The JSON, CSV extracts of it (one per kind of row) and every figure."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "shortcuts.json").write_text(json.dumps(result, indent=1))
    rows = pd.DataFrame(tidy(result["results"]))
    kinds = {"tests": [*TESTS, *(f"{t}_pooled" for t in TESTS), "run_time"], "window": ["window", "window_score"],
             "attention": ["head", "entropy"]}
    for name, tests in kinds.items():
        part = rows[rows.test.isin(tests)].dropna(axis=1, how="all")
        part.to_csv(out / f"{name}.csv", index=False, float_format="%.4f")
    pd.DataFrame(result["controls"]).to_csv(out / "controls.csv", index=False, float_format="%.4f")
    import matplotlib.pyplot as plt

    for name, fig in report_figures(reports).items():
        fig.savefig(out / f"{name}.png", dpi=150)
        plt.close(fig)
