"""``python -m probe.sharpness``: the options, and a run that measures every checkpoint into one report."""

from __future__ import annotations

from dataclasses import dataclass

from probe.cli import resolve_device
from probe.core.rows import control_line
from probe.errors import ProbeError
from probe.runner import CheckpointOptions, Command, Report, lengths_option, option, samples_option, threads_option

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
Wrapped and bridged models (probe.wrap, a bridge-* preset) are read through each attention module's hook_attn_scores
and hook_pattern, where it has them (TransformerLens's bridge: blocks.{i}.attn), with --scale none only.
A model without attention, or whose attention exposes no scores and pattern (a bridged Nemotron-H's), or a task
without a dictionary, is refused in one line (exit code 2) before any work."""


@dataclass
class SharpnessOptions(CheckpointOptions):
    lengths: list[int] | None = lengths_option("1x,4x,8x,16x L_train")
    samples: int = samples_option(64)
    scale: str = option("none", "log-length: also evaluate with the logits at a query that sees n keys multiplied by "
                                "max(1, log n / log n_train), n_train = prefix + L_train (default none)",
                        choices=SCALES)
    threads: int = threads_option(1)


def run(opts: SharpnessOptions) -> Report:
    import pandas as pd

    from probe.checkpoint import load_checkpoint, resolve_checkpoints
    from probe.core.lengths import multiples
    from probe.core.progress import progress_iter
    from probe.memory import check_lengths
    from probe.models import ModelConfig
    from probe.sharpness.measure import attention_hooks, not_applicable
    from probe.sharpness.plots import plot_mass
    from probe.sharpness.report import analyze, summary_table

    device = resolve_device(opts.device)
    paths = resolve_checkpoints(opts.checkpoints)
    ckpts = [load_checkpoint(p) for p in paths]
    for path, ckpt in zip(paths, ckpts, strict=True):  # every file and length before any work
        task, cfg = ckpt.task_config, ckpt.model_config
        own = isinstance(cfg, ModelConfig)
        if opts.scale != "none" and not own:
            raise ProbeError(f"{path}: --scale {opts.scale} sets the logit scale of probe's own attention layers; a "
                             "wrapped or bridged model's attention has none to set (run it with --scale none)")
        if opts.scale != "none" and cfg.attn_scale == "ssmax":
            raise ProbeError(f"{path}: trained with attn_scale=ssmax; --scale {opts.scale} applies to models "
                             "trained without a logit scale")
        why = not_applicable(cfg, task)
        if why:
            raise ProbeError(f"{path}: this analysis does not apply to this checkpoint "
                             f"({why.removeprefix('not applicable: ')})")
        if not own:  # a wrapped model names its attention modules only once built: do they expose scores?
            try:
                attention_hooks(ckpt.build_model("cpu"))
            except ProbeError as e:
                raise ProbeError(f"{path}: this analysis does not apply to this checkpoint ({e})") from None
        lengths = opts.lengths or multiples(task.train_length, (1, 4, 8, 16))
        check_lengths(ckpt.model_config, task, [*lengths, task.train_length], device, name=str(path))
    if not ckpts:
        raise ProbeError("no checkpoints to analyse")
    scales = ("none",) if opts.scale == "none" else ("none", opts.scale)
    results = [analyze(ckpt, opts.lengths, opts.samples, opts.seed, scales, device, progress=opts.progress)
               for ckpt in progress_iter(ckpts, "checkpoints", opts.progress and len(ckpts) > 1)]
    text = []
    mass = pd.concat([r.mass for r in results], ignore_index=True)
    acc = pd.concat([r.accuracy for r in results], ignore_index=True)
    if not mass.empty:
        with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 200):
            text.append(summary_table(mass, acc).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    controls = [c for r in results for c in r.controls]
    text += ["controls (every row is in the JSON):"] + [f"{control_line(c)} [{c['checkpoint']}]" for c in controls]
    rows = ([{**r, "metric": "attention_mass"} for r in mass.to_dict("records")]
            + [{**r, "metric": "accuracy"} for r in acc.to_dict("records")])
    return Report([str(p) for p in paths], rows, controls, "\n".join(text),
                  figures=lambda: {"sharpness.png": plot_mass(mass, acc)}, dpi=150)


COMMAND = Command("sharpness", SharpnessOptions, run, DESCRIPTION, HELP_JSON)
main, build_parser = COMMAND.main, COMMAND.build_parser
