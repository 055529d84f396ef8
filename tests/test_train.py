"""The trainer: schedules and their variants, old checkpoints, precision on any CPU, resume, CLI errors."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from probe import hardware
from probe.checkpoint import load_checkpoint, save_checkpoint
from probe.errors import ProbeError
from probe.models import HookedSequenceModel, ModelConfig
from probe.schedules import legacy
from probe.schedules.points import At
from probe.schedules.settings import VARIANTS, ScheduleConfig, variant_name
from probe.tasks import make_task
from probe.training.batches import train_batch_seed, training_batch
from probe.training.cli import main
from probe.training.config import TrainConfig, lr_at
from probe.training.overrides import build_configs
from probe.training.policies import PLAIN, DetachAttention, SplitCut
from probe.training.presets import DAT_SWITCH
from probe.training.schedule import Schedule
from probe.training.trainer import Trainer, config_diff, resumed_segments, train

ROOT = Path(__file__).parent.parent
TASK = make_task("interleaved", train_length=6)
MODEL = ModelConfig(family="hybrid", vocab_size=TASK.vocab_size, d_model=16, n_layers=1, n_heads=2)
TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "task.train_length=6", "train.batch_size=8",
        "train.eval_every=40", "train.eval_samples=16", "train.traj_every=60"]


def tiny_cfg(**kw) -> TrainConfig:
    base = dict(steps=40, batch_size=8, eval_every=20, eval_samples=16, ckpt_every=10, traj_every=20, lr=3e-3,
                warmup=5)
    return TrainConfig(**{**base, **kw})


def _notes(err: str) -> list[str]:
    """stderr's lines less the trainer's warnings that a run of a few steps cannot fit (its warm-up is most of the
    run, it ends at chance), which every tiny run here gets (tests/test_training.py tests those)."""
    fits = ("warning: the warm-up", "warning: the run ends near chance")
    return [line for line in err.splitlines() if not line.startswith(fits)]


def variant(name: str, **timing) -> ScheduleConfig:
    return ScheduleConfig(**VARIANTS[name], **timing)


# --- schedules: settings, variants, old checkpoints --------------------------------------------------------------
@pytest.mark.parametrize("name,expected", [
    ("joint", [1, 1, 1, 1, 1, 1]),
    ("dat", [0, 0, 0, 1, 1, 1]),
    ("frozen", [1, 1, 1, 1, 1, 1]),
    ("ramp", [0, 0, 0, 0.5, 1, 1]),
])
def test_schedule_gates(name, expected):
    timing = {} if name == "joint" else {"switch": At(fraction=0.5)} | (
        {"ramp_window": At(step=2)} if name == "ramp" else {})
    s = Schedule(variant(name, **timing), total_steps=6)
    assert [s.gate(t) for t in range(6)] == expected
    trains = [s.attention_trains(t) for t in range(6)]
    assert trains == ([True] * 6 if name == "joint" else [False] * 3 + [True] * 3)


def test_a_point_is_a_step_or_a_fraction_never_guessed():
    assert At(step=1).resolve(4500) == 1 and At(fraction=1.0).resolve(4500) == 4500
    assert DAT_SWITCH.resolve(4500) == 2000, "the preset must switch where the shipped checkpoints did"
    assert Schedule(build_configs("hybrid-dat")[2].schedule, 4500).switch_step == 2000
    assert Schedule(build_configs("hybrid-dat", steps=12)[2].schedule, 12).switch_step == 5
    for bad in (dict(), dict(step=1, fraction=0.5), dict(step=-1), dict(fraction=1.5), dict(step=2.5)):
        with pytest.raises(ProbeError):
            At(**bad)
    with pytest.raises(ProbeError, match="must be a step or a fraction of the run"):
        ScheduleConfig(gate="off-until-switch", switch=250)  # a bare number is read only in a record or --set


def _switch(value: str) -> At:
    return build_configs("hybrid-dat", overrides=[f"schedule.switch={value}"])[2].schedule.switch


def test_switch_1_0_is_the_whole_run_and_an_integer_is_a_step():
    """``--set schedule.switch=V``: an integer is a step; a percentage or a number with a decimal point is a fraction of
    the run, so 1.0 is the whole run (not step 1, as the old reading had it); a decimal above 1 is refused, not
    guessed at."""
    assert _switch("250") == At(step=250) and _switch("1") == At(step=1)
    assert _switch("0.8") == At(fraction=0.8) and _switch("50%") == At(fraction=0.5)
    assert _switch("1.0") == At(fraction=1.0) and At(fraction=1.0).resolve(4500) == 4500
    assert _switch("44.4%").resolve(4500) == 1998
    assert build_configs("hybrid-dat", overrides=["schedule.switch_fraction=1"])[2].schedule.switch == At(fraction=1)
    assert build_configs("hybrid-dat", overrides=["schedule.switch_step=1"])[2].schedule.switch == At(step=1)
    for bad, match in (("2.0", r"at most 1.0 \(the whole run\); for a step write an integer \(schedule.switch=2\)"),
                       ("1e3", r"schedule.switch=1000\)"), ("150%", "0% to 100%"), ("-3", "a step is >= 0"),
                       ("soon", "an integer is a step"), ("true", "an integer is a step")):
        with pytest.raises(ProbeError, match=match):
            _switch(bad)
    with pytest.raises(ProbeError, match="after the last step"):  # the whole run: attention would never come on
        Schedule(build_configs("hybrid-dat", overrides=["schedule.switch=1.0"])[2].schedule, 4500)


def test_adaptive_schedule_switches_on_plateau_and_is_capped():
    s = Schedule(variant("adaptive", switch=At(step=100), patience=2, min_switch=At(step=0)), total_steps=200)
    assert s.gate(50) == 0
    for step, acc in [(10, 0.5), (20, 0.8), (30, 0.8), (40, 0.8)]:
        s.observe(step, acc)
    assert s.switched_at == 41 and s.gate(40) == 0 and s.gate(41) == 1
    capped = Schedule(variant("adaptive", switch=At(step=100)), total_steps=200)
    assert capped.gate(99) == 0 and capped.gate(100) == 1


def _record(**schedule) -> ScheduleConfig:
    """A schedule as an old checkpoint recorded it, converted as loading a file of format 1 converts it."""
    return ScheduleConfig.from_dict(legacy.upgrade_schedule(schedule))


def test_bad_schedules_raise():
    with pytest.raises(ProbeError, match="unknown schedule"):
        _record(kind="later")
    with pytest.raises(ProbeError, match="needs a switch"):
        _record(kind="delayed")
    with pytest.raises(ProbeError, match="needs a switch"):
        variant("dat+frozen-rnn")
    with pytest.raises(ProbeError, match="gate 'sometimes'"):
        ScheduleConfig(gate="sometimes")
    with pytest.raises(ProbeError, match="cut_block=1 needs schedule.cut=recurrent"):
        ScheduleConfig(cut="all", cut_block=1)
    with pytest.raises(ProbeError, match="either the old kind"):
        _record(kind="delayed", switch=20, gate="ramp")
    with pytest.raises(ProbeError, match="unknown schedule variant"):
        build_configs("hybrid-joint", overrides=["schedule.variant=later"])
    with pytest.raises(ProbeError, match="no such field"):
        build_configs("hybrid-joint", overrides=["schedule.swich=3"])


def test_every_variant_is_one_entry_named_in_one_place():
    for name, settings in VARIANTS.items():
        timing = {} if name == "joint" else {"switch": At(step=10)}  # joint has nothing to switch
        cfg = ScheduleConfig(**settings, **timing)
        assert cfg.name == variant_name(cfg) == name
        sets = [f"schedule.variant={name}"] + (["schedule.switch_step=10"] if timing else [])
        cfg_set = build_configs("hybrid-joint", overrides=sets)[2]
        assert cfg_set.schedule == cfg == ScheduleConfig(variant=name, **timing)
        from_dat = build_configs("hybrid-dat", overrides=[f"schedule.variant={name}"])[2].schedule
        assert from_dat.name == name and from_dat.switch == (None if name == "joint" else DAT_SWITCH)
    assert _record(kind="delayed", switch=5).name == "dat"  # the old kind's name is an alias
    assert _record(kind="delayed", switch=5) == ScheduleConfig(variant="dat", switch=At(step=5))
    record = variant("stopgrad-rnn1").to_dict()
    assert record["variant"] == "stopgrad-rnn1" and ScheduleConfig.from_dict(record) == variant("stopgrad-rnn1")
    with pytest.raises(ProbeError, match="does not match the settings"):
        ScheduleConfig.from_dict(dict(record, variant="stopgrad-rnn0"))
    assert variant("ramp", switch=At(step=3), freeze_recurrent_after_switch=True).name == "ramp+frozen-rnn"
    assert ScheduleConfig(cut="recurrent", cut_block=3).name == "cut=recurrent,cut_block=3"  # nobody named it yet


# The schedule as the old kind strings defined it, step by step: the oracle old checkpoints must keep.
def _old_behaviour(d: dict, total: int) -> list[tuple]:
    kind, scope = d.get("kind", "joint"), d.get("stopgrad_scope", "all")

    def steps(v):
        return int(round(v * total)) if 0 < v < 1 else int(v)

    t_sw, window = (0 if kind == "joint" else steps(d.get("switch", 0.0))), steps(d.get("ramp_window", 0.0))
    rows = []
    for t in range(total):
        if kind in ("joint", "frozen", "stopgrad"):
            gate = 1.0
        elif kind == "ramp":
            gate = 0.0 if t < t_sw else (1.0 if window == 0 else min(1.0, (t - t_sw + 1) / window))
        else:
            gate = 1.0 if t >= t_sw else 0.0
        cut = kind == "stopgrad" and (t_sw == 0 or t < t_sw)
        rows.append((gate, kind in ("joint", "stopgrad") or t >= t_sw, scope if cut else None,
                     not (d.get("freeze_recurrent_after_switch", False) and t >= t_sw)))
    return rows


def _new_behaviour(cfg: ScheduleConfig, total: int) -> list[tuple]:
    s = Schedule(cfg, total)
    rows = []
    for t in range(total):
        p = s.gradient_policy(t)
        cut = ("all" if isinstance(p, DetachAttention) else
               (p.side if p.block is None else f"recurrent:{p.block}") if isinstance(p, SplitCut) else None)
        rows.append((s.gate(t), s.attention_trains(t), cut, s.recurrent_trains(t)))
    return rows


def _old_dicts():
    for kind in ("joint", "delayed", "ramp", "frozen", "adaptive", "stopgrad"):
        for switch in (0.0, 0.5, 3, 3.0, 1.0, 0.25):
            for window in (0, 2, 0.25):
                scopes = ("all", "recurrent", "nonrecurrent", "recurrent:0") if kind == "stopgrad" else ("all",)
                for scope in scopes:
                    for freeze in (False, True):
                        yield {"kind": kind, "switch": switch, "ramp_window": window, "stopgrad_scope": scope,
                               "freeze_recurrent_after_switch": freeze}


def test_old_schedule_dicts_mean_exactly_what_they_meant():
    """Every old kind x switch (step, fraction, float step, 0) x window x scope x freeze: the settings it is read as
    act at every step as the old kind did (gate, attention training, which gradient is cut, recurrence)."""
    checked = 0
    for d in _old_dicts():
        old_valid = not (d["kind"] != "stopgrad" and d["kind"] != "joint" and d["switch"] == 0) and not (
            d["freeze_recurrent_after_switch"] and (d["kind"] == "joint" or (d["kind"] == "stopgrad"
                                                                             and d["switch"] == 0)))
        if not old_valid:
            continue
        cfg = _record(**d)
        assert _new_behaviour(cfg, 8) == _old_behaviour(d, 8), d
        assert cfg == ScheduleConfig.from_dict(cfg.to_dict()) == ScheduleConfig(**cfg.to_dict())
        checked += 1
    assert checked > 150


def _legacy_label(d: dict, family: str) -> str:
    """Checkpoint.label as the old kind strings spelled it."""
    if family != "hybrid":
        return family
    kind, scope = d.get("kind", "joint"), d.get("stopgrad_scope", "all")
    base, _, block = scope.partition(":")
    suffix = {"all": "", "recurrent": "-rnn", "nonrecurrent": "-nonrnn"}[base] + block
    return ("hybrid-" + ("dat" if kind == "delayed" else kind) + suffix
            + ("+frozen-rnn" if d.get("freeze_recurrent_after_switch") else ""))


_OLD_JOINT = {"kind": "joint", "switch": 0.0, "ramp_window": 0.0, "patience": 3, "min_delta": 0.002, "target": 0.999,
              "min_switch": 0.1}
SHIPPED_OLD = {
    "hybrid-dat.pt": dict(_OLD_JOINT, kind="delayed", switch=2000),
    "hybrid-joint.pt": dict(_OLD_JOINT, freeze_recurrent_after_switch=False, stopgrad_scope="all"),
    "lstm.pt": _OLD_JOINT,
    "transformer.pt": _OLD_JOINT,
    "trajectories/hybrid-dat/step_000000.pt": dict(_OLD_JOINT, kind="delayed", switch=2000),
    "trajectories/hybrid-dat/step_002250.pt": dict(_OLD_JOINT, kind="delayed", switch=2000),
    "trajectories/hybrid-joint/step_004500.pt": dict(_OLD_JOINT, freeze_recurrent_after_switch=False,
                                                     stopgrad_scope="all"),
}
"""The schedule records the shipped files held in format 1 (with the old kind strings), before they were rewritten
once in format 2 (python -m probe.checkpoint upgrade)."""


@pytest.mark.parametrize("path", SHIPPED_OLD)
def test_shipped_checkpoints_load_with_their_old_schedule_unchanged(path):
    """Each shipped file, rewritten in format 2, holds today's spelling of the schedule its old record meant: the
    same gate, training and cut at every step, the same label and kind, the preset's config."""
    raw = torch.load(ROOT / "checkpoints" / path, weights_only=True)
    assert raw["format_version"] == 2 and "kind" not in raw["train_config"]["schedule"]
    ckpt = load_checkpoint(ROOT / "checkpoints" / path)
    old = SHIPPED_OLD[path]
    assert ckpt.schedule_config == _record(**old)
    cfg = TrainConfig.from_dict(ckpt.train_config)
    assert _new_behaviour(cfg.schedule, cfg.steps) == _old_behaviour(old, cfg.steps)
    assert ckpt.label == _legacy_label(old, ckpt.model_config.family)
    assert ckpt.schedule == old["kind"]
    preset = ckpt.label
    model_cfg, task_cfg, train_cfg = build_configs(preset, seed=ckpt.seed)
    train_cfg = dataclasses.replace(train_cfg, threads=cfg.threads)
    assert config_diff(ckpt, model_cfg, task_cfg, train_cfg) is None
    assert cfg == train_cfg


@pytest.mark.parametrize("preset", ["lstm", "transformer", "hybrid-joint", "hybrid-dat"])
def test_shipped_checkpoint_was_trained_with_the_committed_preset(preset):
    """README's reproduction table is only true of the presets if the shipped runs used them (threads aside; the
    shipped joint hybrid is the median seed, the others seed 0)."""
    ckpt = load_checkpoint(ROOT / "checkpoints" / f"{preset}.pt")
    assert isinstance(ckpt.seed, int) and (ckpt.seed == 0 or preset == "hybrid-joint")
    model_cfg, task_cfg, train_cfg = build_configs(preset, seed=ckpt.seed)
    assert ckpt.model_config == model_cfg and ckpt.task_config == task_cfg
    shipped = TrainConfig.from_dict(ckpt.train_config)
    assert dataclasses.replace(shipped, threads=1) == dataclasses.replace(train_cfg, threads=1)
    assert dataclasses.replace(shipped, threads=1, steps=4499) != dataclasses.replace(train_cfg, threads=1)
    assert ckpt.step == train_cfg.steps


COMMITTED_GRIDS = ("coadaptation", "deep", "long", "mechanism", "precision", "recipe", "recurrent", "reproduction",
                   "ssmax", "switch")
"""The grids whose runs were trained and committed before today's spellings: each must still mean what it meant."""


def _grid_toml(name: str) -> Path:
    """A committed grid's file, in the study's folder or where it was before."""
    return next(p for p in (ROOT / "study" / "sweeps" / f"{name}.toml", ROOT / "sweeps" / f"{name}.toml")
                if p.exists())


def test_old_set_spellings_of_committed_sweeps_map_onto_the_settings():
    from probe.results.config import load_config

    names = {}
    for toml in map(_grid_toml, COMMITTED_GRIDS):
        for run in load_config(toml).runs("/tmp/unused"):
            _, _, cfg = build_configs(run.preset, run.task, list(run.overrides), steps=run.steps, seed=run.seed)
            names[run.key.split("/")[0]] = cfg.schedule.name
            assert cfg.precision in ("auto", "fp32"), f"{toml.name}: a grid must train on every CPU"
    assert names["stopgrad-rnn0"] == "stopgrad-rnn0" and names["stopgrad-rnn1"] == "stopgrad-rnn1"
    assert names["stopgrad-nonrnn"] == "stopgrad-nonrnn" and names["stopgrad-rnn"] == "stopgrad-rnn"
    assert names["dat-frozen-rnn"] == "dat+frozen-rnn" and names["frozen"] == "frozen"
    assert names["adaptive"] == "adaptive" and names["switch-250"] == "dat" and names["dat"] == "dat"
    with pytest.raises(ProbeError, match="needs schedule.kind=stopgrad"):
        build_configs("hybrid-dat", overrides=["schedule.stopgrad_scope=recurrent"])
    scoped = build_configs("hybrid-joint", overrides=["schedule.stopgrad_scope=recurrent:1",
                                                       "schedule.kind=stopgrad"])[2].schedule
    assert scoped.name == "stopgrad-rnn1", "the scope applies to the variant the overrides end on, in any order"



def test_coadaptation_grid_runs_each_variant_at_the_mechanism_grids_settings():
    from probe.results.config import load_config

    def grid(name: str) -> dict[str, list]:
        runs: dict[str, list] = {}
        for run in load_config(_grid_toml(name)).runs("/tmp/unused"):
            cfg = build_configs(run.preset, run.task, list(run.overrides), steps=run.steps, seed=run.seed)
            runs.setdefault(run.key.split("/")[0], []).append((run.seed, *cfg))
        return runs

    joint = grid("mechanism")["joint"][0]
    expected = {"frozen-copy": ("frozen-copy", None), "placebo": ("placebo", None),
                "rnn0-until250": ("stopgrad-rnn0", 250), "rnn0-until1000": ("stopgrad-rnn0", 1000),
                "rnn0-att0": ("stopgrad-rnn0-att0", None), "rnn0-att1": ("stopgrad-rnn0-att1", None),
                "rnn1-att1": ("stopgrad-rnn1-att1", None)}
    runs = grid("coadaptation")
    assert set(runs) == set(expected)
    for folder, (name, until) in expected.items():
        seeds = [r[0] for r in runs[folder]]
        assert seeds == list(range(8 if "-att" in folder else 5))
        for _, model_cfg, task_cfg, train_cfg in runs[folder]:
            assert model_cfg == joint[1] and task_cfg == joint[2]
            assert train_cfg.schedule.name == name
            assert train_cfg.schedule.cut_until == (None if until is None else At(step=until))
            same = dataclasses.replace(train_cfg, seed=0, schedule=joint[3].schedule)
            assert same == joint[3], f"{folder}: only the schedule (and seed) differ from the mechanism grid's joint"

# --- the schedule at work in the trainer -------------------------------------------------------------------------
def test_delayed_keeps_attention_untouched_until_the_switch_then_trains_it(tmp_path):
    trainer = Trainer(MODEL, TASK, tiny_cfg(schedule=variant("dat", switch=At(step=20))), tmp_path, progress=False)
    initial = [p.detach().clone() for p in trainer.model.attention_parameters()]
    lstm_initial = trainer.model.blocks[0].lstm.rnn.weight_hh_l0.detach().clone()
    for step in range(20):
        trainer.train_step(step)
    assert trainer.model.attention_gates() == [0.0]
    assert all(torch.equal(a, b) for a, b in zip(initial, trainer.model.attention_parameters(), strict=True))
    assert not torch.equal(lstm_initial, trainer.model.blocks[0].lstm.rnn.weight_hh_l0)
    trainer.train_step(20)
    assert trainer.model.attention_gates() == [1.0]
    assert not all(torch.equal(a, b) for a, b in zip(initial, trainer.model.attention_parameters(), strict=True))


def test_frozen_runs_attention_with_initial_weights(tmp_path):
    trainer = Trainer(MODEL, TASK, tiny_cfg(schedule=variant("frozen", switch=At(step=10))), tmp_path,
                      progress=False)
    initial = [p.detach().clone() for p in trainer.model.attention_parameters()]
    for step in range(10):
        trainer.train_step(step)
    assert trainer.model.attention_gates() == [1.0]
    assert all(torch.equal(a, b) for a, b in zip(initial, trainer.model.attention_parameters(), strict=True))


def test_run_writes_checkpoints_trajectory_and_metrics(tmp_path):
    final = train(MODEL, TASK, tiny_cfg(schedule=variant("dat", switch=At(step=20))), tmp_path, progress=False)
    assert final.step == 40
    assert sorted(p.name for p in (tmp_path / "trajectory").iterdir()) == [
        "step_000000.pt", "step_000020.pt", "step_000040.pt"]
    snap = load_checkpoint(tmp_path / "trajectory" / "step_000020.pt")
    assert snap.state_dict["embed.weight"].dtype == torch.float16 and snap.optimizer_state is None
    assert snap.build_model().embed.weight.dtype == torch.float32
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [20, 40] and "state_acc_3x" in records[0]
    last = load_checkpoint(tmp_path / "last.pt")
    assert last.optimizer_state is not None and last.train_config["schedule"]["switch"] == {"step": 20}
    assert last.extra["precision_used"] == "fp32"
    assert load_checkpoint(tmp_path / "final.pt").label == "hybrid-dat"
    with pytest.raises(ProbeError, match="--resume"):
        train(MODEL, TASK, tiny_cfg(), tmp_path, progress=False)


@pytest.mark.slow
def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path):
    args = ["--preset", "hybrid-dat", "--task", "interleaved", "--steps", "120", "--no-progress",
            *[a for o in TINY + ["train.ckpt_every=10", "schedule.switch=50"] for a in ("--set", o)], "--seed", "1"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    cmd = [sys.executable, "-m", "probe.train", *args, "--out", str(tmp_path / "cut")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        last = tmp_path / "cut" / "last.pt"
        if last.exists() and load_checkpoint(last).step >= 30:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cut_step = load_checkpoint(tmp_path / "cut" / "last.pt").step
    assert 30 <= cut_step < 120, "the run must be killed mid-way for this test to mean anything"
    assert main([*args, "--out", str(tmp_path / "cut"), "--resume"]) == 0
    whole = load_checkpoint(tmp_path / "whole" / "final.pt")
    resumed = load_checkpoint(tmp_path / "cut" / "final.pt")
    for k, v in whole.state_dict.items():
        assert torch.equal(v, resumed.state_dict[k]), k
    assert whole.metrics["state_acc_3x"] == resumed.metrics["state_acc_3x"]
    logged = (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(a)["step"] for a in logged] == [
        json.loads(b)["step"] for b in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    trainer = Trainer(MODEL, TASK, tiny_cfg(), tmp_path, progress=False)
    real = trainer.model.forward

    def poisoned(*a, **k):
        out = real(*a, **k)
        return out * float("nan") if trainer.step >= 25 and trainer.model.training else out

    monkeypatch.setattr(trainer.model, "forward", poisoned)
    with pytest.raises(ProbeError, match="non-finite loss .* step 25"):
        trainer.run()
    assert load_checkpoint(tmp_path / "last.pt").step == 20
    assert not (tmp_path / "final.pt").exists()


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--preset", "lstm2", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown preset") and err.count("\n") == 1
    assert main(["--set", "model.d_model", "--out", str(tmp_path / "y")]) == 2
    assert "bad override" in capsys.readouterr().err
    assert main(["--task", "parity", "--out", str(tmp_path / "z")]) == 2
    assert "unknown task" in capsys.readouterr().err
    taken = tmp_path / "file"
    taken.write_text("mine")
    for out in (taken, taken / "run"):
        assert main(["--steps", "2", "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "a file" in err and err.count("\n") == 1
    assert taken.read_text() == "mine"
    with pytest.raises(ProbeError, match="is a file"):
        train(MODEL, TASK, tiny_cfg(), taken, progress=False)


def test_presets_and_lr_schedule():
    m, t, c = build_configs("hybrid-dat")
    assert m.family == "hybrid" and c.schedule.name == "dat" and c.schedule.switch == DAT_SWITCH
    assert t.name == "interleaved"
    m, t, c = build_configs("lstm", overrides=["model.d_model=64", "task.m=5", "schedule.kind=joint"])
    assert m.d_model == 64 and t.m == 5 and m.vocab_size == t.vocab_size
    cfg = TrainConfig(steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(cfg, 0) == pytest.approx(0.1) and lr_at(cfg, 10) == pytest.approx(1.0)
    assert lr_at(cfg, 100) == pytest.approx(0.1)


def test_four_block_presets_are_the_two_block_ones_with_four_blocks_in_the_paper_s_order():
    from probe.models import HookedSequenceModel

    for schedule in ("joint", "dat"):
        m4, t4, c4 = build_configs(f"hybrid-4block-{schedule}")
        m2, t2, c2 = build_configs(f"hybrid-{schedule}")
        assert m4.n_layers == 4 and m4 == replace(m2, n_layers=4) and c4 == c2 and t4 == t2
    model = HookedSequenceModel(replace(build_configs("hybrid-4block-joint")[0], d_model=16, n_heads=2))
    _, cache = model.run_with_cache(torch.zeros(1, 5, dtype=torch.long))
    ran = [k for k in cache.keys() if k.startswith("blocks.3.")]  # the cache keeps the order the hooks fired in
    wanted = ["ln_lstm.hook_normalized", "hook_lstm_out", "ln_attn.hook_normalized", "hook_attn_out",
              "ln_mlp.hook_normalized", "hook_mlp_out"]
    assert len(model.blocks) == 4
    assert sorted(wanted, key=lambda w: ran.index(f"blocks.3.{w}")) == wanted


def test_a_short_run_of_the_default_preset_scales_its_switch(tmp_path, capsys):
    """``python -m probe.train --steps 12``: hybrid-dat's switch is 4/9 of the run, so it comes at step 5."""
    out = tmp_path / "short"
    assert main(["--steps", "12", *[a for o in TINY for a in ("--set", o)], "--out", str(out), "--no-progress"]) == 0
    final = load_checkpoint(out / "final.pt")
    assert final.label == "hybrid-dat" and final.step == 12
    snap = load_checkpoint(out / "trajectory" / "step_000000.pt")
    assert Schedule(TrainConfig.from_dict(snap.train_config).schedule, 12).switch_step == 5


# --- the mechanism study's variants: each tested for exactly the property it claims ---------------------------
def _one_step_grads(trainer: Trainer, step: int) -> dict[str, torch.Tensor]:
    """Gradients of one training step (no optimizer update), as the trainer computes them at ``step``."""
    trainer.optimizer.step = lambda *a, **k: None  # keep the weights: we only read the gradients
    trainer.train_step(step)
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def _batch(cfg: TrainConfig, step: int):
    return training_batch(TASK, cfg.batch_size, train_batch_seed(cfg.seed, step))


def test_stopgrad_lstm_gradient_is_the_recurrent_path_and_attention_still_learns(tmp_path):
    """``stopgrad``: the LSTM's gradient equals g_rec of the gradient decomposition (attention's inputs detached),
    which differs from the full gradient, and attention's own weights still get gradient."""
    from probe.gradients import attention_inputs_detached, lstm_parameters

    cfg = tiny_cfg(schedule=variant("stopgrad"), grad_clip=1e9)
    trainer = Trainer(MODEL, TASK, cfg, tmp_path, progress=False)
    grads = _one_step_grads(trainer, 3)
    model = trainer.model
    assert not any(b.attn_stopgrad for b in model.attention_blocks), "the cut lasts for the step only"
    batch = _batch(cfg, 3)
    lstm = lstm_parameters(model)[0]
    names = {id(p): n for n, p in model.named_parameters()}

    def grad_of(detached: bool) -> list[torch.Tensor]:
        with attention_inputs_detached(model) if detached else contextlib.nullcontext():
            loss = model(batch.tokens, labels=batch.labels)
        return list(torch.autograd.grad(loss, lstm))

    g_rec, g_full = grad_of(True), grad_of(False)
    for p, rec, full in zip(lstm, g_rec, g_full, strict=True):
        torch.testing.assert_close(grads[names[id(p)]], rec, rtol=1e-4, atol=1e-7)
        assert (full - rec).norm() > 1e-3 * full.norm(), "attention must carry gradient to the LSTM when not stopped"
    attn = [names[id(p)] for p in model.attention_parameters() if p.dim() == 2]
    assert attn and all(grads[n].norm() > 0 for n in attn)


@pytest.mark.parametrize("sched", [
    variant("stopgrad-rnn"), variant("stopgrad-nonrnn"), variant("stopgrad-rnn0"), variant("stopgrad-rnn1"),
    _record(kind="stopgrad", stopgrad_scope="recurrent:0"),  # an old checkpoint's spelling
], ids=["rnn", "nonrnn", "rnn0", "rnn1", "old-recurrent:0"])
def test_split_stopgrad_cuts_attention_for_exactly_its_side(tmp_path, sched):
    """``stopgrad-rnn``: the LSTMs (and their pre-LN) get g_rec, every other parameter below attention the full
    gradient; ``stopgrad-nonrnn``: the other way round; ``stopgrad-rnnN``: block N's LSTM alone gets g_rec. Each
    side differs from what the other side gets, so swapped sides fail; attention still learns."""
    from probe.gradients import attention_inputs_detached

    cfg = tiny_cfg(schedule=sched, grad_clip=1e9)
    two_blocks = dataclasses.replace(MODEL, n_layers=2)  # block 0's MLP lies below block 1's attention
    trainer = Trainer(two_blocks, TASK, cfg, tmp_path, progress=False)
    grads = _one_step_grads(trainer, 3)
    model = trainer.model
    assert not any(b.attn_stopgrad for b in model.attention_blocks), "the forward of the full-gradient pass is plain"
    batch = _batch(cfg, 3)
    names = [n for n, _ in model.named_parameters()]

    def grad_of(detached: bool) -> dict[str, torch.Tensor]:
        with attention_inputs_detached(model) if detached else contextlib.nullcontext():
            loss = model(batch.tokens, labels=batch.labels)
        got = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        return {n: gr for n, gr in zip(names, got, strict=True) if gr is not None}

    cut, full = grad_of(True), grad_of(False)
    rnn = {id(p) for p in model.recurrent_parameters()}
    rec_names = [n for n, p in model.named_parameters() if id(p) in rnn and n.endswith("weight_hh_l0")]
    below = ["embed.weight", "blocks.0.mlp.W_in.weight"]
    assert len(rec_names) == 2 and all(n in full for n in below)
    assert rec_names[0].startswith("blocks.0.")
    cut_side, full_side = {"stopgrad-rnn": (rec_names, below), "stopgrad-nonrnn": (below, rec_names),
                           "stopgrad-rnn0": (rec_names[:1], rec_names[1:] + below),
                           "stopgrad-rnn1": (rec_names[1:], rec_names[:1] + below)}[sched.name]
    for n in cut_side:
        torch.testing.assert_close(grads[n], cut[n], rtol=1e-4, atol=1e-7)
    for n in full_side:
        torch.testing.assert_close(grads[n], full[n], rtol=1e-4, atol=1e-7)
    for n in rec_names + below:
        assert (full[n] - cut[n]).norm() > 1e-3 * full[n].norm(), f"{n}: attention's path must reach it"
    attn = [n for n, p in model.named_parameters() if p.dim() == 2 and ".attn." in n]
    assert attn and all(grads[n].norm() > 0 for n in attn)


def test_cut_through_detaches_the_named_attention_blocks_only(tmp_path):
    two_blocks = dataclasses.replace(MODEL, n_layers=2)
    seen: list[list[bool]] = []
    for through in ((1,), None):
        sched = ScheduleConfig(cut="all", cut_through=through)
        trainer = Trainer(two_blocks, TASK, tiny_cfg(schedule=sched), tmp_path / str(through), progress=False)
        model = trainer.model
        model.blocks[1].attn.register_forward_pre_hook(
            lambda *_, m=model: seen.append([b.attn_stopgrad for b in m.attention_blocks]))
        trainer.train_step(0)
        assert not any(b.attn_stopgrad for b in model.attention_blocks)
    assert seen == [[False, True], [True, True]]
    with pytest.raises(ProbeError, match="no attention in block 2"):
        Trainer(two_blocks, TASK, tiny_cfg(schedule=ScheduleConfig(cut="all", cut_through=(2,))), tmp_path / "x",
                progress=False)


def test_stopgrad_with_a_switch_detaches_until_the_switch_only():
    def cut(cfg, total=6):
        s = Schedule(cfg, total)
        return [isinstance(s.gradient_policy(t), DetachAttention) for t in range(total)]

    assert cut(variant("stopgrad", switch=At(fraction=0.5))) == [True] * 3 + [False] * 3
    assert cut(variant("stopgrad", cut_until=At(step=2))) == [True] * 2 + [False] * 4
    assert all(cut(variant("stopgrad")))
    s = Schedule(variant("stopgrad", switch=At(fraction=0.5)), 6)
    assert all(s.gate(t) == 1 and s.attention_trains(t) for t in range(6))
    assert not any(cut(variant("joint")))


def test_freeze_recurrent_after_switch_holds_the_lstm_and_trains_the_rest(tmp_path):
    sched = variant("dat+frozen-rnn", switch=At(step=20))
    trainer = Trainer(MODEL, TASK, tiny_cfg(steps=40, schedule=sched), tmp_path, progress=False)
    snap = {}
    for step in range(40):
        if step in (0, 20):
            snap[step] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train_step(step)
        trainer.step = step + 1
    end = dict(trainer.model.named_parameters())
    rnn = [n for n in end if ".lstm." in n or ".ln_lstm." in n]
    attn = [n for n in end if ".attn." in n]
    assert all(not torch.equal(snap[0][n], snap[20][n]) for n in rnn if "weight" in n), "LSTM trains before T"
    assert all(torch.equal(snap[20][n], end[n]) for n in rnn), "LSTM is frozen from T on"
    assert all(torch.equal(snap[0][n], snap[20][n]) for n in attn), "attention is held before T (delayed)"
    assert any(not torch.equal(snap[20][n], end[n]) for n in attn), "attention trains after T"
    assert not torch.equal(snap[20]["unembed.weight"], end["unembed.weight"])


def test_variants_are_recorded_by_name_and_checked(tmp_path):
    final = train(MODEL, TASK, tiny_cfg(schedule=variant("dat+frozen-rnn", switch=At(step=20))), tmp_path / "a",
                  progress=False)
    assert final.label == "hybrid-dat+frozen-rnn" and final.variant == "dat+frozen-rnn"
    assert final.schedule == "delayed", "the schedule column keeps the old kinds"
    final = train(MODEL, TASK, tiny_cfg(schedule=variant("stopgrad-rnn")), tmp_path / "c", progress=False)
    assert final.label == "hybrid-stopgrad-rnn" and final.schedule == "stopgrad"
    with pytest.raises(ProbeError, match="no recurrent sublayer in block 1"):
        Trainer(MODEL, TASK, tiny_cfg(schedule=variant("stopgrad-rnn1")), tmp_path / "d", progress=False)
    with pytest.raises(ProbeError, match="needs schedule.kind=stopgrad"):
        _record(kind="delayed", switch=20, stopgrad_scope="recurrent")
    with pytest.raises(ProbeError, match="stopgrad_scope must be one of all, recurrent, nonrecurrent or recurrent:N"):
        _record(kind="stopgrad", stopgrad_scope="lstm")
    with pytest.raises(ProbeError, match="after the last step"):
        Schedule(variant("dat", switch=At(step=2000)), total_steps=50)


def test_trajectory_snapshots_carry_the_lstm_second_moments(tmp_path):
    train(MODEL, TASK, tiny_cfg(), tmp_path, progress=False)
    first = load_checkpoint(tmp_path / "trajectory" / "step_000000.pt")
    later = load_checkpoint(tmp_path / "trajectory" / "step_000020.pt")
    assert "lstm_adam" not in first.extra, "no optimizer state exists before the first step"
    adam = later.extra["lstm_adam"]
    assert adam["step"] == 20 and 0 < adam["beta2"] < 1 and adam["eps"] > 0
    weights = {n for n in later.state_dict if ".lstm.rnn." in n}
    assert set(adam["exp_avg_sq"]) == weights
    assert all(v.dtype == torch.bfloat16 and (v.float() > 0).any() for v in adam["exp_avg_sq"].values())


# --- co-adaptation: which gradient into which LSTM, through which attention ---------------------------------------
TWO_BLOCKS = dataclasses.replace(MODEL, n_layers=2)


@contextlib.contextmanager
def _inputs_detached(modules: list[torch.nn.Module]):
    """The test's own cut, independent of the trainer's: each module's first input detached by a pre-hook."""
    handles = [m.register_forward_pre_hook(lambda _m, args: (args[0].detach(), *args[1:])) for m in modules]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _oracle(model, batch, names: list[str], *cut: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The gradient of the named parameters with the inputs of ``cut`` detached."""
    params = dict(model.named_parameters())
    with _inputs_detached(list(cut)):
        loss = model(batch.tokens, labels=batch.labels)
    got = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    return {n: torch.zeros_like(params[n]) if g is None else g for n, g in zip(names, got, strict=True)}


def _lstm(model, block: int) -> list[str]:
    prefixes = (f"blocks.{block}.lstm.", f"blocks.{block}.ln_lstm.")
    return [n for n, _ in model.named_parameters() if n.startswith(prefixes)]


def _norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(g.pow(2).sum() for g in grads.values())))


def _learned_attention(trainer: Trainer) -> None:
    """Move attention away from its initial weights, as training would, without touching anything else."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in trainer.model.attention_parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))


def test_frozen_copy_lstm0_learns_through_the_initial_attention_only(tmp_path):
    """``frozen-copy``: block 0's LSTM gets (its gradient with every attention's input cut, at the current weights) +
    (the path through attention in a model whose attention has its initial weights, built independently from the
    seed); every other parameter, attention included, gets the plain gradient; at step 0 all of it is the plain
    gradient."""
    cfg = tiny_cfg(schedule=variant("frozen-copy"), grad_clip=1e9)
    fresh = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path / "a", progress=False)
    batch = _batch(cfg, 3)
    names = [n for n, _ in fresh.model.named_parameters()]
    plain = _oracle(fresh.model, batch, names)
    at_init = _one_step_grads(fresh, 3)
    for n in names:
        torch.testing.assert_close(at_init[n], plain[n], rtol=1e-4, atol=1e-7)

    trainer = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path / "b", progress=False)
    _learned_attention(trainer)
    model = trainer.model
    params = list(model.parameters())
    grads = _one_step_grads(trainer, 3)
    assert [id(p) for p in model.parameters()] == [id(p) for p in params], "the model's own parameters are back"
    assert not any(b.attn_stopgrad for b in model.attention_blocks)

    torch.manual_seed(cfg.seed)
    initial = HookedSequenceModel(TWO_BLOCKS)  # the seed's initialisation, rebuilt here
    copy = HookedSequenceModel(TWO_BLOCKS)
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p, p0 in zip(copy.attention_parameters(), initial.attention_parameters(), strict=True):
            p.copy_(p0)
    lstm0 = _lstm(model, 0)
    attn = [b.attn for b in model.attention_blocks]
    attn_copy = [b.attn for b in copy.attention_blocks]
    cut = _oracle(model, batch, lstm0, *attn)
    full_0, cut_0 = _oracle(copy, batch, lstm0), _oracle(copy, batch, lstm0, *attn_copy)
    full = _oracle(model, batch, names)
    for n in lstm0:
        torch.testing.assert_close(grads[n], cut[n] + full_0[n] - cut_0[n], rtol=1e-4, atol=1e-6)
    for n in set(names) - set(lstm0):
        torch.testing.assert_close(grads[n], full[n], rtol=1e-4, atol=1e-7)
    # the property is not vacuous: the learned attention's path, and no path, both give other gradients
    learned_path = {n: full[n] - cut[n] for n in lstm0}
    initial_path = {n: full_0[n] - cut_0[n] for n in lstm0}
    assert _norm({n: learned_path[n] - initial_path[n] for n in lstm0}) > 0.1 * _norm(learned_path)
    assert _norm(initial_path) > 0.05 * _norm(cut)
    assert any(grads[n].norm() > 0 for n in names if ".attn." in n)


def test_co_adaptation_settings_spell_out_their_variants_and_refuse_what_they_cannot_do():
    sets = ["schedule.cut=recurrent", "schedule.cut_block=0"]
    assert build_configs("hybrid-joint", overrides=[*sets, "schedule.cut_mode=initial-attention"])[2].schedule.name \
        == "frozen-copy"
    assert build_configs("hybrid-joint", overrides=[*sets, "schedule.cut_through=1"])[2].schedule.name \
        == "stopgrad-rnn0-att1"
    assert ScheduleConfig.from_dict(variant("placebo").to_dict()) == variant("placebo")
    with pytest.raises(ProbeError, match="cut_mode=initial-attention needs schedule.cut=recurrent"):
        ScheduleConfig(cut="all", cut_mode="initial-attention")
    with pytest.raises(ProbeError, match="drop schedule.cut_through"):
        ScheduleConfig(cut="recurrent", cut_mode="mlp-placebo", cut_through=(0,))
    with pytest.raises(ProbeError, match="cut_mode 'frozen'"):
        ScheduleConfig(cut="recurrent", cut_mode="frozen")


def test_frozen_copy_keeps_the_seed_initial_attention_and_needs_it():
    s = Schedule(variant("frozen-copy"), 10)
    with pytest.raises(ProbeError, match="remember_initial"):
        s.gradient_policy(0)
    torch.manual_seed(0)
    model = HookedSequenceModel(TWO_BLOCKS)
    s.remember_initial(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.attention_parameters():
            p.add_(1.0)
    assert s.initial_attention and all(torch.equal(v, before[n]) for n, v in s.initial_attention.items())
    assert set(s.initial_attention) == {n for n, p in model.named_parameters()
                                        if id(p) in {id(q) for q in model.attention_parameters()}}


def test_a_resumed_frozen_copy_run_routes_through_the_same_initial_attention(tmp_path):
    cfg = tiny_cfg(schedule=variant("frozen-copy"), steps=20)
    first = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False)
    initial = {n: v.clone() for n, v in first.schedule.initial_attention.items()}
    for step in range(10):
        first.train_step(step)
    first.step = 10
    save_checkpoint(tmp_path / "last.pt", first.checkpoint())
    resumed = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False)
    assert resumed.resume()
    weights = dict(resumed.model.named_parameters())
    assert all(not torch.equal(weights[n], v) for n, v in initial.items() if v.dim() == 2), "attention has learned"
    assert all(torch.equal(resumed.schedule.initial_attention[n], v) for n, v in initial.items())

def test_placebo_removes_attentions_share_from_the_mlp_path_and_keeps_attentions(tmp_path):
    """``placebo``: block 0's LSTM loses exactly the norm of its gradient through attention, taken as a multiple of
    its path through the MLPs that avoids every attention (both computed independently here); the path through
    attention is kept whole; every other parameter gets the plain gradient."""
    cfg = tiny_cfg(schedule=variant("placebo"), grad_clip=1e9)
    trainer = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False)
    model = trainer.model
    grads = _one_step_grads(trainer, 3)
    batch = _batch(cfg, 3)
    names = [n for n, _ in model.named_parameters()]
    lstm0 = _lstm(model, 0)
    attn = [b.attn for b in model.attention_blocks]
    mlps = [b.mlp for b in model.blocks]
    full = _oracle(model, batch, names)
    no_att = _oracle(model, batch, lstm0, *attn)
    neither = _oracle(model, batch, lstm0, *attn, *mlps)
    g_att = {n: full[n] - no_att[n] for n in lstm0}
    g_mlp = {n: no_att[n] - neither[n] for n in lstm0}
    assert _norm(g_mlp) > _norm(g_att) > 0.05 * _norm(no_att), "a tiny model where the share can be matched"
    removed = {n: full[n] - grads[n] for n in lstm0}
    assert abs(_norm(removed) - _norm(g_att)) < 1e-4 * _norm(g_att), "as much as attention's share is removed"
    scale = _norm(g_att) / _norm(g_mlp)
    for n in lstm0:  # ... all of it from the MLP path, so attention's path is what the cut gradient still holds
        torch.testing.assert_close(removed[n], scale * g_mlp[n], rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(grads[n] - (no_att[n] - scale * g_mlp[n]), g_att[n], rtol=1e-4, atol=1e-7)
    for n in set(names) - set(lstm0):
        torch.testing.assert_close(grads[n], full[n], rtol=1e-4, atol=1e-7)
    assert _norm({n: removed[n] - g_att[n] for n in lstm0}) > 0.1 * _norm(g_att), "not attention's path itself"


def test_early_only_cut_switches_to_the_full_gradient_at_its_step(tmp_path):
    """``stopgrad-rnn0`` with ``cut_until``: block 0's LSTM is cut up to the step before S, plain from S on."""
    for s_cut in (250, 1000):
        train_cfg = build_configs("hybrid-joint", overrides=["schedule.variant=stopgrad-rnn0",
                                                             f"schedule.cut_until_step={s_cut}"])[2]
        s = Schedule(train_cfg.schedule, train_cfg.steps)
        before, after = s.gradient_policy(s_cut - 1), s.gradient_policy(s_cut)
        assert isinstance(before, SplitCut) and (before.side, before.block, before.through) == ("recurrent", 0, None)
        assert after is PLAIN and s.gradient_policy(train_cfg.steps - 1) is PLAIN and s.cuts(0)
    cfg = tiny_cfg(schedule=variant("stopgrad-rnn0", cut_until=At(step=2)), grad_clip=1e9)
    trainer = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False)
    lstm0 = _lstm(trainer.model, 0)
    attn = [b.attn for b in trainer.model.attention_blocks]
    for step, cut in ((1, True), (2, False)):
        grads = _one_step_grads(trainer, step)
        expected = _oracle(trainer.model, _batch(cfg, step), lstm0, *(attn if cut else ()))
        other = _oracle(trainer.model, _batch(cfg, step), lstm0, *(() if cut else attn))
        for n in lstm0:
            torch.testing.assert_close(grads[n], expected[n], rtol=1e-4, atol=1e-7)
        assert _norm({n: grads[n] - other[n] for n in lstm0}) > 1e-3 * _norm(expected)


@pytest.mark.parametrize("name,block,through", [
    ("stopgrad-rnn0-att0", 0, 0), ("stopgrad-rnn0-att1", 0, 1), ("stopgrad-rnn1-att1", 1, 1)])
def test_one_attentions_path_into_one_lstm_is_cut_exactly(tmp_path, name, block, through):
    """Block ``block``'s LSTM loses exactly the paths through attention ``through`` (computed by detaching that
    attention's input in a separate forward); the other attention's path and every other parameter's are kept."""
    cfg = tiny_cfg(schedule=variant(name), grad_clip=1e9)
    trainer = Trainer(TWO_BLOCKS, TASK, cfg, tmp_path, progress=False)
    model = trainer.model
    grads = _one_step_grads(trainer, 3)
    batch = _batch(cfg, 3)
    names = [n for n, _ in model.named_parameters()]
    lstm = _lstm(model, block)
    full = _oracle(model, batch, names)
    cut = _oracle(model, batch, lstm, model.blocks[through].attn)
    every = _oracle(model, batch, lstm, *[b.attn for b in model.attention_blocks])
    for n in lstm:
        torch.testing.assert_close(grads[n], cut[n], rtol=1e-4, atol=1e-7)
    for n in set(names) - set(lstm):
        torch.testing.assert_close(grads[n], full[n], rtol=1e-4, atol=1e-7)
    path = {n: full[n] - cut[n] for n in lstm}
    assert _norm(path) > 1e-3 * _norm(full), "the cut path carries gradient"
    if block == 0:  # the other attention's path into LSTM 0 is kept: the confound of stopgrad-rnn0 is gone
        assert _norm({n: cut[n] - every[n] for n in lstm}) > 1e-3 * _norm(full)
    else:  # attention 0 lies below LSTM 1, so this is stopgrad-rnn1's cut
        for n in lstm:
            torch.testing.assert_close(cut[n], every[n], rtol=1e-5, atol=1e-8)


# --- precision and other CPU features ------------------------------------------------------------------------------
def _dtypes_seen(trainer: Trainer) -> dict[str, torch.dtype]:
    """The output dtypes of block 0's fused LSTM kernel and its MLP in one training step."""
    seen: dict[str, torch.dtype] = {}
    block = trainer.model.blocks[0]

    def record(name):
        def hook(_m, _a, out):
            seen.setdefault(name, (out[0] if isinstance(out, tuple) else out).dtype)
        return hook

    block.lstm.rnn.register_forward_hook(record("lstm"))
    block.mlp.W_in.register_forward_hook(record("mlp"))
    trainer.train_step(0)
    return seen


def _lstm_without_bf16_kernel(monkeypatch) -> None:
    """``nn.LSTM`` as oneDNN behaves on a CPU without native bf16: refused under autocast."""
    real = torch.nn.LSTM.forward

    def forward(self, *a, **k):
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("could not create a primitive descriptor for the LSTM forward propagation primitive")
        return real(self, *a, **k)

    monkeypatch.setattr(torch.nn.LSTM, "forward", forward)


def test_bf16_on_a_cpu_without_native_bf16_keeps_the_recurrence_in_fp32(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)  # an AVX2-only CPU
    _lstm_without_bf16_kernel(monkeypatch)
    cfg = tiny_cfg(precision="bf16", steps=4, eval_every=4, ckpt_every=4, traj_every=4)
    final = train(MODEL, TASK, cfg, tmp_path / "run", progress=False)
    err = capsys.readouterr().err
    assert err.count("recurrent sublayers kept in fp32") == 1 and len(_notes(err)) == 1
    assert final.extra["precision_used"] == "bf16+fp32-recurrence" and final.train_config["precision"] == "bf16"
    assert math.isfinite(final.metrics["loss"])  # neither NaN nor inf
    trainer = Trainer(MODEL, TASK, cfg, tmp_path / "t", progress=False)
    assert _dtypes_seen(trainer) == {"lstm": torch.float32, "mlp": torch.bfloat16}, "the rest still autocasts"
    # the control: the simulated kernel does refuse bf16, so the path above is what made the run work
    monkeypatch.setattr(hardware, "precision_used", lambda *a: ("bf16", None))
    with pytest.raises(RuntimeError, match="primitive descriptor"):
        Trainer(MODEL, TASK, cfg, tmp_path / "u", progress=False).train_step(0)


def test_a_real_bf16_step_runs_on_this_cpu(tmp_path):
    """Whatever CPU runs the tests: bf16 trains, with fp32 weights, and records what ran."""
    final = train(MODEL, TASK, tiny_cfg(precision="bf16", steps=6, eval_every=6, ckpt_every=6, traj_every=6),
                  tmp_path / "run", progress=False)
    expected = "bf16" if hardware.cpu_has_native_bf16() else "bf16+fp32-recurrence"
    assert final.extra["precision_used"] == expected
    assert all(v.dtype == torch.float32 for v in final.state_dict.values() if v.is_floating_point())
    assert math.isfinite(final.metrics["loss"])  # neither NaN nor inf
    trainer = Trainer(MODEL, TASK, tiny_cfg(precision="bf16"), tmp_path / "t", progress=False)
    assert _dtypes_seen(trainer)["mlp"] == torch.bfloat16
    with pytest.raises(ProbeError, match="precision"):
        TrainConfig(precision="fp8")


def test_bf16_with_the_recurrence_in_fp32_on_request(tmp_path):
    """``bf16+fp32-recurrence`` by name, on any CPU: the recurrence in fp32, the rest in bf16, and recorded; on a CPU
    with native bf16, plain ``bf16`` runs the recurrence in bf16, so the setting is what made the difference."""
    trainer = Trainer(MODEL, TASK, tiny_cfg(precision="bf16+fp32-recurrence"), tmp_path / "a", progress=False)
    assert trainer.precision_used == "bf16+fp32-recurrence"
    assert _dtypes_seen(trainer) == {"lstm": torch.float32, "mlp": torch.bfloat16}
    assert trainer.checkpoint().extra["precision_used"] == "bf16+fp32-recurrence"
    if hardware.cpu_has_native_bf16():
        plain = Trainer(MODEL, TASK, tiny_cfg(precision="bf16"), tmp_path / "b", progress=False)
        assert _dtypes_seen(plain)["lstm"] == torch.bfloat16


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_is_bf16_only_where_native(tmp_path, monkeypatch, native):
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: native)
    trainer = Trainer(MODEL, TASK, tiny_cfg(precision="auto"), tmp_path, progress=False)
    assert trainer.precision_used == ("bf16" if native else "fp32")
    assert _dtypes_seen(trainer) == ({"lstm": torch.bfloat16, "mlp": torch.bfloat16} if native else
                                     {"lstm": torch.float32, "mlp": torch.float32})
    assert trainer.checkpoint().extra["precision_used"] == trainer.precision_used


def test_a_run_resumed_where_auto_resolves_otherwise_records_both_precisions(tmp_path, monkeypatch, capsys):
    """A grid that spans sessions may resume on a CPU where ``train.precision=auto`` resolves otherwise and go on in
    another precision. The checkpoint records each stretch, and the tables call the run mixed, never one precision.
    (The two machines are simulated with two precisions that run on every CPU: bf16 with the recurrence in fp32,
    then fp32.)"""
    from probe.evaluate import _trained_as, evaluate_checkpoints, evaluate_windows, evaluation_envelope
    from probe.results import read_run_folder

    cfg = tiny_cfg(precision="auto", steps=8, eval_every=8, ckpt_every=4, traj_every=8)
    monkeypatch.setattr(hardware, "precision_used", lambda *a: ("bf16+fp32-recurrence", None))
    train(MODEL, TASK, cfg, tmp_path / "run", progress=False, until=4)
    # the control: resumed on the same machine, a run stays one stretch (a record that appended a stretch at every
    # resume would call every stopped run mixed)
    shutil.copytree(tmp_path / "run", tmp_path / "same")
    once = train(MODEL, TASK, cfg, tmp_path / "same", progress=False, resume=True)
    assert [s[:2] for s in once.extra["segments"]] == [[0, "bf16+fp32-recurrence"]]
    assert hardware.trained_as(once.extra)[0] == "bf16+fp32-recurrence"
    capsys.readouterr()
    monkeypatch.setattr(hardware, "precision_used", lambda *a: ("fp32", None))  # the next session's machine
    final = train(MODEL, TASK, cfg, tmp_path / "run", progress=False, resume=True)
    assert "trained so far in bf16+fp32-recurrence; this machine continues in fp32" in capsys.readouterr().err
    assert final.extra["precision_used"] == "fp32"  # what the last stretch ran as: analyses replay a step in it
    assert [s[:2] for s in final.extra["segments"]] == [[0, "bf16+fp32-recurrence"], [4, "fp32"]]
    mixed = "bf16+fp32-recurrence (from step 0), fp32 (from step 4)"
    assert hardware.trained_as(final.extra)[0] == mixed
    assert _trained_as(final)["precision"] == mixed
    ckpt = [tmp_path / "run" / "final.pt"]
    curves = evaluate_checkpoints(ckpt, [6, 12], 8)
    assert set(curves.precision) == {mixed}
    (tmp_path / "run" / "eval.json").write_text(json.dumps(evaluation_envelope(
        curves, ckpt, evaluate_windows(ckpt, 12, 8))))
    summary, _, _ = read_run_folder(tmp_path / "run", "joint", 0)
    assert summary["precision"] == mixed
    # a checkpoint from before segments were kept reads as one stretch, as it recorded
    del final.extra["segments"]
    assert hardware.trained_as(final.extra) == ("fp32", final.extra["device"])


def _ckpt(step: int, precision: str = "auto", **extra):
    return SimpleNamespace(step=step, train_config={"precision": precision}, extra=extra)


@pytest.mark.parametrize(("ckpt", "now", "expected"), [
    # the same machine: one stretch, however often a run is stopped
    (_ckpt(40, segments=[[0, "bf16", "A"]]), ["bf16", "A"], [[0, "bf16", "A"]]),
    # another device with the same precision: a stretch of its own (the device is part of the arithmetic)
    (_ckpt(40, segments=[[0, "bf16", "A"]]), ["bf16", "B"], [[0, "bf16", "A"], [40, "bf16", "B"]]),
    # back on the first machine after a stretch elsewhere: compared with the last stretch, not the first
    (_ckpt(60, segments=[[0, "bf16", "A"], [40, "fp32", "B"]]), ["bf16", "A"],
     [[0, "bf16", "A"], [40, "fp32", "B"], [60, "bf16", "A"]]),
    # a stretch stopped before its first step trained nothing: the next one takes its place
    (_ckpt(40, segments=[[0, "bf16", "A"], [40, "fp32", "B"]]), ["bf16", "A"], [[0, "bf16", "A"]]),
    (_ckpt(0, segments=[[0, "fp32", "B"]]), ["bf16", "A"], [[0, "bf16", "A"]]),
    # a checkpoint from before stretches were kept: one stretch, as it records its precision and device
    (_ckpt(40, precision_used="bf16", device="A"), ["fp32", "B"], [[0, "bf16", "A"], [40, "fp32", "B"]]),
    (_ckpt(40, precision_used="fp32", device="A"), ["fp32", "A"], [[0, "fp32", "A"]]),
    # ... and what it does not record: its config's literal precision, else this machine's
    (_ckpt(40, precision="fp32"), ["fp32", "A"], [[0, "fp32", "A"]]),
    (_ckpt(40, precision="fp32"), ["bf16", "A"], [[0, "fp32", "A"], [40, "bf16", "A"]]),
    (_ckpt(40, precision="auto"), ["bf16", "A"], [[0, "bf16", "A"]]),
])
def test_resumed_segments(ckpt, now, expected):
    assert resumed_segments(ckpt, now) == expected


def test_a_stretch_that_trained_no_step_is_left_out_of_the_record(tmp_path, monkeypatch):
    """Stopped before the first step of a resume elsewhere (SIGINT writes last.pt at once), a run that then goes on
    where it began is one precision's run, not a mixed one."""
    cfg = tiny_cfg(precision="auto", steps=8, eval_every=8, ckpt_every=4, traj_every=8)
    monkeypatch.setattr(hardware, "precision_used", lambda *a: ("bf16+fp32-recurrence", None))
    train(MODEL, TASK, cfg, tmp_path, progress=False, until=4)
    monkeypatch.setattr(hardware, "precision_used", lambda *a: ("fp32", None))
    elsewhere = Trainer(MODEL, TASK, cfg, tmp_path, progress=False)
    assert elsewhere.resume() and [s[:2] for s in elsewhere.segments] == [[0, "bf16+fp32-recurrence"], [4, "fp32"]]
    stopped = elsewhere.checkpoint()  # what the stop writes to last.pt before any step
    assert [s[:2] for s in stopped.extra["segments"]] == [[0, "bf16+fp32-recurrence"]]
    save_checkpoint(tmp_path / "last.pt", stopped)
    monkeypatch.setattr(hardware, "precision_used", lambda *a: ("bf16+fp32-recurrence", None))
    final = train(MODEL, TASK, cfg, tmp_path, progress=False, resume=True)
    assert hardware.trained_as(final.extra)[0] == "bf16+fp32-recurrence"


def test_cpu_feature_check_reads_the_flags_and_a_onednn_cap(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2", "fma"})
    assert not hardware.cpu_has_native_bf16()
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert hardware.cpu_has_native_bf16()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not hardware.cpu_has_native_bf16()


@pytest.mark.slow
def test_bf16_cli_run_on_a_cpu_capped_to_avx2(tmp_path):
    """The reported crash, for real: oneDNN capped to AVX2 has no bf16 LSTM kernel; ``train.precision=bf16`` still
    trains, says so in one line and records what ran."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    bare = ("import torch; m = torch.nn.LSTM(16, 16)\nwith torch.autocast('cpu', dtype=torch.bfloat16): "
            "m(torch.randn(3, 2, 16))")
    control = subprocess.run([sys.executable, "-c", bare], env=env, capture_output=True, text=True)
    if control.returncode == 0:
        pytest.skip("this torch's oneDNN has a bf16 LSTM kernel under an AVX2 cap: nothing to reproduce")
    assert "primitive descriptor" in control.stderr
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "probe.train", "--preset", "hybrid-joint", "--steps", "3",
                           "--set", "train.precision=bf16", *[a for o in TINY for a in ("--set", o)],
                           "--out", str(out), "--no-progress"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("recurrent sublayers kept in fp32") == 1
    assert load_checkpoint(out / "final.pt").extra["precision_used"] == "bf16+fp32-recurrence"


def test_compile_without_a_compiler_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from torch._inductor import cpp_builder

    def missing():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", missing)
    out = tmp_path / "run"
    assert main(["--preset", "hybrid-joint", "--steps", "2", "--set", "train.compile=true",
                 *[a for o in TINY for a in ("--set", o)], "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "needs a C++ compiler" in err and err.count("\n") == 1 and not out.exists()


@pytest.mark.slow
def test_compiled_forward_trains_here(tmp_path):
    hardware.check_compile(torch.device("cpu"))  # a machine without a compiler is refused (test above)
    final = train(MODEL, TASK, tiny_cfg(compile=True, steps=3, eval_every=3, ckpt_every=3, traj_every=3),
                  tmp_path, progress=False)
    assert math.isfinite(final.metrics["loss"])  # neither NaN nor inf


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_adamw_implementations_train_here_like_the_default(tmp_path, impl):
    losses = {}
    for name in ("default", impl):
        trainer = Trainer(MODEL, TASK, tiny_cfg(optimizer_impl=name), tmp_path / name, progress=False)
        losses[name] = [trainer.train_step(step)[0] for step in range(4)]
    assert losses[impl][0] == losses["default"][0]  # same weights before the first update
    assert losses[impl] == pytest.approx(losses["default"], rel=1e-3)  # the same algorithm, other rounding


def test_an_optimizer_the_device_cannot_run_is_refused_in_one_line(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")

    monkeypatch.setattr(torch.optim, "AdamW", refuse)
    with pytest.raises(ProbeError, match="optimizer_impl=fused does not run on cpu .* use train.optimizer_impl"):
        Trainer(MODEL, TASK, tiny_cfg(optimizer_impl="fused"), tmp_path, progress=False)


@pytest.mark.slow  # two threads on a busy two-core machine take seconds per step
def test_threads_setting_is_applied_and_oversubscription_noted(tmp_path, capsys, monkeypatch):
    import probe.training.trainer

    monkeypatch.setattr(probe.training.trainer, "_available_cpus", lambda: {0})  # a one-core machine
    before = torch.get_num_threads()
    try:
        train(MODEL, TASK, tiny_cfg(threads=2, steps=1, eval_every=1, eval_samples=2, ckpt_every=1, traj_every=1),
              tmp_path, progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err
    assert "train.threads=2 but this process may use 1 CPU(s)" in err and len(_notes(err)) == 1


# --- CLI --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag,message", [
    (["--steps", "0"], "train.steps must be a positive integer"),
    (["--steps", "-5"], "train.steps must be a positive integer"),
    (["--set", "model.d_model=abc"], "model.d_model='abc': expected int"),
    (["--set", "model.width=3"], "no such field"),
    (["--set", "schedule.switch_step=2000", "--steps", "50"], "after the last step"),
    (["--set", "train.precision=fp8"], "choose one of fp32, bf16, bf16+fp32-recurrence, auto"),
])
def test_bad_training_flags_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, flag, message):
    out = tmp_path / "run"
    assert main([*flag, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_resume_reads_its_configs_from_last_pt_and_names_a_conflicting_flag(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--resume", "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    overrides = ["model.d_model=16", "model.n_layers=1", "task.train_length=6", "train.batch_size=8",
                 "train.eval_every=30", "train.eval_samples=8", "train.traj_every=30", "train.warmup=5"]
    trainer = Trainer(*build_configs("hybrid-dat", "interleaved", overrides, steps=30, seed=0), out,
                      progress=False)
    trainer.out.mkdir(parents=True)
    for step in range(10):
        trainer.train_step(step)
        trainer.step = step + 1
    save_checkpoint(out / "last.pt", trainer.checkpoint())
    assert main(["--resume", "--out", str(out), "--set", "train.lr=0.5", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "train.lr is 0.002 in the checkpoint" in err and err.count("\n") == 1
    assert main(["--resume", "--out", str(out), "--set", "schedule.switch=14", "--no-progress"]) == 2
    assert "schedule.switch is {'step': 13} in the checkpoint" in capsys.readouterr().err
    assert main(["--resume", "--out", str(out), "--preset", "lstm", "--no-progress"]) == 2
    assert "the run is hybrid-dat" in capsys.readouterr().err
    # the same settings spelled the old way, the new way or as the preset's fraction all agree with the run
    assert main(["--resume", "--out", str(out), "--steps", "30", "--set", "schedule.switch=13",
                 "--set", "schedule.switch_fraction=0.4444444444444444", "--set", "schedule.kind=delayed",
                 "--preset", "hybrid-dat", "--no-progress"]) == 0
    assert load_checkpoint(out / "final.pt").step == 30
    # a split-cut run resumed with the command a sweep prints: the old spellings, each needing its neighbour
    out = tmp_path / "cut"
    old_spelling = ["schedule.kind=stopgrad", "schedule.stopgrad_scope=recurrent"]
    trainer = Trainer(*build_configs("hybrid-joint", "interleaved", overrides + old_spelling, steps=4, seed=0), out,
                      progress=False)
    trainer.out.mkdir(parents=True)
    trainer.train_step(0)
    trainer.step = 1
    save_checkpoint(out / "last.pt", trainer.checkpoint())
    assert main(["--resume", "--out", str(out), "--set", old_spelling[0], "--no-progress"]) == 2
    assert "schedule.cut is 'recurrent' in the checkpoint" in capsys.readouterr().err
    assert main(["--resume", "--out", str(out), *[a for o in old_spelling for a in ("--set", o)],
                 "--no-progress"]) == 0
