"""Synthetic tasks: running sum mod m (state tracking), associative recall, and their two composites."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from probe.core.task import IGNORE_INDEX
from probe.errors import ProbeError

SUBTASKS = ("state", "recall")


@dataclass
class Batch:
    """One batch of one of probe's tasks, every tensor on the same device: the interface every analysis reads
    (``probe.core.task``: tokens, labels, named masks, per-position targets, prefix length), with the running sums.

    ``tokens`` and ``labels`` are ``(batch, prefix_len + length)``; labels hold token ids of the answer or
    ``IGNORE_INDEX``; ``masks[s]`` is True where subtask ``s`` (``"state"`` / ``"recall"``) asks a question.
    ``sums`` is the running sum mod m at every position (``-1`` inside the dictionary prefix), kept so that
    analyses (probes, window tests) need not recompute it.
    """

    tokens: Tensor
    labels: Tensor
    masks: dict[str, Tensor]
    sums: Tensor
    prefix_len: int
    length: int

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            tokens=self.tokens.to(device),
            labels=self.labels.to(device),
            masks={k: v.to(device) for k, v in self.masks.items()},
            sums=self.sums.to(device),
            prefix_len=self.prefix_len,
            length=self.length,
        )

    @property
    def answer_mask(self) -> Tensor:
        return self.labels != IGNORE_INDEX

    @property
    def targets(self) -> dict[str, Tensor]:
        """The per-position targets, as every task's batch names them (``probe.core.task``): the running sum."""
        return {"sums": self.sums}


def _generator(seed: int | torch.Generator) -> torch.Generator:
    # Every batch is drawn on the CPU from an explicit generator, never the global RNG, so that the same seed
    # gives the same batch on any device.
    if isinstance(seed, torch.Generator):
        return seed
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g


@dataclass(frozen=True)
class TaskConfig:
    """Vocabulary shared by every task: numbers ``0..m-1``, then keys, then values, then ``SEP``.

    ``train_length`` is L_train: training draws stream lengths uniformly from ``[1, train_length]``.
    """

    name: ClassVar[str] = "base"
    residue_answers: ClassVar[bool] = True
    """Whether the state answers are the residues s_t themselves (number tokens), so that they can be scored modulo
    each factor of m. False where nothing asks the state (``recall``) or the answer is a value bound to s_t
    (``coupled``)."""
    m: int = 10
    n_keys: int = 16
    n_values: int = 16
    train_length: int = 25

    def __post_init__(self) -> None:
        if self.m < 2:
            raise ProbeError(f"task {self.name}: modulus m={self.m} must be at least 2")
        if self.n_keys < 1 or self.n_values < 1:
            raise ProbeError(f"task {self.name}: n_keys and n_values must be at least 1")
        if self.train_length < 1:
            raise ProbeError(f"task {self.name}: train_length={self.train_length} must be at least 1")

    # --- vocabulary -------------------------------------------------------------------------------------
    @property
    def key_offset(self) -> int:
        return self.m

    @property
    def value_offset(self) -> int:
        return self.m + self.n_keys

    @property
    def sep(self) -> int:
        return self.m + self.n_keys + self.n_values

    @property
    def vocab_size(self) -> int:
        return self.sep + 1

    @property
    def prefix_len(self) -> int:
        """Number of dictionary tokens (pairs and SEP) before the stream."""
        return 0

    # --- sampling ---------------------------------------------------------------------------------------
    def sample(self, length: int, batch_size: int, seed: int | torch.Generator) -> Batch:
        """Draw ``batch_size`` sequences whose stream has exactly ``length`` positions."""
        if not isinstance(length, int) or length < 1:
            raise ProbeError(f"task {self.name}: length must be a positive integer, got {length!r}")
        if batch_size < 1:
            raise ProbeError(f"task {self.name}: batch_size must be positive, got {batch_size}")
        return self._sample(length, batch_size, _generator(seed))

    def _sample(self, length: int, batch_size: int, g: torch.Generator) -> Batch:
        raise NotImplementedError

    def relabel(self, tokens: Tensor) -> Batch:
        """The batch that ``tokens`` spell, its labels, masks and running sums recomputed from the tokens alone by
        the task's rules: what an analysis that edits a sequence (a shortcut test) calls for the edited answers.

        Raises ``ProbeError`` when the tokens are not a sequence of this task (a stream token of the wrong kind, a
        query whose key is not in the dictionary)."""
        if tokens.dim() != 2 or tokens.shape[1] <= self.prefix_len:
            raise ProbeError(f"task {self.name}: relabel needs (batch, prefix {self.prefix_len} + length >= 1) "
                             f"tokens, got shape {tuple(tokens.shape)}")
        device = tokens.device
        tokens = tokens.detach().cpu().long()
        p = self.prefix_len
        return self._relabel(tokens[:, :p] if p else None, tokens[:, p:]).to(device)

    def _relabel(self, prefix: Tensor | None, stream: Tensor) -> Batch:
        raise NotImplementedError

    def _check(self, ok: Tensor, what: str) -> None:
        if not bool(ok.all()):
            raise ProbeError(f"task {self.name}: not a {self.name} sequence ({what})")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self)}

    # --- shared pieces ----------------------------------------------------------------------------------
    def _dictionary(self, batch_size: int, n_pairs: int, g: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """Distinct keys (B, P) as key indices, values (B, P) as value indices, and the prefix tokens."""
        keys = torch.rand(batch_size, self.n_keys, generator=g).argsort(dim=1)[:, :n_pairs]
        values = torch.randint(self.n_values, (batch_size, n_pairs), generator=g)
        prefix = torch.stack([keys + self.key_offset, values + self.value_offset], dim=2).reshape(batch_size, -1)
        sep = torch.full((batch_size, 1), self.sep, dtype=torch.long)
        return keys, values, torch.cat([prefix, sep], dim=1)

    def _assemble(self, prefix: Tensor | None, stream: Tensor, labels: Tensor, state: Tensor, recall: Tensor,
                  sums: Tensor) -> Batch:
        b = stream.shape[0]
        p = 0 if prefix is None else prefix.shape[1]

        def pad(x: Tensor, fill: Any) -> Tensor:
            if p == 0:
                return x
            return torch.cat([torch.full((b, p), fill, dtype=x.dtype), x], dim=1)

        return Batch(
            tokens=stream if prefix is None else torch.cat([prefix, stream], dim=1),
            labels=pad(labels, IGNORE_INDEX),
            masks={"state": pad(state, False), "recall": pad(recall, False)},
            sums=pad(sums, -1),
            prefix_len=p,
            length=stream.shape[1],
        )


@dataclass(frozen=True)
class ModSumConfig(TaskConfig):
    """State tracking: stream of numbers in Z_m, label ``s_t = (x_1 + ... + x_t) mod m`` at every position."""

    name: ClassVar[str] = "modsum"
    last_only: bool = False

    def _sample(self, length: int, batch_size: int, g: torch.Generator) -> Batch:
        x = torch.randint(self.m, (batch_size, length), generator=g)
        sums = x.cumsum(dim=1) % self.m
        state = torch.ones_like(x, dtype=torch.bool)
        if self.last_only:
            state[:, :-1] = False
        labels = torch.where(state, sums, IGNORE_INDEX)
        return self._assemble(None, x, labels, state, torch.zeros_like(state), sums)

    def _relabel(self, prefix: Tensor | None, stream: Tensor) -> Batch:
        self._check((stream >= 0) & (stream < self.m), "every stream token must be a number")
        sums = stream.cumsum(dim=1) % self.m
        state = torch.ones_like(stream, dtype=torch.bool)
        if self.last_only:
            state[:, :-1] = False
        return self._assemble(None, stream, torch.where(state, sums, IGNORE_INDEX), state, torch.zeros_like(state),
                              sums)


@dataclass(frozen=True)
class RecallConfig(TaskConfig):
    """Associative recall (MQAR-style): ``P`` key-value pairs, ``SEP``, then ``length`` queries of those keys."""

    name: ClassVar[str] = "recall"
    residue_answers: ClassVar[bool] = False
    n_pairs: int = 6

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.n_pairs <= self.n_keys:
            raise ProbeError(f"task {self.name}: n_pairs={self.n_pairs} must lie in [1, n_keys={self.n_keys}]")

    @property
    def prefix_len(self) -> int:
        return 2 * self.n_pairs + 1

    def _sample(self, length: int, batch_size: int, g: torch.Generator) -> Batch:
        keys, values, prefix = self._dictionary(batch_size, self.n_pairs, g)
        q = torch.randint(self.n_pairs, (batch_size, length), generator=g)
        stream = keys.gather(1, q) + self.key_offset
        labels = values.gather(1, q) + self.value_offset
        recall = torch.ones_like(stream, dtype=torch.bool)
        sums = torch.zeros_like(stream)
        return self._assemble(prefix, stream, labels, torch.zeros_like(recall), recall, sums)

    def _lookup(self, prefix: Tensor, queries: Tensor, is_query: Tensor) -> Tensor:
        """The value token that the dictionary ``prefix`` binds to each query key (anything where not a query)."""
        keys, values = prefix[:, 0 : 2 * self.n_pairs : 2], prefix[:, 1 : 2 * self.n_pairs : 2]
        match = queries[:, :, None] == keys[:, None, :]
        self._check(match.any(-1) | ~is_query, "a query whose key is not in the dictionary")
        return values.gather(1, match.to(torch.int8).argmax(-1))

    def _relabel(self, prefix: Tensor | None, stream: Tensor) -> Batch:
        assert prefix is not None
        recall = torch.ones_like(stream, dtype=torch.bool)
        labels = self._lookup(prefix, stream, recall)
        return self._assemble(prefix, stream, labels, torch.zeros_like(recall), recall, torch.zeros_like(stream))


@dataclass(frozen=True)
class InterleavedConfig(RecallConfig):
    """The composite (default): each stream position is a query key with probability ``query_prob``, else a number.

    Label at a number: running sum of the numbers so far mod m (queries add nothing). Label at a query: its value.
    """

    name: ClassVar[str] = "interleaved"
    residue_answers: ClassVar[bool] = True
    query_prob: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.query_prob <= 1.0:
            raise ProbeError(f"task {self.name}: query_prob={self.query_prob} must lie in [0, 1]")

    def _sample(self, length: int, batch_size: int, g: torch.Generator) -> Batch:
        keys, values, prefix = self._dictionary(batch_size, self.n_pairs, g)
        is_query = torch.rand(batch_size, length, generator=g) < self.query_prob
        q = torch.randint(self.n_pairs, (batch_size, length), generator=g)
        x = torch.randint(self.m, (batch_size, length), generator=g)
        x = torch.where(is_query, 0, x)
        sums = x.cumsum(dim=1) % self.m
        stream = torch.where(is_query, keys.gather(1, q) + self.key_offset, x)
        labels = torch.where(is_query, values.gather(1, q) + self.value_offset, sums)
        return self._assemble(prefix, stream, labels, ~is_query, is_query, sums)

    def _relabel(self, prefix: Tensor | None, stream: Tensor) -> Batch:
        assert prefix is not None
        is_query = stream >= self.key_offset
        self._check((stream >= 0) & (stream < self.value_offset), "every stream token must be a number or a key")
        x = torch.where(is_query, 0, stream)
        sums = x.cumsum(dim=1) % self.m
        labels = torch.where(is_query, self._lookup(prefix, stream, is_query), sums)
        return self._assemble(prefix, stream, labels, ~is_query, is_query, sums)


@dataclass(frozen=True)
class CoupledConfig(TaskConfig):
    """The coupled composite (probe's extension): the dictionary binds every residue r in Z_m to a random value,
    in shuffled order; the stream holds numbers; the label at t is the value bound to ``s_t``.

    Every answer needs both mechanisms, so both masks are True at every stream position.
    """

    name: ClassVar[str] = "coupled"
    residue_answers: ClassVar[bool] = False

    @property
    def prefix_len(self) -> int:
        return 2 * self.m + 1

    def _sample(self, length: int, batch_size: int, g: torch.Generator) -> Batch:
        order = torch.rand(batch_size, self.m, generator=g).argsort(dim=1)
        values = torch.randint(self.n_values, (batch_size, self.m), generator=g)
        prefix = torch.stack([order, values.gather(1, order) + self.value_offset], dim=2).reshape(batch_size, -1)
        prefix = torch.cat([prefix, torch.full((batch_size, 1), self.sep, dtype=torch.long)], dim=1)
        x = torch.randint(self.m, (batch_size, length), generator=g)
        sums = x.cumsum(dim=1) % self.m
        labels = values.gather(1, sums) + self.value_offset
        both = torch.ones_like(x, dtype=torch.bool)
        return self._assemble(prefix, x, labels, both, both.clone(), sums)

    def _relabel(self, prefix: Tensor | None, stream: Tensor) -> Batch:
        assert prefix is not None
        self._check((stream >= 0) & (stream < self.m), "every stream token must be a number")
        residues, values = prefix[:, 0 : 2 * self.m : 2], prefix[:, 1 : 2 * self.m : 2]
        self._check((residues >= 0) & (residues < self.m), "the dictionary binds residues 0..m-1")
        table = torch.zeros_like(values).scatter(1, residues, values)
        sums = stream.cumsum(dim=1) % self.m
        both = torch.ones_like(stream, dtype=torch.bool)
        return self._assemble(prefix, stream, table.gather(1, sums), both, both.clone(), sums)


TASKS: dict[str, type[TaskConfig]] = {c.name: c for c in (ModSumConfig, RecallConfig, InterleavedConfig, CoupledConfig)}


def make_task(name: str = "interleaved", **overrides: Any) -> TaskConfig:
    """Build a task config by name; unknown names or fields raise ``ProbeError``."""
    if name not in TASKS:
        raise ProbeError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    cls = TASKS[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(overrides) - fields
    if unknown:
        raise ProbeError(
            f"task {name}: unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(fields))}"
        )
    return cls(**overrides)


def task_from_dict(d: dict[str, Any]) -> TaskConfig:
    d = dict(d)
    return make_task(d.pop("name", "interleaved"), **d)
