"""Which inputs and sublayers the answers use: occlusion with path patching, attention reads, sublayer ablation, and
integrated gradients kept only where they converge.

Modules: ``occlusion`` (resample one token, recompute labels, patch paths), ``reads`` (value-weighted attention),
``components`` (zero each sublayer), ``ig`` (per-position IG from a token baseline), ``analysis`` (checkpoints),
``plots``, ``cli`` (``python -m probe.attributions``). Shared scaffolding (batches, gates, checkpoint columns, rows)
comes from ``probe.core``; no other analysis package is imported. Names are imported on first use.
"""

from probe.core.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["AttributionReport", "analyze", "analyze_checkpoint"], "analysis"),
    "main": "cli",
    "component_ablation": "components",
    **dict.fromkeys(["PositionIG", "choose_answers", "ig_far", "ig_profile", "position_ig"], "ig"),
    **dict.fromkeys(["CONDITIONS", "Occlusion", "corrupt", "resample_occlusion"], "occlusion"),
    **dict.fromkeys(["plot_components", "plot_occlusion", "plot_reads"], "plots"),
    **dict.fromkeys(["read_profile", "value_weighted_attention"], "reads"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
