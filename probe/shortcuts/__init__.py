"""Shortcut tests: attention knock-out, sum-preserving perturbation, identity run, positional offset, window test.

One file per test family (``knockout``, ``sums``: sum-preserving, ``runs``: identity run, ``positional``,
``window``), the hand-built models that control them (``oracles``), shared statistics (``common``), everything on one
checkpoint (``report.analyze``), figures (``plots``) and the CLI (``cli``; ``python -m probe.shortcuts ckpt.pt``).
Imports point one way: common <- oracles <- tests <- report <- plots <- cli. Method and results: docs/shortcuts.md.
"""

from probe.shortcuts.common import FLAG_EFFECT, bootstrap_ci, chance, wilson
from probe.shortcuts.knockout import attention_gates, attention_knockout, knockout_configs, knockout_controls
from probe.shortcuts.oracles import forgetful, position_limited, tracker, windowed
from probe.shortcuts.plots import plot_drops, plot_tests, plot_window, report_figures
from probe.shortcuts.positional import (
    FLAG_THRESHOLD,
    Perturbation,
    PositionalResult,
    default_offsets,
    offset_controls,
    pad_stream,
    perturbations,
    perturbed_logits,
    position_controls,
    positional_tests,
)
from probe.shortcuts.report import (
    ShortcutReport,
    analyze,
    drops_table,
    effects_table,
    pooled_rows,
    report_rows,
    summary_table,
)
from probe.shortcuts.runs import check_zero_run, identity_run, identity_run_controls, zero_run
from probe.shortcuts.sums import (
    check_perturbation,
    sum_preserving,
    sum_preserving_controls,
    sum_preserving_perturbation,
)
from probe.shortcuts.window import WindowResult, window_controls, window_test

__all__ = [
    "FLAG_EFFECT", "FLAG_THRESHOLD", "Perturbation", "PositionalResult", "ShortcutReport", "WindowResult", "analyze",
    "attention_gates", "attention_knockout", "bootstrap_ci", "chance", "check_perturbation", "check_zero_run",
    "default_offsets", "drops_table", "forgetful", "identity_run", "identity_run_controls", "knockout_configs",
    "knockout_controls", "offset_controls", "pad_stream", "perturbations", "perturbed_logits", "plot_drops",
    "plot_tests", "plot_window", "pooled_rows", "position_controls", "position_limited", "positional_tests",
    "report_figures", "report_rows", "sum_preserving", "sum_preserving_controls", "sum_preserving_perturbation",
    "summary_table", "effects_table", "tracker", "wilson", "window_controls", "window_test", "windowed", "zero_run",
]
