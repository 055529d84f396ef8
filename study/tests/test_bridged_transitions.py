"""study/scripts/bridged_transitions.py: each trained bridged run's diagnostic read once, with its checks; a
recurrence without a linear transition gets its one-line reason, never a verdict."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from probe.bridge import BridgeModelConfig
from probe.checkpoint import checkpoint_from_model, save_checkpoint
from probe.tasks import make_task

SCRIPTS = Path(__file__).resolve().parents[2] / "study" / "scripts"
TASK = make_task("interleaved", train_length=5)


def test_each_run_is_read_once_with_its_checks_and_an_lstm_gets_its_reason(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bridged_transitions

    runs = tmp_path / "runs"
    for variant, recurrent in (("nemotron-h-joint", "native"), ("lstm-joint", "lstm")):
        cfg = BridgeModelConfig(arch="nemotron-h", d_model=32, vocab_size=TASK.vocab_size, recurrent=recurrent)
        model = cfg.build(TASK)  # a checkpoint records the config it rebuilds from
        (runs / variant / "seed80").mkdir(parents=True)
        save_checkpoint(runs / variant / "seed80" / "final.pt", checkpoint_from_model(
            model, TASK, train_config={"seed": 80, "schedule": {"variant": "joint"}}))
    out = tmp_path / "transitions.csv"
    assert bridged_transitions.main([str(runs), "--out", str(out), "--samples", "4"]) == 0
    table = pd.read_csv(out)
    mamba = table[(table.variant == "nemotron-h-joint") & (table.layer == "all")].iloc[0]
    # Mamba-2's exp(dt A) stays in (0, 1): read from the model's own transitions, with its three checks passing
    assert mamba["range"] == "positive real in (0, 1]" and not mamba["can_count"]
    assert mamba[["state_reproduction", "negated", "longer_sequences"]].astype(bool).all()
    lstm = table[table.variant == "lstm-joint"]
    assert len(lstm) == 1 and "not applicable" in lstm.note.iloc[0] and pd.isna(lstm.can_count.iloc[0])
    before = out.read_text()
    assert bridged_transitions.main([str(runs), "--out", str(out), "--samples", "4"]) == 0
    assert out.read_text() == before  # a run already in the file is not read again
