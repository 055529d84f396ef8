"""Every public analysis checks its arguments first: a wrong one is one ProbeError line that names the function and
what it expected, never an AttributeError from inside (probe.core.inputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from test_wrap import Hybrid

import probe
from probe.attributions.components import component_ablation
from probe.attributions.occlusion import resample_occlusion
from probe.attributions.reads import read_profile, value_weighted_attention
from probe.errors import ProbeError
from probe.evaluate import accuracy_at_length, length_curve
from probe.gradients.analysis import analyze_model, split_with_checks
from probe.gradients.beyond import measure_beyond_range
from probe.gradients.decomposition import decompose, interference
from probe.gradients.lookahead import measure_lookahead
from probe.probes.analysis import probe_model
from probe.probes.fit import collect_activations
from probe.probes.interventions import interchange_intervention
from probe.sharpness.measure import measure_length, measure_queries, sharpness_curve
from probe.shortcuts.knockout import attention_knockout
from probe.shortcuts.positional import positional_tests
from probe.shortcuts.runs import identity_run
from probe.shortcuts.sums import sum_preserving
from probe.shortcuts.window import window_test
from probe.tasks import Batch, make_task
from probe.transitions import measure_fade, measure_phase_windows, measure_transitions

from conftest import tiny_model

TASK = make_task("interleaved", train_length=8)
BATCH = TASK.sample(8, 4, 0)

# every public entry point, called with (model, batch or task) in the order it takes them
ENTRY_POINTS: dict[str, Callable[[Any, Any], Any]] = {
    "probe.gradients.interference": lambda m, b: interference(m, b),
    "probe.gradients.decompose": lambda m, b: decompose(m, b),
    "probe.gradients.analyze_model": lambda m, b: analyze_model(m, TASK),
    "probe.gradients.split_with_checks": lambda m, b: split_with_checks(m, TASK, [8]),
    "probe.gradients.measure_lookahead": lambda m, b: measure_lookahead(m, TASK),
    "probe.gradients.measure_beyond_range": lambda m, b: measure_beyond_range(m, TASK),
    "probe.probes.probe_model": lambda m, b: probe_model(m, TASK),
    "probe.probes.collect_activations": lambda m, b: collect_activations(m, TASK, [8], 4, None, 0),
    "probe.probes.interchange_intervention": lambda m, b: interchange_intervention(m, TASK, [8]),
    "probe.shortcuts.attention_knockout": lambda m, b: attention_knockout(m, TASK),
    "probe.shortcuts.positional_tests": lambda m, b: positional_tests(m, TASK),
    "probe.shortcuts.sum_preserving": lambda m, b: sum_preserving(m, TASK),
    "probe.shortcuts.identity_run": lambda m, b: identity_run(m, TASK),
    "probe.shortcuts.window_test": lambda m, b: window_test(m, TASK),
    "probe.attributions.resample_occlusion": lambda m, b: resample_occlusion(m, b, TASK),
    "probe.attributions.component_ablation": lambda m, b: component_ablation(m, b),
    "probe.attributions.value_weighted_attention": lambda m, b: value_weighted_attention(m, b),
    "probe.attributions.read_profile": lambda m, b: read_profile(m, b, 2),
    "probe.sharpness.sharpness_curve": lambda m, b: sharpness_curve(m, TASK, [8]),
    "probe.sharpness.measure_length": lambda m, b: measure_length(m, TASK, 8, 4),
    "probe.sharpness.measure_queries": lambda m, b: measure_queries(m, TASK, b),
    "probe.evaluate.accuracy_at_length": lambda m, b: accuracy_at_length(m, TASK, 8, 4),
    "probe.evaluate.length_curve": lambda m, b: length_curve(m, TASK, [8], 4),
    "probe.transitions.measure_transitions": lambda m, b: measure_transitions(m, TASK, 8),
    "probe.transitions.measure_fade": lambda m, b: measure_fade(m, TASK),
    "probe.transitions.measure_phase_windows": lambda m, b: measure_phase_windows(m, TASK, None),
}
TAKES_A_BATCH = {name for name in ENTRY_POINTS if name.split(".")[-1] in
                 {"interference", "decompose", "resample_occlusion", "component_ablation", "value_weighted_attention",
                  "read_profile", "measure_queries"}}
TAKES_A_CALLABLE = {name for name in ENTRY_POINTS if name.startswith(("probe.shortcuts.", "probe.evaluate."))}


def one_line_error(call: Callable[[], Any], *words: str) -> ProbeError:
    with pytest.raises(ProbeError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and not isinstance(e.value, AttributeError), msg
    for w in words:
        assert w in msg, msg
    return e.value


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_every_entry_point_refuses_a_tensor_for_its_model(name):
    one_line_error(lambda: ENTRY_POINTS[name](BATCH.tokens, BATCH), f"{name}: expected a model",
                   f"got a Tensor of shape {tuple(BATCH.tokens.shape)}")


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS.keys() - TAKES_A_CALLABLE))
def test_every_entry_point_refuses_a_plain_module(name):
    """A user's nn.Module that was not wrapped: one line that says how to wrap it."""
    plain = Hybrid(TASK.vocab_size).eval()
    one_line_error(lambda: ENTRY_POINTS[name](plain, BATCH), f"{name}: got a plain nn.Module (Hybrid)", "probe.wrap(")


@pytest.mark.parametrize("name", sorted(TAKES_A_BATCH))
def test_a_tensor_where_a_batch_goes(name):
    model = tiny_model("hybrid", TASK.vocab_size)
    one_line_error(lambda: ENTRY_POINTS[name](model, BATCH.tokens), f"{name}: expected a Batch", "task.sample(")


def test_the_issues_example_names_the_batch():
    """``interference(model, tokens)`` ended in ``AttributeError: 'Tensor' object has no attribute 'tokens'``."""
    model = tiny_model("hybrid", TASK.vocab_size)
    one_line_error(lambda: interference(model, BATCH.tokens), "probe.gradients.interference: expected a Batch",
                   f"got a Tensor of shape {tuple(BATCH.tokens.shape)}")
    # and the check lets a real batch through: the same call with the batch gives the table
    assert list(interference(model, BATCH).block) == [0, 1, "all"]


def test_a_mask_the_batch_lacks():
    model = tiny_model("hybrid", TASK.vocab_size)
    one_line_error(lambda: component_ablation(model, BATCH, subtasks=["sate"]),
                   "component_ablation: the batch has no 'sate' mask (it has: recall, state)")
    no_recall = Batch(BATCH.tokens, BATCH.labels, {"state": BATCH.masks["state"]}, BATCH.sums, BATCH.prefix_len,
                      BATCH.length)
    # the gradient split takes any two named parts: one mask alone is not two
    one_line_error(lambda: interference(model, no_recall), "needs two named parts; this batch has masks ['state']")


def test_other_wrong_arguments():
    model = tiny_model("hybrid", TASK.vocab_size)
    one_line_error(lambda: interference("runs/x/final.pt", BATCH), "got a path", "load_checkpoint(path)")
    one_line_error(lambda: probe_model(model, BATCH), "probe.probes.probe_model: expected a task", "got a Batch")
    one_line_error(lambda: analyze_model(model, "interleaved"), "expected a task", "got a str")
    one_line_error(lambda: interference(model, {"tokens": BATCH.tokens}), "expected a Batch", "got a dict")
    bad = Batch(BATCH.tokens[0], BATCH.labels, BATCH.masks, BATCH.sums, BATCH.prefix_len, BATCH.length)
    one_line_error(lambda: interference(model, bad), "tokens must be (batch, pos)",
                   f"tokens ({BATCH.tokens.shape[1]},)")
    wrapped = probe.wrap(Hybrid(TASK.vocab_size).eval(), attention=["attn"], recurrent=["lstm"], task=TASK)
    wrapped.unwrap()
    one_line_error(lambda: interference(wrapped, BATCH), "interference: this wrapper was unwrapped")


def test_what_needs_no_hooks_takes_any_module_from_tokens_to_logits():
    """The evaluation and the shortcut tests only call the model (their controls call hand-built oracles), so the
    check lets a plain nn.Module through: it scores exactly as the same weights wrapped."""
    import copy

    from probe.shortcuts.oracles import tracker

    torch.manual_seed(0)
    plain = Hybrid(TASK.vocab_size).eval()
    wrapped = probe.wrap(copy.deepcopy(plain), attention=["attn"], recurrent=["lstm"], task=TASK)
    assert accuracy_at_length(plain, TASK, 8, n_samples=8) == accuracy_at_length(wrapped, TASK, 8, n_samples=8)
    window = window_test(tracker(TASK), TASK, ks=[2], length=8, n_samples=8, batch_size=8)
    assert window.applicable and not window.windowed  # the exact tracker keeps its answers when the past changes


def test_what_loads_its_own_model_checks_the_checkpoint_or_paths():
    from probe.evaluate import evaluate_checkpoints
    from probe.gradients.analysis import analyze, analyze_checkpoint
    from probe.probes.analysis import run_probes
    from probe.sharpness.report import analyze as sharpness_analyze

    model = tiny_model("hybrid", TASK.vocab_size)
    for name, call in [("probe.gradients.analyze_checkpoint", analyze_checkpoint),
                       ("probe.probes.run_probes", run_probes), ("probe.sharpness.analyze", sharpness_analyze)]:
        one_line_error(lambda call=call: call(model), f"{name}: expected a checkpoint", "*_model function")
        one_line_error(lambda call=call: call("checkpoints/lstm.pt"), "got a path", "load_checkpoint(path)")
    # a lone string would be read one letter at a time, each letter a missing file
    one_line_error(lambda: analyze("checkpoints/lstm.pt"), "probe.gradients.analyze: expected a list",
                   "pass ['checkpoints/lstm.pt']")
    one_line_error(lambda: evaluate_checkpoints(model), "expected a list of checkpoint paths",
                   "got a HookedSequenceModel")
