"""Linear probes that decode the running sum s_t mod m from each hook, with controls and a causal (patching) check.

Usage: ``python -m probe.probes ckpt.pt [more.pt ...] [--hooks ...] [--lengths 25,50,75,100] [--json] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from probe.checkpoint import Checkpoint, load_checkpoint, resolve_checkpoints
from probe.cli import add_common_args, envelope, resolve_device, run_cli, say
from probe.errors import ProbeError
from probe.evaluate import multiples, parse_lengths
from probe.models import HookedSequenceModel
from probe.patching import interchange_intervention
from probe.tasks import TaskConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PROBE_SEED_BASE = 8_000_000_000
"""Probe data come from seeds far from training (``seed * 1_000_003 + step``) and evaluation (7e9) seeds."""

HOOK_SUFFIXES = ("lstm.hook_h", "lstm.hook_c", "hook_attn_out", "hook_resid_post")
"""Default hooks, in every block where they exist."""

DECODABLE = 0.8
"""A state is "decodable" at a block when a probe on its LSTM h or c reaches this accuracy and beats each control
(random init, control task, majority class) by at least ``MARGIN``."""

MARGIN = 0.2

USED = 0.5
"""A state is "used" when patching it moves at least this fraction of later answers to the counterfactual."""

MAX_ITER = 500


def default_hooks(model: HookedSequenceModel) -> list[str]:
    names = set(model.hook_dict)
    return [f"blocks.{i}.{s}" for i in range(len(model.blocks)) for s in HOOK_SUFFIXES if f"blocks.{i}.{s}" in names]


def resolve_hooks(model: HookedSequenceModel, specs: Sequence[str] | None) -> list[str]:
    """Hook names from exact names or suffixes (``lstm.hook_h`` = that hook in every block)."""
    if not specs:
        return default_hooks(model)
    # every hook with one vector per position; (head, query, key) patterns are not per-position features
    names = [n for n in model.hook_dict if not n.endswith(("hook_attn_scores", "hook_pattern"))]
    out: list[str] = []
    for spec in specs:
        hits = [n for n in names if n == spec or n.endswith("." + spec)]
        if not hits:
            raise ProbeError(f"no per-position hook matches {spec!r}; try one of {', '.join(default_hooks(model))}")
        out.extend(h for h in hits if h not in out)
    return out


@dataclass
class Activations:
    """Features at state positions. ``features[hook]`` is ``(N, d)``; ``labels`` s_t; ``control`` the control-task
    label; ``position`` the 1-based stream position; ``length`` the stream length of the sequence."""

    features: dict[str, np.ndarray]
    labels: np.ndarray
    control: np.ndarray
    position: np.ndarray
    length: np.ndarray


CONTROL_TYPES = ("history", "bigram")
"""Type definitions for the Hewitt & Liang control task (see ``control_labels``)."""


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random function of a uint64 key: distinct types get independent-looking labels."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def control_labels(tokens: torch.Tensor, state: torch.Tensor, m: int, seed: int = 0,
                   control: str = "history") -> torch.Tensor:
    """Hewitt & Liang's control task: each type gets a fixed random label in Z_m (``-1`` off state positions).

    ``history``: the type is the sequence of numbers so far, x_1..x_t (queries skipped) -- exactly what s_t is a
    function of, so a probe can score on it only by memorising history types from the representation.
    ``bigram``: the type is (previous number, current number), a local context any sequence model may keep.
    """
    if control not in CONTROL_TYPES:
        raise ProbeError(f"unknown control task {control!r}; choose one of {', '.join(CONTROL_TYPES)}")
    x = tokens.clamp(0, m - 1).numpy().astype(np.uint64)
    st = state.numpy()
    b, t_len = x.shape
    key = np.zeros(b, dtype=np.uint64)
    prev = np.full(b, m, dtype=np.uint64)
    out = np.full((b, t_len), -1, dtype=np.int64)
    salt = _splitmix64(np.array([seed], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        for t in range(t_len):
            if control == "history":  # FNV-style rolling hash of the number history (wraps modulo 2^64)
                new_key = (key * np.uint64(0x100000001B3)) ^ (x[:, t] + np.uint64(1))
            else:
                new_key = prev * np.uint64(m + 1) + x[:, t]
            label = (_splitmix64(new_key ^ salt) % np.uint64(m)).astype(np.int64)
            out[:, t] = np.where(st[:, t], label, -1)
            key = np.where(st[:, t], new_key, key)
            prev = np.where(st[:, t], x[:, t], prev)
    return torch.from_numpy(out)


@torch.no_grad()
def collect_activations(model: HookedSequenceModel, task: TaskConfig, lengths: Iterable[int], n_per_length: int,
                        hooks: Sequence[str], seed: int, control: str = "history",
                        control_seed: int = 0) -> Activations:
    """Run ``n_per_length`` sequences of each length through ``model`` and keep the hooks at state positions."""
    device = next(model.parameters()).device
    feats: dict[str, list[np.ndarray]] = {h: [] for h in hooks}
    labels, ctrl_labels, position, length_col = [], [], [], []
    for length in lengths:
        batch = task.sample(length, n_per_length, seed + length)
        state = batch.masks["state"]
        if not state.any():
            continue
        _, cache = model.run_with_cache(batch.tokens.to(device), names_filter=list(hooks))
        for h in hooks:
            feats[h].append(cache[h][state.to(device)].flatten(1).float().cpu().numpy())  # q/k/v/z: heads joined
        labels.append(batch.sums[state].numpy())
        ctrl_labels.append(control_labels(batch.tokens, state, task.m, control_seed, control)[state].numpy())
        pos = torch.arange(1, batch.tokens.shape[1] + 1) - batch.prefix_len
        position.append(pos.expand_as(state)[state].numpy())
        length_col.append(np.full(int(state.sum()), length))
    if not labels:
        raise ProbeError(f"task {task.name} asks no state questions: nothing to probe")
    return Activations({h: np.concatenate(v) for h, v in feats.items()}, np.concatenate(labels),
                       np.concatenate(ctrl_labels), np.concatenate(position), np.concatenate(length_col))


def fit_probe(x: np.ndarray, y: np.ndarray, seed: int = 0, max_iter: int = MAX_ITER) -> Pipeline:
    """Standardised multinomial logistic regression (lbfgs). ``n_iter_ < max_iter`` tells that it converged."""
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter, random_state=seed))
    # One BLAS thread: these problems are small, and threaded BLAS spin-waits cost several times the work itself.
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore", ConvergenceWarning)  # reported as the `converged` column instead
        probe.fit(x, y)
    return probe


def random_init_like(model: HookedSequenceModel, seed: int) -> HookedSequenceModel:
    """The same architecture (gates included) with seeded random weights: control (a)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        other = HookedSequenceModel(model.cfg)
    if other.attention_blocks:
        other.set_attention_gate(model.attention_gates())
    return other.to(next(model.parameters()).device).eval()


@dataclass
class ProbeResult:
    """Probe accuracies with their controls beside every number, the patching check and its controls.

    ``by_length``: one row per (hook, test length); ``by_position``: one row per (hook, test length, position
    bucket); both with ``probe_acc, control_task_acc, selectivity, random_init_acc, majority_acc, n``.
    ``patching``: one row per (block, length) from ``interchange_intervention`` plus ``probe_acc`` (best LSTM
    hook of that block) and ``verdict``. ``controls``: identity patches and the shuffled-label probe.
    """

    checkpoint: str
    train_length: int
    hooks: list[str]
    by_length: pd.DataFrame
    by_position: pd.DataFrame
    patching: pd.DataFrame
    controls: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def best_hook(self, contains: str = "") -> str | None:
        """Highest mean probe accuracy over the test lengths among hooks whose name contains ``contains`` (first in
        hook order on ties); None if no hook matches."""
        hooks = [h for h in self.hooks if contains in h]
        if not hooks:
            return None
        mean = self.by_length.groupby("hook", sort=False).probe_acc.mean()
        return str(mean.reindex(hooks).idxmax())


def _scores(pred: dict[str, np.ndarray], acts: Activations, majority: int, keys: pd.DataFrame) -> pd.DataFrame:
    df = keys.copy()
    df["probe"] = pred["probe"] == acts.labels
    df["control_task"] = pred["control_task"] == acts.control
    df["random_init"] = pred["random_init"] == acts.labels
    df["majority"] = acts.labels == majority
    return df


def _summarise(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    out = df.groupby(by, sort=True).agg(
        probe_acc=("probe", "mean"), control_task_acc=("control_task", "mean"),
        random_init_acc=("random_init", "mean"), majority_acc=("majority", "mean"), n=("probe", "size"),
    ).reset_index()
    out["selectivity"] = out.probe_acc - out.control_task_acc
    return out


def probe_model(
    model: HookedSequenceModel, task: TaskConfig, lengths: Sequence[int] | None = None,
    hooks: Sequence[str] | None = None, n_train: int = 200, n_test: int = 48, seed: int = 0,
    patching: bool = True, n_patch: int = 48, control: str = "history", name: str = "<model>",
    progress: bool = False,
) -> ProbeResult:
    """Probe every hook for s_t: train on every position of ``n_train`` sequences of length L_train, test on
    ``n_test`` fresh sequences per test length (default 1x..4x L_train), controls beside every number, then patch
    the LSTM state (``interchange_intervention``) and give each LSTM block a verdict."""
    model.eval()
    L = task.train_length
    lengths = list(lengths) if lengths else multiples(L)
    hooks = resolve_hooks(model, hooks)
    rand = random_init_like(model, seed)
    train_seed, test_seed = PROBE_SEED_BASE + seed * 1_000_000, PROBE_SEED_BASE + seed * 1_000_000 + 500_000
    # The models are causal and have no end marker, so position t of a length-L_train sequence is the last
    # position of a length-t one: every position of L_train-long sequences covers the lengths 1..L_train.
    train = collect_activations(model, task, [L], n_train, hooks, train_seed, control, seed)
    test = collect_activations(model, task, lengths, n_test, hooks, test_seed, control, seed)
    rtrain = collect_activations(rand, task, [L], n_train, hooks, train_seed, control, seed)
    rtest = collect_activations(rand, task, lengths, n_test, hooks, test_seed, control, seed)
    values, counts = np.unique(train.labels, return_counts=True)
    majority = int(values[counts.argmax()])
    width = max(1, L // 5)
    keys = pd.DataFrame({"length": test.length, "position_lo": (test.position - 1) // width * width + 1})
    keys["position_hi"] = keys.position_lo + width - 1
    by_len, by_pos = [], []
    it: Iterable[str] = hooks
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(hooks, desc=f"probes {name}", leave=False)
    for hook in it:
        probe = fit_probe(train.features[hook], train.labels, seed)
        ctrl = fit_probe(train.features[hook], train.control, seed)
        rprobe = fit_probe(rtrain.features[hook], rtrain.labels, seed)
        pred = {"probe": probe.predict(test.features[hook]), "control_task": ctrl.predict(test.features[hook]),
                "random_init": rprobe.predict(rtest.features[hook])}
        scored = _scores(pred, test, majority, keys).assign(hook=hook)
        info = {"hook": hook, "probe_train_acc": probe.score(train.features[hook], train.labels),
                "converged": all(int(p[-1].n_iter_.max()) < MAX_ITER for p in (probe, ctrl, rprobe))}
        by_len.append(_summarise(scored, ["hook", "length"]).assign(**{k: v for k, v in info.items() if k != "hook"}))
        by_pos.append(_summarise(scored, ["hook", "length", "position_lo", "position_hi"]))
    by_length = pd.concat(by_len, ignore_index=True)
    by_position = pd.concat(by_pos, ignore_index=True)
    order = {h: k for k, h in enumerate(hooks)}
    by_length = by_length.sort_values(["hook", "length"], key=lambda s: s.map(order) if s.name == "hook" else s)
    by_length["factor"] = by_length.length / L
    controls = [_shuffled_control(train, test, by_length, hooks, seed, majority, L)]
    patch, patch_controls = (interchange_intervention(model, task, lengths, n_patch, seed) if patching
                             else (pd.DataFrame(), pd.DataFrame()))
    if not patch.empty:
        patch = _with_verdicts(patch, by_length)
    result_controls = pd.concat([pd.DataFrame(controls), patch_controls], ignore_index=True)
    meta = {"train_positions": len(train.labels), "test_positions": len(test.labels), "m": task.m,
            "position_bucket": width, "majority_class": majority, "n_train": n_train, "n_test": n_test,
            "control_task": control}
    return ProbeResult(name, L, hooks, by_length.reset_index(drop=True), by_position, patch, result_controls, meta)


def _shuffled_control(train: Activations, test: Activations, by_length: pd.DataFrame, hooks: list[str], seed: int,
                      majority: int, L: int, n_shuffles: int = 3) -> dict[str, Any]:
    """Negative control: the best hook's probe trained on labels shuffled across positions, scored at 1x.

    When the features cluster by s_t, a shuffled-label probe maps whole clusters to random classes, so one shuffle's
    accuracy jumps in steps of about 1/m; the mean over ``n_shuffles`` permutations is steadier. It passes when
    it would not count as decodable: below majority + ``MARGIN``.
    """
    best = str(by_length.groupby("hook", sort=False).probe_acc.mean().reindex(hooks).idxmax())
    at = test.length == (L if (test.length == L).any() else test.length.min())
    rng = np.random.default_rng(seed)
    accs = [float((fit_probe(train.features[best], rng.permutation(train.labels), seed)
                   .predict(test.features[best][at]) == test.labels[at]).mean()) for _ in range(n_shuffles)]
    majority_acc = float((test.labels[at] == majority).mean())
    return {"control": "shuffled_labels", "hook": best, "length": int(test.length[at][0]), "n": int(at.sum()),
            "acc": float(np.mean(accs)), "acc_max": max(accs), "majority_acc": majority_acc,
            "passed": float(np.mean(accs)) < majority_acc + MARGIN}


def _with_verdicts(patch: pd.DataFrame, by_length: pd.DataFrame) -> pd.DataFrame:
    """Join each patching row with the best probe on that block's LSTM h / c at that length, and name the verdict.

    A block whose state is decodable but moves fewer than ``USED`` answers alone, while patching every LSTM block
    at once does, holds the state redundantly: "decodable, used jointly".
    """
    jointly = {r.length: r.iia >= USED for r in patch.itertuples() if r.block < 0}
    rows = []
    for r in patch.itertuples(index=False):
        block = int(r.block)
        hooks = ([f"blocks.{block}.lstm.hook_h", f"blocks.{block}.lstm.hook_c"] if block >= 0
                 else [h for h in by_length.hook.unique() if ".lstm.hook_" in h])
        sel = by_length[by_length.hook.isin(hooks) & (by_length.length == r.length)]
        used = r.iia >= USED
        if sel.empty:
            rows.append({**r._asdict(), "probe_acc": float("nan"), "selectivity": float("nan"),
                         "verdict": "not probed, " + ("used" if used else "not used")})
            continue
        best = sel.loc[sel.probe_acc.idxmax()]
        floor = max(best.random_init_acc, best.control_task_acc, best.majority_acc)
        decodable = best.probe_acc >= DECODABLE and best.probe_acc - floor >= MARGIN
        usage = "used" if used else "used jointly" if block >= 0 and jointly.get(r.length) else "not used"
        verdict = ("decodable, " if decodable else "not decodable, ") + usage
        rows.append({**r._asdict(), "probe_acc": float(best.probe_acc), "selectivity": float(best.selectivity),
                     "verdict": verdict})
    return pd.DataFrame(rows)


def run_probes(ckpt: Checkpoint, device: torch.device | str = "cpu", **kw: Any) -> ProbeResult:
    """``probe_model`` on a checkpoint's model and its own task."""
    model = ckpt.build_model(device)
    result = probe_model(model, ckpt.task_config, name=str(ckpt.path or ckpt.name), **kw)
    result.meta.update(family=ckpt.model_config.family, schedule=ckpt.schedule, step=ckpt.step,
                       train_seed=ckpt.seed)
    return result


def headline(result: ProbeResult, factors: Sequence[int] = (1, 3)) -> dict[str, Any]:
    """One flat row: the best hook's accuracy and selectivity, and the all-blocks interchange accuracy (the single
    LSTM block for one-block models), at each factor x L_train that was tested."""
    out: dict[str, Any] = {"checkpoint": result.checkpoint, "best_hook": result.best_hook()}
    best = result.by_length[result.by_length.hook == out["best_hook"]].set_index("length")
    patch = result.patching
    if not patch.empty:
        patch = patch[patch.block == patch.block.min()].set_index("length")  # -1 (all blocks) if there are several
    for f in factors:
        length = f * result.train_length
        if length in best.index:
            out[f"probe_acc_{f}x"] = float(best.probe_acc[length])
            out[f"selectivity_{f}x"] = float(best.selectivity[length])
        if not patch.empty and length in patch.index:
            out[f"iia_{f}x"] = float(patch.iia[length])
    return out


# --- tidy rows ----------------------------------------------------------------------------------------------
def result_rows(result: ProbeResult, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    base = {"checkpoint": result.checkpoint, "seed": seed, "family": result.meta.get("family"),
            "schedule": result.meta.get("schedule")}
    rows = [{**base, "analysis": "probe", "scope": "length", "position_lo": None, "position_hi": None, **r}
            for r in result.by_length.to_dict("records")]
    rows += [{**base, "analysis": "probe", "scope": "position", **r} for r in result.by_position.to_dict("records")]
    rows += [{**base, "analysis": "patching", **r} for r in result.patching.to_dict("records")]
    controls = []
    for r in result.controls.to_dict("records"):
        r = {k: v for k, v in r.items() if not (isinstance(v, float) and np.isnan(v))}
        # a column with gaps turns ints into floats in pandas; undo that for the integer fields
        controls.append({**base, **{k: int(v) if k in ("block", "length", "n") else v for k, v in r.items()}})
    return rows, controls


def summary_table(result: ProbeResult) -> pd.DataFrame:
    """Hook x length: ``probe_acc (selectivity)`` with the random-init accuracy, for printing."""
    df = result.by_length
    cell = df.probe_acc.map("{:.2f}".format) + " (" + df.selectivity.map("{:+.2f}".format) + ", r " + \
        df.random_init_acc.map("{:.2f}".format) + ")"
    table = df.assign(cell=cell).pivot(index="hook", columns="length", values="cell").reindex(result.hooks)
    table.columns = [f"L={c}" for c in table.columns]
    return table


# --- figures ------------------------------------------------------------------------------------------------
def _short(name: str) -> str:
    """``runs/hybrid-dat/seed0/final.pt`` -> ``hybrid-dat/seed0``; ``checkpoints/lstm.pt`` -> ``lstm``."""
    p = Path(name)
    if p.name in ("final.pt", "last.pt"):
        return (f"{p.parent.parent.name}/{p.parent.name}" if p.parent.name.startswith("seed") else p.parent.name) \
            or p.stem
    return p.stem


def plot_heatmap(results: Sequence[ProbeResult]) -> Figure:
    """Probe accuracy, hook x test length, one panel per checkpoint (selectivity in brackets)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="white")
    height = 0.45 * max(len(r.hooks) for r in results) + 2
    fig, axes = plt.subplots(1, len(results), figsize=(max(7.0, 4.5 * len(results) + 1), height), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        acc = res.by_length.pivot(index="hook", columns="length", values="probe_acc").reindex(res.hooks)
        sel = res.by_length.pivot(index="hook", columns="length", values="selectivity").reindex(res.hooks)
        annot = acc.map("{:.2f}".format) + "\n(" + sel.map("{:+.2f}".format) + ")"
        sns.heatmap(acc, vmin=0, vmax=1, cmap="viridis", annot=annot, fmt="", ax=ax, cbar=ax is axes[0][-1],
                    annot_kws={"fontsize": 7})
        ax.set_title(_short(res.checkpoint))
        ax.set_xlabel("test length (stream positions)")
        ax.set_ylabel("hook")
    fig.suptitle("probe accuracy for $s_t$ (selectivity)")
    fig.tight_layout()
    return fig


def plot_position(results: Sequence[ProbeResult], hooks: Sequence[str] | None = None) -> Figure:
    """Accuracy vs stream position on the longest test length, training range shaded; one panel per checkpoint."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False, sharey=True)
    for ax, res in zip(axes[0], results, strict=True):
        df = res.by_position[res.by_position.length == res.by_position.length.max()]
        mid = (df.position_lo + df.position_hi) / 2
        df = df.assign(position=mid)
        shown = list(hooks) if hooks else [h for h in res.hooks if "attn_out" not in h]
        for hook in shown:
            d = df[df.hook == hook]
            ax.plot(d.position, d.probe_acc, marker="o", ms=3, label=hook)
        best = df[df.hook == res.best_hook()]
        ax.plot(best.position, best.random_init_acc, "k--", lw=1, label="random init (best hook)")
        ax.plot(best.position, best.control_task_acc, "k:", lw=1, label="control task (best hook)")
        ax.plot(best.position, best.majority_acc, color="grey", lw=1, label="majority class")
        ax.axvspan(0.5, res.train_length + 0.5, color="tab:green", alpha=0.1, label="training range")
        ax.set_title(_short(res.checkpoint))
        ax.set_xlabel("stream position t")
        ax.set_ylabel("probe accuracy for $s_t$")
        ax.set_ylim(0, 1.02)
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def plot_compare(results: Sequence[ProbeResult]) -> Figure:
    """Checkpoints on one figure: probe accuracy vs length (best hook, best LSTM-state hook, their controls) and
    interchange-intervention accuracy per block."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.lines import Line2D

    sns.set_theme(style="whitegrid")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    markers = ["o", "^", "v", "D", "P"]
    for k, res in enumerate(results):
        color, label = f"C{k}", _short(res.checkpoint)
        best, lstm = res.best_hook(), res.best_hook(".lstm.hook_")
        d = res.by_length[res.by_length.hook == best]
        ax.plot(d.length, d.probe_acc, "o-", color=color, label=f"{label}: {best}")
        ax.plot(d.length, d.random_init_acc, "--", color=color, lw=1)
        ax.plot(d.length, d.control_task_acc, ":", color=color, lw=1)
        if lstm and lstm != best:
            e = res.by_length[res.by_length.hook == lstm]
            ax.plot(e.length, e.probe_acc, "-.", marker="x", color=color, label=f"{label}: {lstm}")
        ax.axvline(res.train_length, color=color, lw=0.8, alpha=0.5)
        for block, p in res.patching.groupby("block") if not res.patching.empty else []:
            style = ("s--", 1.0) if block < 0 else (markers[int(block) % len(markers)] + "-", 0.6)
            bx.plot(p.length, p.iia, style[0], color=color, alpha=style[1],
                    label=f"{label} block {'all' if block < 0 else int(block)}")
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="grey", ls="--", lw=1, label="random init (best hook)"),
                Line2D([], [], color="grey", ls=":", lw=1, label="control task (best hook)"),
                Line2D([], [], color="grey", lw=0.8, label="L_train")]
    ax.legend(handles=handles, fontsize=7, loc="lower left")
    ax.set(xlabel="test length", ylabel="probe accuracy for $s_t$", ylim=(0, 1.02), title="linear probes")
    bx.set(xlabel="test length", ylabel="interchange-intervention accuracy", ylim=(0, 1.02),
           title="patching the LSTM state (block all = every LSTM block)")
    if bx.lines:
        bx.legend(fontsize=7, loc="lower left")
    else:
        bx.text(0.5, 0.5, "no LSTM state to patch", ha="center", transform=bx.transAxes)
    fig.tight_layout()
    return fig


# --- CLI ----------------------------------------------------------------------------------------------------
COLUMNS = """JSON rows (results): checkpoint, seed, family, schedule, analysis ("probe" | "patching").
Probe rows: scope ("length" | "position"), hook, length, factor (length / L_train), position_lo, position_hi
(1-based stream positions of the bucket; null for scope=length), n (state positions scored), probe_acc,
control_task_acc (Hewitt & Liang control task: random fixed label per number history, or per (previous, current)
number with --control bigram), selectivity
(probe_acc - control_task_acc), random_init_acc (same probe on the architecture with random weights), majority_acc
(always the training majority class), probe_train_acc, converged.
Patching rows: block (-1 = every LSTM block at once), length, n (later state answers), iia (answers that follow the
source's sum), base_follow, unpatched_cf (chance floor), model_acc, iia_correct (iia among the answers the
unpatched model gets right), probe_acc and selectivity (best LSTM hook of the block), verdict ("decodable, used" |
"decodable, used jointly" (only patching every LSTM block moves answers) | "decodable, not used" | "not decodable,
...").
Controls: control="shuffled_labels" (hook, length, acc: mean over 3 label shuffles, acc_max, majority_acc, passed)
and control="identity_patch" (block, length, changed_frac, max_abs_logit_diff, passed)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m probe.probes", description=__doc__.splitlines()[0],
                                     epilog=COLUMNS, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files, directories of *.pt, or globs")
    parser.add_argument("--hooks", nargs="+", default=None,
                        help="hook names or suffixes (lstm.hook_h = every block's); default: every block's "
                             + ", ".join(HOOK_SUFFIXES) + " that exist")
    parser.add_argument("--lengths", default=None, help="test lengths, e.g. 25,50,75,100 or 10:100:10 "
                                                        "(default 1x,2x,3x,4x the checkpoint's L_train)")
    parser.add_argument("--n-train", type=int, default=200,
                        help="training sequences of length L_train, every position used (200)")
    parser.add_argument("--n-test", type=int, default=48, help="test sequences per test length (48)")
    parser.add_argument("--n-patch", type=int, default=48, help="base sequences per patch position (48)")
    parser.add_argument("--control", default="history", choices=CONTROL_TYPES,
                        help="control-task type: history (x_1..x_t, default) or bigram (x_prev, x_t)")
    parser.add_argument("--no-patching", action="store_true", help="skip the interchange intervention")
    add_common_args(parser)
    return parser


def main_body(args: argparse.Namespace) -> dict[str, Any]:
    device = resolve_device(args.device)
    lengths = parse_lengths(args.lengths) if args.lengths else None
    if min(args.n_train, args.n_test, args.n_patch) < 1:
        raise ProbeError("--n-train, --n-test and --n-patch must be positive")
    paths = resolve_checkpoints(args.checkpoints)
    results = []
    for path in paths:
        ckpt = load_checkpoint(path, map_location=device)
        res = run_probes(ckpt, device, lengths=lengths, hooks=args.hooks, n_train=args.n_train, n_test=args.n_test,
                         n_patch=args.n_patch, seed=args.seed, patching=not args.no_patching, control=args.control,
                         progress=not args.json)
        results.append(res)
        say(args, f"\n{path}  (L_train={res.train_length}; cells: probe acc (selectivity, r = random-init acc); "
                  f"majority {res.by_length.majority_acc.mean():.2f})")
        say(args, summary_table(res).to_string())
        if not res.patching.empty:
            cols = ["block", "length", "iia", "iia_correct", "base_follow", "unpatched_cf", "model_acc", "probe_acc",
                    "verdict"]
            say(args, "interchange intervention (block -1 = all LSTM blocks):")
            say(args, res.patching[cols].to_string(index=False, float_format="{:.2f}".format))
        say(args, "headline: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in headline(res).items() if k != "checkpoint"))
        for _, c in res.controls.iterrows():
            if c.control == "shuffled_labels":
                say(args, f"control shuffled labels ({c.hook}): acc {c.acc:.2f} vs majority {c.majority_acc:.2f}")
        if "passed" in res.controls and not res.controls.passed.all():
            say(args, "WARNING: a control failed; see the controls rows")
    rows, controls = [], []
    for res in results:
        r, c = result_rows(res, args.seed)
        rows += r
        controls += c
    out = envelope("probes", [str(p) for p in paths], rows, controls)
    if args.out:
        outdir = Path(args.out)
        outdir.mkdir(parents=True, exist_ok=True)
        (outdir / "probes.json").write_text(json.dumps(out))
        for name, fig in (("probes_heatmap", plot_heatmap(results)), ("probes_position", plot_position(results)),
                          ("probes_compare", plot_compare(results))):
            fig.savefig(outdir / f"{name}.png", dpi=120)
        say(args, f"wrote {outdir}/probes.json and figures probes_heatmap/position/compare.png")
    return out


def main(argv: list[str] | None = None) -> int:
    return run_cli(build_parser(), main_body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
