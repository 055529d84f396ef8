"""Interchange at module level: a recurrent module's outputs from position t on, taken from a source sequence.

A wrapped model's recurrent module that is not an ``nn.LSTM`` / ``nn.GRU`` and exposes no settable state (an RG-LRU
block; a bridged Mamba mixer also has its scan state, ``probe.bridge.ScanState``, which the state interventions use)
has hooks on its input and output only: its state after t cannot be set. What can be set is everything it passes on
from t on. Base and source share every token after t (``interchange_pair``), so the module's outputs from t on differ
between them only through what its state carries across t and through any difference in its later inputs (an
earlier module that also carries history): swapping them is the module-level counterpart of the state interchange,
and an upper bound on what the state at t alone would move. Kinds: ``output`` (a source with another s_t) and
``output_same_sum`` (the same s_t, another history; its control passes when at most ``SAME_SUM_MAX`` of the later
answers change, as the state interchange's does). The identity patch has no counterpart here: setting a module's
own outputs back changes nothing by construction, so it would check nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from probe.probes.interventions import (
    PATCH_FRACTIONS,
    Tally,
    answer_bands,
    count_answers,
    interchange_pairs,
    same_sum_controls,
    tally_rows,
)
from probe.tasks import TaskConfig
from probe.wrapped import HookedRNN, WrappedModel

KINDS = ("output", "output_same_sum")


def module_outputs(model: WrappedModel) -> list[tuple[str, int]]:
    """``(hook, batch dim)`` of each named recurrent module with module-level hooks only (not a hooked
    ``nn.LSTM`` / ``nn.GRU``), in the order named: block k of the rows is the k-th of them."""
    sublayers = model.sublayer_outputs()
    named = zip(model.recurrent_names, model.recurrent_modules, strict=True)
    return [(f"{n}.hook_out", sublayers[f"{n}.hook_out"].batch_dim) for n, m in named if not isinstance(m, HookedRNN)]


def _swap_from(position: int, source: Tensor, dim: int) -> Any:
    def hook(x: Tensor, hook: Any) -> Tensor:
        x = x.clone()
        if dim == 0:
            x[:, position:] = source[:, position:].to(x.dtype)
        else:
            x[position:] = source[position:].to(x.dtype)
        return x
    return hook


@torch.no_grad()
def output_interchange(model: WrappedModel, task: TaskConfig, lengths: Iterable[int], n: int = 48, seed: int = 0,
                       fractions: Iterable[float] = PATCH_FRACTIONS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The module-level interchange (module docstring) per module (``block`` k: the k-th of ``module_outputs``;
    ``-1``: every one at once), length and band, on the pairs ``interchange_intervention`` uses (same seeds).

    Returns ``(results, controls)`` with ``interchange_intervention``'s columns; controls: ``output_same_sum`` (every
    module at once, per length)."""
    modules = module_outputs(model)
    if not modules:
        return pd.DataFrame(), pd.DataFrame()
    device = next(model.parameters()).device
    targets = [(k, [k]) for k in range(len(modules))] + ([(-1, list(range(len(modules))))] if len(modules) > 1 else [])
    names = [h for h, _ in modules]
    tally: Tally = {}
    for length, _, _, full, same in interchange_pairs(task, lengths, n, seed, fractions):
        pos, b = full.position, full.base.tokens.shape[0]
        base_tok = full.base.tokens.to(device)
        _, cache = model.run_with_cache(
            torch.cat([full.source.tokens.to(device), same.source.tokens.to(device)]), names_filter=names)
        pred0 = model(base_tok).argmax(-1)
        bands = answer_bands(full, task.train_length, device)
        base_labels = full.base.labels.to(device)
        for kind, rows, cf in (("output", slice(0, b), full.counterfactual),
                               ("output_same_sum", slice(b, 2 * b), same.counterfactual)):
            for block, chosen in targets:
                hooks = []
                for j in chosen:
                    hook, dim = modules[j]
                    source = cache[hook][rows] if dim == 0 else cache[hook][:, rows]
                    hooks.append((hook, _swap_from(pos, source, dim)))
                pred = model.run_with_hooks(base_tok, fwd_hooks=hooks).argmax(-1)
                count_answers(tally, (kind, block, length), pred, pred0, cf.to(device), base_labels, bands)
    whole = -1 if len(modules) > 1 else 0
    return pd.DataFrame(tally_rows(tally)), pd.DataFrame(same_sum_controls(tally, "output_same_sum", whole))
