"""The named presets: a model, a training config and a schedule variant each, tuned on CPU for the interleaved task."""

from __future__ import annotations

from typing import Any

from probe.schedules.points import At
from probe.schedules.settings import VARIANTS

# Presets, tuned on CPU for the interleaved task (m 10, 6 pairs of 16 keys / 16 values, q 0.2, lengths 1..25).
# The hybrid presets differ only in the schedule; `lstm` is the hybrid without attention sublayers; `transformer`
# uses sinusoidal positions so that its positional code exists at every evaluation length. See README.
# The LSTM-containing presets train at lr 2e-3, not TrainConfig's 1e-3: at 1e-3 the LSTM found the
# length-generalizing counter in only 4 of 6 runs (lstm seed 0 and hybrid-dat seed 2 stalled at 70-90 % state
# accuracy in distribution); at 2e-3 both found it by step 1500 from the same initialisation. The Transformer keeps
# 1e-3: at 2e-3 its recall stalled at 26 %. docs/guides/training.md has the runs.
# hybrid-dat switches at 4/9 of the run: step 2000 of the 4500 its shipped checkpoints trained, and a proportionate
# step of a shortened run.
DAT_SWITCH = At(fraction=4 / 9)
_BASE_MODEL = dict(d_model=128, n_layers=2, n_heads=4, pos_encoding="none")
_BASE_TRAIN = dict(steps=4500, lr=2e-3)
PRESETS: dict[str, dict[str, Any]] = {
    "lstm": dict(model=dict(_BASE_MODEL, family="lstm"), train=dict(_BASE_TRAIN)),
    "transformer": dict(model=dict(_BASE_MODEL, family="transformer", pos_encoding="sinusoidal"),
                        train=dict(_BASE_TRAIN, lr=1e-3)),
    "hybrid-joint": dict(model=dict(_BASE_MODEL, family="hybrid"),
                         train=dict(_BASE_TRAIN, schedule=dict(VARIANTS["joint"]))),
    "hybrid-dat": dict(model=dict(_BASE_MODEL, family="hybrid"),
                       train=dict(_BASE_TRAIN, schedule=dict(VARIANTS["dat"], switch=DAT_SWITCH))),
}

# The other recurrent cells (docs/guides/recurrent.md), each alone (`gru`, `ssm-complex`, ...) and in the hybrid,
# joint and with DAT (`hybrid-gru-joint`, `hybrid-ssm-complex-dat`, ...): the LSTM presets above with only the cell
# changed, so that a difference between a cell's runs and the LSTM's is the cell's. Their lr is the LSTM's 2e-3, not
# tuned per cell. Any other preset takes a cell too: --set model.rnn=ssm --set model.ssm_range=negative.
CELL_MODELS: dict[str, dict[str, Any]] = {
    "gru": dict(rnn="gru"),
    "ssm-positive": dict(rnn="ssm", ssm_range="positive"),
    "ssm-negative": dict(rnn="ssm", ssm_range="negative"),
    "ssm-complex": dict(rnn="ssm", ssm_range="complex"),
    # the same three with the boundary reached exactly (|a| = 1, a = -1; probe.models.ssm.HookedSSM), so that theory's
    # parity and Z_10 constructions are representable at finite weights: study/sweeps/ssm_boundary.toml
    "ssm-positive-closed": dict(rnn="ssm", ssm_range="positive-closed"),
    "ssm-negative-closed": dict(rnn="ssm", ssm_range="negative-closed"),
    "ssm-complex-closed": dict(rnn="ssm", ssm_range="complex-closed"),
}


def _with_cell(preset: str, fields: dict[str, Any]) -> dict[str, Any]:
    return dict(PRESETS[preset], model=dict(PRESETS[preset]["model"], **fields))  # build_configs copies on use


PRESETS.update({name: _with_cell(base, fields) for cell, fields in CELL_MODELS.items()
                for name, base in ((cell, "lstm"), (f"hybrid-{cell}-joint", "hybrid-joint"),
                                   (f"hybrid-{cell}-dat", "hybrid-dat"))})


# The paper's depth: 4 blocks of [LN -> recurrent -> LN -> MHA -> LN -> MLP] (probe's block, pre-LayerNorm with a
# residual add after each sublayer), jointly and with DAT; everything else as the 2-block presets, so that a
# difference between them is depth's. A search for the paper's cliff to chance starts here (issue: the 4-block
# regime), e.g. python -m probe.train --preset hybrid-4block-joint --set model.d_model=64 --set train.lr=1e-3.
PRESETS.update({f"hybrid-4block-{s}": dict(PRESETS[f"hybrid-{s}"], model=dict(PRESETS[f"hybrid-{s}"]["model"],
                                                                              n_layers=4))
                for s in ("joint", "dat")})

# The transformers library's hybrids (probe.external.HF_ARCHS: RecurrentGemma's RG-LRU beside local attention, Jamba's
# Mamba then attention, Falcon-H1's Mamba-2 beside attention), built from a config and wrapped by probe.wrap_hf, at
# the width, depth and training of the 2-block hybrid, jointly and with DAT: hf-recurrentgemma-joint,
# hf-jamba-dat, ... Their pure-PyTorch scans make a step several times dearer than the hybrid's
# (benchmarks/hf_train_step.py); study/sweeps/hf.toml says what it shrank to train them on one core.
PRESETS.update({f"hf-{arch}-{s}": dict(PRESETS[f"hybrid-{s}"], model=dict(family="hf", arch=arch, d_model=128,
                                                                          n_layers=2, n_heads=4))
                for arch in ("recurrentgemma", "jamba", "falcon-h1") for s in ("joint", "dat")})

# Hybrids TransformerLens bridges (probe.bridge.BridgeModelConfig, family "bridge", built offline from the tiny
# transformers config probe.bridge.ARCHS gives at this width): Jamba (a Mamba mixer, then attention), Qwen3-Next (a
# gated DeltaNet, then attention) and Nemotron-H (a Mamba-2 mixer, then attention), at the width, depth and training
# of the 2-block hybrid, jointly and with DAT: bridge-jamba-dat, ... Any other bridged architecture:
# --set model.arch=NAME. benchmarks/bridge_step.py times one step of each against the 2-block hybrid.
PRESETS.update({f"bridge-{arch}-{s}": dict(PRESETS[f"hybrid-{s}"], model=dict(family="bridge", arch=arch,
                                                                              d_model=128, n_layers=2))
                for arch in ("jamba", "qwen3-next", "nemotron-h") for s in ("joint", "dat")})

# A bridged layout whose recurrence can count: the bridged mixers cannot (Mamba's and Mamba-2's exp(dt A) and the
# gated DeltaNet's exp(g)(1 - beta) stay in (0, 1]; probe.transitions.can_count), so Nemotron-H (the cheapest bridged
# step) with an nn.LSTM in its Mamba-2 layer's place (probe.bridge.RecurrentMixer, hidden = d_model), then its
# attention (no positional encoding, as probe's hybrid), at the training of the other bridge presets:
# bridge-nemotron-h-lstm-joint, bridge-nemotron-h-lstm-dat. --set model.recurrent=gru puts a GRU there instead.
PRESETS.update({f"bridge-nemotron-h-lstm-{s}": dict(PRESETS[f"bridge-nemotron-h-{s}"],
                                                    model=dict(PRESETS[f"bridge-nemotron-h-{s}"]["model"],
                                                               recurrent="lstm"))
                for s in ("joint", "dat")})
