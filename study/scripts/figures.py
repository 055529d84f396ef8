"""The paper's figure set: every figure of the study, captioned, into ``figures/`` with its index ``README.md``.

Usage: ``python study/scripts/figures.py [--only NAME ...] [--analyses] [--recompute] [--out figures]``.

By default every figure whose numbers are committed is drawn from them (``study/results/``: the reproduction grid,
the recurrent and fresh grids, the gradient analysis over the shipped trajectories), plus ``gradient_blocks`` from the
shipped checkpoints (a few seconds). ``--analyses`` also runs the analyses behind the attribution, probe, shortcut and
attention figures on the shipped checkpoints; ``--recompute`` computes what the default reads from ``study/results/``
from the checkpoints instead (a grid of many training runs cannot be, and is still read). Each flag's help says what
it costs. The plots themselves are probe's (``probe.figures`` and each analysis's plot functions); what is the
study's here is which runs, which captions and which files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_format import rows_of  # noqa: E402  (beside this file)

from probe.errors import ProbeError  # noqa: E402
from probe.figures import FigureSpec, draw, plot_accuracy_vs_length, plot_over_training, plot_window_seeds  # noqa: E402
from probe.figures import write_index as _write_index  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PRESETS = ("lstm", "transformer", "hybrid-joint", "hybrid-dat")
DRAWING_ORDER = ("transformer", "lstm", "hybrid-joint", "hybrid-dat")
"""Accuracy against length: the last drawn is on top, so DAT's curve is never hidden under the LSTM's at 1.0."""
MECHANISM_JOINT_SEEDS = (0, 1, 2, 3, 4)
BATCHES = 4
"""--recompute: batch draws per checkpoint and length of the interference, so that each point has an interval."""

# what each costs, measured (figures/README.md quotes the default run's; see its preamble)
DEFAULT_COST = ("70 s wall, 28 s of CPU, one torch thread, on a 2-core machine whose load average was 7-8 (a training "
                "grid and test runs on both cores)")
ANALYSES_COST = ("about 3 min more on one idle core (attributions 36 s, probes 91 s, shortcuts 51 s, as the run "
                 "that last made those figures recorded)")
RECOMPUTE_COST = ("over 15 min on a busy 2-core machine even with one batch draw per point (the reproduction's four "
                  "checkpoints at every length 1-100, the gradient analysis with its lookahead over 20 trajectory "
                  f"snapshots); {BATCHES} draws per point add the interference {BATCHES - 1} more times (not timed)")


# --- what the figures are drawn from --------------------------------------------------------------------------------
class Inputs:
    """The results and analyses behind the figures, each read or computed once on first use."""

    def __init__(self, checkpoints: Path, results: Path, seed: int = 0, device: str = "cpu", small: bool = False,
                 recompute: bool = False) -> None:
        self.checkpoints, self.results, self.seed, self.device = checkpoints, results, seed, device
        self.small = small  # tiny samples everywhere: a check of the pipeline, not numbers to report
        self.recompute = recompute
        missing = [p for p in self.finals + self.trajectories if not p.exists()]
        if missing:
            wanted = ", ".join(p + ".pt" for p in PRESETS)
            raise ProbeError(f"missing shipped checkpoint(s): {', '.join(map(str, missing))} (--checkpoints names a "
                             f"folder with {wanted} and trajectories/hybrid-{{joint,dat}}/)")
        if not results.is_dir():
            raise ProbeError(f"--results {results}: no such directory (it holds the committed results the figures "
                             "are drawn from)")

    def validate(self) -> None:
        """Read every checkpoint, so that a damaged file fails in one line before any figure is drawn."""
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

    def committed(self, relative: str) -> Path:
        path = self.results / relative
        if not path.exists():
            raise ProbeError(f"{path}: not there (pass --recompute to compute it from the checkpoints)")
        return path

    @cached_property
    def task(self) -> Any:
        from probe.checkpoint import load_checkpoint

        return load_checkpoint(self.ckpt("hybrid-joint")).task_config

    @cached_property
    def curves(self) -> pd.DataFrame:
        """Every seed of the reproduction grid; with --recompute the shipped (seed-0) checkpoints, evaluated here."""
        if not self.recompute:
            from probe.results import load_curves

            return load_curves(self.committed("reproduction")).assign(model=lambda d: d.variant)
        from probe.core.lengths import stepped, up_to
        from probe.evaluate import evaluate_checkpoints

        curves = evaluate_checkpoints(self.finals, n_samples=16 if self.small else 128, seed=self.seed,
                                      device=self.device, default=stepped if self.small else up_to)
        return curves.assign(model=[Path(c).stem for c in curves.checkpoint])

    @cached_property
    def gradients_over_training(self) -> Any:
        """The gradient analysis over the shipped trajectories (committed: one batch per point); with --recompute,
        computed here at ``BATCHES`` batch draws per point (small: three snapshots, one draw)."""
        from probe import gradients

        if not self.recompute:
            path = self.committed("gradients/trajectories_shipped.json")
            return gradients.GradientReport.from_json(json.loads(path.read_text()))
        from probe.checkpoint import resolve_checkpoints

        paths: list[Any] = list(self.trajectories)
        lookahead: dict[str, Any] = {}  # the analysis's default lookahead
        draws = BATCHES
        if self.small:  # a curve over training needs its ends and a middle; one step size, two random draws
            paths = []
            for folder in self.trajectories:
                files = resolve_checkpoints([str(folder)])
                paths += list(dict.fromkeys([files[0], files[len(files) // 2], files[-1]]))
            lookahead = {"lookahead_cfg": gradients.LookaheadConfig(n_batches=2, batch_size=8, eval_batches=2,
                                                                    train_eval_batches=2, scales=(1.0,), n_random=2)}
            draws = 1
        batch = 8 if self.small else 64
        report = gradients.analyze(paths, seed=self.seed, device=self.device, batch_size=batch, **lookahead)
        more = [gradients.analyze(paths, seed=self.seed + k, device=self.device, batch_size=batch,
                                  lookahead_cfg=None).interference.assign(batch=k) for k in range(1, draws)]
        report.interference = pd.concat([report.interference.assign(batch=0), *more], ignore_index=True)
        return report

    @cached_property
    def interference_seeds(self) -> pd.DataFrame:
        """The interference over training of every run that has it: the shipped trajectories (joint, DAT) and,
        from committed results, the mechanism grid's joint seeds (bf16; not with --recompute)."""
        shipped = self.gradients_over_training.interference
        shipped = shipped.assign(series=shipped.schedule.map({"joint": "joint-shipped", "delayed": "dat-shipped",
                                                              "dat": "dat-shipped"}))
        if self.recompute:
            return shipped
        grid = []
        for seed in MECHANISM_JOINT_SEEDS:
            path = self.results / "gradients" / f"mechanism_joint_seed{seed}.json"
            if path.exists():
                rows = pd.DataFrame(rows_of(json.loads(path.read_text())["results"]))
                rows = rows[rows.analysis == "interference"]
                # last.pt repeats the trajectory's last snapshot: one point per step
                grid.append(rows.drop_duplicates(["step", "length", "block"]).assign(series="joint-grid"))
        return pd.concat([shipped, *grid], ignore_index=True)

    @cached_property
    def gradients_final(self) -> Any:
        from probe import gradients

        return gradients.analyze([self.ckpt("hybrid-joint"), self.ckpt("hybrid-dat")], seed=self.seed,
                                 device=self.device, batch_size=16 if self.small else 64, lookahead_cfg=None)

    @cached_property
    def attributions_final(self) -> Any:
        from probe import attributions

        return attributions.analyze([self.ckpt("hybrid-joint"), self.ckpt("hybrid-dat")], seed=self.seed,
                                    device=self.device, batch_size=4 if self.small else 32,
                                    lengths=[self.task.train_length] if self.small else None)

    @cached_property
    def probes(self) -> list[Any]:
        from probe.checkpoint import load_checkpoint
        from probe.probes import run_probes

        lt = self.task.train_length
        kw: dict[str, Any] = dict(n_train=40, n_train_beyond=16, n_test=8, n_patch=8,
                                  lengths=[lt, 3 * lt]) if self.small else {}
        return [run_probes(load_checkpoint(p), device=self.device, seed=self.seed, **kw) for p in self.finals]

    @cached_property
    def shortcut_figures(self) -> dict[str, Figure]:
        from probe.shortcuts import analyze, report_figures

        kw: dict[str, Any] = dict(n_sequences=16, window_samples=32,
                                  lengths=[self.task.train_length]) if self.small else {}
        return report_figures([analyze(p, device=self.device, seed=self.seed, **kw) for p in self.finals])


# --- the figures ----------------------------------------------------------------------------------------------------
def _accuracy(i: Inputs) -> Figure:
    from probe.core.chance import chance

    subtasks = ("state", "recall")
    names = {"state": f"state tracking (running sum mod {i.task.m})", "recall": "associative recall"}
    return plot_accuracy_vs_length(i.curves, subtasks, hue="model", order=DRAWING_ORDER, labels=names,
                                   chance={s: chance(i.task, s) for s in subtasks}, train_length=i.task.train_length)


def _recurrence(i: Inputs) -> Figure:
    from probe.results import load_curves
    from probe.sweep.aggregate import _bands, aggregate
    from probe.sweep.plots import plot_by_cell

    curves = aggregate(i.results / "recurrent").curves
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


FRESH_CONDITIONS = {"joint": "2-block hybrid, joint", "dat": "2-block hybrid, DAT",
                    "joint4": "4-block hybrid, joint", "dat4": "4-block hybrid, DAT"}
"""The fresh grid's variant stems (``joint4-bf16``: the 4-block joint hybrid in bf16), as a reader knows them."""
PRECISIONS = {"bf16": "trained in bfloat16 (autocast, float32 master weights)", "fp32": "trained in float32"}


def _fresh_windows(i: Inputs) -> Figure:
    from probe.sweep.aggregate import aggregate

    report = aggregate(i.results / "fresh")
    if report.grid is None or report.grid.windows.empty:
        raise ProbeError(f"{i.results / 'fresh'}: its runs were not scored per window of positions")
    w = report.grid.windows
    stem, precision = w.variant.str.rsplit("-", n=1).str[0], w.variant.str.rsplit("-", n=1).str[1]
    w = w.assign(condition=stem, precision=precision)
    return plot_window_seeds(w, hue="condition", column="precision", order=list(FRESH_CONDITIONS),
                             column_order=[p for p in PRECISIONS if p in set(precision)],
                             labels={**FRESH_CONDITIONS, **PRECISIONS})


INTERFERENCE_SERIES = {"joint-grid": "joint, mechanism grid, bf16", "joint-shipped": "joint, shipped run",
                       "dat-shipped": "DAT, shipped run"}


def _grad_training(i: Inputs) -> Figure:
    table = i.interference_seeds
    table = table[table.block.astype(str) == "all"]
    metrics = [("att_ratio", "|g_att| / |g|"), ("cos_att_rec_state", "cos(g_att, g_rec^state)"),
               ("cos_att_recall_rec_state", "cos(g_att^recall, g_rec^state)")]
    return plot_over_training(table, metrics, hue="series", order=[s for s in INTERFERENCE_SERIES
                                                                   if (table.series == s).any()],
                              labels=INTERFERENCE_SERIES, train_length=i.task.train_length)


def _grad_lookahead(i: Inputs) -> Figure:
    from probe.gradients import plot_lookahead

    return plot_lookahead(i.gradients_over_training.lookahead)


def _grad_blocks(i: Inputs) -> Figure:
    from probe.gradients import plot_blocks

    table = i.gradients_final.interference
    return plot_blocks(table[table.checkpoint == str(i.ckpt("hybrid-joint"))])


def _attr(kind: str) -> Any:
    def make(i: Inputs) -> Figure:
        from probe import attributions

        report = i.attributions_final
        plot = {"occlusion": attributions.plot_occlusion, "reads": attributions.plot_reads,
                "components": attributions.plot_components}[kind]
        return plot(getattr(report, kind))
    return make


def _probe(kind: str) -> Any:
    def make(i: Inputs) -> Figure:
        from probe import probes

        return getattr(probes, f"plot_{kind}")(i.probes)
    return make


_ALL = "checkpoints/{lstm,transformer,hybrid-joint,hybrid-dat}.pt"
_PAIR = "checkpoints/hybrid-{joint,dat}.pt"
_TRAJ = "python -m probe.gradients checkpoints/trajectories/hybrid-joint checkpoints/trajectories/hybrid-dat"
RESULTS, ANALYSES = "results", "analyses"
GRIDS = {"which_recurrence": "recurrent", "fresh_by_window": "fresh"}
"""Figures drawn from a grid of many training runs, which no flag recomputes."""
COMMITTED = {"accuracy_vs_length": "reproduction/runs.jsonl",
             "gradient_interference": "gradients/trajectories_shipped.json",
             "gradient_lookahead": "gradients/trajectories_shipped.json"}
"""What a figure reads from --results unless --recompute computes it."""

FIGURES: list[tuple[FigureSpec, str]] = [
    (FigureSpec("accuracy_vs_length",
                "Token accuracy vs stream length for the four presets on the interleaved task, per subtask (state "
                "tracking, recall), every trained seed (3 each, seeds 0-2): thin lines each seed, thick the mean over "
                "seeds with a marker and line style per model, band its 95% t-interval; dashed: chance (a uniform "
                "guess: 1/10 for the state, 1/16 for recall); shaded: training lengths 1-25. The DAT hybrid is "
                "drawn last, on top of the LSTM where both are at 1.0.",
                "python -m probe.evaluate runs/*/seed*/final.pt --lengths 1:100",
                "study/results/reproduction/ (all seeds)", _accuracy), RESULTS),
    (FigureSpec("which_recurrence",
                "State accuracy vs stream length (log axis, to 16x L_train) for each recurrent cell, alone and in the "
                "2-block hybrid trained jointly or with DAT (and with stopgrad-rnn where joint falls off): mean over "
                "seeds (thick), 95% t-interval (band), each seed (thin); top row the state mod 10, bottom row its "
                "parity (mod 2); dotted: chance; shaded: training lengths 1-25. The LSTM column is the "
                "reproduction's LSTM and the mechanism grid's joint and DAT hybrids, evaluated to 4x only.",
                "python -m probe.sweep study/results/recurrent --report --out runs/recurrent-report",
                "study/results/{recurrent,reproduction,mechanism}/", _recurrence), RESULTS),
    (FigureSpec("fresh_by_window",
                "The metric of record on fresh seeds (10-19, never run before this grid; the claims were found on "
                "0-9): token accuracy per window of stream positions (in range, then (1x, 2x] ... (8x, 16x] of "
                "L_train = 25) for the 2-block and "
                "4-block hybrids trained jointly or with DAT; left column trained in bfloat16, right in float32; one "
                "row for the state, one for each factor of Z_10 (parity, mod 5) and one for recall. Dots: every "
                "seed, set side by side where they coincide (a split into seeds that hold and seeds that fall shows "
                "as two clusters); open marker with bar: mean over the 10 seeds with its 95% t-interval; dashed: "
                "chance.",
                "python -m probe.sweep study/results/fresh --report --out runs/fresh-report",
                "study/results/fresh/", _fresh_windows), RESULTS),
    (FigureSpec("gradient_interference",
                "Gradient interference over training: |g_att|/|g| and the cosines of the attention-path gradient on "
                "the LSTM weights with the recurrent-path gradient of the state loss, at L_train and 3 L_train, each "
                "point on one batch of 64 sequences. Joint: the mechanism grid's five seeds (0-4, bf16; thin, "
                "seeds 2-4 measured at steps 250-1000 only) with their mean and 95% t-interval (thick, band) where "
                "at least three seeds were measured, and the shipped joint run (seed 4 of the reproduction); DAT: "
                "the shipped run (seed 0), the one DAT trajectory analysed, so no interval. Dashed vertical: DAT "
                "switches attention on.",
                _TRAJ, "study/results/gradients/{trajectories_shipped,mechanism_joint_seed*}.json", _grad_training),
     RESULTS),
    (FigureSpec("gradient_lookahead",
                "Lookahead over training, joint vs DAT (the shipped trajectories): z = first-order change / "
                "standard error of the training loss and of the state loss at L_train and 3 L_train after a small "
                "step along -g_att, -g_rec and -g of the training loss (averaged over lengths 1-25 as the trainer "
                "samples them); grey: |z| < 2; joint: steps preconditioned by the AdamW second moments its "
                "snapshots hold, DAT: raw gradients (its snapshots hold none). z > 2 in the 3x column with z < -2 "
                "for the training loss is what the interference hypothesis predicts for g_att.",
                _TRAJ, "study/results/gradients/trajectories_shipped.json", _grad_lookahead), RESULTS),
    (FigureSpec("gradient_blocks",
                "Per-block interference of the final joint hybrid: |g_att|/|g| and cosines per LSTM block and "
                "length.",
                "python -m probe.gradients checkpoints/hybrid-joint.pt", "checkpoints/hybrid-joint.pt", _grad_blocks),
     RESULTS),
    (FigureSpec("attribution_distance",
                "Occlusion, joint vs DAT hybrid: fraction of state answers that follow a resampled number to its "
                "recomputed label, by distance back, with nothing patched (total), with every attention output held "
                "at its clean value (recurrent only) and with every LSTM output held (attention only); band: 95% "
                "interval over 32 sequences; square: a resampled dictionary token (flip rate).",
                f"python -m probe.attributions {_PAIR}", _PAIR, _attr("occlusion")), ANALYSES),
    (FigureSpec("attribution_reads",
                "Where attention reads from: value-weighted attention of the state answers by distance back to the "
                "key, per block, joint vs DAT hybrid; square: the dictionary prefix.",
                f"python -m probe.attributions {_PAIR}", _PAIR, _attr("reads")), ANALYSES),
    (FigureSpec("attribution_components",
                "Drop of the correct answer's logit when one sublayer output (each block's LSTM or attention) is "
                "zeroed, per subtask, joint vs DAT hybrid (exact ablation).",
                f"python -m probe.attributions {_PAIR}", _PAIR, _attr("components")), ANALYSES),
    (FigureSpec("probe_heatmap",
                "Linear-probe accuracy for s_t mod m at positions beyond the training range (t > 25) only, per hook "
                "(a+b: concatenated hooks) and test length (2x-4x L_train), four presets. Colour and top number: "
                "probe trained on t <= 25; below: probe trained on t = 26-75 of held-out sequences, and (c) the "
                "same probe fit to the control target sum pi(x_i) mod 10 (pi a fixed non-affine permutation).",
                f"python -m probe.probes {_ALL}", _ALL, _probe("heatmap")), ANALYSES),
    (FigureSpec("probe_position",
                "Probe accuracy for s_t by stream position on length-100 sequences, best hook and best LSTM-state "
                "hook, trained in range (solid) and beyond it (dashed), with the control target (dotted); training "
                "range shaded.",
                f"python -m probe.probes {_ALL}", _ALL, _probe("position")), ANALYSES),
    (FigureSpec("probe_compare",
                "Beyond the training range (t > 25) only. Left: the best LSTM-state probe vs test length, trained in "
                "range (solid) and beyond it (dashed), and the control target (dotted). Right: interventions on "
                "every LSTM block's state: later answers that follow the source under the whole-state and the "
                "probe-subspace interchange, and answers that change under a source with the same s_t.",
                f"python -m probe.probes {_ALL}", _ALL, _probe("compare")), ANALYSES),
    (FigureSpec("shortcut_tests",
                "The four shortcut tests that apply to every family, four presets, 95% CIs: state-accuracy drop "
                "with each block's attention gate (or all) at 0, by length; fraction of answers changed when two "
                "numbers in the last k positions move by -d and +d (an exact tracker changes none), by length; "
                "state-accuracy drop inside and after a run of r zeros against the same sequences without it; "
                "state-accuracy drop when every answer moves k positions later (positional-code index shift, or k "
                "leading zeros).",
                f"python -m probe.shortcuts {_ALL}", _ALL, lambda i: i.shortcut_figures["tests"]), ANALYSES),
    (FigureSpec("shortcut_drops",
                "Position tests at L_train: accuracy drop under a random or permuted positional code (position "
                "dependence), an index shift +k and k leading zeros (positional offset; answers that stay inside "
                "the training range), 95% bootstrap CI over sequences; index tests are N/A without a positional "
                "code.",
                f"python -m probe.shortcuts {_ALL}", _ALL, lambda i: i.shortcut_figures["drops"]), ANALYSES),
    (FigureSpec("shortcut_window",
                "Window test: accuracy on recomputed labels and agreement with old predictions when every number "
                "more than k back is resampled.",
                f"python -m probe.shortcuts {_ALL}", _ALL, lambda i: i.shortcut_figures["window"]), ANALYSES),
    (FigureSpec("attention_entropy",
                "Attention entropy and recall mass on the value vs length (the softmax-sharpness limit).",
                f"python -m probe.shortcuts {_ALL}", _ALL, lambda i: i.shortcut_figures["entropy"]), ANALYSES),
    (FigureSpec("attention_heads",
                "Per-head share of the attention pattern explained by relative position vs content.",
                f"python -m probe.shortcuts {_ALL}", _ALL, lambda i: i.shortcut_figures["heads"]), ANALYSES),
]
SPECS = [s for s, _ in FIGURES]

PREAMBLE = ("Made by `python study/scripts/figures.py` (analysis seed 0; the plots are `probe.figures`' and each "
            "analysis's). By default it draws every figure whose numbers are committed in `study/results/` "
            "(accuracy_vs_length, which_recurrence, fresh_by_window, gradient_interference, gradient_lookahead) and "
            f"gradient_blocks from the shipped checkpoints in `checkpoints/`: {DEFAULT_COST}. `--analyses` also "
            f"remakes the attribution, probe, shortcut and attention figures from the checkpoints: {ANALYSES_COST}. "
            "`--recompute` computes what the default reads from `study/results/` from the checkpoints instead: "
            f"{RECOMPUTE_COST}. `--only NAME` remakes one figure and keeps the other rows as they are. The seconds "
            "column is each figure's own time in the last run that wrote its row ({seconds} s in all). Each row says "
            "which command computes the same numbers.")


def write_index(out: Path, made: dict[str, float], only: bool = False) -> bool:
    """``out/README.md`` for ``SPECS``; with ``only`` a figure the index lists already keeps its row's seconds, so
    that remaking one figure does not change a committed index."""
    if only:
        from probe.figures import _recorded_seconds

        listed = _recorded_seconds(out / "README.md")
        made = {k: v for k, v in made.items() if k not in listed}
    return _write_index(out, SPECS, made, PREAMBLE)


# --- command line ---------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python study/scripts/figures.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "figures"), metavar="DIR",
                   help="output directory for the figures and their index README.md (default figures/)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="make only these figures: " + ", ".join(
        s.name for s in SPECS))
    p.add_argument("--analyses", action="store_true",
                   help=f"also the figures of the analyses run on the shipped checkpoints (attributions, probes, "
                        f"shortcuts): {ANALYSES_COST}")
    p.add_argument("--recompute", action="store_true",
                   help=f"compute from the checkpoints what the default reads from --results, and draw every figure: "
                        f"{RECOMPUTE_COST}")
    p.add_argument("--small", action="store_true",
                   help="tiny samples and three snapshots of each trajectory (with --recompute): a check of the "
                        "pipeline, numbers not for reporting")
    p.add_argument("--results", default=str(ROOT / "study" / "results"), metavar="DIR",
                   help="committed results (default study/results)")
    p.add_argument("--checkpoints", default=str(ROOT / "checkpoints"), metavar="DIR",
                   help="shipped checkpoints (default checkpoints/)")
    p.add_argument("--format", default="png", help="comma list of png, pdf, svg (default png)")
    p.add_argument("--seed", type=int, default=0, help="analysis seed (default 0)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or per-figure lines on stderr")
    return p


def run(args: argparse.Namespace) -> int:
    import torch

    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    if not formats or set(formats) - {"png", "pdf", "svg"}:
        raise ProbeError(f"bad --format {args.format!r}: use a comma list of png, pdf, svg")
    if args.only:
        unknown = set(args.only) - {s.name for s in SPECS}
        if unknown:
            raise ProbeError(f"unknown figure(s) {', '.join(sorted(unknown))}; known: "
                             + ", ".join(s.name for s in SPECS))
        specs = [s for s in SPECS if s.name in args.only]
    else:
        wanted = {RESULTS} | ({ANALYSES} if args.analyses or args.recompute else set())
        specs = [s for s, group in FIGURES if group in wanted]
    out, results = Path(args.out), Path(args.results)
    if out.exists() and not out.is_dir():
        raise ProbeError(f"--out {out}: a file is in the way (it names a directory)")
    torch.set_num_threads(args.threads)
    inputs = Inputs(Path(args.checkpoints), results, args.seed, args.device, args.small, args.recompute)
    inputs.validate()
    absent = [s for s in specs if s.name in GRIDS and not (results / GRIDS[s.name] / "runs.jsonl").is_file()]
    if absent and args.only:
        s = absent[0]
        raise ProbeError(f"{s.name} is drawn from the grid {results / GRIDS[s.name]}/, which is not there "
                         f"(python -m probe.results collect RUNS {results / GRIDS[s.name]} makes it)")
    if not args.recompute:
        for s in specs:
            if s.name in COMMITTED and not (results / COMMITTED[s.name]).is_file():
                raise ProbeError(f"{s.name} is drawn from {results / COMMITTED[s.name]}, which is not there (pass "
                                 "--recompute to compute it from the checkpoints)")
    for s in absent:
        if not args.quiet:
            print(f"{s.name}: skipped, no grid {results / GRIDS[s.name]}/ to draw it from", file=sys.stderr)
    t0 = time.perf_counter()
    rows = draw([s for s in specs if s not in absent], inputs, out, formats, progress=not args.quiet,
                roots=[inputs.checkpoints, results, ROOT])
    changed = write_index(out, {r["figure"]: r["seconds"] for r in rows}, only=bool(args.only))
    if not args.quiet:
        n_files = sum(len(r["files"].split(",")) for r in rows)
        print(f"wrote {n_files} files{' and README.md' if changed else ''} to {out} in "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ProbeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
