"""``python -m probe.sharpness``: parse arguments, run ``analyze`` per checkpoint, print tables or JSON, save."""

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
    make_parser,
    resolve_device,
    run_cli,
    say,
    seed_and_threads,
    write_outputs,
)
from probe.errors import ProbeError

SCALES = ("none", "log-length")  # = probe.sharpness.measure.SCALES, repeated so that --help imports no model
DESCRIPTION = ("Softmax sharpness: per recall query, the attention mass each head puts on the queried key and on "
               "its value vs length, with the dilution reference e^Δ / (e^Δ + n − 1) (Δ: the head's logit gap at "
               "L_train) and recall accuracy; --scale log-length adds the same with log-length logit scaling.")
HELP_JSON = """JSON (--json): results rows have checkpoint, label, seed, train_length, length, scale (none|log-length)
and metric:
  attention_mass: layer, head, target (key|value: the queried key's prefix position, or its value's), mass (mean
    over recall queries), ci_low, ci_high (95% bootstrap over sequences), wrong_mass (same role, next pair of the
    dictionary), gap (mean logit gap of the target over the query's other keys, from hook_attn_scores, after any
    scaling), delta (the gap at L_train), reference (mean over queries of e^delta / (e^delta + n - 1), n = keys the
    query sees, prefix included), uniform_mass (mean 1/n), n_queries, n_sequences, mean_keys;
  accuracy: subtask (state|recall|all), token_acc, seq_acc, n_tokens (probe.evaluate on the same sequences).
controls rows: checkpoint, control, kind, passed, value and what was compared:
  known_attention (instrument): scores overwritten with a known gap on each query's value; mass and gap must come
    back within 1e-5;
  reinit_attention (control): the recall head's mass at L_train must exceed the best head of the same model with
    re-initialised attention (interval above, and 2x);
  wrong_pair (control): the recall head's mass must exceed 2x its mass on the next pair of the dictionary.
A model without attention, or a task without a dictionary, gives one line (notes) and no rows."""


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("python -m probe.sharpness", DESCRIPTION, HELP_JSON)
    add_checkpoints(parser)
    add_lengths(parser, "1x,4x,8x,16x L_train")
    add_samples(parser, 64)
    parser.add_argument("--scale", choices=SCALES, default="none",
                        help="log-length: also evaluate with the logits at a query that sees n keys multiplied by "
                             "max(1, log n / log n_train), n_train = prefix + L_train (default none)")
    add_threads(parser, default=1)
    add_common_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    def body(args: argparse.Namespace) -> dict[str, Any]:
        import pandas as pd

        from probe.checkpoint import load_checkpoint, resolve_checkpoints
        from probe.core.lengths import multiples
        from probe.memory import check_lengths
        from probe.sharpness.measure import not_applicable
        from probe.sharpness.plots import plot_mass
        from probe.sharpness.report import analyze, summary_table

        seed_and_threads(args)
        device = resolve_device(args.device)
        paths = resolve_checkpoints(args.checkpoints)
        ckpts = [load_checkpoint(p) for p in paths]
        for path, ckpt in zip(paths, ckpts, strict=True):  # every file and length before any work
            task = ckpt.task_config
            if args.scale != "none" and ckpt.model_config.attn_scale == "ssmax":
                raise ProbeError(f"{path}: trained with attn_scale=ssmax; --scale {args.scale} applies to models "
                                 "trained without a logit scale")
            if not_applicable(ckpt.model_config, task) is None:
                lengths = args.lengths or multiples(task.train_length, (1, 4, 8, 16))
                check_lengths(ckpt.model_config, task, [*lengths, task.train_length], device, name=str(path))
        scales = ("none",) if args.scale == "none" else ("none", args.scale)
        results = []
        for ckpt in ckpts:
            r = analyze(ckpt, args.lengths, args.samples, args.seed, scales, device)
            if r.note:
                say(args, f"{r.checkpoint}: {r.note}")
            results.append(r)
        mass = pd.concat([r.mass for r in results], ignore_index=True)
        acc = pd.concat([r.accuracy for r in results], ignore_index=True)
        if not mass.empty:
            with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 200):
                say(args, summary_table(mass, acc).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        controls = [c for r in results for c in r.controls]
        for c in controls:
            say(args, f"{c['checkpoint']}: {c['control']} ({c['kind']}): {'passed' if c['passed'] else 'FAILED'}")
        rows = ([{**r, "metric": "attention_mass"} for r in mass.to_dict("records")]
                + [{**r, "metric": "accuracy"} for r in acc.to_dict("records")])
        result = envelope("sharpness", [str(p) for p in paths], rows, controls,
                          notes=[f"{r.checkpoint}: {r.note}" for r in results if r.note])
        if args.out:
            write_outputs(args.out, result, {"sharpness.png": plot_mass(mass, acc)}, dpi=150)
            say(args, f"wrote {Path(args.out) / 'results.json'} and {Path(args.out) / 'sharpness.png'}")
        if not results:
            raise ProbeError("no checkpoints to analyse")
        return result

    return run_cli(build_parser(), body, argv)
