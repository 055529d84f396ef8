"""What an analysis needs from a task: token ids, labels with an ignore index and named position masks, or a sampler.

probe's synthetic tasks (``probe.tasks``) are one implementation of this interface, never a requirement. A user's
task is any of:

- a batch: probe's ``Batch``, a ``TaskBatch``, a dataclass or object with ``tokens``, ``labels`` and ``masks``
  attributes, a dict with those keys, or a tuple ``(tokens, labels, masks[, targets])``;
- a sampler: a callable ``f(length, batch_size, seed)`` that returns one of those batches, or anything with such a
  ``sample`` method (probe's ``TaskConfig``).

``as_batch`` and ``as_sampler`` take any of these and refuse in one ``ProbeError`` line what they cannot read. Each
analysis calls one of them first. This module sits in ``probe.core``, below the tasks and the models: it imports
neither (probe's ``Batch`` already has the interface's attributes, so it passes through unchanged).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from probe.errors import ProbeError

IGNORE_INDEX = -100
"""Label value at positions where nothing is asked (``torch.nn.functional.cross_entropy``'s default). A user's
batch may use another value (``as_batch(..., ignore_index=-1)``): it is rewritten to this one, so that every model's
loss (which ignores ``IGNORE_INDEX``) and every analysis read the same labels."""

Sampler = Callable[[int, int, int], Any]
"""``f(length, batch_size, seed)``: a batch of ``batch_size`` sequences of ``length`` positions, the same for the
same seed."""


@dataclass
class TaskBatch:
    """One batch of any task: ``tokens`` and ``labels`` ``(batch, prefix_len + length)``, labels ``IGNORE_INDEX``
    where nothing is asked; ``masks[name]`` (bool, same shape) where part ``name`` of the task asks; ``targets[name]``
    any per-position target an analysis may read (a probe's, a chance floor's), ``-1`` where it has none;
    ``prefix_len``: positions before the stream (a dictionary, a prompt), which the windows of positions beyond the
    training length do not count."""

    tokens: Tensor
    labels: Tensor
    masks: dict[str, Tensor] = field(default_factory=dict)
    targets: dict[str, Tensor] = field(default_factory=dict)
    prefix_len: int = 0

    @property
    def length(self) -> int:
        """Stream positions (the prefix not counted)."""
        return self.tokens.shape[1] - self.prefix_len

    @property
    def answer_mask(self) -> Tensor:
        return self.labels != IGNORE_INDEX

    def to(self, device: torch.device | str) -> TaskBatch:
        return TaskBatch(self.tokens.to(device), self.labels.to(device),
                         {k: v.to(device) for k, v in self.masks.items()},
                         {k: v.to(device) for k, v in self.targets.items()}, self.prefix_len)

    def rows(self, index: Tensor | slice) -> TaskBatch:
        """The sequences ``index`` selects, every tensor alike."""
        return TaskBatch(self.tokens[index], self.labels[index], {k: v[index] for k, v in self.masks.items()},
                         {k: v[index] for k, v in self.targets.items()}, self.prefix_len)


BATCH_FORMS = ("a Batch (tokens, labels, named masks), e.g. task.sample(length, batch_size, seed), or your own: a "
               "TaskBatch, an object or dict with tokens, labels and masks, a tuple (tokens, labels, masks)")


def _got(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a Tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _fields(x: Any) -> dict[str, Any] | None:
    """The batch's parts by name, or None when ``x`` is not a batch in any form."""
    if isinstance(x, Mapping):
        return dict(x) if "tokens" in x and "labels" in x else None
    if isinstance(x, tuple) and 2 <= len(x) <= 4 and all(isinstance(t, Tensor) for t in x[:2]):
        return dict(zip(("tokens", "labels", "masks", "targets"), x, strict=False))
    if isinstance(getattr(x, "tokens", None), Tensor) and isinstance(getattr(x, "labels", None), Tensor):
        out = {k: getattr(x, k) for k in ("tokens", "labels", "masks", "targets", "prefix_len") if hasattr(x, k)}
        if "targets" not in out and isinstance(getattr(x, "sums", None), Tensor):
            out["targets"] = {"sums": x.sums}  # probe's Batch: its running sums are its per-position target
        return out
    return None


def is_batch(x: Any) -> bool:
    """Whether ``x`` is a batch in one of the forms ``as_batch`` reads (a sampler is not)."""
    return _fields(x) is not None


def as_batch(x: Any, where: str = "probe", masks: Iterable[str] = (), ignore_index: int = IGNORE_INDEX,
             ) -> Any:
    """``x`` as a batch every analysis reads: probe's ``Batch`` and a ``TaskBatch`` unchanged (when their labels
    already use ``IGNORE_INDEX``), anything else in ``BATCH_FORMS`` as a ``TaskBatch``. ``masks``: names the
    analysis reads, each refused in one line when missing; ``ignore_index``: the label value of the user's batch
    where nothing is asked."""
    if isinstance(x, Tensor):
        raise ProbeError(f"{where}: expected {BATCH_FORMS}; got {_got(x)}: a batch carries labels and masks "
                         "besides the tokens")
    parts = _fields(x)
    if parts is None:
        raise ProbeError(f"{where}: expected {BATCH_FORMS}; got {_got(x)}")
    tokens, labels = parts["tokens"], parts["labels"]
    named, targets = parts.get("masks") or {}, parts.get("targets") or {}
    if not isinstance(tokens, Tensor) or not isinstance(labels, Tensor) or tokens.dim() != 2 \
            or labels.shape != tokens.shape:
        raise ProbeError(f"{where}: the batch's tokens must be (batch, pos) and its labels the same shape; got "
                         f"tokens {_shape(tokens)}, labels {_shape(labels)}")
    if tokens.is_floating_point():
        raise ProbeError(f"{where}: the batch's tokens must be integer token ids, got dtype {tokens.dtype}")
    if not isinstance(named, Mapping) or not isinstance(targets, Mapping):
        raise ProbeError(f"{where}: the batch's masks and targets must be dicts of named (batch, pos) tensors, got "
                         f"{_got(named if not isinstance(named, Mapping) else targets)}")
    for kind, d in (("mask", named), ("target", targets)):
        for name, t in d.items():
            if not isinstance(t, Tensor) or t.shape != tokens.shape:
                raise ProbeError(f"{where}: the batch's {kind} {name!r} must be a tensor of the tokens' shape "
                                 f"{tuple(tokens.shape)}, got {_shape(t) if isinstance(t, Tensor) else _got(t)}")
    missing = [m for m in masks if m not in named]
    if missing:
        raise ProbeError(f"{where}: the batch has no {', '.join(map(repr, missing))} mask; it has masks "
                         f"{sorted(named)}")
    prefix = int(parts.get("prefix_len") or 0)
    if not 0 <= prefix < tokens.shape[1]:
        raise ProbeError(f"{where}: prefix_len={prefix} must lie in [0, {tokens.shape[1] - 1}]")
    if ignore_index == IGNORE_INDEX and all(named[k].dtype == torch.bool for k in named) and (
            hasattr(x, "answer_mask") and hasattr(x, "masks") and hasattr(x, "prefix_len")):
        return x  # probe's Batch or a TaskBatch: read as it is
    labels = labels.long()
    if ignore_index != IGNORE_INDEX:
        labels = torch.where(labels == ignore_index, IGNORE_INDEX, labels)
    return TaskBatch(tokens.long(), labels, {k: v.bool() for k, v in named.items()},
                     {k: v.long() for k, v in targets.items()}, prefix)


def _shape(t: Any) -> str:
    return str(tuple(t.shape)) if isinstance(t, Tensor) else _got(t)


def take_rows(batch: Any, index: Tensor | slice) -> TaskBatch:
    """The sequences ``index`` selects from any batch, as a ``TaskBatch``."""
    b = as_batch(batch)
    return TaskBatch(b.tokens[index], b.labels[index], {k: v[index] for k, v in b.masks.items()},
                     {k: v[index] for k, v in batch_targets(b).items()}, b.prefix_len)


def batch_targets(batch: Any) -> dict[str, Tensor]:
    """The per-position targets a batch carries: its ``targets`` dict (probe's ``Batch``: ``sums``)."""
    return dict(_fields(batch).get("targets") or {}) if is_batch(batch) else {}


class TaskSampler:
    """A sampler every analysis draws from: ``sample(length, batch_size, seed)`` returns a batch in the form
    ``as_batch`` returns. ``task`` is probe's ``TaskConfig`` when it was given one (its vocabulary, modulus and
    training length then serve as defaults), else None; ``train_length`` the training length when known."""

    def __init__(self, draw: Callable[[int, int, Any], Any], name: str, task: Any = None,
                 train_length: int | None = None, ignore_index: int = IGNORE_INDEX) -> None:
        self.draw, self.name, self.task = draw, name, task
        self.train_length = train_length
        self.ignore_index = ignore_index

    def sample(self, length: int, batch_size: int, seed: Any) -> Any:
        if self.task is not None:
            return self.task.sample(length, batch_size, seed)
        if isinstance(seed, torch.Generator):  # a user's sampler takes an int seed: one drawn from the generator
            seed = int(torch.randint(2**62, (1,), generator=seed))
        return as_batch(self.draw(length, batch_size, seed), f"the sampler {self.name}", (), self.ignore_index)

    __call__ = sample

    @property
    def prefix_len(self) -> int:
        """Positions before the stream, read from a one-sequence draw (probe's tasks know it without drawing)."""
        if self.task is not None:
            return int(self.task.prefix_len)
        return int(self.sample(1, 1, 0).prefix_len)

    def __repr__(self) -> str:
        return f"TaskSampler({self.name})"


def as_sampler(x: Any, where: str = "probe", train_length: int | None = None,
               ignore_index: int = IGNORE_INDEX) -> TaskSampler:
    """``x`` as a ``TaskSampler``: probe's ``TaskConfig`` (anything with ``sample(length, batch_size, seed)``), a
    callable ``f(length, batch_size, seed)``, or a ``TaskSampler`` (returned as it is). A batch is refused in one line
    (the analysis draws its own). ``train_length``: the training length, when ``x`` does not know it."""
    if isinstance(x, TaskSampler):
        if train_length is not None and x.train_length is None:
            x = TaskSampler(x.draw, x.name, x.task, train_length, x.ignore_index)
        return x
    if isinstance(x, Tensor) or is_batch(x):
        raise ProbeError(f"{where}: expected a task (probe.tasks.make_task(...), or a sampler f(length, batch_size, "
                         f"seed) that returns a batch), got {_got(x)}; this function draws its own batches")
    sample = getattr(x, "sample", None)
    if callable(sample):
        own = getattr(x, "train_length", None)
        return TaskSampler(sample, getattr(x, "name", type(x).__name__), x if hasattr(x, "vocab_size") else None,
                           train_length or own, ignore_index)
    if callable(x):
        return TaskSampler(x, getattr(x, "__name__", type(x).__name__), None, train_length, ignore_index)
    raise ProbeError(f"{where}: expected a task (probe.tasks.make_task(...), or a sampler f(length, batch_size, "
                     f"seed) that returns a batch), got {_got(x)}")


def need_train_length(sampler: TaskSampler, where: str, given: int | None = None) -> int:
    """The training length: ``given``, else the sampler's; refused in one line when neither says."""
    length = given or sampler.train_length
    if not length:
        raise ProbeError(f"{where}: the task {sampler.name} does not say its training length: pass train_length=")
    return int(length)


def two_parts(batch: Any, where: str, parts: Any = None) -> tuple[str, str]:
    """The two named parts an analysis splits by: ``parts`` (two mask names) when given, else the batch's
    ``state`` and ``recall`` (probe's tasks), else its masks when it has exactly two; refused in one line otherwise."""
    named = list(batch.masks)
    if parts is None:
        if "state" in named and "recall" in named:
            return "state", "recall"
        if len(named) == 2:
            return named[0], named[1]
        raise ProbeError(f"{where}: the gradient split needs two named parts; this batch has masks {named}: pass "
                         "parts=(mask_a, mask_b) or two loss callables parts={'a': f, 'b': g}")
    names = list(parts)
    if len(names) != 2 or len(set(names)) != 2:
        raise ProbeError(f"{where}: parts must name two different parts, got {names}")
    return str(names[0]), str(names[1])
