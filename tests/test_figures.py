"""`python -m probe.figures` makes every listed figure and its captioned index from a set of shipped checkpoints."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from probe.figures import FIGURES, main
from probe.models import ModelConfig
from probe.tasks import make_task
from probe.training.config import TrainConfig
from probe.training.points import At
from probe.training.settings import ScheduleConfig
from probe.training.trainer import train


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


@pytest.mark.slow  # about a minute: every analysis behind every figure
def test_every_figure_and_the_index(shipped, tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    texts: list[str] = []
    save = Figure.savefig

    def recording_save(fig, *args, **kwargs):
        texts.extend(t.get_text() for t in fig.findobj(Text))
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_save)
    out = tmp_path / "figs"
    nothing = tmp_path / "none"
    nothing.mkdir()  # no shipped results: every figure is recomputed
    assert main(["--checkpoints", str(shipped), "--results", str(nothing), "--out", str(out),
                 "--format", "png,pdf", "--device", "cpu", "--small"]) == 0
    made = [s for s in FIGURES if not s.needs]  # a figure of a committed grid cannot be recomputed: skipped
    assert len(made) < len(FIGURES)
    for spec in FIGURES:
        for fmt in ("png", "pdf"):
            assert (out / f"{spec.name}.{fmt}").exists() == (spec in made), spec.name
            if spec in made:
                assert (out / f"{spec.name}.{fmt}").stat().st_size > 1000, spec.name
    index = (out / "README.md").read_text()
    for spec in made:
        # a caption's pipes are escaped so that they do not split the markdown table
        assert f"[{spec.name}.png]({spec.name}.png)" in index and spec.caption.replace("|", "\\|") in index
    assert texts and not [t for t in texts if str(shipped) in t], "figure text names checkpoints by absolute path"


def test_only_leaves_an_existing_index_as_it_is(shipped, tmp_path, capsys):
    out = tmp_path / "one"
    out.mkdir()
    # an earlier full run left another figure and the index row that describes it
    (out / "probe_heatmap.png").write_bytes(b"earlier")
    header = "# Figures\n\n| file | caption | same numbers from | inputs | seconds |\n|---|---|---|---|---|\n"
    row = "| [probe_heatmap.png](probe_heatmap.png) | old caption | `x` | `y` | 55 |"
    (out / "README.md").write_text(header + row + "\n")
    assert main(["--checkpoints", str(shipped), "--results", str(tmp_path), "--out", str(out),
                 "--only", "accuracy_vs_length", "--small"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "accuracy_vs_length.png", "probe_heatmap.png"]
    # the new figure gets a row; every line that was there stays byte for byte
    index = (out / "README.md").read_text()
    rows = [line for line in index.splitlines() if line.startswith("| [")]
    assert [r.split("]")[0] for r in rows] == ["| [accuracy_vs_length.png", "| [probe_heatmap.png"]
    assert rows[1] == row
    assert index.startswith(header)
    assert "accuracy_vs_length" in capsys.readouterr().err  # the progress bar names the figure being made
    # remaking a figure the index already lists changes nothing in it (a committed index stays clean)
    assert main(["--checkpoints", str(shipped), "--results", str(tmp_path), "--out", str(out),
                 "--only", "accuracy_vs_length", "--small", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert (out / "README.md").read_text() == index


@pytest.mark.parametrize("case", ["unknown", "format", "no_checkpoints", "no_results", "out_is_a_file", "truncated",
                                  "retrain"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(shipped, tmp_path, capsys, case):
    out = tmp_path / "out"
    # --quick, the old spelling of --small, still parses
    args = ["--checkpoints", str(shipped), "--results", str(tmp_path), "--out", str(out), "--quick"]
    if case == "unknown":
        args += ["--only", "nope"]
    elif case == "format":
        args += ["--format", "gif"]
    elif case == "no_checkpoints":
        empty = tmp_path / "empty"
        empty.mkdir()
        args[1] = str(empty)
    elif case == "no_results":
        args[3] = str(tmp_path / "nonexistent")
    elif case == "out_is_a_file":
        out.write_text("a file")
    elif case == "retrain":  # removed: the figures never train; they say how to get the runs instead
        args += ["--retrain"]
    else:  # a damaged checkpoint fails before any figure is drawn, not after minutes of analyses
        damaged = tmp_path / "damaged"
        shutil.copytree(shipped, damaged)
        data = (damaged / "hybrid-dat.pt").read_bytes()
        (damaged / "hybrid-dat.pt").write_bytes(data[: len(data) // 2])
        args[1] = str(damaged)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, err
    words = {"unknown": "unknown figure", "format": "bad --format", "no_checkpoints": "missing shipped checkpoint",
             "no_results": "--results", "out_is_a_file": "--out", "truncated": "hybrid-dat.pt",
             "retrain": "--retrain is gone"}[case]
    assert words in err
    if case == "out_is_a_file":
        assert out.read_text() == "a file"
    else:
        assert not out.exists() or not list(out.iterdir())


def test_figure_text_names_checkpoints_without_the_folder_they_sit_in(tmp_path):
    import matplotlib.pyplot as plt

    from probe.figures import _without_local_paths

    root = tmp_path / "checkpoints"
    fig, ax = plt.subplots()
    ax.set_title(f"{root}/hybrid-dat.pt")
    ax.plot([0, 1], label=f"hybrid-joint ({root}/trajectories/hybrid-joint/step_000010.pt)")
    ax.legend()
    _without_local_paths(fig, [root])
    assert ax.get_title() == "hybrid-dat.pt"
    assert ax.get_legend().get_texts()[0].get_text() == "hybrid-joint (trajectories/hybrid-joint/step_000010.pt)"
    plt.close(fig)


def _tiny_recurrent_grid(root):
    """results/recurrent in compact form: two cells, alone / joint / dat, two seeds, lengths to 16x of L_train 4,
    with the parity rows; accuracies made up (the figure's drawing is under test, not a model)."""
    import pandas as pd

    from probe.results import Grid, run_summary, write_grid

    rows, runs = [], []
    for variant in ("gru", "hybrid-gru-joint", "hybrid-gru-dat", "ssm-complex", "hybrid-ssm-complex-joint"):
        for seed in (0, 1):
            part = []
            for length in [*range(1, 17), 24, 32, 64]:
                acc = 1.0 if length <= 4 or "dat" in variant else 0.5 + 0.1 * seed
                for subtask, value in (("state", acc), ("recall", 1.0), ("state_mod2", 1.0)):
                    part.append({"variant": variant, "seed": seed, "run": f"{variant}/seed{seed}",
                                 "label": variant, "train_length": 4, "length": length, "subtask": subtask,
                                 "token_acc": value, "seq_acc": value, "n_tokens": 100, "checkpoint": None})
            curve = pd.DataFrame(part)
            rows.append(curve)
            runs.append(run_summary(variant, seed, curve, {}, {"train_length": 4, "label": variant}))
    grid = Grid("recurrent", pd.DataFrame(runs), pd.concat(rows, ignore_index=True))
    write_grid(grid, root / "recurrent")
    return root


@pytest.mark.parametrize("figure, grid", [("which_recurrence", "recurrent"), ("fresh_by_window", "fresh")])
def test_a_grid_figure_is_drawn_from_its_grid_and_refused_without_it(figure, grid, shipped, tmp_path, capsys):
    out = tmp_path / "figs"
    base = ["--checkpoints", str(shipped), "--out", str(out), "--only", figure, "--small"]
    assert main([*base, "--results", str(tmp_path)]) == 2  # a results folder without the grid
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / grid}/" in err and not out.exists()
    # without --results (the default) nothing is read from a results folder: the grid figure says what it needs
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--results {grid}/" in err and not out.exists()
    if grid == "recurrent":
        results = _tiny_recurrent_grid(tmp_path / "results")
    else:
        results = tmp_path / "results"
        shutil.copytree(Path(__file__).resolve().parents[1] / "study" / "results" / grid, results / grid)
    assert main([*base, "--results", str(results), "--quiet"]) == 0
    assert (out / f"{figure}.png").stat().st_size > 10_000


def test_cell_and_schedule_parse_the_recurrent_grid_s_variant_names():
    from probe.sweep.plots import cell_and_schedule

    assert cell_and_schedule("hybrid-ssm-complex-dat") == ("ssm-complex", "dat")
    assert cell_and_schedule("hybrid-gru-stopgrad-rnn") == ("gru", "stopgrad-rnn")
    assert cell_and_schedule("ssm-negative") == ("ssm-negative", "alone")
    assert cell_and_schedule("hybrid-gru-weird") == ("gru-weird", "other")


def test_recurrence_figure_has_a_column_per_cell_and_a_row_per_subtask(tmp_path):
    import matplotlib.pyplot as plt

    from probe.sweep.aggregate import aggregate
    from probe.sweep.plots import plot_by_cell

    report = aggregate(_tiny_recurrent_grid(tmp_path) / "recurrent")
    fig = plot_by_cell(report.curves, report.bands)
    assert len(fig.axes) == 2 * 2 and [ax.get_title() for ax in fig.axes[:2]] == ["gru", "ssm-complex"]
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["alone (2)", "joint (2)", "dat (2)"]
    plt.close(fig)
    no_parity = report.curves[report.curves.subtask != "state_mod2"]
    fig = plot_by_cell(no_parity, report.bands)
    assert len(fig.axes) == 2  # the parity row needs --factors curves
    plt.close(fig)
