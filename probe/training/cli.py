"""Train one run: ``python -m probe.train --preset NAME --seed S --out DIR`` (resumable)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import torch

from probe.checkpoint import Checkpoint, load_checkpoint
from probe.cli import add_common_args, make_parser, resolve_device, run_cli
from probe.core import interrupts
from probe.errors import ProbeError
from probe.external import FactoryModelConfig
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


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("python -m probe.train", __doc__ or "", EPILOG)
    parser.add_argument("--preset", default=None, help=f"one of {', '.join(PRESETS)} (default hybrid-dat)")
    parser.add_argument("--model", default=None, metavar="PACKAGE.MODULE:FACTORY",
                        help="train your own wrapped model: a callable returning (probe.wrap(...), task); the "
                             "checkpoint records the spec, and reading it calls the factory again")
    parser.add_argument("--task", default=None, help="modsum, recall, interleaved (default) or coupled")
    parser.add_argument("--steps", type=int, help="override the preset's number of steps")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a config field, e.g. --set model.d_model=64 --set schedule.switch=40%% "
                             "--set schedule.variant=stopgrad-rnn --set train.precision=auto")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its last.pt, with the configs recorded there (flags "
                             "given as well must agree with them)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_common_args(parser, json_flag=False, out_help="run directory (default runs/run)")
    parser.set_defaults(out="runs/run", seed=None)

    def run(args: argparse.Namespace) -> dict[str, Any]:
        check_out(args.out)
        device = resolve_device(args.device)
        if args.resume:
            return _resume(args, device)
        model_cfg, task_cfg, train_cfg = build_configs(
            args.preset or "hybrid-dat", args.task or "interleaved", args.overrides, steps=args.steps,
            seed=0 if args.seed is None else args.seed)
        if args.model:
            model_cfg, task_cfg = _factory_model(args)
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
        given = [f"train.steps={args.steps}"] if args.steps is not None else []
        given += [f"train.seed={args.seed}"] if args.seed is not None else []
        items = given + args.overrides
        # flags given with --resume must agree with what last.pt recorded; they are applied together, as a run's
        # overrides are, since an old spelling may need its neighbour (schedule.kind, then stopgrad_scope)
        diff = config_diff(ckpt, *override_configs(model_cfg, task_cfg, train_cfg, items)) if items else None
        if diff:
            field = diff.split(" is ")[0]
            culprit = next((i for i in items if i.startswith(field + "=") or i.startswith(field + "_")),
                           " --set ".join(items))
            raise ProbeError(f"{last}: cannot resume with --set {culprit}: {diff.split(' but ')[0]}")
        if args.task and args.task != task_cfg.name:
            raise ProbeError(f"{last}: cannot resume with --task {args.task}: the run's task is {task_cfg.name}")
        if args.preset and args.preset != _preset_of(ckpt):
            raise ProbeError(f"{last}: cannot resume with --preset {args.preset}: the run is {_preset_of(ckpt)}")
        final = train(model_cfg, task_cfg, train_cfg, args.out, device, resume=True, progress=not args.no_progress)
        print(json.dumps({"out": str(args.out), **final.metrics}), file=sys.stdout)
        return {}

    stopped: list[str] = []

    def run_stoppable(args: argparse.Namespace) -> dict[str, Any]:
        # SIGINT and SIGTERM stop training between two steps with last.pt written (Trainer.run); a second one
        # stops at once (last.pt is then the one written before, never a torn file)
        with interrupts.handling():
            try:
                return run(args)
            except KeyboardInterrupt as e:
                stopped.append(stop_line(args, sys.argv[1:] if argv is None else argv, str(e),
                                         interrupts.requested() or "SIGINT"))
                return {}

    rc = run_cli(parser, run_stoppable, argv, emits_json=False)
    if stopped:
        print(stopped[0], file=sys.stderr)
        return 130
    return rc


def stop_line(args: argparse.Namespace, argv: list[str], kept: str, signal: str) -> str:
    """One line after an interrupt: what the run folder keeps, and the command that continues from it."""
    out = Path(args.out)
    last, final = out / "last.pt", out / "final.pt"
    device = f" --device {shlex.quote(args.device)}" if args.device != "auto" else ""
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


def _factory_model(args: argparse.Namespace) -> tuple[FactoryModelConfig, TaskConfig]:
    """``--model package.module:factory``: the factory's model and task replace the preset's."""
    given = [o for o in args.overrides if o.startswith(("model.", "task."))]
    if given or args.task:
        raise ProbeError(f"--model {args.model}: the factory makes the model and names its task; drop "
                         f"{'--task' if args.task else '--set ' + given[0]} (change them in the factory)")
    try:
        return FactoryModelConfig.of(args.model)
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
