"""Which sublayer the answers use: the exact effect of zeroing each recurrent or attention module's output."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from torch import Tensor

from probe.core.cells import recurrent_modules
from probe.core.inputs import check_inputs
from probe.models import HookedSequenceModel
from probe.tasks import SUBTASKS, Batch
from probe.wrapped import WrappedModel


def _correct_logit(logits: Tensor, batch: Batch, mask: Tensor) -> Tensor:
    """Per sequence: mean over the positions in ``mask`` of the correct answer's logit."""
    correct = logits.gather(-1, batch.labels.clamp(min=0)[..., None])[..., 0]
    return (correct * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def module_of(hook: str) -> str:
    """The module whose output ``hook`` is, as the gradient split names it: ``blocks.0.lstm`` for probe's
    ``blocks.0.hook_lstm_out``, the user's own path (``mha``) for a wrapped or bridged model's ``mha.hook_out``."""
    path, last = hook.rsplit(".", 1)
    return path if last == "hook_out" else f"{path}.{last.removeprefix('hook_').removesuffix('_out')}"


def component_ablation(model: HookedSequenceModel | WrappedModel, batch: Batch, subtasks: Sequence[str] = SUBTASKS,
                       ) -> pd.DataFrame:
    """Rows ``subtask, block, module, component, hook, effect, share, logit, acc, acc_ablated``: ``effect`` =
    mean correct-answer logit minus the same with the component's output (``blocks.{i}.hook_{lstm,attn}_out``)
    replaced by 0, which is what a gate of 0 does to attention; ``share`` = |effect| / sum over components.

    ``component`` says what the sublayer is in the model's own terms: ``attn``, or the recurrent cell's kind
    (``lstm``, ``gru``, ``ssm``, or the class of a module probe does not know); ``module`` is the module's path
    (``module_of``). A wrapped model: one row per named module (``sublayer_outputs``), ``block`` its place in that
    order."""
    check_inputs("probe.attributions.component_ablation", model=model, batch=batch, masks=subtasks)
    sublayers = model.sublayer_outputs()
    hooks = list(sublayers)
    cells = iter([kind for _, kind in recurrent_modules(model)])  # in the order sublayer_outputs lists them
    kinds = {name: next(cells, "recurrent") if s.kind == "recurrent" else "attn" for name, s in sublayers.items()}
    rows = []
    with torch.no_grad():
        clean = model(batch.tokens)
        ablated = {}
        for name in hooks:
            with model.hooks(fwd_hooks=[(name, lambda x, hook: torch.zeros_like(x))]):
                ablated[name] = model(batch.tokens)
    for subtask in subtasks:
        mask = batch.masks[subtask] & batch.answer_mask
        keep = mask.any(dim=1)
        if not keep.any():
            continue
        base = _correct_logit(clean, batch, mask)[keep]
        acc = float(((clean.argmax(-1) == batch.labels) & mask).sum() / mask.sum())
        effects = {n: float((base - _correct_logit(ablated[n], batch, mask)[keep]).mean()) for n in hooks}
        total = sum(abs(e) for e in effects.values())
        for place, name in enumerate(hooks):
            block = int(name.split(".")[1]) if name.startswith("blocks.") else place
            rows.append({"subtask": subtask, "block": block, "module": module_of(name),
                         "component": kinds[name], "hook": name,
                         "effect": effects[name], "share": abs(effects[name]) / total if total > 0 else float("nan"),
                         "logit": float(base.mean()), "acc": acc,
                         "acc_ablated": float(((ablated[name].argmax(-1) == batch.labels) & mask).sum()
                                              / mask.sum())})
    return pd.DataFrame(rows)
