"""study/scripts/dense_lookahead.py: every snapshot measured once, cached, and a missing snapshot refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from probe.gradients import lookahead as LA
from probe.train import ScheduleConfig, TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]

SMALL = LA.LookaheadConfig(n_batches=6, batch_size=16, eval_batches=2, train_eval_batches=2)


@pytest.fixture(scope="module")
def trajectory(tmp_path_factory) -> Path:
    """The snapshots (steps 0, 20, 40) of a tiny joint hybrid."""
    from probe.models import ModelConfig
    from probe.tasks import make_task

    run = tmp_path_factory.mktemp("runs") / "joint"
    task = make_task("interleaved", train_length=8)
    model_cfg = ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=16, n_layers=2, n_heads=2)
    cfg = TrainConfig(steps=40, batch_size=16, eval_every=40, eval_samples=8, ckpt_every=40, traj_every=20, lr=3e-3,
                      warmup=5, schedule=ScheduleConfig())
    train(model_cfg, task, cfg, run, progress=False)
    return run / "trajectory"


@pytest.fixture(scope="module")
def D(study_scripts):
    return study_scripts("dense_lookahead")


@pytest.mark.slow  # trains a 40-step run (module fixture)
def test_dense_lookahead_script_writes_every_snapshot_once_and_refuses_a_missing_one(trajectory, D, tmp_path,
                                                                                     monkeypatch):
    folder, work, out = trajectory, tmp_path / "work", tmp_path / "out"
    objs = [D.measure(folder / f"step_{s:06d}.pt", work / f"{s}.json", lengths=[8], batch_size=16,
                      lookahead_cfg=SMALL) for s in (0, 20)]
    D.collect(objs, out)
    la, verdicts = pd.read_csv(out / "lookahead.csv"), pd.read_csv(out / "verdicts.csv")
    checks = pd.read_csv(out / "checks.csv")
    assert list(la.columns) == D.LOOKAHEAD_COLUMNS and sorted(verdicts.step) == [0, 20]
    assert set(la[la.loss == "state"].positions) == {">L", ">2L"}  # beyond-range targets only
    assert {"lookahead_first_order", "lookahead_positions", "lookahead_vs_random"} <= set(checks.control)
    assert set(checks.dropna(subset=["step"]).step) == {0, 20}

    def fail(*a, **k):
        raise AssertionError("a cached snapshot was measured again")

    monkeypatch.setattr(D, "analyze_checkpoint", fail)
    again = D.measure(folder / "step_000020.pt", work / "20.json")
    assert json.dumps(again, sort_keys=True) == json.dumps(objs[1], sort_keys=True)
    assert D.main([str(folder), "--steps", "0", "25", "--work", str(work), "--out", str(out)]) == 2


def _measure_in_worker(snap: Path, cache: Path) -> dict:
    """A stand-in for a snapshot's measurement: which process measured it, written to its cache."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    obj = {"snapshot": snap.name, "pid": os.getpid()}
    cache.write_text(json.dumps(obj))
    return obj


def test_snapshots_measured_in_worker_processes_are_all_collected_by_this_one(D, tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    written: list[int] = []
    objs: list[dict] = []

    def collect(collected: list[dict], out: Path) -> None:  # runs here, once per finished snapshot
        written.append(len(collected))
        objs[:] = collected
        out.mkdir(exist_ok=True)
        pd.DataFrame({"passed": [True] * len(collected)}).to_csv(out / "checks.csv", index=False)

    jobs = [(Path(f"step_{i:06d}.pt"), work / f"{i}.json") for i in range(6)]
    assert D.measure_snapshots(lambda: jobs, _measure_in_worker, collect, out, processes=2) == 0
    assert sorted(o["snapshot"] for o in objs) == sorted(s.name for s, _ in jobs)
    assert os.getpid() not in {o["pid"] for o in objs}  # measured in the pool, not here
    assert written == [1, 2, 3, 4, 5, 6] and all((work / f"{i}.json").is_file() for i in range(6))


def _fails_on_step_3(snap: Path, cache: Path) -> dict:
    if snap.name == "step_000003.pt":
        raise RuntimeError("a worker's snapshot failed")
    return _measure_in_worker(snap, cache)


def _dies_on_step_3(snap: Path, cache: Path) -> dict:
    if snap.name == "step_000003.pt":
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would
    return _measure_in_worker(snap, cache)


@pytest.mark.parametrize("measure_one, error", [(_fails_on_step_3, "a worker's snapshot failed"),
                                                (_dies_on_step_3, "terminated abruptly")])
def test_a_worker_that_fails_or_dies_ends_the_script_with_its_error_and_no_hang(D, tmp_path, measure_one, error):
    jobs = [(Path(f"step_{i:06d}.pt"), tmp_path / "work" / f"{i}.json") for i in range(6)]
    start = time.monotonic()
    with pytest.raises(Exception, match=error):
        D.measure_snapshots(lambda: jobs, measure_one, lambda objs, out: None, tmp_path / "out", processes=2)
    assert time.monotonic() - start < 60  # Pool.imap waited forever for a dead worker


def test_two_runs_that_would_share_a_cache_are_refused_and_one_named_twice_is_measured_once(D, tmp_path):
    for name in ("a", "b"):
        (tmp_path / name / "joint").mkdir(parents=True)
        (tmp_path / name / "joint" / "step_000000.pt").write_bytes(b"")
    snapshot, cache = (lambda f, step: f / f"step_{step:06d}.pt"), (lambda f, step: tmp_path / "w" / f.name / "0.json")
    once = D.snapshot_jobs([tmp_path / "a" / "joint"] * 2, [0], snapshot, cache, "")
    assert len(once) == 1
    with pytest.raises(D.ProbeError, match="would share the cache"):
        D.snapshot_jobs([tmp_path / "a" / "joint", tmp_path / "b" / "joint"], [0], snapshot, cache, "")


CTRL_C = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import dense_lookahead as D

def slow(snap, cache):
    time.sleep(30)
    cache.write_text("{}")
    return {}

if __name__ == "__main__":
    work = Path(sys.argv[2])
    jobs = [(Path(f"step_{i:06d}.pt"), work / f"{i}.json") for i in range(4)]
    print("started", flush=True)
    sys.exit(D.measure_snapshots(lambda: jobs, slow, lambda objs, out: None, work, processes=2))
"""


def test_ctrl_c_ends_every_worker_at_once_rather_than_after_their_snapshots(tmp_path):
    # four snapshots of 30 s on two workers is a minute of work; Ctrl-C (to the whole process group, as a terminal
    # sends it) must end it at once, not after each worker finishes the snapshot it holds and the one queued next.
    # Started with SIGINT ignored, as a shell starts a background job (the test process itself may have been started
    # so, and a child inherits it): the script must still stop on it
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    proc = subprocess.Popen([sys.executable, str(script), str(ROOT / "study" / "scripts"), str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdout.readline().strip() == "started"
    time.sleep(3)  # both workers inside their first snapshot
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert time.monotonic() - start < 20 and proc.returncode == 130 and "interrupted: 0 snapshots" in err
    assert not list(tmp_path.glob("*.json"))

