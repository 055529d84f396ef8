"""Checkpoints: one file of plain data (configs, weights, optimizer state, metrics), written atomically,
read with ``torch.load(weights_only=True)``, and validated with one-line errors that name the file."""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from probe import __version__
from probe.errors import ProbeError
from probe.models import HookedSequenceModel, ModelConfig
from probe.tasks import TaskConfig, task_from_dict

FORMAT = "probe-checkpoint"
FORMAT_VERSION = 1


class CheckpointError(ProbeError):
    """A checkpoint file is missing, unreadable, foreign or incompatible."""


@dataclass
class Checkpoint:
    """The contents of one checkpoint file, configs already parsed."""

    path: Path | None
    model_config: ModelConfig
    task_config: TaskConfig
    state_dict: dict[str, torch.Tensor]
    train_config: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    optimizer_state: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    probe_version: str = __version__

    @property
    def name(self) -> str:
        return self.path.name if self.path else "<memory>"

    @property
    def schedule(self) -> str | None:
        return (self.train_config.get("schedule") or {}).get("kind")

    @property
    def label(self) -> str:
        """What kind of run this is, for tables and legends: ``lstm``, ``transformer``, ``hybrid-joint``,
        ``hybrid-dat`` (the ``delayed`` schedule), ``hybrid-ramp``, ..."""
        family = self.model_config.family
        if family != "hybrid":
            return family
        kind = self.schedule or "joint"
        frozen_rnn = (self.train_config.get("schedule") or {}).get("freeze_recurrent_after_switch", False)
        return "hybrid-" + ("dat" if kind == "delayed" else kind) + ("+frozen-rnn" if frozen_rnn else "")

    @property
    def seed(self) -> int | None:
        return self.train_config.get("seed")

    def build_model(self, device: torch.device | str = "cpu") -> HookedSequenceModel:
        """The model with these weights (gates included), in eval mode."""
        model = HookedSequenceModel(self.model_config)
        try:
            model.load_state_dict(self.state_dict)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise CheckpointError(f"{self.name}: weights do not fit the recorded model config ({first})") from None
        return model.to(device).eval()


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` to ``path`` atomically: a temp file in the same folder, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "probe_version": __version__,
        "model_config": ckpt.model_config.to_dict(),
        "task_config": ckpt.task_config.to_dict(),
        "train_config": ckpt.train_config,
        "step": int(ckpt.step),
        "state_dict": {k: v.detach().cpu() for k, v in ckpt.state_dict.items()},
        "optimizer_state": ckpt.optimizer_state,
        "metrics": ckpt.metrics,
        "extra": ckpt.extra,
    }
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    ckpt.path = path
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read and validate a checkpoint. Every failure is a ``CheckpointError`` whose one-line message names the file."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty file, not a checkpoint")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "weights only" in str(e).lower() or "weights_only" in str(e).lower():
            raise CheckpointError(
                f"{path}: refused to load: it holds Python objects or code, not plain data (a checkpoint is data)"
            ) from None
        raise CheckpointError(f"{path}: not a checkpoint: unreadable pickle ({reason})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as e:
        lines = str(e).strip().splitlines()
        reason = lines[0] if lines else type(e).__name__
        raise CheckpointError(f"{path}: truncated or not a torch file ({reason})") from None
    return checkpoint_from_payload(obj, path)


def checkpoint_from_payload(obj: Any, path: Path | None = None) -> Checkpoint:
    name = str(path) if path else "<checkpoint>"
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CheckpointError(f"{name}: not a probe checkpoint (a torch file without probe's format marker)")
    version = obj.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{name}: written in checkpoint format {version} by probe {obj.get('probe_version')}; "
            f"this probe ({__version__}) reads format <= {FORMAT_VERSION}: upgrade probe"
        )
    missing = [k for k in ("model_config", "task_config", "state_dict") if k not in obj]
    if missing:
        raise CheckpointError(f"{name}: incomplete checkpoint, missing {', '.join(missing)}")
    try:
        model_config = ModelConfig.from_dict(obj["model_config"])
        task_config = task_from_dict(obj["task_config"])
    except (ProbeError, TypeError) as e:
        raise CheckpointError(f"{name}: incompatible config ({e})") from None
    return Checkpoint(
        path=path,
        model_config=model_config,
        task_config=task_config,
        state_dict=obj["state_dict"],
        train_config=obj.get("train_config") or {},
        step=int(obj.get("step", 0)),
        optimizer_state=obj.get("optimizer_state"),
        metrics=obj.get("metrics") or {},
        extra=obj.get("extra") or {},
        probe_version=str(obj.get("probe_version")),
    )


def checkpoint_from_model(model: HookedSequenceModel, task: TaskConfig, **fields: Any) -> Checkpoint:
    """Wrap a live model (and optional train_config, step, optimizer_state, metrics) as a Checkpoint."""
    return Checkpoint(path=None, model_config=model.cfg, task_config=task, state_dict=model.state_dict(), **fields)


def resolve_checkpoints(specs: list[str]) -> list[Path]:
    """Expand CLI arguments (files, directories of ``*.pt``, globs) into checkpoint paths, in sorted order."""
    out: list[Path] = []
    for spec in specs:
        p = Path(spec)
        if p.is_dir():
            found = sorted(p.glob("*.pt"))
            if not found:
                raise CheckpointError(f"{p}: directory holds no *.pt checkpoints")
            out.extend(found)
        elif any(ch in spec for ch in "*?["):
            root = Path(p.anchor) if p.is_absolute() else Path()
            found = sorted(root.glob(str(p.relative_to(p.anchor)) if p.is_absolute() else spec))
            if not found:
                raise CheckpointError(f"{spec}: pattern matches no file")
            out.extend(found)
        else:
            out.append(p)
    return out
