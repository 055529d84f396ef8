"""Train a live model -- yours from ``probe.wrap``, or one of probe's -- on any task's sampler, with every schedule.

``Trainer`` builds its model from a config and writes checkpoints that rebuild it; a model wrapped by hand and a
user's sampler say nothing about how to rebuild them, so this loop trains the model in place and returns what it
measured. Each step is the trainer's: the batch of ``train.seed * 1000003 + step`` at a length uniform in
``1..L_train``, the schedule's gate, what trains and its gradient policy, the learning-rate schedule, gradient
clipping, AdamW.
"""

from __future__ import annotations

import sys
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from probe import hardware
from probe.core.inputs import check_inputs
from probe.core.progress import progress_bar
from probe.core.task import IGNORE_INDEX, TaskSampler, as_sampler, need_train_length
from probe.errors import ProbeError
from probe.training.batches import train_batch_seed
from probe.training.config import TrainConfig, lr_at
from probe.training.schedule import Schedule
from probe.windows import accuracy_at_length

EVAL_FACTORS = (1, 2, 3)
"""Evaluation lengths, as multiples of L_train (the trainer's: ``{mask}_acc_{f}x``)."""


def draw_batch(sampler: TaskSampler, train_length: int, batch_size: int, seed: int) -> Any:
    """The batch of one step: a generator seeded with ``seed``, a length uniform in ``1..train_length``, then the
    batch at that length (probe's tasks draw it from the same generator, as ``training_batch`` does)."""
    g = torch.Generator().manual_seed(seed)
    length = int(torch.randint(1, train_length + 1, (1,), generator=g))
    return sampler.sample(length, batch_size, g)


def train_model(model: Any, task: Any, cfg: TrainConfig, train_length: int | None = None, watch: str | None = None,
                device: torch.device | str | None = None, progress: bool = False) -> pd.DataFrame:
    """Train ``model`` in place for ``cfg.steps`` steps on batches from ``task`` (probe's task or a sampler
    ``f(length, batch_size, seed)``, ``probe.core.task``) under ``cfg.schedule`` (``joint``, ``dat``, ``ramp``,
    ``frozen``, ``adaptive``, the stopgrad cuts, ...). ``train_length``: L_train, when the sampler does not say it;
    ``watch``: the mask whose in-range accuracy the ``adaptive`` schedule watches (default ``state``, else the
    batch's first mask). Returns one row per evaluation (every ``cfg.eval_every`` steps and the last):
    ``step, loss, gate, {mask}_acc_{f}x`` for each named mask and ``all``, f in ``EVAL_FACTORS``. Trains in fp32."""
    where = "probe.training.train_model"
    check_inputs(where, model=model)
    sampler = as_sampler(task, where, train_length)
    L = need_train_length(sampler, where, train_length)
    if cfg.precision not in ("fp32", "auto") or cfg.compile:
        raise ProbeError(f"{where}: trains in fp32 without compile; set train.precision=fp32 and compile=False (the "
                         "Trainer, with a factory, has the other precisions)")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    schedule = Schedule(cfg.schedule, cfg.steps, seed=cfg.seed)
    schedule.check_model(model)
    schedule.remember_initial(model)
    first = draw_batch(sampler, L, 1, train_batch_seed(cfg.seed, 0))
    watch = watch or ("state" if "state" in first.masks else next(iter(first.masks), "all"))
    optimizer = hardware.adamw(list(model.parameters()), cfg.optimizer_impl, device, lr=cfg.lr,
                               weight_decay=cfg.weight_decay)
    history: list[dict[str, Any]] = []
    running: float | None = None
    bar = progress_bar(cfg.steps, "train", progress)
    for step in range(cfg.steps):
        batch = draw_batch(sampler, L, cfg.batch_size, train_batch_seed(cfg.seed, step)).to(device)
        model.set_attention_gate(schedule.gate(step))
        for p in model.attention_parameters():
            p.requires_grad_(schedule.attention_trains(step))  # a parameter without a grad is not updated
        for p in model.recurrent_parameters():
            p.requires_grad_(schedule.recurrent_trains(step))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, step)
        model.train()
        optimizer.zero_grad(set_to_none=True)

        def loss_fn(batch: Any = batch, step: int = step) -> tuple[torch.Tensor, torch.Tensor]:
            logits = model(batch.tokens).float()
            loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
            if not torch.isfinite(loss):
                raise ProbeError(f"{where}: non-finite loss ({loss.item()}) at step {step}; try a lower train.lr")
            return logits, loss

        _, loss = schedule.gradient_policy(step).backward(model, loss_fn)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        done = step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            model.eval()
            row: dict[str, Any] = {"step": done, "loss": running, "gate": schedule.gate(done)}
            for f in EVAL_FACTORS:
                acc = accuracy_at_length(model, sampler, f * L, cfg.eval_samples, seed=cfg.seed)
                row.update({f"{s}_acc_{f}x": v["token_acc"] for s, v in acc.items()})
            if schedule.observe(done, row.get(f"{watch}_acc_1x", float("nan"))):
                print(f"step {done}: attention switched on ({watch} accuracy in range plateaued)", file=sys.stderr)
            history.append(row)
        bar.update(1)
    bar.close()
    model.set_attention_gate(schedule.gate(cfg.steps))
    return pd.DataFrame(history)
