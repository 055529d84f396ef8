"""The reference trainer: the loop, resumable runs, checkpoints (with the state at their step) and trajectories."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from probe import hardware
from probe.checkpoint import Checkpoint, checkpoint_from_model, load_checkpoint, save_checkpoint
from probe.core import interrupts
from probe.core.chance import chance
from probe.core.lock import folder_lock
from probe.core.progress import progress_bar
from probe.errors import ProbeError
from probe.external import AnyModelConfig, build_any
from probe.models import ModelConfig
from probe.tasks import IGNORE_INDEX, Batch, TaskConfig
from probe.training.batches import train_batch_seed, training_batch
from probe.training.config import TrainConfig, lr_at
from probe.training.schedule import Schedule
from probe.training.state import KEY, state_at
from probe.windows import accuracy_at_length


class Trainer:
    """One run: model, optimizer, schedule; ``run()`` trains to ``cfg.steps`` writing checkpoints as it goes.

    The model is probe's own (a ``ModelConfig``) or a wrapped one (``probe.external``: a transformers hybrid or a
    ``package.module:factory``); the loop asks either for the same few things: its attention gates
    (``set_attention_gate``), ``attention_parameters``, ``recurrent_parameters`` and ``attention_detached``."""

    def __init__(self, model_cfg: AnyModelConfig, task: TaskConfig, cfg: TrainConfig, out: str | Path,
                 device: str | torch.device = "cpu", progress: bool = True) -> None:
        self.model_cfg, self.task, self.cfg = model_cfg, task, cfg
        self.out = Path(out)
        self.device = torch.device(device)
        self.progress = progress
        # every check that can refuse comes before the model is built, so a refusal costs nothing
        self.schedule = Schedule(cfg.schedule, cfg.steps, seed=cfg.seed)
        if cfg.compile:
            hardware.check_compile(self.device)
        self.precision_used, note = hardware.precision_used(cfg.precision, self.device)
        if self.precision_used == "bf16+fp32-recurrence" and not isinstance(model_cfg, ModelConfig):
            raise ProbeError(f"{model_cfg.name}: bf16 on this CPU needs the recurrence kept in fp32, which only "
                             "probe's own cells can do; train it with --set train.precision=fp32")
        if note and (progress or self.precision_used == "bf16+fp32-recurrence"):
            print(note, file=sys.stderr)
        if self.device.type == "cuda" and self.precision_used == "fp32":
            # fp32 means fp32: cuDNN (the LSTM) would otherwise run its matmuls in TF32 (10-bit mantissa)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        torch.manual_seed(cfg.seed)
        self.model = build_any(model_cfg, task).to(self.device)
        self.schedule.check_model(self.model)
        # before --resume loads later weights: the model is still as the seed built it
        self.schedule.remember_initial(self.model)
        # the recurrent sublayers then run with autocast off: the one kernel without an emulated bf16 version
        if isinstance(model_cfg, ModelConfig):
            self.model.set_fp32_recurrence(self.precision_used == "bf16+fp32-recurrence")
        self.optimizer = hardware.adamw(list(self.model.parameters()), cfg.optimizer_impl, self.device, lr=cfg.lr,
                                        weight_decay=cfg.weight_decay)
        # compile the forward only; hooks, gates and checkpoints keep working on self.model
        self.forward = torch.compile(self.model, dynamic=True) if cfg.compile else self.model
        self.step = 0
        self.metrics: dict[str, Any] = {}
        self.running: dict[str, float] = {}
        self._bar_eval: dict[str, str] = {}
        self.gradient_log: dict[str, Any] | None = None  # the last step's gradient policy's record, if any
        # [first step, precision, device] of each stretch of training: a run resumed on another machine records
        # where its arithmetic changed (hardware.trained_as reads it), instead of only what its last stretch ran as
        self.segments: list[list[Any]] = [[0, self.precision_used, hardware.device_name(self.device)]]
        # seconds trained before this stretch (a resumed run's time up to its checkpoint), so that the times it logs
        # and records count the whole run, not only what this process trained
        self.elapsed_before = 0.0
        self._clock: float | None = None  # perf_counter() when this stretch began

    # --- state --------------------------------------------------------------------------------------------
    def _apply_schedule(self, step: int) -> None:
        self.model.set_attention_gate(self.schedule.gate(step))
        trains = self.schedule.attention_trains(step)
        for p in self.model.attention_parameters():
            p.requires_grad_(trains)  # a parameter without a grad is skipped by AdamW: no update, no decay
        recurrent = self.schedule.recurrent_trains(step)
        for p in self.model.recurrent_parameters():
            p.requires_grad_(recurrent)

    def checkpoint(self, with_optimizer: bool = True) -> Checkpoint:
        """The run now; its ``extra`` records the state of the next step (``state.StepState``): the gate of each
        attention block, the learning rate and the batch's seed, which analyses read instead of rebuilding them."""
        state = state_at(self.schedule, self.cfg, self.step, len(self.model.attention_gates()))
        return checkpoint_from_model(
            self.model, self.task, model_config=self.model_cfg, train_config=self.cfg.to_dict(), step=self.step,
            optimizer_state=self.optimizer.state_dict() if with_optimizer else None,
            metrics=self.metrics, extra={"schedule_state": self.schedule.state_dict(resume=with_optimizer),
                                         "running": dict(self.running),
                                         "precision_used": self.precision_used, KEY: state.to_dict(),
                                         "device": hardware.device_name(self.device),
                                         "elapsed_s": self.elapsed_s(),
                                         # a stretch that has trained no step yet is not part of the record
                                         "segments": [list(x) for x in self.segments if x[0] < self.step]
                                         or [list(self.segments[0])]},
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
        before = ckpt.extra.get("precision_used")
        if before is not None and before != self.precision_used:
            print(f"note: {last} trained so far in {before}; this machine continues in {self.precision_used}",
                  file=sys.stderr)
        where = ckpt.extra.get("device")
        if where is not None and where != hardware.device_name(self.device):
            print(f"note: {last} trained so far on {where}; it continues on {hardware.device_name(self.device)}",
                  file=sys.stderr)
        self.segments = resumed_segments(ckpt, self.segments[0][1:])
        self.model.load_state_dict(ckpt.state_dict)
        self.schedule.load_state_dict(ckpt.extra.get("schedule_state", {}))
        self._apply_schedule(ckpt.step)
        self.optimizer.load_state_dict(ckpt.optimizer_state)
        self.step, self.metrics = ckpt.step, ckpt.metrics
        self.running = dict(ckpt.extra.get("running") or {})
        # a checkpoint from before the time was recorded: its log's restarted clock is summed per stretch instead
        self.elapsed_before = float(ckpt.extra.get("elapsed_s") or 0.0)
        log = self.out / "metrics.jsonl"
        if log.exists():  # drop what was logged after the checkpoint the run resumes from
            kept = [ln for ln in log.read_text().splitlines() if ln and json.loads(ln)["step"] <= self.step]
            log.write_text("".join(ln + "\n" for ln in kept))
        return True

    def elapsed_s(self) -> float:
        """Seconds of training in the whole run so far: the stretches before a resume and this one."""
        return self.elapsed_before + (0.0 if self._clock is None else time.perf_counter() - self._clock)

    # --- loop ---------------------------------------------------------------------------------------------
    def train_step(self, step: int) -> tuple[float, float]:
        """One optimizer step on the batch of ``step``; returns (loss, token accuracy on that batch)."""
        batch = training_batch(self.task, self.cfg.batch_size, train_batch_seed(self.cfg.seed, step)).to(self.device)
        self._apply_schedule(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.cfg, step)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        # the schedule decides how the gradient is taken (plainly, or with attention's backward path cut)
        policy = self.schedule.gradient_policy(step)
        logits, loss = policy.backward(self.model, lambda: self._loss(batch, step))
        self.gradient_log = policy.log
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        mask = batch.answer_mask
        acc = ((logits.detach().argmax(-1) == batch.labels) & mask).sum() / mask.sum()
        return loss.item(), acc.item()

    def _loss(self, batch: Batch, step: int) -> tuple[Tensor, Tensor]:
        """(logits in fp32, loss) of ``batch``; a non-finite loss stops the run."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision_used != "fp32"):
            logits = self.forward(batch.tokens)
        logits = logits.float()
        loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
        if not torch.isfinite(loss):
            raise ProbeError(
                f"non-finite loss ({loss.item()}) at step {step}; stopped, last good checkpoint kept at "
                f"{self.out / 'last.pt'} (try a lower train.lr)"
            )
        return logits, loss

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
        """AdamW's second moments of every recurrent cell's own weights (any cell; the LayerNorm before it is not
        part of the cell) in bfloat16 (fp16 underflows on squared gradients), and what it takes to precondition a
        gradient as the next update would: ``-lr * g / (sqrt(v / (1 - beta2**t)) + eps)``. Empty before the first
        step. Trajectory snapshots carry it (as ``extra["lstm_adam"]``, the slot's name) for the lookahead
        interference analysis, which preconditions the same parameters."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        group = self.optimizer.param_groups[0]
        moments: dict[str, torch.Tensor] = {}
        step = 0
        for p in (p for layer in self.model.lstm_layers for p in layer.parameters()):
            state = self.optimizer.state.get(p, {})
            if "exp_avg_sq" in state:
                moments[names[id(p)]] = state["exp_avg_sq"].detach().to("cpu", torch.bfloat16)
                step = max(step, int(state["step"]))
        if not moments:
            return {}
        return {"exp_avg_sq": moments, "step": step, "beta1": float(group["betas"][0]),
                "beta2": float(group["betas"][1]), "eps": float(group["eps"]), "lr": float(group["lr"])}

    def _snapshot(self) -> None:
        # with train.traj_optimizer a snapshot is a state to resume from, as last.pt is (optimizer and schedule state)
        ckpt = self.checkpoint(with_optimizer=self.cfg.traj_optimizer)
        dtype = getattr(torch, self.cfg.traj_dtype)
        ckpt.state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in ckpt.state_dict.items()}
        adam = self.lstm_adam_state()
        if adam:
            ckpt.extra["lstm_adam"] = adam
        save_checkpoint(self.out / "trajectory" / f"step_{self.step:06d}.pt", ckpt)

    def run(self, until: int | None = None) -> Checkpoint:
        """Train to ``cfg.steps``, or stop after step ``until`` of the same run (the learning-rate and attention
        schedules still span ``cfg.steps``, so the first ``until`` steps are exactly the full run's): then
        ``last.pt`` holds the state for ``--resume`` and no ``final.pt`` is written.

        A stop asked by SIGINT or SIGTERM (``probe.core.interrupts``, where the caller handles them) is taken between
        two steps: ``last.pt`` is written for that step, whatever ``ckpt_every`` is, and ``Interrupted`` says so."""
        stop = self.cfg.steps if until is None else min(until, self.cfg.steps)
        if stop < 0:
            raise ProbeError(f"until={until}: a run cannot stop before step 0")
        torch.set_num_threads(self.cfg.threads)
        self.out.mkdir(parents=True, exist_ok=True)
        if self.step == 0:
            warning = fit_warning(self.cfg, self.schedule)
            if warning:
                print(warning, file=sys.stderr)
        with interrupts.deferred():
            final = self._loop(stop)
        if self.step == self.cfg.steps:
            warning = chance_warning(self.metrics, self.task)
            if warning:
                print(f"{warning} ({self.out / 'final.pt'})", file=sys.stderr)
        return final

    def _loop(self, stop: int) -> Checkpoint:
        if self.step == 0:
            (self.out / "metrics.jsonl").unlink(missing_ok=True)
            self._snapshot()
        bar = progress_bar(stop, self.out.name, True, initial=self.step) if self.progress else None
        self.elapsed_before, self._clock = self.elapsed_s(), time.perf_counter()
        run_loss, run_acc = self.running.get("loss"), self.running.get("acc")
        saved = None  # the step last.pt holds, when this process wrote it
        while self.step < stop:
            if interrupts.requested():  # between two steps: nothing of a step is half done
                if saved != self.step:
                    save_checkpoint(self.out / "last.pt", self.checkpoint())
                if bar is not None:
                    bar.close()
                raise interrupts.stopped(f"{self.out / 'last.pt'} at step {self.step} of {self.cfg.steps}")
            loss, acc_batch = self.train_step(self.step)
            run_loss = loss if run_loss is None else 0.98 * run_loss + 0.02 * loss
            run_acc = acc_batch if run_acc is None else 0.98 * run_acc + 0.02 * acc_batch
            self.running = {"loss": run_loss, "acc": run_acc}
            if bar is not None and self.step % 10 == 0:
                bar.set_postfix(loss=f"{run_loss:.3f}", acc=f"{run_acc:.3f}", **self._bar_eval)
            self.step += 1
            if self.gradient_log:  # per step, as "step" counts in every record: the update that made it self.step
                self._log({"step": self.step, **self.gradient_log})
            if self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps:
                acc = self.evaluate()
                switched = self.schedule.observe(self.step, acc["state_acc_1x"])
                self.metrics = {"step": self.step, "loss": run_loss, "gate": self.schedule.gate(self.step),
                                "elapsed_s": self.elapsed_s(), **acc}
                self._log(self.metrics | ({"event": "attention switched on"} if switched else {}))
                self._bar_eval = {"state3x": f"{acc['state_acc_3x']:.3f}", "recall3x": f"{acc['recall_acc_3x']:.3f}"}
            if self.step % self.cfg.traj_every == 0:
                self._snapshot()
            if self.step % self.cfg.ckpt_every == 0 or self.step in (self.cfg.steps, stop):
                save_checkpoint(self.out / "last.pt", self.checkpoint())
                saved = self.step
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        final = self.checkpoint(with_optimizer=False)
        if self.step == self.cfg.steps:
            save_checkpoint(self.out / "final.pt", final)
        return final


WARMUP_SHARE = 1 / 3
"""A warm-up this share of the run or longer leaves too few steps at full learning rate to fit the task."""

NEAR_CHANCE = 0.1
"""A final in-range accuracy less than this share of the way from chance to 100 % is "near chance"."""


def fit_warning(cfg: TrainConfig, schedule: Schedule) -> str | None:
    """One line when the settings cannot fit in the steps given: a warm-up of a third of the run or more (a preset's
    200 steps in a 300-step run), or attention switched on before the warm-up ends. None when they can."""
    problems = []
    if cfg.warmup >= WARMUP_SHARE * cfg.steps:
        problems.append(f"the warm-up (train.warmup={cfg.warmup}) takes {cfg.warmup / cfg.steps:.0%} of the "
                        f"{cfg.steps}-step run")
    s = cfg.schedule
    switches = (s.gate != "on" or s.attention_trains == "from-switch") and not s.adaptive
    if switches and 0 < schedule.switch_step < cfg.warmup:
        problems.append(f"attention switches on at step {schedule.switch_step}, before the warm-up ends (step "
                        f"{cfg.warmup})")
    if not problems:
        return None
    return (f"warning: {' and '.join(problems)}: the run may end near chance; shorten the warm-up (--set "
            f"train.warmup={max(1, cfg.steps // 10)}) or train longer")


def chance_warning(metrics: dict[str, Any], task: TaskConfig) -> str | None:
    """One line when a finished run's in-range accuracy (``{subtask}_acc_1x``) is near chance (``NEAR_CHANCE``) for
    any subtask: it has not learned that part of the task."""
    near = []
    for subtask in ("state", "recall"):
        acc = metrics.get(f"{subtask}_acc_1x")
        try:
            level = chance(task, subtask)
        except (AttributeError, ZeroDivisionError):  # a user's task without a label space probe can read
            continue
        if acc is not None and acc == acc and acc - level < NEAR_CHANCE * (1 - level):
            near.append(f"{subtask} {100 * acc:.1f} % (chance {100 * level:.1f} %)")
    if not near:
        return None
    return (f"warning: the run ends near chance in range: {', '.join(near)}; it has not learned "
            f"{'this part of ' if len(near) == 1 else ''}the task (train longer, or check the warm-up and the switch)")


def config_diff(ckpt: Checkpoint, model_cfg: AnyModelConfig, task: TaskConfig, cfg: TrainConfig) -> str | None:
    """The first field on which a checkpoint's configs and the given ones differ, as ``section.field: a != b``.
    Schedules are compared by the steps they act at, so a switch at 4/9 of 4500 steps matches one at step 2000."""
    old_train = TrainConfig.from_dict(ckpt.train_config).resolved().to_dict()
    new_train = cfg.resolved().to_dict()
    pairs = [("model", ckpt.model_config.to_dict(), model_cfg.to_dict()),
             ("task", ckpt.task_config.to_dict(), task.to_dict()),
             ("train", old_train, new_train),
             ("schedule", old_train.pop("schedule"), new_train.pop("schedule"))]
    for section, old, new in pairs:
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                return f"{section}.{key} is {old.get(key)!r} in the checkpoint but {new.get(key)!r} here"
    return None


def check_out(out: str | Path) -> None:
    """A run directory must be a directory or not exist yet."""
    out = Path(out)
    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            raise ProbeError(f"--out {out}: {'it' if path == out else path} is a file, not a directory; "
                             f"--out names a run directory")


def resumed_segments(ckpt: Checkpoint, now: list[Any]) -> list[list[Any]]:
    """The stretches of a run resumed from ``ckpt`` on a machine that trains as ``now`` ([precision, device]): the
    checkpoint's, with a new stretch from its step where the precision or the device differs from its last one.

    A checkpoint from before stretches were kept is one stretch, as its ``precision_used`` and ``device`` record it;
    what it does not record is taken to be this machine's (as its tables always took it), its literal precision
    first where the config names one."""
    recorded = ckpt.extra.get("segments")
    if recorded is None:
        literal = (ckpt.train_config or {}).get("precision")
        precision = ckpt.extra.get("precision_used") or (literal if literal not in (None, "auto") else now[0])
        recorded = [[0, precision, ckpt.extra.get("device") or now[1]]]
    segments = [list(x) for x in recorded]
    if segments[-1][0] >= ckpt.step:
        segments.pop()  # a stretch that trained no step (stopped before its first): this one takes its place
    if not segments or segments[-1][1:] != list(now):
        segments.append([ckpt.step, *now])
    return segments


def train(model_cfg: AnyModelConfig, task: TaskConfig, cfg: TrainConfig, out: str | Path,
          device: str | torch.device = "cpu", resume: bool = False, progress: bool = True,
          until: int | None = None) -> Checkpoint:
    """Train one run into ``out``. With ``resume``, continue from ``out/last.pt`` (which must exist); with
    ``until``, stop after that step of the run (``Trainer.run``)."""
    check_out(out)
    trainer = Trainer(model_cfg, task, cfg, out, device, progress)  # what it refuses, it refuses before any write
    # one writer per run folder: a second trainer (a rerun racing a stopped sweep's worker) is refused here
    with folder_lock(out, "train") as held:
        if held.took_over is not None:
            print(f"note: {out}: took over the lock of {held.took_over.describe()}, which ended without releasing "
                  "it", file=sys.stderr)
        remove_torn_files(out)
        if resume:
            if not trainer.resume():
                raise ProbeError(f"--resume: {Path(out) / 'last.pt'} does not exist; drop --resume to start a fresh "
                                 "run")
        elif (Path(out) / "last.pt").exists():
            raise ProbeError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
        if cfg.threads > len(_available_cpus()):
            print(f"note: train.threads={cfg.threads} but this process may use {len(_available_cpus())} CPU(s); "
                  f"the threads will share them", file=sys.stderr)
        return trainer.run(until)


def remove_torn_files(out: str | Path) -> list[Path]:
    """Delete the temporary files a killed writer left (``save_checkpoint`` writes ``.NAME.*.tmp`` and renames it
    over ``NAME``; a kill in between leaves the temporary file, never a torn checkpoint). Only its lock's holder
    may call this: another writer's temporary file would be in flight."""
    out = Path(out)
    torn = [p for d in (out, out / "trajectory") if d.is_dir() for p in d.glob(".*.tmp")]
    for p in torn:
        p.unlink(missing_ok=True)
    return torn


def _available_cpus() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not on Linux
        return set(range(os.cpu_count() or 1))
