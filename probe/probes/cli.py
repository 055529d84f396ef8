"""``python -m probe.probes``: the options, and a run that probes every checkpoint into one report."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from probe.cli import nonnegative_int, positive_int, resolve_device
from probe.runner import CheckpointOptions, Command, Report, lengths_option, option, samples_option

if TYPE_CHECKING:
    from pathlib import Path

    from probe.probes.analysis import ProbeResult

HOOK_SUFFIXES = ("hook_attn_out", "hook_resid_post")  # = probe.probes.fit's
CONTROL_TARGETS = ("permuted", "history", "bigram")  # = probe.probes.targets' (a test checks both)
WINDOWS = (3, 10, "L")  # = probe.probes.targets'
RANDOM_SUBSPACES = 3
"""Repeated here so that ``--help`` needs no import of the models."""
SIZES = {"factors": (1, 3), "n_train": 100, "n_train_beyond": 50, "n_patch": 32, "windows": ()}
FULL = {"factors": (1, 2, 3, 4), "n_train": 200, "n_train_beyond": 100, "n_patch": 48, "windows": WINDOWS}
"""The default run and the full one (``--full``): lengths (x L_train: in range and the end of the length-generalization
range by default), training and patch sequences, windowed-sum targets. A probe's fit costs in proportion to its
training positions, and each length adds its tests and interventions: the default is about a third of the full
run, and what it leaves out is said in ``--help``."""


def window_list(text: str) -> list[int | str]:
    """``--windows``: a comma list of positive integers and ``L`` (the checkpoint's L_train), or ``none``."""
    if text.strip() == "none":
        return []
    out: list[int | str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "L":
            out.append(part)
        elif part.isdigit() and int(part) >= 1:
            out.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"{text!r}: use a comma list of positive integers and L, e.g. 3,10,L, "
                                             "or none")
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r}: use a comma list of positive integers and L, or none")
    return out

DESCRIPTION = """\
Linear probes that decode the running sum s_t mod m, with controls, and interventions on the recurrent state.

The default run (23 s of CPU on one thread of a 2-core Xeon VM: benchmarks/cli_defaults.py): every probe,
intervention and control below at L_train and 3x, on half the full run's training and patch sequences, without
the windowed-sum targets. --full runs the probes at every length 1x..4x with twice the sequences and the windowed
sums 3,10,L: tighter estimates and the windowed-shortcut check, in about 3x the time.

The recurrent state of a block is what its cell carries, as its hooks: the output lstm.hook_h, then the LSTM's
cell state lstm.hook_c, or the SSM's lstm.hook_state; the GRU's state is lstm.hook_h alone
(docs/guides/recurrent.md)."""

COLUMNS = """Position bands: in = t <= L_train, beyond = t > L_train, all. Length generalization: beyond only.

JSON rows (results): checkpoint, seed, family, schedule, label (the variant), control_target, analysis ("probe" |
"intervention" | "verdict").
Probe rows: scope ("length" | "position"), hook (a+b = one probe on the concatenated hooks), train_positions ("in":
t <= L_train of length-L_train sequences; "beyond": L_train < t <= 3 L_train of held-out length-3 L_train sequences;
"all": both, only for the state hooks the subspace intervention edits), length, test_positions, factor (length
/ L_train), position_lo, position_hi (bucket of scope=position; null for scope=length), n (state positions scored),
probe_acc, control_acc (the same probe fit on the control target: sum of pi(x_i) mod m for a fixed random
non-affine pi with --control permuted), selectivity (probe_acc - control_acc), random_init_acc (same probe on the
architecture with random weights), majority_acc (the training band's majority class), probe_train_acc, converged.
Intervention rows: kind ("full": the whole state (the LSTM's (h, c)) of a source with another s_t; "same_sum": of a
source with the same s_t and another history; "subspace": only the probe's readout subspace of each state vector,
from the full source), block (-1 = every recurrent block at once), length, test_positions (band of the later
answers), n, iia (answers equal to the counterfactual; for same_sum the base's own label), changed_frac (answers
that differ from the unpatched ones), base_follow, unpatched_cf (chance floor of iia), model_acc, iia_correct.
Windowed-sum probe rows (with --windows, after the others): analysis "probe", scope "length", control_target
"window{k}" (k from --windows), the columns of the probe rows above for the same hook and bands, probe_acc the same
s_t probe, and control_acc / selectivity / converged those of a probe of the sum of the last k numbers mod m (queries
skipped; all of them while fewer than k): a hook that decodes a window better than s_t beyond L_train is what a
windowed shortcut looks like. Rows whose control_target is the --control target (default "permuted") are the ones
above, unchanged: filter on control_target.
Intervention kind "subspace_random" (with --random-subspaces N > 0): the subspace interchange through N random
subspaces of each probe subspace's rank (a fixed seed), pooled over the draws (n: the answers of one draw).
Verdict rows: block, length, test_positions, hook / probe_train_positions / probe_acc / control_acc (best probe on
the block's state), iia_full, same_sum_changed, iia_subspace, verdict ("decodable, used" needs the subspace
interchange to move >= 0.5 of the answers and the same-sum source to change <= 0.02 of them; else "... state
used, s_t not isolated" | "... used jointly" | "... not used").
Controls (each with passed and kind: "control" for the control targets, same_sum and random_subspace,
"instrument" for shuffled_labels and identity_patch): control="<target>_target" (per train band, best hook at beyond
positions: selectivity >= 0.2; "window{k}_target" rows carry control_target "window{k}"), "shuffled_labels" (best
in-range hook, labels shuffled: acc < majority + 0.2), "identity_patch" (own state patched back in: nothing
changes), "same_sum" (every recurrent block, per length: changed_frac <= 0.02), "random_subspace" (every recurrent
block, per length, all later answers: iia_subspace - iia_random >= 0.2; with changed_subspace, changed_random,
draws)."""


@dataclass
class ProbeOptions(CheckpointOptions):
    hooks: list[str] | None = option(None, "hook names or suffixes (lstm.hook_h = every block's, one probe each; a+b = "
                                           "one probe on the concatenation); default: every block's recurrent state "
                                           "vectors (h, then c or state), " + ", ".join(HOOK_SUFFIXES) + " that "
                                           "exist, each recurrent block's whole state (h+c), every block's h, every "
                                           "block's whole state", nargs="+", type=str, order=-1)
    lengths: list[int] | None = lengths_option("1x,3x the checkpoint's L_train; 1x..4x with --full; each length adds "
                                               "its probes' tests and interventions")
    samples: int = samples_option(48, "test sequences per test length", aliases=["--n-test"])
    n_train: int | None = option(None, f"training sequences of length L_train, every position used ({SIZES['n_train']}"
                                       f"; {FULL['n_train']} with --full)", type=positive_int)
    n_train_beyond: int | None = option(None, "held-out sequences of length 3 L_train whose positions t > L_train "
                                              f"train the beyond-range probes ({SIZES['n_train_beyond']}; "
                                              f"{FULL['n_train_beyond']} with --full)", type=positive_int)
    n_patch: int | None = option(None, f"base sequences per patch position ({SIZES['n_patch']}; {FULL['n_patch']} "
                                       "with --full)", type=positive_int)
    control: str = option("permuted", "control target: permuted (sum of pi(x_i) mod m, default), history or bigram "
                                      "(Hewitt & Liang types)", choices=CONTROL_TARGETS)
    windows: list[int | str] | None = option(None, "windowed-sum control targets: the sum of the last k numbers mod "
                                             "m, probed beside s_t for each k (L = the checkpoint's L_train): a hook "
                                             "that decodes a window better than s_t beyond L_train shows a windowed "
                                             "shortcut; each k adds a probe per hook and band (default none; "
                                             + ",".join(map(str, WINDOWS)) + " with --full)", type=window_list,
                                             metavar="K,K,...")
    random_subspaces: int = option(RANDOM_SUBSPACES, "random subspaces of the same rank as each probe subspace, the "
                                   f"baseline of the subspace interchange (0 = skip; default {RANDOM_SUBSPACES})",
                                   type=nonnegative_int, metavar="N")
    no_patching: bool = option(False, "skip the interventions")
    full: bool = option(False, "the full run: lengths 1x,2x,3x,4x, 200 + 100 training and 48 patch sequences, "
                               "windowed sums 3,10,L (the flags above override each); about 3x the default run's "
                               "time (benchmarks/cli_defaults.py)")

    def size(self, key: str) -> Any:
        """A size the command line left open: the default run's, or the full run's with ``--full``."""
        given = getattr(self, key, None)
        return given if given is not None else (FULL if self.full else SIZES)[key]


def run(opts: ProbeOptions) -> Report:
    from probe.checkpoint import load_checkpoint, resolve_checkpoints
    from probe.core.lengths import multiples
    from probe.memory import check_lengths
    from probe.probes.analysis import result_rows, run_probes
    from probe.probes.plots import plot_compare, plot_heatmap, plot_position

    device = resolve_device(opts.device)
    paths = resolve_checkpoints(opts.checkpoints)
    ckpts = [load_checkpoint(path, map_location=device) for path in paths]  # every file checked before any work
    for path, ckpt in zip(paths, ckpts, strict=True):
        L = ckpt.task_config.train_length
        check_lengths(ckpt.model_config, ckpt.task_config, [*(opts.lengths or multiples(L, opts.size("factors"))),
                                                            3 * L], device, name=str(path))
    results, text = [], []
    for path, ckpt in zip(paths, ckpts, strict=True):
        lengths = opts.lengths or multiples(ckpt.task_config.train_length, opts.size("factors"))
        res = run_probes(ckpt, device, lengths=lengths, hooks=opts.hooks, n_train=opts.size("n_train"),
                         n_train_beyond=opts.size("n_train_beyond"), n_test=opts.samples, n_patch=opts.size("n_patch"),
                         seed=opts.seed, patching=not opts.no_patching, control=opts.control,
                         windows=list(opts.size("windows")), random_subspaces=opts.random_subspaces,
                         progress=opts.progress)
        results.append(res)
        text.append(_text(path, res))
    rows, controls = [], []
    for res in results:
        r, c = result_rows(res, opts.seed)
        rows += r
        controls += c
    return Report([str(p) for p in paths], rows, controls, "\n".join(text),
                  figures=lambda: {"probes_heatmap.png": plot_heatmap(results),
                                   "probes_position.png": plot_position(results),
                                   "probes_compare.png": plot_compare(results)})


def _text(path: Path, res: ProbeResult) -> str:
    """One checkpoint's tables: probes, windowed-sum targets, interventions and verdicts, headline, failed controls."""
    from probe.core.rows import control_line
    from probe.probes.analysis import headline, summary_table

    if (res.by_length.test_positions == "beyond").any():
        lines = [f"\n{path}  (L_train={res.train_length}; positions t > L_train only; cells: probe trained in range / "
                 f"trained beyond (c = control target, trained beyond))", summary_table(res).to_string()]
    else:  # every length within L_train: the beyond-range table has nothing to show (every row is in the JSON)
        lines = [f"\n{path}  (L_train={res.train_length}): no length beyond L_train, so no table of positions "
                 "t > L_train; give a longer --lengths"]
    if not res.window_targets.empty:
        wt = res.window_targets
        wt = wt[(wt.test_positions == "beyond") & (wt.train_positions == "beyond")]
        lines.append("windowed-sum control targets (trained and tested beyond L_train; s_t = the s_t probe):")
        table = wt.assign(s_t=wt.probe_acc.round(2)).pivot_table(
            index=["hook", "length", "s_t"], columns="control_target", values="control_acc", sort=False)
        lines.append(table.to_string(float_format="{:.2f}".format))
    if not res.interventions.empty:
        iv = res.interventions[res.interventions.test_positions != "all"]
        lines.append("interventions (block -1 = every recurrent block; test_positions = band of the later answers):")
        lines.append(iv.pivot_table(index=["block", "length", "test_positions"], columns="kind",
                                    values=["iia", "changed_frac"]).to_string(float_format="{:.2f}".format))
        lines.append(res.verdicts[["block", "length", "test_positions", "hook", "probe_acc", "iia_full",
                                   "same_sum_changed", "iia_subspace", "verdict"]]
                     .to_string(index=False, float_format="{:.2f}".format))
    lines.append("headline: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in headline(res).items()
                                          if k != "checkpoint" and v is not None))  # no recurrent module: no hook
    failed = res.controls[~res.controls.passed.astype(bool)] if "passed" in res.controls else res.controls[:0]
    if len(failed):
        lines.append(f"controls: {len(res.controls) - len(failed)}/{len(res.controls)} passed; failed (every row is "
                     "in the JSON):")
    lines += [control_line({k: v for k, v in c.items() if not (isinstance(v, float) and v != v)})
              for c in failed.to_dict("records")]
    return "\n".join(lines)


COMMAND = Command("probes", ProbeOptions, run, DESCRIPTION, COLUMNS)
main, build_parser = COMMAND.main, COMMAND.build_parser
