"""study/scripts/recurrent_transitions.py: the recurrent grid's SSM runs read once, other cells skipped."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from probe.checkpoint import checkpoint_from_model, save_checkpoint
from probe.tasks import make_task

from conftest import tiny_model

SCRIPTS = Path(__file__).resolve().parents[2] / "study" / "scripts"
TASK = make_task("interleaved", train_length=5)


def test_grid_script_reads_ssm_runs_once_and_skips_other_cells(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import recurrent_transitions

    runs = tmp_path / "runs"
    # no learned positions, as in the presets: fade_400 needs a 400-token stream
    ssm = tiny_model("hybrid", TASK.vocab_size, d_model=48, rnn="ssm", ssm_range="complex", pos_encoding="none")
    for variant, model in (("hybrid-ssm-complex-dat", ssm),
                           ("hybrid-gru-dat", tiny_model("hybrid", TASK.vocab_size, rnn="gru"))):
        (runs / variant / "seed0").mkdir(parents=True)
        save_checkpoint(runs / variant / "seed0" / "final.pt", checkpoint_from_model(
            model, TASK, train_config={"seed": 0, "schedule": {"variant": "joint"}}))
    out = tmp_path / "transitions.csv"
    assert recurrent_transitions.main([str(runs), "--out", str(out), "--samples", "8"]) == 0
    df = pd.read_csv(out)
    assert set(df.variant) == {"hybrid-ssm-complex-dat"} and sorted(set(df.order)) == [2, 5, 10]
    assert len(df) == 2 * 3  # blocks x orders
    # the run's median fade over its channels, and each order's longest-horizon channel's (none where the untrained
    # block has no channel of that order): shares of the state, in [0, 1]
    assert df.median_fade_400.between(0, 1).all() and df.median_fade_400.nunique() == 1
    assert (df.fade_400.isna() | df.fade_400.between(0, 1)).all()
    windows = [c for c in df if c.startswith("fade_win_")]  # every window of 400 positions at L_train 5, in order
    assert windows == [f"fade_win_{k}" for k in ("0x_1x", "1x_2x", "2x_4x", "4x_8x", "8x_16x", "16x_32x")]
    assert list(df.columns).index("fade_400") + 1 == list(df.columns).index(windows[0])
    phases = [c for c in df if c.startswith("phase_win_")]  # each window's phase error, right after the fades
    assert phases == [w.replace("fade_", "phase_") for w in windows]
    assert list(df.columns).index(phases[0]) == list(df.columns).index(windows[-1]) + 1
    assert (df[phases].isna() | (df[phases] >= 0)).all().all()
    assert df[windows].notna().sum(axis=1).eq(df.fade_400.notna() * len(windows)).all()
    assert (df[windows].isna() | (df[windows] >= 0) & (df[windows] <= 1)).all().all()
    before = out.read_text()
    calls = []
    monkeypatch.setattr(recurrent_transitions, "analyze", lambda *a, **k: calls.append(a))
    assert recurrent_transitions.main([str(runs), "--out", str(out)]) == 0
    assert not calls and out.read_text() == before  # finished runs are not read again
    assert recurrent_transitions.main([str(tmp_path / "nowhere"), "--out", str(out)]) == 2


def test_redo_reads_the_runs_again_and_fills_a_column_written_before_it_existed(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import recurrent_transitions

    runs = tmp_path / "runs"
    ssm = tiny_model("hybrid", TASK.vocab_size, d_model=48, rnn="ssm", ssm_range="negative", pos_encoding="none")
    (runs / "hybrid-ssm-negative-dat" / "seed3").mkdir(parents=True)
    save_checkpoint(runs / "hybrid-ssm-negative-dat" / "seed3" / "final.pt", checkpoint_from_model(
        ssm, TASK, train_config={"seed": 3, "schedule": {"variant": "joint"}}))
    out = tmp_path / "transitions.csv"
    assert recurrent_transitions.main([str(runs), "--out", str(out), "--samples", "8"]) == 0
    full = pd.read_csv(out)
    # as written before the window columns existed, beside another grid's run that RUNS does not hold
    old = full.drop(columns=[c for c in full if c.startswith(("fade_win_", "phase_win_"))])
    other = old.assign(variant="ssm-positive", fade_400=0.5)
    pd.concat([old, other]).to_csv(out, index=False)
    assert recurrent_transitions.main([str(runs), "--out", str(out), "--samples", "8"]) == 0
    assert "fade_win_4x_8x" not in pd.read_csv(out)  # without --redo a run already read is not read again
    assert recurrent_transitions.main([str(runs), "--out", str(out), "--samples", "8", "--redo"]) == 0
    again = pd.read_csv(out)
    assert len(again) == 2 * len(full)  # replaced, not appended; the other run kept
    mine = again[again.variant == "hybrid-ssm-negative-dat"].reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, full)
    assert again[again.variant == "ssm-positive"].fade_win_4x_8x.isna().all()
