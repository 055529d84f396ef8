"""Evaluation: accuracy per subtask against a hand count, the length-generalization score, the CLI contract."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from probe.checkpoint import checkpoint_from_model, save_checkpoint
from probe.evaluate import accuracy_at_length, eval_seed, lengthgen_score, main, parse_lengths
from probe.tasks import make_task

from conftest import tiny_model


def test_accuracy_counts_match_a_hand_count():
    task = make_task("interleaved", train_length=5)
    model = tiny_model("hybrid", task.vocab_size)
    acc = accuracy_at_length(model, task, 9, n_samples=40, batch_size=16, seed=2)
    right = {"state": 0, "recall": 0}
    total = {"state": 0, "recall": 0}
    seq_all = []
    with torch.no_grad():
        for chunk, size in enumerate([16, 16, 8]):
            batch = task.sample(9, size, eval_seed(2, 9, chunk))
            pred = model(batch.tokens).argmax(-1)
            for s in right:
                m = batch.masks[s]
                right[s] += int(((pred == batch.labels) & m).sum())
                total[s] += int(m.sum())
            for b in range(size):
                asked = batch.answer_mask[b]
                seq_all.append(bool((pred[b][asked] == batch.labels[b][asked]).all()))
    for s in right:
        assert acc[s]["token_acc"] == pytest.approx(right[s] / total[s])
    assert acc["all"]["seq_acc"] == pytest.approx(sum(seq_all) / len(seq_all))
    assert acc["all"]["n_tokens"] == total["state"] + total["recall"]


def test_lengthgen_score_is_the_mean_beyond_training_up_to_3x():
    curve = pd.DataFrame({"length": list(range(1, 13)), "subtask": "state", "token_acc": [1.0] * 4 + [0.5] * 8})
    assert lengthgen_score(curve, train_length=4) == {"state": 0.5}
    curve.loc[curve.length > 8, "token_acc"] = 0.0  # the score averages all of (4, 12]
    assert lengthgen_score(curve, train_length=4)["state"] == pytest.approx((4 * 0.5) / 8)


def test_parse_lengths():
    assert parse_lengths("1:5") == [1, 2, 3, 4, 5]
    assert parse_lengths("10:30:10") == [10, 20, 30]
    assert parse_lengths("25,50") == [25, 50]
    from probe.errors import ProbeError

    for bad in ("a:b", "0:3", ""):
        with pytest.raises(ProbeError):
            parse_lengths(bad)


@pytest.fixture
def two_seeds(tmp_path):
    task = make_task("interleaved", train_length=4)
    paths = []
    for seed in (0, 1):
        model = tiny_model("hybrid", task.vocab_size, seed=seed)
        paths.append(save_checkpoint(tmp_path / f"s{seed}.pt", checkpoint_from_model(
            model, task, train_config={"seed": seed, "schedule": {"kind": "joint"}})))
    return paths


def test_cli_json_is_one_tidy_object_and_writes_figure(two_seeds, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main([str(p) for p in two_seeds] + ["--lengths", "1:12", "--samples", "8", "--json", "--out", str(out)])
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    assert set(obj) >= {"probe_version", "command", "checkpoints", "results", "controls"}
    df = pd.DataFrame(obj["results"])
    curve = df[df.length.notna()]
    assert set(curve.subtask) == {"state", "recall", "all"} and len(curve) == 2 * 12 * 3
    assert set(curve.seed) == {0, 1} and set(curve.label) == {"hybrid-joint"}
    score = df[df.metric == "lengthgen_score"]
    assert len(score) == 2 * 3 and score.length.isna().all()
    st = curve[(curve.checkpoint == str(two_seeds[0])) & (curve.subtask == "state") & curve.length.between(5, 12)]
    got = score[(score.checkpoint == str(two_seeds[0])) & (score.subtask == "state")].token_acc.item()
    assert got == pytest.approx(st.token_acc.mean())
    assert {c["control"] for c in obj["controls"]} == {"chance"}
    assert (out / "accuracy_vs_length.png").stat().st_size > 10_000
    assert json.loads((out / "evaluate.json").read_text())["results"] == obj["results"]


def test_cli_human_table(two_seeds, capsys):
    assert main([str(two_seeds[0]), "--lengths", "4,8,12,16", "--samples", "8"]) == 0
    out = capsys.readouterr().out
    assert "hybrid-joint" in out and "1x" in out and "score" in out


@pytest.mark.parametrize("make", ["missing", "junk", "emptydir"])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, make):
    target = tmp_path / "x.pt"
    if make == "junk":
        target.write_bytes(b"not a checkpoint at all")
    if make == "emptydir":
        target = tmp_path / "d"
        target.mkdir()
    assert main([str(target), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1
