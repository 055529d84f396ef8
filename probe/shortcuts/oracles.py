"""Hand-built models whose answer to each shortcut test is known: the positive and negative controls.

Each oracle is a ``tokens [, positions=] -> one-hot logits`` function built on the task's own labels
(``TaskConfig.relabel``); every recall answer is exact. They differ in how they answer the state questions:
``tracker`` (exactly), ``windowed`` (from the last w + 1 positions only), ``forgetful`` (exactly, but it counts the
steps of a run of zeros and forgets the sum after c of them), ``position_limited`` (exactly up to an absolute
position, wrong after it), and ``GatedRecall`` (a stand-in hybrid whose recall goes through one attention gate).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
from jaxtyping import Int
from torch import Tensor

from probe.tasks import TaskConfig


def _state_tokens(task: TaskConfig, tokens: Tensor, residues: Tensor) -> Tensor:
    """The answer token for a running sum ``residues`` (batch, stream): the residue, or for ``coupled`` the value the
    dictionary binds to it."""
    if task.name != "coupled":
        return residues
    keys, values = tokens[:, 0 : 2 * task.m : 2], tokens[:, 1 : 2 * task.m : 2]
    table = torch.zeros_like(keys).scatter(1, keys, values)
    return table.gather(1, residues)


class Oracle:
    """Exact answers everywhere (the state tracker); subclasses change the state answers."""

    reads_positions = False

    def __init__(self, task: TaskConfig) -> None:
        self.task = task

    def __call__(self, tokens: Int[Tensor, "batch pos"], positions: Tensor | None = None) -> Tensor:
        device = tokens.device
        tokens = tokens.cpu()
        batch = self.task.relabel(tokens)
        answers = batch.labels.clone()
        p = batch.prefix_len
        stream = tokens[:, p:]
        x = torch.where(stream < self.task.m, stream, 0)  # queries add nothing
        state = self.state_answers(tokens, x, batch.sums[:, p:], positions)
        if state is not None:
            answers[:, p:] = torch.where(batch.masks["state"][:, p:], state, answers[:, p:])
        answers = answers.clamp(min=0)  # where nothing is asked, any answer
        return torch.nn.functional.one_hot(answers, self.task.vocab_size).float().to(device)

    def state_answers(self, tokens: Tensor, x: Tensor, sums: Tensor, positions: Tensor | None) -> Tensor | None:
        """The state answer token at every stream position; None keeps the exact ones."""
        return None


def tracker(task: TaskConfig) -> Oracle:
    """An exact state tracker (and exact recall): every shortcut test must leave it unchanged."""
    return Oracle(task)


class Windowed(Oracle):
    """Answers the sum of the numbers at the last ``w + 1`` positions only: a local shortcut."""

    def __init__(self, task: TaskConfig, w: int) -> None:
        super().__init__(task)
        self.w = w

    def state_answers(self, tokens: Tensor, x: Tensor, sums: Tensor, positions: Tensor | None) -> Tensor:
        csum = x.cumsum(dim=1)
        before = torch.nn.functional.pad(csum, (self.w + 1, 0))[:, : csum.shape[1]]
        return _state_tokens(self.task, tokens, (csum - before) % self.task.m)


def windowed(task: TaskConfig, w: int) -> Oracle:
    """A model that sees the last ``w + 1`` positions (w = 0: the current number alone)."""
    return Windowed(task, w)


class Forgetful(Oracle):
    """An exact tracker that counts the consecutive zeros it reads and resets its sum to 0 at the ``c``-th: exact on
    i.i.d. streams (a run of c zeros has probability about (q0)^c), wrong after a long run of the identity."""

    def __init__(self, task: TaskConfig, c: int) -> None:
        super().__init__(task)
        self.c = c

    def state_answers(self, tokens: Tensor, x: Tensor, sums: Tensor, positions: Tensor | None) -> Tensor:
        stream = tokens[:, self.task.prefix_len:]
        s = torch.zeros(len(x), dtype=torch.long)
        streak = torch.zeros(len(x), dtype=torch.long)
        out = torch.empty_like(x)
        for t in range(x.shape[1]):
            streak = torch.where(stream[:, t] == 0, streak + 1, 0)
            s = torch.where(streak >= self.c, 0, (s + x[:, t]) % self.task.m)
            out[:, t] = s
        return _state_tokens(self.task, tokens, out)


def forgetful(task: TaskConfig, c: int = 8) -> Oracle:
    """A tracker that forgets its sum after ``c`` consecutive zeros (a step counter that overflows)."""
    return Forgetful(task, c)


class PositionLimited(Oracle):
    """Exact state answers at absolute stream positions below ``c``, wrong (sum + 1) from ``c`` on. It reads the
    ``positions`` a caller passes (an index shift moves its answers), else the token index (padding does)."""

    reads_positions = True

    def __init__(self, task: TaskConfig, c: int) -> None:
        super().__init__(task)
        self.c = c

    def state_answers(self, tokens: Tensor, x: Tensor, sums: Tensor, positions: Tensor | None) -> Tensor:
        p = self.task.prefix_len
        pos = torch.arange(tokens.shape[1]).expand_as(tokens) if positions is None else positions.cpu().expand_as(
            tokens)
        late = (pos[:, p:] - p) >= self.c
        return _state_tokens(self.task, tokens, torch.where(late, (sums + 1) % self.task.m, sums))


def position_limited(task: TaskConfig, c: int | None = None) -> Oracle:
    """A model that takes the absolute-position shortcut: right before stream position ``c`` (default L_train / 2),
    wrong after it."""
    return PositionLimited(task, task.train_length // 2 if c is None else c)


class GatedRecall(Oracle):
    """A stand-in hybrid: exact state answers (its "recurrence"), and exact recall answers that pass only through
    the attention of block ``block``: with that gate below 0.5 every recall answer is the first value token."""

    def __init__(self, task: TaskConfig, n_blocks: int = 2, block: int = 1) -> None:
        super().__init__(task)
        self.cfg = SimpleNamespace(family="hybrid (oracle)", has_attention=True, pos_encoding="none")
        self.block = block
        self._gates = [1.0] * n_blocks

    def attention_gates(self) -> list[float]:
        return list(self._gates)

    def set_attention_gate(self, value: float | Sequence[float]) -> None:
        values = [float(value)] * len(self._gates) if isinstance(value, (int, float)) else [float(v) for v in value]
        if len(values) != len(self._gates):
            raise ValueError(f"{len(values)} gate values for {len(self._gates)} attention blocks")
        self._gates = values

    def __call__(self, tokens: Int[Tensor, "batch pos"], positions: Tensor | None = None) -> Tensor:
        logits = super().__call__(tokens, positions)
        if self._gates[self.block] >= 0.5:
            return logits
        batch = self.task.relabel(tokens.cpu())
        recall = batch.masks["recall"].to(logits.device)
        blind = torch.nn.functional.one_hot(torch.full_like(batch.labels, self.task.value_offset),
                                            self.task.vocab_size).float().to(logits.device)
        return torch.where(recall[..., None], blind, logits)

