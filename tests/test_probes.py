"""Linear probes, their controls and the interventions: on a trained state tracker and on hand-built counters whose
recurrent state is known exactly, each control shown passing and failing."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from probe.checkpoint import checkpoint_from_model, save_checkpoint
from probe.evaluate import accuracy_at_length
from probe.models import HookedSequenceModel, ModelConfig
from probe.probes import (
    collect_activations,
    control_labels,
    control_map,
    default_hooks,
    fit_probe,
    headline,
    interchange_intervention,
    interchange_pair,
    main,
    probe_model,
    random_bases,
    result_rows,
    verdict_rows,
)
from probe.probes.targets import is_affine, resolve_windows, windowed_sum
from probe.schedules.settings import ScheduleConfig
from probe.tasks import make_task
from probe.training.config import TrainConfig
from probe.training.trainer import Trainer

from conftest import tiny_model


# --- a hand-built counter: the recurrent state is exactly what we say it is --------------------------------------
class CounterLSTM(nn.Module):
    """Drop-in for ``HookedLSTM`` in a d = 3m model. Reads x_t from the embedding (dims m..2m-1) and keeps s_t as a
    one-hot in dims 0..m-1 of both h and c -- nothing else, unless asked:

    ``extra="store"``: h and c also hold c_t = sum pi(x_i) mod m (dims 2m..3m-1), which the answers ignore;
    ``extra="use"``: as "store", and the answer it writes is (s_t + [c_t == 0]) mod m, so answers depend on more
    than s_t; ``relocate_after=k``: from position k on, s_t is written in dims 2m..3m-1 instead (the code changes
    beyond the training range, the information does not); ``window=k``: h and c hold the sum of the last k numbers
    w_t instead of s_t, and the answer is w_t (a windowed shortcut: exact while t <= k). ``override_state``
    continues from the s_t (and c_t) that the set cell state holds, as ``HookedLSTM.override_state`` does (not with
    ``window``: that model is only probed)."""

    STATES = ("h", "c")  # a cell's state hooks, in override_state's order, as every recurrent cell lists them

    def __init__(self, m: int, extra: str | None = None, relocate_after: int | None = None,
                 window: int | None = None) -> None:
        super().__init__()
        self.m, self.extra, self.relocate_after, self.window = m, extra, relocate_after, window
        self.pi = torch.as_tensor(control_map(m, 0))
        self.hook_h = HookPoint()
        self.hook_c = HookPoint()
        self._override = None

    @contextlib.contextmanager
    def override_state(self, position, h, c):
        self._override = (position, h, c)
        try:
            yield
        finally:
            self._override = None

    def _onehots(self, values: dict[int, torch.Tensor], b: int) -> torch.Tensor:
        out = torch.zeros(b, 3 * self.m)
        for offset, v in values.items():
            out[torch.arange(b), offset + v] = 1.0
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.m
        tokens = x[..., m:2 * m].argmax(-1)
        b, t_len = tokens.shape
        s, p = torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.long)
        hs, cs = [], []
        for t in range(t_len):
            s, p = (s + tokens[:, t]) % m, (p + self.pi[tokens[:, t]]) % m
            held = tokens[:, max(0, t - self.window + 1):t + 1].sum(1) % m if self.window else s
            slot = 2 * m if self.relocate_after is not None and t >= self.relocate_after else 0
            extra = {2 * m: p} if self.extra else {}
            answer = (held + (p == 0).long()) % m if self.extra == "use" else held
            h, c = self._onehots({slot: answer, **extra}, b), self._onehots({slot: held, **extra}, b)
            if self._override is not None and self._override[0] == t:
                h, c = self._override[1], self._override[2]
                s = c[:, :m].argmax(-1)
                p = c[:, 2 * m:].argmax(-1) if self.extra else p
            hs.append(h)
            cs.append(c)
        self.hook_c(torch.stack(cs, dim=1))
        return self.hook_h(torch.stack(hs, dim=1))


def counter_model(task, **kw) -> HookedSequenceModel:
    """A 1-block model around ``CounterLSTM``: embedding one-hot in dims m..2m-1, MLP off, the unembedding reads
    dims 0..m-1 (after the final LayerNorm the largest of them is the answer)."""
    m = task.m
    model = HookedSequenceModel(ModelConfig(family="lstm", vocab_size=task.vocab_size, d_model=3 * m, n_layers=1,
                                            n_heads=1))
    with torch.no_grad():
        model.embed.weight.zero_()
        model.embed.weight[torch.arange(m), m + torch.arange(m)] = 1.0
        for p in model.blocks[0].mlp.W_out.parameters():
            p.zero_()
        model.unembed.weight.zero_()
        model.unembed.weight[torch.arange(m), torch.arange(m)] = 10.0
        model.unembed.bias.fill_(-100.0)
        model.unembed.bias[:m] = 0.0
    model.blocks[0].lstm = CounterLSTM(m, **kw)
    model.setup()
    return model.eval()


@pytest.fixture(scope="module")
def counter_task():
    return make_task("modsum", m=5, n_keys=1, n_values=1, train_length=8)


def test_hand_built_counter_answers_s_t(counter_task):
    model = counter_model(counter_task)
    assert accuracy_at_length(model, counter_task, 32, 16)["state"]["token_acc"] == 1.0
    batch = counter_task.sample(20, 4, 0)
    _, cache = model.run_with_cache(batch.tokens)
    assert torch.equal(cache["blocks.0.lstm.hook_c"][..., :5].argmax(-1), batch.sums)


# --- a state tracker: the hand-built counter for the method, one trained LSTM to show training still finds it --------
@pytest.fixture
def state_tracker(counter_task):
    """A model whose state is s_t by construction (no training, so no threshold that a torch upgrade can move)."""
    return counter_model(counter_task), counter_task


@pytest.mark.slow  # trains 400 steps
def test_a_trained_lstm_tracks_the_sum_and_the_probe_finds_it(tmp_path):
    """Training still finds a state tracker, and the probe reads s_t from it beyond the training range. Margins,
    not the last percent: an LSTM on s_t mod 3 reaches about 1.0 here; 0.9 leaves room for optimizer drift."""
    task = make_task("modsum", m=3, n_keys=1, n_values=1, train_length=8)
    cfg = ModelConfig(family="lstm", vocab_size=task.vocab_size, d_model=32, n_layers=1, n_heads=1)
    train_cfg = TrainConfig(steps=400, batch_size=32, lr=1e-2, warmup=20, eval_every=400, ckpt_every=400,
                            traj_every=400, schedule=ScheduleConfig())
    trainer = Trainer(cfg, task, train_cfg, tmp_path, progress=False)
    trainer.run()
    model = trainer.model.eval()
    assert accuracy_at_length(model, task, 24, 128)["state"]["token_acc"] > 0.9
    res = probe_model(model, task, hooks=["lstm.hook_h"], lengths=[16, 24], n_train=64, n_train_beyond=32,
                      n_test=32, patching=False)
    r = res.beyond("in")
    assert (r.probe_acc > 0.9).all() and (r.probe_acc > r.majority_acc + 0.3).all()
    ctrl = res.controls.set_index(["control", "train_positions"])
    assert ctrl.loc[("permuted_target", "in"), "passed"]


def no_hooks_left(model) -> bool:
    return all(not hp.fwd_hooks and not hp.bwd_hooks for hp in model.hook_dict.values()) and \
        all(layer._override is None for layer in model.lstm_layers)


def test_probe_finds_the_state_of_a_state_tracker(state_tracker):
    model, task = state_tracker
    res = probe_model(model, task, hooks=["lstm.hook_h"], n_train=64, n_train_beyond=32, n_test=32, patching=False)
    rows = res.by_length
    assert set(rows.train_positions) == {"in", "beyond"}
    assert set(rows.test_positions) == {"in", "beyond", "all"}
    beyond = res.beyond("in")
    assert list(beyond.length) == [16, 24, 32]  # no position beyond L_train in a length-L_train sequence
    for band in ("in", "beyond"):
        r = res.beyond(band)
        assert (r.probe_acc > 0.95).all() and (r.probe_acc > r.majority_acc + 0.5).all()
        # a random LSTM of the same shape does not carry s_t beyond the first positions
        assert (r.probe_acc - r.random_init_acc > 0.4).all()
    assert rows.converged.all()
    ctrl = res.controls.set_index(["control", "train_positions"])
    assert ctrl.loc[("permuted_target", "in"), "passed"] and ctrl.loc[("permuted_target", "beyond"), "passed"]
    assert no_hooks_left(model)


def test_shuffled_labels_are_not_decodable(state_tracker):
    model, task = state_tracker
    hooks = ["blocks.0.lstm.hook_h"]
    train = collect_activations(model, task, [8], 64, hooks, seed=1)
    test = collect_activations(model, task, [16], 32, hooks, seed=2)
    x, xt = train.features[hooks[0]], test.features[hooks[0]]
    # features that cluster by s_t map whole clusters to random classes, so one shuffle's accuracy moves in steps
    # of about 1/m: the mean over shuffles is what sits at chance
    rng = np.random.default_rng(0)
    acc_shuffled = np.mean([(fit_probe(x, rng.permutation(train.labels)).predict(xt) == test.labels).mean()
                            for _ in range(20)])
    acc_real = (fit_probe(x, train.labels).predict(xt) == test.labels).mean()
    assert acc_real > 0.95
    assert acc_shuffled < 1 / task.m + 0.12


def test_shuffled_label_control_fails_when_labels_leak(state_tracker, monkeypatch):
    """Broken on purpose: a 'shuffle' that keeps the labels in place must make the shuffled-label control fail."""
    import probe.probes.controls as controls

    class NoShuffle:
        def permutation(self, x):
            return np.asarray(x)

    model, task = state_tracker
    monkeypatch.setattr(controls, "default_rng", lambda seed: NoShuffle())
    res = probe_model(model, task, hooks=["lstm.hook_h"], lengths=[8], n_train=48, n_train_beyond=16, n_test=24,
                      patching=False)
    row = res.controls[res.controls.control == "shuffled_labels"].iloc[0]
    assert row.acc > 0.9 and not row.passed


def test_controls_and_interventions_of_a_state_tracker(state_tracker):
    model, task = state_tracker
    res = probe_model(model, task, hooks=["lstm.hook_h", "hook_resid_post"], lengths=[8, 24], n_train=48,
                      n_train_beyond=24, n_test=24, n_patch=24)
    shuffled = res.controls[res.controls.control == "shuffled_labels"].iloc[0]
    assert shuffled.passed and shuffled.acc < 1 / task.m + 0.12
    identity = res.controls[res.controls.control == "identity_patch"]
    assert len(identity) == 2 and identity.passed.all() and (identity.changed_frac == 0).all()
    same = res.controls[res.controls.control == "same_sum"]
    assert len(same) == 2 and same.passed.all()
    assert set(res.interventions.kind) == {"full", "same_sum", "subspace"}  # the baselines are off by default
    assert res.window_targets.empty and set(res.controls.control) == {"permuted_target", "shuffled_labels",
                                                                       "identity_patch", "same_sum"}
    assert set(res.verdicts.verdict) == {"decodable, used"}
    # every control carries the number, the bar and what a failure means, for the plain output's line
    assert res.controls[["value", "threshold", "what"]].notna().all().all()
    head = headline(res, factors=(3,))
    assert head["recurrent_acc_in_3x"] > 0.95 and head["recurrent_acc_beyond_3x"] > 0.95
    assert head["recurrent_control_in_3x"] < 0.6 and head["cell"] == "lstm"
    assert head["full_iia_3x"] > 0.95 and head["subspace_iia_3x"] > 0.7 and head["same_sum_changed_frac_3x"] < 0.02
    pos = res.by_position[(res.by_position.hook == "blocks.0.lstm.hook_h") & (res.by_position.length == 24)]
    assert {"probe_acc", "control_acc", "selectivity", "random_init_acc", "majority_acc", "test_positions"} <= \
        set(pos.columns)


def test_state_that_is_decodable_but_cut_off_is_not_used(state_tracker):
    """Negative control for the interventions: the LSTM still computes s_t, but its output never reaches the
    stream."""
    model, task = state_tracker
    model.add_hook("blocks.0.hook_lstm_out", lambda x, hook: torch.zeros_like(x), is_permanent=True)
    try:
        res = probe_model(model, task, hooks=["lstm.hook_h"], lengths=[16], n_train=48, n_train_beyond=24,
                          n_test=24, n_patch=24)
    finally:
        model.reset_hooks(including_permanent=True)
    row = res.verdicts.iloc[0]
    iv = res.interventions.set_index(["kind", "test_positions"])
    assert row.probe_acc > 0.95
    assert iv.loc[("full", "all"), "iia"] < 0.6
    assert abs(iv.loc[("full", "all"), "iia"] - iv.loc[("full", "all"), "unpatched_cf"]) < 0.05
    assert row.verdict == "decodable, not used"


# --- the control target, and its test that it can fail ------------------------------------------------------------
def test_permuted_control_target_is_a_running_sum_not_a_function_of_s_t():
    for m in (3, 4, 5, 10):
        pi = control_map(m, seed=1)
        assert not is_affine(pi, m) and np.array_equal(pi, control_map(m, seed=1))
        if m >= 4:
            assert sorted(pi) == list(range(m))
    x = torch.randint(5, (300, 12), generator=torch.Generator().manual_seed(0))
    state = torch.ones_like(x, dtype=torch.bool)
    lab = control_labels(x, state, 5, seed=0)
    pi = torch.as_tensor(control_map(5, 0))
    assert torch.equal(lab, pi[x].cumsum(1) % 5)
    sums = x.cumsum(1) % 5
    # beyond the first positions it is not a relabelling of s_t: every control value occurs with every sum
    assert all(len(torch.unique(lab[:, 8:][sums[:, 8:] == s])) == 5 for s in range(5))
    # queries are skipped, as s_t skips them
    q = control_labels(torch.tensor([[1, 9, 2]]), torch.tensor([[True, False, True]]), 5)
    assert q[0, 1] == -1 and q[0, 2] == control_labels(torch.tensor([[1, 2]]), torch.ones(1, 2, dtype=torch.bool),
                                                       5)[0, 1]


def test_history_control_is_a_random_function_of_the_history():
    tokens = torch.tensor([[1, 2, 3, 0, 4], [1, 2, 3, 1, 4], [2, 1, 3, 0, 4]])
    lab = control_labels(tokens, torch.ones_like(tokens, dtype=torch.bool), m=5, control="history")
    assert torch.equal(lab[0, :3], lab[1, :3]) and (lab >= 0).all() and (lab < 5).all()


def test_control_target_passes_for_a_counter_and_fails_for_a_model_that_computes_it(counter_task):
    """The control can fail: a model that keeps the permuted sum as readily as s_t gives selectivity ~0."""
    kw = dict(hooks=["lstm.hook_h"], lengths=[16, 24], n_train=64, n_train_beyond=32, n_test=32, patching=False)
    plain = probe_model(counter_model(counter_task), counter_task, **kw)
    both = probe_model(counter_model(counter_task, extra="store"), counter_task, **kw)
    for res, passes in ((plain, True), (both, False)):
        rows = res.controls[res.controls.control == "permuted_target"]
        assert len(rows) == 2 and (rows.passed == passes).all()
        assert (rows.probe_acc > 0.99).all()
    assert (plain.beyond("beyond").control_acc < 1 / counter_task.m + 0.15).all()
    assert (both.beyond("beyond").control_acc > 0.95).all() and (both.beyond("beyond").selectivity < 0.05).all()


# --- windowed-sum control targets: what a shortcut-taking model computes instead of s_t -----------------------------
def slow_windowed_sum(tokens: torch.Tensor, state: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """The obvious oracle: walk each sequence, keep its numbers, sum the last k of them."""
    out = torch.full_like(tokens, -1)
    for b in range(tokens.shape[0]):
        seen: list[int] = []
        for t in range(tokens.shape[1]):
            if state[b, t]:
                seen.append(int(tokens[b, t]))
                out[b, t] = sum(seen[-k:]) % m
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 7, 40])
def test_windowed_sum_is_the_sum_of_the_last_k_numbers(k):
    """Against the loop above, on a task with queries (skipped, as s_t skips them) and a dictionary prefix."""
    task = make_task("interleaved", m=5, train_length=8)
    batch = task.sample(20, 16, 0)
    state = batch.masks["state"]
    want = slow_windowed_sum(batch.tokens, state, task.m, k)
    assert torch.equal(windowed_sum(batch.tokens, state, task.m, k), want)
    assert torch.equal(control_labels(batch.tokens, state, task.m, control=f"window{k}"), want)
    if k >= 20:  # a window longer than the stream is the running sum
        assert torch.equal(want[state], batch.sums[state])


def test_windows_resolve_l_to_the_training_length():
    assert resolve_windows((10, "L", 3, 8), 8) == ["window3", "window8", "window10"]
    from probe.errors import ProbeError

    with pytest.raises(ProbeError, match="positive integer"):
        resolve_windows((0,), 8)


@pytest.fixture(scope="module")
def window_runs(counter_task):
    """An exact counter and two windowed shortcuts (k = 3, and k = L_train: exact in the training range), probed
    with the window targets k = 3 and L_train."""
    kw = dict(hooks=["lstm.hook_h"], lengths=[16, 24], n_train=64, n_train_beyond=32, n_test=32, patching=False,
              windows=(3, "L"))
    L = counter_task.train_length
    return {name: probe_model(counter_model(counter_task, **extra), counter_task, **kw)
            for name, extra in (("counter", {}), ("window3", {"window": 3}), (f"window{L}", {"window": L}))}


def test_window_targets_tell_a_windowed_shortcut_from_a_counter(window_runs, counter_task):
    """Hand-built oracles, no training. A model whose state is the sum of the last k numbers: its window-k probe reads
    it and its s_t probe is at chance beyond the window; the exact counter the reverse -- by a margin, on both
    training bands and at every test length beyond L_train. Fails with the window target computed as s_t (targets
    swapped), with a window one number too long or too short, and with the window probe fit on s_t's labels."""
    chance = 1 / counter_task.m
    L = counter_task.train_length
    counter = window_runs["counter"].window_targets
    counter = counter[counter.test_positions == "beyond"]
    assert set(counter.control_target) == {"window3", f"window{L}"} and len(counter) == 2 * 2 * 2
    assert (counter.probe_acc > 0.95).all() and (counter.control_acc < chance + 0.15).all()
    assert (counter.probe_acc - counter.control_acc > 0.6).all()
    for name in ("window3", f"window{L}"):
        rows = window_runs[name].window_targets
        rows = rows[rows.test_positions == "beyond"]
        own, other = rows[rows.control_target == name], rows[rows.control_target != name]
        assert (own.control_acc > 0.95).all() and (own.probe_acc < chance + 0.15).all()
        assert (own.control_acc - own.probe_acc > 0.6).all()
        # another window is as unrelated to this state as s_t is: each target is its own variable
        assert (other.control_acc < chance + 0.15).all()
        # the s_t probe is the same fit as in by_length: the window rows sit beside it
        main_rows = window_runs[name].by_length
        merged = own.merge(main_rows, on=["hook", "train_positions", "length", "test_positions"])
        assert np.allclose(merged.probe_acc_x, merged.probe_acc_y)


def test_window_target_controls_pass_for_a_counter_and_fail_for_the_shortcut(window_runs, counter_task):
    """The ``window{k}_target`` rows are controls that can fail, and the JSON rows name their target."""
    L = counter_task.train_length
    for name, res in window_runs.items():
        rows = res.controls[res.controls.control.str.startswith("window")].set_index(["control", "train_positions"])
        assert len(rows) == 4 and set(rows.control_target) == {"window3", f"window{L}"}
        # a shortcut model fails every window control: nothing of it decodes s_t beyond L_train (selectivity ~0
        # against another window, and far below 0 against its own)
        assert (rows.passed == (name == "counter")).all(), name
        if name != "counter":
            assert (rows.loc[f"{name}_target"].selectivity < -0.6).all()
    rows, controls = result_rows(window_runs["counter"], 0)
    windowed = [r for r in rows if r.get("control_target", "").startswith("window")]
    assert len(windowed) == len(window_runs["counter"].window_targets)
    assert all(r["analysis"] == "probe" and r["scope"] == "length" for r in windowed)
    assert {r["control_target"] for r in rows if r not in windowed} == {"permuted"}  # the other rows as before
    kinds = {c["control"]: (c["kind"], c["control_target"]) for c in controls if c["control"].startswith("window")}
    assert kinds == {"window3_target": ("control", "window3"), f"window{L}_target": ("control", f"window{L}")}


def test_beyond_trained_probe_tells_a_moved_code_from_missing_information(counter_task):
    """s_t moves to other units after L_train: the in-range probe fails beyond, the beyond-trained one does not."""
    res = probe_model(counter_model(counter_task, relocate_after=counter_task.train_length), counter_task,
                      hooks=["lstm.hook_h"], lengths=[24], n_train=64, n_train_beyond=32, n_test=32,
                      patching=False)
    assert res.beyond("in").probe_acc.iloc[0] < 0.5
    assert res.beyond("beyond").probe_acc.iloc[0] > 0.99
    inside = res.by_length[(res.by_length.train_positions == "in") & (res.by_length.test_positions == "in")]
    assert inside.probe_acc.iloc[0] > 0.99


# --- interventions that isolate s_t --------------------------------------------------------------------------------
def test_same_sum_source_changes_nothing_in_a_model_whose_state_is_s_t(counter_task):
    res, controls = interchange_intervention(counter_model(counter_task), counter_task, [16, 24], n=32)
    same = res[res.kind == "same_sum"]
    assert (same.changed_frac == 0).all() and (same.iia == 1).all()
    assert (res[res.kind == "full"].iia == 1).all()
    assert controls[controls.control == "same_sum"].passed.all()


def test_same_sum_control_fails_when_answers_use_more_than_s_t(counter_task):
    res, controls = interchange_intervention(counter_model(counter_task, extra="use"), counter_task, [16, 24], n=32)
    same = res[(res.kind == "same_sum") & (res.test_positions == "all")]
    assert (same.changed_frac > 0.05).all()
    rows = controls[controls.control == "same_sum"]
    assert len(rows) == 2 and not rows.passed.any()


def test_subspace_interchange_isolates_s_t(counter_task):
    """Only the probe's readout subspace of (h, c) is swapped: enough for the counter, whose state is s_t; the
    verdict needs it together with the same-sum control, which the model that also uses c_t fails."""
    kw = dict(hooks=["lstm.hook_h"], lengths=[16], n_train=64, n_train_beyond=32, n_test=32, n_patch=32)
    plain = probe_model(counter_model(counter_task), counter_task, **kw)
    iv = plain.interventions.set_index(["kind", "test_positions"])
    assert iv.loc[("subspace", "all"), "iia"] > 0.95
    assert plain.verdicts.verdict.iloc[0] == "decodable, used"
    used_more = probe_model(counter_model(counter_task, extra="use"), counter_task, **kw)
    assert used_more.verdicts.verdict.iloc[0].endswith("state used, s_t not isolated")


def test_subspace_interchange_of_an_unread_subspace_moves_nothing(counter_task, monkeypatch):
    """Broken on purpose: with the probe's basis replaced by directions the counter does not use, the subspace
    interchange moves no answer, and the verdict is no longer "used"."""
    import probe.probes.analysis as analysis

    def unread_basis(probe):
        q = np.zeros((3 * counter_task.m, 2))
        q[counter_task.m, 0] = q[counter_task.m + 1, 1] = 1.0  # embedding dims: always 0 in the LSTM state
        return q

    monkeypatch.setattr(analysis, "readout_basis", unread_basis)
    res = probe_model(counter_model(counter_task), counter_task, hooks=["lstm.hook_h"], lengths=[16], n_train=64,
                      n_train_beyond=32, n_test=32, n_patch=32)
    iv = res.interventions.set_index(["kind", "test_positions"])
    assert iv.loc[("subspace", "all"), "iia"] == iv.loc[("subspace", "all"), "unpatched_cf"]
    assert iv.loc[("subspace", "all"), "changed_frac"] == 0
    assert res.verdicts.verdict.iloc[0] == "decodable, state used, s_t not isolated"


def test_random_bases_are_orthonormal_of_the_same_rank_and_fixed_by_the_seed():
    rng = np.random.default_rng(0)
    bases = {"a": np.linalg.qr(rng.standard_normal((15, 4)))[0], "b": np.linalg.qr(rng.standard_normal((9, 2)))[0]}
    draws = random_bases(bases, 3, seed=1)
    assert len(draws) == 3
    for drawn in draws:
        for hook, q in drawn.items():
            assert q.shape == bases[hook].shape and np.allclose(q.T @ q, np.eye(q.shape[1]))
    assert not np.allclose(draws[0]["a"], draws[1]["a"])  # each draw a new subspace
    assert all(np.array_equal(x["a"], y["a"]) for x, y in zip(draws, random_bases(bases, 3, seed=1), strict=True))
    assert random_bases({}, 3) == [{}, {}, {}] and random_bases(bases, 0) == []


@pytest.fixture(scope="module")
def subspace_kw():
    return dict(hooks=["lstm.hook_h"], lengths=[16, 24], n_train=64, n_train_beyond=32, n_test=32, n_patch=32,
                random_subspaces=3)


def test_random_subspace_of_the_same_rank_moves_far_fewer_answers(counter_task, subspace_kw):
    """The baseline of the subspace interchange: on the counter, the probe's subspace moves every later answer to the
    counterfactual, random subspaces of the same rank (three draws) almost none -- a margin that a baseline reusing
    the probe's subspace (next test) cannot meet."""
    res = probe_model(counter_model(counter_task), counter_task, **subspace_kw)
    iv = res.interventions.set_index(["kind", "length", "test_positions"])
    assert set(res.interventions.kind) == {"full", "same_sum", "subspace", "subspace_random"}
    for length in (16, 24):
        probe_run, rand = iv.loc[("subspace", length, "all")], iv.loc[("subspace_random", length, "all")]
        assert rand.n == probe_run.n  # n counts the answers of one draw
        assert probe_run.iia > 0.95 and rand.iia < rand.unpatched_cf + 0.15
        assert probe_run.iia - rand.iia > 0.7 and probe_run.changed_frac - rand.changed_frac > 0.7
    rows = res.controls[res.controls.control == "random_subspace"]
    assert len(rows) == 2 and rows.passed.all() and (rows.draws == 3).all()
    assert (rows.iia_subspace - rows.iia_random > 0.7).all()
    assert res.meta["random_subspace_draws"] == 3
    _, controls = result_rows(res, 0)
    assert {c["kind"] for c in controls if c["control"] == "random_subspace"} == {"control"}
    # the verdicts are those of the run without the baseline
    plain = probe_model(counter_model(counter_task), counter_task, **{**subspace_kw, "random_subspaces": 0})
    assert "subspace_random" not in set(plain.interventions.kind)
    pd.testing.assert_frame_equal(plain.verdicts, res.verdicts)


def test_random_subspace_control_fails_when_the_baseline_reuses_the_probe_subspace(counter_task, subspace_kw,
                                                                                    monkeypatch):
    """Broken on purpose: "random" bases that are the probe's own make the baseline move as many answers as the probe's
    subspace, and the control fails."""
    import probe.probes.interventions as interventions

    monkeypatch.setattr(interventions, "random_bases", lambda bases, draws, seed=0: [dict(bases)] * draws)
    res = probe_model(counter_model(counter_task), counter_task, **subspace_kw)
    iv = res.interventions.set_index(["kind", "length", "test_positions"])
    assert iv.loc[("subspace_random", 16, "all"), "iia"] == iv.loc[("subspace", 16, "all"), "iia"]
    rows = res.controls[res.controls.control == "random_subspace"]
    assert len(rows) == 2 and not rows.passed.any()


@pytest.mark.parametrize("same_sum", [False, True])
def test_interchange_pair_is_a_proper_counterfactual(same_sum):
    task = make_task("interleaved", m=5, train_length=8)
    pair = interchange_pair(task, 12, 6, 32, seed=3, same_sum=same_sum)
    base, src, pos = pair.base, pair.source, pair.position
    assert base.masks["state"][:, pos].all()
    assert torch.equal(base.tokens[:, pos + 1:], src.tokens[:, pos + 1:])
    assert torch.equal(base.tokens[:, : base.prefix_len], src.tokens[:, : base.prefix_len])
    # the counterfactual is what the source itself must answer after t
    assert torch.equal(pair.counterfactual[pair.later], src.labels[pair.later])
    if same_sum:
        assert (src.sums[:, pos] == base.sums[:, pos]).all()
        several = base.masks["state"][:, base.prefix_len:pos + 1].sum(1) > 1
        assert (base.tokens[several] != src.tokens[several]).any(dim=1).all()  # another history, the same sum
    else:
        assert (src.sums[:, pos] != base.sums[:, pos]).all()
        assert (pair.counterfactual[pair.later] != base.labels[pair.later]).all()
    other = interchange_pair(task, 12, 6, 32, seed=3, same_sum=not same_sum)
    assert torch.equal(other.base.tokens, base.tokens)  # both kinds patch into the same bases


def test_verdicts_need_the_subspace_and_the_same_sum_control():
    probes = pd.DataFrame([
        {"hook": f"blocks.{b}.lstm.hook_h", "train_positions": "in", "length": 16, "test_positions": "beyond",
         "probe_acc": acc, "random_init_acc": 0.1, "control_acc": 0.15, "majority_acc": 0.1}
        for b, acc in ((0, 0.95), (1, 0.3))])

    def iv(block, full, same, sub):
        return [{"kind": k, "block": block, "length": 16, "test_positions": "beyond", "iia": v, "changed_frac": v,
                 "unpatched_cf": 0.01} for k, v in (("full", full), ("same_sum", same), ("subspace", sub))]

    rows = pd.DataFrame(iv(0, 0.3, 0.0, 0.3) + iv(1, 0.1, 0.0, 0.0) + iv(-1, 0.9, 0.0, 0.8))
    v = verdict_rows(rows, probes, 8).set_index("block").verdict
    assert v[0] == "decodable, used jointly" and v[1] == "not decodable, used jointly"
    rows = pd.DataFrame(iv(0, 0.3, 0.0, 0.3) + iv(1, 0.02, 0.0, 0.0) + iv(-1, 0.9, 0.0, 0.8))  # block 1: ~floor
    assert verdict_rows(rows, probes, 8).set_index("block").verdict[1] == "not decodable, not used"
    assert v[-1] == "decodable, used"
    rows = pd.DataFrame(iv(0, 0.3, 0.0, 0.3) + iv(-1, 0.9, 0.2, 0.8))  # the history matters too
    assert verdict_rows(rows, probes, 8).set_index("block").verdict[-1] == "decodable, state used, s_t not isolated"
    rows = pd.DataFrame(iv(0, 0.3, 0.0, 0.3) + iv(-1, 0.9, 0.0, 0.1))  # s_t's subspace alone does not move them
    assert verdict_rows(rows, probes, 8).set_index("block").verdict[-1] == "decodable, state used, s_t not isolated"


# --- families, CLI ------------------------------------------------------------------------------------------------
def test_transformer_is_probed_without_interventions(task):
    model = tiny_model("transformer", task.vocab_size, pos_encoding="sinusoidal")
    res = probe_model(model, task, lengths=[8], n_train=24, n_train_beyond=8, n_test=8)
    assert res.interventions.empty and res.verdicts.empty
    assert set(res.hooks) == {f"blocks.{i}.{s}" for i in range(2) for s in ("hook_attn_out", "hook_resid_post")}


def test_joined_hooks_probe_the_concatenation(hybrid, task):
    joined, cell = "blocks.0.lstm.hook_h+blocks.1.lstm.hook_h", "blocks.0.lstm.hook_h+blocks.0.lstm.hook_c"
    assert {joined, cell} <= set(default_hooks(hybrid))
    # the two joined hooks alone (the default's plain hooks are probed by every other probe_model test here)
    res = probe_model(hybrid, task, lengths=[16], hooks=[joined, cell], n_train=24, n_train_beyond=8, n_test=8,
                      n_patch=8)
    assert {joined, cell} <= set(res.by_length.hook)
    assert set(res.by_length[res.by_length.hook == "blocks.0.lstm.hook_h"].train_positions) == {"in", "beyond", "all"}
    acts = collect_activations(hybrid, task, [8], 4, [joined], seed=0)
    assert acts.x(joined).shape[1] == 2 * hybrid.cfg.d_model


@pytest.mark.slow  # about 13 s: two checkpoints end to end, three figures
def test_cli_json_and_figures(tmp_path, capsys):
    task = make_task("modsum", m=3, n_keys=1, n_values=1, train_length=8)
    lstm_path = save_checkpoint(tmp_path / "lstm.pt", checkpoint_from_model(tiny_model("lstm", task.vocab_size),
                                                                            task))
    itask = make_task("interleaved", train_length=8)
    hybrid_path = save_checkpoint(tmp_path / "hybrid.pt", checkpoint_from_model(tiny_model("hybrid", itask.vocab_size),
                                                                                itask))
    out = tmp_path / "out"
    code = main([str(lstm_path), str(hybrid_path), "--json", "--out", str(out), "--lengths", "8,16",
                 "--n-train", "24", "--n-train-beyond", "8", "--samples", "8", "--n-patch", "8", "--windows", "3,10,L"])
    assert code == 0
    captured = capsys.readouterr()
    obj = json.loads(captured.out)
    assert "probes" in captured.err  # the progress bar goes to stderr, also under --json
    assert obj["command"] == "probes" and len(obj["checkpoints"]) == 2
    rows = pd.DataFrame(obj["results"])
    assert set(rows.checkpoint) == {str(lstm_path), str(hybrid_path)}
    probes = rows[rows.analysis == "probe"]
    assert {"train_positions", "test_positions", "control_acc", "control_target"} <= set(probes.columns)
    assert set(probes.train_positions) == {"in", "beyond", "all"} and set(probes.test_positions) == {"in", "beyond",
                                                                                                   "all"}
    hybrid_hooks = set(probes[probes.checkpoint == str(hybrid_path)].hook)
    assert "blocks.1.hook_attn_out" in hybrid_hooks and "blocks.0.lstm.hook_c" in hybrid_hooks
    assert "blocks.0.lstm.hook_h+blocks.1.lstm.hook_h" in hybrid_hooks
    # --windows adds the windowed-sum targets (3, 10, L_train = 8); the random-subspace baseline is on by default
    assert set(probes.control_target) == {"permuted", "window3", "window8", "window10"}
    main_rows = probes[(probes.control_target == "permuted") & (probes.scope == "length")]
    for target in ("window3", "window8", "window10"):
        assert len(probes[probes.control_target == target]) == len(main_rows)
    iv = rows[rows.analysis == "intervention"]
    assert set(iv.kind) == {"full", "same_sum", "subspace", "subspace_random"}
    assert -1 in set(iv[iv.checkpoint == str(hybrid_path)].block)
    assert (rows.analysis == "verdict").any()
    assert all(isinstance(c["passed"], bool) for c in obj["controls"])
    kinds = {c["control"]: c["kind"] for c in obj["controls"]}
    assert kinds == {"permuted_target": "control", "same_sum": "control", "shuffled_labels": "instrument",
                     "identity_patch": "instrument", "window3_target": "control", "window8_target": "control",
                     "window10_target": "control", "random_subspace": "control"}
    assert json.loads((out / "results.json").read_text()) == obj
    for name in ("probes_heatmap", "probes_position", "probes_compare"):
        assert (out / f"{name}.png").stat().st_size > 10_000


@pytest.mark.parametrize("argv, message", [
    (["missing.pt"], "no such file"),
    (["{ckpt}", "--hooks", "hook_nonsense"], "no per-position hook matches"),
    (["{ckpt}", "--hooks", "lstm.hook_h+hook_nonsense"], "no per-position hook matches"),
    (["{ckpt}", "--lengths", "0,5"], "bad --lengths"),
    (["{ckpt}", "--n-train-beyond", "0"], "must be a positive integer"),
    (["{ckpt}", "--lengths", "100000000"], "use lengths up to"),
    (["{ckpt}", "--windows", "0,3"], "positive integers and L"),
    (["{ckpt}", "--windows", "3,K"], "positive integers and L"),
    (["{ckpt}", "--random-subspaces", "-1"], "random-subspaces"),
])
def test_cli_user_errors_exit_2(tmp_path, capsys, argv, message):
    task = make_task("interleaved", train_length=8)
    ckpt = save_checkpoint(tmp_path / "h.pt", checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    assert main([a.format(ckpt=ckpt) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err


def test_cli_defaults_repeated_for_a_fast_help_agree_with_the_modules():
    from probe.probes import cli as pcli
    from probe.probes import targets

    assert pcli.WINDOWS == targets.WINDOWS
    args = pcli.build_parser().parse_args(["x.pt", "--windows", "none", "--random-subspaces", "0"])
    assert args.windows == [] and args.random_subspaces == 0
    assert pcli.build_parser().parse_args(["x.pt", "--windows", "L,5"]).windows == ["L", 5]


def test_permuted_control_on_z2_is_a_user_error():
    from probe.errors import ProbeError

    with pytest.raises(ProbeError, match="m >= 3"):
        control_map(2)


def test_cli_default_run_is_the_small_one_and_full_the_study_s(tmp_path, monkeypatch):
    from probe.probes import analysis
    from probe.probes import cli as pcli

    task = make_task("interleaved", train_length=4)
    ckpt = save_checkpoint(tmp_path / "h.pt", checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    seen = []

    def capture(ckpt, device, **kw):
        seen.append(kw)
        raise RuntimeError("captured")

    monkeypatch.setattr(analysis, "run_probes", capture)
    for argv in ([str(ckpt)], [str(ckpt), "--full"], [str(ckpt), "--full", "--windows", "none", "--n-train", "7"]):
        with pytest.raises(RuntimeError, match="captured"):
            pcli.run(pcli.COMMAND.parse(argv))
    small, full, mixed = ({k: kw[k] for k in ("lengths", "n_train", "n_train_beyond", "n_patch", "windows")}
                          for kw in seen)
    assert small == {"lengths": [4, 12], "n_train": 100, "n_train_beyond": 50, "n_patch": 32, "windows": []}
    assert full == {"lengths": [4, 8, 12, 16], "n_train": 200, "n_train_beyond": 100, "n_patch": 48,
                    "windows": [3, 10, "L"]}
    assert mixed == {**full, "n_train": 7, "windows": []}, "a flag given overrides --full"


def test_cli_lengths_within_l_train_print_a_line_instead_of_the_beyond_table(tmp_path, capsys):
    task = make_task("interleaved", train_length=8)
    ckpt = save_checkpoint(tmp_path / "h.pt", checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    assert main([str(ckpt), "--lengths", "8", "--samples", "4", "--n-train", "12", "--n-train-beyond", "4",
                 "--no-patching", "--no-progress"]) == 0
    assert "no length beyond L_train" in capsys.readouterr().out


def test_summary_table_without_a_length_beyond_l_train_is_empty_not_an_error():
    from probe.probes.analysis import summary_table

    task = make_task("interleaved", train_length=8)
    res = probe_model(tiny_model("hybrid", task.vocab_size), task, lengths=[8], n_train=12, n_train_beyond=4,
                      n_test=4, patching=False)
    table = summary_table(res)
    assert table.empty and list(table.index) == res.hooks
