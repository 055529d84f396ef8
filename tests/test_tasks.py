"""Task generators against slow pure-Python oracles, determinism, and config validation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.errors import ProbeError
from probe.tasks import IGNORE_INDEX, TASKS, make_task

NAMES = sorted(TASKS)


def oracle_labels(task, tokens: list[int]) -> tuple[list[int], list[bool], list[bool]]:
    """Read a sequence token by token, the obvious way, and say what each position must answer."""
    m, ko, vo, sep = task.m, task.key_offset, task.value_offset, task.sep
    labels, state, recall = [], [], []
    if task.name == "modsum":
        total = 0
        for i, tok in enumerate(tokens):
            total = (total + tok) % m
            asked = not task.last_only or i == len(tokens) - 1
            labels.append(total if asked else IGNORE_INDEX)
            state.append(asked)
            recall.append(False)
        return labels, state, recall
    split = tokens.index(sep)
    prefix, stream = tokens[:split], tokens[split + 1 :]
    table = {prefix[i]: prefix[i + 1] for i in range(0, len(prefix), 2)}
    labels = [IGNORE_INDEX] * (split + 1)
    state = [False] * (split + 1)
    recall = [False] * (split + 1)
    total = 0
    for tok in stream:
        if task.name == "coupled":
            total = (total + tok) % m
            labels.append(table[total])
            state.append(True)
            recall.append(True)
        elif ko <= tok < vo:  # a query key
            labels.append(table[tok])
            state.append(False)
            recall.append(True)
        else:
            total = (total + tok) % m
            labels.append(total)
            state.append(True)
            recall.append(False)
    return labels, state, recall


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(NAMES), length=st.integers(1, 40), seed=st.integers(0, 2**31), m=st.integers(2, 12),
       q=st.floats(0, 1), last_only=st.booleans())
def test_generators_match_oracle(name, length, seed, m, q, last_only):
    kw = {"m": m}
    if name == "interleaved":
        kw["query_prob"] = q
    if name == "modsum":
        kw["last_only"] = last_only
    task = make_task(name, **kw)
    batch = task.sample(length, 5, seed)
    assert batch.tokens.shape == (5, task.prefix_len + length) == batch.labels.shape
    assert batch.prefix_len == task.prefix_len and batch.length == length
    for b in range(5):
        labels, state, recall = oracle_labels(task, batch.tokens[b].tolist())
        assert batch.labels[b].tolist() == labels
        assert batch.masks["state"][b].tolist() == state
        assert batch.masks["recall"][b].tolist() == recall
    assert int(batch.tokens.max()) < task.vocab_size and int(batch.tokens.min()) >= 0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n_pairs=st.integers(1, 16), length=st.integers(1, 30))
def test_recall_queries_come_from_distinct_keys(seed, n_pairs, length):
    task = make_task("interleaved", n_pairs=n_pairs, query_prob=0.5)
    batch = task.sample(length, 8, seed)
    for row in batch.tokens.tolist():
        keys = row[: 2 * n_pairs : 2]
        assert len(set(keys)) == n_pairs
        assert all(task.key_offset <= k < task.value_offset for k in keys)
        stream = row[2 * n_pairs + 1 :]
        assert all(tok in keys for tok in stream if task.key_offset <= tok < task.value_offset)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_batch_and_different_seed_different_batch(name):
    task = make_task(name)
    a, b, c = task.sample(30, 16, 7), task.sample(30, 16, 7), task.sample(30, 16, 8)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.tokens, c.tokens)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(task.sample(10, 4, g1).tokens, task.sample(10, 4, g2).tokens)


def test_generation_leaves_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    make_task("interleaved").sample(20, 4, 1)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name,kw,match", [
    ("interleaved", {"n_pairs": 17}, "n_pairs"),
    ("recall", {"n_pairs": 0}, "n_pairs"),
    ("modsum", {"m": 1}, "modulus"),
    ("interleaved", {"query_prob": 1.5}, "query_prob"),
    ("interleaved", {"query_prob": -0.1}, "query_prob"),
    ("nope", {}, "unknown task"),
    ("modsum", {"colour": 3}, "unknown option"),
])
def test_impossible_configs_raise(name, kw, match):
    with pytest.raises(ProbeError, match=match):
        make_task(name, **kw)


@pytest.mark.parametrize("length", [0, -3])
def test_bad_length_raises(length):
    with pytest.raises(ProbeError, match="length"):
        make_task("modsum").sample(length, 2, 0)


def test_round_trip_through_dict():
    from probe.tasks import task_from_dict

    task = make_task("interleaved", m=7, query_prob=0.3)
    assert task_from_dict(task.to_dict()) == task
