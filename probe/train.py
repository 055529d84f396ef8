"""Reference trainer with Delayed Attention Training schedules, presets, resumable runs and trajectories.

Usage: ``python -m probe.train --preset hybrid-dat --seed 0 --out runs/hybrid-dat/seed0``. A run directory holds
``last.pt`` (with optimizer state, for ``--resume``), ``final.pt`` (weights only, what is shipped),
``metrics.jsonl`` (one JSON object per evaluation) and ``trajectory/step_XXXXXX.pt`` snapshots.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from probe.checkpoint import Checkpoint, checkpoint_from_model, load_checkpoint, save_checkpoint
from probe.cli import add_common_args, resolve_device, run_cli
from probe.errors import ProbeError
from probe.evaluate import accuracy_at_length
from probe.models import HookedSequenceModel, ModelConfig
from probe.schedules import Schedule, ScheduleConfig, split_scope
from probe.tasks import IGNORE_INDEX, Batch, TaskConfig, make_task

PRECISIONS = ("fp32", "bf16")
"""``bf16``: forward and backward under ``torch.autocast(dtype=bfloat16)``; weights, optimizer state and loss stay
float32 (mixed precision with fp32 master weights)."""


OPTIMIZER_IMPLS = ("default", "foreach", "fused")
"""AdamW's implementation: torch's default for the device (a per-parameter loop on CPU), multi-tensor ``foreach``,
or the ``fused`` kernel. Same algorithm; they differ in float rounding and speed (benchmarks/throughput.py)."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, evaluation and saving. Batches are a pure function of (seed, step), so a resumed run sees
    exactly the batches the uninterrupted one would have."""

    steps: int = 4500
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 200
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_samples: int = 128
    ckpt_every: int = 500
    traj_every: int = 250
    traj_dtype: str = "float16"
    seed: int = 0
    threads: int = 1
    precision: str = "fp32"
    optimizer_impl: str = "default"
    compile: bool = False
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "eval_samples", "ckpt_every", "traj_every", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProbeError(f"train.{name} must be a positive integer, got {value!r}")
        for name in ("lr", "weight_decay", "min_lr_ratio", "grad_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ProbeError(f"train.{name} must be a non-negative number, got {value!r}")
        if self.precision not in PRECISIONS:
            raise ProbeError(f"train.precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ProbeError(
                f"train.optimizer_impl {self.optimizer_impl!r}: choose one of {', '.join(OPTIMIZER_IMPLS)}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["schedule"] = self.schedule.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        d = dict(d)
        d["schedule"] = ScheduleConfig(**d.get("schedule", {}))
        return cls(**d)


# Presets, tuned on CPU for the interleaved task (m 10, 6 pairs of 16 keys / 16 values, q 0.2, lengths 1..25).
# The hybrid presets differ only in the schedule; `lstm` is the hybrid without attention sublayers; `transformer`
# uses sinusoidal positions so that its positional code exists at every evaluation length. See README.
# The LSTM-containing presets train at lr 2e-3, not TrainConfig's 1e-3: at 1e-3 the LSTM found the
# length-generalizing counter in only 4 of 6 runs (lstm seed 0 and hybrid-dat seed 2 stalled at 70-90 % state
# accuracy in distribution); at 2e-3 both found it by step 1500 from the same initialisation. The Transformer keeps
# 1e-3: at 2e-3 its recall stalled at 26 %. docs/training.md has the runs.
_BASE_MODEL = dict(d_model=128, n_layers=2, n_heads=4, pos_encoding="none")
_BASE_TRAIN = dict(steps=4500, lr=2e-3)
PRESETS: dict[str, dict[str, Any]] = {
    "lstm": dict(model=dict(_BASE_MODEL, family="lstm"), train=dict(_BASE_TRAIN)),
    "transformer": dict(model=dict(_BASE_MODEL, family="transformer", pos_encoding="sinusoidal"),
                        train=dict(_BASE_TRAIN, lr=1e-3)),
    "hybrid-joint": dict(model=dict(_BASE_MODEL, family="hybrid"),
                         train=dict(_BASE_TRAIN, schedule=dict(kind="joint"))),
    "hybrid-dat": dict(model=dict(_BASE_MODEL, family="hybrid"),
                       train=dict(_BASE_TRAIN, schedule=dict(kind="delayed", switch=2000))),
}


def _check_override(section: str, cls: type, name: str, value: Any) -> None:
    """A ``--set`` value must name a field of its config and have that field's type (ints pass as floats)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise ProbeError(f"--set {section}.{name}: no such field; {section} has {', '.join(sorted(fields))}")
    f = fields[name]
    default = f.default if f.default is not dataclasses.MISSING else None
    if default is None or value is None:
        return
    expected = type(default)
    ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise ProbeError(f"--set {section}.{name}={value!r}: expected {expected.__name__}, got {type(value).__name__}")


def build_configs(preset: str, task: str = "interleaved", overrides: list[str] | None = None,
                  **train_overrides: Any) -> tuple[ModelConfig, TaskConfig, TrainConfig]:
    """Configs of a preset, with ``section.field=value`` overrides (sections: model, task, train, schedule)."""
    if preset not in PRESETS:
        raise ProbeError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    spec = PRESETS[preset]
    sections: dict[str, dict[str, Any]] = {
        "model": dict(spec["model"]), "task": {}, "train": dict(spec["train"]),
        "schedule": dict(spec["train"].get("schedule", {})),
    }
    sections["train"].pop("schedule", None)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or section not in sections:
            raise ProbeError(
                f"bad override {item!r}: use SECTION.FIELD=VALUE with SECTION in model, task, train, schedule"
            )
        value = _parse_value(raw)
        if section != "task":  # task fields differ per task and are checked by the task's own dataclass
            cls = {"model": ModelConfig, "train": TrainConfig, "schedule": ScheduleConfig}[section]
            _check_override(section, cls, name, value)
        sections[section][name] = value
    sections["train"].update({k: v for k, v in train_overrides.items() if v is not None})
    try:
        task_cfg = make_task(task, **sections["task"])
        model_cfg = ModelConfig(vocab_size=task_cfg.vocab_size, **sections["model"])
        train_cfg = TrainConfig(schedule=ScheduleConfig(**sections["schedule"]), **sections["train"])
    except TypeError as e:
        raise ProbeError(f"preset {preset}: {e}") from None
    return model_cfg, task_cfg, train_cfg


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def train_batch_seed(seed: int, step: int) -> int:
    return seed * 1_000_003 + step


class Trainer:
    """One run: model, optimizer, schedule; ``run()`` trains to ``cfg.steps`` writing checkpoints as it goes."""

    def __init__(self, model_cfg: ModelConfig, task: TaskConfig, cfg: TrainConfig, out: str | Path,
                 device: str | torch.device = "cpu", progress: bool = True) -> None:
        self.model_cfg, self.task, self.cfg = model_cfg, task, cfg
        self.out = Path(out)
        self.device = torch.device(device)
        self.progress = progress
        if self.device.type == "cuda" and cfg.precision == "fp32":
            # fp32 means fp32: cuDNN (the LSTM) would otherwise run its matmuls in TF32 (10-bit mantissa)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        torch.manual_seed(cfg.seed)
        self.model = HookedSequenceModel(model_cfg).to(self.device)
        impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[cfg.optimizer_impl]
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)
        # compile the forward only; hooks, gates and checkpoints keep working on self.model
        self.forward = torch.compile(self.model, dynamic=True) if cfg.compile else self.model
        self.schedule = Schedule(cfg.schedule, cfg.steps)
        block = split_scope(cfg.schedule.stopgrad_scope)[1]
        if block is not None and not (block < model_cfg.n_layers and self.model.recurrent_parameters(block)):
            raise ProbeError(f"schedule.stopgrad_scope=recurrent:{block}: the model has no LSTM in block {block} "
                             f"({model_cfg.n_layers} blocks)")
        self.step = 0
        self.metrics: dict[str, Any] = {}
        self.running: dict[str, float] = {}
        self._bar_eval: dict[str, str] = {}
        if cfg.precision == "bf16":
            note = bf16_note(self.device)
            if note and progress:
                print(note, file=sys.stderr)

    # --- state --------------------------------------------------------------------------------------------
    def _apply_schedule(self, step: int) -> None:
        self.model.set_attention_gate(self.schedule.gate(step))
        self.model.set_attention_stopgrad(self.schedule.stopgrad_all(step))
        trains = self.schedule.attention_trains(step)
        for p in self.model.attention_parameters():
            p.requires_grad_(trains)  # a parameter without a grad is skipped by AdamW: no update, no decay
        recurrent = self.schedule.recurrent_trains(step)
        for p in self.model.recurrent_parameters():
            p.requires_grad_(recurrent)

    def checkpoint(self, with_optimizer: bool = True) -> Checkpoint:
        return checkpoint_from_model(
            self.model, self.task, train_config=self.cfg.to_dict(), step=self.step,
            optimizer_state=self.optimizer.state_dict() if with_optimizer else None,
            metrics=self.metrics, extra={"schedule_state": self.schedule.state_dict(), "running": dict(self.running)},
        )

    def resume(self) -> bool:
        """Continue from ``out/last.pt`` if it exists; its configs must match this run's (the first differing
        field is named)."""
        last = self.out / "last.pt"
        if not last.exists():
            return False
        ckpt = load_checkpoint(last, map_location=self.device)
        diff = config_diff(ckpt, self.model_cfg, self.task, self.cfg)
        if diff:
            raise ProbeError(f"{last}: cannot resume: {diff}")
        self.model.load_state_dict(ckpt.state_dict)
        self.schedule.load_state_dict(ckpt.extra.get("schedule_state", {}))
        self._apply_schedule(ckpt.step)
        self.optimizer.load_state_dict(ckpt.optimizer_state)
        self.step, self.metrics = ckpt.step, ckpt.metrics
        self.running = dict(ckpt.extra.get("running") or {})
        log = self.out / "metrics.jsonl"
        if log.exists():  # drop what was logged after the checkpoint the run resumes from
            kept = [ln for ln in log.read_text().splitlines() if ln and json.loads(ln)["step"] <= self.step]
            log.write_text("".join(ln + "\n" for ln in kept))
        return True

    # --- loop ---------------------------------------------------------------------------------------------
    def train_step(self, step: int) -> tuple[float, float]:
        """One optimizer step on the batch of ``step``; returns (loss, token accuracy on that batch)."""
        g = torch.Generator().manual_seed(train_batch_seed(self.cfg.seed, step))
        length = int(torch.randint(1, self.task.train_length + 1, (1,), generator=g))
        batch = self.task.sample(length, self.cfg.batch_size, g).to(self.device)
        self._apply_schedule(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.cfg, step)
        self.model.train()
        split = self.schedule.stopgrad_split(step)
        cut_params = self._split_parameters(split) if split else []
        cut_grads = self._grads_without_attention(batch, step, cut_params) if split else []
        logits, loss = self._loss(batch, step)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for p, grad in zip(cut_params, cut_grads, strict=True):  # these learn only from paths that avoid attention
            p.grad = grad  # None where the parameter is frozen or unreached, as after a plain backward
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        mask = batch.answer_mask
        acc = ((logits.detach().argmax(-1) == batch.labels) & mask).sum() / mask.sum()
        return loss.item(), acc.item()

    def _loss(self, batch: Batch, step: int) -> tuple[Tensor, Tensor]:
        """(logits in fp32, loss) of ``batch``; a non-finite loss stops the run."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16"):
            logits = self.forward(batch.tokens)
        logits = logits.float()
        loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
        if not torch.isfinite(loss):
            raise ProbeError(
                f"non-finite loss ({loss.item()}) at step {step}; stopped, last good checkpoint kept at "
                f"{self.out / 'last.pt'} (try a lower train.lr)"
            )
        return logits, loss

    def _split_parameters(self, scope: str) -> list[nn.Parameter]:
        """The parameters that get the attention-free gradient under a split ``stopgrad_scope``."""
        scope, block = split_scope(scope)
        if scope == "recurrent":
            return self.model.recurrent_parameters(block)
        rec = {id(p) for p in self.model.recurrent_parameters()}
        return [p for p in self.model.parameters() if id(p) not in rec]

    def _grads_without_attention(self, batch: Batch, step: int, params: list[nn.Parameter]) -> list[Tensor | None]:
        """``params``' gradient with every path through attention cut (for the LSTM weights, the ``g_rec`` of
        probe.gradients): a forward with the stream detached at attention's inputs, differentiated for them only."""
        trained = [p for p in params if p.requires_grad]
        self.model.set_attention_stopgrad(True)
        try:
            _, loss = self._loss(batch, step)
            grads = torch.autograd.grad(loss, trained, allow_unused=True) if trained else ()
        finally:
            self.model.set_attention_stopgrad(False)
        found = dict(zip(map(id, trained), grads, strict=True))
        return [found.get(id(p)) for p in params]

    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        row: dict[str, float] = {}
        for factor in (1, 2, 3):
            length = factor * self.task.train_length
            acc = accuracy_at_length(self.model, self.task, length, self.cfg.eval_samples, seed=self.cfg.seed)
            for subtask, values in acc.items():
                row[f"{subtask}_acc_{factor}x"] = values["token_acc"]
        return row

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def lstm_adam_state(self) -> dict[str, Any]:
        """AdamW's second moments of the LSTM weights (bfloat16: fp16 underflows on squared gradients) and what it
        takes to precondition a gradient as the next update would: ``-lr * g / (sqrt(v / (1 - beta2**t)) + eps)``.
        Empty before the first step. Trajectory snapshots carry it for the lookahead interference analysis."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        group = self.optimizer.param_groups[0]
        moments: dict[str, torch.Tensor] = {}
        step = 0
        for p in self.model.recurrent_parameters():
            state = self.optimizer.state.get(p, {})
            if "exp_avg_sq" in state and ".lstm.rnn." in names[id(p)]:
                moments[names[id(p)]] = state["exp_avg_sq"].detach().to("cpu", torch.bfloat16)
                step = max(step, int(state["step"]))
        if not moments:
            return {}
        return {"exp_avg_sq": moments, "step": step, "beta1": float(group["betas"][0]),
                "beta2": float(group["betas"][1]), "eps": float(group["eps"]), "lr": float(group["lr"])}

    def _snapshot(self) -> None:
        ckpt = self.checkpoint(with_optimizer=False)
        dtype = getattr(torch, self.cfg.traj_dtype)
        ckpt.state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in ckpt.state_dict.items()}
        adam = self.lstm_adam_state()
        if adam:
            ckpt.extra["lstm_adam"] = adam
        save_checkpoint(self.out / "trajectory" / f"step_{self.step:06d}.pt", ckpt)

    def run(self) -> Checkpoint:
        torch.set_num_threads(self.cfg.threads)
        self.out.mkdir(parents=True, exist_ok=True)
        if self.step == 0:
            (self.out / "metrics.jsonl").unlink(missing_ok=True)
            self._snapshot()
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=self.cfg.steps, initial=self.step, desc=self.out.name, dynamic_ncols=True)
        t0 = time.perf_counter()
        run_loss, run_acc = self.running.get("loss"), self.running.get("acc")
        while self.step < self.cfg.steps:
            loss, acc_batch = self.train_step(self.step)
            run_loss = loss if run_loss is None else 0.98 * run_loss + 0.02 * loss
            run_acc = acc_batch if run_acc is None else 0.98 * run_acc + 0.02 * acc_batch
            self.running = {"loss": run_loss, "acc": run_acc}
            if bar is not None and self.step % 10 == 0:
                bar.set_postfix(loss=f"{run_loss:.3f}", acc=f"{run_acc:.3f}", **self._bar_eval)
            self.step += 1
            if self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps:
                acc = self.evaluate()
                switched = self.schedule.observe(self.step, acc["state_acc_1x"])
                self.metrics = {"step": self.step, "loss": run_loss, "gate": self.schedule.gate(self.step),
                                "elapsed_s": time.perf_counter() - t0, **acc}
                self._log(self.metrics | ({"event": "attention switched on"} if switched else {}))
                self._bar_eval = {"state3x": f"{acc['state_acc_3x']:.3f}", "recall3x": f"{acc['recall_acc_3x']:.3f}"}
            if self.step % self.cfg.traj_every == 0:
                self._snapshot()
            if self.step % self.cfg.ckpt_every == 0 or self.step == self.cfg.steps:
                save_checkpoint(self.out / "last.pt", self.checkpoint())
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        final = self.checkpoint(with_optimizer=False)
        save_checkpoint(self.out / "final.pt", final)
        return final


def bf16_note(device: torch.device) -> str | None:
    """One line when bf16 autocast will be slow here: a CPU without native bf16 dot products (avx512_bf16 or AMX)
    runs it emulated."""
    if device.type != "cpu":
        return None
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "note: cannot tell whether this CPU has native bf16 (no /proc/cpuinfo); bf16 may be emulated"
    if {"avx512_bf16", "amx_bf16"} & flags:
        return None
    return "note: this CPU has neither avx512_bf16 nor AMX: bf16 autocast is emulated and likely slower than fp32"


def config_diff(ckpt: Checkpoint, model_cfg: ModelConfig, task: TaskConfig, cfg: TrainConfig) -> str | None:
    """The first field on which a checkpoint's configs and the given ones differ, as ``section.field: a != b``."""
    pairs = [("model", ckpt.model_config.to_dict(), model_cfg.to_dict()),
             ("task", ckpt.task_config.to_dict(), task.to_dict()),
             ("train", TrainConfig.from_dict(ckpt.train_config).to_dict(), cfg.to_dict())]
    for section, old, new in pairs:
        if section == "train":
            old_s, new_s = old.pop("schedule"), new.pop("schedule")
            pairs.append(("schedule", old_s, new_s))
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                return f"{section}.{key} is {old.get(key)!r} in the checkpoint but {new.get(key)!r} here"
    return None


def train(model_cfg: ModelConfig, task: TaskConfig, cfg: TrainConfig, out: str | Path,
          device: str | torch.device = "cpu", resume: bool = False, progress: bool = True) -> Checkpoint:
    """Train one run into ``out``. With ``resume``, continue from ``out/last.pt`` (which must exist)."""
    trainer = Trainer(model_cfg, task, cfg, out, device, progress)
    if resume:
        if not trainer.resume():
            raise ProbeError(f"--resume: {Path(out) / 'last.pt'} does not exist; drop --resume to start a fresh run")
    elif (Path(out) / "last.pt").exists():
        raise ProbeError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    return trainer.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m probe.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default=None, help=f"one of {', '.join(PRESETS)} (default hybrid-dat)")
    parser.add_argument("--task", default=None, help="modsum, recall, interleaved (default) or coupled")
    parser.add_argument("--steps", type=int, help="override the preset's number of steps")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a config field, e.g. --set model.d_model=64 --set schedule.switch=0.4 "
                             "--set schedule.kind=stopgrad --set train.precision=bf16")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its last.pt, with the configs recorded there (flags "
                             "given as well must agree with them)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_common_args(parser, json_flag=False)
    for action in parser._actions:  # the shared help says "nothing written if omitted", untrue for training
        if action.dest == "out":
            action.help = "run directory (default runs/run)"
    parser.set_defaults(out="runs/run", seed=None)

    def run(args: argparse.Namespace) -> dict[str, Any]:
        device = resolve_device(args.device)
        if args.resume:
            return _resume(args, device)
        model_cfg, task_cfg, train_cfg = build_configs(
            args.preset or "hybrid-dat", args.task or "interleaved", args.overrides, steps=args.steps,
            seed=0 if args.seed is None else args.seed)
        final = train(model_cfg, task_cfg, train_cfg, args.out, device, progress=not args.no_progress)
        print(json.dumps({"out": str(args.out), **final.metrics}), file=sys.stdout)
        return {}

    def _resume(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
        last = Path(args.out) / "last.pt"
        if not last.exists():
            raise ProbeError(f"--resume: {last} does not exist; drop --resume to start a fresh run")
        ckpt = load_checkpoint(last)
        model_cfg, task_cfg = ckpt.model_config, ckpt.task_config
        train_cfg = TrainConfig.from_dict(ckpt.train_config)
        recorded = {"model": model_cfg.to_dict(), "task": task_cfg.to_dict(), "train": train_cfg.to_dict()}
        recorded["schedule"] = recorded["train"].pop("schedule")
        given = [f"train.steps={args.steps}"] if args.steps is not None else []
        given += [f"train.seed={args.seed}"] if args.seed is not None else []
        for item in given + args.overrides:  # flags given with --resume must agree with what last.pt recorded
            key, _, raw = item.partition("=")
            section, _, name = key.partition(".")
            if section in recorded and name in recorded[section] and recorded[section][name] != _parse_value(raw):
                raise ProbeError(f"{last}: cannot resume with --set {item}: {key} is "
                                 f"{recorded[section][name]!r} in the checkpoint")
        if args.task and args.task != task_cfg.name:
            raise ProbeError(f"{last}: cannot resume with --task {args.task}: the run's task is {task_cfg.name}")
        if args.preset and args.preset != _preset_of(ckpt):
            raise ProbeError(f"{last}: cannot resume with --preset {args.preset}: the run is {_preset_of(ckpt)}")
        final = train(model_cfg, task_cfg, train_cfg, args.out, device, resume=True, progress=not args.no_progress)
        print(json.dumps({"out": str(args.out), **final.metrics}), file=sys.stdout)
        return {}

    return run_cli(parser, run, argv, emits_json=False)


def _preset_of(ckpt: Checkpoint) -> str:
    """The preset a checkpoint's model and schedule most likely came from (for comparing --resume flags)."""
    label = ckpt.label
    if label in PRESETS:
        return label
    return "hybrid-joint" if ckpt.model_config.family == "hybrid" else ckpt.model_config.family

if __name__ == "__main__":
    sys.exit(main())
