"""The training core's contracts: a setting that does nothing is refused, every old spelling is read in one module,
and a checkpoint records the state at its step that analyses read instead of rebuilding it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import probe.training.trainer
from probe.checkpoint import load_checkpoint, save_checkpoint
from probe.errors import ProbeError
from probe.models import ModelConfig
from probe.schedules import legacy
from probe.schedules.points import At
from probe.schedules.settings import VARIANTS, ScheduleConfig
from probe.tasks import make_task
from probe.training.batches import DRAWS, SEED_FORMULA, train_batch_seed, training_batch
from probe.training.cli import main
from probe.training.config import TrainConfig, lr_at
from probe.training.overrides import build_configs
from probe.training.presets import DAT_SWITCH
from probe.training.state import KEY, schedule_gate, step_state
from probe.training.trainer import train

ROOT = Path(__file__).parent.parent
TASK = make_task("interleaved", train_length=6)
MODEL = ModelConfig(family="hybrid", vocab_size=TASK.vocab_size, d_model=16, n_layers=2, n_heads=2)


def _record(**schedule) -> ScheduleConfig:
    """A schedule as an old checkpoint recorded it, converted as loading a file of format 1 converts it."""
    return ScheduleConfig.from_dict(legacy.upgrade_schedule(schedule))


# --- a setting that does nothing -----------------------------------------------------------------------------------
@pytest.mark.parametrize("preset,item,why", [
    ("hybrid-joint", "schedule.switch=0.5", "no setting waits for a switch"),
    ("hybrid-joint", "schedule.switch_step=100", "no setting waits for a switch"),
    ("hybrid-dat", "schedule.ramp_window=50", "only schedule.gate=ramp reads it"),
    ("hybrid-dat", "schedule.patience=5", "only an adaptive schedule reads it"),
    ("hybrid-dat", "schedule.min_switch=20%", "only an adaptive schedule reads it"),
])
def test_a_setting_that_does_nothing_in_a_preset_is_refused(preset, item, why):
    with pytest.raises(ProbeError, match=f"--set {item} does nothing in preset {preset} .*{why}"):
        build_configs(preset, overrides=[item])


def test_the_refusal_is_one_line_and_exit_2_from_the_cli(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--preset", "hybrid-joint", "--set", "schedule.switch=0.5", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "schedule.switch=0.5 does nothing in preset hybrid-joint (schedule joint)" in err and err.count("\n") == 1
    assert not out.exists()


def test_a_setting_is_accepted_where_something_reads_it_and_a_preset_s_own_is_dropped_not_refused():
    assert build_configs("hybrid-dat", overrides=["schedule.variant=ramp", "schedule.ramp_window=50"])[2] \
        .schedule.ramp_window == At(step=50)
    assert build_configs("hybrid-joint", overrides=["schedule.variant=stopgrad", "schedule.switch=10%"])[2] \
        .schedule.switch == At(fraction=0.1), "a cut without cut_until lasts until the switch"
    assert build_configs("hybrid-dat", overrides=["schedule.variant=adaptive", "schedule.patience=5"])[2] \
        .schedule.patience == 5
    # hybrid-dat's own switch, left unread by joint, is dropped: the user did not give it
    assert build_configs("hybrid-dat", overrides=["schedule.variant=joint"])[2].schedule == ScheduleConfig()
    with pytest.raises(ProbeError, match="schedule.switch does nothing in schedule joint"):
        ScheduleConfig(switch=At(step=5))  # the same rule for a config built in Python


def test_a_schedule_that_does_nothing_on_the_model_is_refused():
    with pytest.raises(ProbeError, match="preset lstm: schedule dat does nothing on a lstm model, which has no "
                                         "attention"):
        build_configs("lstm", overrides=["schedule.variant=dat", "schedule.switch=100"])
    with pytest.raises(ProbeError, match="schedule.cut=recurrent does nothing on a transformer model"):
        build_configs("transformer", overrides=["schedule.variant=stopgrad-rnn"])
    build_configs("transformer", overrides=["schedule.variant=stopgrad"])  # the cut acts on its embeddings, MLPs


# --- every old spelling in one module -------------------------------------------------------------------------------
def test_old_kinds_and_scopes_map_onto_today_s_settings_in_records_and_in_set_items():
    for kind, name in legacy.KINDS.items():
        switch = [] if kind in ("joint", "stopgrad") else ["schedule.switch=10"]
        assert _record(kind=kind, **({"switch": 10} if switch else {})).name == name
        from_set = build_configs("hybrid-joint", overrides=[f"schedule.kind={kind}", *switch])[2].schedule
        assert from_set == ScheduleConfig(variant=name, **({"switch": At(step=10)} if switch else {}))
    for scope, name in (("all", "stopgrad"), ("recurrent", "stopgrad-rnn"), ("nonrecurrent", "stopgrad-nonrnn"),
                        ("recurrent:0", "stopgrad-rnn0"), ("recurrent:1", "stopgrad-rnn1")):
        assert _record(kind="stopgrad", stopgrad_scope=scope) == ScheduleConfig(**VARIANTS[name])
        sets = [f"schedule.stopgrad_scope={scope}", "schedule.kind=stopgrad"]  # the scope applies last
        assert build_configs("hybrid-joint", overrides=sets)[2].schedule.name == name
    assert _record(kind="delayed", switch=20, freeze_recurrent_after_switch=True).name == "dat+frozen-rnn"
    assert build_configs("hybrid-joint", overrides=["schedule.variant=delayed", "schedule.switch=20"])[2] \
        .schedule.name == "dat"
    assert legacy.old_kind(ScheduleConfig(variant="dat", switch=DAT_SWITCH)) == "delayed"
    assert legacy.old_kind(ScheduleConfig(**VARIANTS["stopgrad-rnn0"])) == "stopgrad"


def test_a_recorded_bare_number_means_what_it_meant_so_1_0_there_is_step_1():
    """In an old record a bare number >= 1 was a step and one in (0, 1) a fraction; 0 meant no switch. Only
    ``--set`` reads 1.0 as the whole run (test_train: test_switch_1_0_is_the_whole_run_...)."""
    assert _record(kind="delayed", switch=2000).switch == At(step=2000)
    assert _record(kind="delayed", switch=0.5).switch == At(fraction=0.5)
    assert _record(kind="delayed", switch=1.0).switch == At(step=1)
    assert _record(kind="ramp", switch=3.0, ramp_window=0.25).ramp_window == At(fraction=0.25)
    assert _record(kind="joint", switch=0.0).switch is None
    # a setting an old record holds that did nothing is dropped: it did nothing then either
    assert _record(kind="joint", switch=2000, ramp_window=50, patience=7) == ScheduleConfig()
    new = ScheduleConfig(variant="dat", switch=DAT_SWITCH).to_dict()
    assert _record(**new) == ScheduleConfig(variant="dat", switch=DAT_SWITCH)  # today's records pass unchanged
    with pytest.raises(ProbeError, match="an old record"):
        ScheduleConfig.from_dict({"kind": "delayed", "switch": 2000})  # legacy.upgrade_schedule converts it, once


OLD_NAMES = {"delayed", "stopgrad_scope", "schedule.kind", "schedule.stopgrad_scope", "kind"}


def test_no_module_but_legacy_spells_an_old_name_and_each_way_into_it_has_one_caller():
    spelled = {}
    for path in sorted((ROOT / "probe").rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in OLD_NAMES}
        if path.parent.name != "schedules":
            names.discard("kind")  # other packages name their own things "kind" (a row's kind)
        if names:
            spelled[str(path.relative_to(ROOT))] = names
    assert set(spelled) == {"probe/schedules/legacy.py"}, spelled
    callers = {}
    for path in sorted((ROOT / "probe").rglob("*.py")):
        text = path.read_text()
        for way in ("upgrade_schedule", "rewrite_overrides", "old_kind", "why_not_today"):
            callers.setdefault(way, []).extend([str(path.relative_to(ROOT))] * text.count(f"legacy.{way}("))
    # an old record enters at one call: where a file of an older format is read (probe.checkpoint._this_format);
    # why_not_today only words a writer's refusal (nothing it converts is kept)
    assert callers == {"upgrade_schedule": ["probe/checkpoint.py"],
                       "rewrite_overrides": ["probe/training/overrides.py"], "old_kind": ["probe/checkpoint.py"],
                       "why_not_today": ["probe/checkpoint.py"]}


# --- what a checkpoint records of its step --------------------------------------------------------------------------
def test_checkpoints_record_gates_lr_and_batch_draw_of_their_step(tmp_path, monkeypatch):
    drawn = []

    def spy(task, batch_size, seed):
        drawn.append(seed)
        return training_batch(task, batch_size, seed)

    monkeypatch.setattr(probe.training.trainer, "training_batch", spy)
    cfg = TrainConfig(steps=24, batch_size=4, eval_every=24, eval_samples=4, ckpt_every=12, traj_every=12, warmup=5,
                      seed=3, schedule=ScheduleConfig(variant="dat", switch=At(step=12)))
    train(MODEL, TASK, cfg, tmp_path, progress=False)
    assert drawn == [train_batch_seed(3, s) for s in range(24)], "the trainer draws every batch by the one function"
    paths = [tmp_path / "final.pt", tmp_path / "last.pt", *sorted((tmp_path / "trajectory").glob("*.pt"))]
    assert [load_checkpoint(p).step for p in paths] == [24, 24, 0, 12, 24]
    for path in paths:
        ckpt = load_checkpoint(path)
        s = ckpt.step
        state = step_state(ckpt)
        assert state.recorded and state.step == s
        assert state.gates == ((0.0, 0.0) if s < 12 else (1.0, 1.0)), "one gate per attention block"
        assert state.lr == lr_at(cfg, s)
        assert state.batch_seed == train_batch_seed(3, s) and state.batch_size == 4
        assert state.draw is training_batch and DRAWS[state.batch_draw] is training_batch
        assert ckpt.extra[KEY]["batch"]["seed_formula"] == SEED_FORMULA
        # the same state, rebuilt from the configs as it is for a checkpoint written before the record
        del ckpt.extra[KEY]
        rebuilt = step_state(ckpt)
        assert not rebuilt.recorded
        assert (rebuilt.gates, rebuilt.lr, rebuilt.batch_seed, rebuilt.draw) == \
            (state.gates, state.lr, state.batch_seed, state.draw)


def test_shipped_checkpoints_without_the_record_rebuild_it():
    dat = step_state(load_checkpoint(ROOT / "checkpoints" / "hybrid-dat.pt"))
    assert not dat.recorded and dat.step == 4500 and dat.gates == (1.0, 1.0)
    assert dat.lr == pytest.approx(2e-4) and dat.batch_seed == 4500 and dat.batch_size == 64
    early = step_state(load_checkpoint(ROOT / "checkpoints" / "trajectories" / "hybrid-dat" / "step_000000.pt"))
    assert early.gates == (0.0, 0.0) and early.lr == pytest.approx(2e-3 / 200)
    assert step_state(load_checkpoint(ROOT / "checkpoints" / "lstm.pt")).gates == ()


def test_analyses_read_the_gate_lr_and_draw_from_the_record(tmp_path, monkeypatch):
    """The record wins over the configs: a tampered record is what the analyses use."""
    cfg = TrainConfig(steps=4, batch_size=4, eval_every=4, eval_samples=4, ckpt_every=4, traj_every=4, warmup=1)
    train(MODEL, TASK, cfg, tmp_path, progress=False)
    ckpt = load_checkpoint(tmp_path / "final.pt")
    ckpt.extra[KEY]["gates"] = [0.25, 0.75]
    ckpt.extra[KEY]["lr"] = 0.125
    save_checkpoint(tmp_path / "tampered.pt", ckpt)
    tampered = load_checkpoint(tmp_path / "tampered.pt")
    assert schedule_gate(tampered) == [0.25, 0.75]

    from probe.gradients import analysis

    seen = {}

    class Called(Exception):
        pass

    def measure(model, task, moments, cfg, seed, device, train_lr=None, draw=None, progress=False):
        seen.update(gates=model.attention_gates(), lr=train_lr, draw=draw)
        raise Called  # enough: the lookahead was called with what the record says

    monkeypatch.setattr(analysis, "measure_beyond_range", measure)
    with pytest.raises(Called):
        analysis.analyze_checkpoint(tampered, lengths=[6], batch_size=4)
    assert seen == {"gates": [0.25, 0.75], "lr": 0.125, "draw": training_batch}
    tampered.extra[KEY]["batch"]["draw"] = "a-later-draw"
    with pytest.raises(ProbeError, match="drawn by 'a-later-draw', which this probe does not know"):
        analysis.analyze_checkpoint(tampered, lengths=[6], batch_size=4)


def test_the_lookaheads_draw_training_batches_with_the_trainer_s_function():
    from probe.gradients import beyond, inputs, lookahead

    assert lookahead.training_batch is beyond.training_batch is training_batch
    assert not hasattr(inputs, "training_batch"), "one function for the draw, imported, never copied"


# --- time -------------------------------------------------------------------------------------------------------
class _Clock:
    """A perf_counter that moves one second per reading, so that every stretch of training takes a known time."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def test_a_resumed_run_s_time_includes_what_it_trained_before_the_interrupt(tmp_path, monkeypatch):
    from probe.results import _read_log, _wall_s
    from probe.training.trainer import Trainer

    monkeypatch.setattr(probe.training.trainer, "time", _Clock())
    cfg = TrainConfig(steps=12, batch_size=4, eval_every=4, eval_samples=4, ckpt_every=12, traj_every=12, warmup=1)
    first = Trainer(MODEL, TASK, cfg, tmp_path, progress=False)
    first.run(until=6)  # as an interrupt at step 6 leaves it: last.pt at step 6, the last log line at step 4
    logged = _read_log(tmp_path)[-1]["elapsed_s"]
    at_interrupt = load_checkpoint(tmp_path / "last.pt").extra["elapsed_s"]
    assert at_interrupt > logged > 0  # steps 4 to 6 are counted too
    second = Trainer(MODEL, TASK, cfg, tmp_path, progress=False)
    assert second.resume()
    final = second.run()
    # the whole run: what it trained up to the interrupt and what it trained after, in the log and the checkpoint
    assert final.metrics["elapsed_s"] > at_interrupt
    assert _wall_s(_read_log(tmp_path)) == pytest.approx(final.metrics["elapsed_s"], abs=0.1)
    assert load_checkpoint(tmp_path / "final.pt").extra["elapsed_s"] >= final.metrics["elapsed_s"]


# --- settings that cannot fit, and a run that ends at chance ---------------------------------------------------
def test_a_warm_up_that_cannot_fit_warns_in_one_line_before_training(tmp_path, capsys):
    # a preset's 200 warm-up steps in a 30-step DAT run: the learning rate is still rising at the switch
    cfg = TrainConfig(steps=30, batch_size=4, eval_every=30, eval_samples=4, warmup=200, ckpt_every=30,
                      traj_every=30, schedule=ScheduleConfig(variant="dat", switch=At(fraction=4 / 9)))
    train(MODEL, TASK, cfg, tmp_path / "short", progress=False)
    lines = capsys.readouterr().err.strip().splitlines()
    first = lines[0]
    assert first.startswith("warning:") and "train.warmup=200" in first and "before the warm-up ends" in first
    assert "train.warmup=3" in first  # the fix, sized to the run
    # the same run ends near chance in range, and says so as its last word
    assert lines[-1].startswith("warning: the run ends near chance in range") and "chance 10.0 %" in lines[-1]
    fitting = TrainConfig(steps=30, batch_size=4, eval_every=30, eval_samples=4, warmup=3, ckpt_every=30,
                          traj_every=30, schedule=ScheduleConfig(variant="dat", switch=At(fraction=4 / 9)))
    train(MODEL, TASK, fitting, tmp_path / "fits", progress=False)
    assert "may end near chance" not in capsys.readouterr().err  # no warning before training


def test_the_chance_warning_names_the_subtasks_near_chance_only():
    from probe.training.trainer import chance_warning

    assert chance_warning({"state_acc_1x": 0.144, "recall_acc_1x": 0.080}, TASK).count("chance") == 3
    assert "recall" not in chance_warning({"state_acc_1x": 0.144, "recall_acc_1x": 0.9}, TASK)
    assert chance_warning({"state_acc_1x": 0.95, "recall_acc_1x": 0.247}, TASK) is None  # the shipped LSTM's recall
