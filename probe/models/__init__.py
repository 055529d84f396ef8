"""Hooked recurrent (LSTM, GRU, SSM), Transformer and hybrid models (TransformerLens ``HookedRootModule``s)."""

from probe.models.cache import SequenceActivationCache, UnknownHookError
from probe.models.components import HookedGRU, HookedLSTM, HookedSSM
from probe.models.config import CELLS, FAMILIES, POS_ENCODINGS, SSM_RANGES, ModelConfig
from probe.models.hooked import Block, HookedSequenceModel
from probe.models.recurrent import HookedRecurrent, InnerHookPoint

__all__ = ["CELLS", "FAMILIES", "POS_ENCODINGS", "SSM_RANGES", "Block", "HookedGRU", "HookedLSTM", "HookedRecurrent",
           "HookedSSM", "HookedSequenceModel", "InnerHookPoint", "ModelConfig", "SequenceActivationCache",
           "UnknownHookError", "build_model"]


def build_model(cfg: ModelConfig) -> HookedSequenceModel:
    return HookedSequenceModel(cfg)
