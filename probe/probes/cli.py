"""``python -m probe.probes``: parse, run the probe analysis per checkpoint, print tables or one JSON object, save."""

from __future__ import annotations

import argparse
from typing import Any

from probe.cli import (
    add_checkpoints,
    add_common_args,
    add_lengths,
    add_samples,
    add_threads,
    envelope,
    make_parser,
    nonnegative_int,
    positive_int,
    resolve_device,
    run_cli,
    say,
    seed_and_threads,
    write_outputs,
)

HOOK_SUFFIXES = ("hook_attn_out", "hook_resid_post")  # = probe.probes.fit's
CONTROL_TARGETS = ("permuted", "history", "bigram")  # = probe.probes.targets' (a test checks both)
WINDOWS = (3, 10, "L")  # = probe.probes.targets'
RANDOM_SUBSPACES = 3
"""Repeated here so that ``--help`` needs no import of the models."""


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

The recurrent state of a block is what its cell carries, as its hooks: the output lstm.hook_h, then the LSTM's
cell state lstm.hook_c, or the SSM's lstm.hook_state; the GRU's state is lstm.hook_h alone (docs/recurrent.md)."""

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


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("python -m probe.probes", DESCRIPTION, COLUMNS)
    add_checkpoints(parser)
    parser.add_argument("--hooks", nargs="+", default=None,
                        help="hook names or suffixes (lstm.hook_h = every block's, one probe each; a+b = one probe on "
                             "the concatenation); default: every block's recurrent state vectors (h, then c or state), "
                             + ", ".join(HOOK_SUFFIXES) + " that exist, each recurrent block's whole state (h+c), "
                             "every block's h, every block's whole state")
    add_lengths(parser, "1x,2x,3x,4x the checkpoint's L_train")
    add_samples(parser, 48, "test sequences per test length", aliases=["--n-test"])
    parser.add_argument("--n-train", type=positive_int, default=200,
                        help="training sequences of length L_train, every position used (200)")
    parser.add_argument("--n-train-beyond", type=positive_int, default=100,
                        help="held-out sequences of length 3 L_train whose positions t > L_train train the "
                             "beyond-range probes (100)")
    parser.add_argument("--n-patch", type=positive_int, default=48, help="base sequences per patch position (48)")
    parser.add_argument("--control", default="permuted", choices=CONTROL_TARGETS,
                        help="control target: permuted (sum of pi(x_i) mod m, default), history or bigram "
                             "(Hewitt & Liang types)")
    parser.add_argument("--windows", type=window_list, default=list(WINDOWS), metavar="K,K,...",
                        help="windowed-sum control targets: the sum of the last k numbers mod m, probed beside s_t "
                             "for each k (L = the checkpoint's L_train; none = skip; default "
                             + ",".join(map(str, WINDOWS)) + ")")
    parser.add_argument("--random-subspaces", type=nonnegative_int, default=RANDOM_SUBSPACES, metavar="N",
                        help="random subspaces of the same rank as each probe subspace, the baseline of the subspace "
                             f"interchange (0 = skip; default {RANDOM_SUBSPACES})")
    parser.add_argument("--no-patching", action="store_true", help="skip the interventions")
    add_threads(parser)
    add_common_args(parser)
    return parser


def main_body(args: argparse.Namespace) -> dict[str, Any]:
    from probe.checkpoint import load_checkpoint, resolve_checkpoints
    from probe.core.lengths import multiples
    from probe.memory import check_lengths
    from probe.probes.analysis import headline, result_rows, run_probes, summary_table
    from probe.probes.plots import plot_compare, plot_heatmap, plot_position

    seed_and_threads(args)
    device = resolve_device(args.device)
    paths = resolve_checkpoints(args.checkpoints)
    ckpts = [load_checkpoint(path, map_location=device) for path in paths]  # every file checked before any work
    for path, ckpt in zip(paths, ckpts, strict=True):
        L = ckpt.task_config.train_length
        check_lengths(ckpt.model_config, ckpt.task_config, [*(args.lengths or multiples(L)), 3 * L], device,
                      name=str(path))
    results = []
    for path, ckpt in zip(paths, ckpts, strict=True):
        res = run_probes(ckpt, device, lengths=args.lengths, hooks=args.hooks, n_train=args.n_train,
                         n_train_beyond=args.n_train_beyond, n_test=args.samples, n_patch=args.n_patch,
                         seed=args.seed, patching=not args.no_patching, control=args.control,
                         windows=args.windows, random_subspaces=args.random_subspaces, progress=not args.json)
        results.append(res)
        say(args, f"\n{path}  (L_train={res.train_length}; positions t > L_train only; cells: probe trained in range / "
                  f"trained beyond (c = control target, trained beyond))")
        say(args, summary_table(res).to_string())
        if not res.window_targets.empty:
            wt = res.window_targets
            wt = wt[(wt.test_positions == "beyond") & (wt.train_positions == "beyond")]
            say(args, "windowed-sum control targets (trained and tested beyond L_train; s_t = the s_t probe):")
            table = wt.assign(s_t=wt.probe_acc.round(2)).pivot_table(
                index=["hook", "length", "s_t"], columns="control_target", values="control_acc", sort=False)
            say(args, table.to_string(float_format="{:.2f}".format))
        if not res.interventions.empty:
            iv = res.interventions[res.interventions.test_positions != "all"]
            say(args, "interventions (block -1 = every recurrent block; test_positions = band of the later answers):")
            say(args, iv.pivot_table(index=["block", "length", "test_positions"], columns="kind",
                                     values=["iia", "changed_frac"]).to_string(float_format="{:.2f}".format))
            say(args, res.verdicts[["block", "length", "test_positions", "hook", "probe_acc", "iia_full",
                                    "same_sum_changed", "iia_subspace", "verdict"]]
                .to_string(index=False, float_format="{:.2f}".format))
        say(args, "headline: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in headline(res).items() if k != "checkpoint"))
        failed = res.controls[~res.controls.passed.astype(bool)] if "passed" in res.controls else res.controls[:0]
        for _, c in failed.iterrows():
            say(args, f"control FAILED: {c.control}" + "".join(f" {k}={c[k]}" for k in ("hook", "train_positions",
                                                                                     "length", "block")
                                                                  if k in c and c[k] == c[k]))
    rows, controls = [], []
    for res in results:
        r, c = result_rows(res, args.seed)
        rows += r
        controls += c
    out = envelope("probes", [str(p) for p in paths], rows, controls)
    if args.out:
        write_outputs(args.out, out, {"probes_heatmap.png": plot_heatmap(results),
                                      "probes_position.png": plot_position(results),
                                      "probes_compare.png": plot_compare(results)})
        say(args, f"wrote {args.out}/results.json and figures probes_heatmap/position/compare.png")
    return out


def main(argv: list[str] | None = None) -> int:
    return run_cli(build_parser(), main_body, argv)
