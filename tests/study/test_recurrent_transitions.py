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
            model, TASK, train_config={"seed": 0, "schedule": {"kind": "joint"}}))
    out = tmp_path / "transitions.csv"
    assert recurrent_transitions.main([str(runs), "--out", str(out), "--samples", "8"]) == 0
    df = pd.read_csv(out)
    assert set(df.variant) == {"hybrid-ssm-complex-dat"} and sorted(set(df.order)) == [2, 5, 10]
    assert len(df) == 2 * 3  # blocks x orders
    # the run's median fade over its channels, and each order's longest-horizon channel's (none where the untrained
    # block has no channel of that order): shares of the state, in [0, 1]
    assert df.median_fade_400.between(0, 1).all() and df.median_fade_400.nunique() == 1
    assert (df.fade_400.isna() | df.fade_400.between(0, 1)).all()
    before = out.read_text()
    calls = []
    monkeypatch.setattr(recurrent_transitions, "analyze", lambda *a, **k: calls.append(a))
    assert recurrent_transitions.main([str(runs), "--out", str(out)]) == 0
    assert not calls and out.read_text() == before  # finished runs are not read again
    assert recurrent_transitions.main([str(tmp_path / "nowhere"), "--out", str(out)]) == 2
