"""How much memory a forward pass needs, and the largest batch of one sequence length that fits in what is free."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
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
    """Activation bytes of one sequence at the peak of a forward pass, split by where they go."""

    attention: int  # the score and pattern tensors (heads x T^2 each) alive at the peak; 0 when it is elsewhere
    tokens: int  # per-position tensors alive at the peak: residual copies, the sublayer's own, the logits

    @property
    def total(self) -> int:
        return self.attention + self.tokens


CELL_WIDTH = {"lstm": 6.25, "gru": 5.0}
"""What a recurrent cell holds per position at its peak, in units of d_model, beside its input and LayerNorm: the
fused kernel's output, its state buffers and every step's gates (4 for the LSTM, 3 for the GRU; measured with
``TensorPeak``: 8.1-8.3 and 7.0 d_model in all with the input and LayerNorm). A cell probe did not build (a wrapped
model's) is counted as the LSTM."""

SSM_WIDTH = 13
"""What the SSM's chunked scan holds per position at its peak, per real number of its state (``ssm_state``): the
input share, the gates, the states and the chunks' partial sums (measured with ``TensorPeak``: 12.3-13.8 a state
unit over the real and complex ranges, at lengths that are a multiple of the scan's chunk)."""

SSM_PADDED = 3
"""What the scan holds more, per state unit, at a length that is not a multiple of its chunk (``SSM_CHUNK``): the
padded copies of its inputs (measured: 14.3-17.7 in all)."""

SSM_CHUNK = 8
"""``probe.models.ssm.CHUNK`` (a layer above this module): the scan pads every sequence to a multiple of it."""

PLAN_RATIOS = {"probe": (0.76, 0.96), "wrapped": (0.85, 3.52)}
"""The plan over the measured peak (lowest, highest, over the runs docs/guides/sweeps.md records, rounded outward) on
the rows of ``python benchmarks/evaluate_memory.py`` at evaluate's default settings (its table): probe's shipped
checkpoints, and three wrapped plain-PyTorch hybrids: two without an MLP, the high end one whose attention runs a
fused kernel that holds no T x T scores, and the low end a GRU, nn.MultiheadAttention and an MLP block, as users write
one. Below 1 the plan understates: the resident set also holds the allocator's slack, which outweighs the
activations at a few sequences a length (0.3x at 16). The refusal and evaluate's report quote these beside the
plan."""

PROBE_FAMILIES = ("lstm", "transformer", "hybrid")
"""The families of probe's own models (``probe.models.config.FAMILIES``, a layer above this module), whose every
tensor the plan counts; any other model's plan rests on the widths and heads read from it."""


def estimate_note(cfg: ModelConfig, grad: bool = False) -> str:
    """What the plan is, in words for a report or a refusal: an estimate, and how far it was off on the benchmark."""
    if grad:
        return "an estimate: a generous bound for a forward and a backward pass, not benchmarked"
    if getattr(cfg, "family", None) in PROBE_FAMILIES:
        lo, hi = PLAN_RATIOS["probe"]
        return f"an estimate: {lo:.2f}-{hi:.2f}x the measured peak on benchmarks/evaluate_memory.py"
    lo, hi = PLAN_RATIOS["wrapped"]
    return (f"an estimate from the model's width and heads, as probe cannot see inside it: {lo:.2f}-{hi:.2f}x the "
            "measured peak on benchmarks/evaluate_memory.py, the high end where attention is a fused kernel")


def forward_cost(cfg: ModelConfig, positions: int, grad: bool = False) -> ForwardCost:
    """Bytes one sequence of ``positions`` tokens (prefix included) holds at the peak of a forward pass.

    Without ``grad`` (no backward pass follows) each sublayer frees what it made before the next runs, so the peak is
    the costliest sublayer, per position (d = d_model, T = positions, H = heads): the block's input, which its caller
    holds, and in a hybrid the recurrent sublayer's output too (attention's input, kept to the block's end), then
    attention: its LayerNorm, q, k, v, z, z reshaped and W_O's output, and the scores and the softmax pattern, H x T
    each (the masked scores replace the raw ones); the MLP: the residual sum, its LayerNorm and two d_mlp-wide tensors
    (W_in's output and the GELU); the recurrent cell: its LayerNorm and ``CELL_WIDTH`` (the SSM: ``SSM_WIDTH`` per
    state unit, ``SSM_PADDED`` more where the scan pads); the head: the last residual, its LayerNorm and the logits.
    These are the tensors alive at the peak as the allocator counts them (``TensorPeak``; tests/test_memory.py holds
    the plan to that count); the causal mask (T^2 bytes a forward) and the LSTM kernel's repacked weights are not
    per sequence and are left out.

    With ``grad`` (a backward pass follows), autograd keeps every layer's activations until the backward pass, and
    the backward pass holds a gradient of the same size: this counts, per layer, three H x T^2 attention tensors
    and every sublayer's output at once, twice: a generous bound (1.4-3.3x ``TensorPeak``'s count of a forward and
    backward pass of small models of each family at T 30 and 200; not in the benchmark).
    """
    d, t = cfg.d_model, positions
    heads = cfg.n_heads if cfg.has_attention else 0
    if grad:
        per_token = 12 * d + 2 * cfg.mlp_dim + 2 * cfg.vocab_size
        layers = 2 * cfg.n_layers
        return ForwardCost(attention=layers * 3 * heads * t * t * _FLOAT, tokens=layers * t * per_token * _FLOAT)
    held = 2 * d if cfg.has_lstm and cfg.has_attention else d
    others = [(held + d) + d + 2 * cfg.mlp_dim, 2 * d + cfg.vocab_size]  # the MLP, the head
    if cfg.has_lstm:
        cell = getattr(cfg, "rnn", "lstm")
        width = ((SSM_WIDTH + (SSM_PADDED if t % SSM_CHUNK else 0)) * cfg.ssm_state if cell == "ssm" else
                 CELL_WIDTH.get(cell, CELL_WIDTH["lstm"]) * d)
        others.append(2 * d + width)  # the block's input, its LayerNorm, the cell
    tokens = int(max(others) * t * _FLOAT)
    if heads:
        attention_tokens = int((held + 7 * d) * t * _FLOAT)
        scores = 2 * heads * t * t * _FLOAT
        if scores + attention_tokens > tokens:
            return ForwardCost(attention=scores, tokens=attention_tokens)
    return ForwardCost(attention=0, tokens=tokens)


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
        f"length {length} needs about {_gb(one.total)} for a single sequence ({dominant}; {estimate_note(cfg, grad)}), "
        f"more than {SAFETY:.0%} of the {_gb(budget / SAFETY)} free on {torch.device(device)}: use lengths up to "
        f"{longest}"
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
    the costliest length (``fit_batch_size`` x ``forward_cost``), the free memory it planned against, and what kind
    of estimate that is (``estimate_note``)."""

    bytes: int
    batch: int
    length: int
    available: int
    note: str = ""


def plan_lengths(cfg: ModelConfig, lengths: Sequence[int], want: int, device: torch.device | str = "cpu",
                 prefix: int = 0) -> Plan:
    """The peak that ``probe.evaluate.length_curve`` plans for over ``lengths`` (sub-batches of at most ``want``)."""
    free = available_bytes(device)
    best = Plan(0, 0, 0, free, estimate_note(cfg))
    for length in lengths:
        batch = fit_batch_size(cfg, length, want, device, prefix=prefix, available=free)
        need = batch * forward_cost(cfg, prefix + length).total
        if need > best.bytes:
            best = Plan(need, batch, length, free, best.note)
    return best


class PeakMemory:
    """The peak growth of memory while the block runs: on CUDA, ``torch.cuda.max_memory_allocated`` over what was
    allocated at the start; on Linux, the peak resident set (``VmHWM``, reset on entry through
    ``/proc/self/clear_refs``) over the resident set at the start; elsewhere the growth of ``ru_maxrss``, a lower
    bound (an earlier, higher peak hides this one). ``bytes`` and ``method`` are set on exit.

    On the CPU this counts more than the plan (``forward_cost``, the tensors alive at the costliest forward pass): the
    freed blocks of earlier, smaller forward passes that the C allocator keeps rather than returns, torch's one-time
    allocations (about 10 MB on the first forward pass), the models loaded inside the block and the results kept;
    ``TensorPeak`` counts only what the plan counts."""

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

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            if sys.platform != "darwin":  # kilobytes on Linux, bytes on macOS
                peak, self._start = peak * 1024, self._start * 1024
        self.bytes = max(0, peak - self._start)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to the null device: the profiler's C++ side announces its start and stop there."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class TensorPeak:
    """The peak of the bytes that CPU tensors hold while the block runs, over what they held at its start, as the
    allocator counts them (``torch.profiler``'s memory events, summed in order): the count ``forward_cost`` plans,
    exact and repeatable where the resident set is neither, and blind to the allocator's slack and to memory that is
    not a tensor. ``bytes`` is set on exit."""

    def __init__(self) -> None:
        self.bytes = 0

    def __enter__(self) -> TensorPeak:
        from torch.profiler import ProfilerActivity, profile

        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _quiet_stderr():
            self._profile.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        with _quiet_stderr():
            self._profile.__exit__(*exc)
        events = [e for e in self._profile.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
        held = peak = 0
        for e in sorted(events, key=lambda e: e.start_ns()):
            held += e.nbytes()
            peak = max(peak, held)
        self.bytes = peak
