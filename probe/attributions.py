"""captum attributions of the correct answer to each block's LSTM and attention outputs, and to input positions
by distance and path (recurrent vs attention).

Everything is attributed at the model's ``HookPoint`` modules (``blocks.{i}.hook_lstm_out``,
``blocks.{i}.hook_attn_out``, ``hook_embed``), never at ``nn.LSTM``, whose tuple output captum cannot handle.
The explained quantity is ``AnswerLogit``: per sequence, the mean over the asked positions (of one subtask, or one
position for the distance analysis) of the logit of the correct answer.

Baselines. captum's layer methods take baselines in input space and run them through the model. The explained
function therefore takes a per-sequence scale ``s`` as its input, and a forward hook multiplies the attributed
hook point's output by ``s`` (registered before captum's own hooks, so captum sees the scaled value): ``s = 1`` is
the model, ``s = 0`` zeroes the component. So an integrated-gradients attribution of a sublayer output is its
total effect relative to removing it (what a gate of 0 does), and completeness reads
``sum(attribution) = logit - logit with the component zeroed`` up to the convergence delta. Gradient x activation
is the first-order estimate of the same quantity (one step at ``s = 1``). For input positions the hook maps the
embedding e to ``ref + s * (e - ref)`` with ``ref`` the mean embedding over the vocabulary at every position (the
"average token"): the model has no padding token, every real token is meaningful (token 0 is the number 0), and the
all-zero embedding is a degenerate baseline here because every sublayer reads the stream through a LayerNorm, which
maps ``s * e`` to the same vector for all but tiny s (the whole change happens in a sliver of the path, which IG's
quadrature misses). The fast method for positions is gradient x (embedding - ref).

Distance and path. For a state answer at stream position t, ``a(s)`` is the attribution to the token embedding at
position s (summed over the embedding dimensions). The recurrent-path part is computed with attention's q, k and v
detached (``probe.gradients.attention_inputs_detached``): only paths through the LSTM recurrence, MLPs and residual
stream remain, and across positions only the recurrence moves information; the attention part is the rest.
Per answer the absolute attributions of both paths at every position are normalised to sum to 1; ``distance``
is ``t - s`` for stream tokens (-1 for the dictionary prefix). ``far_share(k)`` is the mass from stream tokens more
than k positions back, over answers at t > k: a windowed shortcut shows as attention mass confined to small
distances and little far mass on either path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from captum.attr import LayerGradientXActivation, LayerIntegratedGradients
from torch import Tensor, nn

from probe.gradients import attention_inputs_detached
from probe.models import HookedSequenceModel
from probe.tasks import SUBTASKS, Batch

METHODS = ("gxa", "ig")
DELTA_TOL = 0.05
"""IG convergence delta, relative to the size of the explained change, above which a control row fails."""


class AnswerLogit:
    """captum ``forward_func``: ``f(scale, tokens, labels, weights) -> (batch,)`` = sum over positions of
    ``weights * logit[correct answer]``. ``hook`` maps a hook point's output x to ``ref + scale * (x - ref)``
    (per sequence; ``ref`` 0 unless given), so ``scale`` 1 is the model and 0 the reference."""

    def __init__(self, model: HookedSequenceModel, reference: Tensor | None = None) -> None:
        self.model = model
        self.reference = reference
        self._scale: Tensor | None = None

    def hook(self, x: Tensor, hook: Any) -> Tensor:
        assert self._scale is not None
        s = self._scale.view(-1, *([1] * (x.dim() - 1))).to(x.dtype)
        return x * s if self.reference is None else self.reference + s * (x - self.reference)

    def __call__(self, scale: Tensor, tokens: Tensor, labels: Tensor, weights: Tensor) -> Tensor:
        self._scale = scale
        logits = self.model(tokens)
        correct = logits.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        return (correct * weights).sum(dim=-1)


@dataclass(frozen=True)
class Component:
    block: int
    kind: str  # "lstm" | "attn"
    name: str
    module: nn.Module


def components(model: HookedSequenceModel) -> list[Component]:
    """Each block's LSTM output and (gated) attention output hook points, in forward order."""
    out = []
    for i, block in enumerate(model.blocks):
        for kind, attr in (("lstm", "hook_lstm_out"), ("attn", "hook_attn_out")):
            if hasattr(block, attr):
                out.append(Component(i, kind, f"blocks.{i}.{attr}", getattr(block, attr)))
    return out


def _subtask_weights(batch: Batch, subtask: str) -> tuple[Tensor, Tensor]:
    mask = batch.masks[subtask] & batch.answer_mask
    keep = mask.any(dim=1)
    weights = mask.float() / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return keep, weights


def component_attribution(model: HookedSequenceModel, batch: Batch, method: str = "gxa", n_steps: int = 32,
                          subtasks: Sequence[str] = SUBTASKS) -> pd.DataFrame:
    """Attribution of each subtask's correct-answer logit to every block's LSTM and attention outputs.

    Rows: ``subtask, method, block, component, hook, attribution, share, logit, ablation_effect, delta``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}")
    comps = components(model)
    rows: list[dict[str, Any]] = []
    for subtask in subtasks:
        keep, weights = _subtask_weights(batch, subtask)
        if not keep.any():
            continue
        args = (batch.tokens[keep], batch.labels[keep], weights[keep])
        ones = torch.ones(int(keep.sum()), device=batch.tokens.device)
        fwd = AnswerLogit(model)
        with torch.no_grad():
            logit = fwd(ones, *args)
        results = []
        if method == "gxa":
            lga = LayerGradientXActivation(fwd, [c.module for c in comps])
            attrs = lga.attribute(ones, additional_forward_args=args)
            results = [(a.sum(dim=(1, 2)), float("nan"), float("nan")) for a in attrs]
        else:
            for c in comps:
                scaled = AnswerLogit(model)
                # The scaling hook is registered before captum's, so captum records the scaled output.
                with model.hooks(fwd_hooks=[(c.name, scaled.hook)]):
                    attr, delta = LayerIntegratedGradients(scaled, c.module).attribute(
                        ones, baselines=torch.zeros_like(ones), additional_forward_args=args, n_steps=n_steps,
                        internal_batch_size=len(ones) * min(n_steps, 16), return_convergence_delta=True)
                    with torch.no_grad():
                        ablated = scaled(torch.zeros_like(ones), *args)
                results.append((attr.sum(dim=(1, 2)), float((logit - ablated).mean()), float(delta.abs().mean())))
        total = sum(a.mean().abs().item() for a, _, _ in results)
        for c, (a, effect, delta) in zip(comps, results, strict=True):
            value = a.mean().item()
            rows.append({"subtask": subtask, "method": method, "block": c.block, "component": c.kind, "hook": c.name,
                         "attribution": value, "share": abs(value) / total if total > 0 else float("nan"),
                         "logit": float(logit.mean()), "ablation_effect": effect, "delta": delta})
    return pd.DataFrame(rows)


@dataclass
class DistanceAttribution:
    """Per state answer: its stream position ``t`` and the normalised absolute attribution of each path to every
    position (``rec``, ``att``: (answers, positions)); ``delta`` (IG) is relative to the explained change."""

    method: str
    prefix_len: int
    t: Tensor
    rec: Tensor
    att: Tensor
    delta: list[float] = field(default_factory=list)

    def _distance(self) -> Tensor:
        pos = torch.arange(self.rec.shape[1]) - self.prefix_len
        d = self.t[:, None] - pos[None, :]
        return torch.where(pos[None, :] < 0, -1, d)  # -1: the dictionary prefix

    def profile(self) -> pd.DataFrame:
        """Rows ``method, path, distance, mass``: mean over answers; summed over paths and distances it is 1."""
        d = self._distance()
        rows = []
        for path, a in (("recurrent", self.rec), ("attention", self.att)):
            for dist in range(-1, int(self.t.max()) + 1 if len(self.t) else 0):
                mass = (a * (d == dist)).sum(dim=1).mean()
                rows.append({"method": self.method, "path": path, "distance": dist, "mass": float(mass)})
        return pd.DataFrame(rows)

    def far_share(self, k: int) -> pd.DataFrame:
        """Rows ``method, k, path, share, n_answers``: mass from stream tokens more than k back, answers at t > k."""
        late = self.t > k
        far = self._distance() > k
        rows = []
        for path, a in (("recurrent", self.rec), ("attention", self.att), ("total", self.rec + self.att)):
            share = (a[late] * far[late]).sum(dim=1).mean() if late.any() else torch.tensor(float("nan"))
            rows.append({"method": self.method, "k": k, "path": path, "share": float(share),
                         "n_answers": int(late.sum())})
        return pd.DataFrame(rows)


def embedding_reference(model: HookedSequenceModel) -> Tensor:
    """The reference embedding: the mean over the vocabulary (the "average token")."""
    return model.embed.weight.detach().mean(dim=0)


def _embed_attribution(model: HookedSequenceModel, method: str, args: tuple[Tensor, ...], n_steps: int,
                       ) -> tuple[Tensor, Tensor | None, Tensor]:
    """(attribution per position (n, T), convergence delta or None, explained change) at ``hook_embed``.

    ``gxa`` here is gradient x (embedding - reference): every sublayer reads the stream through a LayerNorm, which
    is blind to rescaling, so gradient x embedding would miss most of what a token does."""
    n = args[0].shape[0]
    ones = torch.ones(n, device=args[0].device)
    ref = embedding_reference(model)
    fwd = AnswerLogit(model, reference=ref)
    if method == "gxa":
        grad = LayerGradientXActivation(fwd, model.hook_embed, multiply_by_inputs=False).attribute(
            ones, additional_forward_args=args)
        with torch.no_grad():
            diff = model.embed(args[0]) - ref
        return (grad * diff).sum(dim=-1), None, torch.zeros(n)
    with model.hooks(fwd_hooks=[("hook_embed", fwd.hook)]):
        a, delta = LayerIntegratedGradients(fwd, model.hook_embed).attribute(
            ones, baselines=torch.zeros_like(ones), additional_forward_args=args, n_steps=n_steps,
            internal_batch_size=n * min(n_steps, 4), return_convergence_delta=True)
        with torch.no_grad():
            change = fwd(ones, *args) - fwd(torch.zeros_like(ones), *args)
    return a.sum(dim=-1), delta, change


def distance_attribution(model: HookedSequenceModel, batch: Batch, method: str = "gxa", n_steps: int = 32,
                         max_targets: int | None = None, chunk: int | None = None) -> DistanceAttribution:
    """Attribution of every state answer to the input positions, split into recurrent and attention paths.

    Each answer is one row (its sequence, with the answer's position as the only explained logit); rows are
    attributed ``chunk`` at a time (default 256; 64 for integrated gradients, which evaluates 4 path points of each
    row per pass, so memory stays near that of 256 rows). ``max_targets`` evenly subsamples the answer positions
    (integrated gradients costs ``n_steps`` passes per row).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}")
    chunk = chunk or (256 if method == "gxa" else 64)
    state = batch.masks["state"] & batch.answer_mask
    positions = [p for p in range(batch.prefix_len, state.shape[1]) if state[:, p].any()]
    if max_targets is not None and len(positions) > max_targets:
        idx = torch.linspace(0, len(positions) - 1, max_targets).round().long().unique()
        positions = [positions[i] for i in idx]
    chosen = torch.zeros_like(state)
    chosen[:, positions] = True
    seq, pos = (state & chosen).nonzero(as_tuple=True)
    width = state.shape[1]
    if len(seq) == 0:
        empty = torch.zeros(0, width)
        return DistanceAttribution(method, batch.prefix_len, torch.zeros(0, dtype=torch.long), empty, empty.clone())
    weights = torch.zeros(len(seq), width, device=state.device)
    weights[torch.arange(len(seq)), pos] = 1.0
    recs, atts, deltas = [], [], []
    for lo in range(0, len(seq), chunk):
        rows = slice(lo, lo + chunk)
        args = (batch.tokens[seq[rows]], batch.labels[seq[rows]], weights[rows])
        full, delta, change = _embed_attribution(model, method, args, n_steps)
        with attention_inputs_detached(model):
            rec, _, _ = _embed_attribution(model, method, args, n_steps)
        att = full - rec
        z = (rec.abs() + att.abs()).sum(dim=1, keepdim=True).clamp(min=1e-30)
        recs.append((rec.abs() / z).detach().cpu())
        atts.append((att.abs() / z).detach().cpu())
        if delta is not None:
            deltas.append(float(delta.abs().mean() / change.abs().mean().clamp(min=1e-6)))
    t = (pos - batch.prefix_len).cpu()
    return DistanceAttribution(method, batch.prefix_len, t, torch.cat(recs), torch.cat(atts), deltas)


def ig_delta_controls(comp: pd.DataFrame, dist: DistanceAttribution, checkpoint: str, length: int,
                      ) -> list[dict[str, Any]]:
    """The largest IG convergence delta relative to the change it explains, for sublayer outputs and for input
    positions (two rows: the position path is the harder integral and may need more ``n_steps``)."""
    rel = []
    for _, g in comp.groupby("subtask"):
        scale = g.ablation_effect.abs().sum()
        rel.extend((g.delta / scale).tolist() if scale > 0 else [0.0])
    out = []
    for what, values in (("components", rel), ("positions", dist.delta)):
        value = max(values) if values else 0.0
        out.append({"checkpoint": checkpoint, "control": f"ig_delta_{what}_L{length}", "value": value,
                    "threshold": DELTA_TOL, "passed": bool(value <= DELTA_TOL),
                    "what": f"mean |IG convergence delta| / size of the explained change ({what}); "
                            "raise --ig-steps if it fails"})
    return out


# --- plots ------------------------------------------------------------------------------------------------------
def plot_distance(profile: pd.DataFrame):
    """Attribution mass by distance for state answers, recurrent vs attention path; rows = checkpoints,
    columns = lengths."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    df = profile[profile.distance >= 0].reset_index(drop=True)
    ckpts = list(dict.fromkeys(df.checkpoint))
    lengths = sorted(df.length.unique())
    fig, axes = plt.subplots(len(ckpts), len(lengths), figsize=(5.2 * len(lengths), 3.4 * len(ckpts)),
                             squeeze=False)
    for i, ck in enumerate(ckpts):
        for j, length in enumerate(lengths):
            ax = axes[i, j]
            sub = df[(df.checkpoint == ck) & (df.length == length)]
            sns.lineplot(data=sub, x="distance", y="mass", hue="path", ax=ax,
                         hue_order=["recurrent", "attention"])
            ax.set_xlabel("distance t - s (tokens back)")
            ax.set_ylabel("share of |attribution|")
            ax.set_title(f"{_label(sub, ck)}, length {length} ({sub.method.iloc[0] if len(sub) else ''})")
    fig.suptitle("State answers: where the input attribution comes from")
    fig.tight_layout()
    return fig


def _label(rows: pd.DataFrame, checkpoint: str) -> str:
    """``run-dir/seedN step S`` when the rows say so, else the file name."""
    if len(rows) and {"run", "step"} <= set(rows.columns):
        run = "/".join(str(rows.run.iloc[0]).split("/")[-2:])
        return f"{run} step {int(rows.step.iloc[0])}"
    return str(checkpoint).rsplit("/", 1)[-1]


def plot_components(table: pd.DataFrame):
    """Share of |attribution| of the correct-answer logit per sublayer output; hue = subtask, rows = checkpoints,
    columns = lengths."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    df = table.reset_index(drop=True)
    df["sublayer"] = "block " + df.block.astype(str) + " " + df.component
    ckpts = list(dict.fromkeys(df.checkpoint))
    lengths = sorted(df.length.unique())
    fig, axes = plt.subplots(len(ckpts), len(lengths), figsize=(5.5 * len(lengths), 3.8 * len(ckpts)),
                             squeeze=False)
    for i, ck in enumerate(ckpts):
        for j, length in enumerate(lengths):
            ax = axes[i, j]
            sub = df[(df.checkpoint == ck) & (df.length == length)]
            sns.barplot(data=sub, x="sublayer", y="share", hue="subtask", ax=ax, errorbar=None)
            ax.set_ylabel("share of |attribution|")
            ax.set_xlabel("")
            ax.set_title(f"{_label(sub, ck)}, length {length} ({sub.method.iloc[0] if len(sub) else ''})")
            ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig
