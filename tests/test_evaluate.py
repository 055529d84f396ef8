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
            model, task, train_config={"seed": seed, "schedule": {"variant": "joint"}})))
    return paths


@pytest.mark.slow  # about 8 s: seaborn figure
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
    assert all(c["kind"] == "control" and isinstance(c["passed"], bool) for c in obj["controls"])
    recall = next(c for c in obj["controls"] if c["subtask"] == "recall")
    assert recall["token_acc"] == 1 / make_task("interleaved").n_values
    assert recall["threshold"] == recall["token_acc"] and recall["passes_if"] == ">" and "not learned" in recall["what"]
    assert (out / "accuracy_vs_length.png").stat().st_size > 10_000
    assert json.loads((out / "results.json").read_text())["results"] == obj["results"]


def test_cli_human_table(two_seeds, capsys):
    assert main([str(two_seeds[0]), "--lengths", "4,8,12,16", "--samples", "8"]) == 0
    out = capsys.readouterr().out
    assert "hybrid-joint" in out and "1x" in out and "score" in out
    assert "±" not in out  # one seed has no spread to show
    assert "control chance subtask=state: value" in out and "passes if >" in out  # the number and its bar


def test_summary_spread_is_the_sample_sd_over_seeds():
    """Two seeds at 50 % and 100 %: mean 75, sample SD 35.4 (a population SD would say 25)."""
    from probe.evaluate import summary_table

    curves = pd.DataFrame({"checkpoint": ["a.pt", "b.pt"], "label": "m", "subtask": "state", "seed": [0, 1],
                           "length": 12, "train_length": 4,
                           "token_acc": [0.5, 1.0]})
    assert summary_table(curves, factors=(3,)).loc[0, "3x"] == "75.0 ± 35.4"


def test_solved_table_counts_seeds_above_the_threshold_and_exact_match():
    """One seed solves 3x (95 %), one does not (50 %): ``1/2``, and the exact-match mean (40 and 0 -> 20.0); 16x is
    shown when it was evaluated, 4x is not shown when it was not."""
    from probe.evaluate import solved_table

    curves = pd.DataFrame({"checkpoint": ["a.pt", "b.pt", "a.pt", "b.pt"], "label": "m", "subtask": "state",
                           "seed": [0, 1, 0, 1], "length": [12, 12, 64, 64], "train_length": 4,
                           "token_acc": [0.95, 0.5, 0.99, 0.2], "seq_acc": [0.4, 0.0, 0.9, 0.0]})
    table = solved_table(curves)
    assert table.loc[0, "3x"] == "1/2 · 20.0" and table.loc[0, "16x"] == "1/2 · 45.0"
    assert "4x" not in table.columns
    assert solved_table(curves, threshold=0.99).loc[0, "16x"] == "0/2 · 45.0"  # strictly above, as the sweep counts


def test_cli_human_table_shows_a_length_that_is_not_a_multiple(two_seeds, capsys):
    """``--lengths 6`` once printed only a score column: the accuracy at the asked length must show."""
    assert main([str(two_seeds[0]), "--lengths", "6", "--samples", "8"]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert "L=6" in header.split() and "1x" not in header


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


# --- bad arguments: one line, exit 2, nothing written ---------------------------------------------------------
@pytest.mark.parametrize(("args", "words"), [
    (["--samples", "0"], "--samples: 0 must be a positive integer"),
    (["--batch-size", "-3"], "--batch-size: -3 must be a positive integer"),
    (["--threads", "-2"], "--threads: -2 must be 0 or a positive integer"),
    (["--lengths", ""], "empty --lengths"),
    (["--lengths", "9:2"], "an empty range"),
    (["--lengths", "1:9:0"], "bad --lengths '1:9:0'"),
    (["--lengths", "100000"], "length 100000 needs about"),
])
def test_cli_bad_arguments_exit_2_with_one_line_and_write_nothing(two_seeds, tmp_path, capsys, monkeypatch, args,
                                                                   words):
    monkeypatch.setattr("probe.memory.available_bytes", lambda device="cpu": 2**30)
    out = tmp_path / "out"
    assert main([str(two_seeds[0]), "--json", "--out", str(out), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and words in captured.err, captured.err
    assert not out.exists()


def test_a_length_too_long_for_memory_is_refused_naming_the_longest_that_fits():
    from probe.errors import ProbeError
    from probe.memory import fit_batch_size, forward_cost

    task = make_task("interleaved", train_length=4)
    cfg = tiny_model("hybrid", task.vocab_size).cfg
    budget = 2**30
    with pytest.raises(ProbeError) as e:
        fit_batch_size(cfg, 100_000, 256, prefix=task.prefix_len, available=budget)
    msg = str(e.value)
    assert "length 100000" in msg and "attention scores" in msg and "\n" not in msg, msg
    longest = int(msg.rsplit("up to ", 1)[1])
    assert fit_batch_size(cfg, longest, 256, prefix=task.prefix_len, available=budget) == 1
    assert forward_cost(cfg, task.prefix_len + longest + 1).total > budget / 2
    # shorter sequences get the largest sub-batch that fits, capped at what was asked for
    b = fit_batch_size(cfg, longest // 4, 256, prefix=task.prefix_len, available=budget)
    one = forward_cost(cfg, task.prefix_len + longest // 4).total
    assert 1 < b < 256 and b * one <= budget / 2 < (b + 1) * one


def test_lengths_run_longest_first_and_come_back_in_the_order_asked():
    """The model sees the longest length first (ascending sizes once grew the resident set 7x), the rows keep the
    asked order, a repeated length is evaluated once, and the numbers are those of the ascending order."""
    from probe.evaluate import length_curve

    task = make_task("interleaved", train_length=4)
    model = tiny_model("hybrid", task.vocab_size)
    seen: list[int] = []
    model.hook_embed.add_hook(lambda act, hook: seen.append(act.shape[1]))
    curve = length_curve(model, task, [12, 6, 30, 6], n_samples=8)
    model.reset_hooks()
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == 3
    assert list(dict.fromkeys(curve.length)) == [12, 6, 30]
    ascending = length_curve(model, task, [12, 6, 30], n_samples=8, longest_first=False)
    pd.testing.assert_frame_equal(curve, ascending)


def test_memory_sub_batches_do_not_change_the_numbers(monkeypatch):
    """When memory allows only a few sequences per forward pass, the same sequences are drawn and scored."""
    from probe.evaluate import length_curve

    task = make_task("interleaved", train_length=4)
    model = tiny_model("hybrid", task.vocab_size)
    full = length_curve(model, task, [6, 30], n_samples=24, batch_size=24)
    sizes: list[int] = []
    model.hook_embed.add_hook(lambda act, hook: sizes.append(act.shape[0]))
    from probe.memory import SAFETY, forward_cost

    ten = 10 * forward_cost(model.cfg, task.prefix_len + 6).total / SAFETY  # room for 10 sequences of length 6
    monkeypatch.setattr("probe.memory.available_bytes", lambda device="cpu": int(ten))
    small = length_curve(model, task, [6, 30], n_samples=24, batch_size=24)
    model.reset_hooks()
    assert max(sizes) < 24 and sum(sizes) == 2 * 24, sizes
    pd.testing.assert_frame_equal(full, small)


def test_run_folder_evaluates_final_only_and_says_so(tmp_path, capsys):
    task = make_task("interleaved", train_length=4)
    run = tmp_path / "run"
    for name in ("last.pt", "final.pt"):
        save_checkpoint(run / name, checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    assert main([str(run), "--lengths", "3", "--samples", "4"]) == 0
    captured = capsys.readouterr()
    assert "a training run: using final.pt" in captured.err
    assert main([str(run), "--lengths", "3", "--samples", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoints"] == [str(run / "final.pt")]
    (run / "final.pt").unlink()
    assert main([str(run), "--lengths", "3", "--samples", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoints"] == [str(run / "last.pt")]


def test_folder_of_shipped_checkpoints_evaluates_every_file(two_seeds, capsys):
    assert main([str(two_seeds[0].parent), "--lengths", "3", "--samples", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoints"] == [str(p) for p in two_seeds]


def test_progress_goes_to_stderr_also_under_json_and_no_progress_silences_it(two_seeds, capsys):
    assert main([str(two_seeds[0]), "--lengths", "1:3", "--samples", "4"]) == 0
    assert "hybrid-joint (s0.pt)" in capsys.readouterr().err
    assert main([str(two_seeds[0]), "--lengths", "1:3", "--samples", "4", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert "hybrid-joint (s0.pt)" in captured.err and "pos" in captured.err  # the bar counts sequence positions
    assert main([str(two_seeds[0]), "--lengths", "1:3", "--samples", "4", "--json", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_default_lengths_are_every_fifth_of_l_train_and_every_length_is_a_flag(tmp_path, capsys):
    from probe.core.lengths import stepped, up_to

    task = make_task("interleaved", train_length=10)
    path = save_checkpoint(tmp_path / "h.pt", checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    for extra, lengths in (([], stepped(10)), (["--every-length"], up_to(10))):
        assert main([str(path), "--samples", "2", "--json", "--no-progress", *extra]) == 0
        rows = pd.DataFrame(json.loads(capsys.readouterr().out)["results"])
        assert sorted(rows[rows.length.notna()].length.astype(int).unique()) == lengths
        assert set(rows[rows.metric == "window"].evaluated_length) == {16 * 10}, "the windows stay at 16x"
    assert stepped(10) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40]
    assert {13, 26, 39, 52} <= set(stepped(13)), "the multiples of L_train are always evaluated"


def test_a_long_evaluation_says_its_estimate_before_it_starts(two_seeds, capsys, monkeypatch):
    import probe.evaluate as E

    monkeypatch.setattr(E, "ESTIMATE_ABOVE_S", 0.0)  # every evaluation counts as long
    assert main([str(two_seeds[0]), "--lengths", "1:8", "--samples", "4", "--json"]) == 0
    first = capsys.readouterr().err.lstrip("\r").splitlines()[0]
    assert first.startswith("evaluating 1 checkpoint(s) x 8 lengths x 4 sequences: about ") and "timed here" in first
    monkeypatch.setattr(E, "ESTIMATE_ABOVE_S", 1e9)  # a short one says nothing
    assert main([str(two_seeds[0]), "--lengths", "1:8", "--samples", "4", "--json"]) == 0
    assert "about" not in capsys.readouterr().err


def test_the_estimate_grows_with_the_work_and_is_measured_on_this_machine(monkeypatch):
    import probe.evaluate as E

    task = make_task("interleaved", train_length=4)
    model = tiny_model("hybrid", task.vocab_size)
    monkeypatch.setattr(E, "_forward_seconds", lambda model, task, length, batch: 0.01 * (task.prefix_len + length))
    monkeypatch.setattr(E, "ESTIMATE_ABOVE_S", 0.0)
    short = E.estimate_seconds(model, task, [4, 8], 16, 16)
    assert short == pytest.approx(0.01 * sum(task.prefix_len + n for n in (4, 8)))
    assert E.estimate_seconds(model, task, [4, 8], 32, 16) == pytest.approx(2 * short), "two passes per length"
    assert E.estimate_seconds(model, task, [4, 8], 16, 16, windows_at=64) > short


class _ShiftedOracle(torch.nn.Module):
    """Answers every question from the task's own labels, the state answers shifted by ``shift`` mod m: shift 5
    is right modulo 5 and wrong modulo 2 at every state answer (and shift 2 the reverse), recall always right."""

    def __init__(self, task, shift: int):
        super().__init__()
        self.task, self.shift = task, shift
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        batch = self.task.relabel(tokens)
        labels = batch.labels.clone()
        state = batch.masks["state"]
        labels[state] = (labels[state] + self.shift) % self.task.m
        return torch.nn.functional.one_hot(labels.clamp(min=0), self.task.vocab_size).float()


def test_state_factors_are_the_prime_power_factors_of_the_modulus():
    from probe.evaluate import state_factors

    assert state_factors(10) == [2, 5]
    assert state_factors(12) == [4, 3]
    assert state_factors(30) == [2, 3, 5]
    assert state_factors(8) == [] and state_factors(7) == []  # a prime power has no smaller factor to be right on


@pytest.mark.parametrize("shift, mod2, mod5", [(0, 1.0, 1.0), (5, 0.0, 1.0), (2, 1.0, 0.0), (1, 0.0, 0.0)])
def test_factor_accuracy_separates_parity_from_z5(shift, mod2, mod5):
    task = make_task("interleaved", train_length=5)
    acc = accuracy_at_length(_ShiftedOracle(task, shift), task, 12, n_samples=32, seed=1, factors=True)
    assert acc["state"]["token_acc"] == (1.0 if shift == 0 else 0.0)
    assert acc["state_mod2"]["token_acc"] == mod2 and acc["state_mod5"]["token_acc"] == mod5
    assert acc["state_mod2"]["n_tokens"] == acc["state"]["n_tokens"] > 0
    assert acc["recall"]["token_acc"] == 1.0
    assert "state_mod2" not in accuracy_at_length(_ShiftedOracle(task, 0), task, 12, n_samples=8)  # opt-in


def test_factor_accuracy_counts_a_non_number_answer_as_wrong():
    task = make_task("interleaved", train_length=5)

    class KeyAnswerer(_ShiftedOracle):
        def forward(self, tokens):
            out = super().forward(tokens)
            # a key token whose id is congruent to the answer mod 2 and mod 5 (id = answer + m) must not count
            state = self.task.relabel(tokens).masks["state"]
            shifted = torch.where(state, out.argmax(-1) + self.task.m, out.argmax(-1))
            return torch.nn.functional.one_hot(shifted, self.task.vocab_size).float()

    acc = accuracy_at_length(KeyAnswerer(task, 0), task, 12, n_samples=16, seed=3, factors=True)
    assert acc["state_mod2"]["token_acc"] == 0.0 and acc["state_mod5"]["token_acc"] == 0.0


def test_factors_refuse_a_task_whose_state_answers_are_not_numbers():
    from probe.errors import ProbeError

    task = make_task("coupled", train_length=5)
    model = tiny_model("hybrid", task.vocab_size)
    with pytest.raises(ProbeError, match="not numbers"):
        accuracy_at_length(model, task, 8, n_samples=4, factors=True)


def test_cli_reports_the_memory_it_planned_and_what_it_used(two_seeds, capsys):
    """The plan is the largest sub-batch at the costliest length: the longest one here, with never more sequences
    than --samples in a sub-batch (a plan for the shortest length, or for --batch-size sequences, fails this)."""
    from probe.checkpoint import load_checkpoint
    from probe.memory import forward_cost

    assert main([str(two_seeds[0]), "--lengths", "1:12", "--samples", "8", "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["memory"]
    ckpt = load_checkpoint(two_seeds[0])
    assert mem["planned_length"] == 12 and mem["planned_batch"] == 8
    assert mem["planned_bytes"] == 8 * forward_cost(ckpt.model_config, ckpt.task_config.prefix_len + 12).total
    assert mem["measured_bytes"] >= 0 and mem["measured_by"]
    assert main([str(two_seeds[0]), "--lengths", "1:12", "--samples", "8"]) == 0
    assert "memory: planned about" in capsys.readouterr().out


def test_peak_memory_sees_an_allocation_made_inside_it():
    """256 MB written inside the block must show (a measure that never resets, or reads the wrong field, shows ~0)."""
    from probe.memory import PeakMemory

    with PeakMemory("cpu") as peak:
        block = torch.ones(64 * 2**20)  # 64 Mi floats, touched
        del block
    if peak.method.startswith("ru_maxrss"):
        pytest.skip("no resettable peak on this machine: ru_maxrss growth is only a lower bound")
    assert peak.bytes >= 200 * 2**20, (peak.bytes, peak.method)


def test_coupled_answers_are_values_so_windows_score_no_factors_and_chance_is_over_the_values():
    """coupled's state answers are the values bound to s_t: scored 'mod 2' they were all wrong by construction
    (a value token is never a number), and their floor was 1/m instead of 1/n_values."""
    from probe.core.chance import chance
    from probe.windows import position_counts

    task = make_task("coupled", train_length=5, n_values=16)
    assert chance(task, "state") == 1 / 16 and chance(make_task("interleaved"), "state") == 1 / 10
    counts = position_counts(tiny_model("hybrid", task.vocab_size), task, 8, n_samples=4, seed=0)
    assert set(counts.subtask) == {"state", "recall"}
    interleaved = make_task("interleaved", train_length=5)
    counts = position_counts(tiny_model("hybrid", interleaved.vocab_size), interleaved, 8, n_samples=4, seed=0)
    assert {"state_mod2", "state_mod5"} <= set(counts.subtask), "a residue task still scores its factors"
