"""Hooked LSTM, Transformer and hybrid models (TransformerLens ``HookedRootModule``s)."""

from probe.models.cache import SequenceActivationCache, UnknownHookError
from probe.models.components import HookedLSTM
from probe.models.config import FAMILIES, POS_ENCODINGS, ModelConfig
from probe.models.hooked import Block, HookedSequenceModel

__all__ = ["FAMILIES", "POS_ENCODINGS", "Block", "HookedLSTM", "HookedSequenceModel", "ModelConfig",
           "SequenceActivationCache", "UnknownHookError", "build_model"]


def build_model(cfg: ModelConfig) -> HookedSequenceModel:
    return HookedSequenceModel(cfg)
