"""Memory of ``python -m probe.evaluate`` on every shipped checkpoint, to 16x the training length: the activation
peak it plans (``probe.memory``: the largest sub-batch at the costliest length) against the peak growth it measures,
side by side, with their ratio. A ratio above 1 means the plan understates what the evaluation needs.

    python benchmarks/evaluate_memory.py [--lengths 1:400] [--samples 256] [--order]

``--order`` also measures the same evaluation with the lengths run shortest first (as probe did before it ran them
longest first), each in a process of its own: the reference that shows what the order saves.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The shortest-first reference: the same evaluation in-process, measured the way the CLI measures it.
_ASCENDING = """
import json, sys, torch
from probe.core.lengths import parse_lengths
from probe.evaluate import evaluate_checkpoints, length_curve
from probe.memory import PeakMemory
import probe.evaluate as ev
torch.set_num_threads(1)
plain = length_curve
ev.length_curve = lambda *a, **k: plain(*a, **k, longest_first=False)
with PeakMemory() as peak:
    evaluate_checkpoints([sys.argv[1]], parse_lengths(sys.argv[2]), int(sys.argv[3]))
print(json.dumps({"measured_bytes": peak.bytes}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1:400")
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--order", action="store_true", help="also measure the lengths run shortest first")
    args = parser.parse_args()
    extra = f" {'shortest first MB':>18} {'ratio':>6}" if args.order else ""
    print(f"{'checkpoint':<22} {'planned MB':>10} {'at length':>9} {'batch':>6} {'measured MB':>12} {'ratio':>6}"
          f"{extra}  by")
    for ckpt in sorted((ROOT / "checkpoints").glob("*.pt")):
        # one process per checkpoint, so that no earlier evaluation's peak hides this one's
        done = subprocess.run([sys.executable, "-m", "probe.evaluate", str(ckpt), "--lengths", args.lengths,
                               "--samples", str(args.samples), "--threads", "1", "--json"], capture_output=True,
                              text=True, cwd=ROOT)
        if done.returncode != 0:
            print(f"{ckpt.name:<22} failed: {done.stderr.strip().splitlines()[-1]}")
            continue
        m = json.loads(done.stdout)["memory"]
        ratio = m["measured_bytes"] / m["planned_bytes"] if m["planned_bytes"] else float("nan")
        line = (f"{ckpt.name:<22} {m['planned_bytes'] / 2**20:>10.0f} {m['planned_length']:>9} "
                f"{m['planned_batch']:>6} {m['measured_bytes'] / 2**20:>12.0f} {ratio:>6.2f}")
        if args.order:
            ref = subprocess.run([sys.executable, "-c", _ASCENDING, str(ckpt), args.lengths, str(args.samples)],
                                 capture_output=True, text=True, cwd=ROOT)
            if ref.returncode != 0:
                line += f" {'failed':>18} {'':>6}"
            else:
                asc = json.loads(ref.stdout.strip().splitlines()[-1])["measured_bytes"]
                line += f" {asc / 2**20:>18.0f} {asc / m['planned_bytes']:>6.2f}"
        print(f"{line}  {m['measured_by']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
