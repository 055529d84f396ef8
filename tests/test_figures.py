"""probe.figures: the paper-ready plots draw every seed, the chance line and a reader's names, keep curves on top of
each other apart, and ``draw`` / ``write_index`` save a set of figures with its captioned index."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from probe import figures as F  # noqa: E402


def _curves() -> pd.DataFrame:
    """Two models x three seeds x lengths 1..12, L_train 4; 'b' sits exactly on 'a' (both at 1.0)."""
    rows = []
    for variant in ("a", "b"):
        for seed in (0, 1, 2):
            for length in range(1, 13):
                for subtask in ("state", "recall"):
                    rows.append({"variant": variant, "seed": seed, "length": length, "subtask": subtask,
                                 "token_acc": 1.0, "train_length": 4})
    return pd.DataFrame(rows)


def _lines_at(ax, y: float) -> list:
    return [ln for ln in ax.get_lines() if len(ln.get_ydata()) == 2 and np.allclose(ln.get_ydata(), y)]


def test_accuracy_vs_length_draws_every_seed_chance_and_reader_names():
    fig = F.plot_accuracy_vs_length(_curves(), hue="variant", order=["a", "b"], chance={"state": 0.1, "recall": 0.25},
                                    labels={"a": "model A", "b": "hybrid, DAT"})
    state, recall = fig.axes[:2]
    assert _lines_at(state, 0.1) and _lines_at(recall, 0.25), "a chance line per subtask at its floor"
    seed_lines = [ln for ln in state.get_lines() if ln.get_linewidth() == 0.5]
    assert len(seed_lines) == 2 * 3, "every seed of every model drawn"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "model A (3 seeds)" in legend and "hybrid, DAT (3 seeds)" in legend
    assert not state.get_legend(), "the legend sits below the panels, not on the data"
    means = {ln.get_label(): ln for ln in state.get_lines() if ln.get_label().endswith("seeds)")}
    a, b = means["model A (3 seeds)"], means["hybrid, DAT (3 seeds)"]
    # on top of each other at 1.0, the two stay apart: another marker, line style and marker positions, b above a
    assert a.get_marker() != b.get_marker() and a.get_linestyle() != b.get_linestyle()
    assert a.get_markevery() != b.get_markevery() and b.get_zorder() > a.get_zorder()
    plt.close(fig)


def test_accuracy_vs_length_takes_the_chance_floor_from_a_column():
    curves = _curves().assign(chance=lambda d: np.where(d.subtask == "state", 0.1, 0.5))
    fig = F.plot_accuracy_vs_length(curves)
    assert _lines_at(fig.axes[0], 0.1) and _lines_at(fig.axes[1], 0.5)
    plt.close(fig)


def _windows() -> pd.DataFrame:
    """One condition in two precisions, 6 seeds split 3 at 1.0 / 3 at 0.2 in the far window: a bimodal split."""
    rows = []
    for precision in ("bf16", "fp32"):
        for seed in range(6):
            for j, (window, lo, hi) in enumerate((("in range", 0, 4), ("(1x, 2x]", 4, 8))):
                acc = 1.0 if j == 0 or seed < 3 else 0.2
                rows.append({"condition": "joint4", "precision": precision, "seed": seed, "window": window,
                             "lo": lo, "hi": hi, "subtask": "state", "token_acc": acc, "chance": 0.1})
    return pd.DataFrame(rows)


def test_window_seeds_shows_every_seed_apart_and_the_mean_with_its_interval():
    fig = F.plot_window_seeds(_windows(), hue="condition", column="precision",
                              labels={"joint4": "4-block hybrid, joint", "bf16": "trained in bfloat16"})
    ax = fig.axes[0]
    assert ax.get_title() == "trained in bfloat16" and fig.axes[1].get_title() == "float32 training"
    dots = np.vstack([c.get_offsets() for c in ax.collections if len(c.get_offsets()) == 6])
    assert len(dots) == 2 * 6, "every seed in every window"
    far = dots[dots[:, 0] > 0.5]
    assert sorted(far[:, 1]) == [0.2] * 3 + [1.0] * 3
    assert len(np.unique(far[far[:, 1] == 1.0][:, 0])) == 3, "coinciding seeds are set side by side, not stacked"
    # the mean (0.6) with its t-interval, drawn beside the seeds, not on them
    bars = [c for c in ax.containers if hasattr(c, "lines")]
    means = [b.lines[0].get_ydata()[0] for b in bars]
    assert pytest.approx(0.6) in means
    x_mean = next(b.lines[0].get_xdata()[0] for b in bars if b.lines[0].get_ydata()[0] == pytest.approx(0.6))
    assert x_mean > far[:, 0].max()
    assert ax.collections, "chance drawn"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "4-block hybrid, joint (6 seeds)" in legend and "chance (a uniform guess)" in legend
    plt.close(fig)


def _training() -> pd.DataFrame:
    """Joint: 3 seeds at steps 0, 10, 20; DAT: 1 seed whose gate turns on at step 10; lengths 4.0 and 12.0."""
    rows = []
    for schedule, seeds in (("joint", (0, 1, 2)), ("delayed", (0,))):
        for seed in seeds:
            for step in (0, 10, 20):
                for length in (4.0, 12.0):
                    gate = 0.0 if schedule == "delayed" and step < 10 else 1.0
                    rows.append({"schedule": schedule, "seed": seed, "step": step, "length": length, "gate": gate,
                                 "att_ratio": 0.1 * seed + step / 100})
    return pd.DataFrame(rows)


def test_over_training_names_dat_titles_without_float_artefacts_and_bands_only_over_enough_runs():
    fig = F.plot_over_training(_training(), [("att_ratio", "|g_att| / |g|")], train_length=4)
    left, right = fig.axes
    assert left.get_title() == "length 4 (1x L_train)" and right.get_title() == "length 12 (3x L_train)"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "DAT (1 seed)" in legend and "joint (3 seeds)" in legend and not any("delayed" in t for t in legend)
    assert "DAT: attention switched on" in legend
    assert len(left.collections) == 1, "one band: joint's 3 runs; DAT's single run has none"
    thin = [ln for ln in left.get_lines() if ln.get_linewidth() == 0.7]
    assert len(thin) == 3 + 1, "every run drawn"
    plt.close(fig)


def test_over_training_draws_an_interval_over_batches_of_one_run():
    table = pd.concat([_training().assign(batch=k, att_ratio=lambda d, k=k: d.att_ratio + 0.01 * k)
                       for k in range(3)])
    fig = F.plot_over_training(table[table.schedule == "delayed"], [("att_ratio", "r")])
    assert any(c for c in fig.axes[0].containers), "error bars over the batches of one run"
    plt.close(fig)


def test_reader_names_and_numbers():
    assert F.reader_name("delayed") == "DAT" and F.reader_name("state_mod5") == "state mod 5"
    assert F.reader_name("x", {"x": "y"}) == "y" and F.reader_name("unknown") == "unknown"
    assert F.number(25.0) == "25" and F.number(2.5) == "2.5"


def test_draw_and_index_save_the_set_and_rewrite_nothing_unchanged(tmp_path):
    def make(_):
        fig, ax = plt.subplots()
        ax.set_title(f"{tmp_path}/inside/file.pt")
        return fig

    specs = [F.FigureSpec("one", "a |g| caption", "python -m x", "in/", make),
             F.FigureSpec("two", "never drawn", "c", "i", make)]
    rows = F.draw(specs[:1], None, tmp_path, ("png", "pdf"), progress=False, roots=[tmp_path])
    first = (tmp_path / "one.png").read_bytes()
    F.draw(specs[:1], None, tmp_path, ("png",), progress=False, roots=[tmp_path])
    assert (tmp_path / "one.png").read_bytes() == first, "the same figure is the same bytes"
    assert F.write_index(tmp_path, specs, {r["figure"]: r["seconds"] for r in rows}, "Made by x in {seconds} s.")
    text = (tmp_path / "README.md").read_text()
    assert "[one.png](one.png), [one.pdf](one.pdf)" in text and "a \\|g\\| caption" in text and "two" not in text
    assert not F.write_index(tmp_path, specs, {}, "Made by x in {seconds} s."), "an unchanged index is not rewritten"


def test_figure_text_names_files_without_the_folder_they_sit_in(tmp_path):
    root = tmp_path / "checkpoints"
    fig, ax = plt.subplots()
    ax.set_title(f"{root}/hybrid-dat.pt")
    ax.plot([0, 1], label=f"hybrid-joint ({root}/trajectories/hybrid-joint/step_000010.pt)")
    ax.legend()
    F.without_local_paths(fig, [root])
    assert ax.get_title() == "hybrid-dat.pt"
    assert ax.get_legend().get_texts()[0].get_text() == "hybrid-joint (trajectories/hybrid-joint/step_000010.pt)"
    plt.close(fig)


def test_running_the_module_says_where_the_figures_come_from():
    """``python -m probe.figures`` (a command in older versions and in the issue that moved it) does nothing silently
    no more: one line on stderr naming the commands that draw figures, exit code 2."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "probe.figures"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == F.NO_COMMAND and "probe.sweep GRID --report" in done.stderr
