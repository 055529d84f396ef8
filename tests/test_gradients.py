"""probe.gradients: every control fails on the broken method it guards against, and passes on the real one."""

from __future__ import annotations

import ast
import contextlib
import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.figure
import pandas as pd
import pytest
import torch

from probe import gradients as G
from probe.checkpoint import checkpoint_from_model, load_checkpoint, save_checkpoint
from probe.errors import ProbeError
from probe.gradients import controls as C
from probe.gradients import lookahead as LA
from probe.schedules.points import At
from probe.schedules.settings import ScheduleConfig
from probe.training.batches import train_batch_seed
from probe.training.config import TrainConfig
from probe.training.state import schedule_gate
from probe.training.trainer import Trainer, train

from conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]


def no_hooks(model) -> bool:
    return not any(hp.has_hooks() for hp in model.hook_dict.values())


@pytest.fixture
def batch(task):
    return task.sample(8, 24, 0)


# --- broken cuts: what the decomposition controls must catch ----------------------------------------------------
@contextlib.contextmanager
def detach_only_q(model):
    with model.hooks(fwd_hooks=[(lambda n: n.endswith("attn.hook_q"), lambda x, hook: x.detach())]):
        yield


def detach_nothing(model):
    return contextlib.nullcontext()


@contextlib.contextmanager
def detach_too_much(model):
    """Cuts attention and, wrongly, the LSTM outputs as well: a recurrent path is lost."""
    with G.attention_inputs_detached(model), model.hooks(
            fwd_hooks=[(lambda n: n.endswith("hook_lstm_out"), lambda x, hook: x.detach())]):
        yield


BROKEN = {"detach_only_q": detach_only_q, "detach_nothing": detach_nothing}


def test_g_rec_agrees_with_two_independent_routes(hybrid, batch):
    assert C.route_disagreement(hybrid, batch) <= C.ROUTE_TOL
    # the control is not vacuous: attention carries a sizeable part of this gradient
    total = G.interference(hybrid, batch).set_index("block").loc["all"]
    assert total.att_ratio > 0.05
    assert no_hooks(hybrid) and not any(b.attn_stopgrad for b in hybrid.attention_blocks)


@pytest.mark.parametrize("broken", BROKEN)
def test_route_control_fails_when_the_cut_leaves_a_path_open(hybrid, batch, broken):
    assert C.route_disagreement(hybrid, batch, BROKEN[broken]) > 100 * C.ROUTE_TOL


def test_hand_built_two_block_case_is_what_it_claims():
    model, batch, via_attention = C.known_split_case()
    _, cache = model.run_with_cache(batch.tokens)
    markers = [2, 7]  # M1 and M2
    for i in (0, 1):
        assert (cache[f"blocks.{i}.hook_lstm_out"][:, markers] == 0).all()
    pattern = cache["blocks.1.attn.hook_pattern"][:, 0]
    assert (pattern[:, 6, 2] == 1).all() and (pattern[:, 7, 4] == 1).all()  # exact one-hots
    err = C.known_split_error()
    assert err["error"] <= C.KNOWN_SPLIT_TOL
    assert 0.05 < err["share_expected"] < 0.95  # a split that is neither all nor nothing
    assert math.isclose(err["share"], err["share_expected"], rel_tol=1e-4)
    assert all(c["passed"] for c in C.builtin_controls())


@pytest.mark.parametrize("broken", [*BROKEN, "detach_too_much"])
def test_known_split_control_fails_on_a_broken_cut(broken):
    cut = {**BROKEN, "detach_too_much": detach_too_much}[broken]
    assert C.known_split_error(cut)["error"] > 0.1
    assert not C.builtin_controls(cut)[0]["passed"]


def test_loss_split_control_fails_on_a_wrong_split(hybrid, batch):
    dec = G.decompose(hybrid, batch)
    assert (dec.table().loss_split_residual <= C.SPLIT_TOL).all()
    # g (the split's gradients summed) is the gradient the trainer's backward produces
    hybrid.zero_grad()
    hybrid(batch.tokens, labels=batch.labels).backward()
    trained = torch.cat([p.grad.flatten() for ps in G.lstm_parameters(hybrid) for p in ps])
    assert torch.allclose(dec.vectors(None)["g"], trained, rtol=0, atol=1e-6 * float(trained.norm()))

    def per_subtask_mean(logits, b):  # each part normalised by its own count: does not sum to the training loss
        parts = G.split_losses(logits, b)
        asked = b.answer_mask.sum()
        n_state = (b.masks["state"] & b.answer_mask).sum()
        return {"state": parts["state"] * asked / n_state, "recall": parts["recall"] * asked / (asked - n_state)}

    bad = G.decompose(hybrid, batch, split=per_subtask_mean).table()
    row = C.loss_split_control("x", bad)
    assert row["value"] > 1e-2 and not row["passed"]


def test_hooks_and_flags_are_restored_even_on_error(hybrid, batch):
    with pytest.raises(RuntimeError), G.attention_inputs_detached(hybrid):
        assert not no_hooks(hybrid)
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError), G.attention_stream_detached(hybrid):
        assert all(b.attn_stopgrad for b in hybrid.attention_blocks)
        raise RuntimeError("boom")
    assert no_hooks(hybrid) and not any(b.attn_stopgrad for b in hybrid.attention_blocks)


def test_transformer_has_no_answer(task, batch):
    with pytest.raises(ProbeError, match="no recurrent sublayer"):
        G.decompose(tiny_model("transformer", task.vocab_size), batch)


# --- the lookahead ------------------------------------------------------------------------------------------------
SMALL = LA.LookaheadConfig(n_batches=6, batch_size=16, eval_batches=2, train_eval_batches=2)


def test_training_batch_is_the_trainers_batch(task, tmp_path):
    trainer = Trainer(tiny_model("hybrid", task.vocab_size).cfg, task, TrainConfig(steps=5, batch_size=8), tmp_path,
                      progress=False)
    seen = []
    forward = trainer.model.forward
    trainer.model.forward = lambda tokens, *a, **k: seen.append(tokens.clone()) or forward(tokens, *a, **k)
    trainer.train_step(3)
    ours = G.training_batch(task, 8, train_batch_seed(0, 3))
    assert torch.equal(seen[0], ours.tokens)
    lengths = {G.training_batch(task, 2, s).length for s in range(200)}
    assert lengths == set(range(1, task.train_length + 1))  # every training length, and no other


def test_lookahead_first_order_matches_a_real_step(hybrid, task):
    rows = G.measure_lookahead(hybrid, task, cfg=SMALL)
    assert set(rows.part) == {"att", "rec", "full"} and set(rows["loss"]) == {"train", "state"}
    assert set(rows.length.dropna()) == {8, 24}
    assert not rows.preconditioned.any() and (rows.moments == "none").all()
    assert (rows.first_order_error <= C.FIRST_ORDER_TOL).all()
    assert (rows.dL_measured != 0).all()  # the step is resolved, not lost in rounding
    assert C.first_order_control("x", rows)["passed"]
    # a step along the full gradient of the training loss lowers the held-out training loss here
    full = rows[(rows.part == "full") & (rows["loss"] == "train")].iloc[0]
    assert full.dL_measured < 0
    assert no_hooks(hybrid)


@pytest.mark.parametrize("mutation", ["sign", "half"])
def test_first_order_control_fails_when_the_step_is_not_the_predicted_one(hybrid, task, monkeypatch, mutation):
    real = LA.add_step
    factor = {"sign": -1.0, "half": 0.5}[mutation]
    monkeypatch.setattr(LA, "add_step", lambda params, step: real(params, factor * step))
    row = C.first_order_control("x", G.measure_lookahead(hybrid, task, cfg=SMALL))
    assert row["value"] > 0.3 and not row["passed"]


def test_lookahead_preconditions_with_the_moments_it_is_given(hybrid, task):
    theta = torch.cat([p.detach().flatten() for ps in G.lstm_parameters(hybrid) for p in ps])
    v = torch.rand_like(theta) * 1e-4 + 1e-6
    moments = LA.Moments(v, step=100, beta2=0.999, eps=1e-8, source="trajectory")
    pre = G.measure_lookahead(hybrid, task, moments, SMALL)
    raw = G.measure_lookahead(hybrid, task, None, SMALL)
    assert pre.preconditioned.all() and (pre.moments == "trajectory").all()
    assert (pre.first_order_error <= C.FIRST_ORDER_TOL).all()
    # a non-uniform preconditioner changes the direction, so the changes are not a rescaling of the raw ones
    ratio = pre.dL_first / raw.dL_first
    assert ratio.max() - ratio.min() > 0.05 * ratio.abs().max()


@pytest.mark.parametrize("att_3x,att_train,expected", [
    (5.0, -5.0, "supports"), (-5.0, -5.0, "lowers"), (0.5, -5.0, "no effect detected"), (5.0, 0.5, "neither"),
    (0.0, 0.0, "no attention path")])
def test_verdict_rule(att_3x, att_train, expected):
    rows = pd.DataFrame([
        {"part": "att", "loss": "state", "length": 75, "dL_first": att_3x, "z": att_3x},
        {"part": "att", "loss": "train", "length": None, "dL_first": att_train, "z": att_train}])
    assert LA.verdict(rows, 25)["verdict"] == expected


# --- checkpoints, trajectories, CLI ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from probe.models import ModelConfig
    from probe.tasks import make_task

    root = tmp_path_factory.mktemp("runs")
    task = make_task("interleaved", train_length=8)
    model_cfg = ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=16, n_layers=2, n_heads=2)
    out = {}
    for kind, sched, steps in (("joint", ScheduleConfig(), 40),
                               ("dat", ScheduleConfig(variant="dat", switch=At(step=30)), 60)):
        cfg = TrainConfig(steps=steps, batch_size=16, eval_every=steps, eval_samples=8, ckpt_every=steps,
                          traj_every=20, lr=3e-3, warmup=5, schedule=sched)
        train(model_cfg, task, cfg, root / kind, progress=False)
        out[kind] = root / kind
    return out


@pytest.mark.slow  # trains two 40-60-step runs (module fixture)
def test_moments_from_a_snapshot_and_from_last_pt_agree(runs):
    snap = load_checkpoint(runs["dat"] / "trajectory" / "step_000060.pt")
    last = load_checkpoint(runs["dat"] / "last.pt")
    model = last.build_model()
    a, b = G.adam_moments(snap, model), G.adam_moments(last, model)
    assert a.source == "trajectory" and b.source == "optimizer"
    assert a.step == b.step == 60
    # two storage routes (names in the snapshot, integer ids in the optimizer state): a wrong id-to-name map would
    # pair different tensors; bfloat16 storage keeps 3 significant digits
    torch.testing.assert_close(a.v, b.v, rtol=1e-2, atol=0)
    assert G.adam_moments(load_checkpoint(runs["dat"] / "trajectory" / "step_000000.pt"), model) is None
    assert G.adam_moments(load_checkpoint(runs["dat"] / "final.pt"), model) is None


@pytest.mark.slow  # trains two 40-60-step runs (module fixture)
def test_trajectory_gate_follows_the_schedule_and_moments_are_used(runs):
    rep = G.analyze([runs["dat"] / "trajectory", runs["dat"] / "last.pt"], lengths=[8], batch_size=16,
                    lookahead_cfg=SMALL)
    total = rep.interference[rep.interference.block == "all"]
    gates = total.groupby("step").gate.first()
    assert gates.to_dict() == {0: 0.0, 20: 0.0, 40: 1.0, 60: 1.0}
    moments = rep.lookahead.groupby("checkpoint").moments.first()
    assert moments[str(runs["dat"] / "trajectory" / "step_000000.pt")] == "none"
    assert moments[str(runs["dat"] / "trajectory" / "step_000040.pt")] == "trajectory"
    assert moments[str(runs["dat"] / "last.pt")] == "optimizer"
    # the update size: m and v in last.pt, v alone in a snapshot, neither before the first step
    source = rep.lookahead.groupby("checkpoint").update_source.first()
    assert source[str(runs["dat"] / "last.pt")] == "adam m and v"
    assert source[str(runs["dat"] / "trajectory" / "step_000040.pt")] == "adam v, m = mean gradient"
    assert source[str(runs["dat"] / "trajectory" / "step_000000.pt")] == "no moments: lr sqrt(n)"
    verdicts = rep.verdicts.set_index("checkpoint").verdict
    assert verdicts[str(runs["dat"] / "trajectory" / "step_000000.pt")] == "no attention path"
    assert verdicts[str(runs["dat"] / "last.pt")] != "no attention path"
    # instrument checks hold on any checkpoint; the random-baseline control judges the claim and may fail
    instruments = [c for c in rep.controls if c["kind"] == "instrument"]
    assert all(c["passed"] for c in instruments), [c for c in instruments if not c["passed"]]
    assert {c["control"] for c in rep.controls if c["kind"] == "control"} == {"lookahead_vs_random"}
    fig = G.plot_lookahead(rep.lookahead[rep.lookahead.checkpoint.str.contains("trajectory")])
    assert isinstance(fig, matplotlib.figure.Figure)
    fig = G.plot_over_training(pd.concat([rep.interference, G.analyze(
        [runs["joint"] / "trajectory"], lengths=[8], batch_size=16, lookahead_cfg=None).interference]))
    assert {t.get_text() for t in fig.axes[0].get_legend().get_texts()} == {"joint", "delayed"}


@pytest.mark.slow  # trains two 40-60-step runs (module fixture)
def test_schedule_gate_at_the_switch(runs):
    snap = load_checkpoint(runs["dat"] / "trajectory" / "step_000020.pt")
    assert schedule_gate(snap) == [0.0, 0.0]  # one gate per attention block, as the trainer recorded it
    snap.step = 30  # a snapshot at the switch stores step 29's gate (0); the next update uses gate 1
    assert schedule_gate(snap) == [1.0, 1.0]  # the record is of step 20, so the configs decide step 30's


@pytest.mark.slow  # trains two 40-60-step runs (module fixture)
def test_cli_json_and_figures(runs, tmp_path, capsys):
    rc = G.main([str(runs["joint"] / "trajectory"), "--json", "--lengths", "8", "--samples", "16", "--la-batches", "4",
                 "--la-eval-batches", "2", "--full-lookahead", "--out", str(tmp_path / "o")])
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["command"] == "gradients" and len(obj["checkpoints"]) == 3
    assert {r["analysis"] for r in obj["results"]} == {"interference", "lookahead", "lookahead_verdict"}
    assert all("checkpoint" in r for r in obj["results"])
    assert {c["control"] for c in obj["controls"]} == {"loss_split", "g_rec_two_routes", "parts_sum_to_whole",
                                                      "lookahead_first_order",
                                                      "lookahead_positions", "lookahead_vs_random", "known_split"}
    assert all(isinstance(c["passed"], bool) for c in obj["controls"])
    assert all(c["passed"] for c in obj["controls"] if c["kind"] == "instrument")
    la = [r for r in obj["results"] if r["analysis"] == "lookahead"]
    assert {r["positions"] for r in la if r["loss"] == "state"} == {">L", ">2L"}
    assert {r["step_scale"] for r in la} == {0.0, 0.01, 0.1, 0.3, 1.0} and {r["part"] for r in la} >= {"random"}
    assert all("refute" not in r["verdict"] for r in obj["results"] if r["analysis"] == "lookahead_verdict")
    assert {p.name for p in (tmp_path / "o").iterdir()} >= {"blocks.png", "interference_over_training.png",
                                                            "lookahead_over_training.png", "results.json"}


@pytest.mark.slow  # trains two 40-60-step runs (module fixture)
def test_cli_human_table(runs, capsys):
    # the old spellings --length and --batch stay accepted (hidden) for scripts that use them
    assert G.main([str(runs["joint"] / "final.pt"), "--length", "8", "--batch", "8", "--la-batches", "3",
                   "--la-eval-batches", "2"]) == 0
    out = capsys.readouterr().out
    assert "att_ratio" in out and "lookahead" in out and "verdict" in out and "FAIL" not in out


def test_cli_answers_the_lstm_part_explicitly(task, tmp_path, capsys):
    path = tmp_path / "lstm.pt"
    save_checkpoint(path, checkpoint_from_model(tiny_model("lstm", task.vocab_size), task))
    assert G.main([str(path), "--json", "--lengths", "8", "--samples", "8", "--no-lookahead"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out)["results"] if r["analysis"] == "interference"]
    assert rows and all(r["g_att_norm"] == 0 and r["cos_att_rec"] is None for r in rows)
    assert G.main([str(path), "--lengths", "8", "--samples", "8", "--no-lookahead"]) == 0
    assert "no attention sublayer" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing", "garbage", "transformer", "empty_dir", "bad_flag"])
def test_cli_bad_input_exits_2_with_one_line(case, task, tmp_path, capsys):
    extra = []
    if case == "missing":
        arg = tmp_path / "nope.pt"
    elif case == "garbage":
        arg = tmp_path / "garbage.pt"
        arg.write_bytes(b"not a checkpoint at all")
    elif case in ("transformer", "bad_flag"):
        arg = tmp_path / "t.pt"
        family = "transformer" if case == "transformer" else "hybrid"
        save_checkpoint(arg, checkpoint_from_model(tiny_model(family, task.vocab_size), task))
        extra = ["--la-step", "0"] if case == "bad_flag" else []
    else:
        arg = tmp_path / "empty"
        arg.mkdir()
    assert G.main([str(arg), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    if case == "transformer":
        assert "no recurrent sublayer" in err


def test_modules_run_and_imports_point_one_way():
    for pkg in ("probe.gradients", "probe.attributions"):
        done = subprocess.run([sys.executable, "-m", pkg, "--help"], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0 and "--json" in done.stdout
    for path in (ROOT / "probe" / "gradients").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith("probe.attributions") for n in names), path


# --- the beyond-range lookahead ------------------------------------------------------------------------------------
from probe.gradients import beyond as BY  # noqa: E402

BEYOND = LA.LookaheadConfig(n_batches=6, batch_size=16, eval_batches=4, train_eval_batches=4, n_random=3)


def test_beyond_range_rows_use_only_positions_beyond_the_training_range(hybrid, task):
    rows, checks = BY.measure_beyond_range(hybrid, task, cfg=BEYOND)
    assert set(rows.part) == {"att", "rec", "full", "random"}
    assert set(zip(rows["loss"], rows.positions, strict=True)) == {("train", "<=L"), ("state", ">L"),
                                                                    ("state", ">2L")}
    assert set(rows.step_scale) == {0.0, *BEYOND.scales} and set(rows.length.dropna()) == {3 * task.train_length}
    state = rows[rows["loss"] == "state"].groupby("positions").min_position.min()
    assert state[">L"] == task.train_length + 1 and state[">2L"] == 2 * task.train_length + 1
    assert BY.positions_check("x", rows, checks["starts"])["passed"]
    assert BY.first_order_check("x", checks["first_order_error"])["passed"]
    # no moments and no learning rate: the documented fallback, said in every row
    assert (rows.update_source == "no moments or lr: 1e-2 |theta|").all()
    assert rows.rel_update.iloc[0] == pytest.approx(BY.FALLBACK_REL_UPDATE)
    # per unit of step length: the first-order effect of the full direction is minus its gradient's projection,
    # the real steps approach it as the step shrinks
    full = rows[(rows.part == "full") & (rows.positions == ">L")].set_index("step_scale").effect
    assert abs(full[0.01] - full[0.0]) <= abs(full[1.0] - full[0.0]) + 1e-12
    assert (rows[rows.part != "random"].vs_random_se > 0).all()
    assert no_hooks(hybrid)


def test_positions_check_fails_when_in_range_answers_leak_in(hybrid, task, monkeypatch):
    real = BY.beyond_mask
    monkeypatch.setattr(BY, "beyond_mask", lambda batch, start: real(batch, 0))  # every state answer
    rows, checks = BY.measure_beyond_range(hybrid, task, cfg=BEYOND)
    row = BY.positions_check("x", rows, checks["starts"])
    assert row["value"] == 2 and not row["passed"]


@pytest.mark.parametrize("mutation", ["sign", "half"])
def test_beyond_first_order_check_fails_when_the_step_is_not_the_predicted_one(hybrid, task, monkeypatch, mutation):
    real = BY.add_step
    factor = {"sign": -1.0, "half": 0.5}[mutation]
    monkeypatch.setattr(BY, "add_step", lambda params, step: real(params, factor * step))
    _, checks = BY.measure_beyond_range(hybrid, task, cfg=BEYOND)
    row = BY.first_order_check("x", checks["first_order_error"])
    assert row["value"] > 0.3 and not row["passed"]


def test_update_size_follows_the_moments_and_says_its_source():
    d = torch.full((4,), 2.0)
    v = torch.full((4,), 4.0)
    m = torch.full((4,), 0.5)
    with_m = LA.Moments(v, step=1, beta2=0.0, eps=0.0, source="optimizer", m=m, beta1=0.0, lr=0.1)
    assert BY.update_size(with_m, d, 10.0, 4, None) == (pytest.approx(0.1 * 0.25 * 2), "adam m and v")
    without_m = LA.Moments(v, step=1, beta2=0.0, eps=0.0, source="trajectory", lr=0.1)
    assert BY.update_size(without_m, d, 10.0, 4, None) == (pytest.approx(0.1 * 4), "adam v, m = mean gradient")
    assert BY.update_size(None, d, 10.0, 4, 3e-3) == (pytest.approx(6e-3), "no moments: lr sqrt(n)")
    assert BY.update_size(None, d, 10.0, 4, None) == (pytest.approx(0.1), "no moments or lr: 1e-2 |theta|")


class TwoPaths(torch.nn.Module):
    """A hand-built case whose answer is known. theta reaches the training loss along a recurrent path
    (a . theta + |theta|^2 / 2) and an attention path (b . theta, removed by ``cut``), with a perpendicular to b.
    The beyond-range state loss is c . theta + |theta|^2 / 2 with c = -b: a step along -g_att = -b lowers the
    training loss by |b| per unit and raises the beyond-range loss by |b| per unit (plus the curvature every
    direction shares), while a random direction of the same length moves c . theta by about |b| / sqrt(n) only.
    ``attention=False``: the same case with the attention path cut (attention reads a fixed copy of theta, so b .
    theta0 is a constant). ``isotropic``:
    the beyond-range loss is lam |theta|^2 / 2 alone, which every direction raises by the same amount."""

    def __init__(self, attention: bool = True, isotropic: bool = False, n: int = 32, noise: float = 0.05):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        a = torch.randn(n, generator=g, dtype=torch.float64)
        b = torch.randn(n, generator=g, dtype=torch.float64)
        b -= (b @ a) / (a @ a) * a
        self.a, self.b = a / a.norm(), b / b.norm()
        self.theta = torch.nn.Parameter(torch.zeros(n, dtype=torch.float64))
        self.theta0 = torch.zeros(n, dtype=torch.float64)
        self.attention, self.isotropic, self.noise, self.cut = attention, isotropic, noise, False

    def _noise(self, seed: int) -> torch.Tensor:
        return self.noise * torch.randn(self.theta.shape, generator=torch.Generator().manual_seed(seed),
                                        dtype=torch.float64)

    def train_loss(self, k: int) -> torch.Tensor:
        th = self.theta
        through_attention = self.theta0 if not self.attention else th.detach() if self.cut else th
        return ((self.a + self._noise(k)) @ th + (self.b + self._noise(k + 500)) @ through_attention
                + 0.5 * th @ th)

    @contextlib.contextmanager
    def cutting(self):
        self.cut = True
        try:
            yield
        finally:
            self.cut = False

    def groups(self) -> list[BY.TargetGroup]:
        def far(model, j):
            th = model.theta
            if self.isotropic:
                lam = 1.0 + 0.1 * float(torch.randn(1, generator=torch.Generator().manual_seed(j)))
                return torch.stack([0.5 * lam * th @ th, 0.5 * lam * th @ th])
            return torch.stack([(-self.b + self._noise(j + s)) @ th + 0.5 * th @ th for s in (0, 7000)])

        return [BY.TargetGroup([("train", "<=L", None)], list(range(1000, 1008)),
                               lambda model, k: model.train_loss(k).reshape(1), [0], [1]),
                BY.TargetGroup([("state", ">L", 75), ("state", ">2L", 75)], list(range(2000, 2008)), far,
                               [25, 50], [26, 51])]

    def lookahead(self) -> pd.DataFrame:
        theta = [self.theta]
        directions = BY.gradient_parts(theta, [lambda k=k: self.train_loss(k) for k in range(12)], self.cutting,
                                       lambda g: g)
        randoms = BY.random_directions(directions["full"], 4, lambda g: g, seed=3)
        rows, err = BY.measure_steps(self, self, theta, theta, self.groups(), directions, randoms,
                                     (0.01, 0.1, 0.3, 1.0), 0.5, 1e-6)
        assert err <= C.FIRST_ORDER_TOL
        return rows


def test_the_lookahead_says_supports_where_attention_raises_the_beyond_range_loss():
    rows = TwoPaths().lookahead()
    v = BY.verdict_beyond(rows)
    assert v["verdict"] == "supports" and v["baseline"] == "raises the state loss beyond L more than a random step"
    assert v["z_vs_random_beyond_L"] > 2 and v["z_beyond_2L_att"] > 2
    assert v["z_att_vs_rec_beyond_L"] > 2  # and more than the rest of the gradient, per unit of step
    assert BY.random_baseline_control("hand-built", v)["passed"]
    assert LA.verdict(rows, 25)["verdict"] == "supports"  # the public rule reads the beyond-range rows
    # the per-unit effects are the ones the construction gives: +|b| beyond L and -|b| on the training loss
    att = rows[(rows.part == "att") & (rows.step_scale == 0.0)].set_index("positions").effect
    assert att[">L"] == pytest.approx(1.0, abs=0.1) and att["<=L"] == pytest.approx(-1.0, abs=0.1)


def test_with_the_attention_path_cut_the_same_case_says_no_attention_path():
    rows = TwoPaths(attention=False).lookahead()
    v = BY.verdict_beyond(rows)
    assert v["verdict"] == "no attention path" and (rows[rows.part == "att"].effect == 0).all()
    assert BY.random_baseline_control("hand-built", v)["passed"]  # no claim, nothing to refute


def test_random_baseline_control_fails_when_every_direction_raises_the_loss():
    """The loss beyond L rises along every direction alike: attention's step raises it (verdict supports, at a
    real step), but no more than a random step of the same length, and the control says so."""
    rows = TwoPaths(isotropic=True).lookahead()
    v = BY.verdict_beyond(rows)
    assert v["verdict"] == "supports" and v["baseline"] == "no difference from a random step detected beyond L"
    row = BY.random_baseline_control("hand-built", v)
    assert row["kind"] == "control" and not row["passed"]
    first = rows[(rows.part == "att") & (rows.positions == ">L") & (rows.step_scale == 0.0)].iloc[0]
    assert first.effect == 0  # invisible to first order: only the real step shows it


@pytest.mark.parametrize("att_far,att_train,expected", [
    (5.0, -5.0, "supports"), (-5.0, -5.0, "lowers"), (0.5, -5.0, "no effect detected"), (5.0, 0.5, "neither"),
    (1.9, -1.9, "no effect detected")])
def test_beyond_verdict_rule(att_far, att_train, expected):
    rows = pd.DataFrame([
        {"part": "att", "loss": "state", "positions": ">L", "step_scale": 1.0, "effect": att_far, "z": att_far,
         "direction_norm": 1.0, "vs_random_z": 0.0},
        {"part": "att", "loss": "train", "positions": "<=L", "step_scale": 1.0, "effect": att_train,
         "z": att_train, "direction_norm": 1.0, "vs_random_z": 0.0}])
    v = BY.verdict_beyond(rows)
    assert v["verdict"] == expected and "refute" not in v["detail"]


def test_cli_default_lookahead_is_the_quick_one_and_full_lookahead_the_study_s(monkeypatch):
    from probe.gradients import analysis
    from probe.gradients import cli as gcli

    seen = []

    def capture(*args, **kwargs):
        seen.append(args[6])  # the LookaheadConfig the run would use
        raise RuntimeError("captured")

    monkeypatch.setattr(analysis, "analyze", capture)
    for argv in (["x.pt"], ["x.pt", "--full-lookahead"], ["x.pt", "--no-lookahead"], ["x.pt", "--la-batches", "3"]):
        with pytest.raises(RuntimeError, match="captured"):
            gcli.run(gcli.COMMAND.parse(argv))
    quick, full, none, three = seen
    assert quick.scales == (1.0,) and (quick.n_batches, quick.eval_batches, quick.train_eval_batches,
                                       quick.n_random) == (8, 4, 4, 2)
    assert full == G.LookaheadConfig(), "--full-lookahead is the library's lookahead, the one the study reports"
    assert none is None and three.n_batches == 3 and three.scales == (1.0,)


def test_cli_lookahead_shows_its_progress_on_stderr_also_under_json(task, tmp_path, capsys):
    path = save_checkpoint(tmp_path / "h.pt", checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))
    args = [str(path), "--json", "--lengths", "8", "--samples", "4", "--la-batches", "1", "--la-eval-batches", "2"]
    assert G.main(args) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert "lookahead directions" in captured.err
    assert G.main([*args, "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_an_arm_that_one_batch_carries_is_flagged_without_power():
    """z near +-1 for every direction (the shipped joint checkpoint's training-loss arm): one batch carries the mean,
    so even an effect of one sign in every batch could not be detected; the row says so instead of a bare z."""
    import torch

    one_batch = BY._power(torch.tensor([-0.17, 1e-6, -2e-6, 0.0, 1e-6, 0.0, -1e-6, 2e-6], dtype=torch.float64))
    consistent = BY._power(torch.tensor([-0.9, -1.1, -1.0, -0.8, -1.2, -1.0, -0.95, -1.05], dtype=torch.float64))
    assert not one_batch["powered"] and one_batch["z_if_consistent"] < 2
    assert consistent["powered"]
    rows = TwoPaths(isotropic=True).lookahead()
    v = BY.verdict_beyond(rows)
    assert "train_arm_powered" in v and "harmful" not in v["baseline"] + v["detail"]
