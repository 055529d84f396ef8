"""Where attention reads from: value-weighted attention per key position, by distance back from the answer.

For a state answer at t, block i's attention output there is ``gate * sum_h sum_s pattern[h, t, s] * (v_s^h W_O^h)``.
The share of key position s is ``sum_h pattern[h, t, s] * |v_s^h W_O^h|`` normalised over s (value-weighted
attention: a key with a large weight but a small value vector contributes little; Kobayashi et al. 2020). It says
which positions attention reads directly, which the path-patching effects cannot: there the attention part also
holds tokens that the LSTM carried to a nearby position first.
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from probe.core.inputs import check_inputs
from probe.models import HookedSequenceModel
from probe.tasks import Batch


def value_weighted_attention(model: HookedSequenceModel, batch: Batch) -> dict[int, Tensor]:
    """Per attention block: (batch, query, key) shares, each query's row summing to 1 (0 before the first key)."""
    check_inputs("probe.attributions.value_weighted_attention", model=model, batch=batch)
    names = [n for n in model.hook_dict if n.endswith(("attn.hook_pattern", "attn.hook_v"))]
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens, names_filter=lambda n: n in names)
    out = {}
    for i, block in enumerate(model.blocks):
        if not hasattr(block, "attn"):
            continue
        pattern = cache[f"blocks.{i}.attn.hook_pattern"]  # (b, h, q, k)
        v = cache[f"blocks.{i}.attn.hook_v"]               # (b, k, h, dh)
        h, dh = v.shape[2], v.shape[3]
        w_o = block.attn.W_O.weight.detach().view(-1, h, dh)  # (d_model, h, dh)
        norms = torch.einsum("bkhd,mhd->bkhm", v, w_o).norm(dim=-1)  # (b, k, h)
        weighted = (pattern * norms.permute(0, 2, 1)[:, :, None, :]).sum(dim=1)  # (b, q, k)
        out[i] = weighted / weighted.sum(dim=-1, keepdim=True).clamp(min=1e-30)
    return out


def read_profile(model: HookedSequenceModel, batch: Batch, far: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(profile, far) tables over the state answers. profile rows: ``block, distance (t - s; null in the prefix),
    in_prefix, mass`` (mean share over answers); far rows: ``block, k, prefix, near (distance 0..k), far (> k)``
    for answers at t > k."""
    check_inputs("probe.attributions.read_profile", model=model, batch=batch, masks=("state",))
    shares = value_weighted_attention(model, batch)
    state = (batch.masks["state"] & batch.answer_mask).cpu()
    p = batch.prefix_len
    b, t_len = state.shape
    qi, ti = state.nonzero(as_tuple=True)
    key = torch.arange(t_len)
    dist = (ti[:, None] - key[None, :])  # (answers, keys)
    in_prefix = (key < p)[None, :].expand_as(dist)
    prof, far_rows = [], []
    for block, share in shares.items():
        a = share.cpu()[qi, ti]  # (answers, keys)
        prof.append({"block": block, "distance": None, "in_prefix": True,
                     "mass": float((a * in_prefix).sum(dim=1).mean())})
        for d in range(0, t_len - p):
            sel = (dist == d) & ~in_prefix
            prof.append({"block": block, "distance": d, "in_prefix": False, "mass": float((a * sel).sum(dim=1).mean())})
        late = (ti - p) > far
        if late.any():
            al, dl, pl = a[late], dist[late], in_prefix[late]
            far_rows.append({"block": block, "k": far, "prefix": float((al * pl).sum(dim=1).mean()),
                             "near": float((al * ((dl <= far) & ~pl)).sum(dim=1).mean()),
                             "far": float((al * ((dl > far) & ~pl)).sum(dim=1).mean()),
                             "n_answers": int(late.sum())})
    return pd.DataFrame(prof), pd.DataFrame(far_rows)
