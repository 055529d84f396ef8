"""Shortcut tests: attention knock-out, sum-preserving perturbation, identity run, positional offset, window test.

One file per test family (``knockout``, ``sums``: sum-preserving, ``runs``: identity run, ``positional``,
``window``), the hand-built models that control them (``oracles``), the shared sequences and predictions
(``sampling``), effect rows (``effects``), everything on one checkpoint (``report.analyze``), figures (``plots``) and
the CLI (``cli``; ``python -m probe.shortcuts ckpt.pt``). Imports point one way: sampling, effects <- oracles <-
tests <- report <- plots <- cli; gates, seeds, chance and intervals come from ``probe.core``. Names are imported on
first use.
"""

from probe.core.lazy import lazy_exports

_EXPORTS = {
    "FLAG_EFFECT": "effects",
    **dict.fromkeys(["attention_knockout", "knockout_configs", "knockout_controls"], "knockout"),
    **dict.fromkeys(["forgetful", "position_limited", "tracker", "windowed"], "oracles"),
    **dict.fromkeys(["plot_drops", "plot_tests", "plot_window", "report_figures"], "plots"),
    **dict.fromkeys(["FLAG_THRESHOLD", "Perturbation", "PositionalResult", "default_offsets", "offset_controls",
                     "pad_stream", "perturbations", "perturbed_logits", "position_controls", "positional_tests"],
                    "positional"),
    **dict.fromkeys(["ShortcutReport", "analyze", "drops_table", "effects_table", "pooled_rows", "report_rows",
                     "summary_table"], "report"),
    **dict.fromkeys(["check_zero_run", "identity_run", "identity_run_controls", "zero_run"], "runs"),
    **dict.fromkeys(["check_perturbation", "sum_preserving", "sum_preserving_controls",
                     "sum_preserving_perturbation"], "sums"),
    **dict.fromkeys(["WindowResult", "window_controls", "window_test"], "window"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
