"""Accuracy-vs-length curves per subtask, sequence accuracy, and the length-generalization score.

Usage: ``python -m probe.evaluate ckpt.pt [more.pt ...] [--lengths 1:100] [--json] [--out DIR]``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from probe import hardware
from probe.cli import envelope, positive_int, resolve_device
from probe.core.chance import chance
from probe.core.inputs import check_inputs
from probe.core.lengths import FACTORS, multiples, parse_lengths, stepped, up_to
from probe.core.meta import variant_name
from probe.core.progress import note, progress_bar, progress_iter
from probe.core.rows import CONTROL, check_row, control_line
from probe.core.stats import SOLVED, fraction_above
from probe.errors import ProbeError
from probe.memory import PeakMemory, Plan, check_lengths, fit_batch_size, plan_lengths
from probe.runner import CheckpointOptions, Command, Report, lengths_option, option, samples_option
from probe.tasks import SUBTASKS, TaskConfig
from probe.windows import accuracy_at_length, eval_seed, evaluate, factor_subtask, state_factors, windows_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from probe.models import HookedSequenceModel

__all__ = ["accuracy_at_length", "check_lengths", "eval_seed", "evaluate", "evaluate_checkpoints", "lengthgen_score",
           "factor_subtask", "length_curve", "main", "multiples", "parse_lengths", "plot_length_curves", "scores",
           "solved_table", "state_factors", "summary_table", "evaluate_windows", "windows_summary"]

def length_curve(
    model: HookedSequenceModel, task: TaskConfig, lengths: Iterable[int], n_samples: int = 256,
    batch_size: int = 256, seed: int = 0, progress: bool = False, desc: str = "lengths", factors: bool = False,
    longest_first: bool = True,
) -> pd.DataFrame:
    """One row per (length, subtask): ``length, subtask, token_acc, seq_acc, n_tokens``.

    Each length's forward passes use the largest sub-batch that fits in memory (``probe.memory``); a length at
    which not even one sequence fits raises ``ProbeError`` before anything runs. The rows come in the order of
    ``lengths``; the lengths run longest first (each length's sequences are drawn from its own seed, so the order
    changes no number). Longest first because in ascending order every length's tensors are a little larger than
    the ones just freed: glibc's allocator then keeps the freed blocks and takes new ones, and the resident set of
    ``--lengths 1:400`` at 16 sequences a length grew by 3.3 GB (a 2-block hybrid), against 0.3 GB longest first
    (``benchmarks/evaluate_memory.py --order``)."""
    check_inputs("probe.evaluate.length_curve", forward=model, task=task)
    lengths = list(lengths)
    device = next(model.parameters()).device
    check_lengths(model.cfg, task, lengths, device)  # before any work
    by_length: dict[int, list[dict[str, Any]]] = {}
    order = sorted(set(lengths), reverse=longest_first)
    # the bar counts sequence positions, not lengths: longest first, a bar of lengths would extrapolate the
    # longest one's time to every other (it once estimated 2 h 50 min for a 21-minute run)
    bar = progress_bar(sum(n_samples * (task.prefix_len + n) for n in order), desc, progress, unit="pos",
                       leave=False, unit_scale=True)
    for length in order:
        fits = fit_batch_size(model.cfg, length, batch_size, device, prefix=task.prefix_len)
        by_length[length] = [{"length": length, "subtask": subtask, **acc} for subtask, acc in accuracy_at_length(
            model, task, length, n_samples, batch_size, seed, forward_batch=fits, factors=factors).items()]
        bar.update(n_samples * (task.prefix_len + length))
    bar.close()
    return pd.DataFrame([row for length in dict.fromkeys(lengths) for row in by_length[length]])


def lengthgen_score(curve: pd.DataFrame, train_length: int, factor: int = 3) -> dict[str, float]:
    """Mean token accuracy over lengths in (L_train, factor * L_train] per subtask (Delétang et al.'s protocol)."""
    beyond = curve[(curve.length > train_length) & (curve.length <= factor * train_length)]
    return {s: float(g.token_acc.mean()) for s, g in beyond.groupby("subtask")}


# --- results over checkpoints ------------------------------------------------------------------------------
def evaluate_checkpoints(paths: Sequence[str | Path], lengths: Sequence[int] | None = None, n_samples: int = 256,
                         batch_size: int = 256, seed: int = 0, device: torch.device | str = "cpu",
                         progress: bool = False, factors: bool = False,
                         default: Callable[[int], list[int]] = up_to) -> pd.DataFrame:
    """Tidy curve of every checkpoint: ``checkpoint, label, seed, length, subtask, token_acc, seq_acc, n_tokens``.

    Default lengths: ``default(L_train)`` of each checkpoint's task (1 .. 4 x L_train). ``factors``: also
    ``state_mod{q}`` rows (see ``accuracy_at_length``).
    """
    check_inputs("probe.evaluate.evaluate_checkpoints", paths=paths)
    if n_samples < 1 or batch_size < 1:
        raise ProbeError(f"n_samples={n_samples}, batch_size={batch_size}: both must be at least 1")
    # every file and every length is checked before any evaluation runs, so a bad one costs no time
    from probe.checkpoint import load_checkpoint

    ckpts = [load_checkpoint(path) for path in paths]
    plans = [list(lengths) if lengths else default(c.task_config.train_length) for c in ckpts]
    for ckpt, lens in zip(ckpts, plans, strict=True):
        check_lengths(ckpt.model_config, ckpt.task_config, lens, device, name=str(ckpt.path or ckpt.name))
    frames = []
    for path, ckpt, lens in zip(paths, ckpts, plans, strict=True):
        model = ckpt.build_model(device)
        curve = length_curve(model, ckpt.task_config, lens, n_samples, batch_size, seed, progress,
                             desc=f"{variant_name(ckpt)} ({ckpt.name})", factors=factors)
        curve.insert(0, "checkpoint", str(path))
        curve.insert(1, "label", variant_name(ckpt))
        curve.insert(2, "seed", ckpt.seed)
        curve["train_length"] = ckpt.task_config.train_length
        for key, value in _trained_as(ckpt).items():
            curve[key] = value
        frames.append(curve)
    return pd.concat(frames, ignore_index=True)


def _trained_as(ckpt: Any) -> dict[str, Any]:
    """How a checkpoint was trained, so that a table mixing precisions or devices says so (older checkpoints:
    fp32, default AdamW, device not recorded; a model as its factory builds it, never trained: all None)."""
    if not ckpt.train_config:
        return {"precision": None, "optimizer_impl": None, "trained_on": None}
    train = ckpt.train_config
    precision, device = hardware.trained_as(ckpt.extra)
    return {"precision": precision or train.get("precision", "fp32"),
            "optimizer_impl": train.get("optimizer_impl", "default"), "trained_on": device}


def evaluate_windows(paths: Sequence[str | Path], max_length: int | None = None, n_samples: int = 256,
                     batch_size: int = 256, seed: int = 0, device: torch.device | str = "cpu",
                     progress: bool = False) -> pd.DataFrame:
    """The metric of record (``probe.windows``) of every checkpoint: one row per window of stream positions and
    subtask (``state``, ``recall``, and ``state_mod{q}`` per factor q of the modulus), measured on ``n_samples``
    sequences of ``max_length`` (default 16 x L_train of each checkpoint): ``checkpoint, label, seed, train_length,
    evaluated_length, window, lo, hi, beyond, subtask, token_acc, seq_acc, n_tokens, chance, above_chance_by,
    precision, optimizer_impl, trained_on``."""
    check_inputs("probe.evaluate.evaluate_windows", paths=paths)
    from probe.checkpoint import load_checkpoint

    ckpts = [load_checkpoint(path) for path in paths]
    plans = [max_length or 16 * c.task_config.train_length for c in ckpts]
    for ckpt, length in zip(ckpts, plans, strict=True):
        check_lengths(ckpt.model_config, ckpt.task_config, [length], device, name=str(ckpt.path or ckpt.name))
    frames = []
    for path, ckpt, length in progress_iter(list(zip(paths, ckpts, plans, strict=True)), "windows", progress):
        model = ckpt.build_model(device)
        fits = fit_batch_size(model.cfg, length, batch_size, device, prefix=ckpt.task_config.prefix_len)
        table = windows_of(model, ckpt.task_config, ckpt.task_config.train_length, length, n_samples, seed,
                           batch_size, forward_batch=fits)
        head = {"checkpoint": str(path), "label": variant_name(ckpt), "seed": ckpt.seed,
                "train_length": ckpt.task_config.train_length, "evaluated_length": length}
        frames.append(table.assign(**head, **_trained_as(ckpt))[[*head, *table.columns, "precision",
                                                                   "optimizer_impl", "trained_on"]])
    return pd.concat(frames, ignore_index=True)


def n_seeds(rows: pd.DataFrame) -> int:
    """Seeds among ``rows``: each distinct seed, and each checkpoint that records none (a factory's fresh model) as
    one of its own, so that a table of one such model does not say 0 seeds."""
    return int(rows.seed.dropna().nunique() + rows.checkpoint[rows.seed.isna()].nunique())


def trained_as_text(precision: Any, optimizer_impl: Any) -> str:
    """How a checkpoint was trained, in words for the CLI's first lines."""
    if precision is None or precision != precision:
        return "never trained (no training record: the model as its factory builds it)"
    return f"trained in {precision} (AdamW {optimizer_impl})"


def windows_summary(windows: pd.DataFrame, subtasks: Sequence[str] | None = None) -> pd.DataFrame:
    """Token accuracy (percent) per label, subtask and window: mean over seeds, the lowest seed, and the chance
    floor, as a wide table (one column per window) for a terminal or a report."""
    data = windows if subtasks is None else windows[windows.subtask.isin(subtasks)]
    rows: list[dict[str, Any]] = []
    for (label, subtask), g in data.groupby(["label", "subtask"], sort=False):
        row: dict[str, Any] = {"label": label, "subtask": subtask, "seeds": n_seeds(g),
                               "chance": f"{100 * g.chance.iloc[0]:.1f}"}
        for name, w in g.groupby("window", sort=False):
            acc = w.token_acc.dropna()
            row[name] = (f"{100 * acc.mean():.1f}" + (f" (min {100 * acc.min():.1f})" if len(acc) > 1 else "")
                         if len(acc) else "—")
        rows.append(row)
    return pd.DataFrame(rows)


def scores(curves: pd.DataFrame) -> pd.DataFrame:
    """Length-generalization score per checkpoint and subtask: ``checkpoint, label, seed, subtask, lengthgen_score``."""
    rows = []
    for (path, label, seed, lt), curve in curves.groupby(["checkpoint", "label", "seed", "train_length"],
                                                         dropna=False):
        for subtask, value in lengthgen_score(curve, int(lt)).items():
            rows.append({"checkpoint": path, "label": label, "seed": seed, "subtask": subtask,
                         "lengthgen_score": value})
    return pd.DataFrame(rows)


SHOWN_LENGTHS = 8
"""Evaluated lengths that are not multiples of L_train get a column of their own when there are at most this many."""


def _spread(values: pd.Series) -> str:
    """``mean ± SD`` in percent over seeds; the mean alone for one seed (a "± 0.0" would claim a spread it cannot
    know)."""
    if len(values) < 2:
        return f"{100 * values.mean():.1f}"
    return f"{100 * values.mean():.1f} ± {100 * values.std(ddof=1):.1f}"


def summary_table(curves: pd.DataFrame, factors: Sequence[int] = FACTORS) -> pd.DataFrame:
    """Mean ± sample standard deviation over seeds of token accuracy (percent; the mean alone for one seed, which has
    no spread to show), per label and subtask: averaged over the
    in-distribution lengths (``1..1x``, the lengths evaluated up to L_train), at k x L_train for each of ``factors``
    that was evaluated (1x-4x, 8x, 16x: the sweep's report's lengths), at each other evaluated length when there are
    few (``L=30``), and the length-generalization score (where a length in (L_train, 3 L_train] was evaluated)."""
    rows = []
    multiple = curves.length % curves.train_length == 0
    others = sorted(set(curves.length[~multiple].astype(int)))
    shown = others if len(others) <= SHOWN_LENGTHS else []
    for (label, subtask), g in curves.groupby(["label", "subtask"]):
        row: dict[str, Any] = {"label": label, "subtask": subtask, "seeds": n_seeds(g)}
        inside = g[g.length <= g.train_length].groupby("seed").token_acc.mean()
        if len(inside):
            row["1..1x"] = _spread(inside)
        for f in factors:
            at = g[g.length == f * g.train_length]
            if len(at):
                row[f"{f}x"] = _spread(at.token_acc)
        for length in shown:
            at = g[g.length == length]
            if len(at):
                row[f"L={length}"] = _spread(at.token_acc)
        sc = scores(g)
        if len(sc) and sc.lengthgen_score.notna().any():
            row["score"] = f"{100 * sc.lengthgen_score.mean():.1f}"
        rows.append(row)
    return pd.DataFrame(rows)


def solved_table(curves: pd.DataFrame, threshold: float = SOLVED, factors: Sequence[int] = FACTORS) -> pd.DataFrame:
    """Per label and subtask, at each of ``factors`` x L_train that was evaluated: how many seeds exceed
    ``threshold`` token accuracy (``3/3``, the sweep report's count) and the sequences with every answer right
    (exact match, percent, mean over seeds): ``3/3 · 74.6``. A mean token accuracy hides whether one seed failed
    or every seed slipped a little; these two say which."""
    rows = []
    for (label, subtask), g in curves.groupby(["label", "subtask"]):
        row: dict[str, Any] = {"label": label, "subtask": subtask}
        for f in factors:
            at = g[g.length == f * g.train_length]
            if len(at) and at.token_acc.notna().any():
                solved, n = fraction_above(at.token_acc.to_numpy(), threshold)
                row[f"{f}x"] = f"{solved}/{n} · {100 * at.seq_acc.mean():.1f}"
        rows.append(row)
    return pd.DataFrame(rows)


def plot_length_curves(curves: pd.DataFrame, subtasks: Sequence[str] = SUBTASKS) -> Figure:
    """Token accuracy vs length, one panel per subtask, one line per label (mean over seeds, band = min..max),
    the training range shaded."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    data = curves[curves.subtask.isin(subtasks)].dropna(subset=["token_acc"])
    fig, axes = plt.subplots(1, len(subtasks), figsize=(5 * len(subtasks), 3.6), sharey=True, squeeze=False)
    for ax, subtask in zip(axes[0], subtasks, strict=True):
        part = data[data.subtask == subtask]
        if part.empty:
            ax.set_title(f"{subtask}: not asked by this task")
            continue
        sns.lineplot(part, x="length", y="token_acc", hue="label", errorbar=("pi", 100), ax=ax)
        lt = int(part.train_length.max())
        ax.axvspan(1, lt, color="0.85", alpha=0.5, lw=0, label=f"training lengths (1–{lt})")
        ax.set(title=f"{subtask} subtask", xlabel="stream length L (tokens)", ylabel="token accuracy",
               ylim=(-0.02, 1.02))
        ax.legend(fontsize=7, loc="lower left")
    seeds = {label: n_seeds(g) for label, g in data.groupby("label")}
    fig.suptitle("Accuracy vs length (line: mean over seeds; band: min–max) — seeds per model: "
                 + ", ".join(f"{k} {v}" for k, v in seeds.items()), fontsize=8)
    fig.tight_layout()
    return fig


def window_rows(windows: pd.DataFrame) -> list[dict[str, Any]]:
    """``evaluate_windows``'s table as envelope rows: ``length`` null, ``metric`` "window"."""
    return [{**{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()},
             "length": None, "metric": "window"} for r in windows.to_dict("records")]


def evaluation_envelope(curves: pd.DataFrame, paths: Sequence[str | Path],
                        windows: pd.DataFrame | None = None) -> dict[str, Any]:
    """The ``--json`` object of ``evaluate_checkpoints(paths)``: length rows, length-generalization score rows,
    window rows (``evaluate_windows``, the metric of record) and chance controls (see ``--help``)."""
    rows = curves.drop(columns=["train_length"]).to_dict("records")
    rows += [{"checkpoint": r.checkpoint, "label": r.label, "seed": r.seed, "length": None,
              "subtask": r.subtask, "metric": "lengthgen_score", "token_acc": r.lengthgen_score,
              "seq_acc": None} for r in scores(curves).itertuples()]
    if windows is not None and len(windows):
        rows += window_rows(windows)
    from probe.checkpoint import load_checkpoint

    task = load_checkpoint(paths[0]).task_config
    inside = curves[curves.length <= curves.train_length]
    controls = []
    for subtask in ("state", "recall"):
        level = chance(task, subtask)
        accs = inside[inside.subtask == subtask].groupby("checkpoint").token_acc.mean().dropna()
        # the baseline a claim of learning must beat: every checkpoint above chance in the training range
        worst = float(accs.min()) if len(accs) else math.nan
        controls.append(check_row("chance", CONTROL, bool(len(accs)) and bool((accs > level).all()),
                                  subtask=subtask, token_acc=level, worst_in_range=worst, value=worst,
                                  threshold=level, passes_if=">",
                                  what="the lowest checkpoint's mean in-range accuracy against chance; a fail means "
                                       "a checkpoint has not learned this subtask in range (the model, not the tool)"))
    return envelope("evaluate", [str(p) for p in paths], rows, controls)


def memory_plan(paths: Sequence[str | Path], lengths: Sequence[int] | None = None, n_samples: int = 256,
                batch_size: int = 256, device: torch.device | str = "cpu",
                default: Callable[[int], list[int]] = up_to) -> Plan:
    """The largest activation peak that ``python -m probe.evaluate`` plans for over these checkpoints: the lengths of
    ``evaluate_checkpoints`` and the windows' length of ``evaluate_windows`` (the longest asked, else 16 x L_train:
    the costliest of the default run), at the sub-batches they pick (never more sequences than ``n_samples``); what
    the CLI reports beside the measured peak."""
    from probe.checkpoint import load_checkpoint

    plans = []
    for path in paths:
        ckpt = load_checkpoint(path)
        train_length = ckpt.task_config.train_length
        lens = list(lengths) if lengths else [*default(train_length), 16 * train_length]
        check_lengths(ckpt.model_config, ckpt.task_config, lens, device, name=str(ckpt.path or ckpt.name))
        plans.append(plan_lengths(ckpt.model_config, lens, min(batch_size, n_samples), device,
                                  prefix=ckpt.task_config.prefix_len))
    return max(plans, key=lambda p: p.bytes)


# --- the time it will take --------------------------------------------------------------------------------------
ESTIMATE_ABOVE_S = 30.0
"""An evaluation estimated to take longer than this says so, with its estimate, before it starts."""


@torch.no_grad()
def _forward_seconds(model: HookedSequenceModel, task: TaskConfig, length: int, batch: int) -> float:
    """Seconds of one forward pass of ``batch`` sequences of ``length`` (the second of two: the first warms up)."""
    tokens = task.sample(length, batch, 0).tokens.to(next(model.parameters()).device)
    model(tokens)
    t0 = time.perf_counter()
    model(tokens)
    return time.perf_counter() - t0


def estimate_seconds(model: HookedSequenceModel, task: TaskConfig, lengths: Sequence[int], n_samples: int,
                     batch_size: int, windows_at: int | None = None) -> float:
    """Seconds that ``length_curve`` over ``lengths`` (and ``windows_of`` at ``windows_at``) will take here, from
    forward passes timed on this machine at the run's own sub-batch: one at L_train, and when that predicts more
    than ``ESTIMATE_ABOVE_S``, one at the longest length, with a cost per pass linear in the positions through both
    (the chord of attention's quadratic part). The second pass costs one length's forward, under 1 % of a run that
    needs it."""
    batch = min(n_samples, batch_size)
    passes = math.ceil(n_samples / batch)
    plan = [task.prefix_len + n for n in (*lengths, *([windows_at] if windows_at else []))]
    n1 = task.prefix_len + task.train_length
    t1 = _forward_seconds(model, task, task.train_length, batch)
    guess = passes * sum(t1 * n / n1 for n in plan)
    n2 = max(plan)
    if guess <= ESTIMATE_ABOVE_S or n2 <= n1:
        return guess
    slope = (_forward_seconds(model, task, n2 - task.prefix_len, batch) - t1) / (n2 - n1)
    return passes * sum(max(t1 + slope * (n - n1), 0.0) for n in plan)


def _duration(seconds: float) -> str:
    return (f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400
            else f"{seconds / 3600:.1f} h")


def announce(paths: Sequence[str | Path], lengths: Sequence[int] | None, n_samples: int, batch_size: int,
             device: torch.device | str, default: Callable[[int], list[int]] = up_to) -> float:
    """Estimate the evaluation of ``paths`` (``estimate_seconds``) and, when it is long, say so in one line on
    stderr before it starts. Returns the estimate."""
    from probe.checkpoint import load_checkpoint

    total, n_lengths = 0.0, 0
    for path in paths:
        ckpt = load_checkpoint(path)
        task = ckpt.task_config
        lens = list(lengths) if lengths else default(task.train_length)
        n_lengths = max(n_lengths, len(lens))
        total += estimate_seconds(ckpt.build_model(device).eval(), task, lens, n_samples, batch_size,
                                  max(lengths) if lengths else 16 * task.train_length)
    if total > ESTIMATE_ABOVE_S:
        note(f"evaluating {len(paths)} checkpoint(s) x {n_lengths} lengths x {n_samples} sequences: about "
             f"{_duration(total)} on this machine (from forward passes timed here)")
    return total


# --- CLI ---------------------------------------------------------------------------------------------------
_HELP_JSON = """JSON (--json): results rows {checkpoint, label, seed, length, subtask (state|recall|all, and
state_mod{q} with --factors), token_acc, seq_acc, n_tokens, train_length, precision, optimizer_impl, trained_on (how
and where the checkpoint was trained)}, plus one row per checkpoint and subtask with length null, metric
"lengthgen_score" and its value in token_acc (mean token accuracy over the lengths evaluated in (L_train, 3
L_train]: every one with --every-length), plus the metric of record: rows with length null, metric "window", {window
("in range", "(1x, 2x]", ... "(16x, 32x]"), lo, hi (stream positions lo < t <= hi), beyond (every position past
L_train), subtask (state, recall, state_mod{q} for each prime-power factor q of the modulus), token_acc, seq_acc
(every answer in the window right), n_tokens, chance (1/m, 1/q, 1/n_values), above_chance_by, evaluated_length}:
accuracy at the positions of each whole window covered by the longest length evaluated, measured on sequences of
that length (the all-position mean at a length k x L_train mixes in-range positions in; claims are made from
windows); controls rows {control: "chance", subtask, token_acc, kind "control", passed, worst_in_range}: the
accuracy of guessing uniformly (state 1/m, recall 1/n_values); passed when every checkpoint's mean token accuracy
over lengths <= L_train beats it. memory {planned_bytes (the activations of the largest sub-batch at the costliest
length, the windows' included: probe.memory's estimate), planned_batch, planned_length, planned_note (what kind of
estimate, and how far off it was on benchmarks/evaluate_memory.py), available_bytes (free when planned),
measured_bytes (the peak growth of the process's memory during the evaluation), measured_by (how it was measured)}."""


def _note(text: str) -> None:
    print(text, file=sys.stderr)


@dataclass
class EvaluateOptions(CheckpointOptions):
    lengths: list[int] | None = lengths_option("every L_train/5-th length to 4x L_train, 5:100:5 for L_train 25, "
                                               "and the windows at 16x")
    samples: int = samples_option(256)
    every_length: bool = option(False, "every length 1..4x L_train (the score's protocol, as the study reports it) "
                                       "instead of every L_train/5-th: the same curve, about 3x the default run's "
                                       "time (benchmarks/cli_defaults.py)")
    batch_size: int = option(256, "sub-batch size, bounds memory (default 256)", type=positive_int)
    factors: bool = option(False, "also the state answers' accuracy modulo each prime-power factor q of the modulus "
                                  "(subtasks state_mod2, state_mod5 for m = 10): parity apart from the rest")


def run(opts: EvaluateOptions) -> Report:
    """The length curves, the windows of the metric of record and the memory they took, as one report."""
    from probe.checkpoint import resolve_checkpoints

    paths = resolve_checkpoints(opts.checkpoints, note=None if opts.json else _note)
    device = resolve_device(opts.device)
    default = up_to if opts.every_length else stepped
    plan = memory_plan(paths, opts.lengths, opts.samples, opts.batch_size, device, default)
    if opts.progress:
        announce(paths, opts.lengths, opts.samples, opts.batch_size, device, default)
    with PeakMemory(device) as peak:
        curves = evaluate_checkpoints(paths, opts.lengths, opts.samples, opts.batch_size, opts.seed, device,
                                      progress=opts.progress, factors=opts.factors, default=default)
        longest = int(opts.lengths and max(opts.lengths) or 0) or None
        windows = evaluate_windows(paths, longest, opts.samples, opts.batch_size, opts.seed, device,
                                   progress=opts.progress)
    text = [f"{r.checkpoint}: {r.label}, seed {r.seed}, {trained_as_text(r.precision, r.optimizer_impl)}"
            for r in curves.drop_duplicates("checkpoint").itertuples()]
    text.append(summary_table(curves).to_string(index=False))
    solved = solved_table(curves)
    if len(solved.columns) > 2:  # a multiple of L_train was evaluated
        text += [f"\nseeds above {100 * SOLVED:.0f} % token accuracy · sequences with every answer right (%, "
                 "mean over seeds):", solved.to_string(index=False)]
    if len(windows):
        text += ["\nthe metric of record: token accuracy (%) per window of stream positions, mean over "
                 "checkpoints (lowest), beside chance:", windows_summary(windows).to_string(index=False)]
    else:
        text.append("\nno whole window of positions to report: the longest length evaluated is below L_train")
    text.append(f"memory: planned about {plan.bytes / 2**20:.0f} MB of activations (sub-batches of {plan.batch} at "
                f"length {plan.length}; {plan.available / 2**30:.1f} GB free; {plan.note}), measured "
                f"{peak.bytes / 2**20:.0f} MB ({peak.method})")
    result = evaluation_envelope(curves, paths, windows)
    text += ["controls:", *(control_line(c) for c in result["controls"])]
    memory = {"planned_bytes": plan.bytes, "planned_batch": plan.batch, "planned_length": plan.length,
              "planned_note": plan.note, "available_bytes": plan.available, "measured_bytes": peak.bytes,
              "measured_by": peak.method}
    return Report(result["checkpoints"], result["results"], result["controls"], "\n".join(text),
                  figures=lambda: {"accuracy_vs_length.png": plot_length_curves(curves)}, dpi=150,
                  extra={"memory": memory})


COMMAND = Command("evaluate", EvaluateOptions, run, __doc__.split("\n\n")[0], _HELP_JSON)
main, build_parser = COMMAND.main, COMMAND.build_parser


if __name__ == "__main__":
    sys.exit(main())
