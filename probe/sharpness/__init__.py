"""Softmax sharpness at long lengths: attention mass on the queried key vs length, and logit scales that sharpen it.

``measure`` (per-query mass and gap, ``sharpness_curve``, ``attention_scale``), ``controls`` (the instrument check and
controls), ``report`` (``analyze``: one checkpoint, controls included; ``summary_table``), ``plots``, ``cli``
(``python -m probe.sharpness ckpt.pt``). Imports point one way: measure <- controls <- report <- plots <- cli.
Names are imported on first use.
"""

from probe.core.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["SCALES", "TARGETS", "QueryStats", "attention_hooks", "attention_scale", "mass_rows",
                     "measure_length", "measure_queries", "not_applicable", "query_targets", "recall_head",
                     "reference_mass", "sharpness_curve"], "measure"),
    **dict.fromkeys(["SharpnessResult", "analyze", "summary_table"], "report"),
    **dict.fromkeys(["known_attention_check", "oracle_targets", "placebo_control", "reinit_control",
                     "reinitialised", "sharpness_controls"], "controls"),
    **dict.fromkeys(["plot_mass"], "plots"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
