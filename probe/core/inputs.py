"""What every analysis checks first: a hooked model, a batch (not a bare tensor), a task, the masks it reads.

Each public analysis function calls these in its first lines, so that a wrong argument is one ``ProbeError`` line
that names the function and what it expected, never an ``AttributeError`` from deep inside. The checks read only
what they need (duck typing): ``probe.core`` sits below the models and tasks and imports neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from os import PathLike
from typing import Any

from torch import Tensor, nn

from probe.errors import ProbeError

MODEL = "one of probe's models or your own wrapped by probe.wrap(model, attention=[...], recurrent=[...])"
BATCH = "a Batch (tokens, labels, named masks), e.g. task.sample(length, batch_size, seed)"


def _got(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a Tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def check_model(model: Any, where: str) -> None:
    """``model`` is a hooked model an analysis can run: probe's own or a wrapped one (a TransformerLens
    ``HookedRootModule`` with a ``cfg``), and not a wrapper that was unwrapped."""
    from transformer_lens import HookedRootModule

    if isinstance(model, (str, PathLike)):
        raise ProbeError(f"{where}: expected a model, got a path ({model}): load it with "
                         "probe.checkpoint.load_checkpoint(path).build_model()")
    if hasattr(model, "build_model") and not isinstance(model, nn.Module):
        raise ProbeError(f"{where}: expected a model, got {_got(model)}: pass its .build_model()")
    if not isinstance(model, nn.Module):
        raise ProbeError(f"{where}: expected a model ({MODEL}), got {_got(model)}")
    if not isinstance(model, HookedRootModule) or getattr(model, "cfg", None) is None:
        raise ProbeError(f"{where}: got a plain nn.Module ({type(model).__name__}), which has no hook points: wrap "
                         "it first with probe.wrap(model, attention=[...], recurrent=[...])")
    if getattr(model, "unwrapped", False) is True:
        raise ProbeError(f"{where}: this wrapper was unwrapped: wrap the model again with probe.wrap")


def check_batch(batch: Any, where: str, masks: Iterable[str] = ()) -> None:
    """``batch`` has ``tokens`` (batch, pos), ``labels`` of the same shape and a dict of named ``masks``, among them
    every name in ``masks`` (what this analysis reads)."""
    if isinstance(batch, Tensor):
        raise ProbeError(f"{where}: expected {BATCH}, got {_got(batch)}: a batch carries labels and masks besides "
                         "the tokens")
    tokens, labels, named = (getattr(batch, a, None) for a in ("tokens", "labels", "masks"))
    if not isinstance(tokens, Tensor) or not isinstance(labels, Tensor) or not isinstance(named, dict):
        raise ProbeError(f"{where}: expected {BATCH}, got {_got(batch)}")
    if tokens.dim() != 2 or labels.shape != tokens.shape:
        raise ProbeError(f"{where}: the batch's tokens must be (batch, pos) and its labels the same shape; got "
                         f"tokens {tuple(tokens.shape)}, labels {tuple(labels.shape)}")
    missing = [m for m in masks if m not in named]
    if missing:
        has = ", ".join(sorted(named)) or "none"
        raise ProbeError(f"{where}: the batch has no {', '.join(map(repr, missing))} mask (it has: {has}); this "
                         f"analysis reads {', '.join(masks)}")


def check_task(task: Any, where: str, optional: bool = False) -> None:
    """``task`` can draw batches: it has a ``sample(length, batch_size, seed)`` (probe's ``TaskConfig``) or is itself
    a callable sampler; ``optional``: None is allowed (the model's own task is used)."""
    if task is None and optional:
        return
    if isinstance(task, Tensor) or hasattr(task, "tokens"):
        raise ProbeError(f"{where}: expected a task (probe.tasks.make_task(...), or your own with a "
                         f"sample(length, batch_size, seed) method), got {_got(task)}; this function draws its own "
                         "batches from the task")
    # a callable is let through: a sampler f(length, batch_size, seed) is the other form a task may take
    if not callable(getattr(task, "sample", None)) and not callable(task):
        raise ProbeError(f"{where}: expected a task (probe.tasks.make_task(...), or your own with a "
                         f"sample(length, batch_size, seed) method), got {_got(task)}")


def check_forward(forward: Any, where: str) -> None:
    """``forward`` maps tokens to logits: a model, or a hand-built oracle (a callable) that a control runs instead."""
    if isinstance(forward, (str, PathLike)):
        check_model(forward, where)  # the path's own message
    if isinstance(forward, Tensor) or not callable(forward):
        raise ProbeError(f"{where}: expected a model ({MODEL}) or a callable from tokens to logits, got "
                         f"{_got(forward)}")


def check_checkpoint(ckpt: Any, where: str) -> None:
    """``ckpt`` is a loaded checkpoint (it can build its model and knows its task)."""
    if isinstance(ckpt, (str, PathLike)):
        raise ProbeError(f"{where}: expected a loaded checkpoint, got a path ({ckpt}): pass "
                         "probe.checkpoint.load_checkpoint(path)")
    if not callable(getattr(ckpt, "build_model", None)) or getattr(ckpt, "task_config", None) is None:
        live = " (for a live model, call the analysis's *_model function)" if isinstance(ckpt, nn.Module) else ""
        raise ProbeError(f"{where}: expected a checkpoint from probe.checkpoint.load_checkpoint(path), got "
                         f"{_got(ckpt)}{live}")


def check_paths(paths: Any, where: str) -> None:
    """``paths`` is a list of checkpoint files, folders or globs: a lone string would be read letter by letter."""
    if isinstance(paths, (str, PathLike)):
        raise ProbeError(f"{where}: expected a list of checkpoint paths, got one path: pass [{str(paths)!r}]")
    if isinstance(paths, (Tensor, nn.Module)) or not isinstance(paths, Iterable):
        raise ProbeError(f"{where}: expected a list of checkpoint paths (files, folders, globs), got {_got(paths)}")


_NOT_GIVEN: Any = object()  # an argument the analysis does not take (None is a value a user can pass by mistake)


def check_inputs(where: str, model: Any = _NOT_GIVEN, batch: Any = _NOT_GIVEN, task: Any = _NOT_GIVEN,
                 masks: Iterable[str] = (), task_optional: bool = False, forward: Any = _NOT_GIVEN,
                 ckpt: Any = _NOT_GIVEN, paths: Any = _NOT_GIVEN) -> None:
    """The one call each public analysis makes first, with the arguments it takes: the model (``forward``: a model
    or an oracle callable, for the shortcut tests), then the batch (with the masks it reads), then the task
    (``task_optional``: None stands for the model's own task); or, for the functions that load their own models,
    the checkpoint or the list of paths."""
    if ckpt is not _NOT_GIVEN:
        check_checkpoint(ckpt, where)
    if paths is not _NOT_GIVEN:
        check_paths(paths, where)
    if model is not _NOT_GIVEN:
        check_model(model, where)
    if forward is not _NOT_GIVEN:
        check_forward(forward, where)
    if batch is not _NOT_GIVEN:
        check_batch(batch, where, masks)
    if task is not _NOT_GIVEN:
        check_task(task, where, optional=task_optional)
