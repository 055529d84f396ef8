"""Every figure of the reproduction from the shipped checkpoints, with a captioned index (``figures/README.md``).

Usage: ``python -m probe.figures [--results DIR] [--out figures/] [--format png,pdf] [--only NAME ...]``.

``--results`` names a folder of committed results: the reproduction grid (``reproduction/``), the analyses' JSON
(``gradients/trajectories_shipped.json``) and the grids some figures are drawn from (``recurrent/``). Without it every
figure that can be is computed from the checkpoints, and a figure drawn from a grid is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from probe.cli import resolve_device
from probe.core.progress import progress_bar
from probe.core.tables import pipe_row, pipe_table
from probe.errors import ProbeError
from probe.runner import Command, Options, Report, option

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PRESETS = ("lstm", "transformer", "hybrid-joint", "hybrid-dat")
REPO = Path(__file__).resolve().parents[1]


class Inputs:
    """The analyses behind the figures, each computed once on first use and shared by every figure that needs it."""

    def __init__(self, checkpoints: Path, results: Path | None = None, seed: int = 0, device: str = "cpu",
                 quick: bool = False) -> None:
        self.checkpoints, self.results, self.seed, self.device = checkpoints, results, seed, device
        self.quick = quick  # small samples everywhere (--small): a smoke run of the pipeline, not numbers to report
        missing = [p for p in self.finals + self.trajectories if not p.exists()]
        if missing:
            wanted = ", ".join(p + ".pt" for p in PRESETS)
            raise ProbeError(f"missing shipped checkpoint(s): {', '.join(map(str, missing))} (--checkpoints names a "
                             f"folder with {wanted} and trajectories/hybrid-{{joint,dat}}/)")
        if results is not None and not results.is_dir():
            raise ProbeError(f"--results {results}: no such directory (it holds the reproduction grid, "
                             "reproduction/, and the analyses' JSON; pass an empty directory to recompute everything)")

    def validate(self) -> None:
        """Read every checkpoint the figures use, so that a damaged file fails in one line before any figure is
        drawn (not after minutes of analyses and with some figures written)."""
        from probe.checkpoint import load_checkpoint, resolve_checkpoints

        for path in resolve_checkpoints([str(p) for p in self.finals + self.trajectories]):
            load_checkpoint(path)

    @property
    def finals(self) -> list[Path]:
        return [self.checkpoints / f"{p}.pt" for p in PRESETS]

    @property
    def trajectories(self) -> list[Path]:
        return [self.checkpoints / "trajectories" / p for p in ("hybrid-joint", "hybrid-dat")]

    def ckpt(self, preset: str) -> Path:
        return self.checkpoints / f"{preset}.pt"

    @cached_property
    def train_length(self) -> int:
        """L_train of the shipped checkpoints (one task for all four)."""
        from probe.checkpoint import load_checkpoint

        return load_checkpoint(self.ckpt("hybrid-joint")).task_config.train_length

    @cached_property
    def curves(self) -> pd.DataFrame:
        """All seeds of the reproduction grid (``RESULTS/reproduction/``, a grid in compact form; an older
        ``evaluate.json`` envelope is read too); else the seed-0 checkpoints, evaluated here."""
        if self.results is not None and (self.results / "reproduction" / "runs.jsonl").is_file():
            from probe.results import load_curves

            return load_curves(self.results / "reproduction")
        # an envelope of ``python -m probe.evaluate --json``, as shipped before the compact grid
        candidates = () if self.results is None else (self.results / "evaluate.json",
                                                      self.results / "evaluate" / "results.json")
        path = next((p for p in candidates if p.exists()), None)
        if path is not None:
            df = pd.DataFrame(json.loads(path.read_text())["results"])
            return df[df.length.notna()].astype({"length": int}).assign(train_length=25)
        from probe.core.lengths import stepped, up_to
        from probe.evaluate import evaluate_checkpoints

        return evaluate_checkpoints(self.finals, n_samples=16 if self.quick else 128, seed=self.seed,
                                    device=self.device, default=stepped if self.quick else up_to)

    @cached_property
    def gradients_over_training(self) -> Any:
        """``RESULTS/gradients/trajectories_shipped.json`` (the CLI's output over the trajectories; the lookahead
        takes about 20 s a checkpoint); else computed, small when quick."""
        from probe import gradients

        path = None if self.results is None else self.results / "gradients" / "trajectories_shipped.json"
        if path is not None and path.exists() and not self.quick:
            return gradients.GradientReport.from_json(json.loads(path.read_text()))
        if not self.quick:
            return gradients.analyze(self.trajectories, seed=self.seed, device=self.device)
        from probe.checkpoint import resolve_checkpoints

        # a curve over training needs its ends and a middle, not every snapshot; one step size, two random draws
        snapshots = []
        for folder in self.trajectories:
            files = resolve_checkpoints([str(folder)])
            snapshots += list(dict.fromkeys([files[0], files[len(files) // 2], files[-1]]))
        cfg = gradients.LookaheadConfig(n_batches=2, batch_size=8, eval_batches=2, train_eval_batches=2,
                                        scales=(1.0,), n_random=2)
        return gradients.analyze(snapshots, seed=self.seed, device=self.device, batch_size=8, lookahead_cfg=cfg)

    @cached_property
    def gradients_final(self) -> Any:
        from probe import gradients

        return gradients.analyze([self.ckpt("hybrid-joint"), self.ckpt("hybrid-dat")], seed=self.seed,
                                 device=self.device, batch_size=16 if self.quick else 64, lookahead_cfg=None)

    @cached_property
    def attributions_final(self) -> Any:
        from probe import attributions

        return attributions.analyze([self.ckpt("hybrid-joint"), self.ckpt("hybrid-dat")], seed=self.seed,
                                    device=self.device, batch_size=4 if self.quick else 32,
                                    lengths=[self.train_length] if self.quick else None)

    @cached_property
    def probes(self) -> list[Any]:
        from probe.checkpoint import load_checkpoint
        from probe.probes import run_probes

        kw: dict[str, Any] = dict(n_train=40, n_train_beyond=16, n_test=8, n_patch=8,
                                  lengths=[self.train_length, 3 * self.train_length]) if self.quick else {}
        return [run_probes(load_checkpoint(p), device=self.device, seed=self.seed, **kw) for p in self.finals]

    @cached_property
    def shortcuts(self) -> list[Any]:
        from probe.shortcuts import analyze

        kw: dict[str, Any] = dict(n_sequences=16, window_samples=32, lengths=[self.train_length]) if self.quick else {}
        return [analyze(p, device=self.device, seed=self.seed, **kw) for p in self.finals]

    @cached_property
    def shortcut_figures(self) -> dict[str, Figure]:
        from probe.shortcuts import report_figures

        return report_figures(self.shortcuts)


@dataclass(frozen=True)
class FigureSpec:
    name: str
    caption: str
    command: str
    inputs: str
    make: Callable[[Inputs], Figure]
    needs: str | None = None
    """A grid under ``--results`` the figure is drawn from and that cannot be recomputed here (a sweep of many
    training runs): without it the figure is skipped, with a line saying so, unless ``--only`` asks for it."""
    computed_from: str | None = None
    """What the figure is computed from when ``--results`` does not hold its ``inputs``."""

    def shown(self, results: str | None) -> tuple[str, str]:
        """``command`` and ``inputs`` with ``{results}`` as the folder given; without one, the inputs are what the
        figure is computed from."""
        command = self.command.replace(RESULTS_MARK, results or "RESULTS")
        if RESULTS_MARK not in self.inputs:
            return command, self.inputs
        return command, self.inputs.replace(RESULTS_MARK, results) if results else (self.computed_from or "—")


RESULTS_MARK = "{results}"


def _accuracy(i: Inputs) -> Figure:
    from probe.evaluate import plot_length_curves

    return plot_length_curves(i.curves)


def _recurrence(i: Inputs) -> Figure:
    from probe.results import load_curves
    from probe.sweep.aggregate import _bands, aggregate
    from probe.sweep.plots import plot_by_cell

    report = aggregate(i.results / "recurrent")
    curves = report.curves
    # the LSTM's own runs, for reference (evaluated to 4x only): the reproduction's LSTM, the mechanism grid's hybrids
    refs = [(i.results / "reproduction", {"lstm": "lstm"}),
            (i.results / "mechanism", {"joint": "hybrid-lstm-joint", "dat": "hybrid-lstm-dat"})]
    extra = []
    for path, names in refs:
        if (path / "runs.jsonl").is_file():
            c = load_curves(path)
            c = c[c.variant.isin(names)]
            extra.append(c.assign(variant=c.variant.map(names)))
    if extra:
        curves = pd.concat([*extra, curves], ignore_index=True)
    return plot_by_cell(curves, _bands(curves, list(dict.fromkeys(curves.variant))))


def _fresh_windows(i: Inputs) -> Figure:
    from probe.sweep.aggregate import aggregate
    from probe.sweep.plots import plot_windows

    report = aggregate(i.results / "fresh")
    if report.grid is None or report.grid.windows.empty:
        raise ProbeError(f"{i.results / 'fresh'}: its runs were not scored per window of positions")
    return plot_windows(report.grid.windows, report.windows)


def _grad_training(i: Inputs) -> Figure:
    from probe.gradients import plot_over_training

    return plot_over_training(i.gradients_over_training.interference)


def _grad_lookahead(i: Inputs) -> Figure:
    from probe.gradients import plot_lookahead

    return plot_lookahead(i.gradients_over_training.lookahead)


def _grad_blocks(i: Inputs) -> Figure:
    from probe.gradients import plot_blocks

    table = i.gradients_final.interference
    return plot_blocks(table[table.checkpoint == str(i.ckpt("hybrid-joint"))])


def _attr_distance(i: Inputs) -> Figure:
    from probe.attributions import plot_occlusion

    return plot_occlusion(i.attributions_final.occlusion)


def _attr_reads(i: Inputs) -> Figure:
    from probe.attributions import plot_reads

    return plot_reads(i.attributions_final.reads)


def _attr_components(i: Inputs) -> Figure:
    from probe.attributions import plot_components

    return plot_components(i.attributions_final.components)


def _probe_heatmap(i: Inputs) -> Figure:
    from probe.probes import plot_heatmap

    return plot_heatmap(i.probes)


def _probe_position(i: Inputs) -> Figure:
    from probe.probes import plot_position

    return plot_position(i.probes)


def _probe_compare(i: Inputs) -> Figure:
    from probe.probes import plot_compare

    return plot_compare(i.probes)


_ALL = "checkpoints/{lstm,transformer,hybrid-joint,hybrid-dat}.pt"
_TRAJECTORIES = "checkpoints/trajectories/hybrid-{joint,dat}"
FIGURES: list[FigureSpec] = [
    FigureSpec("accuracy_vs_length",
               "Token accuracy vs stream length for the four presets on the interleaved task, per subtask (state "
               "tracking, recall). Line: mean over seeds; band: min-max over seeds; shaded: training lengths 1-25.",
               "python -m probe.evaluate runs/*/seed*/final.pt --lengths 1:100",
               "{results}/reproduction/ (all seeds)", _accuracy, computed_from=_ALL + " (seed 0)"),
    FigureSpec("which_recurrence",
               "State accuracy vs stream length (log axis, to 16x L_train) for each recurrent cell, alone and in the "
               "2-block hybrid trained jointly or with DAT (and with stopgrad-rnn where joint falls off): mean over "
               "seeds (thick), 95% t-interval (band), each seed (thin); top row the state mod 10, bottom row its "
               "parity (mod 2); dotted: chance; shaded: training lengths 1-25. The LSTM column is the reproduction's "
               "LSTM and the mechanism grid's joint and DAT hybrids, evaluated to 4x only.",
               "python -m probe.sweep {results}/recurrent --report --out runs/recurrent-report",
               "{results}/{recurrent,reproduction,mechanism}/", _recurrence, needs="recurrent"),
    FigureSpec("fresh_by_window",
               "The metric of record on fresh seeds (10-19, never used to find a claim): token accuracy per window of "
               "stream positions (in range, then (1x, 2x] ... (8x, 16x] of L_train = 25) for the four headline "
               "presets, each in bf16 and fp32; one panel for the state, one for each factor of Z_10 (parity, mod 5) "
               "and one for recall; dots: each seed; bars: mean over seeds with its 95% t-interval; dashed: chance.",
               "python -m probe.sweep {results}/fresh --report --out runs/fresh-report",
               "{results}/fresh/", _fresh_windows, needs="fresh"),
    FigureSpec("gradient_interference",
               "Gradient interference over training, joint vs DAT (the shipped trajectories): |g_att|/|g| and "
               "the cosines of the attention-path gradient on the LSTM weights with the recurrent-path gradient of "
               "the state loss, at L_train and 3 L_train, on one batch each. Dashed: DAT switches attention on.",
               "python -m probe.gradients checkpoints/trajectories/hybrid-joint checkpoints/trajectories/hybrid-dat",
               "{results}/gradients/trajectories_shipped.json", _grad_training, computed_from=_TRAJECTORIES),
    FigureSpec("gradient_lookahead",
               "Lookahead over training, joint vs DAT (the shipped trajectories): z = first-order change / "
               "standard error of the training loss and of the state loss at L_train and 3 L_train after a small "
               "step along -g_att, -g_rec and -g of the training loss (averaged over lengths 1-25 as the trainer "
               "samples them); grey: |z| < 2; joint: steps preconditioned by the AdamW second moments its "
               "snapshots hold, DAT: raw gradients (its snapshots hold none). z > 2 in the 3x column with z < -2 "
               "for the training loss is what the interference hypothesis predicts for g_att.",
               "python -m probe.gradients checkpoints/trajectories/hybrid-joint checkpoints/trajectories/hybrid-dat",
               "{results}/gradients/trajectories_shipped.json", _grad_lookahead, computed_from=_TRAJECTORIES),
    FigureSpec("gradient_blocks",
               "Per-block interference of the final joint hybrid: |g_att|/|g| and cosines per LSTM block and length.",
               "python -m probe.gradients checkpoints/hybrid-joint.pt", "checkpoints/hybrid-joint.pt", _grad_blocks),
    FigureSpec("attribution_distance",
               "Occlusion, joint vs DAT hybrid: fraction of state answers that follow a resampled number to its "
               "recomputed label, by distance back, with nothing patched (total), with every attention output held "
               "at its clean value (recurrent only) and with every LSTM output held (attention only); band: 95% "
               "interval over 32 sequences; square: a resampled dictionary token (flip rate).",
               "python -m probe.attributions checkpoints/hybrid-joint.pt checkpoints/hybrid-dat.pt",
               "checkpoints/hybrid-{joint,dat}.pt", _attr_distance),
    FigureSpec("attribution_reads",
               "Where attention reads from: value-weighted attention of the state answers by distance back to the "
               "key, per block, joint vs DAT hybrid; square: the dictionary prefix.",
               "python -m probe.attributions checkpoints/hybrid-joint.pt checkpoints/hybrid-dat.pt",
               "checkpoints/hybrid-{joint,dat}.pt", _attr_reads),
    FigureSpec("attribution_components",
               "Drop of the correct answer's logit when one sublayer output (each block's LSTM or attention) is "
               "zeroed, per subtask, joint vs DAT hybrid (exact ablation).",
               "python -m probe.attributions checkpoints/hybrid-joint.pt checkpoints/hybrid-dat.pt",
               "checkpoints/hybrid-{joint,dat}.pt", _attr_components),
    FigureSpec("probe_heatmap",
               "Linear-probe accuracy for s_t mod m at positions beyond the training range (t > 25) only, per hook "
               "(a+b: concatenated hooks) and test length (2x-4x L_train), four presets. Colour and top number: "
               "probe trained on t <= 25; below: probe trained on t = 26-75 of held-out sequences, and (c) the same "
               "probe fit to the control target sum pi(x_i) mod 10 (pi a fixed non-affine permutation).",
               f"python -m probe.probes {_ALL}", _ALL, _probe_heatmap),
    FigureSpec("probe_position",
               "Probe accuracy for s_t by stream position on length-100 sequences, best hook and best LSTM-state "
               "hook, trained in range (solid) and beyond it (dashed), with the control target (dotted); training "
               "range shaded.",
               f"python -m probe.probes {_ALL}", _ALL, _probe_position),
    FigureSpec("probe_compare",
               "Beyond the training range (t > 25) only. Left: the best LSTM-state probe vs test length, trained in "
               "range (solid) and beyond it (dashed), and the control target (dotted). Right: interventions on every "
               "LSTM block's state: later answers that follow the source under the whole-state and the "
               "probe-subspace interchange, and answers that change under a source with the same s_t.",
               f"python -m probe.probes {_ALL}", _ALL, _probe_compare),
    FigureSpec("shortcut_tests",
               "The four shortcut tests that apply to every family, four presets, 95% CIs: state-accuracy drop with "
               "each block's attention gate (or all) at 0, by length; fraction of answers changed when two numbers "
               "in the last k positions move by -d and +d (an exact tracker changes none), by length; state-accuracy "
               "drop inside and after a run of r zeros against the same sequences without it; state-accuracy drop "
               "when every answer moves k positions later (positional-code index shift, or k leading zeros).",
               f"python -m probe.shortcuts {_ALL}", _ALL, lambda i: i.shortcut_figures["tests"]),
    FigureSpec("shortcut_drops",
               "Position tests at L_train: accuracy drop under a random or permuted positional code (position "
               "dependence), an index shift +k and k leading zeros (positional offset; answers that stay inside "
               "the training range), 95% bootstrap CI over sequences; index tests are N/A without a positional code.",
               f"python -m probe.shortcuts {_ALL}", _ALL, lambda i: i.shortcut_figures["drops"]),
    FigureSpec("shortcut_window",
               "Window test: accuracy on recomputed labels and agreement with old predictions when every number more "
               "than k back is resampled.",
               f"python -m probe.shortcuts {_ALL}", _ALL, lambda i: i.shortcut_figures["window"]),
    FigureSpec("attention_entropy",
               "Attention entropy and recall mass on the value vs length (the softmax-sharpness limit).",
               f"python -m probe.shortcuts {_ALL}", _ALL, lambda i: i.shortcut_figures["entropy"]),
    FigureSpec("attention_heads",
               "Per-head share of the attention pattern explained by relative position vs content.",
               f"python -m probe.shortcuts {_ALL}", _ALL, lambda i: i.shortcut_figures["heads"]),
]


INDEX_HEADER = ("file", "caption", "same numbers from", "inputs", "seconds")
_INDEX_ROW = re.compile(r"^\| \[(?P<file>[^\]]+)\]\(.*\| (?P<secs>\d+|—) \|$")
_FORMATS = ("png", "pdf", "svg")


def _recorded_seconds(index: Path) -> dict[str, float]:
    """The seconds column of an earlier index, by figure: a figure this run does not remake keeps its row."""
    if not index.exists():
        return {}
    found = (_INDEX_ROW.match(line) for line in index.read_text().splitlines())
    return {Path(m["file"]).stem: float(m["secs"]) for m in found if m and m["secs"] != "—"}


def _row(out: Path, spec: FigureSpec, secs: float | None, results: str | None = None) -> str | None:
    files = [f"{spec.name}.{fmt}" for fmt in _FORMATS if (out / f"{spec.name}.{fmt}").exists()]
    if not files:
        return None
    links = ", ".join(f"[{f}]({f})" for f in files)
    caption = spec.caption.replace("|", "\\|")  # |g_att| would split the table cell
    shown = "—" if secs is None else f"{secs:.0f}"
    command, inputs = spec.shown(results)
    return pipe_row([links, caption, f"`{command}`", f"`{inputs}`", shown])


def _shown_path(path: Path) -> str:
    """A path as the index names it: relative to the working directory where it lies below it."""
    rel = os.path.relpath(path)
    return path.name if rel.startswith("..") else rel


def write_index(out: Path, made: dict[str, float], seed: int, only: bool = False, results: Path | None = None) -> bool:
    """``out/README.md``: one captioned row for every figure present in ``out``, in the order of ``FIGURES``, with
    the seconds it took (this run's for those in ``made``, the earlier index's for the others) and the ``--results``
    folder they were drawn from (None: computed from the checkpoints).

    With ``only`` (``--only NAME``) an existing index keeps every line it has, so that remaking a figure does not
    change a committed file: only a figure it does not list yet gets a row. Returns whether the file changed."""
    index = out / "README.md"
    if only and index.exists():
        lines = index.read_text().splitlines()
        found = {m["file"].split(".")[0]: n for n, line in enumerate(lines) if (m := _INDEX_ROW.match(line))}
        missing = [s for s in FIGURES if s.name in made and s.name not in found]
        if not missing:
            return False
        shown = None if results is None else _shown_path(results)
        block = [lines[found[s.name]] if s.name in found else _row(out, s, made.get(s.name), shown) for s in FIGURES
                 if s.name in found or s in missing]
        rows_at = sorted(found.values())
        start, stop = (rows_at[0], rows_at[-1] + 1) if rows_at else (len(lines), len(lines))
        lines[start:stop] = [r for r in block if r is not None]
        index.write_text("\n".join(lines) + "\n")
        return True
    before = _recorded_seconds(index)
    shown_results = None if results is None else _shown_path(results)
    rows, total = [], 0.0
    for spec in FIGURES:
        secs = made.get(spec.name, before.get(spec.name))
        row = _row(out, spec, secs, shown_results)
        if row is None:
            continue
        total += secs or 0.0
        rows.append(row)
    flag, drawn = ("", "") if shown_results is None else (
        f" --results {shown_results}", f" and `{shown_results}/reproduction/` (all trained seeds)")
    lines = ["# Figures", "",
             f"Made by `python -m probe.figures{flag} --out {_shown_path(out)}` (analysis seed {seed}) from the "
             f"shipped checkpoints in `checkpoints/` (the joint hybrid: the median of five seeds; the others: seed 0)"
             f"{drawn}; the figures below took {total:.0f} s on one CPU core (`--only NAME` remakes one and leaves "
             "this index as it is, adding a row only for a figure it does not list). Each row says which command "
             "computes the same numbers.", "",
             pipe_table(INDEX_HEADER, []), *rows]
    index.write_text("\n".join(lines) + "\n")
    return True


def _without_local_paths(fig: Figure, roots: list[Path]) -> None:
    """Name checkpoints in figure text by their path inside the checkpoints folder (``hybrid-dat.pt``): where that
    folder sits on the machine that drew the figure means nothing to its reader."""
    from matplotlib.text import Text

    prefixes = sorted({str(p) + os.sep for r in roots for p in (r, r.resolve()) if p.is_absolute()}, key=len,
                      reverse=True)
    for text in fig.findobj(Text):
        s = text.get_text()
        if any(p in s for p in prefixes):
            for p in prefixes:
                s = s.replace(p, "")
            text.set_text(s)


def draw(specs: list[FigureSpec], inputs: Inputs, out: Path, formats: Sequence[str] = ("png",),
         progress: bool = True) -> list[dict[str, Any]]:
    """Each figure of ``specs`` into ``out`` in every format; one row per figure: figure, files, seconds."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    # an analysis behind one figure can run for a minute: the bar names the figure being made meanwhile
    bar = progress_bar(len(specs), "figures", progress, unit="figure")
    for spec in specs:
        bar.set_description(spec.name)
        t0 = time.perf_counter()
        fig = spec.make(inputs)
        _without_local_paths(fig, [p for p in (inputs.checkpoints, inputs.results, REPO) if p is not None])
        files = []
        for fmt in formats:
            fig.savefig(out / f"{spec.name}.{fmt}", dpi=150 if fmt == "png" else None, bbox_inches="tight")
            files.append(f"{spec.name}.{fmt}")
        plt.close(fig)
        rows.append({"figure": spec.name, "files": ",".join(files), "seconds": time.perf_counter() - t0})
        bar.update(1)
        if progress:
            bar.write(f"{spec.name:24s} {rows[-1]['seconds']:6.1f} s  -> {', '.join(files)}", file=sys.stderr)
    bar.close()
    return rows


# --- CLI ------------------------------------------------------------------------------------------------------------
@dataclass
class FigureOptions(Options):
    format: str = option("png", "comma list of png, pdf, svg (default png)")
    only: list[str] | None = option(None, "make only these figures (an existing index is left as it is)", nargs="+",
                                    metavar="NAME", type=str)
    checkpoints: str = option(str(REPO / "checkpoints"), "shipped checkpoints directory")
    results: str | None = option(None, "a folder of results: the reproduction grid (reproduction/), the analyses' "
                                       "JSON and the grids some figures are drawn from (default: none; every figure "
                                       "that can be is computed from the checkpoints)", metavar="DIR")
    retrain: bool = option(False, argparse.SUPPRESS)  # removed: says so in one line
    quiet: bool = option(False, "no progress bar or per-figure lines on stderr")
    quick: bool = option(False, "tiny samples, fewer lengths and three snapshots of each trajectory: every figure "
                                "drawn end to end as a check of the pipeline, numbers not for reporting; 56 s of "
                                "CPU on one thread of a 2-core Xeon VM (benchmarks/cli_defaults.py)", flag="--small",
                         aliases=["--quick"])
    out: str = option("figures", "output directory for the figures and their index README.md (default figures/)",
                      metavar="DIR", order=4)


def run(opts: FigureOptions) -> Report:
    formats = [f.strip() for f in opts.format.split(",") if f.strip()]
    if not formats or set(formats) - {"png", "pdf", "svg"}:
        raise ProbeError(f"bad --format {opts.format!r}: use a comma list of png, pdf, svg")
    specs = FIGURES
    if opts.only:
        unknown = set(opts.only) - {s.name for s in FIGURES}
        if unknown:
            raise ProbeError(f"unknown figure(s) {', '.join(sorted(unknown))}; known: "
                             + ", ".join(s.name for s in FIGURES))
        specs = [s for s in FIGURES if s.name in opts.only]
    quiet = opts.quiet or opts.no_progress
    if opts.retrain:
        raise ProbeError("--retrain is gone: train the runs first (python -m probe.sweep ... --out RUNS), then "
                         "draw the figures from their checkpoints (--checkpoints) and results (--results)")
    results = None if opts.results is None else Path(opts.results)
    inputs = Inputs(Path(opts.checkpoints), results, opts.seed, str(resolve_device(opts.device)), opts.quick)
    inputs.validate()

    def grid(s: FigureSpec) -> str:
        return f"--results {s.needs}/" if results is None else f"{results / s.needs}/"

    absent = [s for s in specs if s.needs and (results is None or not (results / s.needs / "runs.jsonl").is_file())]
    if absent and opts.only:
        s = absent[0]
        raise ProbeError(f"{s.name} is drawn from the grid {grid(s)}, which is not there (python -m probe.results "
                         f"collect RUNS {'DIR' if results is None else results}/{s.needs} makes it)")
    for s in absent:
        if not quiet:
            print(f"{s.name}: skipped, no grid {grid(s)} to draw it from", file=sys.stderr)
    t_all, out = time.perf_counter(), Path(opts.out)
    rows = draw([s for s in specs if s not in absent], inputs, out, formats, progress=not quiet)
    changed = write_index(out, {r["figure"]: r["seconds"] for r in rows}, opts.seed, only=bool(opts.only),
                          results=results)
    if not quiet:
        n_files = sum(len(r["files"].split(",")) for r in rows)
        print(f"wrote {n_files} files{' and README.md' if changed else ''} to {out} in "
              f"{time.perf_counter() - t_all:.0f} s", file=sys.stderr)
    return Report([str(p) for p in inputs.finals], rows)


COMMAND = Command("figures", FigureOptions, run, __doc__.split("\n\n")[0],
                  "figures: " + ", ".join(s.name for s in FIGURES), results_file=False)
main, build_parser = COMMAND.main, COMMAND.build_parser


if __name__ == "__main__":
    sys.exit(main())
