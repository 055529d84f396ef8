"""Attention-gradient interference on the LSTM weights: the g_att / g_rec split, the lookahead and their controls.

Modules: ``decomposition`` (the split), ``lookahead`` (what a step along each part does), ``controls`` (checks a
broken method fails), ``analysis`` (checkpoints and trajectories), ``plots``, ``cli`` (``python -m probe.gradients``).
"""

from probe.gradients.analysis import (
    GRAD_SEED_BASE,
    GradientReport,
    analysis_batch,
    analyze,
    analyze_checkpoint,
    check_family,
    checkpoint_meta,
    default_lengths,
    schedule_gate,
)
from probe.gradients.cli import main
from probe.gradients.controls import (
    builtin_controls,
    control_row,
    known_split_case,
    known_split_error,
    route_disagreement,
)
from probe.gradients.decomposition import (
    Decomposition,
    attention_gates,
    attention_inputs_detached,
    attention_output_detached,
    attention_stream_detached,
    cosine,
    decompose,
    interference,
    lstm_parameters,
    split_losses,
    state_loss,
)
from probe.gradients.lookahead import (
    LookaheadConfig,
    Moments,
    adam_moments,
    measure_lookahead,
    training_batch,
    verdict,
)
from probe.gradients.plots import plot_blocks, plot_lookahead, plot_over_training

__all__ = [
    "GRAD_SEED_BASE", "Decomposition", "GradientReport", "LookaheadConfig", "Moments", "adam_moments",
    "analysis_batch", "analyze", "analyze_checkpoint", "attention_gates", "attention_inputs_detached",
    "attention_output_detached", "attention_stream_detached", "builtin_controls", "check_family", "checkpoint_meta",
    "control_row", "cosine", "decompose", "default_lengths", "interference", "known_split_case", "known_split_error",
    "lstm_parameters", "measure_lookahead", "main", "plot_blocks", "plot_lookahead", "plot_over_training",
    "route_disagreement", "schedule_gate", "split_losses", "state_loss", "training_batch", "verdict",
]
