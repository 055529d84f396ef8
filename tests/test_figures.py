"""`python -m probe.figures` makes every listed figure and its captioned index from a set of shipped checkpoints."""

from __future__ import annotations

import shutil

import pytest

from probe.figures import FIGURES, main
from probe.models import ModelConfig
from probe.schedules import ScheduleConfig
from probe.tasks import make_task
from probe.train import TrainConfig, train


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
        sched = ScheduleConfig(kind=kind, switch=10 if kind == "delayed" else 0)
        tcfg = TrainConfig(steps=20, batch_size=8, eval_every=20, eval_samples=8, ckpt_every=20, traj_every=10,
                           schedule=sched)
        train(cfg, task, tcfg, root / "runs" / preset, progress=False)
        shutil.copy(root / "runs" / preset / "final.pt", root / f"{preset}.pt")
        if family == "hybrid":
            shutil.copytree(root / "runs" / preset / "trajectory", root / "trajectories" / preset)
    return root


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
    assert main(["--checkpoints", str(shipped), "--results", str(tmp_path / "none"), "--out", str(out),
                 "--format", "png,pdf", "--device", "cpu", "--quick"]) == 0
    for spec in FIGURES:
        for fmt in ("png", "pdf"):
            assert (out / f"{spec.name}.{fmt}").stat().st_size > 1000, spec.name
    index = (out / "README.md").read_text()
    for spec in FIGURES:
        # a caption's pipes are escaped so that they do not split the markdown table
        assert f"[{spec.name}.png]({spec.name}.png)" in index and spec.caption.replace("|", "\\|") in index
    assert texts and not [t for t in texts if str(shipped) in t], "figure text names checkpoints by absolute path"


def test_only_and_bad_arguments(shipped, tmp_path, capsys):
    out = tmp_path / "one"
    out.mkdir()
    # an earlier full run left another figure and the index row that describes it
    (out / "probe_heatmap.png").write_bytes(b"earlier")
    (out / "README.md").write_text("| [probe_heatmap.png](probe_heatmap.png) | old caption | `x` | `y` | 55 |\n")
    assert main(["--checkpoints", str(shipped), "--results", str(tmp_path), "--out", str(out),
                 "--only", "accuracy_vs_length", "--quick"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "accuracy_vs_length.png", "probe_heatmap.png"]
    rows = [line for line in (out / "README.md").read_text().splitlines() if line.startswith("| [")]
    assert [r.split("]")[0] for r in rows] == ["| [accuracy_vs_length.png", "| [probe_heatmap.png"]
    heatmap = next(s for s in FIGURES if s.name == "probe_heatmap")
    assert rows[1].endswith("| 55 |") and heatmap.caption.replace("|", "\\|") in rows[1]
    assert "accuracy_vs_length" in capsys.readouterr().err  # the progress bar names the figure being made
    assert main(["--checkpoints", str(shipped), "--results", str(tmp_path), "--out", str(out),
                 "--only", "accuracy_vs_length", "--quick", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["--only", "nope", "--out", str(out)]) == 2
    assert "unknown figure" in capsys.readouterr().err
    assert main(["--format", "gif", "--out", str(out)]) == 2
    assert "bad --format" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--checkpoints", str(empty), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: missing shipped checkpoint") and err.count("\n") == 1


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
