"""Attention-gradient interference on the recurrent weights: the g_att / g_rec split, the lookahead and checks.

Modules: ``decomposition`` (the split), ``inputs`` (what both lookaheads start from: sizes, AdamW moments, seeds),
``beyond`` (the lookahead: what a step along each part does beyond the training range), ``lookahead`` (its
first-order predecessor), ``adamstep`` (AdamW's real next update from its saved state, split into parts),
``realstep`` (the lookahead at that real step, beside a random step matched in norm and training-loss projection),
``controls`` (checks a broken method fails), ``analysis`` (checkpoints and trajectories), ``plots``, ``cli``
(``python -m probe.gradients``).
Names are imported on first use, so that the CLI's ``--help`` answers at once.
"""

from probe.core.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["DEFAULT_FACTORS", "GradientReport", "analyze", "analyze_checkpoint", "analyze_model",
                     "check_family", "split_with_checks"],
                    "analysis"),
    **dict.fromkeys(["AdamWState", "RealStep", "adamw_state", "next_update", "update_parts"], "adamstep"),
    "main": "cli",
    **dict.fromkeys(["measure_beyond_range", "update_size", "verdict_beyond"], "beyond"),
    **dict.fromkeys(["builtin_controls", "known_split_case", "known_split_error", "route_disagreement"], "controls"),
    **dict.fromkeys(["Decomposition", "attention_inputs_detached", "attention_output_detached",
                     "attention_stream_detached", "cosine", "decompose", "interference", "lstm_parameters",
                     "split_losses", "state_loss"], "decomposition"),
    **dict.fromkeys(["LookaheadConfig", "Moments", "adam_moments"], "inputs"),
    **dict.fromkeys(["measure_lookahead", "training_batch", "verdict"], "lookahead"),
    **dict.fromkeys(["plot_blocks", "plot_lookahead", "plot_over_training"], "plots"),
    **dict.fromkeys(["RealStepConfig", "RealStepReport", "matched_random", "measure_real_step", "real_step_report"],
                    "realstep"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
