"""``python -m probe.sweep``: parse, plan, run on an executor, aggregate; exit 0 only if every run succeeded."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from probe.cli import resolve_device, run_cli, say, tidy
from probe.errors import ProbeError
from probe.sweep.aggregate import FIGURE, RESULTS, TABLE, aggregate, markdown_table, write_report
from probe.sweep.compare import compare, comparison_table, plot_seed_dots
from probe.sweep.config import SweepConfig, config_from_presets, load_config
from probe.sweep.executors import default_jobs, make_executor
from probe.sweep.runner import SweepOutcome, plan, run_sweep
from probe.sweep.worker import RunOptions

USAGE = """Usage:
  python -m probe.sweep CONFIG.toml --out DIR [--executor local|ray] [--jobs N] [--dry-run]
  python -m probe.sweep --preset P [P ...] --seeds S [S ...] [--steps N] [--set SECTION.FIELD=VALUE ...] --out DIR
  python -m probe.sweep DIR --report

Each run is `python -m probe.train` with its config in DIR/VARIANT/seedS/ (log: train.log), then
`python -m probe.evaluate` of its final.pt at lengths 1..4x L_train into eval.json. A run with final.pt and
eval.json is skipped; one with last.pt resumes from it. Exit code 0 if every run succeeded, 1 if one failed, 2 on
a bad command line or config."""

_HELP_JSON = """results.json / --json: the SPEC envelope. results rows are of two kinds (field "row"):
"run": {variant, run, checkpoint (relative to DIR), label, seed, train_length, length, subtask (state|recall|all),
token_acc, seq_acc, n_tokens}, and per run and subtask a row with length null, metric "lengthgen_score" and its
value in token_acc; "summary": {variant, subtask, metric (token_acc | lengthgen_score), factor (1-4, null for the
score), length, n_seeds, mean, ci_low, ci_high (bootstrap 95 % CI of the mean over seeds, percentile method),
seed_S (each seed's value)}. controls rows: seed_matches_folder (the checkpoint was trained with its folder's
seed), seeds_give_distinct_weights (no two seeds of a variant ended with the same weights). "missing" lists the
runs without a finished evaluation."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m probe.sweep", description=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_HELP_JSON)
    p.add_argument("target", nargs="?", help="a sweep config (.toml), or with --report a sweep's directory")
    p.add_argument("--preset", nargs="+", metavar="P", help="shorthand: one variant per preset, named after it")
    p.add_argument("--seeds", nargs="+", type=int, metavar="S", help="seeds (replace the config's)")
    p.add_argument("--steps", type=int, help="training steps of every run (replaces the presets' and the config's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override for every run, after the config's (as probe.train --set)")
    p.add_argument("--task", default=None, help="task of the --preset shorthand (default interleaved)")
    p.add_argument("--out", help="sweep directory: runs go to OUT/VARIANT/seedS/, results to OUT/")
    p.add_argument("--executor", default="local", choices=["local", "ray"],
                   help="local: a process pool on this machine (default); ray: Ray tasks (pip install -e \".[ray]\")")
    p.add_argument("--jobs", type=int, default=None,
                   help=f"runs at a time: local workers, or the CPUs of a local Ray instance (default: the "
                        f"cores, here {default_jobs()}); one thread per run")
    p.add_argument("--address", help="Ray cluster to use (e.g. auto, or HEAD:6379); default: start a local one")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto; every run trains there")
    p.add_argument("--gpus-per-run", type=float, default=1.0,
                   help="Ray with --device cuda: GPUs each run reserves (0.25 packs four runs on a GPU; default 1)")
    p.add_argument("--retries", type=int, default=3, help="reruns of a run whose worker died (default 3)")
    p.add_argument("--eval-samples", type=int, default=256, help="sequences per length in eval.json (default 256)")
    p.add_argument("--dry-run", action="store_true", help="print the runs, their state and commands; run nothing")
    p.add_argument("--report", action="store_true", help="re-aggregate the runs of DIR (or --out) without training")
    p.add_argument("--compare", nargs="+", metavar="VARIANT", default=[],
                   help="with the report: every variant against these baselines on state accuracy at 3x L_train "
                        "(difference of means, exact permutation p over seeds; rows with row=comparison), and a "
                        "figure of every seed's value (seeds_3x.png)")
    p.add_argument("--no-figure", action="store_true", help="results.json and results.md only")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print results.json's object on stdout (human text to stderr)")
    return p


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    if args.preset:
        if args.target:
            raise ProbeError(f"give a config ({args.target}) or --preset, not both")
        if not args.seeds:
            raise ProbeError("--preset needs --seeds S [S ...]")
        cfg = config_from_presets(args.preset, args.seeds, args.task or "interleaved")
        return cfg.with_command_line(None, args.steps, args.overrides)
    if not args.target:
        raise ProbeError("nothing to run: pass CONFIG.toml or --preset P ... --seeds S ... (see --help)")
    if args.task:
        raise ProbeError("--task is for the --preset shorthand; a config sets task = \"...\"")
    return load_config(args.target).with_command_line(args.seeds, args.steps, args.overrides)


def _device(args: argparse.Namespace) -> str:
    if args.executor == "ray" and args.address:
        # The cluster's nodes, not this driver, must have the device: only check that the name parses.
        if args.device == "auto":
            raise ProbeError("--device auto is decided on this machine; with --address name cpu or cuda")
        return str(_parse_device(args.device))
    return str(resolve_device(args.device))


def _parse_device(name: str) -> Any:
    import torch

    try:
        return torch.device(name)
    except RuntimeError:
        raise ProbeError(f"bad --device {name!r}: use cpu, cuda, cuda:N or auto") from None


def _report(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    report = aggregate(out)
    text = markdown_table(report)
    if args.compare:
        comparison = compare(report.curves, args.compare)
        report.result["results"] += tidy(comparison.to_dict("records"))
        text += "\n" + comparison_table(comparison)
    paths = write_report(report, out, figure=not args.no_figure)
    if args.compare:
        (out / TABLE).write_text(text)
        if not args.no_figure:
            import matplotlib.pyplot as plt

            fig = plot_seed_dots(report.curves, report.summary)
            fig.savefig(out / "seeds_3x.png", dpi=150)
            plt.close(fig)
            paths.append(out / "seeds_3x.png")
    print(text, file=sys.stderr if args.json else sys.stdout)
    print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return report.result


def _print_outcome(outcome: SweepOutcome) -> None:
    counts: dict[str, int] = {}
    for r in outcome.results:
        counts[r.status] = counts.get(r.status, 0) + 1
    startup = f"; Ray start-up {outcome.startup_s:.1f} s" if outcome.executor == "ray" else ""
    print(f"{len(outcome.results)} runs in {outcome.wall_s:.1f} s ({outcome.executor}{startup}): "
          + ", ".join(f"{n} {s}" for s, n in counts.items()), file=sys.stderr)
    for r in outcome.failed:
        print(f"  FAILED {r.key}: {r.error} (log: {r.log})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    failed = False

    def body(args: argparse.Namespace) -> dict[str, Any]:
        nonlocal failed
        if args.report:
            target = args.target or args.out
            if not target:
                raise ProbeError("--report needs the sweep directory: python -m probe.sweep DIR --report")
            return _report(args, Path(target))
        cfg = config_from_args(args)
        if args.dry_run:
            out = Path(args.out or "DIR")
            for run, state in plan(cfg, out):
                say(args, f"{run.key}  [{state}]  {run.out}")
                if state != "finished":
                    if state in ("new", "interrupted"):
                        say(args, "  " + run.command(resume=state == "interrupted"))
                    say(args, f"  {sys.executable} -m probe.evaluate {run.out / 'final.pt'} "
                              f"--samples {args.eval_samples} --json > {run.out / 'eval.json'}")
            return {}
        if not args.out:
            raise ProbeError("--out DIR is required: runs go to DIR/VARIANT/seedS/")
        for name, value in (("--jobs", args.jobs), ("--eval-samples", args.eval_samples)):
            if value is not None and value < 1:
                raise ProbeError(f"{name} {value}: must be at least 1")
        if args.retries < 0:
            raise ProbeError(f"--retries {args.retries}: must be 0 or more")
        device = _device(args)
        is_cuda = device.startswith("cuda")
        executor = make_executor(args.executor, args.jobs, args.address, args.retries,
                                 args.gpus_per_run if is_cuda else 0.0)
        if args.executor == "ray" and is_cuda:
            device = "cuda"  # Ray gives each task its GPU(s) through CUDA_VISIBLE_DEVICES
        opts = RunOptions(device=device, eval_samples=args.eval_samples)
        outcome = run_sweep(cfg, args.out, executor, opts, progress=not args.no_progress)
        _print_outcome(outcome)
        failed = bool(outcome.failed)
        if all(not r.ok for r in outcome.results):
            return {}
        return _report(args, Path(args.out))

    rc = run_cli(parser, body, argv)
    return rc or int(failed)


__all__ = ["main", "build_parser", "RESULTS", "TABLE", "FIGURE"]
