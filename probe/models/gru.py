"""The GRU cell of the hooked recurrent sublayer: its hook points, its one step, and ``nn.GRU`` as its kernel."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from probe.models.recurrent import HookedRecurrent, InnerHookPoint, Put


class HookedGRU(HookedRecurrent):
    """One GRU layer as a sublayer (PyTorch's equations), with TransformerLens hook points on its gates and state.

    One step computes the reset and update gates ``r, z = sigmoid(W_i x_t + b_i + W_h h_{t-1} + b_h)``, then the
    candidate ``n = tanh(W_in x_t + b_in + r (W_hn h_{t-1} + b_hn))``, then ``h_t = (1 - z) n + z h_{t-1}``;
    ``hook_h`` is the layer's output and its only carried state.

    The candidate is an ``INTERMEDIATE`` value, not a gate: it is computed from the reset gate the hooks returned, so
    an edit of ``hook_r`` at t moves n_t and h_t, as the equations say. Editing ``hook_h`` at t is
    ``override_state(t, h)``; editing ``hook_z`` or ``hook_n`` at t moves h_t; nothing before t changes. Paths,
    settling and gradients are ``HookedRecurrent``'s, as for the LSTM: without hooks the layer is the fused
    ``nn.GRU``; hooks that only read get r, z (one matmul) and n (one more) computed beside it.
    """

    GATES = ("r", "z")
    STATES = ("h",)
    INTERMEDIATE = ("n",)

    def __init__(self, d_model: int, d_in: int | None = None) -> None:
        super().__init__()
        # d_in: the input's width where it differs from the state's (a user's nn.GRU served by ``probe.wrap``)
        self.rnn = nn.GRU(d_in or d_model, d_model, batch_first=True)
        self.hook_r = InnerHookPoint()  # [batch, pos, d_model]
        self.hook_z = InnerHookPoint()  # [batch, pos, d_model]
        self.hook_n = InnerHookPoint()  # [batch, pos, d_model]
        self.hook_h = HookPoint()  # [batch, pos, d_model]

    def fused(self, x: Float[Tensor, "batch pos d_model"],
              state: tuple[Tensor] | None = None) -> tuple[Tensor, tuple[Tensor]]:
        out, h = self.rnn(x, None if state is None else state[0][None].contiguous())
        return out, (h[0],)

    def input_share(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos 3*d_model"]:
        r = self.rnn
        d = r.hidden_size
        # r and z add both biases outside any product; the candidate's hidden bias sits inside r (...), so it stays
        # with the hidden share
        return F.linear(x, r.weight_ih_l0, r.bias_ih_l0 + F.pad(r.bias_hh_l0[: 2 * d], (0, d)))

    def gate_values(self, xi: Float[Tensor, "*batch 3*d_model"],
                    h_prev: Float[Tensor, "*batch d_model"]) -> tuple[Tensor, Tensor]:
        d = self.rnn.hidden_size
        w_hrz = self.rnn.weight_hh_l0[: 2 * d]
        xrz = xi[..., : 2 * d]
        z = torch.addmm(xrz, h_prev, w_hrz.T) if xi.dim() == 2 else xrz + F.linear(h_prev, w_hrz)
        r, u = torch.sigmoid(z).chunk(2, dim=-1)
        return r, u

    def _candidate(self, xi: Tensor, r: Tensor, h_prev: Tensor) -> Tensor:
        d = self.rnn.hidden_size
        hn = F.linear(h_prev, self.rnn.weight_hh_l0[2 * d :], self.rnn.bias_hh_l0[2 * d :])
        return torch.tanh(torch.addcmul(xi[..., 2 * d :], r, hn))

    def advance(self, xi_t: Tensor, gates: Sequence[Tensor], state: tuple[Tensor, ...], put: Put) -> tuple[Tensor]:
        r, z = gates
        h_prev = state[0]
        n = put("n", self._candidate(xi_t, r, h_prev))
        return (put("h", torch.lerp(n, h_prev, z)),)

    def read_out_states(self, xi: Tensor, gates: Sequence[Tensor], out: Tensor,
                        wanted: set[str]) -> dict[str, Tensor]:
        # n depends on the previous output only, not on a carried inner state: one call for all positions
        out_prev = torch.cat([out.new_zeros(out.shape[0], 1, out.shape[2]), out[:, :-1]], dim=1)
        return {"n": self._candidate(xi, gates[0], out_prev)} if "n" in wanted else {}

    def initial_state(self, batch: int, like: Tensor) -> tuple[Tensor]:
        return (like.new_zeros(batch, self.rnn.hidden_size),)
