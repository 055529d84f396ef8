"""probe.sweep: configs, local pool vs Ray bit for bit, SIGKILLed workers, failing runs, --report, dry runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray  # CI installs the extra (README's test command): the Ray executor is tested, never skipped
import torch

import probe.train
from probe.checkpoint import load_checkpoint
from probe.errors import ProbeError
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
from probe.sweep.aggregate import RESULTS, bootstrap_ci
from probe.sweep.cli import main
from probe.sweep.config import config_from_dict

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
    real = probe.train.save_checkpoint

    def save_then_die(path, ckpt):
        written = real(path, ckpt)
        if Path(path).name == "last.pt" and ckpt.step >= KILL_STEP and not _marker(run).exists():
            _marker(run).write_text(str(ckpt.step))
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    probe.train.save_checkpoint = save_then_die  # the trainer calls it through its module
    try:
        return execute_run(run, opts)
    finally:
        probe.train.save_checkpoint = real


def kill_always(run, opts):
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def ray_instance():
    # Ray's workers cannot import this test module by name: ship its functions (kill_once) by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


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
    assert load_config("sweeps/reproduction.toml").runs("runs")[0].out.parts[-2:] == ("lstm", "seed0")


@pytest.mark.parametrize("text,message", [
    ('seed = [0]\n[[variant]]\npreset = "lstm"\n', "unknown key"),
    ('seeds = [0]\n[[variant]]\npreset = "gru"\n', "unknown preset 'gru'"),
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


def test_ray_executor_without_ray_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails as if it were not installed
    assert main(["--preset", "lstm", "--seeds", "0", "--out", str(tmp_path), "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install -e ".[ray]"' in err


# --- executors: bit identity, failing runs, killed workers ----------------------------------------------------
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


def test_failing_runs_are_reported_and_the_others_finish(ray_instance, tmp_path, capsys):
    config = tmp_path / "sweep.toml"
    config.write_text(f'name = "faults"\nseeds = [0]\nsteps = {STEPS}\nset = {json.dumps(TINY)}\n'
                      '[[variant]]\nname = "ok"\npreset = "lstm"\n'
                      '[[variant]]\nname = "typo"\npreset = "lstm"\nset = ["train.no_such_field=1"]\n'
                      '[[variant]]\nname = "nan"\npreset = "lstm"\nset = ["train.lr=1e30"]\n')
    out = tmp_path / "out"
    assert main([str(config), "--out", str(out), "--executor", "ray", *QUIET, "--no-figure"]) == 1
    err = capsys.readouterr().err
    assert "FAILED typo/seed0: " in err and "train.no_such_field" in err
    assert "FAILED nan/seed0: non-finite loss" in err
    assert f"(log: {out.resolve() / 'nan' / 'seed0' / 'train.log'})" in err
    assert "Traceback" in (out / "typo" / "seed0" / "train.log").read_text()
    assert (out / "ok" / "seed0" / "eval.json").exists()
    result = json.loads((out / RESULTS).read_text())
    assert result["missing"] == ["typo/seed0", "nan/seed0"]
    assert {r["variant"] for r in result["results"]} == {"ok"}


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


def test_summary_rows_are_the_mean_and_bootstrap_ci_of_each_seeds_value(local_sweep):
    local, _ = local_sweep
    df = pd.DataFrame(json.loads((local / RESULTS).read_text())["results"])
    runs, summary = df[df.row == "run"], df[df.row == "summary"]
    assert len(runs[runs.length.notna()]) == 4 * 24 * 3  # runs x lengths 1..4x6 x subtasks
    row = summary[(summary.variant == "lstm") & (summary.subtask == "state") & (summary.factor == 3)].iloc[0]
    at3x = runs[(runs.variant == "lstm") & (runs.subtask == "state") & (runs.length == 18)].set_index("seed")
    assert row.seed_0 == at3x.token_acc[0] and row.seed_1 == at3x.token_acc[1]
    assert row["mean"] == pytest.approx(at3x.token_acc.mean())
    assert min(row.seed_0, row.seed_1) <= row.ci_low <= row["mean"] <= row.ci_high <= max(row.seed_0, row.seed_1)
    score = summary[(summary.variant == "lstm") & (summary.subtask == "state")
                    & (summary.metric == "lengthgen_score")].iloc[0]
    per_run = runs[(runs.variant == "lstm") & (runs.subtask == "state") & (runs.metric == "lengthgen_score")]
    assert score.n_seeds == 2 and score["mean"] == pytest.approx(per_run.token_acc.mean())
    beyond = runs[(runs.variant == "lstm") & (runs.subtask == "state") & runs.length.between(7, 18)]
    assert score["mean"] == pytest.approx(beyond.token_acc.mean())  # the score: mean over lengths in (L, 3L]


def test_bootstrap_ci_covers_the_mean_and_shrinks_with_more_seeds():
    few, many = np.array([[0.7], [0.8], [0.9]]), np.tile([[0.7], [0.8], [0.9]], (14, 1))
    (lo3, hi3), (lo40, hi40) = bootstrap_ci(few), bootstrap_ci(many)
    assert lo3[0] < 0.8 < hi3[0] and lo40[0] < 0.8 < hi40[0]
    assert hi40[0] - lo40[0] < hi3[0] - lo3[0]
    assert np.isnan(bootstrap_ci(np.array([[0.5]]))[0][0])  # one seed has no interval
    assert bootstrap_ci(np.ones((4, 1)))[0][0] == 1.0  # every seed agrees: the interval is that value


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


# Last: it leaves Ray a worker short. retries=0, so that no fresh worker has to import torch only to die again.
def test_ray_worker_that_dies_beyond_its_retries_is_reported_failed(ray_instance, tmp_path):
    cfg = tiny(["lstm"], [0])
    (result,) = run_sweep(cfg, tmp_path, RayExecutor(2, retries=0), OPTS, progress=False,
                          worker=kill_always).results
    assert result.status == "failed" and "worker died 1 time(s)" in result.error
