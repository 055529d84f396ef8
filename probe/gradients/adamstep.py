"""AdamW's real next update of the recurrent weights at a snapshot, from its saved state, split into additive parts.

For theta (each recurrent cell's own weights, ``lstm_parameters``) torch's AdamW takes, at its step t (1-based, the
one after the snapshot's), with the step's gradient g (after the trainer's gradient clipping):

    m' = b1 m + (1 - b1) g,   v' = b2 v + (1 - b2) g^2,   denom = sqrt(v') / sqrt(1 - b2^t) + eps
    theta' = theta (1 - lr wd) - lr / (1 - b1^t) * m' / denom

so the update ``u = theta - theta'`` is ``lr wd theta + s m' / denom``, ``s = lr / (1 - b1^t)``. It is linear in m'
once denom is fixed, so with g = g_att + g_rec (g_rec: the gradient with attention's inputs detached, times the
step's clipping coefficient; g_att: the rest of the run's own gradient) it splits exactly into

    att      = s (1 - b1) g_att / denom      attention's part of this step's gradient
    rec      = s (1 - b1) g_rec / denom      the recurrent part of this step's gradient
    momentum = s b1 m / denom                what the first moment carries from earlier steps (both paths' history,
                                             which the saved m does not tell apart)
    decay    = lr wd theta                   decoupled weight decay

whose sum is u (to float rounding). Each part goes through the real step's own denominator: v' is built from the
whole g, and the preconditioner is the optimizer's, not re-estimated per part (a part's own g^2 would change the
scale of every coordinate, not the direction the real step takes). The moments are the optimizer's own
(``source`` ``"adamw-state"``): a snapshot written with ``train.traj_optimizer=true`` or a ``last.pt``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from probe import hardware
from probe.checkpoint import Checkpoint
from probe.core.gates import attention_gates
from probe.errors import ProbeError
from probe.gradients.decomposition import Cut, attention_inputs_detached, check_has_lstm, flat_grad
from probe.tasks import IGNORE_INDEX
from probe.training.config import TrainConfig
from probe.training.schedule import Schedule
from probe.training.state import step_state

PARTS = ("att", "rec", "momentum", "decay")
SOURCE = "adamw-state"


@dataclass(frozen=True)
class AdamWState:
    """AdamW's state for theta (flat, in the order of ``lstm_parameters``) and the hyperparameters of its next step.
    ``step`` counts the steps taken so far (0: none; the next is step + 1); ``lr`` is the next step's."""

    m: Tensor
    v: Tensor
    step: int
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    source: str = SOURCE


def check_optimizer_state(optimizer_state: dict[str, Any] | None, name: str = "<state>") -> None:
    """Refuse, in one line that says how to get one, a checkpoint without AdamW's state (a weights-only snapshot,
    ``final.pt``): a check that loads nothing, so a command can make it before any work."""
    if not optimizer_state or "param_groups" not in optimizer_state:
        raise ProbeError(f"{name}: holds no optimizer state, so AdamW's real next step cannot be computed; write "
                         "snapshots with --set train.traj_optimizer=true --set train.traj_dtype=float32, or use the "
                         "run's last.pt")


def check_real_step(ckpt: Checkpoint, optimizer: bool = True, name: str | None = None) -> None:
    """What ``next_update`` needs and a checkpoint may lack, checked from what it holds alone: AdamW's state (unless
    ``optimizer`` is false: a state given from elsewhere), and a gradient policy the update can be rebuilt for.
    ``name``: how the error names the checkpoint (default its file name)."""
    name = name or ckpt.name
    if optimizer:
        check_optimizer_state(ckpt.optimizer_state, name)
    cut_mode = TrainConfig.from_dict(ckpt.train_config).schedule.cut_mode
    if cut_mode in ("initial-attention", "initial-model", "lagged-attention"):
        raise ProbeError(f"{name}: the {cut_mode} cut needs weights the snapshot does not hold; the real step is "
                         "computed for joint, stopgrad and random-path runs")


def adamw_state(optimizer_state: dict[str, Any] | None, model: Any, lr: float, name: str = "<state>",
                ) -> AdamWState:
    """theta's AdamW state from an optimizer ``state_dict()`` over ``model.parameters()`` (its integer ids follow
    that order), with ``lr`` the learning rate of the next step. Before the first step the moments are zero."""
    theta = check_has_lstm(model)
    check_optimizer_state(optimizer_state, name)
    groups = optimizer_state["param_groups"]
    ids = [i for g in groups for i in g["params"]]
    params = list(model.parameters())
    if len(ids) != len(params):
        raise ProbeError(f"{name}: its optimizer state covers {len(ids)} parameters, the model has {len(params)}")
    index = {id(p): i for p, i in zip(params, ids, strict=True)}
    group_of = {i: g for g in groups for i in g["params"]}
    group = group_of[index[id(theta[0])]]
    if group.get("amsgrad") or group.get("maximize"):
        raise ProbeError(f"{name}: AdamW ran with amsgrad or maximize, which this update does not model")
    if any(group_of[index[id(p)]] is not group for p in theta):
        raise ProbeError(f"{name}: the recurrent weights sit in several parameter groups; one group is expected")
    ms, vs, steps = [], [], set()
    for p in theta:
        s = optimizer_state["state"].get(index[id(p)], {})
        ms.append(s["exp_avg"].double().flatten() if "exp_avg" in s else torch.zeros(p.numel(), dtype=torch.float64))
        vs.append(s["exp_avg_sq"].double().flatten() if "exp_avg_sq" in s else
                  torch.zeros(p.numel(), dtype=torch.float64))
        steps.add(int(float(s["step"])) if "step" in s else 0)
    if len(steps) != 1:
        raise ProbeError(f"{name}: the recurrent weights' AdamW step counts differ ({sorted(steps)})")
    b1, b2 = (float(b) for b in group["betas"])
    return AdamWState(torch.cat(ms), torch.cat(vs), steps.pop(), float(lr), b1, b2, float(group["eps"]),
                      float(group["weight_decay"]))


def denominator(state: AdamWState, g: Tensor) -> Tensor:
    """The next step's ``sqrt(v') / sqrt(1 - b2^t) + eps``, t = step + 1."""
    t = state.step + 1
    v = state.beta2 * state.v.to(g) + (1 - state.beta2) * g * g
    return v.sqrt() / (1 - state.beta2 ** t) ** 0.5 + state.eps


def update_parts(theta: Tensor, g_att: Tensor, g_rec: Tensor, state: AdamWState) -> dict[str, Tensor]:
    """The parts of the next update (module docstring) in float64, flat; ``full`` is their sum."""
    theta, g_att, g_rec = theta.double(), g_att.double(), g_rec.double()
    t = state.step + 1
    denom = denominator(state, g_att + g_rec)
    s = state.lr / (1 - state.beta1 ** t)
    parts = {"att": s * (1 - state.beta1) * g_att / denom, "rec": s * (1 - state.beta1) * g_rec / denom,
             "momentum": s * state.beta1 * state.m.to(theta) / denom,
             "decay": state.lr * state.weight_decay * theta}
    parts["full"] = sum(parts[p] for p in PARTS)
    return parts


@dataclass
class RealStep:
    """The next update at a snapshot: its parts (``update_parts``), the clipped gradient's parts, the clipping
    coefficient, the step's training loss, the denominator and the state used."""

    parts: dict[str, Tensor]
    g_att: Tensor
    g_rec: Tensor
    clip: float
    loss: float
    denom: Tensor
    state: AdamWState


def _loss_fn(model: Any, batch: Any, precision: str) -> Any:
    """The trainer's loss (``Trainer._loss``): the forward under bf16 autocast unless the run trained in fp32."""
    def fn() -> tuple[Tensor, Tensor]:
        device = batch.tokens.device.type
        with torch.autocast(device, dtype=torch.bfloat16, enabled=precision != "fp32"):
            logits = model(batch.tokens)
        logits = logits.float()
        return logits, F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
    return fn


def next_update(ckpt: Checkpoint, model: Any | None = None, cut: Cut = attention_inputs_detached,
                state: AdamWState | None = None) -> RealStep:
    """AdamW's next update of theta at ``ckpt`` as the run takes it: the batch, gates, learning rate, trained
    parameters, gradient policy, precision and gradient clipping of the snapshot's step (``probe.training.state``),
    from the optimizer state the checkpoint holds. ``model`` (default: built from ``ckpt``) is left with its gates
    and ``requires_grad`` flags as they were and without gradients. ``state`` overrides the optimizer state read
    from the checkpoint (the tests pass a wrong one and see the update disagree with torch's step)."""
    model = model if model is not None else ckpt.build_model()
    cfg = TrainConfig.from_dict(ckpt.train_config)
    at = step_state(ckpt)
    device = next(model.parameters()).device
    check_real_step(ckpt, optimizer=state is None)
    state = state if state is not None else adamw_state(ckpt.optimizer_state, model, at.lr if at.lr is not None
                                                        else cfg.lr, ckpt.name)
    schedule = Schedule(cfg.schedule, cfg.steps, seed=cfg.seed)
    schedule.load_state_dict(ckpt.extra.get("schedule_state") or {})
    # the precision the run trained in, as it recorded it (older runs: what the config gives on this device)
    precision = str(ckpt.extra.get("precision_used") or hardware.precision_used(cfg.precision, device)[0])
    batch = at.draw(ckpt.task_config, at.batch_size, at.batch_seed).to(device)
    theta = check_has_lstm(model)
    flags = [p.requires_grad for p in model.parameters()]
    trains_att, trains_rec = schedule.attention_trains(at.step), schedule.recurrent_trains(at.step)
    att_ids = {id(p) for p in model.attention_parameters()}
    rec_ids = {id(p) for p in model.recurrent_parameters()}
    was_training = model.training
    layers = list(getattr(model, "lstm_layers", []))
    fp32_before = [getattr(layer, "fp32_recurrence", False) for layer in layers]
    try:
        for p in model.parameters():  # as the trainer's _apply_schedule: a frozen parameter gets no gradient
            p.requires_grad_(trains_att if id(p) in att_ids else trains_rec if id(p) in rec_ids else True)
            p.grad = None
        if hasattr(model, "set_fp32_recurrence"):
            model.set_fp32_recurrence(precision == "bf16+fp32-recurrence")
        model.train()
        fn = _loss_fn(model, batch, precision)
        with attention_gates(model, schedule.gate(at.step)), torch.enable_grad():
            _, loss = schedule.gradient_policy(at.step).backward(model, fn)
            total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
            g = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in theta]).double()
            with cut(model):
                g_rec = flat_grad(fn()[1], theta).double() if trains_rec else torch.zeros_like(g)
    finally:
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)
            p.grad = None
        for layer, before in zip(layers, fp32_before, strict=True):
            if hasattr(layer, "fp32_recurrence"):
                layer.fp32_recurrence = before
        model.train(was_training)
    # clip_grad_norm_'s own coefficient, so that g_rec is scaled as the step's g was
    clip = min(1.0, cfg.grad_clip / (total + 1e-6))
    g_rec = g_rec * clip
    flat = torch.cat([p.detach().flatten() for p in theta])
    parts = update_parts(flat, g - g_rec, g_rec, state)
    return RealStep(parts, g - g_rec, g_rec, clip, float(loss.detach()), denominator(state, g), state)
