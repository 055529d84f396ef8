"""probe.sweep: configs, validation before any run, local pool vs Ray bit for bit, SIGKILLed workers, failing runs,
--report from run folders and from the compact form, evaluation options, dry runs."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import probe.training.trainer
from probe.checkpoint import load_checkpoint
from probe.errors import ProbeError
from probe.hardware import precision_used
from probe.results import CURVES, RUNS, import_runs, lengths_spec, load_grid, parse_lengths_spec
from probe.results.config import config_from_dict, eval_lengths_for
from probe.sweep import (
    LocalExecutor,
    RayExecutor,
    RunOptions,
    aggregate,
    config_from_presets,
    execute_run,
    load_config,
    run_sweep,
)
from probe.sweep.aggregate import RESULTS
from probe.sweep.cli import main

# A run of tens of steps, checkpointed every 10 so that a killed worker has a last.pt to resume from.
TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "task.train_length=6", "train.batch_size=8",
        "train.eval_every=10", "train.ckpt_every=10", "train.traj_every=20", "train.eval_samples=16",
        "train.warmup=5"]
STEPS, KILL_STEP = 40, 20
OPTS = RunOptions(eval_samples=16)
SETS = [a for s in TINY for a in ("--set", s)]
QUIET = ["--eval-samples", "16", "--no-progress"]


def tiny(presets=("hybrid-joint", "lstm"), seeds=(0, 1)):
    return config_from_presets(list(presets), list(seeds)).with_command_line(None, STEPS, TINY)


def _marker(run) -> Path:
    return run.out.parents[1] / f"killed-{run.variant}-seed{run.seed}"


def kill_once(run, opts):
    """``execute_run``, except that the first time its worker process SIGKILLs itself right after writing the
    last.pt of step KILL_STEP (the marker file says it happened, and at which step)."""
    real = probe.training.trainer.save_checkpoint

    def save_then_die(path, ckpt):
        written = real(path, ckpt)
        if Path(path).name == "last.pt" and ckpt.step >= KILL_STEP and not _marker(run).exists():
            _marker(run).write_text(str(ckpt.step))
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    probe.training.trainer.save_checkpoint = save_then_die  # the trainer calls it through its module
    try:
        return execute_run(run, opts)
    finally:
        probe.training.trainer.save_checkpoint = real


def kill_always(run, opts):
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def ray_instance():
    # Ray is an optional extra: without it these tests skip (CI installs it, so there they run)
    ray = pytest.importorskip("ray")
    # Ray's workers cannot import this test module by name: ship its functions (kill_once) by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # Ray's tqdm support replaces builtins.print in this process and never puts it back; tests that run after these
    # (test_checkpoint's fuzz pickles print itself) would see another print than the one they were collected with
    print_before = builtins.print
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        yield ray
    finally:
        ray.shutdown()
        builtins.print = print_before


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """2 presets x 2 seeds on the local pool, through the CLI shorthand."""
    out = tmp_path_factory.mktemp("local")
    argv = ["--preset", "hybrid-joint", "lstm", "--seeds", "0", "1", "--steps", str(STEPS), *SETS, "--out", str(out),
            "--jobs", "2", *QUIET]
    assert main(argv) == 0
    return out, argv


def _same_weights(a: Path, b: Path) -> bool:
    x, y = load_checkpoint(a).state_dict, load_checkpoint(b).state_dict
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _eval_rows(run_dir: Path) -> list[dict]:
    rows = json.loads((run_dir / "eval.json").read_text())["results"]
    return [{k: v for k, v in r.items() if k != "checkpoint"} for r in rows]


def _steps_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --- configs -------------------------------------------------------------------------------------------------
def test_toml_config_gives_variant_x_seed_runs_with_overrides_in_order(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "mech"\nseeds = [0, 1, 2]\nset = ["train.lr=0.001"]\nsteps = 100\n'
                    '[[variant]]\nname = "joint"\npreset = "hybrid-joint"\n'
                    '[[variant]]\nname = "stopgrad"\npreset = "hybrid-joint"\nset = ["schedule.kind=stopgrad"]\n'
                    'seeds = [5]\nsteps = 7\n')
    cfg = load_config(path)
    runs = cfg.runs(tmp_path / "out")
    assert [r.key for r in runs] == ["joint/seed0", "joint/seed1", "joint/seed2", "stopgrad/seed5"]
    assert runs[3].overrides == ("train.lr=0.001", "schedule.kind=stopgrad") and runs[3].steps == 7
    assert runs[0].out == (tmp_path / "out" / "joint" / "seed0").resolve()
    cli = cfg.with_command_line([3], 9, ["train.lr=0.002"])  # the command line wins over the file
    assert [r.key for r in cli.runs(tmp_path)] == ["joint/seed3", "stopgrad/seed3"]
    assert all(r.steps == 9 and r.overrides[-1] == "train.lr=0.002" for r in cli.runs(tmp_path))
    assert config_from_dict(cfg.to_dict()) == cfg  # what sweep.json stores reads back as the same sweep
    assert load_config("study/sweeps/reproduction.toml").runs("runs")[0].out.parts[-2:] == ("lstm", "seed0")


@pytest.mark.parametrize("text,message", [
    ('seed = [0]\n[[variant]]\npreset = "lstm"\n', "unknown key"),
    ('seeds = [0]\n[[variant]]\npreset = "lstm2"\n', "unknown preset 'lstm2'"),
    ('seeds = [0]\n[[variant]]\npreset = "lstm"\n[[variant]]\npreset = "lstm"\n', "used twice"),
    ('[[variant]]\npreset = "lstm"\n', "no seeds"),
    ('seeds = [0]\n[[variant]]\nname = "a/b"\npreset = "lstm"\n', "bad variant name"),
    ('seeds = [0]\nset = ["model.d_model"]\n[[variant]]\npreset = "lstm"\n', "SECTION.FIELD=VALUE"),
    ('seeds = [0\n', "not valid TOML"),
])
def test_bad_configs_are_one_line_errors(tmp_path, capsys, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProbeError, match=message):
        load_config(path)
    assert main([str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_dry_run_prints_runs_and_commands_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "dry"
    assert main(["--preset", "hybrid-dat", "--seeds", "3", "4", "--steps", "50", "--set", "train.lr=0.002",
                 "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert text.count("-m probe.train --preset hybrid-dat") == 2 and "--seed 4" in text
    assert "--steps 50 --set train.lr=0.002" in text and "[new]" in text and "-m probe.evaluate" in text
    assert not out.exists()



def test_skip_collected_trains_only_the_runs_a_collected_grid_lacks(tmp_path, capsys):
    """A grid resumed where its run folders are gone (a fresh clone holding only the committed runs.jsonl) must not
    retrain what is committed, per variant and seed: a filter that dropped whole variants, or every seed a variant
    shares with another's collected seed, would list other runs than these."""
    grid = tmp_path / "grid"
    grid.mkdir()
    (grid / "runs.jsonl").write_text("".join(json.dumps({"variant": v, "seed": s}) + "\n"
                                             for v, s in (("lstm", 0), ("lstm", 1), ("hybrid-dat", 0))))
    argv = ["--preset", "lstm", "hybrid-dat", "--seeds", "0", "1", "2", "--steps", "5", "--out", str(tmp_path / "o"),
            "--skip-collected", str(grid), "--dry-run"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    listed = [line.split()[0] for line in captured.out.splitlines() if "[new]" in line]
    assert listed == ["lstm/seed2", "hybrid-dat/seed1", "hybrid-dat/seed2"]
    assert "skipping 3 run(s)" in captured.err
    (grid / "runs.jsonl").write_text("".join(json.dumps({"variant": v, "seed": s}) + "\n"
                                             for v in ("lstm", "hybrid-dat") for s in (0, 1, 2)))
    assert main(argv) == 0 and "nothing to train" in capsys.readouterr().out
    assert main([*argv[:-3], "--skip-collected", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no runs.jsonl" in err
    assert main(["--report", str(grid), "--skip-collected", str(grid)]) == 2
    assert "--skip-collected goes with a grid to train" in capsys.readouterr().err


@pytest.mark.parametrize("report_flags", [["--compare", "a:b:c"], ["--compare", "a:b", "--target", "x>1"],
                                          ["--target", "both-16x"], ["--window", "(2x, 4x]"]])
def test_bad_report_options_are_refused_before_anything_trains(tmp_path, capsys, report_flags):
    out = tmp_path / "never"
    assert main(["--preset", "lstm", "--seeds", "0", "--steps", "5", "--out", str(out), *report_flags]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not out.exists()


def test_ray_executor_without_ray_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails as if it were not installed
    assert main(["--preset", "lstm", "--seeds", "0", "--out", str(tmp_path), "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'probe-hybrids[ray]'" in err


# --- executors: bit identity, failing runs, killed workers ----------------------------------------------------
@pytest.mark.slow
def test_local_and_ray_give_bit_identical_runs(local_sweep, ray_instance, tmp_path):
    local, _ = local_sweep
    outcome = run_sweep(tiny(), tmp_path, RayExecutor(2), OPTS, progress=False)
    assert [r.status for r in outcome.results] == ["trained"] * 4 and outcome.executor == "ray"
    for run in tiny().runs(tmp_path):
        assert _same_weights(local / run.key / "final.pt", run.out / "final.pt"), run.key
        assert (run.out / "train.log").read_text().count("=== ") == 2  # start and end of one attempt
    assert main([str(tmp_path), "--report", "--no-figure"]) == 0
    # checkpoints are named relative to the sweep directory, so every metric of both sweeps must agree
    assert (tmp_path / RESULTS).read_text() == (local / RESULTS).read_text()


def test_failing_runs_are_reported_and_the_others_finish(tmp_path, capsys):
    config = tmp_path / "sweep.toml"
    config.write_text(f'name = "faults"\nseeds = [0]\nsteps = {STEPS}\nset = {json.dumps(TINY)}\n'
                      '[[variant]]\nname = "ok"\npreset = "lstm"\n'
                      '[[variant]]\nname = "nan"\npreset = "lstm"\nset = ["train.lr=1e30"]\n')
    out = tmp_path / "out"
    assert main([str(config), "--out", str(out), "--jobs", "2", *QUIET, "--no-figure"]) == 1
    err = capsys.readouterr().err
    assert "FAILED nan/seed0: non-finite loss" in err
    assert f"(log: {out.resolve() / 'nan' / 'seed0' / 'train.log'})" in err
    assert "Traceback" in (out / "nan" / "seed0" / "train.log").read_text()
    assert (out / "ok" / "seed0" / "eval.json").exists()
    result = json.loads((out / RESULTS).read_text())
    assert result["missing"] == ["nan/seed0"]
    assert {r["variant"] for r in result["results"]} == {"ok"}


@pytest.mark.slow
def test_sigkilled_ray_worker_is_retried_and_ends_as_if_uninterrupted(local_sweep, ray_instance, tmp_path):
    local, _ = local_sweep
    cfg = tiny(["hybrid-joint"], [1])
    (result,) = run_sweep(cfg, tmp_path, RayExecutor(2, retries=1), OPTS, progress=False, worker=kill_once).results
    run = cfg.runs(tmp_path)[0]
    assert int(_marker(run).read_text()) == KILL_STEP, "the worker must have been killed mid-run"
    assert result.status == "resumed" and result.resumed_from == KILL_STEP
    assert _same_weights(local / run.key / "final.pt", run.out / "final.pt")
    assert _steps_logged(local / run.key) == _steps_logged(run.out)
    assert _eval_rows(run.out) == _eval_rows(local / run.key)


@pytest.mark.slow
def test_sigkilled_local_worker_is_rerun_in_a_fresh_pool_and_resumes(local_sweep, tmp_path):
    local, _ = local_sweep
    cfg = tiny(["lstm"], [0])
    (result,) = run_sweep(cfg, tmp_path, LocalExecutor(1, retries=1), OPTS, progress=False,
                          worker=kill_once).results
    run = cfg.runs(tmp_path)[0]
    assert int(_marker(run).read_text()) == KILL_STEP
    assert result.status == "resumed" and result.resumed_from == KILL_STEP
    assert _same_weights(local / run.key / "final.pt", run.out / "final.pt")


# --- resumption and reports ---------------------------------------------------------------------------------------
def test_finished_runs_are_skipped_and_a_changed_config_is_refused(local_sweep, tmp_path, capsys):
    local, argv = local_sweep
    copy = tmp_path / "copy"
    shutil.copytree(local, copy)
    before = {p: p.stat().st_mtime_ns for p in copy.glob("*/seed*/*.pt")}
    out_arg = argv.index("--out") + 1
    assert main([*argv[:out_arg], str(copy), *argv[out_arg + 1:], "--no-figure"]) == 0
    assert "4 runs in" in capsys.readouterr().err and before == {
        p: p.stat().st_mtime_ns for p in copy.glob("*/seed*/*.pt")}
    changed = [*argv[:out_arg], str(copy), *argv[out_arg + 1:]]
    changed[changed.index("--steps") + 1] = str(STEPS + 10)
    assert main(changed) == 1
    assert "trained with other configs" in capsys.readouterr().err


def test_a_checkpoint_that_recorded_auto_resolved_is_reused_only_where_auto_resolves_the_same(tmp_path):
    """Checkpoints from before ``auto`` was kept in the config hold the precision it resolved to (``bf16`` on a CPU
    with native bf16). A sweep asking for ``auto`` reuses such a run where auto resolves to what it holds, and
    refuses it where it would resolve to the other precision (the run would then not be this machine's run)."""
    from probe.checkpoint import save_checkpoint
    from probe.sweep.worker import check_final

    cfg = config_from_presets(["lstm"], [0]).with_command_line(None, 10, [*TINY, "train.precision=auto"])
    (run,) = cfg.runs(tmp_path)
    execute_run(run, OPTS)
    check_final(run)  # as trained: auto in the config, what it ran as in extra
    here = precision_used("auto", torch.device("cpu"))[0]
    ckpt = load_checkpoint(run.out / "final.pt")
    del ckpt.extra["precision_used"]
    for recorded, reused in ((here, True), ({"bf16": "fp32", "fp32": "bf16"}[here], False)):
        ckpt.train_config["precision"] = recorded
        save_checkpoint(run.out / "final.pt", ckpt)
        if reused:
            check_final(run)
        else:
            with pytest.raises(ProbeError, match="trained with other configs"):
                check_final(run)
    # a checkpoint that records what it ran as asked for that precision literally, not for auto: not this run
    ckpt.train_config["precision"], ckpt.extra["precision_used"] = here, here
    save_checkpoint(run.out / "final.pt", ckpt)
    with pytest.raises(ProbeError, match="trained with other configs"):
        check_final(run)


def test_report_reproduces_results_json_from_the_run_folders(local_sweep, tmp_path):
    local, _ = local_sweep
    copy = tmp_path / "moved"
    shutil.copytree(local, copy)  # somewhere else: the rows must not depend on where the sweep lives
    written = (copy / RESULTS).read_text()
    for name in ("results.json", "results.md", "accuracy_vs_length.png"):
        (copy / name).unlink()
    assert main([str(copy), "--report"]) == 0
    assert (copy / RESULTS).read_text() == written
    assert (copy / "accuracy_vs_length.png").stat().st_size > 10_000
    assert "| hybrid-joint | state | 2 |" in (copy / "results.md").read_text()


def test_summary_rows_are_the_mean_and_t_interval_of_each_seeds_value(local_sweep):
    local, _ = local_sweep
    from scipy import stats

    df = pd.DataFrame(json.loads((local / RESULTS).read_text())["results"])
    grid = load_grid(local)
    curves = grid.curves
    assert len(curves) == 4 * 36 * 3  # runs x lengths (1..4x6, then every 6 to 16x: the default) x subtasks
    row = df[(df.variant == "lstm") & (df.subtask == "state") & (df.factor == 3) & (df.metric == "token_acc")].iloc[0]
    at3x = curves[(curves.variant == "lstm") & (curves.subtask == "state") & (curves.length == 18)].set_index("seed")
    assert row.seed_0 == at3x.token_acc[0] and row.seed_1 == at3x.token_acc[1]
    assert row["mean"] == pytest.approx(at3x.token_acc.mean())
    ci = stats.ttest_1samp(at3x.token_acc, 0).confidence_interval()
    assert row.ci_low == pytest.approx(max(0.0, ci.low)) and row.ci_high == pytest.approx(min(1.0, ci.high))
    assert row.seeds_above_90 == int((at3x.token_acc > 0.9).sum())
    seq = df[(df.variant == "lstm") & (df.subtask == "state") & (df.factor == 3) & (df.metric == "seq_acc")].iloc[0]
    assert seq["mean"] == pytest.approx(at3x.seq_acc.mean())
    score = df[(df.variant == "lstm") & (df.subtask == "state") & (df.metric == "lengthgen_score")].iloc[0]
    beyond = curves[(curves.variant == "lstm") & (curves.subtask == "state") & curves.length.between(7, 18)]
    assert score.n_seeds == 2 and score["mean"] == pytest.approx(beyond.token_acc.mean())  # mean over (L, 3L]
    runs = grid.runs.set_index("run")
    assert runs.loc["lstm/seed1", "state_acc_3x"] == at3x.token_acc[1] and runs.loc["lstm/seed1", "steps"] == STEPS
    assert runs.loc["lstm/seed1", "eval_samples"] == 16 and runs.loc["lstm/seed1", "eval_lengths"] == "1:24,30:96:6"


def test_controls_catch_a_sweep_that_mixed_up_its_seeds(local_sweep, tmp_path):
    local, _ = local_sweep
    copy = tmp_path / "mixed"
    shutil.copytree(local, copy)
    assert all(c["passed"] for c in aggregate(copy).result["controls"])
    shutil.rmtree(copy / "lstm" / "seed1")
    shutil.copytree(copy / "lstm" / "seed0", copy / "lstm" / "seed1")  # seed 1 is really seed 0
    failed = {(c["control"], c.get("run") or c.get("variant")) for c in aggregate(copy).result["controls"]
              if not c["passed"]}
    assert failed == {("seed_matches_folder", "lstm/seed1"), ("seeds_give_distinct_weights", "lstm")}


# --- validation before any run ------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,message", [
    (["--steps", "-5"], "--steps"),
    (["--steps", "0"], "--steps"),
    (["--set", "foo.bar=1"], "foo.bar=1"),
    (["--set", "train.no_such_field=1"], "no_such_field"),
    (["--jobs", "0"], "--jobs"),
    (["--eval-samples", "0"], "--eval-samples"),
    (["--eval-lengths", "1:x"], "--eval-lengths"),
    (["--steps", "12", "--set", "schedule.switch=5000"], "after the last step"),  # a config only training finds
])
def test_a_bad_command_line_or_run_config_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    argv = ["--preset", "hybrid-dat", "--seeds", "0", "1", "--out", str(out), "--no-progress", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not out.exists()  # no sweep.json, no logs, no run folders
    assert main([*argv, "--dry-run"]) == 2  # a dry run validates the same way
    capsys.readouterr()


def test_out_pointing_at_a_file_is_one_line_exit_2(tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    assert main(["--preset", "lstm", "--seeds", "0", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a file is in the way" in err and target.read_text() == "keep me"


# --- evaluation options ---------------------------------------------------------------------------------------------
def test_eval_lengths_grammar_and_its_compact_spelling():
    assert eval_lengths_for("4x", 25) == list(range(1, 101))
    sixteen = eval_lengths_for("16x", 25)
    assert sixteen == list(range(1, 101)) + list(range(125, 401, 25)) == eval_lengths_for(None, 25)  # the default
    assert lengths_spec(sixteen) == "1:100,125:400:25" and parse_lengths_spec("1:100,125:400:25") == sixteen
    assert eval_lengths_for("coarse", 25) == list(range(5, 101, 5))
    assert eval_lengths_for("25,75,1:3", 25) == [1, 2, 3, 25, 75]
    with pytest.raises(ProbeError):
        eval_lengths_for("0:5", 25)


def test_quick_sweep_to_16x_says_what_it_reduced_and_reports_16x(tmp_path, capsys):
    out = tmp_path / "quick"
    argv = ["--preset", "lstm", "--seeds", "0", "--steps", "20", *SETS, "--set", "train.precision=auto",
            "--out", str(out), "--jobs", "1", "--quick", "--eval-lengths", "16x", "--no-progress", "--no-figure"]
    assert main(argv) == 0
    err = capsys.readouterr()
    assert "quick: evaluating 32 sequences per length instead of 256" in err.err
    log = (out / "lstm" / "seed0" / "train.log").read_text()
    # 1..24, then 30..96 by 6
    assert "quick: evaluating 32 sequences" in log and "evaluated 36 lengths x 32 sequences" in log
    run = load_grid(out).runs.iloc[0]
    assert run.eval_samples == 32 and run.eval_lengths == "1:24,30:96:6"
    # the precision the run trained in, as this CPU resolved "auto", not the setting
    assert run.precision == precision_used("auto", torch.device("cpu"))[0]
    # and the device it trained on, as its checkpoint records it (the worker's log line says only "cpu")
    from probe.hardware import device_name

    assert run.trained_on == device_name(torch.device("cpu")) and run.trained_on.startswith("cpu (")
    assert np.isfinite(run.state_acc_16x) and np.isfinite(run.state_seq_acc_16x)
    table = (out / "results.md").read_text()
    assert "16x (96)" in table and "seeds > 90 % at 16x" in table and "seq. acc. 16x" in table


# --- the compact form: --report and collection without checkpoints --------------------------------------------------
def test_report_and_compare_work_on_the_compact_form_alone(local_sweep, tmp_path, capsys):
    local, _ = local_sweep
    compact = tmp_path / "committed"
    compact.mkdir()
    for name in (RUNS, CURVES, "training.csv", "sweep.json"):
        shutil.copy(local / name, compact / name)
    committed = {p.name: p.read_bytes() for p in compact.iterdir()}
    # a committed grid is read, never rewritten: its report goes to --out (or in place, when asked)
    assert main([str(compact), "--report", "--compare", "lstm", "--no-figure"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a compact grid (no run folders)" in err and "--in-place" in err
    report = tmp_path / "report"
    assert main([str(compact), "--report", "--compare", "lstm", "--no-figure", "--out", str(report)]) == 0
    text = capsys.readouterr().out
    assert "| hybrid-joint | lstm | 2 vs 2 |" in text and "Holm" in text
    assert {p.name: p.read_bytes() for p in compact.iterdir()} == committed
    assert main([str(compact), "--report", "--compare", "lstm", "--no-figure", "--in-place"]) == 0
    assert (compact / RESULTS).read_text() == (report / RESULTS).read_text()
    mine = json.loads((report / RESULTS).read_text())
    theirs = json.loads((local / RESULTS).read_text())
    summary = [r for r in mine["results"] if r["row"] == "summary"]
    assert summary == [r for r in theirs["results"] if r["row"] == "summary"]
    assert mine["controls"] == [] and "controls_not_run" in mine  # no checkpoints: said, not faked
    assert any(r["row"] == "comparison" for r in mine["results"])
    # a pair, compared on a target: the seeds meeting it counted from runs.jsonl, Fisher's test refused at 2 vs 2
    assert main([str(compact), "--report", "--no-figure", "--out", str(report), "--compare", "hybrid-joint:lstm",
                 "--target", "recall_acc_1x>=0.5"]) == 0
    rows = [r for r in json.loads((report / RESULTS).read_text())["results"] if r["row"] == "target_comparison"]
    runs = [json.loads(line) for line in (compact / RUNS).read_text().splitlines()]
    expect = {v: sum(r["recall_acc_1x"] >= 0.5 for r in runs if r["variant"] == v) for v in ("hybrid-joint", "lstm")}
    assert [(r["variant"], r["baseline"], r["k"], r["k_baseline"]) for r in rows] == \
        [("hybrid-joint", "lstm", expect["hybrid-joint"], expect["lstm"])]
    assert not rows[0]["testable"] and "descriptive" in rows[0]["verdict"]
    capsys.readouterr()
    assert main([str(compact), "--report", "--no-figure", "--out", str(report), "--target", "both-16x"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    # --out naming the compact grid itself is a rewrite, which only --in-place asks for
    before = {p.name: p.read_bytes() for p in compact.iterdir()}
    assert main([str(compact), "--report", "--no-figure", "--out", str(compact)]) == 2
    assert "--in-place" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in compact.iterdir()} == before


def test_collect_runs_converts_losslessly_and_merges_a_grid_run_in_parts(local_sweep, tmp_path, capsys):
    local, _ = local_sweep
    part1, part2, dst = tmp_path / "part1", tmp_path / "part2", tmp_path / "results" / "grid"
    for part, seed in ((part1, 0), (part2, 1)):
        for variant in ("lstm", "hybrid-joint"):
            shutil.copytree(local / variant / f"seed{seed}", part / variant / f"seed{seed}")
    import_runs(part1, dst)
    grid = import_runs(part2, dst)  # a later part of the same grid: both parts kept
    assert sorted(grid.runs.run) == sorted(f"{v}/seed{s}" for v in ("lstm", "hybrid-joint") for s in (0, 1))
    back = load_grid(dst)
    for variant, seed in (("lstm", 1), ("hybrid-joint", 0)):
        rows = json.loads((local / variant / f"seed{seed}" / "eval.json").read_text())["results"]
        c = back.curves[back.curves.run == f"{variant}/seed{seed}"].set_index(["length", "subtask"])
        for r in rows:
            if r.get("length") is None:
                continue
            got = c.loc[(r["length"], r["subtask"])]
            assert got.token_acc == r["token_acc"] and got.n_tokens == r["n_tokens"]  # bit for bit
            assert got.seq_acc == r["seq_acc"]
    assert (dst / RUNS).read_text().count("\n") == 4 and "\n " not in (dst / RUNS).read_text()  # no indentation
    from probe.results.__main__ import main as results_main

    assert results_main(["collect", str(local), str(tmp_path / "other")]) == 0  # the CLI: the same conversion
    assert sorted(load_grid(tmp_path / "other").runs.run) == sorted(load_grid(local).runs.run)
    capsys.readouterr()
    assert results_main(["collect", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 2
    (tmp_path / "a_file").write_text("")
    assert results_main(["collect", str(local), str(tmp_path / "a_file")]) == 2
    assert results_main(["collect", str(local)]) == 2  # no DST
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(e.startswith("error: ") for e in errors)  # one line each


def test_trajectory_regeneration_retrains_a_checkpoint_bit_for_bit(tmp_path):
    # What makes deleting committed trajectories safe: a shipped checkpoint's recorded configs and seed retrain
    # the same weights and the same snapshots (fp32, same CPU).
    from probe.retrain import Source, retrain
    from probe.retrain import main as retrain_main
    from probe.train import build_configs, train

    model_cfg, task_cfg, train_cfg = build_configs("hybrid-joint", "interleaved", TINY, steps=STEPS, seed=3)
    train(model_cfg, task_cfg, train_cfg, tmp_path / "original", progress=False)
    shipped = tmp_path / "shipped"
    (shipped / "trajectories" / "tiny").mkdir(parents=True)
    shutil.copy(tmp_path / "original" / "final.pt", shipped / "tiny.pt")
    diff = retrain(Source.of(shipped / "tiny.pt"), [0, 20, 40], tmp_path / "work", tmp_path / "traj", progress=False)
    assert diff == 0.0
    for step in (0, 20, 40):
        name = f"step_{step:06d}.pt"
        assert _same_weights(tmp_path / "original" / "trajectory" / name, tmp_path / "traj" / "tiny" / name)
    # the CLI on a shipped checkpoint: by default the steps its shipped snapshots have
    for step in (0, 40):
        shutil.copy(tmp_path / "original" / "trajectory" / f"step_{step:06d}.pt", shipped / "trajectories" / "tiny")
    assert retrain_main([str(shipped / "tiny.pt"), "--out", str(tmp_path / "cli"), "--no-progress"]) == 0
    assert sorted(p.name for p in (tmp_path / "cli" / "tiny").iterdir()) == ["step_000000.pt", "step_000040.pt"]


def test_a_run_stopped_early_is_the_full_runs_beginning_and_resumes_to_its_end(tmp_path):
    # until=N keeps the whole run's schedules, so its first N steps are the full run's; no final.pt is written
    # (nothing may mistake the prefix for a finished run), and --resume continues it to the same final weights.
    from probe.train import build_configs, train

    model_cfg, task_cfg, train_cfg = build_configs("hybrid-joint", "interleaved", TINY, steps=STEPS, seed=3)
    train(model_cfg, task_cfg, train_cfg, tmp_path / "full", progress=False)
    train(model_cfg, task_cfg, train_cfg, tmp_path / "part", progress=False, until=KILL_STEP)
    assert not (tmp_path / "part" / "final.pt").exists() and (tmp_path / "part" / "last.pt").exists()
    assert load_checkpoint(tmp_path / "part" / "last.pt").step == KILL_STEP
    name = f"step_{KILL_STEP:06d}.pt"
    assert _same_weights(tmp_path / "full" / "trajectory" / name, tmp_path / "part" / "trajectory" / name)
    train(model_cfg, task_cfg, train_cfg, tmp_path / "part", progress=False, resume=True)
    assert _same_weights(tmp_path / "full" / "final.pt", tmp_path / "part" / "final.pt")


def test_regenerating_a_runs_early_window_is_checked_against_its_own_snapshots(tmp_path):
    # --runs RUN --until N: dense snapshots of the first N steps, tied to the run by its own snapshots; a run whose
    # stored snapshot differs (here: one weight moved) is reported, not passed.
    from probe.checkpoint import save_checkpoint
    from probe.retrain import Source, retrain
    from probe.retrain import main as retrain_main
    from probe.train import build_configs, train

    model_cfg, task_cfg, train_cfg = build_configs("hybrid-joint", "interleaved", TINY, steps=STEPS, seed=3)
    run = tmp_path / "grid" / "joint" / "seed3"
    train(model_cfg, task_cfg, train_cfg, run, progress=False)
    source = Source.of(run)
    name = source.name
    diff = retrain(source, [0, 5, 10, 15, 20], tmp_path / "work", tmp_path / "dense", until=KILL_STEP, progress=False)
    assert (name, diff) == ("joint-seed3", 0.0)
    assert sorted(p.name for p in (tmp_path / "dense" / name).iterdir()) == [
        f"step_{s:06d}.pt" for s in (0, 5, 10, 15, 20)]
    snap = run / "trajectory" / f"step_{KILL_STEP:06d}.pt"
    ckpt = load_checkpoint(snap)
    key = next(k for k in ckpt.state_dict if "lstm" in k and ckpt.state_dict[k].is_floating_point())
    ckpt.state_dict[key] = ckpt.state_dict[key] + 0.5
    save_checkpoint(snap, ckpt)
    diff = retrain(source, [0, 20], tmp_path / "work", tmp_path / "dense", until=KILL_STEP, progress=False)
    assert diff >= 0.49
    assert retrain_main([str(run), "--until", str(STEPS + 1), "--out", str(tmp_path / "x")]) == 2
    assert retrain_main([str(run), "--until", "10", "--steps", "0", "20", "--out", str(tmp_path / "x")]) == 2
    assert retrain_main([str(tmp_path / "grid" / "joint"), "--out", str(tmp_path / "x")]) == 2  # not a run folder


# Last: it leaves Ray a worker short. retries=0, so that no fresh worker has to import torch only to die again.
@pytest.mark.slow
def test_ray_worker_that_dies_beyond_its_retries_is_reported_failed(ray_instance, tmp_path):
    cfg = tiny(["lstm"], [0])
    (result,) = run_sweep(cfg, tmp_path, RayExecutor(2, retries=0), OPTS, progress=False,
                          worker=kill_always).results
    assert result.status == "failed" and "worker died 1 time(s)" in result.error


def test_eval_factors_reach_the_run_summaries_and_the_compact_curves(tmp_path, capsys):
    out = tmp_path / "factors"
    argv = ["--preset", "lstm", "--seeds", "0", "--steps", "20", *SETS, "--out", str(out), "--jobs", "1",
            "--quick", "--eval-factors", "--no-progress", "--no-figure"]
    assert main([*argv, "--dry-run"]) == 0 and "--factors" in capsys.readouterr().out
    assert main(argv) == 0
    capsys.readouterr()
    grid = load_grid(out)
    run = grid.runs.iloc[0]
    assert 0 <= run.state_mod5_acc_3x <= 1 and 0 <= run.state_mod2_acc_3x <= 1
    # right modulo 10 implies right modulo 2 and modulo 5: the factor accuracies bound the state's from above
    assert run.state_mod2_acc_3x >= run.state_acc_3x and run.state_mod5_acc_3x >= run.state_acc_3x
    compact = tmp_path / "compact"
    from probe.results import write_grid

    write_grid(grid, compact)
    back = load_grid(compact).curves
    assert {"state_mod2", "state_mod5"} <= set(back.subtask)
    with pytest.raises(ProbeError, match="eval_factors"):
        config_from_dict({"name": "x", "seeds": [0], "eval_factors": "yes",
                          "variant": [{"name": "a", "preset": "lstm"}]}, "x.toml")


def test_windows_reach_the_run_summaries_the_compact_form_and_the_report(local_sweep, tmp_path):
    # the metric of record travels from eval.json to runs.jsonl / windows.csv and back bit for bit, and the
    # report shows it beside its chance floor
    local, _ = local_sweep
    grid = load_grid(local)
    w = grid.windows
    assert set(w.run) == set(grid.runs.run) and {"state", "recall", "state_mod2", "state_mod5"} <= set(w.subtask)
    run = grid.runs.set_index("run").loc["lstm/seed0"]
    row = w[(w.run == "lstm/seed0") & (w.subtask == "state") & (w.window == "(1x, 2x]")].iloc[0]
    assert run["state_win_1x_2x"] == row.token_acc and row.chance == 0.1 and run["trained_on"].startswith("cpu")
    from probe.results import write_grid

    write_grid(grid, tmp_path / "compact")
    back = load_grid(tmp_path / "compact").windows
    pd.testing.assert_frame_equal(back.reset_index(drop=True), w.reset_index(drop=True), check_dtype=False)
    table = (local / "results.md").read_text()
    assert "Per window of stream positions" in table and "| lstm | state_mod5 |" in table
    rows = json.loads((local / RESULTS).read_text())["results"]
    assert any(r["row"] == "window" and r["window"] == "(2x, 4x]" and r["chance"] == 0.2 for r in rows)
