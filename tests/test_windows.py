"""The metric of record: accuracy per window of positions, per subtask and factor, beside its chance floor."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from probe.errors import ProbeError
from probe.evaluate import accuracy_at_length
from probe.tasks import make_task
from probe.windows import position_counts, state_factors, window_table, windows_for, windows_of

L = 5  # the training length the oracles below pretend to have


class Oracle(nn.Module):
    """A hand-built model with a known answer per window: it reads the task's own labels (``relabel``) and answers
    them right at stream positions up to ``right_until``; beyond it, ``beyond`` decides what it says:

    - ``"constant"``: the number 0 at every state question (right 1/m of the time: chance);
    - ``"parity"``: a number with the right parity whose mod-5 part is drawn uniformly (right mod 2 always, mod 5
      at chance): a model that kept one factor of the counter and lost the other.
    Recall is always answered right."""

    def __init__(self, task, right_until: int, beyond: str = "constant"):
        super().__init__()
        self.task, self.right_until, self.beyond = task, right_until, beyond
        self.anchor = nn.Parameter(torch.zeros(()))  # a device for the evaluation to find

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch = self.task.relabel(tokens)
        answer = batch.labels.clamp(min=0).clone()
        p = batch.prefix_len
        late = torch.zeros_like(answer, dtype=torch.bool)
        late[:, p + self.right_until:] = True
        late &= batch.masks["state"]
        if self.beyond == "constant":
            answer[late] = 0
        else:
            g = torch.Generator().manual_seed(int(tokens.sum()))
            random5 = torch.randint(5, answer.shape, generator=g)
            # the number congruent to the answer mod 2 and to a random residue mod 5 (CRT: 5a + 6b mod 10)
            answer[late] = ((5 * (answer % 2) + 6 * random5) % 10)[late]
        return nn.functional.one_hot(answer, self.task.vocab_size).float() + 0 * self.anchor


@pytest.fixture(scope="module")
def task():
    return make_task("interleaved", train_length=L)


def test_windows_are_whole_and_named_by_multiples_of_the_training_length():
    names = [(w.lo, w.hi, w.name) for w in windows_for(25, 400)]
    assert names == [(0, 25, "in range"), (25, 50, "(1x, 2x]"), (50, 100, "(2x, 4x]"), (100, 200, "(4x, 8x]"),
                     (200, 400, "(8x, 16x]")]
    assert [w.name for w in windows_for(25, 399)][-1] == "(4x, 8x]"  # a window is reported only whole
    assert not windows_for(25, 400)[0].beyond and all(w.beyond for w in windows_for(25, 400)[1:])
    assert state_factors(10) == [2, 5] and state_factors(8) == [] and state_factors(12) == [4, 3]
    with pytest.raises(ProbeError, match="positive"):
        windows_for(0, 10)


def test_a_model_right_only_in_range_is_at_chance_in_every_window_beyond_while_its_mean_is_not(task):
    # the control the all-position mean fails: at 4x it averages a quarter of perfect answers in
    model = Oracle(task, right_until=L)
    table = windows_of(model, task, L, 16 * L, n_samples=400, seed=1).set_index(["subtask", "window"])
    assert table.loc[("state", "in range"), "token_acc"] == 1.0
    for window in ("(1x, 2x]", "(2x, 4x]", "(4x, 8x]", "(8x, 16x]"):
        row = table.loc[("state", window)]
        se = math.sqrt(0.1 * 0.9 / row.n_tokens)
        assert abs(row.token_acc - 0.1) < 4 * se and row.chance == 0.1
        assert table.loc[("recall", window), "token_acc"] == 1.0
    mean_at_4x = accuracy_at_length(model, task, 4 * L, n_samples=400, seed=1)["state"]["token_acc"]
    assert mean_at_4x > 0.25  # what "state at 4x" reported: ~0.1 + 0.9 / 4, far from the floor


def test_a_model_that_kept_parity_is_right_mod_2_and_at_chance_mod_5_beyond_range(task):
    model = Oracle(task, right_until=L, beyond="parity")
    table = windows_of(model, task, L, 8 * L, n_samples=400, seed=2).set_index(["subtask", "window"])
    for window in ("(1x, 2x]", "(2x, 4x]", "(4x, 8x]"):
        assert table.loc[("state_mod2", window), "token_acc"] == 1.0
        row = table.loc[("state_mod5", window)]
        assert abs(row.token_acc - 0.2) < 4 * math.sqrt(0.2 * 0.8 / row.n_tokens) and row.chance == 0.2
        assert table.loc[("state", window), "token_acc"] < 0.3  # right mod 10 iff right mod 2 and mod 5


def test_windows_and_the_length_curve_count_the_same_answers_on_the_same_sequences(task):
    # instrument check: two routes over the same draw (the windows' per-position counts and the curve's total)
    model = Oracle(task, right_until=2 * L)
    counts = position_counts(model, task, 4 * L, n_samples=64, seed=3, batch_size=24)
    total = accuracy_at_length(model, task, 4 * L, n_samples=64, batch_size=24, seed=3, factors=True)
    for subtask in ("state", "recall", "state_mod2", "state_mod5"):
        part = counts[counts.subtask == subtask]
        assert int(part.asked.sum()) == total[subtask]["n_tokens"]
        assert part.right.sum() / part.asked.sum() == pytest.approx(total[subtask]["token_acc"], abs=1e-12)
    table = window_table(counts, task, L).set_index(["subtask", "window"])
    assert table.loc[("state", "(1x, 2x]"), "seq_acc"] == 1.0 and table.loc[("state", "(2x, 4x]"), "seq_acc"] < 0.2


def test_a_window_s_key_is_the_suffix_of_its_summary_column_and_a_bad_name_is_refused():
    from probe.windows import window_key

    assert [w.key for w in windows_for(25, 400)] == ["0x_1x", "1x_2x", "2x_4x", "4x_8x", "8x_16x"]
    assert [window_key(w.name) for w in windows_for(25, 800)] == ["0x_1x", "1x_2x", "2x_4x", "4x_8x", "8x_16x",
                                                                    "16x_32x"]
    for bad in ("(4x, 8x)", "(2x, 8x]", "(3x, 4x]", "(8x, 4x]", "(ax, 2x]", "(1x,2x]", "(32x, 64x]"):
        with pytest.raises(ProbeError, match="not a window name"):
            window_key(bad)
