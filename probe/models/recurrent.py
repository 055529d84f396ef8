"""A hooked recurrent sublayer without its cell: hooks on states and gates, fused vs unrolled, settling, overrides."""

from __future__ import annotations

import contextlib
import operator
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from probe.errors import ProbeError

Put = Callable[[str, Tensor], Tensor]
"""What a step hands each value it computes to: ``put(name, value)`` returns the value the recurrence continues
with (the hooks' edit, an override, or the value itself)."""

Edits = dict[str, tuple[Bool[Tensor, "batch pos ..."], Float[Tensor, "batch pos ..."]]]
"""Per hook point: which elements the hooks changed, and the values they returned there."""


def listened(hook_point: HookPoint) -> bool:
    """Whether anything is attached to ``hook_point``. torch's own hook dicts, not TransformerLens's handle lists, so
    that a hook added with plain ``register_forward_hook`` also counts."""
    return bool(hook_point._forward_hooks or hook_point._backward_hooks)


class InnerHookPoint(HookPoint):
    """A ``HookPoint`` on a value that reaches the layer's output only inside the recurrence (a gate, a cell state).

    Its forward hooks see and edit it like any other. No gradient reaches it from outside the recurrence, so a
    backward hook on it would never fire: adding one warns (once per hook) instead of failing silently. ``output``
    names the layer's output state, whose hook does see a gradient."""

    def __init__(self, output: str = "h") -> None:
        super().__init__()
        self.output = output

    def add_hook(self, hook: Callable, dir: str = "fwd", *args: Any, **kwargs: Any) -> Any:
        if dir == "bwd":
            name = self.name or "this hook point"
            output = f"{name.rpartition('.')[0]}.hook_{self.output}".lstrip(".")
            warnings.warn(f"a backward hook on {name} never fires: it reaches the layer's output only inside the "
                          f"recurrence; {output} sees the gradient of the layer's output", UserWarning, stacklevel=2)
        return super().add_hook(hook, dir, *args, **kwargs)


@contextlib.contextmanager
def cudnn_backprop_ok(x: Tensor, training: bool) -> Iterator[None]:
    """Within the block, a recurrent kernel run on ``x`` can be backpropagated through in eval mode.

    cuDNN's RNN backward refuses a forward pass run in eval mode ("cudnn RNN backward can only be called in training
    mode"), and every analysis that takes a gradient (the gradient split, the lookahead, attributions) runs an
    eval-mode model. So where a graph is being built on CUDA outside training, cuDNN is off for the pass: PyTorch's
    own kernel computes the same values and has a backward in either mode. Training, no-grad passes and the CPU keep
    the fast path."""
    if training or not torch.is_grad_enabled() or not x.is_cuda:
        yield
        return
    # not cudnn.flags(): it also resets the other cuDNN settings and the global fp32 matmul precision
    before = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = False
    try:
        yield
    finally:
        torch.backends.cudnn.enabled = before


def _same(a: Tensor, b: Tensor) -> Tensor:
    """Elementwise equality in which NaN equals NaN (else a NaN state would read as an edit on every pass)."""
    return (a == b) | (a.isnan() & b.isnan())


def _per_position(mask: Tensor) -> Bool[Tensor, "pos"]:
    """Whether any element of a (batch, pos, ...) mask is set, per position."""
    return mask.flatten(2).any(dim=2).any(dim=0) if mask.dim() > 2 else mask.any(dim=0)


def _edits_of(returned: Tensor, computed: Tensor) -> tuple[Tensor, Tensor] | None:
    """(where ``returned`` differs from ``computed``, ``returned``), or None where it does not (one pass over memory
    for a hook that only read)."""
    if torch.equal(returned, computed):
        return None
    changed = ~_same(returned, computed)
    return (changed, returned) if changed.any() else None


def _first_difference(old: Edits, new: Edits, below: int) -> int | None:
    """The first position before ``below`` at which two sets of edits differ (where they edit, or what they write),
    or None."""
    first: int | None = None
    for p in old.keys() | new.keys():
        if p in old and p in new:
            (om, ov), (nm, nv) = old[p], new[p]
            diff = (om != nm) | (nm & ~_same(ov, nv))
        else:
            diff = (new.get(p) or old[p])[0]
        where = _per_position(diff[:, :below]).nonzero()
        if len(where):
            first = int(where[0, 0]) if first is None else min(first, int(where[0, 0]))
    return first


class _Tape:
    """One run of the recurrence's bookkeeping: for each hook point in ``record`` it keeps what the steps computed
    (an override in its place where one is set), and it returns to the step what the recurrence continues with:
    ``fed``'s value where the hooks edited, the computed one elsewhere."""

    def __init__(self, record: set[str], fed: Edits, overrides: dict[int, dict[str, Tensor]]) -> None:
        self.t = 0
        self.record: dict[str, list[Tensor]] = {p: [] for p in record | fed.keys()}
        self.fed = fed
        self.fed_at = {p: set(_per_position(mask).nonzero()[:, 0].tolist()) for p, (mask, _) in fed.items()}
        self.overrides = overrides

    def __call__(self, p: str, value: Tensor) -> Tensor:
        t = self.t
        if t in self.overrides and p in self.overrides[t]:
            value = self.overrides[t][p]
        if p in self.record:
            self.record[p].append(value)
        return self.fed_value(p, value)

    def fed_value(self, p: str, value: Tensor) -> Tensor:
        """``value`` with the hooks' edit at the current step written over it (no override, nothing recorded)."""
        if self.t in self.fed_at.get(p, ()):
            mask, new = self.fed[p]
            return torch.where(mask[:, self.t], new[:, self.t], value)
        return value

    def stale(self, before: dict[str, Tensor]) -> bool:
        """Whether, at the step just taken, some point the hooks edit was computed differently from what they saw
        (``before``): their edit there answered a value that no longer holds, so later steps would build on it."""
        t = self.t
        return any(t in at and not torch.equal(self.record[p][-1], before[p][:, t]) for p, at in self.fed_at.items())


class HookedRecurrent(nn.Module):
    """A recurrent sublayer with TransformerLens hook points on its gates and states; the cell is a subclass.

    **What a cell supplies** (``HookedLSTM`` is the example): ``GATES`` and ``STATES``, the names of its hook points
    (``hook_<name>``, created in its ``__init__`` with a shape comment: gates and states other than the output as
    ``InnerHookPoint``); ``STATES[0]`` is the layer's output, and ``STATES`` is the order of the kernel's state tuple
    and of ``override_state``'s arguments. Then five methods: ``fused(x, state)`` (the fast kernel on a sequence from
    a state, returning the output sequence and the final state), ``input_share(x)`` (x's part of every step, for all
    positions at once), ``gate_values(xi, out_prev)`` (the gates from x's share and the previous output; it must
    work on any leading shape, so that the gates of a fused run are read out in one call), ``advance(xi_t, gates,
    state, put)`` (the rest of one step: the new state, each value passed through ``put`` in the order the step
    computes it), and ``initial_state(batch, like)``. ``step`` composes them: it is the only recurrence every path runs.

    **Paths.** No hook attached: the fused kernel (on each side of every overridden position when ``override_state``
    is active). Hooks attached that only read: the fused kernel, with the gates (one ``gate_values`` call on the
    kernel's outputs) and the other states (a scan of ``advance``) read out beside it. ``force_unrolled`` or an
    active override: the step-by-step loop. Where a hook changes a value, ``_settle`` reruns the loop from the first
    changed position until the hooks return what the recurrence was fed.

    A step may also compute values that sit between its gates and its states but are not carried to the next step
    (the GRU's candidate n, computed from the edited reset gate): ``INTERMEDIATE`` names them; ``advance`` puts them.
    A cell whose kernel yields its inner states for all positions at once (a parallel scan) may override
    ``read_out_states``, which by default scans ``advance``.

    ``fp32_recurrence``: run the recurrence with autocast off and the input in float32 (for CPUs whose fused
    recurrent kernels have no bf16 version); what it returns is float32 and the layers above autocast as usual.
    """

    GATES: ClassVar[tuple[str, ...]] = ()
    STATES: ClassVar[tuple[str, ...]] = ()
    INTERMEDIATE: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        super().__init__()
        self.force_unrolled = False
        self.fp32_recurrence = False
        self._override_stack: list[dict[int, dict[str, Tensor]]] = []

    # --- what a cell supplies --------------------------------------------------------------------------------------
    def fused(self, x: Tensor, state: tuple[Tensor, ...] | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        raise NotImplementedError

    def input_share(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def gate_values(self, xi: Tensor, out_prev: Tensor) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def advance(self, xi_t: Tensor, gates: Sequence[Tensor], state: tuple[Tensor, ...],
                put: Put) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def initial_state(self, batch: int, like: Tensor) -> tuple[Tensor, ...]:
        raise NotImplementedError

    # --- the one step ----------------------------------------------------------------------------------------------
    def step(self, xi_t: Tensor, state: tuple[Tensor, ...], put: Put,
             gates: Sequence[Tensor] | None = None) -> tuple[Tensor, ...]:
        """One step of the recurrence from ``state`` (``gates`` given: a read-out of a run that already has them)."""
        if gates is None:
            gates = self.gate_values(xi_t, state[0])
        return self.advance(xi_t, [put(p, g) for p, g in zip(self.GATES, gates, strict=True)], state, put)

    # --- hook points -----------------------------------------------------------------------------------------------
    @property
    def points(self) -> tuple[str, ...]:
        """The hook points in the order a step computes them, which is the order hooks are called in: gates,
        intermediate values, inner states, the output."""
        return (*self.GATES, *self.INTERMEDIATE, *self.STATES[1:], self.STATES[0])

    def hook_point(self, p: str) -> HookPoint:
        return getattr(self, f"hook_{p}")

    # --- override_state --------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def override_state(self, positions: int | Sequence[int], *states: Tensor) -> Iterator[None]:
        """Within the block, the state after each of ``positions`` is ``states`` (in ``STATES``'s order: the LSTM's
        (h, c)), and the recurrence continues from it; nothing before a position changes. One position: each state
        ``(batch, *state_shape)``; several: ``(batch, len(positions), *state_shape)``, in the order given.

        Blocks nest (also inside a hook, or on several layers at once): an inner block adds its positions, wins where
        both set one, and on exit -- an exception included -- the outer block's overrides are back as they were. A
        forward reads the overrides once, when it starts. A position outside the sequence, or a state of the wrong
        shape, is a ``ProbeError`` at the forward (the sequence's length) or here (everything else)."""
        entry = self._check_override(positions, states)
        self._override_stack.append(entry)
        try:
            yield
        finally:
            self._override_stack = [e for e in self._override_stack if e is not entry]

    @property
    def overridden_positions(self) -> tuple[int, ...]:
        """The positions whose state an active ``override_state`` sets."""
        return tuple(sorted({t for e in self._override_stack for t in e}))

    @property
    def _override(self) -> dict[int, dict[str, Tensor]] | None:
        # older tests read this name to check that no override is left behind
        return self._merged_overrides() or None

    def _check_override(self, positions: int | Sequence[int], states: Sequence[Tensor]) -> dict[int, dict[str, Tensor]]:
        single = not isinstance(positions, Sequence)
        names = ", ".join(self.STATES)
        where = f"override_state({positions!r}, {names})"
        if len(states) != len(self.STATES):
            raise ProbeError(f"{where}: {len(self.STATES)} states expected ({names}), got {len(states)}")
        try:  # numpy and 0-d torch integers too, but not floats or bools
            ts = [operator.index(t) for t in ([positions] if single else positions) if not isinstance(t, bool)]
        except TypeError:
            ts = []
        if not ts or len(ts) != (1 if single else len(positions)) or min(ts) < 0 or len(set(ts)) != len(ts):
            raise ProbeError(f"{where}: positions must be distinct integers >= 0")
        param = next(self.parameters())
        for name, s, init in zip(self.STATES, states, self.initial_state(1, param), strict=True):
            expected = ("batch",) + (() if single else (len(ts),)) + tuple(init.shape[1:])
            if not isinstance(s, Tensor) or s.dim() != len(expected) or tuple(s.shape[1:]) != expected[1:]:
                got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
                raise ProbeError(f"{where}: {name} must have shape ({', '.join(map(str, expected))}), not {got}")
        if len({s.shape[0] for s in states}) != 1:
            raise ProbeError(f"{where}: the states disagree on the batch size ({[s.shape[0] for s in states]})")
        return {t: {n: s if single else s[:, k] for n, s in zip(self.STATES, states, strict=True)}
                for k, t in enumerate(ts)}

    def _merged_overrides(self) -> dict[int, dict[str, Tensor]]:
        merged: dict[int, dict[str, Tensor]] = {}
        for entry in self._override_stack:
            merged.update(entry)
        return merged

    def _overrides_for(self, x: Tensor) -> dict[int, dict[str, Tensor]]:
        """The active overrides, checked against ``x`` and cast to its dtype and device."""
        merged = self._merged_overrides()
        b, t_len = x.shape[:2]
        for t, states in merged.items():
            if t >= t_len:
                raise ProbeError(f"override_state: position {t} is outside 0..{t_len - 1} (the sequence has "
                                 f"{t_len} positions)")
            if next(iter(states.values())).shape[0] != b:
                raise ProbeError(f"override_state at position {t}: batch {next(iter(states.values())).shape[0]}, "
                                 f"the input has {b}")
        return {t: {n: s.to(x) for n, s in states.items()} for t, states in merged.items()}

    # --- the forward -----------------------------------------------------------------------------------------------
    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        with cudnn_backprop_ok(x, self.training):
            if self.fp32_recurrence and torch.is_autocast_enabled(x.device.type):
                with torch.autocast(x.device.type, enabled=False):
                    return self._forward(x.float())
            return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        overrides = self._overrides_for(x)
        hooked = [p for p in self.points if listened(self.hook_point(p))]
        out = self.STATES[0]
        if not hooked and not self.force_unrolled:
            return self._fused_through(x, overrides)
        if overrides or self.force_unrolled:
            xi = self.input_share(x)
            values, _ = self._scan(xi, set(hooked), overrides)
        else:
            # the fused kernel; x's share is computed only if something beyond the output is read out or edited
            xi = None
            values = {out: self.fused(x)[0]}
            if set(hooked) - {out}:
                xi = self.input_share(x)
                values |= self._read_out(xi, values[out], set(hooked) - {out})
        if not hooked:
            return values[out]
        return self._settle(x, xi, values, hooked, overrides)

    def _settle(self, x: Tensor, xi: Tensor | None, values: dict[str, Tensor], hooked: list[str],
                overrides: dict[int, dict[str, Tensor]]) -> Tensor:
        """Call the hooks, rerun the recurrence where they edited, and repeat until they return what it was fed.

        Invariant, at the top of every pass: ``values`` is what the recurrence computes at each position before
        ``fresh`` when it is fed ``fed`` (the previous pass's edits) and the overrides; positions from ``fresh`` on
        are an earlier pass's. So when the hooks, called on ``values``, edit exactly where ``fed`` does and write
        the same values, and ``fresh`` is T, every hook returns what the recurrence continued from: done.

        A pass reruns from the first position where the hooks' edits differ from ``fed``; before it the old and the
        new edits agree, so the values there stay the recurrence's. The first rerun goes to the end, so a patch from
        a cache or a constant settles in two hook calls. Later reruns stop after the first step at which an edited
        point was computed differently from what the hooks saw (their edit there answered a value that no longer
        holds; continuing would build on it), so an edit that depends on its input settles one position per pass:
        about T + 2 calls and 2T steps, not T^2 steps."""
        t_len, out = x.shape[1], self.STATES[0]
        fed: Edits = {}
        fresh = t_len
        limit = (len(hooked) + 1) * t_len + 4  # a causal hook settles one (position, hook point) at least per pass
        for n_pass in range(limit):
            outputs, edits = self._call_hooks(values, hooked)
            start = _first_difference(fed, edits, below=fresh)
            if start is None:
                if fresh == t_len:
                    return outputs.get(out, values[out])
                start = fresh
            fed = edits
            xi = self.input_share(x) if xi is None else xi
            values, fresh = self._scan(xi, set(hooked), overrides, fed, start, values, stop_when_stale=n_pass > 0)
        names = ", ".join(self.hook_point(p).name or f"hook_{p}" for p in hooked)
        raise ProbeError(f"hooks on {names} did not settle after {limit} passes: a hook on a recurrent state must be "
                         "causal and deterministic (its edit at t may use positions <= t only; draw noise once, "
                         "outside the hook)")

    def _call_hooks(self, values: dict[str, Tensor], hooked: list[str]) -> tuple[dict[str, Tensor], Edits]:
        """Call each hooked point on its sequence; returns what they returned and which elements they changed."""
        outputs: dict[str, Tensor] = {}
        edits: Edits = {}
        for p in hooked:
            v = values[p]
            # a clone, so that a hook editing in place leaves the computed values to compare against
            y = self.hook_point(p)(v.clone())
            if y.shape != v.shape:
                raise ProbeError(f"a hook on {self.hook_point(p).name} returned shape {tuple(y.shape)}; "
                                 f"it must keep {tuple(v.shape)}")
            outputs[p] = y
            edit = _edits_of(y.detach(), v.detach())
            if edit is not None:
                edits[p] = edit
        return outputs, edits

    def _scan(self, xi: Tensor, record: set[str], overrides: dict[int, dict[str, Tensor]], fed: Edits | None = None,
              start: int = 0, before: dict[str, Tensor] | None = None, stop_when_stale: bool = False,
              gates: Sequence[Tensor] | None = None) -> tuple[dict[str, Tensor], int]:
        """The recurrence step by step from ``start`` (earlier positions are ``before``'s), fed ``fed`` and the
        overrides. Returns the computed values of ``record`` and of every state, and where it stopped: the end, or
        with ``stop_when_stale`` just after the first stale step (``_Tape.stale``); later positions are
        ``before``'s. ``gates`` (all positions): read them instead of computing them (a read-out)."""
        fed = fed or {}
        before = before or {}
        b, t_len = xi.shape[:2]
        tape = _Tape(record | set(self.STATES), fed, overrides)
        if start == 0:
            state = self.initial_state(b, xi)
        else:
            missing = set(self.STATES) - before.keys()
            if missing:  # a fused first pass read out only what was hooked
                before = before | self._read_out(xi, before[self.STATES[0]], missing)
            tape.t = start - 1
            state = tuple(tape.fed_value(s, before[s][:, start - 1]) for s in self.STATES)
        end = t_len
        for t in range(start, t_len):
            tape.t = t
            state = self.step(xi[:, t], state, tape, None if gates is None else [g[:, t] for g in gates])
            if stop_when_stale and tape.stale(before):
                end = t + 1
                break
        return {p: torch.cat([before[p][:, :start], torch.stack(vs, dim=1), before[p][:, end:]], dim=1)
                if start or end < t_len else torch.stack(vs, dim=1) for p, vs in tape.record.items()}, end

    def _read_out(self, xi: Tensor, out: Tensor, wanted: set[str]) -> dict[str, Tensor]:
        """Gates and states of the fused run whose output is ``out``: the gates in one call from (x_t, out_{t-1}),
        the other states by a scan of ``advance`` over them -- the fused kernel keeps both inside, and this costs a
        fraction of an unrolled loop."""
        out_prev = torch.cat([self.initial_state(out.shape[0], out)[0][:, None], out[:, :-1]], dim=1)
        gates = self.gate_values(xi, out_prev)
        values = {p: g for p, g in zip(self.GATES, gates, strict=True) if p in wanted}
        inner = wanted & set(self.INTERMEDIATE + self.STATES[1:])
        if inner:
            values |= self.read_out_states(xi, gates, out, inner)
        return values

    def read_out_states(self, xi: Tensor, gates: Sequence[Tensor], out: Tensor,
                        wanted: set[str]) -> dict[str, Tensor]:
        """The intermediate values and inner states in ``wanted`` of the fused run whose output is ``out``, given
        x's share and the run's gates (all positions): a scan of ``advance`` over the gates. A cell whose kernel
        gives them at once (a parallel scan, or values that depend on the output only) overrides this."""
        scanned, _ = self._scan(xi, wanted, {}, gates=gates)
        return {p: scanned[p] for p in wanted}

    def _fused_through(self, x: Tensor, overrides: dict[int, dict[str, Tensor]]) -> Tensor:
        """The fused kernel on each stretch between overridden positions, restarted from each override."""
        if not overrides:
            return self.fused(x)[0]
        pieces: list[Tensor] = []
        state: tuple[Tensor, ...] | None = None
        t0 = 0
        for t in sorted(overrides):
            if t > t0:
                pieces.append(self.fused(x[:, t0:t], state)[0])
            state = tuple(overrides[t][s] for s in self.STATES)
            pieces.append(state[0][:, None])
            t0 = t + 1
        if t0 < x.shape[1]:
            pieces.append(self.fused(x[:, t0:], state)[0])
        return torch.cat(pieces, dim=1)

    def unrolled(self, x: Float[Tensor, "batch pos d_model"]) -> dict[str, Tensor]:
        """The recurrence step by step, without calling any hook (the active overrides apply): every gate and state
        as a (batch, pos, ...) sequence."""
        values, _ = self._scan(self.input_share(x), set(self.points), self._overrides_for(x))
        return values
