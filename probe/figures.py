"""Figures a paper can use, drawn from tidy results, and a captioned index for a set of them.

Plots (each takes DataFrames and returns a matplotlib Figure): ``plot_accuracy_vs_length`` (accuracy against
length, every seed and the mean with its t-interval), ``plot_window_seeds`` (the metric of record per window of
positions: every seed as a dot beside the mean with its t-interval) and ``plot_over_training`` (a quantity against
the training step, every run and, where there are enough, their mean with its t-interval). One style for all:
the accuracy of guessing drawn as a line, a marker and a line style per series besides its colour (so that curves
on top of each other stay apart), names a reader knows (``reader_name``), legends below the panels.

``draw`` saves a list of ``FigureSpec`` and ``write_index`` writes their captioned ``README.md``. There is no
command line here: ``python -m probe.sweep GRID --report`` draws a grid's figures, and each analysis draws its own
with ``--out``.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from probe.core.stats import t_interval
from probe.core.tables import pipe_row, pipe_table
from probe.errors import ProbeError
from probe.runner import Command, CommandOptions, Report
from probe.schedules.legacy import ALIASES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

READER_NAMES: dict[str, str] = {
    "lstm": "LSTM", "transformer": "Transformer", "hybrid-joint": "hybrid, joint", "hybrid-dat": "hybrid, DAT",
    "hybrid-4block-joint": "4-block hybrid, joint", "hybrid-4block-dat": "4-block hybrid, DAT",
    "joint": "joint", "dat": "DAT", "stopgrad": "stop-gradient",
    "stopgrad-rnn": "stop-gradient (LSTM)",
    "state": "state (running sum)", "recall": "recall", "state_mod2": "parity of the state (mod 2)",
    "bf16": "bfloat16 training", "fp32": "float32 training",
}
"""probe's own names (presets, schedules, subtasks, precisions) as a caption would write them."""
# an old record's schedule names (DAT was once "delayed") read as today's: legacy.py is the one place that spells them
READER_NAMES.update({old: READER_NAMES[new] for old, new in ALIASES.items()})

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (8, 2)))
CHANCE_STYLE = {"color": "0.25", "ls": (0, (4, 3)), "lw": 0.9}


def reader_name(name: Any, labels: Mapping[str, str] | None = None) -> str:
    """``name`` as a reader knows it: ``labels`` first, then ``READER_NAMES``; ``state_mod{q}`` is "state mod q";
    anything else unchanged."""
    key = str(name)
    if labels and key in labels:
        return labels[key]
    if key in READER_NAMES:
        return READER_NAMES[key]
    if m := re.fullmatch(r"state_mod(\d+)", key):
        return f"state mod {m[1]}"
    return key


def number(x: float) -> str:
    """A number as a title writes it: ``25`` for 25.0, ``2.5`` for 2.5 (no float artefacts)."""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True)
class Style:
    """Colour, marker and line style of one series."""

    color: Any
    marker: str
    linestyle: Any


def styles(names: Sequence[Any]) -> dict[Any, Style]:
    """One ``Style`` per name, in order: a colour-blind-safe colour, a marker and a line style each."""
    import seaborn as sns

    palette = sns.color_palette("colorblind", max(len(names), 1))
    return {n: Style(palette[i % len(palette)], MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)])
            for i, n in enumerate(names)}


def _theme() -> None:
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")


def _legend_below(fig: Figure, axes: Iterable[Any], ncols: int = 4) -> None:
    """One legend for the figure, under its panels, off the data (labels deduplicated across panels)."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if not label.startswith("_"):
                seen.setdefault(label, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   ncols=min(ncols, len(seen)), fontsize=7, frameon=False)


def _interval(values: Sequence[float]) -> tuple[float, float, float, int]:
    ci = t_interval(values)
    return ci.estimate, ci.low, ci.high, ci.n


def mean_with_interval(df: pd.DataFrame, by: Sequence[str], value: str) -> pd.DataFrame:
    """Per group of ``by``: ``mean``, the 95 % t-interval ``ci_low``/``ci_high`` over its rows and ``n`` (NaN bounds
    where n < 2)."""
    rows = [dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True),
                 **dict(zip(("mean", "ci_low", "ci_high", "n"), _interval(g[value].to_numpy()), strict=True)))
            for key, g in df.groupby(list(by), sort=False)]
    return pd.DataFrame(rows, columns=[*by, "mean", "ci_low", "ci_high", "n"])


# --- accuracy against length ----------------------------------------------------------------------------------------
def plot_accuracy_vs_length(curves: pd.DataFrame, subtasks: Sequence[str] = ("state", "recall"), *,
                            hue: str = "variant", order: Sequence[str] | None = None,
                            chance: Mapping[str, float] | None = None, labels: Mapping[str, str] | None = None,
                            train_length: int | None = None) -> Figure:
    """Token accuracy against stream length, one panel per subtask: per ``hue`` value each seed (thin), the mean over
    seeds (thick, with its marker every few lengths, staggered between series so that curves on top of each other
    stay apart) and its 95 % t-interval (band); the accuracy of guessing (``chance``, by subtask, or a ``chance``
    column) dashed; the training lengths shaded. ``order``: the drawing order, last on top. ``curves``: rows of
    ``hue``, seed, length, subtask, token_acc (as ``probe.evaluate`` or a grid writes them)."""
    import matplotlib.pyplot as plt

    _theme()
    data = curves[curves.subtask.isin(subtasks)].dropna(subset=["token_acc"])
    present = [s for s in subtasks if (data.subtask == s).any()]
    names = list(order or dict.fromkeys(data[hue]))
    look = styles(names)
    lt = train_length or (int(data.train_length.max()) if "train_length" in data else None)
    fig, axes = plt.subplots(1, len(present), figsize=(4.6 * len(present), 3.4), sharey=True, squeeze=False)
    lengths = np.sort(data.length.unique())
    every = max(len(names), len(lengths) // 8)  # room for each series to put its markers elsewhere
    for ax, subtask in zip(axes[0], present, strict=True):
        part = data[data.subtask == subtask]
        if lt:
            ax.axvspan(1, lt, color="0.9", lw=0, label=f"training lengths (1–{lt})", zorder=0)
        floor = (chance or {}).get(subtask)
        if floor is None and "chance" in part and part.chance.notna().any():
            floor = float(part.chance.dropna().iloc[0])
        if floor is not None:
            ax.axhline(floor, **CHANCE_STYLE, label="chance (a uniform guess)", zorder=1)
        for k, name in enumerate(names):
            rows = part[part[hue] == name]
            if rows.empty:
                continue
            st = look[name]
            for _, seed in rows.groupby("seed"):
                seed = seed.sort_values("length")
                ax.plot(seed.length, seed.token_acc, color=st.color, lw=0.5, alpha=0.5, zorder=2 + k)
            m = mean_with_interval(rows, ["length"], "token_acc").sort_values("length")
            ax.fill_between(m.length, m.ci_low, m.ci_high, color=st.color, alpha=0.15, lw=0, zorder=2 + k)
            start = (k * every) // max(len(names), 1)
            ax.plot(m.length, m["mean"], color=st.color, ls=st.linestyle, lw=1.6, marker=st.marker, ms=4,
                    markevery=(start, every), zorder=3 + k,
                    label=f"{reader_name(name, labels)} ({rows.seed.nunique()} seeds)")
        ax.set(title=reader_name(subtask, labels), xlabel="stream length L (tokens)", ylabel="token accuracy",
               ylim=(-0.02, 1.04), xlim=(0, float(lengths.max()) + 1))
    fig.tight_layout()
    _legend_below(fig, axes[0], ncols=3)
    return fig


# --- the metric of record: windows of positions ---------------------------------------------------------------------
def window_order(windows: pd.DataFrame) -> list[str]:
    """The windows in order of position (``lo``, ``hi``)."""
    return list(windows.sort_values(["lo", "hi"]).window.drop_duplicates())


def _spread(values: np.ndarray, width: float) -> np.ndarray:
    """Horizontal offsets that set equal or near values side by side (a small beeswarm), within ``width``."""
    order = np.argsort(values, kind="stable")
    out = np.zeros(len(values))
    bins = np.round(values[order] * 50)  # values within 0.02 share a row
    for b in np.unique(bins):
        idx = order[bins == b]
        n = len(idx)
        out[idx] = (np.arange(n) - (n - 1) / 2) * min(width / max(n - 1, 1), width / 4)
    return out


def plot_window_seeds(windows: pd.DataFrame, *, hue: str = "variant", column: str | None = None,
                      subtasks: Sequence[str] | None = None, order: Sequence[str] | None = None,
                      column_order: Sequence[str] | None = None, labels: Mapping[str, str] | None = None) -> Figure:
    """Token accuracy per window of stream positions, one row of panels per subtask and one column per value of
    ``column`` (if given): per ``hue`` value and window, every seed a dot (set side by side where they coincide, so
    that a split into two groups of seeds shows) and, beside them, the mean over seeds with its 95 % t-interval;
    each window's chance floor dashed. ``windows``: rows of ``hue``, seed, window, lo, hi, subtask, token_acc,
    chance (a grid's ``windows`` table)."""
    import matplotlib.pyplot as plt

    _theme()
    have = list(dict.fromkeys(windows.subtask))
    factors = sorted((x for x in have if x.startswith("state_mod")), key=lambda x: int(x.removeprefix("state_mod")))
    rows = [x for x in (subtasks or [x for x in ("state", *factors, "recall") if x in have]) if x in have]
    cols = list(column_order or dict.fromkeys(windows[column])) if column else [None]
    names = list(order or dict.fromkeys(windows[hue]))
    look = styles(names)
    wins = window_order(windows)
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(1.2 + 1.25 * len(wins) * len(cols), 2.5 * len(rows)),
                             sharey=True, sharex=True, squeeze=False)
    slot = 0.84 / max(len(names), 1)
    for i, subtask in enumerate(rows):
        for j, col in enumerate(cols):
            ax = axes[i][j]
            panel = windows[(windows.subtask == subtask) & ((windows[column] == col) if column else True)]
            floors = panel.groupby("window").chance.first().reindex(wins)
            ax.hlines(floors, np.arange(len(wins)) - 0.46, np.arange(len(wins)) + 0.46,
                      colors=CHANCE_STYLE["color"], linestyles=[CHANCE_STYLE["ls"]], lw=CHANCE_STYLE["lw"],
                      label="chance (a uniform guess)")
            for k, name in enumerate(names):
                part = panel[panel[hue] == name]
                if part.empty:
                    continue
                st = look[name]
                centre = (k - (len(names) - 1) / 2) * slot
                for w, g in part.groupby("window"):
                    x0 = wins.index(w) + centre
                    y = g.token_acc.to_numpy(dtype=float)
                    ax.scatter(x0 - slot * 0.18 + _spread(y, slot * 0.45), y, s=9, color=st.color,
                               marker=st.marker, alpha=0.7, lw=0, zorder=3)
                    mean, lo, hi, _ = _interval(y)
                    if math.isfinite(lo):
                        ax.errorbar([x0 + slot * 0.3], [mean], yerr=[[mean - lo], [hi - mean]], color=st.color,
                                    fmt=st.marker, ms=3.5, mfc="white", capsize=1.5, lw=1, zorder=4)
                n = part.seed.nunique()
                ax.scatter([], [], color=st.color, marker=st.marker, s=14,
                           label=f"{reader_name(name, labels)} ({n} seeds)")
            ax.set_xticks(range(len(wins)), wins, fontsize=7)
            ax.set_ylim(-0.03, 1.08)  # a t-interval may reach past 1
            ax.set_ylabel(reader_name(subtask, labels) if j == 0 else "")
            if i == 0 and column:
                ax.set_title(reader_name(col, labels))
            if i == len(rows) - 1:
                ax.set_xlabel("window of stream positions")
    fig.tight_layout()
    _legend_below(fig, axes.flat, ncols=3)
    return fig


# --- a quantity over training ---------------------------------------------------------------------------------------
def plot_over_training(table: pd.DataFrame, metrics: Sequence[tuple[str, str]], *, hue: str = "schedule",
                       order: Sequence[str] | None = None, labels: Mapping[str, str] | None = None,
                       train_length: int | None = None, min_runs: int = 3,
                       zero_line: Callable[[str], bool] = lambda col: col.startswith("cos")) -> Figure:
    """A quantity against the training step, one row per metric (``(column, axis label)``), one column per
    ``length``: per ``hue`` value each run (a ``seed``, thin, with markers; with several rows per step -- batches --
    its mean and their 95 % t-interval as error bars) and, at steps where at least ``min_runs`` runs were measured,
    the mean over runs (thick) with its 95 % t-interval (band). Where a run's attention gate (``gate``) goes from 0
    to on, a dashed vertical line. Titles name the length (and its multiple of ``train_length``)."""
    import matplotlib.pyplot as plt

    _theme()
    names = list(order or dict.fromkeys(table[hue]))
    look = styles(names)
    lengths = sorted(table.length.unique())
    fig, axes = plt.subplots(len(metrics), len(lengths), figsize=(4.3 * len(lengths), 2.5 * len(metrics)),
                             sharex=True, squeeze=False)
    for j, length in enumerate(lengths):
        at = table[table.length == length]
        for i, (col, label) in enumerate(metrics):
            ax = axes[i][j]
            if zero_line(col):
                ax.axhline(0.0, color="0.3", lw=0.7)
            for k, name in enumerate(names):
                rows = at[at[hue] == name].dropna(subset=[col])
                if rows.empty:
                    continue
                st = look[name]
                per_run = mean_with_interval(rows, ["seed", "step"], col)
                for _, run in per_run.groupby("seed"):
                    run = run.sort_values("step")
                    ax.plot(run.step, run["mean"], color=st.color, ls=st.linestyle, lw=0.7, alpha=0.75,
                            marker=st.marker, ms=2.5, zorder=2 + k)
                    if (run.n > 1).any():
                        ax.errorbar(run.step, run["mean"], yerr=[run["mean"] - run.ci_low, run.ci_high - run["mean"]],
                                    fmt="none", color=st.color, lw=0.7, capsize=1.5, zorder=2 + k)
                over = mean_with_interval(per_run, ["step"], "mean").sort_values("step")
                over = over[over.n >= min_runs]
                if len(over):
                    ax.fill_between(over.step, over.ci_low, over.ci_high, color=st.color, alpha=0.18, lw=0)
                    ax.plot(over.step, over["mean"], color=st.color, ls=st.linestyle, lw=2, zorder=3 + k)
                n = rows.seed.nunique()
                ax.plot([], [], color=st.color, ls=st.linestyle, marker=st.marker, ms=3,
                        label=f"{reader_name(name, labels)} ({n} {'seed' if n == 1 else 'seeds'})")
                if "gate" in rows and (rows.gate == 0).any() and (rows.gate > 0).any():
                    ax.axvline(rows[rows.gate > 0].step.min(), color=st.color, ls="--", lw=0.9,
                               label=f"{reader_name(name, labels)}: attention switched on")
            if col.startswith("cos"):
                ax.set_ylim(-1.05, 1.05)
            ax.set_ylabel(label if j == 0 else "")
            if i == 0:
                mult = f" ({number(length / train_length)}x L_train)" if train_length else ""
                ax.set_title(f"length {number(length)}{mult}")
            if i == len(metrics) - 1:
                ax.set_xlabel("training step")
    fig.tight_layout()
    _legend_below(fig, axes.flat, ncols=3)
    return fig


# --- saving a figure set with its captioned index -------------------------------------------------------------------
@dataclass(frozen=True)
class FigureSpec:
    """One figure of a set: its file name (no suffix), caption, the command that computes the same numbers, what it
    is drawn from, and ``make``, which draws it from whatever the set's caller passes to ``draw``."""

    name: str
    caption: str
    command: str
    inputs: str
    make: Callable[[Any], Figure]


INDEX_HEADER = ("file", "caption", "same numbers from", "inputs", "seconds")
_INDEX_ROW = re.compile(r"^\| \[(?P<file>[^\]]+)\]\(.*\| (?P<secs>\d+|—) \|$")
FORMATS = ("png", "pdf", "svg")


def _recorded_seconds(index: Path) -> dict[str, float]:
    """The seconds column of an earlier index, by figure: a figure this run does not remake keeps its row."""
    if not index.exists():
        return {}
    found = (_INDEX_ROW.match(line) for line in index.read_text().splitlines())
    return {Path(m["file"]).stem: float(m["secs"]) for m in found if m and m["secs"] != "—"}


def index_row(out: Path, spec: FigureSpec, secs: float | None) -> str | None:
    """The index's row for ``spec`` (None when none of its files is in ``out``)."""
    files = [f"{spec.name}.{fmt}" for fmt in FORMATS if (out / f"{spec.name}.{fmt}").exists()]
    if not files:
        return None
    links = ", ".join(f"[{f}]({f})" for f in files)
    caption = spec.caption.replace("|", "\\|")  # |g_att| would split the table cell
    shown = "—" if secs is None else f"{secs:.0f}"
    return pipe_row([links, caption, f"`{spec.command}`", f"`{spec.inputs}`", shown])


def write_index(out: Path, specs: Sequence[FigureSpec], made: dict[str, float], preamble: str) -> bool:
    """``out/README.md``: ``preamble`` (a paragraph; ``{seconds}`` in it becomes the total of the seconds column),
    then one captioned row for every figure of ``specs`` present in ``out``, in order, with the seconds it took (this
    run's for those in ``made``, the earlier index's for the others). Returns whether the file changed."""
    index = out / "README.md"
    before = _recorded_seconds(index)
    rows, total = [], 0.0
    for spec in specs:
        secs = made.get(spec.name, before.get(spec.name))
        row = index_row(out, spec, secs)
        if row is None:
            continue
        total += secs or 0.0
        rows.append(row)
    text = "\n".join(["# Figures", "", preamble.replace("{seconds}", f"{total:.0f}"), "",
                      pipe_table(INDEX_HEADER, []), *rows]) + "\n"
    if index.exists() and index.read_text() == text:
        return False
    index.write_text(text)
    return True


def without_local_paths(fig: Figure, roots: Sequence[Path]) -> None:
    """Name files in figure text by their path inside ``roots`` (``hybrid-dat.pt``): where that folder sits on the
    machine that drew the figure means nothing to its reader."""
    from matplotlib.text import Text

    prefixes = sorted({str(p) + os.sep for r in roots for p in (r, r.resolve()) if p.is_absolute()}, key=len,
                      reverse=True)
    for text in fig.findobj(Text):
        s = text.get_text()
        if any(p in s for p in prefixes):
            for p in prefixes:
                s = s.replace(p, "")
            text.set_text(s)


def draw(specs: Sequence[FigureSpec], inputs: Any, out: Path, formats: Sequence[str] = ("png",),
         progress: bool = True, roots: Sequence[Path] = ()) -> list[dict[str, Any]]:
    """Each figure of ``specs`` (``spec.make(inputs)``) into ``out`` in every format, its text rid of the folders
    ``roots``; one row per figure: figure, files, seconds."""
    import matplotlib.pyplot as plt

    from probe.core.progress import progress_bar

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    bar = progress_bar(len(specs), "figures", progress, unit="figure")  # a figure's analysis can take a minute
    for spec in specs:
        bar.set_description(spec.name)
        t0 = time.perf_counter()
        fig = spec.make(inputs)
        without_local_paths(fig, list(roots))
        files = []
        for fmt in formats:
            # no timestamp in the file: the same figure drawn twice is the same bytes
            meta = {"Software": None} if fmt == "png" else {"CreationDate": None} if fmt == "pdf" else {"Date": None}
            fig.savefig(out / f"{spec.name}.{fmt}", dpi=150 if fmt == "png" else None, bbox_inches="tight",
                        metadata=meta)
            files.append(f"{spec.name}.{fmt}")
        plt.close(fig)
        rows.append({"figure": spec.name, "files": ",".join(files), "seconds": time.perf_counter() - t0})
        bar.update(1)
        if progress:
            bar.write(f"{spec.name:24s} {rows[-1]['seconds']:6.1f} s  -> {', '.join(files)}", file=sys.stderr)
    bar.close()
    return rows


NO_COMMAND = ("error: probe.figures is plots and no command: a grid's figures come from python -m probe.sweep GRID "
              "--report --out DIR, each analysis draws its own with --out DIR, and this repository's figure set is "
              "made by the script that figures/README.md names")
"""What ``python -m probe.figures`` (a command once) says instead of doing nothing."""


@dataclass
class _NoCommandOptions(CommandOptions):
    """``python -m probe.figures`` takes no flag of its own: it only says where figures come from."""


def _refuse(options: _NoCommandOptions) -> Report:
    raise ProbeError(NO_COMMAND.removeprefix("error: "))


COMMAND = Command("figures", _NoCommandOptions, _refuse, "probe.figures is plots and no command: it says where a "
                  "grid's, an analysis's and this repository's figures come from", results_file=False)
main = COMMAND.main

if __name__ == "__main__":
    sys.exit(main())
