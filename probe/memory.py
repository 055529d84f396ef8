"""How much memory a forward pass needs, and the largest batch of one sequence length that fits in what is free."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from probe.errors import ProbeError

if TYPE_CHECKING:
    from probe.models import ModelConfig
    from probe.tasks import TaskConfig

SAFETY = 0.5
"""Plan for at most this share of the free memory: the estimate ignores the allocator's slack and whatever else the
process holds (the other checkpoints, pandas frames, figures)."""

_FLOAT = 4  # bytes; models run in float32 for analysis


def available_bytes(device: torch.device | str = "cpu") -> int:
    """Memory free for new tensors on ``device``: CUDA's free memory, else the OS's available RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:  # Linux: MemAvailable counts reclaimable page cache, which SC_AVPHYS_PAGES does not
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ForwardCost:
    """Peak activation bytes of one no-grad forward pass of one sequence, split by where they go."""

    attention: int  # score, masked score and pattern tensors of one layer: H x T^2 each
    tokens: int  # per-token activations: residual stream, LSTM gates, MLP hidden, logits

    @property
    def total(self) -> int:
        return self.attention + self.tokens


def forward_cost(cfg: ModelConfig, positions: int, grad: bool = False) -> ForwardCost:
    """Bytes one sequence of ``positions`` tokens (prefix included) needs at the peak of a no-grad forward pass.

    Layers run one after another and free their activations, so the peak is one layer's worth: attention holds
    the raw scores, the masked scores and the softmax pattern around the softmax (measured: 2.6 of these
    tensors at the peak on CPU; 3 are counted), and the per-token terms count every sublayer's output at once.
    With ``grad`` (a backward pass follows), autograd keeps every layer's activations until the backward pass, and
    the backward pass holds a gradient of the same size: twice every layer's worth.
    """
    attention = 3 * cfg.n_heads * positions * positions * _FLOAT if cfg.has_attention else 0
    per_token = 12 * cfg.d_model + 2 * cfg.mlp_dim + 2 * cfg.vocab_size
    layers = 2 * cfg.n_layers if grad else 1
    return ForwardCost(attention=layers * attention, tokens=layers * positions * per_token * _FLOAT)


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**28 else f"{n / 2**20:.0f} MB"


def fit_batch_size(cfg: ModelConfig, length: int, want: int, device: torch.device | str = "cpu", prefix: int = 0,
                   available: int | None = None, grad: bool = False) -> int:
    """The largest sub-batch, at most ``want``, whose forward pass on sequences of stream length ``length`` (plus
    ``prefix`` tokens, the task's dictionary) fits in ``SAFETY`` x the free memory.

    Raises ``ProbeError`` naming the longest length that would fit when not even one sequence does."""
    budget = SAFETY * (available_bytes(device) if available is None else available)
    one = forward_cost(cfg, prefix + length, grad)
    if one.total <= budget:
        return max(1, min(want, int(budget // one.total)))
    longest = max(0, max_positions(cfg, budget, grad) - prefix)
    dominant = (f"{cfg.n_heads} heads x {prefix + length}^2 attention scores"
                if one.attention > one.tokens else f"{prefix + length} tokens of activations")
    raise ProbeError(
        f"length {length} needs about {_gb(one.total)} for a single sequence ({dominant}), more than "
        f"{SAFETY:.0%} of the {_gb(budget / SAFETY)} free on {torch.device(device)}: use lengths up to {longest}"
    )


def max_positions(cfg: ModelConfig, budget: float, grad: bool = False) -> int:
    """The longest sequence (in tokens) whose single-sequence forward pass fits in ``budget`` bytes."""
    lo, hi = 0, 1
    while forward_cost(cfg, hi, grad).total <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if forward_cost(cfg, mid, grad).total <= budget else (lo, mid)
    return lo


def check_lengths(cfg: ModelConfig, task: TaskConfig, lengths: Sequence[int], device: torch.device | str = "cpu",
                  grad: bool = False, name: str | None = None) -> None:
    """Refuse, before any work, a length the model cannot take: beyond a learned position table, or so long that
    one sequence's forward pass (with ``grad``: forward and backward) would not fit in memory. The message names the
    longest length that fits, prefixed by ``name`` (the checkpoint) when given."""
    try:
        if not lengths:
            raise ProbeError("no lengths to analyse")
        longest = max(lengths)
        if cfg.pos_encoding == "learned" and task.prefix_len + longest > cfg.max_len:
            raise ProbeError(f"length {longest} needs {task.prefix_len + longest} positions, beyond the model's "
                             f"learned table of {cfg.max_len}: use lengths up to {cfg.max_len - task.prefix_len}")
        fit_batch_size(cfg, longest, 1, device, prefix=task.prefix_len, grad=grad)
    except ProbeError as e:
        if name is None:
            raise
        raise ProbeError(f"{name}: {e}") from None


@dataclass(frozen=True)
class Plan:
    """What an evaluation over several lengths plans to hold at its peak: the activations of the largest sub-batch at
    the costliest length (``fit_batch_size`` x ``forward_cost``), and the free memory it planned against."""

    bytes: int
    batch: int
    length: int
    available: int


def plan_lengths(cfg: ModelConfig, lengths: Sequence[int], want: int, device: torch.device | str = "cpu",
                 prefix: int = 0) -> Plan:
    """The peak that ``probe.evaluate.length_curve`` plans for over ``lengths`` (sub-batches of at most ``want``)."""
    free = available_bytes(device)
    best = Plan(0, 0, 0, free)
    for length in lengths:
        batch = fit_batch_size(cfg, length, want, device, prefix=prefix, available=free)
        need = batch * forward_cost(cfg, prefix + length).total
        if need > best.bytes:
            best = Plan(need, batch, length, free)
    return best


class PeakMemory:
    """The peak growth of memory while the block runs: on CUDA, ``torch.cuda.max_memory_allocated`` over what was
    allocated at the start; on Linux, the peak resident set (``VmHWM``, reset on entry through
    ``/proc/self/clear_refs``) over the resident set at the start; elsewhere the growth of ``ru_maxrss``, a lower
    bound (an earlier, higher peak hides this one). ``bytes`` and ``method`` are set on exit."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.bytes = 0
        self.method = ""

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise OSError(f"no {field} in /proc/self/status")

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start, self.method = torch.cuda.memory_allocated(self.device), "cuda max_memory_allocated"
            return self
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current resident set (Linux >= 4.0)
            self._start, self.method = self._status("VmRSS"), "peak resident set (VmHWM) growth"
        except OSError:
            import resource

            self._start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.method = "ru_maxrss growth (a lower bound)"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.method.startswith("peak resident"):
            peak = self._status("VmHWM")
        else:
            import resource
            import sys

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            if sys.platform != "darwin":  # kilobytes on Linux, bytes on macOS
                peak, self._start = peak * 1024, self._start * 1024
        self.bytes = max(0, peak - self._start)
