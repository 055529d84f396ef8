"""Linear probes that decode the running sum s_t mod m (or any target of yours: ``decode.probe_target``), their
controls, and interventions on the recurrent state.

Usage: ``python -m probe.probes ckpt.pt [more.pt ...] [--hooks ...] [--lengths 25,50,75,100] [--json] [--out DIR]``.
Modules, imported one way: ``targets`` (s_t's control targets) -> ``fit`` (activations, probes) -> ``controls`` and
``interventions`` -> ``analysis`` (one model end to end) and ``decode`` (any target, any task) -> ``plots`` ->
``cli``. Names are imported on first use.
"""

from probe.core.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["DECODABLE", "SUBSPACE_SHARE", "TRAIN_BANDS", "USED", "ProbeResult", "headline", "probe_model",
                     "result_rows", "run_probes", "summary_table", "verdict_rows"], "analysis"),
    **dict.fromkeys(["build_parser", "main"], "cli"),
    **dict.fromkeys(["TargetProbe", "bigram_labels", "probe_target", "windowed"], "decode"),
    **dict.fromkeys(["MARGIN", "control_target_rows", "shuffled_labels_row"], "controls"),
    **dict.fromkeys(["BANDS", "HOOK_SUFFIXES", "Activations", "band_mask", "collect_activations", "default_hooks",
                     "fit_probe", "random_init_like", "readout_basis", "resolve_hooks", "slot_block", "state_hook",
                     "state_names"], "fit"),
    **dict.fromkeys(["KINDS", "RANDOM_SUBSPACE_MARGIN", "SAME_SUM_MAX", "InterchangePair", "interchange_intervention",
                     "interchange_pair", "States", "lstm_states_at", "patched_logits", "random_bases",
                     "subspace_interchange"], "interventions"),
    **dict.fromkeys(["plot_compare", "plot_heatmap", "plot_position"], "plots"),
    **dict.fromkeys(["CONTROL_TARGETS", "WINDOWS", "control_labels", "control_map", "permuted_sum",
                     "resolve_windows", "windowed_sum"], "targets"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
