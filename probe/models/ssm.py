"""A selective diagonal linear recurrence (a Mamba-style SSM cell) whose transitions are positive, signed or complex,
with the boundary (|a| = 1, a = -1) open or closed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from transformer_lens.hook_points import HookPoint

from probe.errors import ProbeError
from probe.models.recurrent import HookedRecurrent, InnerHookPoint, Put

RANGES = ("positive", "negative", "complex", "positive-closed", "negative-closed", "complex-closed")
"""Where the transition a_t lies: (0, 1), (-1, 1), or a complex number of modulus < 1 (the open ranges: the boundary is
only approached); and the same three with the boundary reached exactly at finite pre-activations: (0, 1], [-1, 1],
modulus in (0, 1] (``HookedSSM`` has the parametrisation). Magnitudes are at least e^-8 in all six."""

CLOSED_MARGIN = 0.05
"""δ of the ``-closed`` ranges: their transition is the open one's times (1 + δ), capped at modulus 1, so the cap
is reached where the open range's transition is still 1 / (1 + δ) ~ 0.95 -- a finite step size, not an infinite
one (``HookedSSM``)."""

MIN_LOG_MAGNITUDE = -8.0
"""log|a_t| is at least this (|a_t| >= 3.4e-4, a reset to well below float32's resolution of the state within a few
steps): it bounds the dynamic range of the log-space scan, ``CHUNK * 8 = 64`` nats within a chunk."""

CHUNK = 8
"""Positions per chunk of the scan. exp(-cumulative log|a|) within a chunk is at most e^64 ~ 6e27, far below
float32's 3e38 even times a large input; across chunks the state is carried step by step (T / CHUNK steps)."""


def chunked_scan(log_mag: Float[Tensor, "batch pos k"], u: Tensor, s0: Tensor, flip: Tensor | None = None,
                 phase: Tensor | None = None, chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """``s_t = a_t s_{t-1} + u_t`` for every t, with ``a_t = exp(log_mag_t)``, negated where ``flip`` (bool), or
    times ``exp(i phase_t)`` (``u`` and ``s0`` then complex). Returns every s_t (batch, pos, k) and the last one.

    Within a chunk, s_t = P_t (s_start + sum_{s <= t} u_s / P_s) with P_t the product of the transitions since the
    chunk began: P is exp of a cumulative sum of log-magnitudes (and of phases; a sign is the parity of the flips so
    far): every chunk at once in a handful of elementwise ops and cumsums. ``log_mag >= -8`` and
    the chunk size bound |log P| by 64, so 1/P neither overflows nor loses the terms it scales. Across chunks the
    start state is carried sequentially (a loop of T / chunk small steps)."""
    b, t_len, k = u.shape
    pad = (-t_len) % chunk
    if pad:  # padded steps have a = 1 and u = 0: the state passes through unchanged
        log_mag = F.pad(log_mag, (0, 0, 0, pad))
        u = F.pad(u, (0, 0, 0, pad))
        flip = None if flip is None else F.pad(flip, (0, 0, 0, pad))
        phase = None if phase is None else F.pad(phase, (0, 0, 0, pad))
    n = (t_len + pad) // chunk
    split = (b, n, chunk, k)
    log_p = log_mag.reshape(split).cumsum(2)
    if phase is not None:
        # torch's complex exp is not vectorised on the CPU: build exp(L + iΦ) and its inverse from real exp, cos, sin
        angle = phase.reshape(split).cumsum(2)
        mag, inv = log_p.exp(), (-log_p).exp()  # not 1 / p: a complex reciprocal divides by |p|^2, which underflows
        cos, sin = angle.cos(), angle.sin()
        p, p_inv = torch.complex(mag * cos, mag * sin), torch.complex(inv * cos, -inv * sin)
    else:
        p = log_p.exp()
        if flip is not None:  # the sign of a product of transitions: the parity of its flips (exact)
            p = p * (1 - 2 * flip.reshape(split).to(p.dtype).cumsum(2).remainder_(2))
        p_inv = p.reciprocal()  # |p| >= e^-64: no overflow
    local = p * (p_inv * u.reshape(split)).cumsum(2)  # each chunk's states from a zero start
    starts = []
    s = s0
    p_last, local_last = p[:, :, -1], local[:, :, -1]
    for j in range(n):
        starts.append(s)
        s = torch.addcmul(local_last[:, j], p_last[:, j], s)
    states = torch.addcmul(local, p, torch.stack(starts, dim=1)[:, :, None])
    return states.reshape(b, n * chunk, k)[:, :t_len], s


def _inverse_softplus(y: Tensor) -> Tensor:
    """The x with softplus(x) = y (y > 0)."""
    return y + torch.log(-torch.expm1(-y))


def _parts(a: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """log|a| (at least -8), and the flips (real a) or the phase (complex a) of the transitions ``a``."""
    log_mag = torch.log(a.abs()).clamp(min=MIN_LOG_MAGNITUDE)
    if a.is_complex():
        return log_mag, None, torch.angle(a)
    flip = a < 0
    return log_mag, flip if bool(flip.any()) else None, None


def _next(x: Tensor | None, fill: float) -> Tensor | None:
    """x_{t+1} at t, ``fill`` after the last position, in reversed time (the adjoint's transitions)."""
    if x is None:
        return None
    return torch.cat([x[:, 1:], torch.full_like(x[:, :1], fill)], dim=1).flip(1)


class LinearScan(torch.autograd.Function):
    """``s_t = a_t s_{t-1} + u_t`` (all real or all complex) with its own backward: the adjoint
    ``λ_t = g_t + conj(a_{t+1}) λ_{t+1}`` is the same scan run backwards in time, and then ``∂a_t = λ_t conj(s_{t-1})``,
    ``∂u_t = λ_t``, ``∂s_0 = conj(a_1) λ_1`` (PyTorch's convention for complex gradients). Exact where autograd
    through the log-space scan would not be: that differentiates log|a|, whose 1/|a| magnifies rounding where |a| is
    small; and it keeps a few tensors, not every intermediate of the scan. Magnitudes below e^-8 count as e^-8."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, u: Tensor, s0: Tensor) -> tuple[Tensor, Tensor]:
        log_mag, flip, phase = _parts(a)
        states, last = chunked_scan(log_mag, u, s0, flip=flip, phase=phase)
        ctx.save_for_backward(a, s0, states, log_mag, flip, phase)
        return states, last

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_states: Tensor | None, g_last: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        a, s0, states, log_mag, flip, phase = ctx.saved_tensors
        g = torch.zeros_like(states) if g_states is None else g_states
        if g_last is not None:
            g = g.clone()
            g[:, -1] += g_last
        # conj(a_{t+1}): the same magnitudes and flips, the opposite phase
        lam, _ = chunked_scan(_next(log_mag, 0.0), g.flip(1), torch.zeros_like(s0), flip=_next(flip, False),
                              phase=None if phase is None else -_next(phase, 0.0))
        lam = lam.flip(1)
        s_prev = torch.cat([s0[:, None], states[:, :-1]], dim=1)
        return lam * s_prev.conj(), lam, a[:, 0].conj() * lam[:, 0]


def linear_scan(a: Float[Tensor, "batch pos k"], u: Tensor, s0: Tensor) -> tuple[Tensor, Tensor]:
    """Every state of ``s_t = a_t s_{t-1} + u_t`` from ``s0``, and the last: ``chunked_scan`` forward, the adjoint
    scan backward (``LinearScan``)."""
    return LinearScan.apply(a, u, s0)


class HookedSSM(HookedRecurrent):
    """A selective (input-dependent) diagonal linear recurrence as a sublayer, with hook points on its transition,
    input gate and state.

    With k channels, from the normalised stream x_t one linear map gives (per channel) a step size, an input gate, a
    value and, for ``complex``, a phase; then

        Δ_t = softplus(·),  r_t = exp(max(-Δ_t exp(A_log), -8))   (0 < r_t < 1)
        a_t = r_t (positive) | 2 r_t - 1 (negative; |a_t| < e^-8 set to e^-8) | r_t exp(i θ_t) (complex)
        b_t = sigmoid(·),   s_t = a_t s_{t-1} + b_t v_t,   h_t = W_out s_t + b_out.

    and the closed ranges, with δ = ``CLOSED_MARGIN`` (0.05):

        r_t = exp(clamp(ln(1 + δ) - Δ_t exp(A_log), -8, 0)) = min(1, (1 + δ) exp(-Δ_t A))   (0 < r_t <= 1)
        a_t = r_t (positive-closed) | r_t exp(i θ_t) (complex-closed)
            | clamp((1 + δ)(2 ρ_t - 1), -1, 1) with ρ_t the open range's r_t (negative-closed; |a_t| < e^-8 as above)

    What comes from where: the selective step size Δ_t, the transition exp(Δ_t A) with A = -exp(A_log), and the
    initialisation of Δ's bias (inverse softplus of log-uniform values in [1e-3, 1e-1]) are Mamba's (Gu & Dao 2023,
    "Mamba: Linear-Time Sequence Modeling with Selective State Spaces"), one state per channel instead of a (channel,
    state) grid, and a sigmoid input gate b_t in the place of Δ_t B_t. ``negative`` is Grazzi et al.'s recipe (ICLR
    2025, "Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues"): the same transition mapped to
    2 a - 1, so that a flip (a = -1) is representable and parity is within reach. ``complex`` adds an
    input-dependent rotation, so a transition can act as an element of Z_m (θ = 2π d / m) -- the form that diagonal
    SSMs need for modular counting by Merrill et al. (ICML 2024, "The Illusion of State in State-Space Models") and
    Sarrof et al. (2024, "The Expressive Capacity of State Space Models: A Formal Language Perspective"), whose
    results say that a non-negative diagonal transition cannot represent parity at arbitrary lengths.

    **Closed ranges.** In the open ranges those constructions are only approached: a_t = -1 needs an infinite step
    size (the clamp at e^-8 stops a flip at 2 e^-8 - 1 = -0.99933, so a sign kept through n flips fades as
    0.99933^n), and |a_t| = 1 needs Δ_t exp(A_log) below float32's 2^-25, a step-size pre-activation near -17
    where softplus's gradient is e^-17: representable, but not where training goes. ``positive-closed``,
    ``negative-closed`` and ``complex-closed`` reach the boundary exactly at finite pre-activations. They keep the
    open ranges' Mamba parametrisation (the same Δ_t, A, θ_t and in_proj rows) and scale the transition by
    (1 + δ) before capping it, so a closed run differs from an open one in the boundary alone: |a_t| = 1 exactly
    once Δ_t exp(A_log) <= ln(1 + δ) (a pre-activation of ln(expm1(ln(1.05) / A)), -3.0 for A = 1, -5.8 for
    A = 16), and for ``negative-closed`` a_t = -1 exactly once ρ_t <= δ / (2 (1 + δ)), i.e. Δ_t exp(A_log) >= 3.74.
    (A (1 + δ) sigmoid(z) magnitude, the other obvious choice, has the same slope near the cap but drops A and the
    step size, the parts that the open ranges share with Mamba.) The cap is a hard clamp: a position whose
    transition is saturated passes no gradient to its step size (or A_log) -- a channel leaves the boundary only
    through its other positions, which share its in_proj row. That is the price of an exact 1 or -1; δ sets how
    close to the boundary a transition must come before it snaps on. **Initialisation**: Δ's bias is set so that
    at x_t = 0 every closed range starts at exactly the transitions the open range would (the same draw of dt):
    softplus(bias) = dt + ln(1 + δ) / A for positive- and complex-closed, and for negative-closed the Δ whose
    clamp((1 + δ)(2 ρ - 1)) is 2 exp(-dt A) - 1. Away from x_t = 0 a closed channel near 1 is more sensitive to its
    input (|d ln r / d pre-activation| is about dt A + ln(1 + δ) instead of dt A), so its slowest channels start at
    the cap on part of the tokens.

    **Sizes.** ``state`` real numbers in all: k = ``state`` channels for positive / negative, k = ``state / 2``
    complex channels for complex, stored as (real, imaginary) pairs: ``hook_state``'s element 2j is Re s_j and 2j + 1
    is Im s_j. So every range keeps the same memory and ``hook_state`` the same shape.

    **Hooks** (the same in the closed range as in the open one): ``hook_a`` (a_t, or its modulus r_t for the
    complex ranges), ``hook_theta`` (θ_t, complex ranges only), ``hook_b``,
    ``hook_state`` (s_t), ``hook_h`` (the output). The recurrence carries s only: editing ``hook_state`` at t moves
    h_t and everything after; editing a gate at t moves s_t on; editing ``hook_h`` at t changes the output at t
    alone (h is not fed back). ``override_state(t, h, state)`` sets both.

    **Paths.** The fused kernel is ``linear_scan``: ``chunked_scan`` (log-space, parallel within chunks) forward, the
    adjoint scan backward. ``advance`` is the plain step it is tested against, and what edits run through
    (``HookedRecurrent``); hooks that only read get the states from the scan. The cell always runs in float32 under
    autocast: the log-space scan needs float32's range and resolution.
    """

    STATES = ("h", "state")

    def __init__(self, d_model: int, state: int | None = None, kind: str = "positive") -> None:
        super().__init__()
        state = d_model if state is None else state
        if kind not in RANGES:
            raise ProbeError(f"unknown ssm_range {kind!r}; choose one of {', '.join(RANGES)}")
        self.kind = kind
        self.closed = kind.endswith("-closed")
        self.base = kind.removesuffix("-closed")  # the open range of the same shape: positive, negative or complex
        self.complex = self.base == "complex"
        if state < 1 or (self.complex and state % 2):
            raise ProbeError(f"ssm_state={state}: it must be positive, and even for {kind} (real, imaginary pairs)")
        self.n_state = state
        self.k = state // 2 if self.complex else state
        self.GATES = ("a", "theta", "b") if self.complex else ("a", "b")  # per instance: only complex has a phase
        k = self.k
        # x's share: [step size (k), phase (k, complex only), input gate (k), value (state)]
        self.sizes = (k, k, k, state) if self.complex else (k, k, state)
        self.in_proj = nn.Linear(d_model, sum(self.sizes))
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, k)))
        self.out_proj = nn.Linear(state, d_model)
        with torch.no_grad():
            dt = torch.exp(torch.empty(k).uniform_(math.log(1e-3), math.log(1e-1)))
            self.in_proj.bias[:k] = _inverse_softplus(self._closed_step(dt.double()) if self.closed else dt)
            if self.complex:
                self.in_proj.bias[k : 2 * k] = 0.0
        self.hook_a = InnerHookPoint()  # [batch, pos, k]
        if self.complex:
            self.hook_theta = InnerHookPoint()  # [batch, pos, k]
        self.hook_b = InnerHookPoint()  # [batch, pos, k]
        self.hook_state = InnerHookPoint()  # [batch, pos, state]
        self.hook_h = HookPoint()  # [batch, pos, d_model]

    def _closed_step(self, dt: Tensor) -> Tensor:
        """The step size at which this closed range's transition equals the open range's exp(-dt A) (positive,
        complex) or 2 exp(-dt A) - 1 (negative) -- the initialisation the class docstring states."""
        a_mag = self.A_log.detach().double().exp()
        if self.base != "negative":
            return dt + math.log1p(CLOSED_MARGIN) / a_mag
        target = 2 * torch.exp(-dt * a_mag) - 1  # the open negative range's a; |target| < 1, so rho is in (0, 1)
        rho = (target / (1 + CLOSED_MARGIN) + 1) / 2
        return -torch.log(rho) / a_mag

    def extra_repr(self) -> str:
        return f"kind={self.kind}, state={self.n_state}"

    # --- the cell ------------------------------------------------------------------------------------------------
    def input_share(self, x: Float[Tensor, "batch pos d_model"]) -> Tensor:
        return self.in_proj(x)

    def gate_values(self, xi: Tensor, h_prev: Tensor | None = None) -> tuple[Tensor, ...]:
        # selective: the gates depend on x_t only, never on the previous output
        # split, not slices: the backward of one split is one cat, that of each slice a zero-filled copy of xi
        parts = xi.split(self.sizes, dim=-1)
        log_r = -F.softplus(parts[0]) * self.A_log.exp()
        if self.closed and self.base != "negative":  # capped at 0: r = 1 exactly, and no gradient, once saturated
            log_r = (log_r + math.log1p(CLOSED_MARGIN)).clamp(MIN_LOG_MAGNITUDE, 0.0)
        else:
            log_r = log_r.clamp(min=MIN_LOG_MAGNITUDE)
        r = log_r.exp()
        b = torch.sigmoid(parts[-2])
        if self.complex:
            return r, parts[1], b
        if self.base == "negative":
            # |a| below e^-8 is set to e^-8 (a sign there is immaterial, and one masked fill is far cheaper than a
            # sign-preserving bound)
            a = 2 * r - 1
            if self.closed:  # a = -1 and a = 1 exactly, and no gradient, once saturated
                a = ((1 + CLOSED_MARGIN) * a).clamp(-1.0, 1.0)
            eps = math.exp(MIN_LOG_MAGNITUDE)
            return a.masked_fill(a.abs() < eps, eps), b
        return r, b

    def transition(self, gates: Sequence[Tensor]) -> Tensor:
        """a_t, what the scan multiplies each channel's state by, from the gates ``gate_values`` gives: complex
        r_t e^{i θ_t} for ``complex``, else real. ``_states`` scans with exactly this, and ``probe.transitions`` reads
        it, so a channel's measured modulus and phase are those the recurrence applies."""
        if self.complex:
            r, theta = gates[0], gates[1]
            return torch.polar(r, theta)
        return gates[0]

    def _value(self, xi: Tensor) -> Tensor:
        return xi.split(self.sizes, dim=-1)[-1]

    def advance(self, xi_t: Tensor, gates: Sequence[Tensor], state: tuple[Tensor, ...],
                put: Put) -> tuple[Tensor, Tensor]:
        s_prev, v = state[1], self._value(xi_t)
        if self.complex:
            r, theta, b = gates
            re, im = s_prev.unflatten(-1, (self.k, 2)).unbind(-1)
            v_re, v_im = v.unflatten(-1, (self.k, 2)).unbind(-1)
            c, sn = r * torch.cos(theta), r * torch.sin(theta)
            s = torch.stack([c * re - sn * im + b * v_re, sn * re + c * im + b * v_im], dim=-1).flatten(-2)
        else:
            a, b = gates
            s = torch.addcmul(a * s_prev, b, v)
        s = put("state", s)
        return put("h", self.out_proj(s)), s

    def initial_state(self, batch: int, like: Tensor) -> tuple[Tensor, Tensor]:
        return like.new_zeros(batch, self.out_proj.out_features), like.new_zeros(batch, self.n_state)

    # --- the fast path ------------------------------------------------------------------------------------------
    def _states(self, xi: Tensor, gates: Sequence[Tensor], s0: Tensor | None) -> tuple[Tensor, Tensor]:
        """Every s_t by ``linear_scan`` from the gates (those ``advance`` reads), and the last."""
        b_size = xi.shape[0]
        v = self._value(xi)
        if s0 is None:
            s0 = xi.new_zeros(b_size, self.n_state)
        a, b = self.transition(gates), gates[-1]
        if self.complex:
            u = torch.view_as_complex((b[..., None] * v.unflatten(-1, (self.k, 2))).contiguous())
            s0c = torch.view_as_complex(s0.unflatten(-1, (self.k, 2)).contiguous())
            states, last = linear_scan(a, u, s0c)
            return torch.view_as_real(states).flatten(-2), torch.view_as_real(last).flatten(-2)
        return linear_scan(a, b * v, s0)

    def fused(self, x: Float[Tensor, "batch pos d_model"],
              state: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        xi = self.input_share(x)
        states, last = self._states(xi, self.gate_values(xi), None if state is None else state[1])
        out = self.out_proj(states)
        return out, (out[:, -1], last)

    def read_out_states(self, xi: Tensor, gates: Sequence[Tensor], out: Tensor,
                        wanted: set[str]) -> dict[str, Tensor]:
        return {"state": self._states(xi, gates, None)[0]} if "state" in wanted else {}

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                return self._forward(x.float())
        return self._forward(x)
