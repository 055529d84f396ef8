"""Gradient policies: how one training step's gradient is taken, plainly or with attention's backward path cut for
some parameters. The live schedule (``schedule.Schedule.gradient_policy``) picks one per step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from probe.errors import ProbeError

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
    caller has zeroed). Returns ``(logits, loss)`` of the forward the step reports. ``log``, after ``backward``: what
    the step's gradient surgery did, as numbers the trainer writes to the run's ``metrics.jsonl`` for that step (None:
    nothing to record)."""

    log: dict[str, float | bool] | None = None

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


class CounterfactualPath(GradientPolicy):
    """Block ``block``'s recurrent sublayer (every block's if None) learns through attention as a counterfactual
    model computes it, never through the current model's attention:

        g_lstm = g_cut(theta) + [g_full(theta') - g_cut(theta')]

    where g_cut is the gradient with the stream detached at the attention of ``through`` (None: every block), g_full
    the plain one, theta the current weights and theta' the same with the parameters named in ``replaced`` at the
    values given there: attention's (and its pre-LN's) initial weights (``initial-attention``), its weights of k
    steps ago (``lagged-attention``), or every parameter's initial weights but the learning sublayer's own
    (``initial-model``). The bracket is the path through attention in that counterfactual; where theta' = theta the
    sum is the plain gradient. Every other parameter, attention included, gets the plain gradient. Four backward
    passes a step."""

    def __init__(self, block: int | None, through: tuple[int, ...] | None, replaced: dict[str, Tensor]) -> None:
        self.block, self.through, self.replaced = block, through, replaced

    def backward(self, model: Trainable, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        params = [p for p in model.recurrent_parameters(self.block) if p.requires_grad]
        if not params:
            return super().backward(model, loss_fn)
        cut = _grads(loss_fn, params, _detached(model, self.through))
        with _parameters_replaced(model, self.replaced):
            full_0 = _grads(loss_fn, params)
            cut_0 = _grads(loss_fn, params, _detached(model, self.through))
        logits, loss = super().backward(model, loss_fn)
        for p, c, f0, c0 in zip(params, cut, full_0, cut_0, strict=True):
            p.grad = c + (f0 - c0)
        return logits, loss


class AttentionHistory:
    """Attention's weights (and its pre-LN's) at each of the last ``lag`` steps, exactly, so that step t can learn
    through those of step t - lag (of step 0 while t < lag: the lag is then t). One copy of the chosen attention
    parameters per step kept, ``lag`` of them between steps (the 2-block, d_model 128 hybrid: 133k numbers, 0.5 MB a
    step in float32, 133 MB at lag 250). Resumable: ``state_dict`` holds every copy kept."""

    def __init__(self, names: list[str], lag: int) -> None:
        self.names, self.lag = names, lag
        self.kept: dict[int, dict[str, Tensor]] = {}

    def record(self, model: Trainable, step: int) -> None:
        """Keep the weights ``model`` holds at the start of ``step`` (recording a step again replaces it)."""
        params = dict(model.named_parameters())
        self.kept[step] = {n: params[n].detach().clone() for n in self.names}

    def lagged(self, model: Trainable, step: int) -> dict[str, Tensor]:
        """Record ``step``'s weights, return those of ``step - lag`` (step 0's before that) and forget what no later
        step needs."""
        self.record(model, step)
        source = max(step - self.lag, 0)
        if source not in self.kept:
            raise ProbeError(f"the gradient through attention's weights of {self.lag} steps ago needs those of step "
                             f"{source}, which this run did not keep (train from step 0, or resume from a checkpoint "
                             f"with its optimizer state)")
        weights = self.kept[source]
        for s in [s for s in self.kept if s < max(step + 1 - self.lag, 0)]:
            del self.kept[s]
        return weights

    def state_dict(self) -> list[list[Any]]:
        return [[s, dict(w)] for s, w in sorted(self.kept.items())]

    def load_state_dict(self, kept: list[list[Any]]) -> None:
        self.kept = {int(s): dict(w) for s, w in kept}


class LaggedAttentionPath(CounterfactualPath):
    """``CounterfactualPath`` through attention's weights of ``history.lag`` steps before ``step``, which it records
    as it runs (``AttentionHistory.lagged``): the recurrent sublayer learns through an attention mismatched with the
    forward pass by a controlled amount. Four backward passes a step."""

    def __init__(self, block: int | None, through: tuple[int, ...] | None, history: AttentionHistory,
                 step: int) -> None:
        super().__init__(block, through, {})
        self.history, self.step = history, step

    def backward(self, model: Trainable, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        self.replaced = self.history.lagged(model, self.step)
        return super().backward(model, loss_fn)


RANDOM_SEED_FORMULA = "2**40 + train.seed * 1000003 + step"
"""The seed of a step's random direction (``random_direction_seed``): a pure function of the run's seed and the step,
so a resumed run draws what the uninterrupted one would have, and apart from every batch seed."""


def random_direction_seed(seed: int, step: int) -> int:
    """The seed of the random direction of ``step`` in a run seeded ``seed`` (``RANDOM_SEED_FORMULA``)."""
    return (1 << 40) + seed * 1_000_003 + step


class RandomDirection(GradientPolicy):
    """Block ``block``'s recurrent sublayer (every block's if None) gets, in place of its gradient through attention,
    a random direction of the same norm, drawn afresh each step:

        g_lstm = g_cut + r,   r_p = |g_full,p - g_cut,p| z_p / |z_p|,   z_p ~ N(0, I)

    for each parameter tensor p, with g_cut the gradient with the stream detached at the attention of ``through``.
    The norm is matched per tensor rather than over the sublayer at once so that the injection is as large as
    attention's part in every tensor (input weights, recurrent weights, biases, the pre-LN): AdamW normalises each
    element by its own history, so a direction that moved norm between tensors would change the steps' sizes as well
    as their direction. z comes from a generator seeded by ``random_direction_seed(seed, step)`` on the CPU, the same
    on any device. Every other parameter gets the plain gradient. Two backward passes a step."""

    def __init__(self, block: int | None, through: tuple[int, ...] | None, seed: int) -> None:
        self.block, self.through, self.seed = block, through, seed

    def backward(self, model: Trainable, loss_fn: LossFn) -> tuple[Tensor, Tensor]:
        import torch

        params = [p for p in model.recurrent_parameters(self.block) if p.requires_grad]
        if not params:
            return super().backward(model, loss_fn)
        cut = _grads(loss_fn, params, _detached(model, self.through))
        logits, loss = super().backward(model, loss_fn)
        g = torch.Generator().manual_seed(self.seed)
        for p, c in zip(params, cut, strict=True):
            full = p.grad if p.grad is not None else torch.zeros_like(p)
            z = torch.randn(p.shape, generator=g).to(device=p.device, dtype=c.dtype)
            p.grad = c + torch.linalg.vector_norm(full - c) / torch.linalg.vector_norm(z) * z
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
    g_mlp where that is smaller: the cap binds). Every other parameter gets the plain gradient. Three backward passes
    a step. ``log`` holds, per step and before gradient clipping, |g_att| (``placebo_attention_norm``, what
    ``stopgrad-rnnN`` would remove), |g_mlp|, the norm removed, s, and whether the cap bound."""

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
        # what the match rests on, so that it can be recomputed from the run's log: the norm each path held, the
        # norm removed (from the MLP path; attention's is removed from nowhere) and whether the cap bound
        self.log = {"placebo_attention_norm": float(att_norm), "placebo_mlp_norm": float(mlp_norm),
                    "placebo_removed_norm": float(scale * mlp_norm), "placebo_scale": float(scale),
                    "placebo_cap_bound": bool(att_norm > mlp_norm)}
        return logits, loss
