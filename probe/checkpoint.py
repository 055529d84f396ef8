"""Checkpoints: one file of plain data (configs, weights, optimizer state, metrics), written atomically,
read with ``torch.load(weights_only=True)``, and validated with one-line errors that name the file.

``python -m probe.checkpoint upgrade PATH...`` rewrites files of an older format in this one, once."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import pickletools
import re
import struct
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from probe.cli import say
from probe.core.package import __version__
from probe.core.specs import is_factory_spec
from probe.errors import ProbeError
from probe.external import AnyModelConfig, build_any, call_factory, model_config_from_dict
from probe.models import ModelConfig
from probe.runner import Command, CommandGroup, CommandOptions, Report, option
from probe.schedules import legacy
from probe.schedules.settings import ScheduleConfig
from probe.tasks import TaskConfig, task_from_dict

FORMAT = "probe-checkpoint"
FORMAT_VERSION = 2
"""The schema this probe writes. 2: the training record's schedule is spelt as ``ScheduleConfig.to_dict`` writes it
(its settings and its variant's name), and only so. 1 (probe 0.1.0): the schedule in any spelling it ever had (an
old ``kind``, bare-number points: ``probe.schedules.legacy``) and a wrapped model's ``nn.LSTM`` / ``nn.GRU`` weights
under the names of an older wrapper (``_upgrade_wrapped_keys``). A file of format 1 is converted as it is read, with a
note; ``python -m probe.checkpoint upgrade PATH`` rewrites it once."""


class CheckpointError(ProbeError):
    """A checkpoint file is missing, unreadable, foreign or incompatible."""


class CheckpointFormatWarning(UserWarning):
    """A checkpoint of an older format was converted as it was read; rewriting it once makes the note go away."""


_NOTED: set[str] = set()
"""The files of an older format noted in this process: one note a file, however often a command reads it."""


@dataclass
class Checkpoint:
    """The contents of one checkpoint file, configs already parsed."""

    path: Path | None
    model_config: AnyModelConfig
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
    def schedule_config(self) -> ScheduleConfig | None:
        """The run's schedule; None when none is recorded or the record is not a schedule."""
        if not isinstance(self.train_config.get("schedule"), dict):
            return None
        try:
            return ScheduleConfig.from_dict(self.train_config["schedule"])
        except (ProbeError, TypeError):
            return None

    @property
    def variant(self) -> str | None:
        """The schedule variant's one name (``joint``, ``dat``, ``stopgrad-rnn0``, ``dat+frozen-rnn``, ...)."""
        cfg = self.schedule_config
        return None if cfg is None else cfg.name

    @property
    def schedule(self) -> str | None:
        """The schedule in the old vocabulary of kinds (``joint``, ``delayed``, ``stopgrad``, ...) that the
        ``schedule`` column of results has always used; ``variant`` and ``label`` tell variants apart."""
        cfg = self.schedule_config
        return None if cfg is None else legacy.old_kind(cfg)

    @property
    def label(self) -> str:
        """What kind of run this is, for tables and legends: ``lstm``, ``transformer``, or ``hybrid-`` and the
        schedule variant's name (``hybrid-joint``, ``hybrid-dat``, ``hybrid-stopgrad-rnn0``, ...); a recurrent cell
        other than the LSTM is named after the family, as the presets name it (``gru``, ``hybrid-ssm-complex-dat``)."""
        cfg = self.model_config
        if not isinstance(cfg, ModelConfig):  # a wrapped model: hf-recurrentgemma-dat, my.module:factory-joint
            return f"{cfg.name}-{self.variant or 'joint'}"
        family = cfg.family
        rnn = getattr(cfg, "rnn", "lstm")
        cell = "" if rnn == "lstm" or family == "transformer" else (
            f"ssm-{cfg.ssm_range}" if rnn == "ssm" else rnn)
        if family != "hybrid":
            return cell or family
        return "hybrid-" + (f"{cell}-" if cell else "") + (self.variant or "joint")

    @property
    def seed(self) -> int | None:
        return self.train_config.get("seed")

    def build_model(self, device: torch.device | str = "cpu") -> Any:
        """The model with these weights (gates included), in eval mode, knowing its task (``to_str_tokens``): probe's
        own, or a wrapped one rebuilt from its recorded transformers config or factory (``probe.external``)."""
        try:
            model = build_any(self.model_config, self.task_config)
        except ProbeError as e:
            # the path as given (a run folder's final.pt among many is named by its folder), not the file's name
            raise CheckpointError(f"{self.path or self.name}: cannot rebuild its model: {e}") from None
        try:
            model.load_state_dict(self.state_dict)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise CheckpointError(f"{self.path or self.name}: weights do not fit the recorded model config ({first})"
                                  ) from None
        return model.to(device).eval()


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` to ``path`` atomically: a temp file in the same folder, then ``os.replace``. A training
    record whose schedule is not spelt as today's (``ScheduleConfig.to_dict``) is refused: a new file holds no old
    spelling."""
    path = Path(path)
    _check_schedule_record(ckpt.train_config, path)
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
    _write_atomically(path, payload)
    ckpt.path = path
    return path


def _check_schedule_record(train_config: dict[str, Any], path: Path) -> None:
    """One line if ``train_config``'s schedule is not a record ``ScheduleConfig.from_dict`` reads as it is: an old
    spelling (``kind``, a bare-number point) is named with the function that converts it."""
    record = train_config.get("schedule", {})
    if not isinstance(record, dict):
        raise CheckpointError(f"{path}: not written: train_config's schedule is a {type(record).__name__}, not a "
                              f"record of settings (ScheduleConfig.to_dict writes one)")
    try:
        ScheduleConfig.from_dict(record)
    except (ProbeError, TypeError):
        raise CheckpointError(f"{path}: not written: train_config's schedule {record!r} "
                              f"{legacy.why_not_today(record)}") from None


def _write_atomically(path: Path, payload: dict[str, Any], mode: int | None = None) -> None:
    """``torch.save(payload)`` to a temp file beside ``path``, flushed to disk, then renamed over ``path``: a reader
    sees the old file or the new one, never part of one. ``mode``: the new file's permissions (default: what a plain
    ``open()`` gives)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write it ({e.strerror or type(e).__name__})") from None
    try:
        # mkstemp creates the file 0600; a checkpoint is shared data, so give it what open() would: 0666 - umask
        os.fchmod(fd, 0o666 & ~_umask() if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)  # the rename itself survives a power cut
    except BaseException as e:  # a full disk, an interrupt, a kill: the previous file stays, whole
        Path(tmp).unlink(missing_ok=True)
        # torch.save reports a failed write as a RuntimeError about stream positions; the OSError is its context
        cause = e if isinstance(e, OSError) else e.__context__ if isinstance(e, RuntimeError) else None
        if isinstance(cause, OSError):
            was = "is as it was" if path.exists() else "was not written"
            why = cause.strerror or str(cause) or type(cause).__name__
            raise CheckpointError(f"{path}: cannot write it ({why}); the file {was}, never torn") from None
        raise


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform or filesystem that cannot open a folder: the rename is still atomic
        return
    try:
        with contextlib.suppress(OSError):  # some filesystems refuse fsync on a folder; the rename is done
            os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0o022)  # the only portable way to read the umask is to set it; put it straight back
    os.umask(mask)
    return mask


def load_checkpoint(source: str | os.PathLike | BinaryIO, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read and validate a checkpoint from a path or a binary file object (``io.BytesIO(data)`` works).

    A path that does not exist but reads ``package.module:factory`` is a factory (``load_factory``): the
    model it returns, with its task, stands in for a checkpoint in every analysis.

    Every failure is a ``CheckpointError`` whose one-line message names the file, what is wrong with it and the
    fix: missing, empty, not a torch file (text, JSON, random bytes), truncated, a zip without torch's members, a
    pickle that holds Python objects or code, a torch file that is not a probe checkpoint, a newer format.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists() and is_factory_spec(str(source)):  # package.module:factory, a live model, not a file
            return load_factory(str(source))
        return checkpoint_from_payload(_read_file(path, map_location), path)
    named = Path(source.name) if isinstance(getattr(source, "name", None), str) else None
    if not source.seekable():  # recognising the format reads ahead and rewinds
        source = io.BytesIO(source.read())
    obj = _load_payload(source, str(named or "<stream>"), map_location)
    return checkpoint_from_payload(obj, named)


def _read_file(path: Path, map_location: str | torch.device) -> Any:
    """The payload of the file at ``path`` (``_load_payload``), after the checks a path needs."""
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty file, not a checkpoint")
    try:
        f = path.open("rb")
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it ({e.strerror or type(e).__name__})") from None
    with f:
        return _load_payload(f, str(path), map_location)


# --- telling a bad file apart ----------------------------------------------------------------------------
_FIX = "pass a .pt file written by probe (python -m probe.train or probe.checkpoint.save_checkpoint)"
_RECOPY = "copy or download it again, or re-save it"
_PLAIN_PICKLE = f"not a checkpoint: a Python pickle of plain data, not a torch file; {_FIX}"
_ZIP_MAGIC = b"PK\x03\x04"  # what torch.save writes first; torch itself looks only here (torch.serialization)
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # first pickle of torch's pre-1.6 format
_SCAN_LIMIT = 64 << 20  # bytes read to recognise a pickle; a legacy torch file's first pickle is tiny
_OBJECT_OPCODES = {"INST", "OBJ", "BUILD", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"}
# the globals through which old pickle protocols spell plain values (bytes, sets): data, not objects
_PLAIN_GLOBALS = {f"{m}.{n}" for m in ("builtins", "__builtin__") for n in ("bytes", "bytearray", "set", "frozenset")}
_PLAIN_GLOBALS.add("_codecs.encode")
_OTHER_FORMATS = ((b"\x1f\x8b", "gzip-compressed data (decompress it first)"), (b"\x93NUMPY", "a numpy .npy array"),
                  (b"\x89HDF", "an HDF5 file"), (b"PK\x05\x06", "an empty zip archive"))


@dataclass
class _Pickle:
    """What a well-formed pickle references, read without running it."""

    first: Any  # the first opcode's argument: the whole value of a one-int pickle such as torch's legacy magic
    globals: list[str]  # module.name of each global it would import ("?" where the name is computed)
    objects: bool  # builds or calls Python objects (what weights_only refuses unless torch allows the global)


def _scan_pickle(data: bytes) -> _Pickle | None:
    """The first pickle in ``data``, or None when the bytes are not a well-formed pickle.

    ``pickletools.dis`` checks opcodes, arguments, the stack and the memo, so text or random bytes rarely pass.
    It reports malformed input with assorted exception types, all of which mean "not a pickle"."""
    try:
        pickletools.dis(io.BytesIO(data), out=io.StringIO())
        ops = list(pickletools.genops(io.BytesIO(data)))
    except (ValueError, EOFError, OverflowError, MemoryError, struct.error, UnicodeError, IndexError, KeyError,
            TypeError):
        return None
    names, strings = [], []
    for op, arg, _ in ops:
        if isinstance(arg, str):
            strings.append(arg)
        if op.name in ("GLOBAL", "INST"):
            names.append(str(arg).replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            names.append(".".join(strings[-2:]) if len(strings) >= 2 else "?")
    first = ops[0][1] if ops and ops[0][0].name != "PROTO" else (ops[1][1] if len(ops) > 1 else None)
    objects = any(op.name in _OBJECT_OPCODES for op, _, _ in ops) or bool(set(names) - _PLAIN_GLOBALS)
    return _Pickle(first, names, objects)


def _reason(e: BaseException) -> str:
    """The gist of a library's message: its first sentence of its first line, without terminal colour codes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return first.split(". ")[0].rstrip(".")[:120]


def _what_is(head: bytes, size: int) -> str:
    """A name for bytes that are neither a zip nor a pickle: text, JSON, a known binary format, or binary data."""
    for magic, what in _OTHER_FORMATS:
        if head.startswith(magic):
            return what
    if len(head) >= 10 and head[8:10] == b'{"' and int.from_bytes(head[:8], "little") < size:
        return "a safetensors file (probe reads torch checkpoints, which carry the configs safetensors lacks)"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        text = head[: e.start].decode("utf-8") if e.start >= len(head) - 3 and e.start > 0 else ""
    if not text or "\x00" in text or sum(not (c.isprintable() or c.isspace()) for c in text) > len(text) // 20:
        return f"{size} bytes of binary data, neither a torch file (a zip) nor a pickle"
    if not text.strip():
        return "a text file of blank space, not a torch file"
    start = text.lstrip()[:30].splitlines()[0]
    if text.lstrip()[:1] in ("{", "[") and len(head) == size:
        try:
            json.loads(text)
            return f"a JSON file (starts {start!r}), not a torch file"
        except ValueError:
            pass
    return f"a text file (starts {start!r}), not a torch file"


def _load_payload(f: BinaryIO, name: str, map_location: str | torch.device) -> Any:
    """``torch.load(f, weights_only=True)``, with every way it can fail turned into one line that names the cause.

    The format is recognised before torch reads anything, because torch's own errors on a bad file are multi-line,
    misleading (a text file gives ``KeyError: 101``; random bytes are said to hold Python objects) or both."""
    start = f.tell()
    size = f.seek(0, os.SEEK_END) - start
    if size == 0:
        raise CheckpointError(f"{name}: empty file, not a checkpoint; {_FIX}")
    f.seek(start)
    magic = f.read(len(_ZIP_MAGIC))
    is_zip = _ZIP_MAGIC.startswith(magic)  # a file cut inside the magic itself is a truncated zip too
    f.seek(start)
    if is_zip:
        pkl = _check_zip(f, name, size)
    else:
        head = f.read(_SCAN_LIMIT)
        scan = _scan_pickle(head)
        if scan is None:
            raise CheckpointError(f"{name}: not a checkpoint: {_what_is(head, size)}; {_FIX}")
        # Only torch's old format starts with a pickle (of its magic number); any other pickle is refused here,
        # the same way whatever its protocol (torch's unpickler reads some protocols' opcodes and not others).
        if scan.first != _TORCH_LEGACY_MAGIC:
            raise CheckpointError(f"{name}: {_refusal(scan.globals) if scan.objects else _PLAIN_PICKLE}")
    f.seek(start)
    try:
        with warnings.catch_warnings():
            # torch warns on stderr about pickle protocols > 2; the verdict below says what matters in one line
            warnings.simplefilter("ignore")
            return torch.load(f, map_location=map_location, weights_only=True)
    except Exception as e:  # torch's unpickler raises arbitrary exception types on malformed data
        if is_zip:  # scanned only now: a good checkpoint's loading should not pay for it
            f.seek(start)
            with _zip(f, name, size) as zf:
                scan = _scan_pickle(zf.read(pkl))
        raise CheckpointError(f"{name}: {_verdict(e, scan, is_zip)}") from None


@contextlib.contextmanager
def _zip(f: BinaryIO, name: str, size: int) -> Iterator[zipfile.ZipFile]:
    """The zip archive in ``f``; one that cannot be read was cut short (or damaged)."""
    try:
        with zipfile.ZipFile(f) as zf:
            yield zf
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, struct.error,
            NotImplementedError, zlib.error):
        # a torch file ends with the zip's central directory: a file cut short has none
        raise CheckpointError(f"{name}: truncated or damaged torch file ({size} bytes; the zip archive inside is "
                              f"incomplete); {_RECOPY}") from None


def _check_zip(f: BinaryIO, name: str, size: int) -> str:
    """The name of the zip's ``data.pkl`` (torch's pickle); refuse a zip that is cut short or has none, or whose
    bytes differ from those written: torch itself reads a flipped byte in the weights without a word, so every
    member is checked against the CRC-32 the zip records for it (about 60 ms per 100 MB)."""
    with _zip(f, name, size) as zf:
        members = zf.namelist()
        bad = zf.testzip()
    if bad is not None:
        raise CheckpointError(f"{name}: damaged torch file (its member {bad} does not match the checksum written "
                              f"with it); {_RECOPY}")
    pkl = next((m for m in members if m == "data.pkl" or m.endswith("/data.pkl")), None)
    if pkl is None:
        shown = ", ".join(members[:4]) + (", ..." if len(members) > 4 else "") if members else "nothing"
        raise CheckpointError(f"{name}: not a checkpoint: a zip archive without torch's data.pkl (it holds "
                              f"{shown}); {_FIX}")
    return pkl


def _verdict(e: Exception, scan: _Pickle | None, is_zip: bool) -> str:
    """Why torch.load failed on a file that looked like a zip or a pickle."""
    refused = isinstance(e, pickle.UnpicklingError) and "weights only" in str(e).lower().replace("_", " ")
    if refused and scan is not None and scan.objects:
        culprit = re.search(r"GLOBAL ([\w.]+)", str(e))
        return _refusal([culprit.group(1)] if culprit else scan.globals)
    if scan is None:
        return f"damaged torch file (its data.pkl is not a valid pickle); {_RECOPY}"
    if refused:
        return f"not a checkpoint: a torch file whose pickle torch's safe loader does not read; {_FIX}"
    return f"{'' if is_zip else 'truncated or '}damaged torch file ({_reason(e)}); {_RECOPY}"


def _refusal(globals_: list[str]) -> str:
    names = list(dict.fromkeys(globals_))
    what = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "") if names else "objects it builds"
    return (f"refused to load: it holds Python objects or code ({what}), not plain data, and a checkpoint is data; "
            f"{_FIX}")


# --- formats ---------------------------------------------------------------------------------------------------------
def _this_format(obj: Any, name: str) -> tuple[dict[str, Any], int]:
    """A file's payload in this probe's format, and the format it was written in. An older format is converted here
    and nowhere else: its schedule record re-spelt once by ``legacy.upgrade_schedule``, a wrapped recurrence's weights
    (and their AdamW moments) under today's names (``_upgrade_wrapped_keys``); a newer one is refused."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        holds = (f"a dict of {', '.join(repr(k)[:40] for k in list(obj)[:4])}{', ...' if len(obj) > 4 else ''}"
                 if isinstance(obj, dict) and obj else f"a {type(obj).__name__}")
        raise CheckpointError(f"{name}: not a probe checkpoint: a torch file ({holds}) without probe's format "
                              f"marker; {_FIX}")
    version = obj.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(f"{name}: damaged probe checkpoint (format_version is {version!r}); {_RECOPY}")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{name}: written in checkpoint format {version} by probe {obj.get('probe_version')}; "
            f"this probe ({__version__}) reads format <= {FORMAT_VERSION}: upgrade probe"
        )
    if version == FORMAT_VERSION:
        return obj, version
    current = dict(obj, format_version=FORMAT_VERSION)
    if isinstance(obj.get("state_dict"), dict):
        current["state_dict"] = _upgrade_wrapped_keys(obj["state_dict"])
    adam = obj["extra"].get("lstm_adam") if isinstance(obj.get("extra"), dict) else None
    if isinstance(adam, dict) and isinstance(adam.get("exp_avg_sq"), dict):
        moments = _upgrade_wrapped_keys(adam["exp_avg_sq"])
        current["extra"] = dict(obj["extra"], lstm_adam=dict(adam, exp_avg_sq=moments))
    train = obj.get("train_config")
    if isinstance(train, dict) and isinstance(train.get("schedule"), dict):
        try:
            current["train_config"] = dict(train, schedule=legacy.upgrade_schedule(train["schedule"]))
        except ProbeError as e:
            raise CheckpointError(f"{name}: checkpoint format {version} whose schedule record is not a schedule "
                                  f"({e})") from None
    return current, version


_OLD_WRAPPED_RNN = re.compile(r"(module\..+)\.layers\.(\d+)\.rnn\.(weight_ih|weight_hh|bias_ih|bias_hh)_l0")
"""A key of format 1: a wrapped model's named ``nn.LSTM`` / ``nn.GRU`` at ``PATH``, before wraps kept the user's
module tree, was swapped for cells saved as ``module.PATH.layers.K.rnn.W_l0``; today its keys are the user's own,
``module.PATH.W_lK``."""


def _upgrade_wrapped_keys(named: dict[str, Any]) -> dict[str, Any]:
    """``named`` (a state_dict, or anything keyed by parameter name) with a wrapped recurrence's format-1 keys as
    today's. Only a module every key below which has the old form is renamed (a user's own ``...layers.0.rnn``
    beside other weights is left as it is), and never onto a key that is there already."""
    found = {key: m for key in named if (m := _OLD_WRAPPED_RNN.fullmatch(key))}
    paths = {m.group(1) for m in found.values()}
    old = {p for p in paths if all(k in found for k in named if k.startswith(p + "."))}
    out: dict[str, Any] = {}
    for key, value in named.items():
        m = found.get(key)
        new = f"{m.group(1)}.{m.group(3)}_l{m.group(2)}" if m and m.group(1) in old else None
        out[new if new and new not in named else key] = value
    return out


def checkpoint_from_payload(obj: Any, path: Path | None = None) -> Checkpoint:
    """The checkpoint a file's payload holds, checked. A file of an older format is converted first, with a note
    (``CheckpointFormatWarning``, once a file in a process) that names it and how to rewrite it once."""
    name = str(path) if path else "<checkpoint>"
    obj, version = _this_format(obj, name)
    if version < FORMAT_VERSION and name not in _NOTED:
        _NOTED.add(name)
        fix = (f"python -m probe.checkpoint upgrade {path}" if path else
               "probe.checkpoint.save_checkpoint writes it in this format")
        warnings.warn(f"{name}: checkpoint format {version}, converted as it was read; rewrite it once in format "
                      f"{FORMAT_VERSION}: {fix}", CheckpointFormatWarning, stacklevel=3)
    missing = [k for k in ("model_config", "task_config", "state_dict") if k not in obj]
    if missing:
        raise CheckpointError(f"{name}: incomplete checkpoint, missing {', '.join(missing)}; {_RECOPY}")
    state_dict = obj["state_dict"]
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise CheckpointError(f"{name}: damaged checkpoint (state_dict is not a dict of tensors); {_RECOPY}")
    try:
        model_config = model_config_from_dict(obj["model_config"])
        task_config = task_from_dict(obj["task_config"])
        step = int(obj.get("step", 0))
    except (ProbeError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{name}: incompatible config ({_reason(e)}), written by probe "
                              f"{obj.get('probe_version')}: read it with that version") from None
    return Checkpoint(
        path=path,
        model_config=model_config,
        task_config=task_config,
        state_dict=state_dict,
        train_config=obj.get("train_config") or {},
        step=step,
        optimizer_state=obj.get("optimizer_state"),
        metrics=obj.get("metrics") or {},
        extra=obj.get("extra") or {},
        probe_version=str(obj.get("probe_version")),
    )


def checkpoint_from_model(model: Any, task: TaskConfig, model_config: AnyModelConfig | None = None,
                          **fields: Any) -> Checkpoint:
    """Wrap a live model (and optional train_config, step, optimizer_state, metrics) as a Checkpoint. A wrapped
    model's checkpoint records what rebuilds it (``model_config``: an ``HFModelConfig`` or ``FactoryModelConfig``, by
    default the one it was built from); one that records nothing is refused, since a checkpoint holds no code."""
    cfg = model_config or getattr(model, "source_config", None) or model.cfg
    if not isinstance(cfg, AnyModelConfig):
        raise CheckpointError(
            f"a {type(model).__name__} built by hand cannot be saved: a checkpoint is data and could not rebuild it; "
            "build it from probe.external.HFModelConfig or FactoryModelConfig (python -m probe.train --model "
            "package.module:factory), or pass model_config=")
    return Checkpoint(path=None, model_config=cfg, task_config=task, state_dict=model.state_dict(), **fields)


def resolve_checkpoints(specs: list[str], note: Callable[[str], None] | None = None) -> list[Path]:
    """Expand CLI arguments (files, directories, globs) into checkpoint paths, in sorted order.

    A training run's folder (it holds ``final.pt`` or ``last.pt``) stands for one checkpoint: ``final.pt``, or
    ``last.pt`` while the run has not finished; ``note`` hears which. Any other folder (``checkpoints/``, a
    trajectory) stands for every ``*.pt`` in it."""
    out: list[Path] = []
    for spec in specs:
        p = Path(spec)
        if p.is_dir():
            final, last = p / "final.pt", p / "last.pt"
            if final.exists() or last.exists():
                chosen = final if final.exists() else last
                out.append(chosen)
                if note and chosen == final:
                    note(f"{p}: a training run: using final.pt" + (" (last.pt is the same run's resume point)"
                                                                    if last.exists() else ""))
                elif note:
                    note(f"{p}: a training run without final.pt (not finished?): using last.pt")
                continue
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


# --- package.module:factory wherever a CLI takes a checkpoint ------------------------------------------------------
@dataclass
class FactoryCheckpoint(Checkpoint):
    """A live model from a factory, served to the analyses in place of a checkpoint file: no path, no training
    record (so no schedule gate and no optimizer moments), the model itself instead of a state dict."""

    model: Any = None
    spec: str = ""

    @property
    def name(self) -> str:
        return self.spec

    @property
    def label(self) -> str:
        return self.spec

    def build_model(self, device: torch.device | str = "cpu") -> Any:
        return self.model.to(device).eval()


def load_factory(spec: str) -> FactoryCheckpoint:
    """Import ``package.module``, call ``callable()`` and check that it returned ``(model, task)``: a wrapped model
    (``probe.wrap``, ``probe.wrap_hf``) or one of probe's, and a ``TaskConfig``. The current folder is importable,
    as for ``python -m``. Every failure is one line (``CheckpointError``)."""
    try:
        model, task = call_factory(spec)
    except ProbeError as e:
        raise CheckpointError(f"no such file, and {e}") from None
    return FactoryCheckpoint(path=None, model_config=model.cfg, task_config=task, state_dict={}, model=model,
                             spec=spec)


# --- python -m probe.checkpoint upgrade ----------------------------------------------------------------------------
def upgrade_checkpoint(path: str | os.PathLike) -> int:
    """Rewrite the checkpoint at ``path`` in this probe's format (``FORMAT_VERSION``) and return the format it had.

    Only the format changes: the weights, the optimizer state and every other field are written back as they were
    read. The rewrite is atomic (a temp file, then a rename, as ``save_checkpoint`` writes), so a failure midway
    leaves the file as it was; the file is checked as a whole before anything is written. A file already in this
    format is not touched."""
    path = Path(path)
    obj, version = _this_format(_read_file(path, "cpu"), str(path))
    if version < FORMAT_VERSION:
        checkpoint_from_payload(obj, path)  # a file that would not load is not rewritten
        _write_atomically(path, obj, mode=path.stat().st_mode & 0o777)
    return version


_UPGRADE_HELP = f"""Rewrite checkpoints of an older format in format {FORMAT_VERSION}, once, so that they load without a
note. Each file is rewritten atomically (a temp file, then a rename: a failure leaves it as it was), its weights,
optimizer state and metrics as they were; a file already in format {FORMAT_VERSION} is left as it is. Not on a run
that is training: its next save would race the rewrite.

--json prints one object; each row: checkpoint, format_was, format, rewritten (true or false)."""


def _checkpoint_files(specs: list[str]) -> list[Path]:
    """Files as given; a folder stands for every ``*.pt`` below it."""
    out: list[Path] = []
    for spec in specs:
        p = Path(spec)
        found = sorted(p.rglob("*.pt")) if p.is_dir() else [p]
        if not found:
            raise CheckpointError(f"{p}: folder holds no *.pt checkpoints")
        out += found
    return out


@dataclass
class UpgradeOptions(CommandOptions):
    """``python -m probe.checkpoint upgrade PATH... [--json]``."""

    paths: list[str] = option(help="checkpoint files, or folders (every *.pt below them)", positional=True,
                              nargs="+", metavar="PATH", default_factory=list)
    json: bool = option(False, "print one JSON object on stdout")
    # every command takes it, so that a script can pass it everywhere; an upgrade draws no bar
    no_progress: bool = option(False, "accepted for a uniform command line (upgrade shows no progress)", order=7)


def upgrade(opts: UpgradeOptions) -> Report:
    """Rewrite each file of an older format once; a line a file says what was done (one line and exit code 2 on a
    bad file)."""
    rows = []
    for path in _checkpoint_files(opts.paths):
        was = upgrade_checkpoint(path)
        rows.append({"checkpoint": str(path), "format_was": was, "format": FORMAT_VERSION,
                     "rewritten": was != FORMAT_VERSION})
        say(opts, f"{path}: " + (f"format {was} -> {FORMAT_VERSION}, rewritten" if was != FORMAT_VERSION else
                                 f"already format {FORMAT_VERSION}, left as it is"))  # as it goes: a bad file stops
    return Report([r["checkpoint"] for r in rows], rows, command="checkpoint upgrade")


COMMAND = CommandGroup("checkpoint", "Checkpoint files in this probe's format.", (
    Command("upgrade", UpgradeOptions, upgrade, _UPGRADE_HELP, results_file=False,
            summary="rewrite checkpoints of an older format, once"),
))
main, build_parser = COMMAND.main, COMMAND.build_parser


if __name__ == "__main__":
    raise SystemExit(main())
