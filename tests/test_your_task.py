"""A task is an interface: docs/guides/your-task.md runs as written, and each analysis takes a user's batch, masks,
target and sampler (or refuses what is missing in one line)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from probe.core.task import TaskBatch, as_batch, as_sampler
from probe.errors import ProbeError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def guide():
    """Every python block of the guide, in order, in one namespace."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "guides" / "your-task.md").read_text(), re.S)
    assert len(blocks) == 5
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/guides/your-task.md", "exec"), namespace)
    return namespace


def test_the_guide_runs_every_analysis_on_its_own_task(guide):
    history, windows, result = guide["history"], guide["windows"], guide["result"]
    # 100 DAT steps: attention off before the switch, on after; the bracket state is learned above chance in range
    assert list(history.step) == [50, 100] and list(history.gate) == [1.0, 1.0]
    assert history.bracket_acc_1x.iloc[-1] > 0.2 + 0.1
    assert set(windows.subtask) == {"bracket", "copy"}
    assert set(windows.window) == {"in range", "(1x, 2x]", "(2x, 4x]"}
    assert windows.set_index("subtask").chance.to_dict() == {"bracket": 0.2, "copy": pytest.approx(1 / 3)}
    assert {"window3_target", "random_init", "shuffled_labels", "same_target", "identity_patch"} <= \
        set(result.controls.control)
    assert result.controls[result.controls.kind == "instrument"].passed.all()
    assert set(result.interventions.kind) == {"same_target", "other_target"}


def test_the_guide_names_the_module_and_is_linked_from_the_index():
    assert "guides/your-task.md" in (ROOT / "docs" / "index.md").read_text()


def test_a_batch_in_every_form_reads_the_same():
    tokens = torch.tensor([[0, 1, 2]])
    labels = torch.tensor([[3, -1, 4]])
    masks = {"a": torch.tensor([[True, False, True]])}
    forms = [{"tokens": tokens, "labels": labels, "masks": masks}, (tokens, labels, masks),
             TaskBatch(tokens, torch.where(labels == -1, -100, labels), masks)]
    read = [as_batch(f, ignore_index=-1 if not isinstance(f, TaskBatch) else -100) for f in forms]
    for b in read:
        assert b.labels.tolist() == [[3, -100, 4]] and b.masks["a"].tolist() == masks["a"].tolist()
    with pytest.raises(ProbeError, match="has no 'b' mask; it has masks \\['a'\\]"):
        as_batch(forms[0], "here", masks=["b"])
    with pytest.raises(ProbeError, match="a Tensor of shape"):
        as_batch(tokens, "here")
    with pytest.raises(ProbeError, match="draws its own batches"):
        as_sampler(forms[0], "here")


def test_probes_own_task_passes_through_unchanged():
    from probe.tasks import make_task

    task = make_task("interleaved", train_length=4)
    batch = task.sample(4, 2, 0)
    assert as_batch(batch) is batch and as_batch(batch).targets["sums"] is batch.sums
    sampler = as_sampler(task)
    assert sampler.train_length == 4 and torch.equal(sampler.sample(4, 2, 0).tokens, batch.tokens)


def test_the_gradient_split_refuses_what_it_cannot_split(guide):
    from probe.gradients import interference

    model, batch = guide["model"], guide["sample"](6, 4, 0)
    one = {**batch, "masks": {"answer": batch["labels"] != -100}}
    with pytest.raises(ProbeError, match=r"needs two named parts; this batch has masks \['answer'\]"):
        interference(model, one)
    partial = {**batch, "masks": {"bracket": batch["masks"]["bracket"], "none": torch.zeros_like(batch["tokens"],
                                                                                               dtype=torch.bool)}}
    with pytest.raises(ProbeError, match="leave .* labelled positions out"):
        interference(model, partial)


def test_the_parts_are_the_ones_named(guide):
    """Swapping the two masks swaps the parts' columns: the split reads the names it is given, not an order."""
    from probe.gradients import interference

    model, batch = guide["model"], guide["sample"](8, 8, 3)
    ab = interference(model, batch, parts=("bracket", "copy")).iloc[-1]
    ba = interference(model, batch, parts=("copy", "bracket")).iloc[-1]
    assert ab.loss_bracket == ba.loss_bracket and ab.n_copy == ba.n_copy
    assert ab.loss_bracket != ab.loss_copy


def test_the_random_init_control_fails_on_a_target_the_tokens_give_away(guide):
    """The current token is in every hook after the embedding, trained or not: the random-init copy decodes it as
    well as the trained model, and the control must say so."""
    from probe.probes import probe_target

    result = probe_target(guide["model"], guide["sample"], lambda tokens: tokens.clone(), control="bigram",
                          train_length=8, lengths=[16], n_train=64, n_test=16, patching=False)
    row = result.controls.set_index("control").loc["random_init"]
    assert not row.passed and row.random_init_acc > 0.9
