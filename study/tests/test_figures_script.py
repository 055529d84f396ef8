"""study/scripts/figures.py: the paper's figure set and its captioned index, drawn from committed results by default
and from a set of shipped checkpoints with --recompute."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from probe.models import ModelConfig
from probe.schedules.points import At
from probe.schedules.settings import ScheduleConfig
from probe.tasks import make_task
from probe.training.config import TrainConfig
from probe.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def S(study_scripts):
    return study_scripts("figures")


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """A miniature of checkpoints/: the four presets (tiny, a few steps) and two hybrid trajectories."""
    root = tmp_path_factory.mktemp("shipped")
    task = make_task("interleaved", train_length=4)
    runs = {"lstm": ("lstm", "joint"), "transformer": ("transformer", "joint"),
            "hybrid-joint": ("hybrid", "joint"), "hybrid-dat": ("hybrid", "delayed")}
    for preset, (family, kind) in runs.items():
        cfg = ModelConfig(family=family, vocab_size=task.vocab_size, d_model=16, n_layers=2, n_heads=2,
                          pos_encoding="sinusoidal" if family == "transformer" else "none")
        sched = ScheduleConfig(variant="dat", switch=At(step=10)) if kind == "delayed" else ScheduleConfig()
        tcfg = TrainConfig(steps=20, batch_size=8, eval_every=20, eval_samples=8, ckpt_every=20, traj_every=10,
                           schedule=sched)
        train(cfg, task, tcfg, root / "runs" / preset, progress=False)
        shutil.copy(root / "runs" / preset / "final.pt", root / f"{preset}.pt")
        if family == "hybrid":
            shutil.copytree(root / "runs" / preset / "trajectory", root / "trajectories" / preset)
    return root


def test_the_default_set_is_drawn_from_committed_results_and_the_rest_is_behind_a_flag(S):
    default = [s.name for s, group in S.FIGURES if group == S.RESULTS]
    assert {"accuracy_vs_length", "fresh_by_window", "gradient_interference"} <= set(default)
    assert not {"probe_heatmap", "shortcut_tests", "attribution_distance"} & set(default)
    helps = {a.dest: a.help for a in S.build_parser()._actions}
    assert "min" in helps["analyses"] and "15 min" in helps["recompute"], "each costly flag says what it costs"


@pytest.mark.slow  # about a minute: every analysis behind every figure, on tiny checkpoints
def test_recompute_draws_every_figure_but_the_grids_and_indexes_them(S, shipped, tmp_path):
    out, nothing = tmp_path / "figs", tmp_path / "none"
    nothing.mkdir()
    assert S.main(["--checkpoints", str(shipped), "--results", str(nothing), "--out", str(out), "--format",
                   "png,pdf", "--recompute", "--small", "--quiet"]) == 0
    made = [s for s in S.SPECS if s.name not in S.GRIDS]
    for spec in S.SPECS:
        assert (out / f"{spec.name}.pdf").exists() == (spec in made), spec.name
    index = (out / "README.md").read_text()
    assert all(f"[{s.name}.png]({s.name}.png)" in index and s.caption.replace("|", "\\|") in index for s in made)
    assert str(shipped) not in index


def test_only_keeps_the_rows_an_index_has(S, shipped, tmp_path):
    out = tmp_path / "one"
    out.mkdir()
    header = "# Figures\n\n| file | caption | same numbers from | inputs | seconds |\n|---|---|---|---|---|\n"
    (out / "README.md").write_text(header)
    results = tmp_path / "results"
    shutil.copytree(ROOT / "study" / "results" / "reproduction", results / "reproduction")
    base = ["--checkpoints", str(shipped), "--results", str(results), "--out", str(out), "--quiet"]
    assert S.main([*base, "--only", "accuracy_vs_length"]) == 0
    index = (out / "README.md").read_text()
    assert "[accuracy_vs_length.png]" in index and "python study/scripts/figures.py" in index
    assert S.main([*base, "--only", "accuracy_vs_length"]) == 0
    assert (out / "README.md").read_text() == index, "remaking a listed figure leaves the index as it is"


@pytest.mark.parametrize("case", ["unknown", "format", "no_checkpoints", "no_results", "out_is_a_file", "truncated",
                                  "no_grid", "not_committed"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(S, shipped, tmp_path, capsys, case):
    out = tmp_path / "out"
    args = ["--checkpoints", str(shipped), "--results", str(tmp_path), "--out", str(out), "--small"]
    if case == "unknown":
        args += ["--only", "nope"]
    elif case == "format":
        args += ["--format", "gif"]
    elif case == "no_checkpoints":
        (tmp_path / "empty").mkdir()
        args[1] = str(tmp_path / "empty")
    elif case == "no_results":
        args[3] = str(tmp_path / "nonexistent")
    elif case == "out_is_a_file":
        out.write_text("a file")
    elif case == "no_grid":
        args += ["--only", "fresh_by_window"]
    elif case == "not_committed":
        args += ["--only", "accuracy_vs_length"]
    else:
        damaged = tmp_path / "damaged"
        shutil.copytree(shipped, damaged)
        data = (damaged / "hybrid-dat.pt").read_bytes()
        (damaged / "hybrid-dat.pt").write_bytes(data[: len(data) // 2])
        args[1] = str(damaged)
    assert S.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, err
    words = {"unknown": "unknown figure", "format": "bad --format", "no_checkpoints": "missing shipped checkpoint",
             "no_results": "--results", "out_is_a_file": "--out", "truncated": "hybrid-dat.pt",
             "no_grid": f"{tmp_path / 'fresh'}/", "not_committed": "--recompute"}[case]
    assert words in err
    if case == "out_is_a_file":
        assert out.read_text() == "a file"
    else:
        assert not out.exists() or not list(out.iterdir())
