"""Attention-gradient interference: how much of the LSTM weights' gradient arrives through attention, and whether
it pulls against the update that would improve state tracking.

Usage: ``python -m probe.gradients ckpt.pt`` (one checkpoint), ``python -m probe.gradients runs/hybrid-joint/seed0/
trajectory runs/hybrid-dat/seed0/trajectory`` (trajectories: curves over training), or a glob.

Method. For one batch of the checkpoint's task at a fixed length, with the loss ``L`` (mean cross-entropy over the
labelled positions, exactly the training loss) and ``theta_i`` the four tensors of block i's LSTM
(``weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0``):

- ``g = dL/dtheta`` (full gradient);
- ``g_rec``: the same gradient with every attention sublayer's inputs detached. Attention reads the residual stream
  only through q, k and v, so forward hooks on ``blocks.{i}.attn.hook_q/k/v`` that return ``x.detach()`` cut every
  path that passes through an attention sublayer and change no forward value. ``g_rec`` is the gradient along the
  paths that never pass through attention (the recurrence, the MLPs, the residual stream);
- ``g_att = g - g_rec``: the part that reaches the LSTM through attention (through at least one attention sublayer).

The loss is split exactly, ``L = L_state + L_recall`` with ``L_s = sum_{positions of s} CE / N`` (N = all labelled
positions; an answer that belongs to both subtasks, as in the ``coupled`` task, counts as a state answer), so that
``g_att = g_att^state + g_att^recall`` and ``g_rec = g_rec^state + g_rec^recall`` hold exactly. Reported per block
and over all blocks: ``att_ratio = |g_att| / |g|``, ``cos(g_att, g_rec)``, ``cos(g_att, g_rec^state)`` (negative:
attention's gradient points against the recurrent-path update of the state loss) and the split of ``g_att``.

The attention gate used is the one the training schedule applies at the checkpoint's step (the step the next update
would take; a trajectory snapshot stores the gate of the step before it), unless ``--stored-gate``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from probe.checkpoint import Checkpoint, load_checkpoint, resolve_checkpoints
from probe.cli import add_common_args, envelope, resolve_device, run_cli, say
from probe.errors import ProbeError
from probe.models import HookedSequenceModel, ModelConfig
from probe.schedules import Schedule, ScheduleConfig
from probe.tasks import IGNORE_INDEX, Batch, TaskConfig

LSTM_PARAMS = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
ATTENTION_INPUTS = ("attn.hook_q", "attn.hook_k", "attn.hook_v")
RESIDUAL_TOL = 1e-5
GRAD_SEED_BASE = 8_000_000_000
"""Analysis batches come from seeds far from training (``seed * 1_000_003 + step``) and evaluation seeds."""


# --- the decomposition ------------------------------------------------------------------------------------------
def _is_attention_input(name: str) -> bool:
    return name.endswith(ATTENTION_INPUTS)


def _detach(x: Tensor, hook: Any) -> Tensor:
    return x.detach()


@contextlib.contextmanager
def attention_inputs_detached(model: HookedSequenceModel) -> Iterator[None]:
    """Within the block, every attention sublayer's q, k and v are detached: same forward values, no gradient
    through attention. The hooks are removed on exit, also on an exception."""
    with model.hooks(fwd_hooks=[(_is_attention_input, _detach)]):
        yield


@contextlib.contextmanager
def attention_gates(model: HookedSequenceModel, value: float | Sequence[float] | None) -> Iterator[None]:
    """Within the block the gates are ``value`` (None: unchanged); the previous gates come back on exit."""
    before = model.attention_gates()
    if value is not None and before:
        model.set_attention_gate(value)
    try:
        yield
    finally:
        if before:
            model.set_attention_gate(before)


def lstm_parameters(model: HookedSequenceModel) -> list[list[torch.nn.Parameter]]:
    """theta: per block with an LSTM, its four LSTM tensors."""
    return [[getattr(layer.rnn, n) for n in LSTM_PARAMS] for layer in model.lstm_layers]


def split_losses(logits: Tensor, batch: Batch) -> dict[str, Tensor]:
    """``state`` and ``recall`` parts that sum exactly to the training loss (mean CE over labelled positions)."""
    ce = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX,
                         reduction="none").view_as(batch.labels)
    asked = batch.answer_mask
    n = asked.sum().clamp(min=1)
    state = batch.masks["state"] & asked
    recall = batch.masks["recall"] & asked & ~state
    other = asked & ~state & ~recall  # none in probe's tasks; kept so the parts always sum to the loss
    return {"state": (ce * state).sum() / n, "recall": (ce * recall).sum() / n + (ce * other).sum() / n}


def _grads(loss: Tensor, params: list[torch.nn.Parameter], retain: bool) -> Tensor:
    gs = torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(gs, params, strict=True)])


@dataclass
class Decomposition:
    """Flattened per-block gradients of one batch. Keys of each dict: ``state``, ``recall`` (loss parts)."""

    g: list[dict[str, Tensor]]
    g_rec: list[dict[str, Tensor]]
    g_ref: list[Tensor]
    losses: dict[str, float]
    counts: dict[str, int]
    forward_diff: float

    @property
    def n_blocks(self) -> int:
        return len(self.g)

    def vectors(self, block: int | None) -> dict[str, Tensor]:
        """``g, g_rec, g_att`` and their ``_state`` / ``_recall`` parts, plus ``g_ref``, for one block (None: all)."""
        idx = range(self.n_blocks) if block is None else [block]

        def cat(parts: list[Tensor]) -> Tensor:
            return torch.cat([parts[i] for i in idx])

        out: dict[str, Tensor] = {"g_ref": cat(self.g_ref)}
        for s in ("state", "recall"):
            out[f"g_{s}"] = cat([d[s] for d in self.g])
            out[f"g_rec_{s}"] = cat([d[s] for d in self.g_rec])
            out[f"g_att_{s}"] = out[f"g_{s}"] - out[f"g_rec_{s}"]
        for name in ("g", "g_rec", "g_att"):
            out[name] = out[f"{name}_state"] + out[f"{name}_recall"]
        return out

    def table(self) -> pd.DataFrame:
        """One row per block and one with ``block="all"``; columns documented in the CLI's --help."""
        rows = []
        for block in [*range(self.n_blocks), None]:
            v = self.vectors(block)
            norm = {k: float(t.norm()) for k, t in v.items()}
            rows.append({
                "block": "all" if block is None else block,
                "g_norm": norm["g"], "g_rec_norm": norm["g_rec"], "g_att_norm": norm["g_att"],
                "att_ratio": _ratio(norm["g_att"], norm["g"]),
                "cos_att_rec": cosine(v["g_att"], v["g_rec"]),
                "cos_att_rec_state": cosine(v["g_att"], v["g_rec_state"]),
                "cos_att_state_rec_state": cosine(v["g_att_state"], v["g_rec_state"]),
                "cos_att_recall_rec_state": cosine(v["g_att_recall"], v["g_rec_state"]),
                "g_att_state_norm": norm["g_att_state"], "g_att_recall_norm": norm["g_att_recall"],
                "residual": _ratio(float((v["g_att"] + v["g_rec"] - v["g_ref"]).norm()), norm["g_ref"]),
                "loss": self.losses["all"], "loss_state": self.losses["state"], "loss_recall": self.losses["recall"],
                "n_state": self.counts["state"], "n_recall": self.counts["recall"],
                "forward_diff": self.forward_diff,
            })
        return pd.DataFrame(rows)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def cosine(a: Tensor, b: Tensor) -> float:
    """Cosine similarity; NaN when either vector is exactly zero (no direction to compare)."""
    na, nb = float(a.norm()), float(b.norm())
    if na == 0 or nb == 0:
        return math.nan
    return float(a @ b) / (na * nb)


def decompose(model: HookedSequenceModel, batch: Batch) -> Decomposition:
    """``g``, ``g_rec`` (per loss part) and the reference gradient of the model's own loss, for every block."""
    theta = lstm_parameters(model)
    if not theta:
        raise ProbeError("this model has no LSTM sublayer, so there are no LSTM weights whose gradient could be "
                         "split (a transformer); run the analysis on a hybrid or lstm checkpoint")
    flat = [p for ps in theta for p in ps]
    sizes = [sum(p.numel() for p in ps) for ps in theta]

    def per_block(v: Tensor) -> list[Tensor]:
        return list(v.split(sizes))

    with torch.enable_grad():
        parts = split_losses(model(batch.tokens), batch)
        g = {s: per_block(_grads(parts[s], flat, retain=s == "state")) for s in ("state", "recall")}
        with attention_inputs_detached(model):
            logits_rec = model(batch.tokens)
        parts_rec = split_losses(logits_rec, batch)
        g_rec = {s: per_block(_grads(parts_rec[s], flat, retain=s == "state")) for s in ("state", "recall")}
        # The reference: the training loss as the model computes it, in a forward pass of its own.
        ref_loss = model(batch.tokens, labels=batch.labels)
        g_ref = per_block(_grads(ref_loss, flat, retain=False))
    full = (parts["state"] + parts["recall"]).item()
    asked = batch.answer_mask
    state = batch.masks["state"] & asked
    return Decomposition(
        g=[{s: g[s][i] for s in g} for i in range(len(theta))],
        g_rec=[{s: g_rec[s][i] for s in g_rec} for i in range(len(theta))],
        g_ref=g_ref,
        losses={"all": full, "state": parts["state"].item(), "recall": parts["recall"].item()},
        counts={"state": int(state.sum()), "recall": int((asked & ~state).sum())},
        forward_diff=abs((parts_rec["state"] + parts_rec["recall"]).item() - full),
    )


def interference(model: HookedSequenceModel, batch: Batch) -> pd.DataFrame:
    """The interference table of one model on one batch (see ``Decomposition.table``)."""
    return decompose(model, batch).table()


# --- checkpoints and trajectories -------------------------------------------------------------------------------
def schedule_gate(ckpt: Checkpoint) -> float | None:
    """The gate the checkpoint's schedule applies at its step (None when the checkpoint records no schedule)."""
    sched = ckpt.train_config.get("schedule")
    if not sched or not ckpt.model_config.has_attention:
        return None
    try:
        cfg = ScheduleConfig(**sched)
    except TypeError:
        return None
    switched = (ckpt.extra.get("schedule_state") or {}).get("switched_at")
    return Schedule(cfg, int(ckpt.train_config.get("steps", 0)), switched_at=switched).gate(ckpt.step)


def analysis_batch(task: TaskConfig, length: int, batch_size: int, seed: int,
                   device: torch.device | str = "cpu") -> Batch:
    """The batch every checkpoint of an analysis sees at ``length`` (the same across a trajectory)."""
    return task.sample(length, batch_size, GRAD_SEED_BASE + seed * 1_000_000 + length).to(device)


def default_lengths(task: TaskConfig) -> list[int]:
    return [task.train_length, 3 * task.train_length]


def checkpoint_meta(ckpt: Checkpoint) -> dict[str, Any]:
    path = ckpt.path
    run = str(path.parent.parent if path is not None and path.parent.name == "trajectory" else
              (path.parent if path is not None else "<memory>"))
    return {"checkpoint": str(path) if path is not None else ckpt.name, "run": run,
            "schedule": ckpt.schedule or "none", "seed": ckpt.seed, "step": ckpt.step,
            "family": ckpt.model_config.family}


def check_family(ckpt: Checkpoint | ModelConfig, name: str) -> None:
    cfg = ckpt.model_config if isinstance(ckpt, Checkpoint) else ckpt
    if not cfg.has_lstm:
        raise ProbeError(f"{name}: a {cfg.family} checkpoint has no LSTM, so there is no LSTM-weight gradient to "
                         "split into attention and recurrent paths; run it on a hybrid or lstm checkpoint")


@dataclass
class GradientReport:
    """Everything one invocation measured: tidy frames plus control rows."""

    interference: pd.DataFrame
    attributions: pd.DataFrame = field(default_factory=pd.DataFrame)
    distance: pd.DataFrame = field(default_factory=pd.DataFrame)
    far: pd.DataFrame = field(default_factory=pd.DataFrame)
    controls: list[dict[str, Any]] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        frames = [(self.interference, "interference"), (self.attributions, "attribution"),
                  (self.distance, "distance"), (self.far, "far_share")]
        out: list[dict[str, Any]] = []
        for df, kind in frames:
            if not df.empty:
                out.extend({"analysis": kind, **r} for r in df.to_dict("records"))
        return out


def gate0_control(model: HookedSequenceModel, batch: Batch) -> float:
    """|g_att| / |g| with every gate at 0: the model is then the LSTM model, so it must be exactly 0."""
    if not model.attention_blocks:
        return 0.0
    with attention_gates(model, 0.0):
        v = decompose(model, batch).vectors(None)
    return float(v["g_att"].norm())


def analyze_checkpoint(ckpt: Checkpoint, lengths: Sequence[int] | None = None, batch_size: int = 64, seed: int = 0,
                       device: torch.device | str = "cpu", attr: str = "none", attr_batch: int = 16,
                       ig_steps: int = 32, far: int | None = None, stored_gate: bool = False,
                       targets: int | None = 16) -> GradientReport:
    """Interference at each length (and attributions with ``attr`` = ``gxa`` or ``ig``) for one checkpoint.
    ``targets`` bounds the answer positions the distance analysis explains (evenly spaced; None = all)."""
    from probe import attributions as A

    check_family(ckpt, ckpt.name)
    meta = checkpoint_meta(ckpt)
    model = ckpt.build_model(device)
    gate = None if stored_gate else schedule_gate(ckpt)
    lengths = list(lengths or default_lengths(ckpt.task_config))
    frames, attr_frames, dist_frames, far_frames, controls = [], [], [], [], []
    with attention_gates(model, gate):
        gates = model.attention_gates()
        meta_g = {**meta, "gate": gates[0] if gates else 0.0}
        for length in lengths:
            batch = analysis_batch(ckpt.task_config, length, batch_size, seed, device)
            frames.append(interference(model, batch).assign(**meta_g, length=length))
            if attr != "none":
                sub = analysis_batch(ckpt.task_config, length, min(attr_batch, batch_size), seed, device)
                comp = A.component_attribution(model, sub, method=attr, n_steps=ig_steps)
                attr_frames.append(comp.assign(**meta_g, length=length))
                dist = A.distance_attribution(model, sub, method=attr, n_steps=ig_steps, max_targets=targets)
                k = far if far is not None else max(1, ckpt.task_config.train_length // 3)
                dist_frames.append(dist.profile().assign(**meta_g, length=length))
                far_frames.append(dist.far_share(k).assign(**meta_g, length=length))
                if attr == "ig":
                    controls.extend(A.ig_delta_controls(comp, dist, meta["checkpoint"], length))
        table = pd.concat(frames, ignore_index=True)
        total = table[table.block == "all"]
        controls.append(_control(meta["checkpoint"], "decomposition_residual", float(table.residual.max()),
                                 RESIDUAL_TOL, "max |g_att + g_rec - g_train| / |g_train| over lengths and blocks"))
        controls.append(_control(meta["checkpoint"], "detach_forward_diff", float(total.forward_diff.max()), 0.0,
                                 "|L with attention inputs detached - L|: detaching changes no forward value"))
        if model.attention_blocks:
            # exactness does not depend on the batch size, so the control uses a small batch
            first = analysis_batch(ckpt.task_config, lengths[0], min(batch_size, 16), seed, device)
            controls.append(_control(meta["checkpoint"], "gates_zero_g_att_norm", gate0_control(model, first), 0.0,
                                     "|g_att| with every attention gate at 0 (the LSTM model): exactly 0"))
    return GradientReport(table, _concat(attr_frames), _concat(dist_frames), _concat(far_frames), controls)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _control(checkpoint: str, name: str, value: float, threshold: float, what: str) -> dict[str, Any]:
    return {"checkpoint": checkpoint, "control": name, "value": value, "threshold": threshold,
            "passed": bool(value <= threshold), "what": what}


# --- controls that need no checkpoint ---------------------------------------------------------------------------
def attention_only_case(d_model: int = 8, length: int = 6, batch_size: int = 4, seed: int = 0,
                        ) -> tuple[HookedSequenceModel, Batch]:
    """A hand-built one-block hybrid where the only answer (at the last position) can reach the LSTM only
    through attention: the last token saturates the LSTM's output gate (pre-activation about -2000, so
    ``sigmoid`` is exactly 0 in float32 and so is its derivative), which makes the LSTM output at the answer's
    position exactly 0 with zero gradient; earlier positions are not labelled, and one block has no later LSTM.
    Hence ``g_rec = 0`` exactly and ``|g_att| / |g| = 1``."""
    gen = torch.Generator().manual_seed(seed)
    vocab = 6
    marker = vocab - 1
    model = HookedSequenceModel(ModelConfig(family="hybrid", vocab_size=vocab, d_model=d_model, n_layers=1,
                                            n_heads=2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        for ln in (model.blocks[0].ln_lstm, model.blocks[0].ln_attn, model.blocks[0].ln_mlp, model.ln_final):
            ln.weight.fill_(1.0)
            ln.bias.zero_()
        emb = torch.randn(vocab, d_model, generator=gen)
        emb[:, 0] = -5.0  # ordinary tokens: coordinate 0 far below the rest, so LN gives it a value near -2.3
        emb[marker] = 0.0
        emb[marker, 0] = 10.0  # the marker: coordinate 0 far above the rest (LN value about +2.6)
        model.embed.weight.copy_(emb)
        rnn = model.blocks[0].lstm.rnn
        o = slice(3 * d_model, 4 * d_model)  # PyTorch's gate order: input, forget, cell, output
        rnn.weight_ih_l0[o] = 0.0
        rnn.weight_ih_l0[o, 0] = -1000.0
        rnn.weight_hh_l0[o] = 0.0
        rnn.bias_ih_l0[o] = 0.0
        rnn.bias_hh_l0[o] = 0.0
    tokens = torch.randint(marker, (batch_size, length), generator=gen)
    tokens[:, -1] = marker
    labels = torch.full_like(tokens, IGNORE_INDEX)
    labels[:, -1] = torch.randint(vocab, (batch_size,), generator=gen)
    state = labels != IGNORE_INDEX
    batch = Batch(tokens=tokens, labels=labels, masks={"state": state, "recall": torch.zeros_like(state)},
                  sums=torch.zeros_like(tokens), prefix_len=0, length=length)
    return model.eval(), batch


def builtin_controls() -> list[dict[str, Any]]:
    """The two model-independent controls: the hand-built attention-only case and an LSTM model."""
    model, batch = attention_only_case()
    row = interference(model, batch).query("block == 'all'").iloc[0]
    out = [_control("<hand-built>", "attention_only_ratio_error", abs(float(row.att_ratio) - 1.0), RESIDUAL_TOL,
                    "| |g_att|/|g| - 1 | where the answer can only come through attention")]
    torch.manual_seed(0)
    lstm = HookedSequenceModel(ModelConfig(family="lstm", vocab_size=batch.tokens.max().item() + 1, d_model=8,
                                           n_layers=2)).eval()
    lrow = interference(lstm, batch).query("block == 'all'").iloc[0]
    out.append(_control("<lstm model>", "lstm_g_att_norm", float(lrow.g_att_norm), 0.0,
                        "|g_att| of a model without attention: exactly 0"))
    return out


def analyze(paths: Sequence[str | Path], lengths: Sequence[int] | None = None, batch_size: int = 64, seed: int = 0,
            device: torch.device | str = "cpu", attr: str = "auto", attr_batch: int = 16, ig_steps: int = 32,
            far: int | None = None, stored_gate: bool = False, targets: int | None = 16,
            progress: bool = False) -> GradientReport:
    """Every checkpoint in ``paths`` (files, trajectory directories, globs); ``attr="auto"`` attributes a single
    checkpoint with gradient x activation and skips attributions over trajectories."""
    files = resolve_checkpoints([str(p) for p in paths])
    ckpts = [load_checkpoint(p) for p in files]  # validate every file before spending time on any
    for c in ckpts:
        check_family(c, str(c.path))
    if attr == "auto":
        attr = "gxa" if len(ckpts) == 1 else "none"
    if attr not in ("none", "gxa", "ig"):
        raise ProbeError(f"unknown attribution method {attr!r}; choose auto, none, gxa or ig")
    it: Any = ckpts
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(ckpts, desc="checkpoints", file=sys.stderr, leave=False)
    reports = [analyze_checkpoint(c, lengths, batch_size, seed, device, attr, attr_batch, ig_steps, far, stored_gate,
                                  targets) for c in it]
    return GradientReport(
        interference=_concat([r.interference for r in reports]),
        attributions=_concat([r.attributions for r in reports]),
        distance=_concat([r.distance for r in reports]),
        far=_concat([r.far for r in reports]),
        controls=[c for r in reports for c in r.controls] + builtin_controls(),
    )


# --- plots ------------------------------------------------------------------------------------------------------
def _sns():
    import matplotlib

    matplotlib.use(matplotlib.get_backend())
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return sns


def plot_over_training(table: pd.DataFrame, block: str | int = "all"):
    """Interference over training: ``|g_att|/|g|``, ``cos(g_att, g_rec^state)`` and ``cos(g_att^recall,
    g_rec^state)`` against the step, one line per schedule on shared axes (the band is the spread over seeds when
    there are several), one column per length; dashed: where a schedule switches attention on."""
    import matplotlib.pyplot as plt

    sns = _sns()
    df = table[table.block.astype(str) == str(block)].reset_index(drop=True)
    lengths = sorted(df.length.unique())
    metrics = [("att_ratio", "|g_att| / |g|"), ("cos_att_rec_state", "cos(g_att, g_rec^state)"),
               ("cos_att_recall_rec_state", "cos(g_att^recall, g_rec^state)")]
    fig, axes = plt.subplots(len(metrics), len(lengths), figsize=(max(7.0, 5.5 * len(lengths)), 9), squeeze=False,
                             sharex=True)
    order = sorted(df.schedule.unique())
    for j, length in enumerate(lengths):
        sub = df[df.length == length]
        for i, (col, label) in enumerate(metrics):
            ax = axes[i, j]
            sns.lineplot(data=sub, x="step", y=col, hue="schedule", hue_order=order, marker="o", errorbar="sd",
                         ax=ax, legend=(i == 0 and j == 0))
            if col.startswith("cos"):
                ax.axhline(0.0, color="0.3", lw=0.8)
                ax.set_ylim(-1.05, 1.05)
            for _, s in sub.groupby("schedule"):
                on = s[s.gate > 0].step
                if len(on) and (s.gate == 0).any():
                    ax.axvline(on.min(), color="0.5", ls="--", lw=0.8)
            ax.set_xlabel("training step")
            ax.set_ylabel(label)
            if i == 0:
                ax.set_title(f"length {length}")
    seeds = df.groupby("schedule")["seed"].nunique().to_dict()
    fig.suptitle(f"LSTM-weight gradient through attention (block {block}; seeds per schedule: "
                 + ", ".join(f"{k} {v}" for k, v in seeds.items()) + ")")
    fig.tight_layout()
    return fig


def plot_blocks(table: pd.DataFrame):
    """Per-block bars: ``|g_att|/|g|`` and the two cosines, hue = length; one row per run (its last checkpoint)."""
    import matplotlib.pyplot as plt

    sns = _sns()
    last = table.loc[table.groupby("run").step.transform("max") == table.step]
    ckpts = list(dict.fromkeys(last.checkpoint))
    metrics = [("att_ratio", "|g_att| / |g|"), ("cos_att_rec", "cos(g_att, g_rec)"),
               ("cos_att_rec_state", "cos(g_att, g_rec^state)")]
    fig, axes = plt.subplots(len(ckpts), len(metrics), figsize=(15, 3.8 * len(ckpts)), squeeze=False)
    for i, ck in enumerate(ckpts):
        df = last[last.checkpoint == ck].reset_index(drop=True)
        df = df.assign(block=df.block.astype(str), length=df.length.astype(str))
        for ax, (col, label) in zip(axes[i], metrics, strict=True):
            sns.barplot(data=df, x="block", y=col, hue="length", ax=ax, errorbar=None)
            ax.set_ylabel(label)
            ax.set_xlabel("block")
            if col.startswith("cos"):
                ax.axhline(0.0, color="0.3", lw=0.8)
                ax.set_ylim(-1, 1)
            else:
                ax.set_ylim(0, 1)
        run = "/".join(str(df.run.iloc[0]).split("/")[-2:])
        axes[i, 0].set_title(f"{run} ({Path(ck).name}, step {int(df.step.iloc[0])}, gate {df.gate.iloc[0]:g})",
                             loc="left")
    fig.tight_layout()
    return fig


# --- CLI --------------------------------------------------------------------------------------------------------
HELP_COLUMNS = """\
JSON rows (--json): every row has "analysis", "checkpoint", "run", "schedule", "seed", "step", "family", "gate",
"length".
  analysis "interference" (one per checkpoint, length and block; block "all" = every block together):
    block, g_norm, g_rec_norm, g_att_norm, att_ratio (=|g_att|/|g|), cos_att_rec, cos_att_rec_state,
    cos_att_state_rec_state, cos_att_recall_rec_state, g_att_state_norm, g_att_recall_norm, residual,
    loss, loss_state, loss_recall, n_state, n_recall, forward_diff. Cosines are null where a vector is 0.
  analysis "attribution" (components; per subtask and method): subtask, method (gxa | ig), block, component
    (lstm | attn), hook, attribution (mean over sequences of the summed attribution to the correct-answer logit),
    share (|attribution| / sum over components), logit (mean correct-answer logit), ablation_effect and delta
    (ig only: logit minus logit with the component zeroed; mean |convergence delta|).
  analysis "distance" (state answers): method, path (recurrent | attention), distance (t - s, -1 = prefix),
    mass (mean share of the answer's absolute input attribution).
  analysis "far_share": method, k, path (recurrent | attention | total), share (mass from tokens > k back).
controls rows: checkpoint, control, value, threshold, passed, what."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m probe.gradients", description=__doc__.split("\n\n")[0],
        epilog=HELP_COLUMNS, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files, trajectory directories or globs")
    parser.add_argument("--batch", type=int, default=64, help="sequences per length (default 64)")
    parser.add_argument("--length", default=None,
                        help="stream lengths: 25,75 or START:STOP[:STEP] (default: the training length and 3x)")
    parser.add_argument("--attr", default="auto", choices=("auto", "none", "gxa", "ig"),
                        help="attributions: gxa (gradient x activation), ig (integrated gradients), none; auto = "
                             "gxa for one checkpoint, none for several")
    parser.add_argument("--attr-batch", type=int, default=16, help="sequences per length for attributions")
    parser.add_argument("--ig-steps", type=int, default=32, help="integration steps for --attr ig (default 32)")
    parser.add_argument("--targets", type=int, default=16,
                        help="answer positions per length explained by the distance analysis, evenly spaced "
                             "(default 16; 0 = all)")
    parser.add_argument("--far", type=int, default=None,
                        help="k for the far-token share (default: a third of the training length)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for torch (default 1: these small models run fastest on one; 0 = torch's "
                             "default)")
    parser.add_argument("--stored-gate", action="store_true",
                        help="use the gate stored in the checkpoint, not the schedule's gate at its step")
    add_common_args(parser)

    def body(args: argparse.Namespace) -> dict[str, Any]:
        from probe.evaluate import parse_lengths

        torch.manual_seed(args.seed)
        if args.threads > 0:
            torch.set_num_threads(args.threads)
        if args.batch < 1 or args.attr_batch < 1 or args.ig_steps < 1 or args.targets < 0:
            raise ProbeError("--batch, --attr-batch and --ig-steps must be positive, --targets non-negative")
        lengths = parse_lengths(args.length) if args.length else None
        report = analyze(args.checkpoints, lengths, args.batch, args.seed, resolve_device(args.device), args.attr,
                         args.attr_batch, args.ig_steps, args.far, args.stored_gate, args.targets or None,
                         progress=not args.json)
        result = envelope("gradients", sorted(report.interference.checkpoint.unique().tolist()), report.rows(),
                          report.controls)
        say(args, format_report(report))
        if args.out:
            write_outputs(report, result, Path(args.out))
            say(args, f"\nwrote figures and results.json to {args.out}")
        return result

    return run_cli(parser, body, argv)


def format_report(report: GradientReport) -> str:
    t = report.interference
    cols = ["step", "gate", "length", "block", "att_ratio", "cos_att_rec", "cos_att_rec_state", "g_norm"]
    lines = []
    for ckpt, df in t.groupby("checkpoint", sort=False):
        lines.append(f"\n{ckpt}  ({df.family.iloc[0]}, schedule {df.schedule.iloc[0]}, seed {df.seed.iloc[0]})")
        lines.append(df[cols].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        if df.family.iloc[0] == "lstm":
            lines.append("  lstm model: no attention sublayer, so g_att = 0 and g = g_rec by construction")
    if not report.attributions.empty:
        a = report.attributions
        lines.append("\nattribution of the correct-answer logit to each sublayer output (share of |attribution|):")
        piv = a.pivot_table(index=["checkpoint", "length", "subtask"], columns=["block", "component"],
                            values="share")
        lines.append(piv.to_string(float_format=lambda x: f"{x:.3f}"))
    if not report.far.empty:
        f = report.far
        lines.append(f"\nstate answers: share of input attribution from tokens more than k={f.k.iloc[0]} back:")
        piv = f.pivot_table(index=["checkpoint", "length"], columns="path", values="share")
        lines.append(piv.to_string(float_format=lambda x: f"{x:.3f}"))
    lines.append("\ncontrols (worst value over checkpoints; every row is in the JSON):")
    ctl = pd.DataFrame(report.controls)
    for name, g in ctl.groupby("control", sort=False):
        worst = g.loc[g.value.idxmax()]
        lines.append(f"  {'ok  ' if g.passed.all() else 'FAIL'} {name:<28} {worst.value:.3g} (<= {worst.threshold:g})"
                     f"  {int(g.passed.sum())}/{len(g)} passed  {worst.what}")
    return "\n".join(lines)


def write_outputs(report: GradientReport, result: dict[str, Any], out: Path) -> None:
    import matplotlib.pyplot as plt

    from probe import attributions as A

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    figs = {"blocks.png": plot_blocks(report.interference)}
    if report.interference.step.nunique() > 1:
        figs["interference_over_training.png"] = plot_over_training(report.interference)
    if not report.distance.empty:
        figs["attribution_distance.png"] = A.plot_distance(report.distance)
        figs["components.png"] = A.plot_components(report.attributions)
    for name, fig in figs.items():
        fig.savefig(out / name, dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
