"""Which inputs and sublayers the answers use: occlusion with path patching, attention reads, sublayer ablation, and
integrated gradients kept only where they converge.

Modules: ``occlusion`` (resample one token, recompute labels, patch paths), ``reads`` (value-weighted attention),
``components`` (zero each sublayer), ``ig`` (per-position IG from a token baseline), ``analysis`` (checkpoints),
``plots``, ``cli`` (``python -m probe.attributions``). Imports point one way: this package uses
``probe.gradients``' checkpoint helpers; ``probe.gradients`` never imports it.
"""

from probe.attributions.analysis import AttributionReport, analyze, analyze_checkpoint
from probe.attributions.cli import main
from probe.attributions.components import component_ablation
from probe.attributions.ig import PositionIG, choose_answers, ig_far, ig_profile, position_ig
from probe.attributions.occlusion import CONDITIONS, Occlusion, corrupt, resample_occlusion
from probe.attributions.plots import plot_components, plot_occlusion, plot_reads
from probe.attributions.reads import read_profile, value_weighted_attention

__all__ = [
    "CONDITIONS", "AttributionReport", "Occlusion", "PositionIG", "analyze", "analyze_checkpoint", "choose_answers",
    "component_ablation", "corrupt", "ig_far", "ig_profile", "main", "plot_components",
    "plot_occlusion", "plot_reads", "position_ig", "read_profile", "resample_occlusion", "value_weighted_attention",
]
