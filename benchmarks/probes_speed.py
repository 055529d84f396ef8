"""Time the default ``python -m probe.probes`` run on one checkpoint, on one core (budget: under 60 s).

Usage: ``python benchmarks/probes_speed.py [ckpt.pt]`` (default: checkpoints/hybrid-dat.pt, else
runs/hybrid-dat/seed0/final.pt, else a randomly initialised model of the hybrid-dat preset: the cost does not
depend on the weights).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from probe.checkpoint import checkpoint_from_model, load_checkpoint, save_checkpoint  # noqa: E402
from probe.models import HookedSequenceModel  # noqa: E402
from probe.probes import interchange_intervention, probe_model  # noqa: E402
from probe.train import build_configs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def pick_checkpoint(argv: list[str], tmp: Path) -> Path:
    if argv:
        return Path(argv[0])
    for cand in (ROOT / "checkpoints" / "hybrid-dat.pt", ROOT / "runs" / "hybrid-dat" / "seed0" / "final.pt"):
        if cand.exists():
            return cand
    model_cfg, task, _ = build_configs("hybrid-dat")
    torch.manual_seed(0)
    return save_checkpoint(tmp / "hybrid-dat-random.pt", checkpoint_from_model(HookedSequenceModel(model_cfg), task))


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = pick_checkpoint(argv, Path(tmp))
        ckpt = load_checkpoint(path)
        model, task = ckpt.build_model(), ckpt.task_config
        print(f"checkpoint {path} ({ckpt.model_config.family}, d_model {ckpt.model_config.d_model}, "
              f"{ckpt.model_config.n_layers} blocks, L_train {task.train_length}); 1 torch thread, 1 BLAS thread")
        res, w, c = timed(lambda: probe_model(model, task, patching=False))
        n_fits = 3 * len(res.by_length.groupby(["hook", "train_positions"]))
        print(f"probes ({len(res.hooks)} hooks, {n_fits} fits, {res.meta['train_positions_n']} train / "
              f"{res.meta['test_positions_n']} test positions): wall {w:5.1f} s  cpu {c:5.1f} s")
        _, w, c = timed(lambda: interchange_intervention(model, task, [task.train_length * f for f in (1, 2, 3, 4)],
                                                         n=48))
        print(f"interventions (full and same-sum; 4 lengths x 3 positions x 48 pairs): wall {w:5.1f} s  "
              f"cpu {c:5.1f} s")
        cmd = [sys.executable, "-m", "probe.probes", str(path), "--json", "--out", str(Path(tmp) / "out")]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        _, w, _ = timed(lambda: subprocess.run(cmd, check=True, capture_output=True, env={**os.environ,
                                                                                         "OMP_NUM_THREADS": "1"}))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        # On a busy machine wall time exceeds the CPU time of the single-threaded run; the CPU time is what one
        # free core would take.
        verdict = "within" if min(w, cpu) <= 60 else "OVER"
        print(f"default CLI run end to end (imports, probes, interventions, 3 figures, JSON): wall {w:5.1f} s  "
              f"cpu {cpu:5.1f} s ({verdict} the 60 s budget; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main(sys.argv[1:])
