"""``python -m probe.sweep``: parse, plan, run on an executor, aggregate; exit 0 only if every run succeeded."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from probe.cli import (
    envelope,
    make_parser,
    nonnegative_int,
    positive_float,
    positive_int,
    resolve_device,
    run_cli,
    say,
    tidy,
)
from probe.core import interrupts
from probe.core.files import write_text_atomically
from probe.core.lock import folder_lock
from probe.errors import ProbeError
from probe.results import has_run_folders, load_grid
from probe.results.config import DEFAULT_LENGTHS, SweepConfig, config_from_presets, eval_lengths_for, load_config
from probe.sweep.aggregate import (
    FIGURE,
    RESULTS,
    TABLE,
    aggregate,
    markdown_table,
    save_figure,
    write_report,
)
from probe.sweep.claims import claims_markdown, judge, load_claims
from probe.sweep.compare import (
    compare,
    compare_target,
    comparison_table,
    expand_pairs,
    parse_compare,
    parse_target,
    plot_seed_dots,
    target_table,
)
from probe.sweep.executors import default_jobs, make_executor
from probe.sweep.runner import SweepOutcome, kept, plan, run_sweep
from probe.sweep.worker import RunOptions
from probe.training.overrides import build_configs
from probe.training.schedule import Schedule

DEFAULT_SAMPLES, QUICK_SAMPLES = 256, 32
USAGE = """Usage:
  python -m probe.sweep CONFIG.toml --out DIR [--executor local|ray] [--jobs N] [--dry-run]
  python -m probe.sweep --preset P [P ...] --seeds S [S ...] [--steps N] [--set SECTION.FIELD=VALUE ...] --out DIR
  python -m probe.sweep DIR --report [--out REPORT_DIR | --in-place]
  python -m probe.sweep --confirm CLAIMS.toml --out DIR [--no-train]

Each run is `python -m probe.train` with its config in DIR/VARIANT/seedS/ (log: train.log), then
`python -m probe.evaluate` of its final.pt to 16x L_train (every length to 4x, then every L_train; --eval-lengths)
into eval.json. A run with
final.pt and eval.json is skipped; one with last.pt resumes from it. The whole command line and every run's
configs are checked before any run starts. --report reads run folders or the compact form of results/ (runs.jsonl,
curves.csv); it writes into a sweep's own DIR, and a compact grid's report into --out (--in-place: into DIR).
SIGINT or SIGTERM (Ctrl-C, or a scheduler's stop) stops every run at its next step with last.pt written and says in
one line what is kept and the command that resumes (exit 130). One sweep at a time writes DIR (DIR/.lock). Exit
code 0 if every run succeeded, 1 if one failed, 2 on a bad command line or config, 130 when interrupted."""

_HELP_JSON = """Files in DIR after a run or --report: runs.jsonl (one summary per run: accuracies at 1-4x, 8x, 16x
L_train where evaluated, scores, precision, switch step, steps, wall time), curves.csv (every run x length x subtask:
n_tokens, correct, seq_acc), training.csv (the runs' metrics.jsonl), results.json, results.md, figures.
results.json / --json: the JSON envelope; results rows (field "row"): "summary": {variant, subtask, metric
(token_acc | seq_acc | lengthgen_score), factor (null for the score), length, n_seeds, mean, ci_low, ci_high (95 %
t-interval of the mean over seeds, cut to [0, 1]), seeds_above_90 (seeds whose accuracy there exceeds 90 %), seed_S
(each seed's value)}; with --compare, "comparison": {variant, baseline, n_seeds, n_seeds_baseline, mean,
mean_ci_low, mean_ci_high, mean_baseline, difference, difference_ci_low, difference_ci_high (Welch 95 % interval),
p_permutation (exact, two-sided: twice the smaller tail), p_min_attainable, p_holm, p_bh (over the table's distinct
pairs), n_tests, verdict}. controls rows (run folders with final.pt only): seed_matches_folder (the checkpoint was
trained with its folder's seed), seeds_give_distinct_weights (no two seeds of a variant ended with the same
weights). "missing" lists the runs without a finished evaluation."""


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("python -m probe.sweep", USAGE, _HELP_JSON)
    p.add_argument("target", nargs="?", help="a sweep config (.toml), or with --report a sweep's or a results/ "
                                              "grid's directory")
    p.add_argument("--preset", nargs="+", metavar="P", help="shorthand: one variant per preset, named after it")
    p.add_argument("--seeds", nargs="+", type=int, metavar="S", help="seeds (replace the config's)")
    p.add_argument("--steps", type=positive_int, help="training steps of every run (replaces the presets' and the "
                                                      "config's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override for every run, after the config's (as probe.train --set)")
    p.add_argument("--task", default=None, help="task of the --preset shorthand (default interleaved)")
    p.add_argument("--out", help="sweep directory: runs go to OUT/VARIANT/seedS/, results to OUT/")
    p.add_argument("--executor", default="local", choices=["local", "ray"],
                   help="local: a process pool on this machine (default); ray: Ray tasks (pip install -e \".[ray]\")")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help=f"runs at a time: local workers, or the CPUs of a local Ray instance (default: the "
                        f"cores, here {default_jobs()}); one thread per run")
    p.add_argument("--address", help="Ray cluster to use (e.g. auto, or HEAD:6379); default: start a local one")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto; every run trains there")
    p.add_argument("--gpus-per-run", type=positive_float, default=1.0,
                   help="Ray with --device cuda: GPUs each run reserves (0.25 packs four runs on a GPU; default 1)")
    p.add_argument("--retries", type=nonnegative_int, default=3,
                   help="reruns of a run whose worker died (default 3)")
    p.add_argument("--eval-samples", type=positive_int, default=None,
                   help="sequences per length of each run's final evaluation (default: the config's, else 256)")
    p.add_argument("--eval-lengths", default=None, metavar="SPEC",
                   help="lengths of the final evaluation: 16x (default: every length up to 4x L_train, then "
                        "every L_train up to 16x), 4x (every length up to 4x), coarse, or a list such as "
                        "1:100,125:400:25; or eval_lengths in the config")
    p.add_argument("--eval-factors", action="store_true",
                   help="the final evaluation also reports the state answers modulo each prime-power factor of the "
                        "modulus (subtasks state_mod2, state_mod5; probe.evaluate --factors); or eval_factors = true")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke test's evaluation: {QUICK_SAMPLES} sequences at every (L_train/5)-th length up "
                        "to 4x, unless --eval-samples/--eval-lengths say otherwise (the log says what it reduced)")
    p.add_argument("--dry-run", action="store_true", help="print the runs, their state and commands; run nothing")
    p.add_argument("--report", action="store_true",
                   help="re-aggregate the runs of DIR without training: into DIR if it is a sweep's (run folders), "
                        "else into --out")
    p.add_argument("--in-place", action="store_true",
                   help="with --report on a compact grid (no run folders, e.g. a committed one): rewrite its own "
                        "results.json, results.md and figures instead of writing to --out")
    p.add_argument("--compare", nargs="+", metavar="VARIANT", default=[],
                   help="with the report: every variant against these baselines, or VARIANT:BASELINE pairs only "
                        "(joint-fp32:joint-bf16), on state accuracy in --window (difference of means with its "
                        "Welch interval, exact permutation p, Holm and BH over the table; rows with "
                        "row=comparison), and a figure of every seed's value at 3x (seeds_3x.png)")
    p.add_argument("--window", metavar="W", default=None,
                   help="with --compare: the window of positions compared, e.g. '(8x, 16x]' (default (2x, 4x], "
                        "the window that holds 3x L_train; a grid without windows compares at 3x)")
    p.add_argument("--target", dest="target_spec", metavar="SPEC", default=None,
                   help="with --compare: also count the seeds of each pair that meet a target and compare the "
                        "rates (Fisher's exact test, Newcombe interval, Holm; rows with row=target_comparison): "
                        "METRIC>=X,METRIC<X,... over runs.jsonl's columns, or recipe (both subtasks >= 99 %% in "
                        "(2x, 4x] and >= 95 %% in (8x, 16x])")
    p.add_argument("--confirm", metavar="CLAIMS.toml",
                   help="pre-registered confirmation: train the fresh seeds of the claims file's sweep in --out "
                        "(finished runs are reused), then judge every claim on them: confirmed / not confirmed / "
                        "not testable / pending (rows with row=claim; DIR/claims.json and claims.md). Claims found "
                        "on the seeds they would be confirmed on are refused")
    p.add_argument("--no-train", action="store_true",
                   help="with --confirm: judge the runs DIR already holds (run folders or a committed grid), train "
                        "nothing")
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


def eval_options(args: argparse.Namespace, cfg: SweepConfig) -> tuple[int, str | None, str | None]:
    """Samples and lengths of the final evaluation (command line, then config, then defaults), and what
    ``--quick`` reduced, in words (None without it)."""
    samples = args.eval_samples or cfg.eval_samples
    lengths = args.eval_lengths or cfg.eval_lengths
    note = None
    if args.quick:
        reduced = []
        if samples is None:
            samples = QUICK_SAMPLES
            reduced.append(f"{QUICK_SAMPLES} sequences per length instead of {DEFAULT_SAMPLES}")
        if lengths is None:
            lengths = "coarse"
            reduced.append(f"every (L_train/5)-th length up to 4x instead of {DEFAULT_LENGTHS}")
        note = "quick: evaluating " + ("; ".join(reduced) if reduced else "as asked (nothing reduced)")
    lengths = lengths or DEFAULT_LENGTHS
    eval_lengths_for(lengths, 25)  # the grammar, before any run
    return samples or DEFAULT_SAMPLES, lengths, note


def validate_runs(cfg: SweepConfig) -> None:
    """Every run's configs, built as the trainer will build them, before any run starts: a bad override, step
    count or schedule is one line and exit 2, not a failed run per seed minutes later."""
    for run in cfg.runs("."):
        try:
            _, _, train_cfg = build_configs(run.preset, run.task, list(run.overrides), steps=run.steps, seed=run.seed)
            Schedule(train_cfg.schedule, train_cfg.steps)
        except ProbeError as e:
            raise ProbeError(f"{run.key}: {e}") from None


def _device(args: argparse.Namespace) -> str:
    if args.executor == "ray" and args.address:
        # The cluster's nodes, not this driver, must have the device: only check that the name parses.
        if args.device == "auto":
            raise ProbeError("--device auto is decided on this machine; with --address name cpu or cuda")
        import torch

        try:
            return str(torch.device(args.device))
        except RuntimeError:
            raise ProbeError(f"bad --device {args.device!r}: use cpu, cuda, cuda:N or auto") from None
    return str(resolve_device(args.device))


def report_folder(args: argparse.Namespace) -> tuple[Path, Path]:
    """``--report``'s source and destination: a sweep's own folder (it has run folders) takes its report; a compact
    grid (committed results) is only read, and its report goes to ``--out``, unless ``--in-place`` asks for it."""
    if not (args.target or args.out):
        raise ProbeError("--report needs the sweep directory: python -m probe.sweep DIR --report")
    source = Path(args.target or args.out)
    if not source.is_dir():
        raise ProbeError(f"{source}: no such sweep directory")
    if args.in_place:
        if args.target and args.out and Path(args.out) != source:
            raise ProbeError(f"--in-place writes the report into {source}; drop --out {args.out} or --in-place")
        return source, source
    compact = not (has_run_folders(source) or any(p.is_dir() for p in source.glob("*/seed*")))
    if args.out:
        if compact and Path(args.out).resolve() == source.resolve():
            raise ProbeError(f"--out {args.out} is the compact grid being read: pass --in-place to rewrite its own "
                             "files, or another --out")
        return source, Path(args.out)
    if not compact or any(p.is_dir() for p in source.glob("*/seed*")):
        return source, source
    raise ProbeError(f"{source} is a compact grid (no run folders): --report writes its tables and figures to "
                     f"--out DIR; to rewrite {source}'s own files, pass --in-place")


def _report(args: argparse.Namespace, source: Path, out: Path | None = None) -> dict[str, Any]:
    out = out or source
    report = aggregate(source)
    text = markdown_table(report)
    if args.compare:
        baselines, pairs = parse_compare(args.compare)
        # the metric of record where the grid has it: the window of positions that holds 3x L_train, or --window
        windows = report.grid.windows if report.grid is not None else None
        has_windows = windows is not None and not windows.empty
        window = args.window or ("(2x, 4x]" if has_windows and (windows.window == "(2x, 4x]").any() else None)
        comparison = compare(report.curves, baselines, windows=windows, window=window, pairs=pairs)
        report.result["results"] += tidy(comparison.to_dict("records"))
        text += "\n" + comparison_table(comparison)
        if args.target_spec:
            runs = report.grid.runs
            by_target = compare_target(runs, expand_pairs(runs.variant, baselines, pairs),
                                       parse_target(args.target_spec))
            report.result["results"] += tidy(by_target.to_dict("records"))
            text += "\n" + target_table(by_target)
    out.mkdir(parents=True, exist_ok=True)
    paths = write_report(report, out, figure=not args.no_figure)
    if args.compare:
        write_text_atomically(out / TABLE, text)
        if not args.no_figure:
            save_figure(plot_seed_dots(report.curves, report.summary), out / "seeds_3x.png")
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
        # the report's options are read before anything trains: a typo there must not wait for the whole grid
        parse_compare(args.compare)
        if args.target_spec:
            parse_target(args.target_spec)
        if (args.window or args.target_spec) and not args.compare:
            raise ProbeError("--window and --target go with --compare (the pairs or baselines they compare)")
        if args.confirm:
            return _confirm(args)
        if args.no_train:
            raise ProbeError("--no-train goes with --confirm CLAIMS.toml")
        if args.report:
            source, out = report_folder(args)
            stage["report"] = out
            with folder_lock(out, "sweep --report"):
                return _report(args, source, out)
        if args.in_place:
            raise ProbeError("--in-place goes with --report")
        cfg = config_from_args(args)
        samples, lengths, quick_note = eval_options(args, cfg)
        factors = args.eval_factors or cfg.eval_factors
        validate_runs(cfg)
        if args.dry_run:
            out = Path(args.out or "DIR")
            lengths_arg = f" --lengths {lengths}" if lengths else ""
            lengths_arg += " --factors" if factors else ""
            for run, state in plan(cfg, out):
                say(args, f"{run.key}  [{state}]  {run.out}")
                if state != "finished":
                    if state in ("new", "interrupted"):
                        say(args, "  " + run.command(resume=state == "interrupted"))
                    say(args, f"  {sys.executable} -m probe.evaluate {run.out / 'final.pt'} "
                              f"--samples {samples}{lengths_arg} --json > {run.out / 'eval.json'}")
            return {}
        if not args.out:
            raise ProbeError("--out DIR is required: runs go to DIR/VARIANT/seedS/")
        device = _device(args)
        is_cuda = device.startswith("cuda")
        executor = make_executor(args.executor, args.jobs, args.address, args.retries,
                                 args.gpus_per_run if is_cuda else 0.0)
        if args.executor == "ray" and is_cuda:
            device = "cuda"  # Ray gives each task its GPU(s) through CUDA_VISIBLE_DEVICES
        if quick_note:
            print(quick_note, file=sys.stderr)
        opts = RunOptions(device=device, eval_samples=samples, eval_lengths=lengths, eval_factors=factors,
                          note=quick_note)
        # the sweep's lock is held through its report too: no second sweep starts on DIR in between
        with folder_lock(args.out, "sweep"):
            outcome = run_sweep(cfg, args.out, executor, opts, progress=not args.no_progress)
            _print_outcome(outcome)
            failed = bool(outcome.failed)
            if all(not r.ok for r in outcome.results):
                return {}
            stage["report"] = Path(args.out)
            stage["kept"] = kept(cfg, args.out)
            return _report(args, Path(args.out))

    def _confirm(args: argparse.Namespace) -> dict[str, Any]:
        nonlocal failed

        if args.target or args.preset:
            raise ProbeError("--confirm takes its sweep from the claims file; drop the config or --preset")
        if not args.out:
            raise ProbeError("--confirm needs --out DIR: where the fresh seeds' runs are (or go)")
        claims = load_claims(args.confirm)
        out = Path(args.out)
        if not args.no_train:
            samples, lengths, quick_note = eval_options(args, claims.sweep)
            validate_runs(claims.sweep)
            executor = make_executor(args.executor, args.jobs, args.address, args.retries, 0.0)
            opts = RunOptions(device=_device(args), eval_samples=samples, eval_lengths=lengths,
                              eval_factors=claims.sweep.eval_factors, note=quick_note)
            outcome = run_sweep(claims.sweep, out, executor, opts, progress=not args.no_progress)
            _print_outcome(outcome)
            failed = bool(outcome.failed)
        if not out.is_dir():
            raise ProbeError(f"{out}: no such directory of runs to judge the claims on")
        rows = judge(claims, load_grid(out).runs)
        text = claims_markdown(rows, f"{args.confirm} on {out}")
        result = envelope("sweep --confirm", [], [{"row": "claim", **r} for r in tidy(rows)], [],
                          claims=str(args.confirm))
        (out / "claims.json").write_text(json.dumps(result, separators=(",", ":")) + "\n")
        (out / "claims.md").write_text(text)
        print(text, file=sys.stderr if args.json else sys.stdout)
        return result

    stage: dict[str, Any] = {}  # where an interrupt landed: the report's folder, what the runs kept
    stopped: list[str] = []

    def body_stoppable(args: argparse.Namespace) -> dict[str, Any]:
        # SIGINT and SIGTERM, to this process alone or to its whole group: every run stops at its next step with
        # last.pt written (probe.sweep.executors), and one line says what was kept and how to resume
        with interrupts.handling():
            try:
                return body(args)
            except KeyboardInterrupt as e:
                command = "python -m probe.sweep " + shlex.join(sys.argv[1:] if argv is None else argv)
                signal = interrupts.requested() or "SIGINT"
                if "report" in stage:
                    runs = f" ({stage['kept']})" if "kept" in stage else ""
                    line = f"while writing the report into {stage['report']}{runs}, whose files are never torn; " \
                           f"run again: {command}"
                elif str(e):  # from run_sweep: what every run keeps
                    line = f"{e}; resume with: {command}"
                else:
                    line = f"stopped; run again: {command}"
                stopped.append(f"interrupted ({signal}): {line}")
                return {}

    rc = run_cli(parser, body_stoppable, argv)
    if stopped:
        print(stopped[0], file=sys.stderr)
        return 130
    return rc or int(failed)


__all__ = ["main", "build_parser", "RESULTS", "TABLE", "FIGURE"]
