"""Accuracy-vs-length curves per subtask, sequence accuracy, and the length-generalization score (SPEC section 7).

Usage: ``python -m probe.evaluate ckpt.pt [more.pt ...] [--lengths 1:100] [--json] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from probe.checkpoint import load_checkpoint, resolve_checkpoints
from probe.cli import add_common_args, envelope, resolve_device, run_cli, say
from probe.errors import ProbeError
from probe.memory import fit_batch_size
from probe.models import HookedSequenceModel, ModelConfig
from probe.tasks import SUBTASKS, TaskConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure

EVAL_SEED_BASE = 7_000_000_000
"""Evaluation batches come from seeds far from the training seeds (which are ``seed * 1_000_003 + step``)."""


def eval_seed(seed: int, length: int, chunk: int) -> int:
    return EVAL_SEED_BASE + seed * 1_000_000 + length * 1_000 + chunk


@torch.no_grad()
def accuracy_at_length(
    model: HookedSequenceModel, task: TaskConfig, length: int, n_samples: int = 256, batch_size: int = 256,
    seed: int = 0, device: torch.device | str | None = None, forward_batch: int | None = None,
) -> dict[str, dict[str, float]]:
    """Token and sequence accuracy per subtask (and ``all``) on ``n_samples`` fresh sequences of one length.

    Sequences are drawn ``batch_size`` at a time and run through the model ``forward_batch`` at a time (default:
    all at once), so the draws, and the numbers, do not depend on how much memory the forward pass may use.
    Sequence accuracy of a subtask counts only sequences that ask that subtask at least once (NaN if none does).
    """
    if n_samples < 1 or batch_size < 1:
        raise ProbeError(f"n_samples={n_samples}, batch_size={batch_size}: both must be at least 1")
    device = device or next(model.parameters()).device
    step = forward_batch or batch_size
    right = {s: 0 for s in (*SUBTASKS, "all")}
    asked = dict(right)
    seq_right = dict(right)
    seq_asked = dict(right)
    done, chunk = 0, 0
    while done < n_samples:
        b = min(batch_size, n_samples - done)
        batch = task.sample(length, b, eval_seed(seed, length, chunk)).to(device)
        pred = torch.cat([model(batch.tokens[i:i + step]).argmax(-1) for i in range(0, b, step)])
        correct = pred == batch.labels
        masks = {**batch.masks, "all": batch.answer_mask}
        for s, mask in masks.items():
            right[s] += int((correct & mask).sum())
            asked[s] += int(mask.sum())
            has = mask.any(dim=1)
            seq_right[s] += int(((correct | ~mask).all(dim=1) & has).sum())
            seq_asked[s] += int(has.sum())
        done += b
        chunk += 1
    return {
        s: {
            "token_acc": right[s] / asked[s] if asked[s] else math.nan,
            "seq_acc": seq_right[s] / seq_asked[s] if seq_asked[s] else math.nan,
            "n_tokens": asked[s],
        }
        for s in right
    }


def length_curve(
    model: HookedSequenceModel, task: TaskConfig, lengths: Iterable[int], n_samples: int = 256,
    batch_size: int = 256, seed: int = 0, progress: bool = False, desc: str = "lengths",
) -> pd.DataFrame:
    """One row per (length, subtask): ``length, subtask, token_acc, seq_acc, n_tokens``.

    Each length's forward passes use the largest sub-batch that fits in memory (``probe.memory``); a length at
    which not even one sequence fits raises ``ProbeError`` before anything runs."""
    lengths = list(lengths)
    device = next(model.parameters()).device
    check_lengths(model.cfg, task, lengths, device)
    rows: list[dict[str, Any]] = []
    it: Iterable[int] = lengths
    if progress:
        from tqdm import tqdm

        it = tqdm(lengths, desc=desc, leave=False, file=sys.stderr)
    for length in it:
        fits = fit_batch_size(model.cfg, length, batch_size, device, prefix=task.prefix_len)
        for subtask, acc in accuracy_at_length(model, task, length, n_samples, batch_size, seed,
                                               forward_batch=fits).items():
            rows.append({"length": length, "subtask": subtask, **acc})
    return pd.DataFrame(rows)


def check_lengths(cfg: ModelConfig, task: TaskConfig, lengths: Sequence[int], device: torch.device | str) -> None:
    """Refuse, before any work, a length the model cannot take: beyond a learned position table, or so long that
    one sequence's forward pass would not fit in memory."""
    if not lengths:
        raise ProbeError("no lengths to evaluate")
    longest = max(lengths)
    if cfg.pos_encoding == "learned" and task.prefix_len + longest > cfg.max_len:
        raise ProbeError(f"length {longest} needs {task.prefix_len + longest} positions, beyond the model's learned "
                         f"table of {cfg.max_len}: use lengths up to {cfg.max_len - task.prefix_len}")
    fit_batch_size(cfg, longest, 1, device, prefix=task.prefix_len)


def lengthgen_score(curve: pd.DataFrame, train_length: int, factor: int = 3) -> dict[str, float]:
    """Mean token accuracy over lengths in (L_train, factor * L_train] per subtask (Delétang et al.'s protocol)."""
    beyond = curve[(curve.length > train_length) & (curve.length <= factor * train_length)]
    return {s: float(g.token_acc.mean()) for s, g in beyond.groupby("subtask")}


def parse_lengths(spec: str) -> list[int]:
    """``"1:100"`` (inclusive), ``"1:100:5"`` or ``"25,50,75"``."""
    usage = "use START:STOP[:STEP] such as 1:100, or a comma list such as 25,50,75"
    if not spec.strip():
        raise ProbeError(f"empty --lengths: {usage}")
    try:
        if ":" in spec:
            parts = [int(p) for p in spec.split(":")]
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] < 1):
                raise ValueError
            start, stop, step = parts[0], parts[1], parts[2] if len(parts) == 3 else 1
            out = list(range(start, stop + 1, step))
            if not out:
                raise ProbeError(f"bad --lengths {spec!r}: an empty range (START is after STOP)")
        else:
            out = [int(p) for p in spec.split(",") if p.strip()]
    except ValueError:
        raise ProbeError(f"bad --lengths {spec!r}: {usage}") from None
    if not out or min(out) < 1:
        raise ProbeError(f"bad --lengths {spec!r}: lengths must be positive integers")
    return out


def multiples(train_length: int, factors: Sequence[int] = (1, 2, 3, 4)) -> list[int]:
    return [f * train_length for f in factors]


# --- results over checkpoints ------------------------------------------------------------------------------
def evaluate_checkpoints(paths: Sequence[str | Path], lengths: Sequence[int] | None = None, n_samples: int = 256,
                         batch_size: int = 256, seed: int = 0, device: torch.device | str = "cpu",
                         progress: bool = False) -> pd.DataFrame:
    """Tidy curve of every checkpoint: ``checkpoint, label, seed, length, subtask, token_acc, seq_acc, n_tokens``.

    Default lengths: 1 .. 4 x L_train of each checkpoint's task.
    """
    if n_samples < 1 or batch_size < 1:
        raise ProbeError(f"n_samples={n_samples}, batch_size={batch_size}: both must be at least 1")
    # every file and every length is checked before any evaluation runs, so a bad one costs no time
    ckpts = [load_checkpoint(path) for path in paths]
    plans = [list(lengths) if lengths else list(range(1, 4 * c.task_config.train_length + 1)) for c in ckpts]
    for ckpt, lens in zip(ckpts, plans, strict=True):
        try:
            check_lengths(ckpt.model_config, ckpt.task_config, lens, device)
        except ProbeError as e:
            raise ProbeError(f"{ckpt.path or ckpt.name}: {e}") from None
    frames = []
    for path, ckpt, lens in zip(paths, ckpts, plans, strict=True):
        model = ckpt.build_model(device)
        curve = length_curve(model, ckpt.task_config, lens, n_samples, batch_size, seed, progress,
                             desc=f"{ckpt.label} ({ckpt.name})")
        curve.insert(0, "checkpoint", str(path))
        curve.insert(1, "label", ckpt.label)
        curve.insert(2, "seed", ckpt.seed)
        curve["train_length"] = ckpt.task_config.train_length
        # how it was trained, so that a table mixing precisions says so (older checkpoints: fp32, default AdamW)
        curve["precision"] = ckpt.train_config.get("precision", "fp32") if ckpt.train_config else None
        curve["optimizer_impl"] = ckpt.train_config.get("optimizer_impl", "default") if ckpt.train_config else None
        frames.append(curve)
    return pd.concat(frames, ignore_index=True)


def scores(curves: pd.DataFrame) -> pd.DataFrame:
    """Length-generalization score per checkpoint and subtask: ``checkpoint, label, seed, subtask, lengthgen_score``."""
    rows = []
    for (path, label, seed, lt), curve in curves.groupby(["checkpoint", "label", "seed", "train_length"],
                                                         dropna=False):
        for subtask, value in lengthgen_score(curve, int(lt)).items():
            rows.append({"checkpoint": path, "label": label, "seed": seed, "subtask": subtask,
                         "lengthgen_score": value})
    return pd.DataFrame(rows)


def summary_table(curves: pd.DataFrame, factors: Sequence[int] = (1, 2, 3, 4)) -> pd.DataFrame:
    """Mean ± standard deviation over seeds of token accuracy (percent), per label and subtask: averaged over the
    in-distribution lengths (``1..1x``, the lengths evaluated up to L_train), at k x L_train, and the
    length-generalization score."""
    rows = []
    for (label, subtask), g in curves.groupby(["label", "subtask"]):
        row: dict[str, Any] = {"label": label, "subtask": subtask, "seeds": g.seed.nunique()}
        inside = g[g.length <= g.train_length].groupby("seed").token_acc.mean()
        if len(inside):
            row["1..1x"] = f"{100 * inside.mean():.1f} ± {100 * inside.std(ddof=0):.1f}"
        for f in factors:
            at = g[g.length == f * g.train_length]
            if len(at):
                row[f"{f}x"] = f"{100 * at.token_acc.mean():.1f} ± {100 * at.token_acc.std(ddof=0):.1f}"
        sc = scores(g)
        if len(sc):
            row["score"] = f"{100 * sc.lengthgen_score.mean():.1f}"
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
    n_seeds = data.groupby("label").seed.nunique()
    fig.suptitle("Accuracy vs length (line: mean over seeds; band: min–max) — seeds per model: "
                 + ", ".join(f"{k} {v}" for k, v in n_seeds.items()), fontsize=8)
    fig.tight_layout()
    return fig


def evaluation_envelope(curves: pd.DataFrame, paths: Sequence[str | Path]) -> dict[str, Any]:
    """The ``--json`` object of ``evaluate_checkpoints(paths)``: length rows, length-generalization score rows and
    chance controls (see ``--help``)."""
    rows = curves.drop(columns=["train_length"]).to_dict("records")
    rows += [{"checkpoint": r.checkpoint, "label": r.label, "seed": r.seed, "length": None,
              "subtask": r.subtask, "metric": "lengthgen_score", "token_acc": r.lengthgen_score,
              "seq_acc": None} for r in scores(curves).itertuples()]
    task = load_checkpoint(paths[0]).task_config
    controls = [{"control": "chance", "subtask": "state", "token_acc": 1 / task.m},
                {"control": "chance", "subtask": "recall", "token_acc": 1 / task.n_values}]
    return envelope("evaluate", [str(p) for p in paths], rows, controls)


# --- CLI ---------------------------------------------------------------------------------------------------
_HELP_JSON = """JSON (--json): results rows {checkpoint, label, seed, length, subtask (state|recall|all), token_acc,
seq_acc, n_tokens, train_length, precision, optimizer_impl (how the checkpoint was trained)}, plus one row per
checkpoint and subtask with length null, metric "lengthgen_score" and its value in token_acc (mean token accuracy
over lengths in (L_train, 3 L_train]); controls rows {control: "chance", subtask,
token_acc}: the accuracy of guessing uniformly."""


def _note(text: str) -> None:
    print(text, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probe.evaluate", description=__doc__.split("\n\n")[0],
                                     epilog=_HELP_JSON)
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files, directories of *.pt, or globs")
    parser.add_argument("--lengths", default=None, help="START:STOP[:STEP] or a comma list (default 1:4xL_train)")
    parser.add_argument("--samples", type=int, default=256, help="sequences per length (default 256)")
    parser.add_argument("--batch-size", type=int, default=256, help="sub-batch size, bounds memory (default 256)")
    add_common_args(parser)

    def body(args: argparse.Namespace) -> dict[str, Any]:
        for flag, value in (("--samples", args.samples), ("--batch-size", args.batch_size)):
            if value < 1:  # 0 samples gave "nan ± nan" and exit code 0
                raise ProbeError(f"{flag} {value}: must be at least 1 (default 256)")
        paths = resolve_checkpoints(args.checkpoints, note=None if args.json else _note)
        lengths = parse_lengths(args.lengths) if args.lengths is not None else None
        curves = evaluate_checkpoints(paths, lengths, args.samples, args.batch_size, args.seed,
                                      resolve_device(args.device), progress=not args.json)
        trained = curves.drop_duplicates("checkpoint")
        for r in trained.itertuples():
            say(args, f"{r.checkpoint}: {r.label}, seed {r.seed}, trained in {r.precision} "
                      f"(AdamW {r.optimizer_impl})")
        say(args, summary_table(curves).to_string(index=False))
        result = evaluation_envelope(curves, paths)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "evaluate.json").write_text(json.dumps(result, indent=1))
            plot_length_curves(curves).savefig(out / "accuracy_vs_length.png", dpi=150)
            say(args, f"wrote {out / 'evaluate.json'} and {out / 'accuracy_vs_length.png'}")
        return result

    return run_cli(parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
