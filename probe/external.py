"""Models probe did not define, as configs that rebuild them: a transformers hybrid, or a ``package.module:factory``.

A checkpoint records a model's config, never its code. For probe's own models that is a ``ModelConfig``; for a wrapped
model it is one of the two configs here:

- ``HFModelConfig``: a transformers RecurrentGemma, Jamba or Falcon-H1 built from a config (no download), wrapped by
  ``probe.wrap_hf``. The config records the whole transformers config it builds (``transformers``), so a checkpoint
  rebuilds the model it was trained as even if probe's small defaults (``HF_ARCHS``) change later.
- ``FactoryModelConfig``: a callable ``package.module:factory`` returning ``(wrapped model, task)``; rebuilding a
  checkpoint calls it again (it must be importable where the checkpoint is read) and loads the weights.

``model_config_from_dict`` reads any of the three from a checkpoint's ``model_config``.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.core.specs import FACTORY_SPEC
from probe.errors import ProbeError
from probe.hf import wrap_hf
from probe.models import HookedSequenceModel, ModelConfig
from probe.tasks import TaskConfig
from probe.wrapped import WrappedModel


def _recurrentgemma(d: int, n_layers: int, n_heads: int, vocab: int) -> dict[str, Any]:
    # Griffin's pattern (recurrent, attention) repeated over n_layers; a window wider than any evaluated sequence, so
    # that its local attention is global here as probe's is; one key/value head (multi-query), as RecurrentGemma has
    return dict(model_type="recurrent_gemma", vocab_size=vocab, hidden_size=d, intermediate_size=3 * d,
                num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=1, lru_width=d,
                attention_window_size=2048, conv1d_width=4,
                block_types=[("recurrent", "attention")[i % 2] for i in range(n_layers)])


def _jamba(d: int, n_layers: int, n_heads: int, vocab: int) -> dict[str, Any]:
    # a Mamba mixer, then attention (period 2, offset 1); one expert, so the MLPs are dense as probe's are
    return dict(model_type="jamba", vocab_size=vocab, hidden_size=d, intermediate_size=4 * d,
                num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_heads,
                attn_layer_period=2, attn_layer_offset=1, num_experts=1, num_experts_per_tok=1,
                expert_layer_period=1, expert_layer_offset=0, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                mamba_dt_rank=max(1, d // 16))


def _falcon_h1(d: int, n_layers: int, n_heads: int, vocab: int) -> dict[str, Any]:
    # every layer has a Mamba-2 mixer beside attention; the mixer's width as its inner width (expand 2), d_head 16
    return dict(model_type="falcon_h1", vocab_size=vocab, hidden_size=d, intermediate_size=4 * d,
                num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_heads,
                head_dim=d // n_heads, mamba_d_ssm=2 * d, mamba_n_heads=2 * d // 16, mamba_d_head=16,
                mamba_d_state=16, mamba_d_conv=4, mamba_n_groups=1, mamba_chunk_size=64)


HF_ARCHS = {"recurrentgemma": _recurrentgemma, "jamba": _jamba, "falcon-h1": _falcon_h1}
"""The transformers hybrids probe trains, by the name its presets use (``hf-recurrentgemma``, ...), each a function of
(width, layers, heads, vocabulary) giving the transformers config: small, CPU-sized, and close to probe's 2-block
hybrid at the same width (one recurrent and one attention module, MLPs 3-4x wide). Fields given in
``HFModelConfig.transformers`` override these."""

_CLASSES = {"recurrent_gemma": "RecurrentGemma", "jamba": "Jamba", "falcon_h1": "FalconH1"}


class WrappedSizes:
    """What analyses and the memory planner read from a model's config, for a model probe did not define."""

    has_attention = True
    has_lstm = True
    rnn = "wrapped"
    pos_encoding = "none"
    max_len = sys.maxsize
    n_heads: int = 1
    d_model: int = 0

    @property
    def mlp_dim(self) -> int:
        return 4 * self.d_model

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class HFModelConfig(WrappedSizes):
    """A transformers hybrid (``arch`` in ``HF_ARCHS``) sized by width, layers and heads, plus any transformers config
    field in ``transformers`` (``--set 'model.transformers={"mamba_d_state": 8}'``). Once made, ``transformers`` holds
    the whole config the model is built from, and that is what a checkpoint records."""

    arch: str = "recurrentgemma"
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 0
    transformers: dict[str, Any] = field(default_factory=dict)
    family: str = "hf"

    def __post_init__(self) -> None:
        if self.arch not in HF_ARCHS:
            raise ProbeError(f"model.arch {self.arch!r}: probe builds {', '.join(HF_ARCHS)}; any other transformers "
                             "model trains through --model package.module:factory")
        if self.d_model % self.n_heads:
            raise ProbeError(f"model.d_model={self.d_model} is not a multiple of model.n_heads={self.n_heads}")
        full = HF_ARCHS[self.arch](self.d_model, self.n_layers, self.n_heads, self.vocab_size) | self.transformers
        object.__setattr__(self, "transformers", full)

    @property
    def name(self) -> str:
        return f"hf-{self.arch}"

    def build(self, task: TaskConfig | None = None) -> Any:
        """The transformers model from ``transformers`` (random weights), wrapped by ``probe.wrap_hf``."""
        try:
            import transformers
        except ImportError:
            raise ProbeError(f"{self.name} needs the transformers library: pip install -e '.[hf]'") from None

        fields = dict(self.transformers)
        model_type = fields.pop("model_type")
        prefix = _CLASSES[model_type]
        config = getattr(transformers, f"{prefix}Config")(**fields)
        model = wrap_hf(getattr(transformers, f"{prefix}ForCausalLM")(config), task=task)
        model.source_config = self  # what its checkpoints record (checkpoint_from_model)
        return model


@dataclass(frozen=True)
class FactoryModelConfig(WrappedSizes):
    """A model made by ``factory`` (``package.module:callable`` returning ``(wrapped model, task)``), called again to
    rebuild a checkpoint: it must be importable there, and build the same architecture. Sizes are read from the
    model when it is first built (``of``)."""

    factory: str = ""
    vocab_size: int = 0
    d_model: int = 0
    n_heads: int = 1
    n_layers: int = 1
    family: str = "factory"

    def __post_init__(self) -> None:
        if not FACTORY_SPEC.match(self.factory):
            raise ProbeError(f"model.factory {self.factory!r}: give package.module:callable")

    @property
    def name(self) -> str:
        return self.factory

    @classmethod
    def of(cls, spec: str) -> tuple[FactoryModelConfig, TaskConfig]:
        """The config of ``spec`` with its model's sizes, and the task the factory names."""
        model, task = call_factory(spec)
        cfg = model.cfg
        return cls(spec, vocab_size=task.vocab_size, d_model=cfg.d_model, n_heads=cfg.n_heads,
                   n_layers=cfg.n_layers), task

    def build(self, task: TaskConfig | None = None) -> Any:
        model, made_for = call_factory(self.factory)
        if model.task is None:
            model.task = task or made_for
        model.source_config = self  # what its checkpoints record (checkpoint_from_model)
        return model


def call_factory(spec: str) -> tuple[Any, TaskConfig]:
    """Import ``package.module`` (the current folder is importable, as for ``python -m``), call the callable and check
    that it returned ``(model, task)``: a wrapped model (or one of probe's) and a ``TaskConfig``. Every failure is one
    line that names the fix."""
    module_name, _, attr = spec.partition(":")
    if not attr or not FACTORY_SPEC.match(spec):
        raise ProbeError(f"{spec}: give MODULE:FACTORY, the importable module and the callable in it that returns "
                         "(probe.wrap(model, ...), task), e.g. my_hybrid:factory for factory() in my_hybrid.py")
    if module_name.endswith(".py"):
        raise ProbeError(f"{spec}: give the module's name, not its file: {module_name[:-3]}:{attr}")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ProbeError(f"{spec}: module {module_name!r} cannot be imported ({e}); run from the folder that holds "
                         "it or put it on PYTHONPATH") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ProbeError(f"{spec}: module {module_name} has no callable {attr!r}")
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], TaskConfig)):
        raise ProbeError(f"{spec}: the factory must return (model, task): a model from probe.wrap and a "
                         f"probe.tasks TaskConfig; it returned {type(made).__name__}")
    model, task = made
    if type(model).__name__ == "TransformerBridge":  # TransformerLens's bridge, wrapped as any analysis takes it
        model = imported(BY_PATH["bridge-wrap"])(model, task)
    if not isinstance(model, WrappedModel) and not hasattr(model, "blocks"):
        raise ProbeError(f"{spec}: the factory's model is a {type(model).__name__}: wrap it with "
                         "probe.wrap(model, attention=[...], recurrent=[...]) first")
    if model.task is None:
        model.task = task
    return model, task


# every config of a model probe did not define is a WrappedSizes: HFModelConfig, FactoryModelConfig, BY_PATH's
AnyModelConfig = ModelConfig | WrappedSizes
_BY_FAMILY: dict[str, type] = {"hf": HFModelConfig, "factory": FactoryModelConfig}
BY_PATH: dict[str, str] = {"bridge": "probe.bridge:BridgeModelConfig", "bridge-wrap": "probe.bridge:wrap"}
"""What ``probe.bridge`` defines (it builds on this module, which cannot import it back), by import path: the config
type of the ``bridge`` model family, read when a preset or a checkpoint names the family, and the wrapper of a
``TransformerBridge`` that a factory returns; imported only when used, as ``transformers`` is."""


def imported(path: str) -> Any:
    """The object ``package.module:name`` names."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def model_config_class(family: str | None) -> type:
    """The config type of a model family: ``HFModelConfig`` for ``hf``, ``FactoryModelConfig`` for ``factory``, the
    class ``BY_PATH`` names for ``bridge``, probe's ``ModelConfig`` for every other."""
    if family == "bridge":
        return imported(BY_PATH[family])
    return _BY_FAMILY.get(family or "", ModelConfig)


def model_config_from_dict(d: dict[str, Any]) -> AnyModelConfig:
    """A model config as a checkpoint recorded it (``to_dict``)."""
    cls = model_config_class(d.get("family"))
    if cls is ModelConfig:
        return ModelConfig.from_dict(d)
    unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ProbeError(f"model config: unknown field(s) {', '.join(sorted(unknown))}")
    return cls(**d)


def build_any(cfg: AnyModelConfig, task: TaskConfig | None = None) -> Any:
    """The model ``cfg`` describes, with fresh weights: probe's own, or a wrapped one."""
    if isinstance(cfg, ModelConfig):
        return HookedSequenceModel(cfg, task=task)
    return cfg.build(task)
