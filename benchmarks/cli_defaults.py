"""Time every analysis command's default run on a shipped checkpoint, on one thread, beside a plain forward+backward.

Usage: ``python benchmarks/cli_defaults.py [--group default options long] [--only NAME ...]``. Each command runs as
a user runs it (``python -m probe.NAME ckpt --threads 1 --no-progress --json``, imports included) in a process of
its own; the table gives its wall time, its CPU time (user + system of that process: what one free core would take,
also on a busy machine), and the CPU time in units of one forward+backward pass of the same model (64 sequences of
length 3 x L_train, one thread), a ratio that holds across machines and loads. ``default`` (the default group) is
every command as it starts; ``options`` the opt-in flags whose cost ``--help`` quotes; ``long`` the runs that take
many minutes (every length to 16x, a retrain). The docs quote the figures this prints, with the machine it names.
The sweep trains in worker processes of a process server whose CPU time the parent may not collect: read its wall
time, and its run's log line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "checkpoints"
BUDGET_S = 30.0
"""A default run should answer within this on one idle core (issue 35): judged on CPU time."""
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    args: list[str]
    reference: str  # the checkpoint whose forward+backward is the unit
    log: str | None = None  # a log the command writes under tmp, whose "evaluated" line is printed beside its row

    def command(self, tmp: Path) -> list[str]:
        return [sys.executable, "-m", *[a.format(ckpt=CKPT, tmp=tmp) for a in self.args]]


def _analysis(name: str, module: str, ckpt: str, *extra: str, group: str = "default") -> Case:
    return Case(name, group, [f"probe.{module}", f"{{ckpt}}/{ckpt}.pt", *extra, "--threads", "1", "--no-progress",
                              "--json"], ckpt)


CASES = [
    _analysis("evaluate", "evaluate", "hybrid-joint"),
    _analysis("gradients", "gradients", "hybrid-joint"),
    _analysis("gradients --no-lookahead", "gradients", "hybrid-joint", "--no-lookahead"),
    _analysis("attributions", "attributions", "hybrid-joint"),
    _analysis("probes", "probes", "hybrid-dat"),
    _analysis("shortcuts", "shortcuts", "hybrid-joint"),
    _analysis("sharpness", "sharpness", "hybrid-dat"),
    Case("transitions", "default", ["probe.transitions", "{tmp}/hybrid-ssm-complex-dat.pt", "--threads", "1",
                                    "--no-progress", "--json"], "hybrid-dat"),
    _analysis("evaluate --every-length", "evaluate", "hybrid-joint", "--every-length", group="options"),
    _analysis("gradients --full-lookahead", "gradients", "hybrid-joint", "--full-lookahead", group="options"),
    _analysis("attributions --ig", "attributions", "hybrid-joint", "--ig", group="options"),
    *(Case(name, "options", ["probe.gradients", "{tmp}/realstep/trajectory/step_000040.pt", *extra, "--threads", "1",
                             "--no-progress", "--json"], "hybrid-joint")
      for name, extra in (("gradients, snapshot with AdamW's state", []),
                          ("gradients --real-step", ["--real-step"]),
                          ("gradients --real-step --rollout 50", ["--real-step", "--rollout", "50"]))),
    _analysis("probes --full", "probes", "hybrid-dat", "--full", group="options"),
    Case("sweep smoke test (lstm, 12 steps, --quick)", "options",
         ["probe.sweep", "--preset", "lstm", "--seeds", "0", "--steps", "12", "--quick", "--out", "{tmp}/smoke",
          "--no-progress"], "hybrid-joint", log="smoke/*/seed0/train.log"),
    _analysis("evaluate, the sweep's 16x (1:100,125:400:25)", "evaluate", "hybrid-joint", "--lengths",
              "1:100,125:400:25", group="long"),
    _analysis("evaluate --lengths 1:400", "evaluate", "hybrid-joint", "--lengths", "1:400", group="long"),
    Case("retrain hybrid-joint", "long", ["probe.retrain", "{ckpt}/hybrid-joint.pt", "--out", "{tmp}/retrain",
                                          "--threads", "1", "--no-progress"], "hybrid-joint"),
]


def forward_backward_seconds(name: str, repeats: int = 5) -> float:
    """Median CPU seconds of one forward+backward pass of checkpoint ``name`` (64 x 3 L_train, one thread): CPU time,
    as the commands' column, so that a busy machine slows neither."""
    from probe.checkpoint import load_checkpoint

    ckpt = load_checkpoint(CKPT / f"{name}.pt")
    model, task = ckpt.build_model("cpu"), ckpt.task_config
    batch = task.sample(3 * task.train_length, 64, 0)
    times = []
    for _ in range(repeats + 1):  # the first pass warms up
        model.zero_grad(set_to_none=True)
        t0 = time.process_time()
        model(batch.tokens, labels=batch.labels).backward()
        times.append(time.process_time() - t0)
    return statistics.median(times[1:])


def ssm_checkpoint(folder: Path) -> Path:
    """A randomly initialised SSM hybrid of the ``hybrid-ssm-complex-dat`` preset's size (none is shipped; the
    transitions' cost does not depend on the weights)."""
    from probe.checkpoint import checkpoint_from_model, save_checkpoint
    from probe.models import HookedSequenceModel
    from probe.train import build_configs

    model_cfg, task, train_cfg = build_configs("hybrid-ssm-complex-dat")
    torch.manual_seed(0)
    return save_checkpoint(folder / "hybrid-ssm-complex-dat.pt", checkpoint_from_model(
        HookedSequenceModel(model_cfg), task, train_config=train_cfg.to_dict()))


def realstep_snapshot(folder: Path) -> Path:
    """A snapshot that holds AdamW's state, of the hybrid-joint preset's size, written as study/sweeps/realstep.toml
    writes them (none is shipped): 60 steps with a snapshot every 20; the real step's cost does not depend on how far
    the run got."""
    from probe.train import build_configs, train

    model_cfg, task, train_cfg = build_configs(
        "hybrid-joint", overrides=["train.steps=60", "train.traj_every=20", "train.traj_optimizer=true",
                                   "train.traj_dtype=float32", "train.precision=auto", "train.optimizer_impl=fused",
                                   "train.eval_every=1000", "train.eval_samples=8"])
    train(model_cfg, task, train_cfg, folder / "realstep", progress=False)
    return folder / "realstep" / "trajectory" / "step_000040.pt"


def with_threads(case: Case, threads: int | None) -> Case:
    """The case at ``--threads threads``, or (None) as a user runs it: no ``--threads``, no thread variables."""
    args, i = list(case.args), case.args.index("--threads") if "--threads" in case.args else -1
    if i >= 0:
        del args[i:i + 2]
    return dataclasses.replace(case, args=args if threads is None else [*args, "--threads", str(threads)])


def run(case: Case, tmp: Path, env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system of the child) and exit code of one case."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(case.command(tmp), cwd=ROOT, env={**os.environ, **(ONE_THREAD if env is None else env)},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        print(f"  {case.name} exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), done.returncode


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}"


@contextlib.contextmanager
def training_beside(tmp: Path, on: bool):
    """A training run of the hybrid-joint preset at torch's default threads in the background (a user's other work),
    stopped on exit; nothing when ``on`` is False."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-m", "probe.train", "--preset", "hybrid-joint", "--steps", "1000000",
                             "--out", str(tmp / "beside"), "--no-progress"], cwd=ROOT, env={**os.environ},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(20)  # past its start-up, into the steps
        yield
    finally:
        proc.terminate()
        proc.wait()


def compare_threads(cases: list[Case], tmp: Path, beside: bool, repeats: int) -> bool:
    """Each command as a user runs it (its default --threads) against --threads 1 and 2: the median wall seconds of
    ``repeats`` rounds, each round running the three settings in a rotated order (so that a burst of other work
    lands on each setting alike), and the default's median over one thread's. The default should be no slower than
    one thread: def/1 <= 1.10. Returns whether every command meets that."""
    print(f"\n{'command (--no-progress --json), ' + ('beside a training run' if beside else 'no other work'):<60} "
          f"{'default':>8} {'1 thr':>7} {'2 thr':>7} {'def/1':>6} {'rounds':>11} {'load':>5}   (median of {repeats}, "
          "interleaved; rounds: the lowest and highest def/1 of a single round, the noise between two runs of one "
          "setting)")
    ok = True
    with training_beside(tmp, beside):
        for case in cases:
            settings = (None, 1, 2)
            walls: dict[int | None, list[float]] = {t: [] for t in settings}
            for r in range(repeats):
                for t in settings[r % 3:] + settings[:r % 3]:
                    walls[t].append(run(with_threads(case, t), tmp, env={"MPLBACKEND": "Agg"})[0])
            med = {t: statistics.median(w) for t, w in walls.items()}
            ratio = med[None] / med[1]
            rounds = [d / o for d, o in zip(walls[None], walls[1], strict=True)]
            ok &= ratio <= 1.10
            print(f"{case.name:<60} {med[None]:8.1f} {med[1]:7.1f} {med[2]:7.1f} {ratio:6.2f} "
                  f"{min(rounds):5.2f}-{max(rounds):<5.2f} {os.getloadavg()[0]:5.1f}", flush=True)
    print(f"every default within 10 % of --threads 1 ({'beside a training run' if beside else 'no other work'}): "
          f"{'yes' if ok else 'no'}")
    return ok


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", nargs="+", default=["default"], choices=["default", "options", "long"])
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="cases whose name starts so")
    parser.add_argument("--threads", choices=["idle", "beside", "both"], default=None,
                        help="instead of the CPU table: each command at its default --threads, 1 and 2, with no other "
                             "work started (idle: run it on an idle machine) and/or beside a training run")
    parser.add_argument("--repeats", type=int, default=3, help="with --threads: rounds per command (median; default 3)")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if c.group in args.group and (not args.only or any(c.name.startswith(o)
                                                                                  for o in args.only))]
    torch.set_num_threads(1)
    print(f"machine: {machine()}")
    if args.threads:
        print(f"load average at start: {os.getloadavg()[0]:.1f}")
        with tempfile.TemporaryDirectory() as folder:
            tmp = Path(folder)
            if any(c.name == "transitions" for c in cases):
                ssm_checkpoint(tmp)
            ok = [compare_threads(cases, tmp, beside, args.repeats)
                  for beside in {"idle": [False], "beside": [True], "both": [False, True]}[args.threads]]
        return 0 if all(ok) else 1
    print(f"load average at start: {os.getloadavg()[0]:.1f} (above 0: other work shares the cores, so wall times "
          "are slow; CPU times and ratios hold)")
    units = {name: forward_backward_seconds(name) for name in dict.fromkeys(c.reference for c in cases)}
    print("plain forward+backward, 64 sequences x 3 L_train, 1 thread, CPU time: "
          + ", ".join(f"{n} {s:.3f} s" for n, s in units.items()))
    print(f"\n{'command (one thread, --no-progress --json)':<48} {'wall s':>7} {'cpu s':>7} {'x fwd+bwd':>9} "
          f"{'load':>5}  budget")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        if any(c.name == "transitions" for c in cases):
            ssm_checkpoint(tmp)
        if any("{tmp}/realstep" in " ".join(c.args) for c in cases):
            realstep_snapshot(tmp)
        for case in cases:
            wall, cpu, code = run(case, tmp)
            budget = "" if case.group != "default" else "ok" if cpu <= BUDGET_S else f"OVER {BUDGET_S:.0f} s"
            print(f"{case.name:<48} {wall:7.1f} {cpu:7.1f} {cpu / units[case.reference]:9.0f} "
                  f"{os.getloadavg()[0]:5.1f}  {budget if code == 0 else f'exit {code}'}", flush=True)
            for log in sorted(tmp.glob(case.log)) if case.log else []:
                lines = [line for line in log.read_text().splitlines() if line.startswith("evaluated")]
                print(f"  its log: {lines[-1] if lines else 'no evaluated line'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
