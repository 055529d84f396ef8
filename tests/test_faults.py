"""Faults that could lose data: interrupts (SIGINT, SIGTERM; to the process group or the parent alone), a kill during
a checkpoint write, a full disk, a damaged checkpoint, and two writers on one folder. Each test says what is left,
and that the rerun ends where an uninterrupted run does."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from probe.checkpoint import load_checkpoint
from probe.core import interrupts
from probe.core.lock import LOCK, FolderLocked, folder_lock, read_owner
from probe.sweep import config_from_presets
from probe.sweep.cli import main as sweep_main
from probe.sweep.worker import RunOptions, execute_run
from probe.training.cli import main as train_main
from probe.training.overrides import build_configs
from probe.training.trainer import train

DRIVER = Path(__file__).parent / "fault_driver.py"
# checkpoints only at the end (ckpt_every beyond the run): whatever last.pt an interrupt leaves, the stop wrote it
TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "task.train_length=6", "train.batch_size=8",
        "train.eval_every=10", "train.ckpt_every=1000", "train.traj_every=1000", "train.eval_samples=16",
        "train.warmup=5"]
SETS = [a for s in TINY for a in ("--set", s)]
STEPS = 60
SWEEP = ["--preset", "lstm", "--seeds", "0", "1", "--steps", str(STEPS), *SETS, "--jobs", "2", "--no-progress",
         "--no-figure", "--eval-samples", "16", "--eval-lengths", "coarse"]
TRAIN = ["--preset", "lstm", "--steps", "40", *SETS, "--set", "train.ckpt_every=10", "--no-progress",
         "--device", "cpu"]
RUNS = ("lstm/seed0", "lstm/seed1")
AT = 20  # tests/fault_driver.py slows training from this step, and kills a trainer in the write of its last.pt


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_checkpoint(a).state_dict, load_checkpoint(b).state_dict
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def eval_rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "checkpoint"}
            for r in json.loads((run / "eval.json").read_text())["results"]]


def assert_same_sweep(done: Path, base: Path) -> None:
    """The runs' weights, evaluations and the report are those of the uninterrupted sweep."""
    for key in RUNS:
        assert same_weights(done / key / "final.pt", base / key / "final.pt"), key
        assert eval_rows(done / key) == eval_rows(base / key), key
    assert (done / "results.json").read_text() == (base / "results.json").read_text()
    assert not list(done.rglob(LOCK)) and not list(done.rglob(".*.tmp")), "a lock or a temporary file is left"


@pytest.fixture(scope="module")
def base_sweep(tmp_path_factory) -> Path:
    """The two-run sweep, uninterrupted."""
    out = tmp_path_factory.mktemp("base")
    assert sweep_main([*SWEEP, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """One training run, uninterrupted."""
    out = tmp_path_factory.mktemp("train") / "run"
    assert train_main([*TRAIN, "--out", str(out)]) == 0
    return out


# --- the lock ----------------------------------------------------------------------------------------------------
def test_a_second_writer_is_refused_in_one_line_that_names_the_owner(tmp_path):
    with folder_lock(tmp_path, "train") as held:
        owner = read_owner(held.path)
        assert owner.pid == os.getpid() and owner.host == socket.gethostname() and owner.what == "train"
        with folder_lock(tmp_path, "again"):  # the same process again (a sweep worker, then its trainer)
            pass
        assert (tmp_path / LOCK).exists()
        # another process: the kernel's lock, not the record, decides
        code = f"from probe.core.lock import folder_lock\nwith folder_lock({str(tmp_path)!r}, 'x'): pass"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        last = done.stderr.strip().splitlines()[-1]
        assert "FolderLocked" in last and f"pid {os.getpid()} on {socket.gethostname()} (train, since " in last
    assert not (tmp_path / LOCK).exists(), "the lock file is removed on release"


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {"pid": int(dead.stdout), "host": socket.gethostname(), "what": "train", "since": time.time() - 60}
    (tmp_path / LOCK).write_text(json.dumps(record))  # what a SIGKILLed owner leaves
    with folder_lock(tmp_path, "sweep") as held:
        assert held.took_over.pid == record["pid"] and read_owner(held.path).pid == os.getpid()


def test_without_flock_a_live_owner_is_refused_and_a_dead_one_taken_over(tmp_path, monkeypatch):
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)  # a network filesystem without flock
    alive = {"pid": os.getppid(), "host": socket.gethostname(), "what": "sweep", "since": time.time()}
    (tmp_path / LOCK).write_text(json.dumps(alive))
    with pytest.raises(FolderLocked, match=f"pid {os.getppid()} on "):
        with folder_lock(tmp_path, "train"):
            pass
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / LOCK).write_text(json.dumps(alive | {"pid": int(dead.stdout)}))
    with folder_lock(tmp_path, "train") as held:
        assert held.took_over.pid == int(dead.stdout)
    assert not (tmp_path / LOCK).exists()


# --- interrupts, in-process ----------------------------------------------------------------------------------------
def test_a_signal_is_recorded_where_deferred_and_raised_elsewhere_and_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.handling():
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            assert interrupts.requested() == "SIGTERM"
            with pytest.raises(interrupts.Interrupted):  # a second one: the user insists
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is before and interrupts.requested() is None
    with interrupts.handling(), pytest.raises(interrupts.Interrupted):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)


def signal_at(monkeypatch, step: int, sig: int = signal.SIGINT) -> None:
    """SIGINT to this process in the middle of training step ``step``."""
    import probe.training.trainer as trainer

    real = trainer.Trainer.train_step

    def train_step(self, n):
        if n == step:
            os.kill(os.getpid(), sig)
        return real(self, n)

    monkeypatch.setattr(trainer.Trainer, "train_step", train_step)


def test_train_interrupted_keeps_last_pt_whatever_ckpt_every_and_resumes_to_the_same_run(tmp_path, monkeypatch,
                                                                                       capsys, base_run):
    out = tmp_path / "run"
    signal_at(monkeypatch, 17)
    assert train_main([*TRAIN, "--set", "train.ckpt_every=1000", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("interrupted (SIGINT): kept ")
    assert f"at step 18 of 40; resume with: python -m probe.train --resume --out {out} --device cpu" in err
    assert load_checkpoint(out / "last.pt").step == 18 and not (out / "final.pt").exists()
    assert not (out / LOCK).exists()
    monkeypatch.undo()
    assert train_main(["--resume", "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    # ckpt_every does not change the run's steps, only where it checkpoints: the run is the uninterrupted one
    assert same_weights(out / "final.pt", base_run / "final.pt")


def test_a_full_disk_during_a_checkpoint_write_keeps_the_last_good_one_and_says_so(tmp_path, monkeypatch, capsys,
                                                                                    base_run):
    real = torch.save

    class Full(io.BufferedWriter):
        """A file on a disk that fills up after 1000 bytes."""

        written = 0

        def write(self, b):
            self.written += len(b)
            if self.written > 1000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(b)

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("optimizer_state") is not None and obj.get("step") == 20:
            return real(obj, Full(io.FileIO(f.fileno(), "wb", closefd=False)), *args, **kwargs)
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    out = tmp_path / "run"
    assert train_main([*TRAIN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "last.pt: cannot write it (No space left on device); the file is as it was" in err
    assert load_checkpoint(out / "last.pt").step == 10, "the last good checkpoint is kept, whole"
    assert not list(out.glob(".*.tmp")) and not (out / LOCK).exists()
    monkeypatch.undo()
    assert train_main(["--resume", "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    assert same_weights(out / "final.pt", base_run / "final.pt")


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the weights, which torch itself would read without a word
    path.write_bytes(bytes(data))


def test_a_checkpoint_damaged_between_runs_is_refused_in_one_line_never_used(tmp_path, capsys, base_run):
    out = tmp_path / "run"
    model_cfg, task_cfg, train_cfg = build_configs("lstm", "interleaved", TINY + ["train.ckpt_every=10"], steps=40,
                                                   seed=0)
    train(model_cfg, task_cfg, train_cfg, out, "cpu", progress=False, until=20)
    flip_a_byte(out / "last.pt")
    assert train_main(["--resume", "--out", str(out), "--no-progress", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "last.pt: damaged torch file" in err and "checksum" in err
    assert not (out / "final.pt").exists()
    shutil.rmtree(out)
    assert train_main([*TRAIN, "--out", str(out)]) == 0  # retrained: the uninterrupted run
    assert same_weights(out / "final.pt", base_run / "final.pt")

    # a sweep's run: a damaged last.pt is refused with what to do, a damaged final.pt is never reused
    cfg = config_from_presets(["lstm"], [0]).with_command_line(None, 20, TINY + ["train.ckpt_every=10"])
    (run,) = cfg.runs(tmp_path / "sweep")
    opts = RunOptions(eval_samples=16, eval_lengths="coarse")
    assert execute_run(run, opts).status == "trained"
    reference = load_checkpoint(run.out / "final.pt")
    shutil.copy(run.out / "last.pt", tmp_path / "good-last.pt")
    for name in ("final.pt", "eval.json"):
        (run.out / name).unlink()
    flip_a_byte(run.out / "last.pt")
    result = execute_run(run, opts)
    assert result.status == "failed" and "damaged torch file" in result.error
    assert f"to train this run again from step 0, delete {run.out / 'last.pt'}" in result.error
    (run.out / "last.pt").unlink()
    assert execute_run(run, opts).status == "trained"  # retrained from step 0: the same run
    assert all(torch.equal(v, load_checkpoint(run.out / "final.pt").state_dict[k])
               for k, v in reference.state_dict.items())
    flip_a_byte(run.out / "final.pt")
    result = execute_run(run, opts)
    assert result.status == "failed" and "final.pt: damaged torch file" in result.error


# --- processes: a kill in a write, interrupts of a sweep in each phase, two sweeps ---------------------------------
def start(fault: str, module: str, args: list[str], marks: Path) -> subprocess.Popen:
    """``python tests/fault_driver.py`` in its own process group, as a terminal would start it."""
    marks.mkdir(exist_ok=True)
    env = {**os.environ, "FAULT_MARKS": str(marks), "MPLBACKEND": "Agg"}
    return subprocess.Popen([sys.executable, str(DRIVER), fault, module, *args], start_new_session=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(paths: list[Path], proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if proc.poll() is not None:
            raise AssertionError(f"ended before the fault ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, f"no {[p.name for p in paths]} after {timeout} s"
        time.sleep(0.05)


def live_processes(group: int) -> list[str]:
    """The processes of a process group that still run (zombies, already ended, are not counted)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(stat.parent.name)
    return found


def interrupt(proc: subprocess.Popen, sig: int, whole_group: bool) -> tuple[float, str, str]:
    """Send ``sig`` to the group (a terminal's Ctrl-C) or the parent alone (a scheduler); the seconds to its exit,
    its stdout and stderr. No process of the group may outlive it by more than the interpreter's own exit."""
    t0 = time.monotonic()
    (os.killpg if whole_group else os.kill)(proc.pid, sig)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t0
    print(f"{signal.Signals(sig).name} to the {'group' if whole_group else 'parent'}: exit {proc.returncode} "
          f"{took:.1f} s later")  # the figure to quote (pytest -s)
    deadline = time.monotonic() + 15  # the pool's fork server exits when it sees its parent gone
    while live_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:100]
            for pid in live_processes(proc.pid)}
    assert not left, f"left running: {left}; the command ended {proc.returncode}: {err[-3000:]}"
    return took, out, err


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_resumes_from_the_last_good_one(tmp_path, capsys, base_run):
    out = tmp_path / "run"
    proc = start("kill-in-save", "probe.train", [*TRAIN, "--out", str(out)], tmp_path / "marks")
    proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL and (tmp_path / "marks" / "killed").exists()
    assert load_checkpoint(out / "last.pt").step == 10, "last.pt is the checkpoint before the torn write"
    assert len(list(out.glob(".last.pt.*.tmp"))) == 1, "the torn write is a temporary file, not last.pt"
    assert read_owner(out / LOCK).pid == proc.pid  # the killed trainer could not clear its lock
    assert train_main(["--resume", "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    assert f"took over the lock of pid {proc.pid}" in capsys.readouterr().err
    assert not list(out.glob(".*.tmp")) and not (out / LOCK).exists()
    assert same_weights(out / "final.pt", base_run / "final.pt")


@pytest.mark.slow
@pytest.mark.parametrize("whole_group", [True, False], ids=["ctrl-c-to-the-group", "sigint-to-the-parent"])
def test_sigint_during_training_stops_every_worker_keeps_last_pt_and_resumes_to_the_same_sweep(
        tmp_path, whole_group, base_sweep):
    out = tmp_path / "sweep"
    proc = start("slow-train", "probe.sweep", [*SWEEP, "--out", str(out)], tmp_path / "marks")
    wait_for([tmp_path / "marks" / f"training-{k.replace('/', '-')}" for k in RUNS], proc)
    took, stdout, stderr = interrupt(proc, signal.SIGINT, whole_group)
    assert proc.returncode == 130 and stdout == ""
    line = one_line(stderr)
    assert line.startswith(f"interrupted (SIGINT): of 2 runs in {out}, 2 with last.pt (lstm/seed0 at step ")
    assert line.endswith("resume with: python -m probe.sweep " + " ".join([*SWEEP, "--out", str(out)]))
    assert took < 15, f"{took:.1f} s from SIGINT to exit"
    for key in RUNS:
        step = load_checkpoint(out / key / "last.pt").step
        assert AT <= step < STEPS and not (out / key / "final.pt").exists()
        assert "interrupted while training" in (out / key / "train.log").read_text()
    assert sweep_main([*SWEEP, "--out", str(out)]) == 0
    assert_same_sweep(out, base_sweep)


@pytest.mark.slow
def test_sigint_during_evaluation_keeps_final_pt_and_the_rerun_evaluates_it(tmp_path, base_sweep):
    out = tmp_path / "sweep"
    proc = start("slow-evaluate", "probe.sweep", [*SWEEP, "--out", str(out)], tmp_path / "marks")
    wait_for([tmp_path / "marks" / f"evaluating-{k.replace('/', '-')}" for k in RUNS], proc)
    took, stdout, stderr = interrupt(proc, signal.SIGINT, whole_group=True)
    assert proc.returncode == 130 and "2 trained and not yet evaluated" in one_line(stderr)
    for key in RUNS:
        assert (out / key / "final.pt").exists() and not (out / key / "eval.json").exists()
    assert sweep_main([*SWEEP, "--out", str(out)]) == 0
    assert_same_sweep(out, base_sweep)


@pytest.mark.slow
def test_sigterm_while_writing_the_report_leaves_no_torn_file_and_the_rerun_writes_it(tmp_path, base_sweep):
    out = tmp_path / "sweep"
    proc = start("slow-report", "probe.sweep", [*SWEEP, "--out", str(out)], tmp_path / "marks")
    wait_for([tmp_path / "marks" / "reporting"], proc)
    took, stdout, stderr = interrupt(proc, signal.SIGTERM, whole_group=False)
    assert proc.returncode == 130 and "Traceback" not in stderr
    last = stderr.splitlines()[-1]  # after the sweep's own summary line
    assert last.startswith(f"interrupted (SIGTERM): while writing the report into {out} (of 2 runs in {out}, 2 "
                           "finished)")
    assert not (out / "results.json").exists() and not list(out.glob(".*.tmp"))
    assert sweep_main([*SWEEP, "--out", str(out)]) == 0
    assert_same_sweep(out, base_sweep)


@pytest.mark.slow
def test_a_second_sweep_on_the_same_folder_is_refused_and_writes_nothing(tmp_path, capsys, base_sweep):
    out = tmp_path / "sweep"
    proc = start("slow-train", "probe.sweep", [*SWEEP, "--out", str(out)], tmp_path / "marks")
    wait_for([tmp_path / "marks" / f"training-{k.replace('/', '-')}" for k in RUNS], proc)
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in out.rglob("*") if p.is_file()}
    assert sweep_main([*SWEEP, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"is being written by pid {proc.pid} on {socket.gethostname()} (sweep, " in err
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in out.rglob("*") if p.is_file()}
    assert {p: v for p, v in after.items() if p.name == "sweep.json"} == {
        p: v for p, v in before.items() if p.name == "sweep.json"}
    for key in RUNS:
        assert (out / key / "train.log").read_text().count("=== ") == 1, "one writer started each run"
    # a scheduler's SIGTERM to the whole group: the same orderly stop
    took, stdout, stderr = interrupt(proc, signal.SIGTERM, whole_group=True)
    assert proc.returncode == 130 and one_line(stderr).startswith("interrupted (SIGTERM): of 2 runs")
    assert sweep_main([*SWEEP, "--out", str(out)]) == 0
    assert_same_sweep(out, base_sweep)


@pytest.mark.slow
def test_ray_sweep_interrupted_cancels_its_tasks_which_keep_last_pt(tmp_path, base_sweep):
    pytest.importorskip("ray")  # an optional extra
    out = tmp_path / "sweep"
    args = [*SWEEP, "--out", str(out), "--executor", "ray"]
    proc = start("slow-train", "probe.sweep", args, tmp_path / "marks")
    wait_for([tmp_path / "marks" / f"training-{k.replace('/', '-')}" for k in RUNS], proc, timeout=300)
    took, stdout, stderr = interrupt(proc, signal.SIGINT, whole_group=False)
    assert proc.returncode == 130 and "Traceback" not in stderr
    assert stderr.splitlines()[-1].startswith(f"interrupted (SIGINT): of 2 runs in {out}, 2 with last.pt")
    assert took < 30, f"{took:.1f} s from SIGINT to exit"
    for key in RUNS:
        assert AT <= load_checkpoint(out / key / "last.pt").step < STEPS
    assert sweep_main([*SWEEP, "--out", str(out)]) == 0  # resumed on the local pool: the same runs
    assert_same_sweep(out, base_sweep)
