"""probe.transitions: the SSM's per-token transitions, which channels count modulo what, and its checks."""

from __future__ import annotations

import json
import math

import pytest
import torch

from probe.checkpoint import checkpoint_from_model, save_checkpoint
from probe.errors import ProbeError
from probe.tasks import make_task
from probe.transitions import (
    _set_known,
    analyze,
    channel_table,
    known_rotation_check,
    main,
    measure_fade,
    measure_phase_windows,
    measure_transitions,
    not_applicable,
    reinit_control,
    reinitialised,
    summarize,
)
from probe.windows import windows_for

from conftest import tiny_model

TASK = make_task("interleaved", train_length=5)


def ssm(kind: str, seed: int = 0):
    # d_model above the vocabulary, so that a row of in_proj can take any value on every token (the hand-set cases)
    return tiny_model("hybrid", TASK.vocab_size, seed=seed, d_model=48, rnn="ssm", ssm_range=kind)


@pytest.mark.parametrize("kind, k, order", [("complex", 1, 10), ("negative", 5, 2), ("positive", 0, 1)])
def test_a_hand_set_transition_comes_back_as_its_group_element(kind, k, order):
    model = ssm(kind)
    _set_known(model, TASK, channel=0)
    ch = channel_table(measure_transitions(model, TASK, 12, n_samples=8), TASK.m, TASK.train_length)
    row = ch[(ch.block == 0) & (ch.channel == 0)].iloc[0]
    assert row.k == k and row.order == order and row.phase_error < 1e-3
    assert row.fade_steps > 16 * TASK.train_length
    assert bool(row.counts_beyond) == (order > 1)
    assert known_rotation_check(ssm(kind), TASK, 12)["passed"]


def test_block0_transitions_are_a_function_of_the_token_and_later_ones_are_not():
    tr = measure_transitions(ssm("complex"), TASK, 15, n_samples=16)
    assert tr[tr.block == 0].phase_spread.max() < 1e-3 and tr[tr.block == 0].modulus_sd.max() < 1e-5
    assert tr[tr.block == 1].phase_spread.max() > 1e-3  # block 1 reads attention's output: context moves it
    assert set(tr.kind) == {"number", "other"} and (tr.n > 0).all()


def test_the_instrument_check_catches_a_phase_read_with_the_wrong_sign(monkeypatch):
    import probe.transitions as tr

    real = tr._circ_mean
    monkeypatch.setattr(tr, "_circ_mean", lambda phase: (lambda m, s: (-m, s))(*real(phase)))
    row = known_rotation_check(ssm("complex"), TASK, 12)
    assert not row["passed"] and row["k"] == 9  # exp(-2 pi i d / 10): the inverse rotation


@pytest.mark.parametrize("shift, passes", [(0, True), (-1, False)])
def test_the_instrument_check_catches_tokens_read_one_position_off(monkeypatch, shift, passes):
    model = ssm("complex")
    real = type(model).run_with_cache

    def shifted(self, tokens, **kw):  # shift -1: the gates of position t labelled with the token at t + 1
        return real(self, torch.roll(tokens, shift, dims=1), **kw)

    # on the class: the check measures a copy of the model, which an instance attribute would not reach
    monkeypatch.setattr(type(model), "run_with_cache", shifted)
    assert known_rotation_check(model, TASK, 12)["passed"] == passes


def test_reinit_control_fails_on_a_model_that_is_its_own_reinitialisation_and_passes_a_counter():
    model = ssm("complex")
    fresh = reinitialised(model, seed=3)
    ch = channel_table(measure_transitions(fresh, TASK, 12, n_samples=8), TASK.m, TASK.train_length)
    row = reinit_control(fresh, TASK, 12, ch, seed=3)
    assert not row["passed"] and row["trained_counting"] == row["reinit_counting"] == 0
    # a broken channel table that calls every channel a counter fails it too: the fresh model "counts" as well
    broken = ch.assign(counts_beyond=True, order=10, horizon=1e9)
    import probe.transitions as tr

    real = tr.channel_table
    try:
        tr.channel_table = lambda t, m, lt: real(t, m, lt).assign(counts_beyond=True)
        assert not tr.reinit_control(fresh, TASK, 12, broken, seed=3)["passed"]
    finally:
        tr.channel_table = real
    _set_known(model, TASK, channel=0)
    ch = channel_table(measure_transitions(model, TASK, 12, n_samples=8), TASK.m, TASK.train_length)
    assert reinit_control(model, TASK, 12, ch, seed=3)["passed"]


def test_shuffled_digits_control_passes_a_counter_and_fails_a_method_that_fits_any_pattern(monkeypatch):
    import probe.transitions as tr

    model = ssm("complex")
    _set_known(model, TASK, channel=0)
    transitions = measure_transitions(model, TASK, 12, n_samples=8)
    ch = channel_table(transitions, TASK.m, TASK.train_length)
    assert tr.shuffled_digits_control(transitions, ch, TASK.m, TASK.train_length)["passed"]
    # a broken channel table that calls every channel a perfect Z_10 counter, whatever its phases (infinite
    # horizons included: inf >= 2 inf must not pass)
    for h in (1e9, float("inf")):
        broken = lambda t, m, lt, h=h: channel_table(t, m, lt).assign(order=m, horizon=h)  # noqa: E731
        monkeypatch.setattr(tr, "channel_table", broken)
        assert not tr.shuffled_digits_control(transitions, broken(transitions, 10, 5), TASK.m,
                                              TASK.train_length)["passed"]


@pytest.mark.parametrize("kw", [dict(rnn="lstm"), dict(rnn="gru")])
def test_cells_without_a_per_token_transition_say_so_in_one_line(kw):
    note = not_applicable(tiny_model("hybrid", TASK.vocab_size, **kw))
    assert note and "\n" not in note and "SSM" in note


def test_cli_json_gives_channel_and_summary_rows_with_every_control(tmp_path, capsys):
    path = save_checkpoint(tmp_path / "ssm.pt", checkpoint_from_model(
        ssm("complex"), TASK, train_config={"seed": 0, "schedule": {"variant": "joint"}}))
    assert main([str(path), "--samples", "8", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert {r["metric"] for r in obj["results"]} == {"channel", "summary"}
    assert {c["control"] for c in obj["controls"]} == {"known_rotation", "reinit", "shuffled_digits"}
    assert {c["kind"] for c in obj["controls"]} == {"instrument", "control"}
    channels = [r for r in obj["results"] if r["metric"] == "channel"]
    assert len(channels) == 2 * 24 and {r["length"] for r in channels} == {TASK.train_length}


def test_cli_takes_the_shared_lengths_grammar_one_measurement_per_length(tmp_path, capsys):
    path = save_checkpoint(tmp_path / "ssm.pt", checkpoint_from_model(ssm("complex"), TASK))
    assert main([str(path), "--lengths", "5,10", "--samples", "8", "--no-controls", "--json", "--no-progress"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    channels = [r for r in rows if r["metric"] == "channel"]
    assert len(channels) == 2 * 2 * 24 and {r["length"] for r in channels} == {5, 10}
    assert {r["length"] for r in rows if r["metric"] == "summary"} == {5, 10}
    assert main([str(path), "--lengths", "4:12:4", "--samples", "8", "--no-controls"]) == 0
    out = capsys.readouterr().out
    assert all(f"length {n}:" in out for n in (4, 8, 12))


@pytest.mark.parametrize("kw", [dict(rnn="lstm"), dict(rnn="gru")])
def test_cli_a_checkpoint_it_does_not_apply_to_is_one_line_and_exit_2_before_any_work(kw, tmp_path, capsys):
    ssm_path = save_checkpoint(tmp_path / "ssm.pt", checkpoint_from_model(ssm("complex"), TASK))
    other = save_checkpoint(tmp_path / "other.pt", checkpoint_from_model(tiny_model("hybrid", TASK.vocab_size, **kw),
                                                                         TASK))
    out = tmp_path / "out"
    assert main([str(ssm_path), str(other), "--json", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert captured.err.count("\n") == 1 and "other.pt" in captured.err and "does not apply" in captured.err


def test_analyze_of_a_hand_set_counter_reports_it_in_the_summary(tmp_path):
    model = ssm("complex")
    _set_known(model, TASK, channel=0)
    path = save_checkpoint(tmp_path / "c.pt", checkpoint_from_model(
        model, TASK, train_config={"seed": 0, "schedule": {"variant": "joint"}}))
    r = analyze(path, n_samples=8)
    row = r.summary[(r.summary.block == 0) & (r.summary.order == 10)].iloc[0]
    assert row.channels >= 1 and row.best_horizon > 16 * TASK.train_length and math.isfinite(row.beyond)
    assert all(c["passed"] for c in r.controls)


def _counts(model) -> dict[int, int]:
    """Block 0's channels counting beyond 4 x L_train, per order, as the summary table reports them."""
    ch = channel_table(measure_transitions(model, TASK, 12, n_samples=8), TASK.m, TASK.train_length)
    summary = summarize(ch, TASK.m, TASK.train_length)
    return {int(r.order): int(r.channels) for r in summary[summary.block == 0].itertuples()}


def test_channels_set_to_each_order_through_the_modules_parameters_are_counted_as_such():
    """Five channels of block 0's complex SSM set (in_proj's rows) to rotations by 2 pi k d / 10 with k = 1, 3, 7
    (order 10), 2 (order 5) and 5 (order 2): the table counts 3, 1 and 1. Two channels of a negative SSM set to
    flip on odd numbers count as order 2, measured from the sign of the transition the scan applies."""
    model = ssm("complex")
    for channel, k in enumerate((1, 3, 7, 2, 5)):
        _set_known(model, TASK, channel=channel, k=k)
    assert _counts(model) == {2: 1, 5: 1, 10: 3}
    negative = ssm("negative")
    for channel in (0, 1):
        _set_known(negative, TASK, channel=channel)
    assert _counts(negative) == {2: 2, 5: 0, 10: 0}


def test_the_count_reads_the_transition_the_module_applies(monkeypatch):
    """The phases come from ``HookedSSM.transition``, the function the scan multiplies by: a module whose transition
    dropped the phase (what a fixed phase of 0 would assume) has no counting channel left, and one whose transition
    conjugated it counts the same channels at the inverse rotation (k = 9 for k = 1)."""
    from probe.models import HookedSSM

    model = ssm("complex")
    _set_known(model, TASK, channel=0)
    real = HookedSSM.transition
    monkeypatch.setattr(HookedSSM, "transition", lambda self, gates: real(self, gates).abs().to(torch.complex64))
    assert _counts(model) == {2: 0, 5: 0, 10: 0}
    monkeypatch.setattr(HookedSSM, "transition", lambda self, gates: real(self, gates).conj())
    ch = channel_table(measure_transitions(model, TASK, 12, n_samples=8), TASK.m, TASK.train_length)
    assert ch[(ch.block == 0) & (ch.channel == 0)].iloc[0].k == 9


# --- the closed ranges and the fade over 400 steps ------------------------------------------------------------------
@pytest.mark.parametrize("kind, k, order", [("complex-closed", 1, 10), ("negative-closed", 5, 2),
                                            ("positive-closed", 0, 1)])
def test_a_closed_ranges_hand_set_transition_comes_back_as_its_group_element_without_fading(kind, k, order):
    """The instrument check's construction on a closed range gives the exact group element (a = -1 on odd numbers
    for negative-closed, modulus exactly 1 everywhere): the same k and order as the open range's, and no fade at all
    over 400 steps (``fade_400`` exactly 1)."""
    model = ssm(kind)
    _set_known(model, TASK, channel=0)
    ch = channel_table(measure_transitions(model, TASK, 12, n_samples=8), TASK.m, TASK.train_length)
    row = ch[(ch.block == 0) & (ch.channel == 0)].iloc[0]
    assert row.k == k and row.order == order and row.phase_error < 1e-3
    assert known_rotation_check(ssm(kind), TASK, 12)["passed"]
    fade = measure_fade(model, TASK, n_samples=4)
    assert fade[(fade.block == 0) & (fade.channel == 0)].fade_400.item() == 1.0


@pytest.mark.parametrize("kind, delta", [("complex", 0.0), ("complex", 0.002), ("negative", 0.0)])
def test_the_phase_error_through_a_window_is_the_offset_summed_over_its_positions_in_half_sectors(kind, delta):
    """The hand-set exact rotation accumulates no phase error in any window; the same rotation with every token's
    phase moved by ``delta`` accumulates delta x (hi - lo) through window (lo, hi], i.e. that over pi / 10 in
    half-sectors of Z_10 (a window read off by a position, a target of the wrong sign or a half-sector of another
    order misses it by far more than the 2 % allowed)."""
    model = ssm(kind)
    _set_known(model, TASK, channel=0, k=1 if kind == "complex" else 5)
    if delta:
        with torch.no_grad():
            model.lstm_layers[0].in_proj.bias[model.lstm_layers[0].k] += delta  # channel 0's phase row
    channels = channel_table(measure_transitions(model, TASK, 12, n_samples=8), TASK.m, TASK.train_length)
    order = {"complex": 10, "negative": 2}[kind]
    assert channels.set_index(["block", "channel"]).loc[(0, 0), "order"] == order
    phase = measure_phase_windows(model, TASK, channels, n_samples=4).set_index(["block", "channel"])
    windows = windows_for(TASK.train_length, 400)
    for w in windows:
        got = phase.loc[(0, 0), f"phase_win_{w.key}"]
        if delta:
            assert abs(got / (delta * (w.hi - w.lo) / (math.pi / order)) - 1) < 0.02
        else:
            assert got < 1e-3
    orders = channels.set_index(["block", "channel"]).order
    assert phase[orders.reindex(phase.index) == 1].isna().all().all()  # no counting: no phase to keep


def _stepped(model, channels_pre: dict[int, torch.Tensor]) -> None:
    """Set block 0's step-size rows so that channel c's pre-activation is ``channels_pre[c]`` on each token (A = 1):
    least squares on the tokens' inputs to block 0's SSM (LayerNorm of the embedding), exact up to rounding."""
    layer = model.lstm_layers[0]
    with torch.no_grad():
        x = model.blocks[0].ln_lstm(model.embed.weight[None])[0]
        design = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=1)
        for c, pre in channels_pre.items():
            sol = torch.linalg.lstsq(design, pre.to(x.dtype)[:, None]).solution[:, 0]
            layer.A_log[c] = 0.0
            layer.in_proj.weight[c], layer.in_proj.bias[c] = sol[:-1], sol[-1]


def test_fade_400_is_the_median_product_of_the_moduli_over_the_400_stream_steps():
    """In float64, three channels of block 0: |a| = 1 on every token (fade exactly 1.0); |a| = 0.99 on every token
    (0.99^400, to 1e-6 relative); |a| = 0.99 on number tokens only (0.99^n, n the numbers among a sequence's 400
    stream tokens, the dictionary prefix not counted: the median over 5 sequences is 0.99 to the median n)."""
    model = ssm("positive").double()
    vocab = TASK.vocab_size
    pre99 = math.log(math.expm1(-math.log(0.99)))  # softplus(pre99) = -ln 0.99
    numbers = torch.arange(vocab) < TASK.m
    _stepped(model, {0: torch.full((vocab,), -60.0), 1: torch.full((vocab,), pre99),
                     2: torch.where(numbers, pre99, -60.0)})
    fade = measure_fade(model, TASK, n_samples=5, seed=0)
    f = fade[fade.block == 0].set_index("channel").fade_400
    assert f[0] == 1.0
    assert abs(f[1] / 0.99**400 - 1) < 1e-6
    n = (TASK.sample(400, 5, 0).tokens[:, TASK.prefix_len:] < TASK.m).sum(1)
    assert n.shape == (5,) and len(set(n.tolist())) > 1  # the sequences differ, so the median is a choice
    assert abs(f[2] / 0.99 ** float(n.median()) - 1) < 1e-6
    assert len(fade) == 2 * 48 and fade.fade_400.between(0, 1).all()
    # each window's product runs over its own stream positions (lo, hi]: 0.99^(hi - lo) on every token, and on
    # numbers only 0.99 to the median count of numbers in those positions (a window read off by one position, or
    # shifted onto the dictionary prefix, misses both by a factor 0.99 or more)
    windows = windows_for(TASK.train_length, 400)
    assert len(windows) >= 4 and windows[0].name == "in range"
    stream = TASK.sample(400, 5, 0).tokens[:, TASK.prefix_len:] < TASK.m
    for w in windows:
        g = fade[fade.block == 0].set_index("channel")[f"fade_win_{w.key}"]
        assert g[0] == 1.0 and abs(g[1] / 0.99 ** (w.hi - w.lo) - 1) < 1e-6
        assert abs(g[2] / 0.99 ** float(stream[:, w.lo:w.hi].sum(1).median()) - 1) < 1e-6


def test_fade_400_of_a_closed_channel_is_1_where_the_open_range_fades_and_analyze_reports_it(tmp_path):
    """At a step-size pre-activation of -7 on every token (float32, A = 1), positive-closed is at |a| = 1 exactly
    (fade 1.0) and positive is at exp(-softplus(-7)) (fade e^-0.36 = 0.69); ``analyze`` carries ``fade_400`` in its
    channel rows, measured over 400 steps whatever the length it analyses."""
    fades = {}
    for kind in ("positive-closed", "positive"):
        model = ssm(kind)
        _stepped(model, {0: torch.full((TASK.vocab_size,), -7.0)})
        path = save_checkpoint(tmp_path / f"{kind}.pt", checkpoint_from_model(model, TASK))
        r = analyze(path, length=8, n_samples=4, controls=False)
        assert "fade_400" in r.channels and all("fade_400" in row for row in r.rows() if row["metric"] == "channel")
        fades[kind] = r.channels[(r.channels.block == 0) & (r.channels.channel == 0)].fade_400.item()
    assert fades["positive-closed"] == 1.0
    assert abs(fades["positive"] - math.exp(-400 * math.log1p(math.exp(-7.0)))) < 1e-3


def test_analyze_runs_the_long_stream_once_and_reads_the_same_columns_as_two_passes(tmp_path, monkeypatch):
    """measure_fade and measure_phase_windows share one forward pass over the 400-token stream in ``analyze``
    (``sample_stream``): the columns equal those of the two functions each running its own pass, and the long
    sequences go through the model once. A stream sampled with other settings is refused, not silently read."""
    from probe.models.hooked import HookedSequenceModel
    from probe.transitions import FADE_STEPS, sample_stream

    model = ssm("complex", seed=3)
    path = save_checkpoint(tmp_path / "c.pt", checkpoint_from_model(model, TASK))
    lengths = []
    original = HookedSequenceModel.run_with_cache

    def counted(self, tokens, *args, **kwargs):
        lengths.append(tokens.shape[1])
        return original(self, tokens, *args, **kwargs)

    monkeypatch.setattr(HookedSequenceModel, "run_with_cache", counted)
    r = analyze(path, n_samples=4, controls=False)
    assert lengths.count(TASK.prefix_len + FADE_STEPS) == 1
    monkeypatch.undo()
    fade = measure_fade(model.eval(), TASK, n_samples=4)
    phase = measure_phase_windows(model, TASK, channel_table(r.transitions, TASK.m, TASK.train_length), n_samples=4)
    separate = fade.merge(phase, on=["block", "channel"])
    shared = r.channels[separate.columns]
    assert shared.shape == separate.shape and (shared.isna() == separate.isna()).all().all()
    assert ((shared.fillna(0) - separate.fillna(0)).abs().to_numpy().max()) < 1e-9
    with pytest.raises(ProbeError, match="seed 1"):
        measure_fade(model, TASK, n_samples=4, seed=0, stream=sample_stream(model, TASK, n_samples=4, seed=1))
    other = make_task("interleaved", train_length=5, n_pairs=TASK.n_pairs - 2)  # a shorter dictionary prefix
    assert other.prefix_len != TASK.prefix_len
    with pytest.raises(ProbeError, match="another task"):
        measure_fade(model, TASK, n_samples=4, stream=sample_stream(model, other, n_samples=4))


def test_plain_output_gives_each_control_its_value_threshold_and_meaning(tmp_path, capsys):
    """Every control line of the plain output (``probe.core.rows.control_line``) carries the row's value, its
    threshold and what a failure means. A hand-set counter passes all three; the same SSM untrained (no counter)
    fails ``reinit`` and ``shuffled_digits``, and the lines say FAIL beside the numbers that failed them."""
    counter = ssm("complex")
    _set_known(counter, TASK, channel=0)
    for name, model, failing in (("counter", counter, set()), ("untrained", ssm("complex"),
                                                                  {"reinit", "shuffled_digits"})):
        path = save_checkpoint(tmp_path / f"{name}.pt", checkpoint_from_model(model, TASK))
        assert main([str(path), "--samples", "8"]) == 0
        out = capsys.readouterr().out
        lines = {c: next(line for line in out.splitlines() if f" {c} " in line)
                 for c in ("known_rotation", "reinit", "shuffled_digits")}
        for control, line in lines.items():
            assert line.lstrip().startswith("FAIL" if control in failing else "ok")
            assert "(passes if " in line and "no threshold recorded" not in line and "a fail means" in line
        assert "value 0 (passes if <= 0)" in lines["reinit"] and "(passes if >= 80)" in lines["known_rotation"]


# --- a bridged checkpoint: the bridged diagnostic (can_count) with its checks ---------------------------------------
BRIDGE_RUN = ["--set", "model.d_model=32", "--steps", "4", "--set", "schedule.switch=2", "--set", "train.warmup=1",
              "--set", "train.batch_size=4", "--set", "train.eval_samples=4", "--set", "train.traj_every=2",
              "--set", "train.traj_dtype=float32", "--set", "task.train_length=6", "--no-progress"]


@pytest.fixture(scope="module")
def bridged_runs(tmp_path_factory):
    """final.pt of bridge-nemotron-h-dat (a Mamba-2, then attention) and of its LSTM twin, trained 4 steps."""
    pytest.importorskip("transformers")
    from probe.training.cli import main as train_main

    root = tmp_path_factory.mktemp("bridged")
    for preset in ("bridge-nemotron-h-dat", "bridge-nemotron-h-lstm-dat"):
        assert train_main(["--preset", preset, *BRIDGE_RUN, "--out", str(root / preset)]) == 0
    return {p: root / p / "final.pt" for p in ("bridge-nemotron-h-dat", "bridge-nemotron-h-lstm-dat")}


def test_cli_runs_the_bridged_diagnostic_with_its_control_lines(bridged_runs, capsys):
    path = bridged_runs["bridge-nemotron-h-dat"]
    assert main([str(path), "--samples", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["layer"]: r for r in out["results"] if r["metric"] == "can_count"}
    assert set(rows) == {"blocks.0.mixer", "all"}
    # a Mamba-2's A = -exp(A_log) and dt > 0 keep every transition in (0, 1), trained or not
    assert rows["all"]["range"] == "positive real in (0, 1]" and rows["all"]["can_count"] is False
    controls = {c["control"]: c for c in out["controls"]}
    assert set(controls) == {"state_reproduction", "negated", "longer_sequences"}
    assert all(c["passed"] and {"value", "threshold", "passes_if", "what"} <= set(c) for c in controls.values())
    assert controls["state_reproduction"]["value"] < 1e-4 and controls["negated"]["value"] == pytest.approx(math.pi)
    assert main([str(path), "--samples", "4"]) == 0
    text = capsys.readouterr().out
    assert "positive real in (0, 1]" in text and "cannot" in text
    assert "ok   instrument state_reproduction hook=blocks.0.mixer length=6: value" in text
    assert "ok   control longer_sequences length=24: value 0 (passes if < 0.628)" in text


def test_the_bridged_checks_catch_a_wrong_transition_a_blind_summary_and_a_change_beyond_the_range(
        bridged_runs, monkeypatch):
    import probe.transitions as transitions
    from probe.bridge import transition_eigenvalues
    from probe.checkpoint import load_checkpoint
    from probe.transitions import bridged_controls, can_count

    ckpt = load_checkpoint(bridged_runs["bridge-nemotron-h-dat"])
    model, task = ckpt.build_model().eval(), ckpt.task_config
    measured = can_count(model, task, n_samples=4)

    def passed(**kw):
        return {c["control"]: c["passed"] for c in bridged_controls(model, task, measured, n_samples=4, **kw)}

    assert all(passed().values())
    # a transition read wrongly (its square root: the right sign, the wrong dt A) no longer carries the scan's state
    sqrt = passed(eigenvalues=lambda m, t: {k: v.sqrt() for k, v in transition_eigenvalues(m, t).items()})
    assert not sqrt["state_reproduction"] and sqrt["negated"]

    # transitions that turn negative beyond the training range: the verdict at L_train no longer holds there
    def flips_beyond(m, t):
        out = transition_eigenvalues(m, t)
        beyond = torch.arange(t.shape[1]) >= task.prefix_len + task.train_length
        return {k: torch.where(beyond[None, :, None], -v, v) for k, v in out.items()}

    assert not passed(eigenvalues=flips_beyond)["longer_sequences"]
    # a summary that reads the moduli only can never say "can": the negated instrument catches it
    real_range = transitions.eigen_range
    monkeypatch.setattr(transitions, "eigen_range", lambda e, m=2: real_range(e.abs(), m))
    assert not passed()["negated"]


def test_cli_a_bridged_lstm_is_refused_in_one_line_before_any_work(bridged_runs, capsys):
    assert main([str(bridged_runs["bridge-nemotron-h-lstm-dat"])]) == 2
    err = capsys.readouterr().err.strip()
    assert "an LSTM is nonlinear" in err and "\n" not in err
