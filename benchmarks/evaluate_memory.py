"""Memory of ``python -m probe.evaluate`` on every shipped checkpoint, to 16x the training length: the activation
peak it plans (``probe.memory``: the largest sub-batch at the costliest length) against the peak growth it measures,
side by side, with their ratio. A ratio above 1 means the plan understates what the evaluation needs.

    python benchmarks/evaluate_memory.py [--lengths 1:400] [--samples 256]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1:400")
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    print(f"{'checkpoint':<22} {'planned MB':>10} {'at length':>9} {'batch':>6} {'measured MB':>12} {'ratio':>6}  by")
    for ckpt in sorted((ROOT / "checkpoints").glob("*.pt")):
        # one process per checkpoint, so that no earlier evaluation's peak hides this one's
        done = subprocess.run([sys.executable, "-m", "probe.evaluate", str(ckpt), "--lengths", args.lengths,
                               "--samples", str(args.samples), "--json"], capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            print(f"{ckpt.name:<22} failed: {done.stderr.strip().splitlines()[-1]}")
            continue
        m = json.loads(done.stdout)["memory"]
        ratio = m["measured_bytes"] / m["planned_bytes"] if m["planned_bytes"] else float("nan")
        print(f"{ckpt.name:<22} {m['planned_bytes'] / 2**20:>10.0f} {m['planned_length']:>9} {m['planned_batch']:>6} "
              f"{m['measured_bytes'] / 2**20:>12.0f} {ratio:>6.2f}  {m['measured_by']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
