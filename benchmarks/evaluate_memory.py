"""Memory of ``python -m probe.evaluate`` at its default settings, on every shipped checkpoint and on three wrapped
hybrids: the activation peak it plans (``probe.memory``: the largest sub-batch at the costliest length, the windows'
16 x L_train included) against what it measures, and their ratio (plan / measured: above 1 the plan is generous,
below 1 it understates).

    python benchmarks/evaluate_memory.py [--lengths 5:100:5] [--samples 256] [--order]

Three numbers a row: ``planned`` (``forward_cost`` x the sub-batch); ``tensors``, the bytes CPU tensors hold at the peak
of that one forward pass as the allocator counts them (``probe.memory.TensorPeak``: what the plan models, exactly);
``measured``, the peak growth of the resident set over the whole evaluation, in a process of its own (what the
evaluation reports: the activations, plus what the allocator keeps of earlier lengths' freed blocks, torch's one-time
allocations and the loaded model). The wrapped rows are plain-PyTorch hybrids (width 32, untrained) under
``probe.wrap``, on probe's default task: ``Hybrid`` (nn.Embedding, nn.LSTM or nn.GRU, causal nn.MultiheadAttention,
nn.Linear) and ``UserHybrid``, the shape a user writes (an nn.GRU ``gru``, a causal 2-head nn.MultiheadAttention ``mha``
and an MLP block, wrapped as docs/guides/your-task.md wraps its hybrid). With 2 heads nn.MultiheadAttention's eval path
writes out the T x T scores; with 1 head it runs a fused kernel that never does, which the plan, reading only widths and
heads, cannot see. The summary compares each group's range with ``probe.memory.PLAN_RATIOS`` (what the refusal and
evaluate's report quote; the runs in docs/guides/sweeps.md) and says whether every row lies within 1.5x, and every row
but the fused kernel's.

``--order`` also measures the same evaluation with the lengths run shortest first (as probe did before it ran them
longest first), each in a process of its own: the reference that shows what the order saves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

import probe
from probe.checkpoint import load_checkpoint
from probe.memory import PLAN_RATIOS, TensorPeak
from probe.tasks import make_task

ROOT = Path(__file__).resolve().parents[1]
WITHIN = 1.5
WIDTH = 32


class Hybrid(nn.Module):
    """A user's hybrid as the docs write one: embedding, a recurrent layer, causal multi-head attention, unembedding,
    the middle two residual."""

    def __init__(self, vocab: int, d: int = WIDTH, cell: type[nn.Module] = nn.LSTM, heads: int = 2) -> None:
        super().__init__()
        self.embed, self.rnn = nn.Embedding(vocab, d), cell(d, d, batch_first=True)
        self.attn, self.unembed = nn.MultiheadAttention(d, heads, batch_first=True), nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + self.rnn(x)[0]
        mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).triu(1)
        return self.unembed(x + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0])


class UserHybrid(nn.Module):
    """A hybrid as a new user wrote one (issue 53's trial): embedding, an nn.GRU named ``gru``, causal 2-head
    nn.MultiheadAttention named ``mha``, an MLP block (4 x width, GELU), unembedding, the middle three residual."""

    def __init__(self, vocab: int, d: int = WIDTH) -> None:
        super().__init__()
        self.embed, self.gru = nn.Embedding(vocab, d), nn.GRU(d, d, batch_first=True)
        self.mha = nn.MultiheadAttention(d, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.unembed = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + self.gru(x)[0]
        mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).triu(1)
        x = x + self.mha(x, x, x, attn_mask=mask, need_weights=False)[0]
        return self.unembed(x + self.mlp(x))


def _wrapped(module: nn.Module, attention: str = "attn", recurrent: str = "rnn") -> tuple[nn.Module, object]:
    return probe.wrap(module.eval(), attention=[attention], recurrent=[recurrent]), make_task()


def _hybrid(cell: type[nn.Module], heads: int) -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    return _wrapped(Hybrid(make_task().vocab_size, cell=cell, heads=heads))


def lstm_two_heads() -> tuple[nn.Module, object]:
    """The factory of the first wrapped row (``evaluate_memory:lstm_two_heads``)."""
    return _hybrid(nn.LSTM, 2)


def gru_one_head() -> tuple[nn.Module, object]:
    """The factory of the second wrapped row: one head, so nn.MultiheadAttention runs a fused kernel."""
    return _hybrid(nn.GRU, 1)


def gru_mha_mlp() -> tuple[nn.Module, object]:
    """The factory of the third wrapped row: the user's hybrid, wrapped as docs/guides/your-task.md shows."""
    torch.manual_seed(0)
    return _wrapped(UserHybrid(make_task().vocab_size), attention="mha", recurrent="gru")


WRAPPED = {"wrapped LSTM, 2 heads": "evaluate_memory:lstm_two_heads",
           "wrapped GRU, 1 head": "evaluate_memory:gru_one_head",
           "wrapped GRU+MHA+MLP": "evaluate_memory:gru_mha_mlp"}
FUSED = {"wrapped GRU, 1 head"}
"""Rows whose attention is a fused kernel: no T x T scores, where the plan counts them."""

# The shortest-first reference: the same evaluation in-process, measured the way the CLI measures it.
_ASCENDING = """
import json, sys, torch
from probe.core.lengths import parse_lengths, stepped
from probe.evaluate import evaluate_checkpoints, length_curve
from probe.memory import PeakMemory
import probe.evaluate as ev
torch.set_num_threads(1)
plain = length_curve
ev.length_curve = lambda *a, **k: plain(*a, **k, longest_first=False)
with PeakMemory() as peak:
    evaluate_checkpoints([sys.argv[1]], parse_lengths(sys.argv[2]) if sys.argv[2] else None, int(sys.argv[3]),
                         default=stepped)
print(json.dumps({"measured_bytes": peak.bytes}))
"""


def tensor_peak(spec: str, batch: int, length: int) -> int:
    """``TensorPeak`` of one forward pass of ``batch`` sequences of stream length ``length`` (after a warm-up)."""
    ckpt = load_checkpoint(spec)
    model = ckpt.build_model("cpu").eval()
    tokens = ckpt.task_config.sample(length, batch, 0).tokens
    with torch.no_grad():
        model(tokens[:1])
        with TensorPeak() as peak:
            model(tokens).argmax(-1)
    return peak.bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="", help="evaluate's --lengths (default: its own default lengths)")
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--order", action="store_true", help="also measure the lengths run shortest first")
    args = parser.parse_args()
    torch.set_num_threads(1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"),
                                                                     os.environ.get("PYTHONPATH")]))}
    rows = {p.name: str(p) for p in sorted((ROOT / "checkpoints").glob("*.pt"))} | WRAPPED
    extra = f" {'shortest first MB':>18} {'ratio':>6}" if args.order else ""
    print(f"{'model':<22} {'planned MB':>10} {'at length':>9} {'batch':>6} {'tensors MB':>10} {'measured MB':>11} "
          f"{'ratio':>6}{extra}")
    ratios: dict[str, float] = {}
    method = "-"
    for name, spec in rows.items():
        # one process per model, so that no earlier evaluation's peak hides this one's
        done = subprocess.run([sys.executable, "-m", "probe.evaluate", spec, "--samples", str(args.samples),
                               "--threads", "1", "--json", *(["--lengths", args.lengths] if args.lengths else [])],
                              capture_output=True, text=True, cwd=ROOT, env=env)
        if done.returncode != 0:
            print(f"{name:<22} failed: {done.stderr.strip().splitlines()[-1]}")
            ratios[name] = float("nan")
            continue
        m = json.loads(done.stdout)["memory"]
        method = m["measured_by"]
        ratio = m["planned_bytes"] / m["measured_bytes"] if m["measured_bytes"] else float("nan")
        ratios[name] = ratio
        tensors = tensor_peak(spec, m["planned_batch"], m["planned_length"])
        line = (f"{name:<22} {m['planned_bytes'] / 2**20:>10.0f} {m['planned_length']:>9} {m['planned_batch']:>6} "
                f"{tensors / 2**20:>10.0f} {m['measured_bytes'] / 2**20:>11.0f} {ratio:>6.2f}")
        if args.order:
            ref = subprocess.run([sys.executable, "-c", _ASCENDING, spec, args.lengths, str(args.samples)],
                                 capture_output=True, text=True, cwd=ROOT, env=env)
            if ref.returncode != 0:
                line += f" {'failed':>18} {'':>6}"
            else:
                asc = json.loads(ref.stdout.strip().splitlines()[-1])["measured_bytes"]
                line += f" {asc / 2**20:>18.0f} {m['planned_bytes'] / asc:>6.2f}"
        print(line, flush=True)
    for group, names in (("probe", [n for n in rows if n not in WRAPPED]), ("wrapped", list(WRAPPED))):
        got = [ratios[n] for n in names if ratios[n] == ratios[n]]
        said = PLAN_RATIOS[group]
        print(f"{group}: plan / measured {min(got, default=float('nan')):.2f}-{max(got, default=float('nan')):.2f} "
              f"(probe.memory.PLAN_RATIOS[{group!r}] says {said[0]:.2f}-{said[1]:.2f})")
    print(f"measured by: {method}")
    within = {n: 1 / WITHIN <= r <= WITHIN for n, r in ratios.items()}
    print(f"all within {WITHIN}x: {'yes' if all(within.values()) else 'no'}")
    if FUSED & set(within):
        print(f"all within {WITHIN}x but where attention is a fused kernel: "
              f"{'yes' if all(ok for n, ok in within.items() if n not in FUSED) else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
