"""``python -m probe.sweep``: parse, plan, run on an executor, aggregate; exit 0 only if every run succeeded."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.cli import envelope, nonnegative_int, positive_float, positive_int, resolve_device, say, tidy
from probe.core.files import write_text_atomically
from probe.core.lock import folder_lock
from probe.errors import ProbeError
from probe.results import RUNS, has_run_folders, load_grid
from probe.results.config import DEFAULT_LENGTHS, SweepConfig, config_from_presets, eval_lengths_for, load_config
from probe.runner import Command, CommandOptions, Report, option
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
  python -m probe.sweep CONFIG.toml --out DIR [--executor local|ray] [--jobs N] [--skip-collected GRID] [--dry-run]
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


@dataclass
class SweepOptions(CommandOptions):
    """The command line of ``python -m probe.sweep``; ``stage`` records, for the line after an interrupt, where it
    landed (the report's folder, what the runs kept)."""

    target: str | None = option(None, "a sweep config (.toml), or with --report a sweep's or a results/ grid's "
                                      "directory", positional=True, nargs="?")
    preset: list[str] | None = option(None, "shorthand: one variant per preset, named after it", nargs="+",
                                      metavar="P")
    seeds: list[int] | None = option(None, "seeds (replace the config's)", nargs="+", type=int, metavar="S")
    steps: int | None = option(None, "training steps of every run (replaces the presets' and the config's)",
                               type=positive_int)
    overrides: list[str] = option([], "override for every run, after the config's (as probe.train --set)",
                                  flag="--set", action="append", metavar="SECTION.FIELD=VALUE")
    task: str | None = option(None, "task of the --preset shorthand (default interleaved)")
    out: str | None = option(None, "sweep directory: runs go to OUT/VARIANT/seedS/, results to OUT/")
    executor: str = option("local", "local: a process pool on this machine (default); ray: Ray tasks (pip install "
                                    "-e \".[ray]\")", choices=["local", "ray"])
    jobs: int | None = option(None, "runs at a time: local workers, or the CPUs of a local Ray instance (default: "
                                    f"the cores, here {default_jobs()}); one thread per run", type=positive_int)
    address: str | None = option(None, "Ray cluster to use (e.g. auto, or HEAD:6379); default: start a local one")
    device: str = option("cpu", "cpu (default), cuda, cuda:N or auto; every run trains there")
    gpus_per_run: float = option(1.0, "Ray with --device cuda: GPUs each run reserves (0.25 packs four runs on a "
                                      "GPU; default 1)", type=positive_float)
    retries: int = option(3, "reruns of a run whose worker died (default 3)", type=nonnegative_int)
    eval_samples: int | None = option(None, "sequences per length of each run's final evaluation (default: the "
                                            "config's, else 256)", type=positive_int)
    eval_lengths: str | None = option(None, "lengths of the final evaluation: 16x (default: every length up to 4x "
                                            "L_train, then every L_train up to 16x), 4x (every length up to 4x), "
                                            "coarse, or a list such as 1:100,125:400:25; or eval_lengths in the "
                                            "config", metavar="SPEC")
    eval_factors: bool = option(False, "the final evaluation also reports the state answers modulo each "
                                       "prime-power factor of the modulus (subtasks state_mod2, state_mod5; "
                                       "probe.evaluate --factors); or eval_factors = true")
    quick: bool = option(False, f"a smoke test's evaluation: {QUICK_SAMPLES} sequences at every (L_train/5)-th "
                                "length up to 4x, unless --eval-samples/--eval-lengths say otherwise (the log says "
                                "what it reduced)")
    skip_collected: str | None = option(None, "skip the runs a collected grid already holds (GRID/runs.jsonl, as "
                                              "python -m probe.results collect writes it): a grid resumed where its "
                                              "run folders are gone trains only what is missing", metavar="GRID")
    dry_run: bool = option(False, "print the runs, their state and commands; run nothing")
    report: bool = option(False, "re-aggregate the runs of DIR without training: into DIR if it is a sweep's (run "
                                 "folders), else into --out")
    in_place: bool = option(False, "with --report on a compact grid (no run folders, e.g. a committed one): "
                                   "rewrite its own results.json, results.md and figures instead of writing to --out")
    compare: list[str] = option([], "with the report: every variant against these baselines, or VARIANT:BASELINE "
                                    "pairs only (joint-fp32:joint-bf16), on state accuracy in --window (difference "
                                    "of means with its Welch interval, exact permutation p, Holm and BH over the "
                                    "table; rows with row=comparison), and a figure of every seed's value at 3x "
                                    "(seeds_3x.png)", nargs="+", metavar="VARIANT")
    window: str | None = option(None, "with --compare: the window of positions compared, e.g. '(8x, 16x]' (default "
                                      "(2x, 4x], the window that holds 3x L_train; a grid without windows compares "
                                      "at 3x)", metavar="W")
    target_spec: str | None = option(None, "with --compare: also count the seeds of each pair that meet a target "
                                           "and compare the rates (Fisher's exact test, Newcombe interval, Holm; "
                                           "rows with row=target_comparison): METRIC>=X,METRIC<X,... over "
                                           "runs.jsonl's columns, or both-16x (both subtasks >= 99 %% in (2x, 4x] and "
                                           ">= 95 %% in (8x, 16x])", flag="--target", metavar="SPEC")
    confirm: str | None = option(None, "pre-registered confirmation: train the fresh seeds of the claims file's "
                                       "sweep in --out (finished runs are reused), then judge every claim on them: "
                                       "confirmed / not confirmed / not testable / pending (rows with row=claim; "
                                       "DIR/claims.json and claims.md). Claims found on the seeds they would be "
                                       "confirmed on are refused", metavar="CLAIMS.toml")
    no_train: bool = option(False, "with --confirm: judge the runs DIR already holds (run folders or a committed "
                                   "grid), train nothing")
    no_figure: bool = option(False, "results.json and results.md only")
    no_progress: bool = option(False, "no progress bar", order=7)
    json: bool = option(False, "print results.json's object on stdout (human text to stderr)", order=8)
    stage: dict[str, Any] = field(default_factory=dict, init=False)

    def folders(self) -> dict[str, str | None]:
        return {} if self.dry_run else {"--out": self.out}  # a dry run writes nothing: a read-only sweep can be listed


def config_from_args(opts: SweepOptions) -> SweepConfig:
    if opts.preset:
        if opts.target:
            raise ProbeError(f"give a config ({opts.target}) or --preset, not both")
        if not opts.seeds:
            raise ProbeError("--preset needs --seeds S [S ...]")
        cfg = config_from_presets(opts.preset, opts.seeds, opts.task or "interleaved")
        return cfg.with_command_line(None, opts.steps, opts.overrides)
    if not opts.target:
        raise ProbeError("nothing to run: pass CONFIG.toml or --preset P ... --seeds S ... (see --help)")
    if opts.task:
        raise ProbeError("--task is for the --preset shorthand; a config sets task = \"...\"")
    return load_config(opts.target).with_command_line(opts.seeds, opts.steps, opts.overrides)


def eval_options(opts: SweepOptions, cfg: SweepConfig) -> tuple[int, str | None, str | None]:
    """Samples and lengths of the final evaluation (command line, then config, then defaults), and what
    ``--quick`` reduced, in words (None without it)."""
    samples = opts.eval_samples or cfg.eval_samples
    lengths = opts.eval_lengths or cfg.eval_lengths
    note = None
    if opts.quick:
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


def _device(opts: SweepOptions) -> str:
    if opts.executor == "ray" and opts.address:
        # The cluster's nodes, not this driver, must have the device: only check that the name parses.
        if opts.device == "auto":
            raise ProbeError("--device auto is decided on this machine; with --address name cpu or cuda")
        import torch

        try:
            return str(torch.device(opts.device))
        except RuntimeError:
            raise ProbeError(f"bad --device {opts.device!r}: use cpu, cuda, cuda:N or auto") from None
    return str(resolve_device(opts.device))


def report_folder(opts: SweepOptions) -> tuple[Path, Path]:
    """``--report``'s source and destination: a sweep's own folder (it has run folders) takes its report; a compact
    grid (committed results) is only read, and its report goes to ``--out``, unless ``--in-place`` asks for it."""
    if not (opts.target or opts.out):
        raise ProbeError("--report needs the sweep directory: python -m probe.sweep DIR --report")
    source = Path(opts.target or opts.out)
    if not source.is_dir():
        raise ProbeError(f"{source}: no such sweep directory")
    if opts.in_place:
        if opts.target and opts.out and Path(opts.out) != source:
            raise ProbeError(f"--in-place writes the report into {source}; drop --out {opts.out} or --in-place")
        return source, source
    compact = not (has_run_folders(source) or any(p.is_dir() for p in source.glob("*/seed*")))
    if opts.out:
        if compact and Path(opts.out).resolve() == source.resolve():
            raise ProbeError(f"--out {opts.out} is the compact grid being read: pass --in-place to rewrite its own "
                             "files, or another --out")
        return source, Path(opts.out)
    if not compact or any(p.is_dir() for p in source.glob("*/seed*")):
        return source, source
    raise ProbeError(f"{source} is a compact grid (no run folders): --report writes its tables and figures to "
                     f"--out DIR; to rewrite {source}'s own files, pass --in-place")


def grid_report(opts: SweepOptions, source: Path, out: Path | None = None) -> dict[str, Any]:
    """Aggregate the runs of ``source``, compare them as ``--compare`` asks, write the report into ``out`` (default
    ``source``) and print its tables (to stderr under ``--json``); returns the envelope of ``results.json``."""
    out = out or source
    report = aggregate(source)
    text = markdown_table(report)
    if opts.compare:
        baselines, pairs = parse_compare(opts.compare)
        # the metric of record where the grid has it: the window of positions that holds 3x L_train, or --window
        windows = report.grid.windows if report.grid is not None else None
        has_windows = windows is not None and not windows.empty
        window = opts.window or ("(2x, 4x]" if has_windows and (windows.window == "(2x, 4x]").any() else None)
        comparison = compare(report.curves, baselines, windows=windows, window=window, pairs=pairs)
        report.result["results"] += tidy(comparison.to_dict("records"))
        text += "\n" + comparison_table(comparison)
        if opts.target_spec:
            runs = report.grid.runs
            by_target = compare_target(runs, expand_pairs(runs.variant, baselines, pairs),
                                       parse_target(opts.target_spec))
            report.result["results"] += tidy(by_target.to_dict("records"))
            text += "\n" + target_table(by_target)
    out.mkdir(parents=True, exist_ok=True)
    paths = write_report(report, out, figure=not opts.no_figure)
    if opts.compare:
        write_text_atomically(out / TABLE, text)
        if not opts.no_figure:
            save_figure(plot_seed_dots(report.curves, report.summary), out / "seeds_3x.png")
            paths.append(out / "seeds_3x.png")
    print(text, file=sys.stderr if opts.json else sys.stdout)
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


# --- the command: one function per mode -----------------------------------------------------------------------------
def run(opts: SweepOptions) -> Report:
    """Check the report's options, then run the mode asked for: confirm claims, report a folder, or train a grid
    (or only list its runs) and report it."""
    check_report_options(opts)
    if opts.skip_collected and (opts.confirm or opts.report):
        raise ProbeError("--skip-collected goes with a grid to train (a config or --preset), not --confirm or --report")
    if opts.confirm:
        return confirm(opts)
    if opts.no_train:
        raise ProbeError("--no-train goes with --confirm CLAIMS.toml")
    if opts.report:
        return report_only(opts)
    if opts.in_place:
        raise ProbeError("--in-place goes with --report")
    cfg = config_from_args(opts)
    if opts.skip_collected:
        left = cfg.without(collected_runs(opts.skip_collected))
        if left is None:
            say(opts, f"every run of {cfg.name!r} is already in {opts.skip_collected}: nothing to train")
            return Report([], [])
        skipped = len(cfg.runs(".")) - len(left.runs("."))
        print(f"skipping {skipped} run(s) that {opts.skip_collected} already holds", file=sys.stderr)
        cfg = left
    samples, lengths, quick_note = eval_options(opts, cfg)
    factors = opts.eval_factors or cfg.eval_factors
    validate_runs(cfg)
    if opts.dry_run:
        dry_run(opts, cfg, samples, lengths, factors)
        return Report([], [])
    if not opts.out:
        raise ProbeError("--out DIR is required: runs go to DIR/VARIANT/seedS/")
    return train_and_report(opts, cfg, Path(opts.out), RunOptions(eval_samples=samples, eval_lengths=lengths,
                                                                  eval_factors=factors, note=quick_note))


def collected_runs(grid: str | Path) -> set[tuple[str, int]]:
    """The (variant, seed) pairs a collected grid holds (``--skip-collected``), from its ``runs.jsonl``."""
    path = Path(grid) / RUNS
    if not path.is_file():
        raise ProbeError(f"--skip-collected {grid}: no {RUNS} there (a grid written by python -m probe.results "
                         "collect)")
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return {(str(r["variant"]), int(r["seed"])) for r in rows}
    except (ValueError, KeyError, TypeError) as e:
        raise ProbeError(f"--skip-collected {grid}: {RUNS} is not one JSON object with variant and seed a line "
                         f"({type(e).__name__})") from None


def check_report_options(opts: SweepOptions) -> None:
    """The report's options, read before anything trains: a typo there must not wait for the whole grid."""
    parse_compare(opts.compare)
    if opts.target_spec:
        parse_target(opts.target_spec)
    if (opts.window or opts.target_spec) and not opts.compare:
        raise ProbeError("--window and --target go with --compare (the pairs or baselines they compare)")


def report_only(opts: SweepOptions) -> Report:
    """``--report``: aggregate the runs already there, train nothing."""
    source, out = report_folder(opts)
    opts.stage["report"] = out
    with folder_lock(out, "sweep --report"):
        return Report.of_envelope(grid_report(opts, source, out))


def dry_run(opts: SweepOptions, cfg: SweepConfig, samples: int, lengths: str | None, factors: bool) -> None:
    """``--dry-run``: every run, its state, and the commands that would train and evaluate it."""
    out = Path(opts.out or "DIR")
    lengths_arg = f" --lengths {lengths}" if lengths else ""
    lengths_arg += " --factors" if factors else ""
    for run, state in plan(cfg, out):
        say(opts, f"{run.key}  [{state}]  {run.out}")
        if state != "finished":
            if state in ("new", "interrupted"):
                say(opts, "  " + run.command(resume=state == "interrupted"))
            say(opts, f"  {sys.executable} -m probe.evaluate {run.out / 'final.pt'} "
                      f"--samples {samples}{lengths_arg} --json > {run.out / 'eval.json'}")


def train_and_report(opts: SweepOptions, cfg: SweepConfig, out: Path, evaluation: RunOptions) -> Report:
    """Train and evaluate every unfinished run of ``cfg`` in ``out`` on the executor (``evaluation``: how each run
    is evaluated; the device is ``--device``'s), then report the grid; exit code 1 if a run failed."""
    device = _device(opts)
    is_cuda = device.startswith("cuda")
    executor = make_executor(opts.executor, opts.jobs, opts.address, opts.retries,
                             opts.gpus_per_run if is_cuda else 0.0)
    if opts.executor == "ray" and is_cuda:
        device = "cuda"  # Ray gives each task its GPU(s) through CUDA_VISIBLE_DEVICES
    if evaluation.note:
        print(evaluation.note, file=sys.stderr)
    # the sweep's lock is held through its report too: no second sweep starts on DIR in between
    with folder_lock(out, "sweep"):
        outcome = run_sweep(cfg, out, executor, dataclasses.replace(evaluation, device=device),
                            progress=opts.progress)
        _print_outcome(outcome)
        failed = int(bool(outcome.failed))
        if all(not r.ok for r in outcome.results):
            return Report([], [], exit_code=failed)
        opts.stage.update(report=out, kept=kept(cfg, out))
        return Report.of_envelope(grid_report(opts, out), exit_code=failed)


def confirm(opts: SweepOptions) -> Report:
    """``--confirm CLAIMS.toml``: train the claims file's fresh seeds (unless ``--no-train``), then judge every
    claim on the runs in ``--out``; exit code 1 if a run failed."""
    if opts.target or opts.preset:
        raise ProbeError("--confirm takes its sweep from the claims file; drop the config or --preset")
    if not opts.out:
        raise ProbeError("--confirm needs --out DIR: where the fresh seeds' runs are (or go)")
    claims = load_claims(opts.confirm)
    out = Path(opts.out)
    failed = 0
    if not opts.no_train:
        samples, lengths, quick_note = eval_options(opts, claims.sweep)
        validate_runs(claims.sweep)
        executor = make_executor(opts.executor, opts.jobs, opts.address, opts.retries, 0.0)
        evaluation = RunOptions(device=_device(opts), eval_samples=samples, eval_lengths=lengths,
                                eval_factors=claims.sweep.eval_factors, note=quick_note)
        outcome = run_sweep(claims.sweep, out, executor, evaluation, progress=opts.progress)
        _print_outcome(outcome)
        failed = int(bool(outcome.failed))
    if not out.is_dir():
        raise ProbeError(f"{out}: no such directory of runs to judge the claims on")
    rows = judge(claims, load_grid(out).runs)
    text = claims_markdown(rows, f"{opts.confirm} on {out}")
    result = envelope("sweep --confirm", [], [{"row": "claim", **r} for r in tidy(rows)], [], claims=str(opts.confirm))
    (out / "claims.json").write_text(json.dumps(result, separators=(",", ":")) + "\n")
    (out / "claims.md").write_text(text)
    print(text, file=sys.stderr if opts.json else sys.stdout)
    return Report.of_envelope(result, exit_code=failed)


def stop_line(opts: SweepOptions, argv: list[str], kept: str, signal: str) -> str:
    """The line after SIGINT or SIGTERM (to this process alone or to its whole group, when every run stops at its
    next step with last.pt written, ``probe.sweep.executors``): what was kept, and the command that resumes."""
    command = "python -m probe.sweep " + shlex.join(argv)
    if "report" in opts.stage:
        runs = f" ({opts.stage['kept']})" if "kept" in opts.stage else ""
        line = f"while writing the report into {opts.stage['report']}{runs}, whose files are never torn; " \
               f"run again: {command}"
    elif kept:  # from run_sweep: what every run keeps
        line = f"{kept}; resume with: {command}"
    else:
        line = f"stopped; run again: {command}"
    return f"interrupted ({signal}): {line}"


COMMAND = Command("sweep", SweepOptions, run, USAGE, _HELP_JSON, results_file=False, stopped=stop_line)
main, build_parser = COMMAND.main, COMMAND.build_parser

__all__ = ["COMMAND", "main", "build_parser", "RESULTS", "TABLE", "FIGURE"]
