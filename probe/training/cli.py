"""Train one run: ``python -m probe.train --preset NAME --seed S --out DIR`` (resumable)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

from probe.checkpoint import Checkpoint, load_checkpoint
from probe.cli import DEVICE_HELP, SEED_HELP, resolve_device
from probe.errors import ProbeError
from probe.external import FactoryModelConfig
from probe.runner import Command, CommandOptions, Report, option
from probe.tasks import TaskConfig
from probe.training.config import TrainConfig
from probe.training.overrides import build_configs, override_configs
from probe.training.presets import PRESETS
from probe.training.trainer import check_out, config_diff, train

EPILOG = """\
Example: python -m probe.train --preset hybrid-dat --seed 0 --out runs/hybrid-dat/seed0
Your own hybrid: python -m probe.train --model my_hybrid:factory --preset hybrid-dat --out runs/mine (the factory
returns a probe.wrap'ed model and its task; the preset gives the training and the schedule). The transformers
hybrids: --preset hf-recurrentgemma-dat (or hf-jamba-*, hf-falcon-h1-*; docs/your-own-hybrid.md).

A run directory holds last.pt (with optimizer state, for --resume), final.pt (weights only, what is shipped),
metrics.jsonl (one JSON object per evaluation) and trajectory/step_XXXXXX.pt snapshots. Configs, presets, the --set
grammar and the schedules: probe/training/; docs/guides/training.md.
Ctrl-C or SIGTERM stops at the next step with last.pt written (whatever train.ckpt_every is) and prints the command
that resumes; exit 130. One writer per run directory: a second trainer on it is refused (DIR/.lock names the owner).
A point in the run (schedule.switch, ramp_window, cut_until, min_switch): an integer is a step (2000), a percentage
or a number with a decimal point a fraction of the run (50%, 0.5; 1.0 is the whole run)."""


@dataclass
class TrainOptions(CommandOptions):
    """The command line of ``python -m probe.train``: the run's configs come from a preset and ``--set``; its
    threads and precision are training settings (``train.threads``, ``train.precision``), so there is no
    ``--threads`` here."""

    preset: str | None = option(None, f"one of {', '.join(PRESETS)} (default hybrid-dat)")
    model: str | None = option(None, "train your own wrapped model: a callable returning (probe.wrap(...), task); "
                                     "the checkpoint records the spec, and reading it calls the factory again",
                               metavar="PACKAGE.MODULE:FACTORY")
    task: str | None = option(None, "modsum, recall, interleaved (default) or coupled")
    steps: int | None = option(None, "override the preset's number of steps", type=int)
    overrides: list[str] = option([], "override a config field, e.g. --set model.d_model=64 --set "
                                      "schedule.switch=40%% --set schedule.variant=stopgrad-rnn --set "
                                      "train.precision=auto", flag="--set", action="append",
                                  metavar="SECTION.FIELD=VALUE")
    resume: bool = option(False, "continue the run in --out from its last.pt, with the configs recorded there "
                                 "(flags given as well must agree with them)")
    no_progress: bool = option(False, "no progress bar", order=7)
    out: str = option("runs/run", "run directory (default runs/run)", metavar="DIR", order=8)
    device: str = option("auto", DEVICE_HELP, order=8)
    seed: int | None = option(None, SEED_HELP, type=int, order=8)


def run(opts: TrainOptions) -> Report:
    """Train (or ``--resume``) the run in ``--out``; the report's text is one JSON line: the run's folder and its
    final metrics."""
    check_out(opts.out)
    device = resolve_device(opts.device)
    final = _resume(opts, device) if opts.resume else _start(opts, device)
    row = {"out": str(opts.out), **final.metrics}
    return Report([str(Path(opts.out) / "final.pt")], [row], text=json.dumps(row))


def _start(opts: TrainOptions, device: torch.device) -> Checkpoint:
    model_cfg, task_cfg, train_cfg = build_configs(
        opts.preset or "hybrid-dat", opts.task or "interleaved", opts.overrides, steps=opts.steps,
        seed=0 if opts.seed is None else opts.seed)
    if opts.model:
        model_cfg, task_cfg = _factory_model(opts)
    return train(model_cfg, task_cfg, train_cfg, opts.out, device, progress=opts.progress)


def _resume(opts: TrainOptions, device: torch.device) -> Checkpoint:
    last = Path(opts.out) / "last.pt"
    if not last.exists():
        raise ProbeError(f"--resume: {last} does not exist; drop --resume to start a fresh run")
    ckpt = load_checkpoint(last)
    model_cfg, task_cfg = ckpt.model_config, ckpt.task_config
    train_cfg = TrainConfig.from_dict(ckpt.train_config)
    given = [f"train.steps={opts.steps}"] if opts.steps is not None else []
    given += [f"train.seed={opts.seed}"] if opts.seed is not None else []
    items = given + opts.overrides
    # flags given with --resume must agree with what last.pt recorded; they are applied together, as a run's
    # overrides are, since an old spelling may need its neighbour (schedule.kind, then stopgrad_scope)
    diff = config_diff(ckpt, *override_configs(model_cfg, task_cfg, train_cfg, items)) if items else None
    if diff:
        field = diff.split(" is ")[0]
        culprit = next((i for i in items if i.startswith(field + "=") or i.startswith(field + "_")),
                       " --set ".join(items))
        raise ProbeError(f"{last}: cannot resume with --set {culprit}: {diff.split(' but ')[0]}")
    if opts.task and opts.task != task_cfg.name:
        raise ProbeError(f"{last}: cannot resume with --task {opts.task}: the run's task is {task_cfg.name}")
    if opts.preset and opts.preset != _preset_of(ckpt):
        raise ProbeError(f"{last}: cannot resume with --preset {opts.preset}: the run is {_preset_of(ckpt)}")
    return train(model_cfg, task_cfg, train_cfg, opts.out, device, resume=True, progress=opts.progress)


def stop_line(opts: TrainOptions, argv: list[str], kept: str, signal: str) -> str:
    """One line after an interrupt: what the run folder keeps, and the command that continues from it."""
    out = Path(opts.out)
    last, final = out / "last.pt", out / "final.pt"
    device = f" --device {shlex.quote(opts.device)}" if opts.device != "auto" else ""
    resume = f"resume with: python -m probe.train --resume --out {shlex.quote(str(out))}{device}"
    if final.exists():
        return f"interrupted ({signal}) as the run ended: {final} is written"
    if kept:
        return f"interrupted ({signal}): kept {kept}; {resume}"
    if last.exists():
        try:
            step = f"step {load_checkpoint(last).step}"
        except ProbeError as e:
            return f"interrupted ({signal}) at once: {e}"
        return f"interrupted ({signal}) at once: kept {last} at {step}, written before; {resume}"
    return f"interrupted ({signal}) before the first step: nothing kept; run again: python -m probe.train " \
           f"{shlex.join(argv)}"


def _factory_model(opts: TrainOptions) -> tuple[FactoryModelConfig, TaskConfig]:
    """``--model package.module:factory``: the factory's model and task replace the preset's."""
    given = [o for o in opts.overrides if o.startswith(("model.", "task."))]
    if given or opts.task:
        raise ProbeError(f"--model {opts.model}: the factory makes the model and names its task; drop "
                         f"{'--task' if opts.task else '--set ' + given[0]} (change them in the factory)")
    try:
        return FactoryModelConfig.of(opts.model)
    except ProbeError as e:
        raise ProbeError(f"--model {e}") from None


def _preset_of(ckpt: Checkpoint) -> str:
    """The preset a checkpoint's model and schedule most likely came from (for comparing --resume flags): the
    preset named like the run's variant, else the family's."""
    label = ckpt.label
    if label in PRESETS:
        return label
    family = ckpt.model_config.family
    if family != "hybrid":
        return family
    # a variant without a preset of its own (a cut, a frozen LSTM): the joint preset of the same cell
    cfg = ckpt.model_config
    rnn = getattr(cfg, "rnn", "lstm")
    cell = f"ssm-{cfg.ssm_range}" if rnn == "ssm" else rnn
    return "hybrid-joint" if rnn == "lstm" else f"hybrid-{cell}-joint"


COMMAND = Command("train", TrainOptions, run, __doc__ or "", EPILOG, results_file=False, stopped=stop_line)
main, build_parser = COMMAND.main, COMMAND.build_parser
