"""The LSTM cell of the hooked recurrent sublayer: its hook points, its one step, and ``nn.LSTM`` as its kernel."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from probe.models.recurrent import HookedRecurrent, InnerHookPoint, Put

GATES = ("i", "f", "g", "o")
"""The LSTM's gates in PyTorch's order (the rows of ``weight_ih_l0``)."""


class HookedLSTM(HookedRecurrent):
    """One LSTM layer as a sublayer, with TransformerLens hook points on its gates and states.

    One step computes i, f, g, o from (x_t, h_{t-1}) (sigmoid, sigmoid, tanh, sigmoid; PyTorch's gate order), then
    ``c_t = f c_{t-1} + i g``, then ``h_t = o tanh(c_t)``; ``hook_h`` is the layer's output.

    **Edits are causal.** A hook sees the whole sequence, as every TransformerLens hook does, and what it returns at
    position t is the value the recurrence continues from: an edit of ``hook_h`` at t moves h_{t+1}, h_{t+2}, ...; an
    edit of ``hook_c`` at t moves h_t (computed from c_t) and everything later; an edit of a gate at t moves c_t and
    h_t. Editing ``hook_h`` and ``hook_c`` at t is ``override_state(t, h, c)``. Nothing before t changes.

    How (``HookedRecurrent``): with no hook attached (training, evaluation) the layer is the fused ``nn.LSTM``
    kernel. With hooks that only read (caching) it is the same kernel, with the gates and c_t recomputed beside it
    (one matmul and an elementwise scan). Where a hook changes some elements, the layer reruns the recurrence step by
    step from the first changed position and calls the hooks again, until they return what the recurrence was fed.
    A patch at any positions from a cache, or a constant, settles in two calls; an edit that depends on its input
    (adding a vector, scaling, projecting out a direction) in about T + 2 calls and 2T steps. So a hook on these
    points may be called more than once per forward; its last call sees the final values (a caching hook stores
    those). It must be causal and deterministic -- its edit at t may depend only on positions <= t, and random noise
    must be drawn once outside the hook -- or the forward raises ``ProbeError``.

    Gradients: edited elements are constants in the recurrence, as a patch from a cache is; every other element
    carries its gradient through time. A backward hook on ``hook_h`` sees the gradient of the loss with respect to the
    layer's output sequence (through the sublayers above, not through later steps of the recurrence); the gates and
    ``hook_c`` feed the output only inside the recurrence, so backward hooks on them never fire (adding one warns).
    """

    GATES = GATES
    STATES = ("h", "c")  # nn.LSTM's state order; h is the layer's output

    def __init__(self, d_model: int, d_in: int | None = None) -> None:
        super().__init__()
        # d_in: the input's width where it differs from the state's (a user's nn.LSTM served by ``probe.wrap``)
        self.rnn = nn.LSTM(d_in or d_model, d_model, batch_first=True)
        self.hook_i = InnerHookPoint()  # [batch, pos, d_model]
        self.hook_f = InnerHookPoint()  # [batch, pos, d_model]
        self.hook_g = InnerHookPoint()  # [batch, pos, d_model]
        self.hook_o = InnerHookPoint()  # [batch, pos, d_model]
        self.hook_c = InnerHookPoint()  # [batch, pos, d_model]
        self.hook_h = HookPoint()  # [batch, pos, d_model]

    def fused(self, x: Float[Tensor, "batch pos d_model"],
              state: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if state is not None:
            state = (state[0][None].contiguous(), state[1][None].contiguous())
        out, (h, c) = self.rnn(x, state)
        return out, (h[0], c[0])

    def input_share(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos 4*d_model"]:
        r = self.rnn
        return F.linear(x, r.weight_ih_l0, r.bias_ih_l0 + r.bias_hh_l0)

    def gate_values(self, xi: Float[Tensor, "*batch 4*d_model"],
                    h_prev: Float[Tensor, "*batch d_model"]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        w_hh = self.rnn.weight_hh_l0
        # one step is one fused op (the backward pass walks every op of the loop T times); a read-out of all
        # positions is one matmul
        z = torch.addmm(xi, h_prev, w_hh.T) if xi.dim() == 2 else xi + F.linear(h_prev, w_hh)
        i, f, _, o = torch.sigmoid(z).chunk(4, dim=-1)
        d = z.shape[-1] // 4
        return i, f, torch.tanh(z[..., 2 * d : 3 * d]), o

    def advance(self, xi_t: Tensor, gates: Sequence[Tensor], state: tuple[Tensor, ...],
                put: Put) -> tuple[Tensor, Tensor]:
        i, f, g, o = gates
        c = put("c", torch.addcmul(f * state[1], i, g))
        h = put("h", o * torch.tanh(c))
        return h, c

    def initial_state(self, batch: int, like: Tensor) -> tuple[Tensor, Tensor]:
        zeros = like.new_zeros(batch, self.rnn.hidden_size)
        return zeros, zeros
