"""TransformerLens's ``ActivationCache`` taught probe's block layout, and the error for a misspelled hook name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import ActivationCache
from transformer_lens.utilities import Slice, SliceInput

from probe.errors import ProbeError


class UnknownHookError(ProbeError, KeyError):
    """A hook name that the model (or the cache) does not have. A ``KeyError`` too, so code that looks a name up and
    catches ``KeyError`` (TransformerLens does) keeps working."""

    def __str__(self) -> str:  # KeyError would print the repr of its message
        return str(self.args[0])


def unknown_hook(name: str, known: Iterable[str], what: str = "the model has no hook") -> UnknownHookError:
    """The one-line error for ``name``, naming the nearest known names."""
    known = list(known)
    near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"nearest: {', '.join(near)}" if near else f"{len(known)} names; list them with model.hook_dict"
    return UnknownHookError(f"{what} named {name!r} ({hint})")


class SequenceActivationCache(ActivationCache):
    """The cache ``run_with_cache`` returns: a TransformerLens ``ActivationCache`` (``cache["pattern", 1]``,
    ``stack_activation``, ``accumulated_resid``, ``logit_attrs``, ``stack_head_results``, ...) where a block is
    ``[LN -> LSTM] -> [LN -> attention] -> LN -> MLP``:

    - ``decompose_resid`` also lists each block's LSTM output (``{l}_lstm_out``; ``mode`` may be ``"lstm"``), so the
      components sum to the residual stream for all three families;
    - LayerNorm scales are the block's own: the input to block l is normalised by its first LN (``ln_lstm``, or
      ``ln_attn`` in a Transformer), the MLP's input (``mlp_input=True``) by ``ln_mlp``; TransformerLens's names
      ``ln1`` / ``ln2`` do not exist here;
    - ``get_neuron_results`` / ``stack_neuron_results`` read each MLP's ``W_out`` from its ``nn.Linear``;
    - ``get_full_resid_decomposition`` also lists each block's LSTM output and gates the heads and their bias;
    - a missing key is a one-line ``UnknownHookError`` that names the nearest cached keys.
    """

    def __getitem__(self, key: Any) -> Tensor:
        try:
            return super().__getitem__(key)
        except KeyError:
            name = key if isinstance(key, str) else repr(key)
            raise unknown_hook(name, self.cache_dict, "the cache holds no activation") from None

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: Literal["all", "lstm", "attn", "mlp"] = "all",
        apply_ln: bool = False,
        pos_slice: Slice | SliceInput = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ) -> Float[Tensor, "component *batch_and_pos d_model"] | tuple[Tensor, list[str]]:
        """The residual stream entering block ``layer`` (default: the final stream) as a stack of what wrote it:
        embeddings, then each earlier block's LSTM, attention and MLP outputs; with ``mlp_input`` the stream entering
        block ``layer``'s MLP (its LSTM and attention outputs added). ``mode`` keeps one kind of sublayer."""
        if mode not in ("all", "lstm", "attn", "mlp"):
            raise ProbeError(f"mode must be all, lstm, attn or mlp, not {mode!r}")
        pos_slice = pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice)
        n_layers = self.model.cfg.n_layers
        layer = n_layers if layer is None or layer == -1 else layer
        parts: list[tuple[str, str]] = []
        if incl_embeds:
            parts += [(k, label) for k, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed"))
                      if k in self.cache_dict]
        kinds = [k for k in ("lstm", "attn", "mlp") if mode in ("all", k)]
        sublayers = [(i, k) for i in range(layer) for k in kinds]
        if mlp_input and layer < n_layers:
            sublayers += [(layer, k) for k in kinds if k != "mlp"]
        parts += [(f"blocks.{i}.hook_{k}_out", f"{i}_{k}_out") for i, k in sublayers
                  if f"blocks.{i}.hook_{k}_out" in self.model.hook_dict]
        if not parts:
            raise ProbeError(f"nothing to decompose: a {self.model.cfg.family} model has no {mode} sublayer "
                             f"before block {layer}")
        stack = torch.stack([pos_slice.apply(self[k], dim=-2) for k, _ in parts], dim=0)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice, mlp_input=mlp_input)
        return (stack, [label for _, label in parts]) if return_labels else stack

    def _get_cached_ln_scale(self, layer: int | None, mlp_input: bool, pos_slice: Slice,
                             batch_slice: Slice | None = None) -> Tensor:
        # TransformerLens reads blocks.{l}.ln1 / ln2; a block here normalises its input with its first LN
        # (ln_lstm, or ln_attn without an LSTM) and its MLP input with ln_mlp.
        n_layers = self.model.cfg.n_layers
        if layer is None or layer == n_layers:
            key = "ln_final.hook_scale"
        elif mlp_input:
            key = f"blocks.{layer}.ln_mlp.hook_scale"
        else:
            first = "ln_lstm" if self.model.cfg.has_lstm else "ln_attn"
            key = f"blocks.{layer}.{first}.hook_scale"
        scale = pos_slice.apply(self[key], dim=-2)
        if batch_slice is not None and self.has_batch_dim:
            scale = batch_slice.apply(scale)
        return scale

    def _ensure_head_results(self) -> bool:
        # TransformerLens computes missing head results from a W_O of shape (head, d_head, d_model); here W_O is an
        # nn.Linear, so the same product is written against its weight.
        all_cached = True
        for i, block in enumerate(self.model.blocks):
            key = f"blocks.{i}.attn.hook_result"
            if not hasattr(block, "attn") or key in self.cache_dict:
                continue
            all_cached = False
            attn = block.attn
            w_o = attn.W_O.weight.view(-1, attn.n_heads, attn.d_head)
            self.cache_dict[key] = torch.einsum("...hd,mhd->...hm", self[f"blocks.{i}.attn.hook_z"], w_o).detach()
        return all_cached

    def get_neuron_results(self, layer: int, neuron_slice: Slice | SliceInput = None,
                           pos_slice: Slice | SliceInput = None,
                           project_output_onto: Tensor | None = None) -> Float[Tensor, "*batch_and_pos neuron d"]:
        """Each neuron's contribution to the stream, ``post[n] * W_out[n]`` (not cached: cheap to recompute);
        ``project_output_onto`` ((d_model,) or (d_model, k)) contracts ``W_out`` with it first."""
        neuron_slice = neuron_slice if isinstance(neuron_slice, Slice) else Slice(neuron_slice)
        pos_slice = pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice)
        # position first: slicing it may drop a dimension, and the neuron axis is the last either way
        acts = neuron_slice.apply(pos_slice.apply(self[f"blocks.{layer}.mlp.hook_post"], dim=-2), dim=-1)
        w_out = neuron_slice.apply(self.model.blocks[layer].mlp.W_out.weight.T, dim=0)  # neuron d_model
        if project_output_onto is not None:
            w_out = w_out @ project_output_onto
            if w_out.dim() == 1:
                return acts * w_out
        return acts[..., None] * w_out

    def _stack_neuron_results_apply_ln_projected(self, layer: int, pos_slice: Slice, neuron_slice: Slice,
                                                 project_2d: Tensor, mlp_input: bool = False) -> Tensor:
        # TransformerLens folds the LayerNorm into W_out read as a tensor; here the full stack is normalised, then
        # projected (the same numbers, without the memory saving)
        parts = [self.get_neuron_results(i, neuron_slice, pos_slice) for i in range(layer)]
        if not parts:
            embed = pos_slice.apply(self["hook_embed"], dim=-2)
            return embed.new_zeros(0, *embed.shape[:-1], project_2d.shape[-1])
        stack = torch.cat(parts, dim=-2).movedim(-2, 0)
        return self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice, mlp_input=mlp_input) @ project_2d

    def get_full_resid_decomposition(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        expand_neurons: bool = True,
        apply_ln: bool = False,
        pos_slice: Slice | SliceInput = None,
        return_labels: bool = False,
        project_output_onto: Tensor | None = None,
    ) -> Float[Tensor, "component *batch_and_pos d"] | tuple[Tensor, list[str]]:
        """The stream entering block ``layer`` (default: the final stream; with ``mlp_input`` the one entering its
        MLP) as a stack that sums to it: every head's result times its block's attention gate (``L0H1``), each
        block's LSTM output (``0_lstm_out``: a recurrence has no linear split into parts), every neuron's result
        (``L0N5``) or, with ``expand_neurons=False``, each MLP's output (``0_mlp_out``, biases included), then
        ``embed``, ``pos_embed`` (where the model has one) and ``bias`` (``model.accumulated_bias``). With
        ``apply_ln`` each component is normalised by the LayerNorm scale of what reads the stream;
        ``project_output_onto`` ((d_model,) or (d_model, k)) projects the finished stack."""
        model = self.model
        n_layers = model.cfg.n_layers
        layer = n_layers if layer is None or layer == -1 else layer
        if mlp_input and layer >= n_layers:
            raise ProbeError(f"mlp_input needs a block below {n_layers}, not layer {layer}")
        pos_slice = pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice)
        parts: list[Tensor] = []
        labels: list[str] = []
        with_heads = layer + int(mlp_input)  # the blocks whose attention wrote into this stream
        if model.cfg.has_attention and with_heads:
            heads, head_labels = self.stack_head_results(with_heads, pos_slice=pos_slice, return_labels=True)
            gates = torch.stack([b.attn_gate for b in model.blocks[:with_heads]]).repeat_interleave(model.cfg.n_heads)
            parts.append(heads * gates.view(-1, *[1] * (heads.dim() - 1)))
            labels += head_labels
        if model.cfg.has_lstm and with_heads:
            lstm, lstm_labels = self.decompose_resid(layer, mlp_input=mlp_input, mode="lstm", incl_embeds=False,
                                                     pos_slice=pos_slice, return_labels=True)
            parts.append(lstm)
            labels += lstm_labels
        if layer:
            if expand_neurons:
                neurons, neuron_labels = self.stack_neuron_results(layer, pos_slice=pos_slice, return_labels=True)
            else:
                neurons, neuron_labels = self.decompose_resid(layer, mode="mlp", incl_embeds=False,
                                                              pos_slice=pos_slice, return_labels=True)
            parts.append(neurons)
            labels += neuron_labels
        for key, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed")):
            if key in model.hook_dict:
                parts.append(pos_slice.apply(self[key], dim=-2)[None])
                labels.append(label)
        bias = model.accumulated_bias(layer, mlp_input, include_mlp_biases=expand_neurons)
        parts.append(bias.expand(parts[-1].shape)[:1])
        labels.append("bias")
        stack = torch.cat(parts, dim=0)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice, mlp_input=mlp_input)
        if project_output_onto is not None:
            stack = stack @ project_output_onto
        return (stack, labels) if return_labels else stack
