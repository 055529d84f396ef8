"""The hooked LSTM sublayer: the fused kernel where nothing edits it, an unrolled loop where hooks edit its states."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from probe.errors import ProbeError

GATES = ("i", "f", "g", "o")
POINTS = (*GATES, "c", "h")
"""The recurrent hook points in the order one step computes them: gates, then the cell state, then the output."""

Edits = dict[str, tuple[Bool[Tensor, "batch pos d_model"], Float[Tensor, "batch pos d_model"]]]
"""Per hook point: which elements the hooks changed, and the values they returned there."""


def listened(hook_point: HookPoint) -> bool:
    """Whether anything is attached to ``hook_point``. torch's own hook dicts, not TransformerLens's handle lists, so
    that a hook added with plain ``register_forward_hook`` also counts."""
    return bool(hook_point._forward_hooks or hook_point._backward_hooks)


def _same(a: Tensor, b: Tensor) -> Tensor:
    """Elementwise equality in which NaN equals NaN (else a NaN state would read as an edit on every pass)."""
    return (a == b) | (a.isnan() & b.isnan())


def _changed(y: Tensor, v: Tensor) -> Tensor | None:
    """Where ``y`` differs from ``v``, or None where it does not (one pass over memory for a hook that only read)."""
    if torch.equal(y, v):
        return None
    changed = ~_same(y, v)
    return changed if changed.any() else None


def _first_change(old: Edits, new: Edits, below: int) -> int | None:
    """The first position before ``below`` at which two sets of edits differ (where they edit, or what they write),
    or None."""
    first: int | None = None
    for p in old.keys() | new.keys():
        if p in old and p in new:
            (om, ov), (nm, nv) = old[p], new[p]
            diff = (om != nm) | (nm & ~_same(ov, nv))
        else:
            diff = (new.get(p) or old[p])[0]
        where = diff[:, :below].any(dim=2).any(dim=0).nonzero()
        if len(where):
            t = int(where[0, 0])
            first = t if first is None else min(first, t)
    return first


class HookedLSTM(nn.Module):
    """One LSTM layer as a sublayer, with TransformerLens hook points on its gates and states.

    Hook points, each ``(batch, pos, d_model)``: ``hook_i``, ``hook_f``, ``hook_g``, ``hook_o`` (the gate
    activations: sigmoid, sigmoid, tanh, sigmoid), ``hook_c`` (cell state c_t) and ``hook_h`` (h_t, the layer's
    output). One step computes i, f, g, o from (x_t, h_{t-1}), then ``c_t = f c_{t-1} + i g``, then
    ``h_t = o tanh(c_t)``.

    **Edits are causal.** A hook sees the whole sequence, as every TransformerLens hook does, and what it returns at
    position t is the value the recurrence continues from: an edit of ``hook_h`` at t moves h_{t+1}, h_{t+2}, ...; an
    edit of ``hook_c`` at t moves h_t (computed from c_t) and everything later; an edit of a gate at t moves c_t and
    h_t. Editing ``hook_h`` and ``hook_c`` at t is ``override_state(t, h, c)``. Nothing before t changes.

    How: with no hook attached (training, evaluation) the layer is the fused ``nn.LSTM`` kernel. With hooks attached
    it first runs the fused kernel (gates and c_t, when hooked, are recomputed from its h: one matmul and an
    elementwise scan) and calls the hooks. Hooks that only read (caching) change nothing, and that is the whole
    forward. Where a hook changed some elements, the layer reruns the recurrence step by step from the first changed
    position, writing the edited values over the computed ones, and calls the hooks again on the new sequence; it
    repeats until the hooks return what the recurrence was fed (a fixed point). A patch at any positions from a
    cache, or a constant, settles in two calls. An edit that depends on its input (adding a vector, scaling,
    projecting out a direction) settles one position per call: about T + 2 calls and 2T steps. So a hook on these
    points may be called more than once per forward; its last call sees the final values (a caching hook stores
    those). It must be causal and deterministic -- its edit at t may depend only on positions <= t, and random noise
    must be drawn once outside the hook -- or the forward raises ``ProbeError``.

    Gradients: edited elements are constants in the recurrence, as a patch from a cache is; every other element
    carries its gradient through time. A backward hook on ``hook_h`` sees the gradient of the loss with respect to the
    layer's output sequence (through the sublayers above, not through later steps of the recurrence); the gates and
    ``hook_c`` feed the output only inside the recurrence, so backward hooks on them do not fire.

    ``override_state`` sets (h_t, c_t) at one position and lets the recurrence continue from it (without hooks: the
    fused kernel on each side of t). ``force_unrolled`` runs the step-by-step loop even without hooks (tests).
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(d_model, d_model, batch_first=True)
        self.hook_i = HookPoint()
        self.hook_f = HookPoint()
        self.hook_g = HookPoint()
        self.hook_o = HookPoint()
        self.hook_c = HookPoint()
        self.hook_h = HookPoint()
        self._override: tuple[int, Tensor, Tensor] | None = None
        self.force_unrolled = False

    @contextlib.contextmanager
    def override_state(self, position: int, h: Tensor, c: Tensor) -> Iterator[None]:
        """Within the block, the state after ``position`` is (h, c) (each ``(batch, d_model)``)."""
        self._override = (position, h, c)
        try:
            yield
        finally:
            self._override = None

    def _hook_point(self, p: str) -> HookPoint:
        return getattr(self, f"hook_{p}")

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        hooked = [p for p in POINTS if listened(self._hook_point(p))]
        if not hooked and not self.force_unrolled:
            if self._override is None:
                return self.rnn(x)[0]
            return self._fused_with_override(x)
        xi: Tensor | None = None  # x's share of the gates: only the read-out and the loop need it
        if self._override is None and not self.force_unrolled:
            values = {"h": self.rnn(x)[0]}
            if set(hooked) - {"h"}:
                xi = self._input_gates(x)
                values |= self._read_out(xi, values["h"], set(hooked) - {"h"})
        else:
            xi = self._input_gates(x)
            values, _ = self._unroll(xi, 0, {}, {}, set(hooked))
        if not hooked:
            return values["h"]
        # The fixed point. ``fed`` is what the last pass wrote over the computed values; ``valid`` is where that pass
        # stopped (later positions are the pass before's). The first pass after the fused one runs to the end: a
        # patch from a cache (the common edit) settles there. If the hooks still answer differently, their edit
        # depends on its input, and later passes stop at the first edited position whose input moved, so that an
        # edit at every position costs O(T) steps and hook calls, not O(T^2) steps.
        fed: Edits = {}
        t_len, valid, stepwise = x.shape[1], x.shape[1], False
        limit = (len(hooked) + 1) * t_len + 4  # a causal hook settles one (position, hook point) at least per pass
        for n_pass in range(limit):
            outputs, edits = self._call_hooks(values, hooked)
            start = _first_change(fed, edits, below=valid)
            if start is None and valid == t_len:
                return outputs.get("h", values["h"])
            stepwise = stepwise or n_pass > 0
            fed = edits
            xi = self._input_gates(x) if xi is None else xi
            values, valid = self._unroll(xi, valid if start is None else start, values, fed, set(hooked), stepwise)
        names = ", ".join(self._hook_point(p).name or f"hook_{p}" for p in hooked)
        raise ProbeError(f"hooks on {names} did not settle after {limit} passes: a hook on a recurrent state must be "
                         "causal and deterministic (its edit at t may use positions <= t only; draw noise once, "
                         "outside the hook)")

    def _fused_with_override(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        t, h_t, c_t = self._override  # type: ignore[misc]
        head, _ = self.rnn(x[:, : t + 1])
        tail, _ = self.rnn(x[:, t + 1 :], (h_t[None].contiguous(), c_t[None].contiguous()))
        return torch.cat([head[:, :t], h_t[:, None], tail], dim=1)

    def _input_gates(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos 4*d_model"]:
        r = self.rnn
        return F.linear(x, r.weight_ih_l0, r.bias_ih_l0 + r.bias_hh_l0)

    def _read_out(self, xi: Tensor, h: Float[Tensor, "batch pos d_model"], wanted: set[str]) -> dict[str, Tensor]:
        """Gates and c_t of the run that produced ``h``: the gates in one matmul from (x_t, h_{t-1}), c_t by an
        elementwise scan -- the fused kernel keeps both inside, and this costs a fraction of an unrolled loop."""
        if not wanted:
            return {}
        h_prev = F.pad(h[:, :-1], (0, 0, 1, 0))
        zi, zf, zg, zo = (xi + F.linear(h_prev, self.rnn.weight_hh_l0)).chunk(4, dim=-1)
        out = dict(zip(GATES, (torch.sigmoid(zi), torch.sigmoid(zf), torch.tanh(zg), torch.sigmoid(zo)), strict=True))
        if "c" in wanted:
            ig = out["i"] * out["g"]
            c = torch.zeros_like(h[:, 0])
            cs = []
            for t in range(h.shape[1]):
                c = out["f"][:, t] * c + ig[:, t]
                cs.append(c)
            out["c"] = torch.stack(cs, dim=1)
        return {p: v for p, v in out.items() if p in wanted}

    def _call_hooks(self, values: dict[str, Tensor], hooked: list[str]) -> tuple[dict[str, Tensor], Edits]:
        """Call each hooked point on its sequence; returns what they returned and which elements they changed."""
        outputs: dict[str, Tensor] = {}
        edits: Edits = {}
        for p in hooked:
            v = values[p]
            # a clone, so that a hook editing in place leaves the computed values to compare against
            y = self._hook_point(p)(v.clone())
            if y.shape != v.shape:
                raise ProbeError(f"a hook on {self._hook_point(p).name} returned shape {tuple(y.shape)}; "
                                 f"it must keep {tuple(v.shape)}")
            outputs[p] = y
            changed = _changed(y.detach(), v.detach())
            if changed is not None:
                edits[p] = (changed, y.detach())
        return outputs, edits

    def _unroll(self, xi: Tensor, start: int, previous: dict[str, Tensor], fed: Edits, wanted: set[str],
                stepwise: bool = False) -> tuple[dict[str, Tensor], int]:
        """The recurrence step by step from ``start`` (earlier positions are kept from ``previous``), writing ``fed``
        over the elements hooks edited. Returns the computed (pre-edit) values of ``wanted`` and of h and c, and the
        position where it stopped: the end, or with ``stepwise`` just after the first position that ``fed`` edits
        and whose computed value differs from ``previous`` (what the hooks last saw there); positions from there on
        are ``previous``'s."""
        wanted = wanted | {"h", "c"}
        b, t_len, _ = xi.shape
        d = xi.shape[-1] // 4
        if start > 0 and "c" not in previous:
            previous = previous | self._read_out(xi, previous["h"], {"c"})

        def feed(p: str, t: int, v: Tensor) -> Tensor:
            if p in fed and t in steps[p]:
                mask, new = fed[p]
                return torch.where(mask[:, t], new[:, t], v)
            return v

        steps = {p: set(mask.any(dim=2).any(dim=0).nonzero()[:, 0].tolist()) for p, (mask, _) in fed.items()}
        if start == 0:
            h = xi.new_zeros(b, d)
            c = xi.new_zeros(b, d)
        else:
            h = feed("h", start - 1, previous["h"][:, start - 1])
            c = feed("c", start - 1, previous["c"][:, start - 1])
        w_hh = self.rnn.weight_hh_l0.T
        gates_wanted = [p for p in GATES if p in wanted or p in fed]
        rec: dict[str, list[Tensor]] = {p: [] for p in wanted}
        override = self._override
        end = t_len
        for t in range(start, t_len):
            # few, fused ops per step: the backward pass walks every one of them T times
            z = torch.addmm(xi[:, t], h, w_hh)
            i, f, _, o = torch.sigmoid(z).chunk(4, dim=-1)  # PyTorch's gate order: i, f, g, o
            g = torch.tanh(z[:, 2 * d : 3 * d])
            if gates_wanted:
                gates = {"i": i, "f": f, "g": g, "o": o}
                for p in gates_wanted:
                    if p in rec:
                        rec[p].append(gates[p])
                    gates[p] = feed(p, t, gates[p])
                i, f, g, o = gates["i"], gates["f"], gates["g"], gates["o"]
            c = torch.addcmul(f * c, i, g)
            if override is not None and override[0] == t:
                c = override[2]
            rec["c"].append(c)
            c = feed("c", t, c)
            h = o * torch.tanh(c)
            if override is not None and override[0] == t:
                h = override[1]
            rec["h"].append(h)
            h = feed("h", t, h)
            if stepwise and any(t in steps[p] and not torch.equal(rec[p][-1], previous[p][:, t]) for p in fed):
                end = t + 1
                break
        return {p: torch.cat([previous[p][:, :start], torch.stack(vs, dim=1), previous[p][:, end:]], dim=1)
                if start or end < t_len else torch.stack(vs, dim=1) for p, vs in rec.items()}, end

    def unrolled(self, x: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Tensor]:
        """The same recurrence step by step, without calling any hook; returns (h, c), each (batch pos d_model)."""
        values, _ = self._unroll(self._input_gates(x), 0, {}, {}, set())
        return values["h"], values["c"]
