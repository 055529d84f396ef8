"""Gradient policies: how one training step's gradient is taken, plainly or with attention's backward path cut for
some parameters. The live schedule (``schedule.Schedule.gradient_policy``) picks one per step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor, nn

    from probe.models import HookedSequenceModel
    from probe.wrapped import WrappedModel

    Trainable = HookedSequenceModel | WrappedModel
    """What the trainer trains: probe's own model, or a wrapped one (the same gate, cut and parameter methods)."""

LossFn = Callable[[], "tuple[Tensor, Tensor]"]
"""Runs the model's forward on the step's batch and returns ``(logits, loss)``."""


class GradientPolicy:
    """Takes one step's gradient: runs ``loss_fn`` and leaves the gradient in each parameter's ``.grad`` (which the
    caller has zeroed). Returns ``(logits, loss)`` of the forward the step reports."""

    def backward(self, model: Trainable, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        logits, loss = loss_fn()
        loss.backward()
        return logits, loss


PLAIN = GradientPolicy()


def _detached(model: Trainable, blocks: tuple[int, ...] | None) -> AbstractContextManager[None]:
    """Within the block the stream entering the attention of ``blocks`` (None: every block; on a wrapped model, the
    inputs of the ``blocks``-th named attention modules) is detached: the model's own ``attention_detached``."""
    return model.attention_detached(blocks)


class DetachAttention(GradientPolicy):
    """Every parameter's gradient through attention is cut: the stream is detached where it enters attention, so
    attention's own weights still learn but nothing below it learns through it."""

    def __init__(self, blocks: tuple[int, ...] | None = None) -> None:
        self.blocks = blocks

    def backward(self, model: Trainable, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        with _detached(model, self.blocks):
            return super().backward(model, loss_fn)


def _grads(loss_fn: LossFn, params: list[nn.Parameter], *contexts: Any) -> list[Tensor]:
    """The gradient of ``params`` in a forward run inside ``contexts`` (zeros where a parameter is unreached)."""
    import torch

    with ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        _, loss = loss_fn()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


@contextmanager
def _mlp_inputs_detached(model: HookedSequenceModel) -> Iterator[None]:
    """Within the block the stream entering every MLP sublayer is detached (a hook on its pre-LN; the stream itself
    and the forward values are untouched)."""
    handles = [b.ln_mlp.register_forward_pre_hook(lambda _m, args: (args[0].detach(), *args[1:]))
               for b in model.blocks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _parameters_replaced(model: HookedSequenceModel, values: dict[str, Tensor]) -> Iterator[None]:
    """Within the block the named parameters read as ``values`` (constants), as ``torch.func.functional_call`` would;
    the model's own parameters (and their optimizer state) are untouched and back on exit."""
    saved = []
    try:
        for name, value in values.items():
            prefix, _, leaf = name.rpartition(".")
            module = model.get_submodule(prefix)
            saved.append((module, leaf, module._parameters[leaf]))
            module._parameters[leaf] = value
        yield
    finally:
        for module, leaf, param in reversed(saved):
            module._parameters[leaf] = param


class SplitCut(GradientPolicy):
    """One side's gradient through attention is cut, the other's kept: a forward with the stream detached at
    attention gives the cut side's gradient (for the LSTM weights, the ``g_rec`` of probe.gradients), a plain forward
    and backward the rest; the cut side's ``.grad`` is then replaced. Two backward passes a step."""

    def __init__(self, side: str, block: int | None = None, through: tuple[int, ...] | None = None) -> None:
        self.side, self.block, self.through = side, block, through

    def parameters(self, model: Trainable) -> list[nn.Parameter]:
        """The parameters whose gradient avoids attention."""
        if self.side == "recurrent":
            return model.recurrent_parameters(self.block)
        rec = {id(p) for p in model.recurrent_parameters()}
        return [p for p in model.parameters() if id(p) not in rec]

    def backward(self, model: Trainable, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        import torch

        params = self.parameters(model)
        trained = [p for p in params if p.requires_grad]
        with _detached(model, self.through):
            _, cut_loss = loss_fn()
            grads = torch.autograd.grad(cut_loss, trained, allow_unused=True) if trained else ()
        found = dict(zip(map(id, trained), grads, strict=True))
        logits, loss = super().backward(model, loss_fn)
        for p in params:  # these learn only from paths that avoid attention
            p.grad = found.get(id(p))  # None where the parameter is frozen or unreached, as after a plain backward
        return logits, loss


class InitialAttentionPath(GradientPolicy):
    """Block ``block``'s recurrent sublayer (every block's if None) learns through attention as it was at
    initialisation, never through the attention that has learned since:

        g_lstm = g_cut(theta) + [g_full(theta_0) - g_cut(theta_0)]

    where g_cut is the gradient with the stream detached at the attention of ``through`` (None: every block), g_full
    the plain one, theta the current weights and theta_0 the same with those attentions' weights (and their pre-LN)
    at their initial values. The bracket is the path through the initial attention; at step 0 the sum is the plain
    gradient. Every other parameter, attention included, gets the plain gradient. Four backward passes a step."""

    def __init__(self, block: int | None, through: tuple[int, ...] | None, initial: dict[str, Tensor]) -> None:
        self.block, self.through, self.initial = block, through, initial

    def backward(self, model: Trainable, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        params = [p for p in model.recurrent_parameters(self.block) if p.requires_grad]
        if not params:
            return super().backward(model, loss_fn)
        cut = _grads(loss_fn, params, _detached(model, self.through))
        with _parameters_replaced(model, self.initial):
            full_0 = _grads(loss_fn, params)
            cut_0 = _grads(loss_fn, params, _detached(model, self.through))
        logits, loss = super().backward(model, loss_fn)
        for p, c, f0, c0 in zip(params, cut, full_0, cut_0, strict=True):
            p.grad = c + (f0 - c0)
        return logits, loss


class MlpPlacebo(GradientPolicy):
    """A placebo for ``stopgrad-rnnN``: block ``block``'s recurrent sublayer (every block's if None) loses as much
    gradient norm as the cut through attention would remove, but from a path that is not attention's. With g_full the
    plain gradient, g_na the gradient with the stream detached at every attention, and g_none the gradient with it
    detached at every attention and every MLP:

        g_att = g_full - g_na     (every path through some attention: kept whole)
        g_mlp = g_na - g_none     (every path through some MLP and no attention: the placebo's path)
        g_lstm = g_full - s * g_mlp,   s = min(1, |g_att| / |g_mlp|)

    norms taken over the sublayer's parameters together, so the removed norm |s * g_mlp| equals |g_att| (or is all of
    g_mlp where that is smaller). Every other parameter gets the plain gradient. Three backward passes a step."""

    def __init__(self, block: int | None) -> None:
        self.block = block

    def backward(self, model: Trainable, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        import torch

        params = [p for p in model.recurrent_parameters(self.block) if p.requires_grad]
        if not params:
            return super().backward(model, loss_fn)
        no_att = _grads(loss_fn, params, _detached(model, None))
        neither = _grads(loss_fn, params, _detached(model, None), _mlp_inputs_detached(model))
        logits, loss = super().backward(model, loss_fn)
        full = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        att_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(f - n)
                                                         for f, n in zip(full, no_att, strict=True)]))
        mlp = [n - z for n, z in zip(no_att, neither, strict=True)]
        mlp_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m) for m in mlp]))
        scale = torch.clamp(att_norm / mlp_norm, max=1.0) if mlp_norm > 0 else mlp_norm.new_zeros(())
        for p, f, m in zip(params, full, mlp, strict=True):
            p.grad = f - scale * m
        return logits, loss
