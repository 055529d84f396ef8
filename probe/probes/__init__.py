"""Linear probes that decode the running sum s_t mod m, their controls, and interventions on the LSTM state.

Usage: ``python -m probe.probes ckpt.pt [more.pt ...] [--hooks ...] [--lengths 25,50,75,100] [--json] [--out DIR]``.
Modules, imported one way: ``targets`` (s_t's control targets) -> ``fit`` (activations, probes) -> ``controls`` and
``interventions`` -> ``analysis`` (one model end to end) -> ``plots`` -> ``cli``.
"""

from probe.probes.analysis import (
    DECODABLE,
    SUBSPACE_SHARE,
    TRAIN_BANDS,
    USED,
    ProbeResult,
    headline,
    probe_model,
    result_rows,
    run_probes,
    summary_table,
    verdict_rows,
)
from probe.probes.cli import build_parser, main
from probe.probes.controls import MARGIN, control_target_rows, shuffled_labels_row
from probe.probes.fit import (
    BANDS,
    HOOK_SUFFIXES,
    Activations,
    band_mask,
    collect_activations,
    default_hooks,
    fit_probe,
    random_init_like,
    readout_basis,
    resolve_hooks,
    state_hook,
)
from probe.probes.interventions import (
    KINDS,
    SAME_SUM_MAX,
    InterchangePair,
    interchange_intervention,
    interchange_pair,
    lstm_states_at,
    patched_logits,
    subspace_interchange,
)
from probe.probes.plots import plot_compare, plot_heatmap, plot_position
from probe.probes.targets import CONTROL_TARGETS, control_labels, control_map, permuted_sum

__all__ = [
    "BANDS", "CONTROL_TARGETS", "DECODABLE", "HOOK_SUFFIXES", "KINDS", "MARGIN", "SAME_SUM_MAX", "SUBSPACE_SHARE",
    "TRAIN_BANDS", "USED", "Activations", "InterchangePair", "ProbeResult", "band_mask", "build_parser",
    "collect_activations", "control_labels", "control_map", "control_target_rows", "default_hooks", "fit_probe",
    "headline", "interchange_intervention", "interchange_pair", "lstm_states_at", "main", "patched_logits",
    "permuted_sum", "plot_compare", "plot_heatmap", "plot_position", "probe_model", "random_init_like",
    "readout_basis", "resolve_hooks", "result_rows", "run_probes", "shuffled_labels_row", "state_hook",
    "subspace_interchange", "summary_table", "verdict_rows",
]
