"""Runs a probe command with a fault injected, for tests/test_faults.py: ``python tests/fault_driver.py FAULT MODULE
ARGS...``; FAULT is slow-train, slow-evaluate, slow-report or kill-in-save, markers go to $FAULT_MARKS."""

from __future__ import annotations

import functools
import io
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

AT = 20  # a slowed run is slow from this step on, and says so with a marker file; kill-in-save kills at it
_patched: set[str] = set()


def mark(name: str) -> None:
    Path(os.environ["FAULT_MARKS"], name).write_text(str(os.getpid()))


def slow_training() -> None:
    """Every step from AT on takes 0.2 s more: a window in which the test's signal lands mid-training."""
    import probe.training.trainer as trainer

    real = trainer.Trainer.train_step

    def step(self: Any, n: int) -> tuple[float, float]:
        out = real(self, n)
        if n + 1 >= AT:
            mark(f"training-{self.out.parent.name}-{self.out.name}")
            time.sleep(0.2)
        return out

    trainer.Trainer.train_step = step


def slow_evaluation() -> None:
    """The final evaluation waits 2 minutes before it starts: the signal lands in it."""
    import probe.sweep.worker as worker

    real = worker.evaluate_run

    def evaluate(run: Any, opts: Any) -> Path:
        mark(f"evaluating-{run.variant}-seed{run.seed}")
        time.sleep(120)
        return real(run, opts)

    worker.evaluate_run = evaluate


def faulty_worker(run: Any, opts: Any) -> Any:
    """``execute_run`` in a pool worker, with this process's fault patched in once."""
    from probe.sweep.worker import execute_run

    fault = os.environ["FAULT"]
    if fault not in _patched:
        _patched.add(fault)
        {"slow-train": slow_training, "slow-evaluate": slow_evaluation}.get(fault, lambda: None)()
    return execute_run(run, opts)


def slow_report() -> None:
    import probe.sweep.cli as cli

    real = cli.write_report

    def write(*args: Any, **kwargs: Any) -> Any:
        mark("reporting")
        time.sleep(120)
        return real(*args, **kwargs)

    cli.write_report = write


def kill_in_save() -> None:
    """SIGKILL this process half-way through writing the last.pt of step AT (its temporary file half written)."""
    import torch

    real = torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(obj, dict) and obj.get("optimizer_state") is not None and obj.get("step") == AT:
            buf = io.BytesIO()
            real(obj, buf, *args, **kwargs)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            f.flush()
            os.fsync(f.fileno())
            mark("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        real(obj, f, *args, **kwargs)

    torch.save = save


def main(argv: list[str]) -> int:
    fault, module, *args = argv
    os.environ["FAULT"] = fault
    if fault == "kill-in-save":
        kill_in_save()
    if module == "probe.sweep":
        # pool workers unpickle the worker function by its module's name: this file, importable as fault_driver
        import fault_driver

        import probe.sweep.cli as cli

        if "ray" in args:  # Ray's workers cannot import this file: ship its functions by value
            import ray

            ray.cloudpickle.register_pickle_by_value(fault_driver)
        cli.run_sweep = functools.partial(cli.run_sweep, worker=fault_driver.faulty_worker)
        if fault == "slow-report":
            slow_report()
        return cli.main(args)
    from probe.training.cli import main as train_main

    return train_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
