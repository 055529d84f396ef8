"""The blocks of study/docs/gradients.md, probes.md and shortcuts.md: each a function of the committed results only."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

from doc_format import read_envelope, results_dir

Z = 2.0
"""|z| above which a first-order change counts as detected (the lookahead's own threshold)."""

GRADIENT_FILES = ("trajectories_shipped", "final_shipped", "mechanism_joint_seed0", "mechanism_joint_seed1",
                  "mechanism_joint_seed2", "mechanism_joint_seed3", "mechanism_joint_seed4",
                  "mechanism_stopgrad_seed0")
ATTRIBUTION_FILES = ("final_shipped", "final_ig_L25_shipped")


# --- shared helpers --------------------------------------------------------------------------------------------------
@cache
def _load(path: Path) -> dict:
    return read_envelope(path)


def _json(root: Path, *parts: str) -> dict:
    path = results_dir(root).joinpath(*parts)
    if not path.is_file():
        raise SystemExit(f"{path}: missing; rerun the analysis that writes it (study/scripts/analyze_shipped.sh)")
    return _load(path)


def _table(header: Sequence[str], rows: list[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _f(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    text = f"{x:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.000"


def _ci(x: float | None, lo: float | None, hi: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    if lo is None or hi is None:
        return _f(x, digits)
    return f"{_f(x, digits)} [{_f(lo, digits)}, {_f(hi, digits)}]"


def _e(x: float | None) -> str:
    return "–" if x is None else f"{x:.1e}"


def _z(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1f}"


def _reading(z: float | None) -> str:
    """What a first-order change with this z says, at the strength of the evidence."""
    if z is None:
        return "no attention path"
    if z < -Z:
        return "lowers"
    if z > Z:
        return "raises"
    return "no change detected"


def _ranges(steps: Sequence[str], order: Sequence[str]) -> str:
    """Steps as runs of consecutive entries of the run's own snapshot list (`0-1500, 2250`)."""
    if not steps:
        return "none"
    idx = sorted(order.index(s) for s in steps)
    out, start = [], idx[0]
    for a, b in zip(idx, [*idx[1:], None], strict=True):
        if b != a + 1:
            out.append(order[start] if start == a else f"{order[start]}-{order[a]}")
            start = b
    return ", ".join(out)


def _name(ckpt: str) -> str:
    return Path(ckpt).stem.removeprefix("hybrid-") if ckpt.endswith(".pt") and "/" in ckpt else ckpt


# --- study/docs/gradients.md: the lookahead ---------------------------------------------------------------------------
def _gradients(root: Path, name: str) -> dict:
    return _json(root, "gradients", f"{name}.json")


def _step(row: dict) -> str:
    return "last" if str(row["checkpoint"]).endswith("last.pt") else str(row["step"])


def _lookahead(rows: list[dict], ckpt: str, part: str, loss: str, length: float | None) -> dict | None:
    for r in rows:
        if (r["analysis"] == "lookahead" and r["checkpoint"] == ckpt and r["part"] == part and r["loss"] == loss
                and r["length"] == length):
            return r
    return None


def _runs(data: dict) -> dict[str, list[dict]]:
    """The lookahead verdict rows of each run (run folder, schedule, seed) in a gradients JSON, in checkpoint order."""
    runs: dict[str, list[dict]] = {}
    for r in data["results"]:
        if r["analysis"] == "lookahead_verdict":
            runs.setdefault(f"{r['run']}:{r['schedule']}:{r['seed']}", []).append(r)
    return runs


def _lookahead_table(root: Path, run_suffix: str) -> str:
    data = _gradients(root, "trajectories_shipped")
    rows = []
    for v in next(rs for key, rs in _runs(data).items() if key.split(":")[0].endswith(run_suffix)):
        ck = v["checkpoint"]

        def cell(part: str, loss: str, length: float | None, ck: str = ck) -> str:
            r = _lookahead(data["results"], ck, part, loss, length)
            return "—" if r is None or r["z"] is None else f"{r['dL_first']:.1e} ({r['z']:+.1f})"

        if v["verdict"] == "no attention path":
            rows.append([v["step"], _f(v["gate"], 0), "gate 0: `g_att` = 0", "", "", cell("rec", "state", 75.0),
                         cell("full", "state", 75.0), "no attention path"])
            continue
        pre = _lookahead(data["results"], ck, "att", "train", None)
        rows.append([v["step"], _f(v["gate"], 0) + (", preconditioned" if pre and pre["preconditioned"] else ""),
                     cell("att", "train", None), cell("att", "state", 25.0), cell("att", "state", 75.0),
                     cell("rec", "state", 75.0), cell("full", "state", 75.0), _reading(v["z_state_3x_att"])])
    return _table(["step", "gate", "`-g_att`: training loss", "`-g_att`: state, L 25", "`-g_att`: state, L 75",
                   "`-g_rec`: state, L 75", "`-g`: state, L 75", "`-g_att` on the L 75 state loss"], rows)


def gradients_lookahead_joint(root: Path) -> str:
    """First-order change (z) after a step along each part, the shipped joint trajectory."""
    return _lookahead_table(root, "hybrid-joint")


def gradients_lookahead_dat(root: Path) -> str:
    """The same for the shipped DAT trajectory."""
    return _lookahead_table(root, "hybrid-dat")


def gradients_losses(root: Path) -> str:
    """The losses before the step, the z of the training-loss change along each part, and attention's share."""
    data = _gradients(root, "trajectories_shipped")
    rows = []
    for run, vs in _runs(data).items():
        for v in vs:
            if v["verdict"] == "no attention path":
                continue
            ck = v["checkpoint"]
            train = {p: _lookahead(data["results"], ck, p, "train", None) for p in ("att", "rec", "full")}
            s75 = {p: _lookahead(data["results"], ck, p, "state", 75.0) for p in ("att", "full")}
            share = s75["att"]["dL_first"] / s75["full"]["dL_first"] if s75["full"]["dL_first"] else float("nan")
            shown = _reading(v["z_state_3x_att"]) == "lowers" and s75["full"]["dL_first"] < 0
            zs = " / ".join(_z(train[p]["z"]) for p in ("att", "rec", "full"))
            rows.append([Path(run.split(":")[0]).name, v["step"], f"{train['att']['loss_before']:.3g}",
                         f"{s75['att']['loss_before']:.3g}", zs, f"{100 * share:.0f} %" if shown else "—"])
    return _table(["run", "step", "training loss (held-out batches)", "state loss, L 75",
                   "z of the training-loss change along `-g_att` / `-g_rec` / `-g`",
                   "`-g_att`'s share of `-g`'s first-order change of the L 75 state loss (where `-g_att` lowers it)"],
                  rows)


def gradients_verdicts(root: Path) -> str:
    """Every run with a lookahead in study/results/gradients: where a step along -g_att moves the 3x state loss."""
    rows = []
    for name in GRADIENT_FILES:
        data = _gradients(root, name)
        for run, vs in _runs(data).items():
            att = [v for v in vs if v["verdict"] != "no attention path"]
            order = [_step(v) for v in vs]
            by = {k: [v for v in att if _reading(v["z_state_3x_att"]) == k]
                  for k in ("lowers", "no change detected", "raises")}
            zs = [v["z_state_3x_att"] for v in by["no change detected"]]
            z_span = (f" (z {min(zs):+.1f} to {max(zs):+.1f})" if len(zs) > 1 else f" (z {zs[0]:+.1f})" if zs
                      else "")
            pre = sum(bool((_lookahead(data["results"], v["checkpoint"], "att", "train", None) or {})
                           .get("preconditioned")) for v in att)
            train = [_step(v) for v in att if v["z_train_att"] < -Z]
            rows.append([f"`{name}.json`", f"{vs[0]['schedule']} seed {vs[0]['seed']}"
                         + (f" (`{run.split(':')[0]}`)" if not run.startswith("runs/") else ""),
                         len(vs), len(vs) - len(att), pre,
                         f"{len(by['lowers'])}: {_ranges([_step(v) for v in by['lowers']], order)}",
                         f"{len(zs)}: {_ranges([_step(v) for v in by['no change detected']], order)}{z_span}",
                         len(by["raises"]), _ranges(train, order)])
    return _table(["file", "run", "checkpoints", "gate 0", "preconditioned", "3x state loss lowered (z < −2): steps",
                   "no change detected (|z| ≤ 2): steps", "raised (z > 2)", "training loss lowered (z < −2): steps"],
                  rows)


def gradients_positive(root: Path) -> str:
    """Checkpoints where -g_att's first-order change of the 3x state loss is positive, with the other parts' z."""
    rows = []
    for name in GRADIENT_FILES:
        data = _gradients(root, name)
        for vs in _runs(data).values():
            for v in vs:
                z = v["z_state_3x_att"]
                if z is None or z <= 0 or str(v["checkpoint"]).endswith("last.pt"):
                    continue
                ck = v["checkpoint"]
                others = [_lookahead(data["results"], ck, p, "state", 75.0)["z"] for p in ("rec", "full")]
                rows.append([f"`{name}.json`", f"{v['schedule']} seed {v['seed']}", _step(v), _z(z),
                             *[_z(o) for o in others]])
    return _table(["file", "run", "step", "z along `-g_att`", "z along `-g_rec`", "z along `-g`"], rows)


def gradients_final(root: Path) -> str:
    """The final checkpoints, float32, raw gradients."""
    data = _gradients(root, "final_shipped")
    rows = []
    for v in (v for vs in _runs(data).values() for v in vs):
        ck = v["checkpoint"]
        r = _lookahead(data["results"], ck, "att", "state", 75.0)
        rows.append([f"`{ck}`", v["step"], "yes" if r["preconditioned"] else "no (no optimizer state)",
                     f"{r['dL_first']:.1e} ({r['z']:+.1f})", f"{v['dL_train_att']:.1e} ({v['z_train_att']:+.1f})",
                     _reading(v["z_state_3x_att"])])
    return _table(["checkpoint", "step", "preconditioned", "`-g_att`: state, L 75 (z)", "`-g_att`: training loss (z)",
                   "`-g_att` on the L 75 state loss"], rows)


def gradients_cosine(root: Path) -> str:
    """Interference rows (block = all) of the shipped trajectories, L 25 / L 75."""
    data = _gradients(root, "trajectories_shipped")
    inter = [r for r in data["results"] if r["analysis"] == "interference" and r["block"] == "all"]
    rows: dict[tuple[str, int], dict[float, dict]] = {}
    for r in inter:
        rows.setdefault((Path(r["run"]).name, r["step"]), {})[r["length"]] = r
    out = []
    for (run, step), by in rows.items():
        a, b = by[25], by[75]
        if a["gate"] == 0:
            out.append([run, step, "gate 0: `g_att` = 0", "", f"{a['g_norm']:.2f} / {b['g_norm']:.2f}"])
            continue
        out.append([run, step, f"{a['cos_att_rec_state']:+.2f} / {b['cos_att_rec_state']:+.2f}",
                    f"{a['att_ratio']:.2f} / {b['att_ratio']:.2f}", f"{a['g_norm']:.2f} / {b['g_norm']:.2f}"])
    return _table(["run", "step", "cos(`g_att`, `g_rec^state`), L 25 / 75", "\\|g_att\\| / \\|g\\|, L 25 / 75",
                   "\\|g\\|, L 25 / 75"], out)


def gradients_controls(root: Path) -> str:
    """Every control row of results/gradients and results/attributions: how many passed, and the worst value."""
    rows = []
    for folder, names in (("gradients", GRADIENT_FILES), ("attributions", ATTRIBUTION_FILES)):
        for name in names:
            ctrl = _json(root, folder, f"{name}.json")["controls"]
            worst: dict[str, tuple[float, float]] = {}
            for c in ctrl:
                key = c["control"].rsplit("_L", 1)[0] + ("_L*" if "_L" in c["control"] else "")
                v, t = abs(c["value"]), c["threshold"]
                if key not in worst or v > worst[key][0]:
                    worst[key] = (v, t)
            cells = [f"`{k}` {_g(v)} (≤ {_g(t)})" for k, (v, t) in worst.items()]
            kinds = sorted({c.get("kind", "unlabelled") for c in ctrl})
            rows.append([f"`{folder}/{name}.json`", f"{sum(c['passed'] for c in ctrl)} of {len(ctrl)}",
                         ", ".join(kinds), "; ".join(cells)])
    return _table(["file", "passed", "`kind`", "largest value of each check (threshold)"], rows)


def _g(x: float) -> str:
    return "0" if x == 0 else (f"{x:.2g}" if x >= 0.01 else f"{x:.1e}")


# --- study/docs/gradients.md: attributions ----------------------------------------------------------------------------
def _attr(root: Path, name: str = "final_shipped") -> list[dict]:
    return _json(root, "attributions", f"{name}.json")["results"]


def attributions_occlusion(root: Path) -> str:
    """Occlusion with path patching, state answers, near (≤ k back) and far (> k back)."""
    rows = []
    far = [r for r in _attr(root) if r["analysis"] == "occlusion_far"]
    keys = dict.fromkeys((r["checkpoint"], r["length"], r["range"], r["k"]) for r in far)
    for ck, length, rng, k in sorted(keys, key=lambda t: (t[0] != "checkpoints/hybrid-joint.pt", t[1], t[2] != "far")):
        by = {r["condition"]: r for r in far if (r["checkpoint"], r["length"], r["range"]) == (ck, length, rng)}
        t, rec, att = (by[c] for c in ("total", "recurrent_only", "attention_only"))
        both = t["follow"] - rec["follow"] - att["follow"]
        rows.append([f"{_name(ck)}, L {length}", f"{'> ' if rng == 'far' else '≤ '}{k} back",
                     *[_ci(r["follow"], r["follow_ci_low"], r["follow_ci_high"]) for r in (t, rec, att)],
                     _f(both), _f(t["clean_acc"])])
    return _table(["model, length", "resampled number", "total", "recurrent only", "attention only",
                   "needs both (total − the two)", "clean accuracy"], rows)


def attributions_prefix(root: Path) -> str:
    """Resampling a dictionary (prefix) token: the share of state answers that flip."""
    rows = [[f"{_name(r['checkpoint'])}, L {r['length']}", _f(r["flip"]), _f(r["follow"])]
            for r in _attr(root) if r["analysis"] == "occlusion" and r["in_prefix"] and r["condition"] == "total"]
    return _table(["model, length", "state answers that flip", "answers equal to their (unchanged) label"], rows)


def attributions_reads(root: Path) -> str:
    """Value-weighted attention of the state answers: prefix / near / far, per block."""
    reads = [r for r in _attr(root) if r["analysis"] == "reads_far"]
    keys = dict.fromkeys((r["checkpoint"], r["length"]) for r in reads)
    rows = []
    for ck, length in keys:
        cells = []
        for r in sorted((r for r in reads if (r["checkpoint"], r["length"]) == (ck, length)), key=lambda r: r["block"]):
            cells.append(f"{r['prefix']:.2f} / {r['near']:.2f} / {r['far']:.2f}")
        rows.append([f"{_name(ck)}, L {length}", *cells])
    k = reads[0]["k"]
    return _table(["model, length", *[f"block {b}: prefix / near (≤ {k} back) / far" for b in (0, 1)]], rows)


def attributions_components(root: Path) -> str:
    """Zeroing one sublayer: the drop of the correct logit and state accuracy clean → ablated, L 25 / L 75."""
    comp = [r for r in _attr(root) if r["analysis"] == "components" and r["subtask"] == "state"]
    models = list(dict.fromkeys(r["checkpoint"] for r in comp))
    rows = []
    for block in (0, 1):
        for part, label in (("lstm", "LSTM"), ("attn", "attention")):
            cells = []
            for ck in models:
                rs = sorted((r for r in comp if (r["checkpoint"], r["block"], r["component"]) == (ck, block, part)),
                            key=lambda r: r["length"])
                cells.append(" / ".join(f"{r['effect']:.2f}" for r in rs))
                cells.append(" / ".join(f"{r['acc']:.3f} → {r['acc_ablated']:.3f}" for r in rs))
            rows.append([f"block {block} {label}", *cells])
    lengths = sorted({r["length"] for r in comp})
    head = []
    for ck in models:
        head += [f"{_name(ck)}: logit drop", f"{_name(ck)}: state accuracy, clean → zeroed"]
    n = _attr_samples(root)
    return (_table(["sublayer", *head], rows)
            + f"\n\nL {' / '.join(map(str, lengths))}; {n} sequences per length (`--samples`).")


def _attr_samples(root: Path) -> int:
    occ = [r for r in _attr(root) if r["analysis"] == "occlusion"]
    return int(occ[0]["n_sequences"])


def attributions_ig(root: Path) -> str:
    """Integrated gradients: how many answers converged."""
    data = _json(root, "attributions", "final_ig_L25_shipped.json")
    rows = []
    for c in data["controls"]:
        if c["control"].startswith("ig_converged"):
            rows.append([f"{_name(c['checkpoint'])}", c["control"].rsplit("_", 1)[1],
                         f"{c['n_dropped']} of {c['n_answers']}", _f(c["value"]), _f(c["threshold"], 1),
                         "passed" if c["passed"] else "**failed**"])
    return _table(["model", "length", "answers dropped (not converged at the largest step count)", "fraction",
                   "threshold", "`ig_converged`"], rows)


def gradients_knockout(root: Path) -> str:
    """The knock-out of results/shortcuts on the two hybrids, L 25 and 75: state accuracy, drop with its interval."""
    return _knockout_table(root, ("hybrid-joint", "hybrid-dat"), (25, 75))


# --- study/docs/shortcuts.md ------------------------------------------------------------------------------------------
def _shortcuts(root: Path) -> dict:
    return _json(root, "shortcuts", "results.json")


def _knockout_table(root: Path, labels: Sequence[str], lengths: Sequence[int]) -> str:
    res = [r for r in _shortcuts(root)["results"] if r["test"] == "attention_knockout" and r.get("applicable")]
    rows = []
    for label in labels:
        for sub in ("state", "recall"):
            for blocks in ("0", "1", "all"):
                cells = []
                for length in lengths:
                    hit = [r for r in res if (r["label"], r["subtask"], r["blocks"], r["length"])
                           == (label, sub, blocks, length)]
                    if not hit:
                        cells.append("–")
                        continue
                    r = hit[0]
                    cells.append(f"{r['baseline_acc']:.3f} → {r['acc']:.3f}; "
                                 f"{_ci(r['effect'], r['ci_low'], r['ci_high'])}")
                rows.append([label, sub, blocks, *cells])
    n = sorted({r["n_sequences"] for r in res if r["label"] in labels})
    count = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    return (_table(["model", "subtask", "gates at 0", *[f"L {L}: accuracy → knocked out; drop [95 % CI]"
                                                        for L in lengths]], rows)
            + f"\n\n{count} sequences per cell (`--samples`); interval: bootstrap over sequences.")


BLOCKS: dict[str, Callable[[Path], str]] = {
    "gradients-controls": gradients_controls,
    "gradients-lookahead-joint": gradients_lookahead_joint,
    "gradients-lookahead-dat": gradients_lookahead_dat,
    "gradients-losses": gradients_losses,
    "gradients-verdicts": gradients_verdicts,
    "gradients-positive": gradients_positive,
    "gradients-final": gradients_final,
    "gradients-cosine": gradients_cosine,
    "gradients-knockout": gradients_knockout,
    "attributions-occlusion": attributions_occlusion,
    "attributions-prefix": attributions_prefix,
    "attributions-reads": attributions_reads,
    "attributions-components": attributions_components,
    "attributions-ig": attributions_ig,
}


# --- study/docs/probes.md ---------------------------------------------------------------------------------------------
PROBE_ROWS = (("lstm", "blocks.0.lstm.hook_h"), ("transformer", "blocks.1.hook_resid_post"),
              ("hybrid-joint", "blocks.1.lstm.hook_h"), ("hybrid-joint", "blocks.0.lstm.hook_h+blocks.1.lstm.hook_h"),
              ("hybrid-joint", "blocks.0.lstm.hook_h+blocks.0.lstm.hook_c+blocks.1.lstm.hook_h+blocks.1.lstm.hook_c"),
              ("hybrid-joint", "blocks.1.hook_resid_post"), ("hybrid-dat", "blocks.1.lstm.hook_h"))
"""The (preset, hook) rows of the headline table: each preset's informative LSTM hook, the joint hybrid's joined
hooks and final residual, and the Transformer's final residual (it has no recurrent state)."""

PROBE_BUCKETS = ((1, 5), (21, 25), (26, 30), (46, 50), (71, 75), (96, 100))


def _probes(root: Path) -> dict:
    return _json(root, "probes", "results.json")


def _hook(hook: str) -> str:
    names = {"blocks.0.lstm.hook_h+blocks.1.lstm.hook_h": "both blocks' h",
             "blocks.0.lstm.hook_h+blocks.0.lstm.hook_c+blocks.1.lstm.hook_h+blocks.1.lstm.hook_c":
                 "both blocks' h and c"}
    return names.get(hook, f"`{hook}`")


def _probe(rows: list[dict], label: str, hook: str, train: str, length: int, test: str) -> dict | None:
    for r in rows:
        if (r["analysis"] == "probe" and r["scope"] == "length" and r["label"] == label and r["hook"] == hook
                and r["train_positions"] == train and r["length"] == length and r["test_positions"] == test):
            return r
    return None


def _pair(rows: list[dict], label: str, hook: str, train: str, key: str, lengths: Sequence[int] = (50, 75)) -> str:
    cells = [_probe(rows, label, hook, train, L, "beyond") for L in lengths]
    return " / ".join("–" if c is None else f"{c[key]:.2f}" for c in cells)


def _intervention(rows: list[dict], label: str, kind: str, block: int, length: int) -> dict | None:
    test = "in" if length == min(r["length"] for r in rows if r["analysis"] == "intervention") else "beyond"
    for r in rows:
        if (r["analysis"] == "intervention" and r["label"] == label and r["kind"] == kind and r["block"] == block
                and r["length"] == length and r["test_positions"] == test):
            return r
    return None


def _iv(rows: list[dict], label: str, kind: str, block: int, key: str, lengths: Sequence[int],
        digits: int = 2) -> str:
    """One intervention column at each length, joined with " / "."""
    return " / ".join(_f((_intervention(rows, label, kind, block, L) or {}).get(key), digits) for L in lengths)


def _verdict(rows: list[dict], label: str, block: int, length: int) -> str:
    hit = [r for r in rows if r["analysis"] == "verdict" and r["label"] == label and r["block"] == block
           and r["length"] == length]
    return hit[0]["verdict"] if hit else "—"


def probes_table(root: Path) -> str:
    """Beyond-range probe accuracy at L 50 / 75, and the all-block interventions on the answers beyond L_train."""
    rows = _probes(root)["results"]
    out = []
    for label, hook in PROBE_ROWS:
        first = hook == next(h for lab, h in PROBE_ROWS if lab == label)
        cells = [label, _hook(hook), _pair(rows, label, hook, "in", "probe_acc"),
                 _pair(rows, label, hook, "beyond", "probe_acc"), _pair(rows, label, hook, "beyond", "control_acc")]
        has_state = any(r["analysis"] == "intervention" and r["label"] == label for r in rows)
        if first and has_state:
            cells += [_iv(rows, label, "full", -1, "iia", (50, 75)), _iv(rows, label, "subspace", -1, "iia", (50, 75)),
                      _iv(rows, label, "same_sum", -1, "changed_frac", (50, 75), 3),
                      " / ".join(_verdict(rows, label, -1, L) for L in (50, 75))]
        elif first:
            cells += ["—", "—", "—", "— (no recurrent state)"]
        else:
            cells += ["", "", "", ""]
        out.append(cells)
    return _table(["preset", "hook", "trained in range", "trained beyond", "control target", "full IIA",
                   "subspace IIA", "same-sum changed", "verdict, every LSTM block (L 50 / 75)"], out)


def probes_hooks(root: Path) -> str:
    """Every hook of every preset: s_t probe accuracy beyond L_train at L 50 / 75, and the control target."""
    rows = _probes(root)["results"]
    keys = dict.fromkeys((r["label"], r["hook"]) for r in rows if r["analysis"] == "probe" and r["scope"] == "length")
    out = []
    for label, hook in sorted(keys, key=lambda k: (k[0], "+" in k[1], k[1])):
        out.append([label, _hook(hook), _pair(rows, label, hook, "in", "probe_acc"),
                    _pair(rows, label, hook, "beyond", "probe_acc"), _pair(rows, label, hook, "all", "probe_acc"),
                    _pair(rows, label, hook, "beyond", "control_acc"),
                    _pair(rows, label, hook, "beyond", "random_init_acc")])
    return _table(["preset", "hook", "trained in range", "trained beyond", "trained on all positions",
                   "control target (trained beyond)", "random init (trained beyond)"], out)


def probes_position(root: Path) -> str:
    """Probe accuracy by position on length-100 test sequences, for the hooks the prose discusses."""
    rows = [r for r in _probes(root)["results"] if r["analysis"] == "probe" and r["scope"] == "position"
            and r["length"] == max(PROBE_BUCKETS)[1]]
    picks = (("transformer", "blocks.1.hook_resid_post", "in"), ("transformer", "blocks.1.hook_resid_post", "beyond"),
             ("hybrid-joint", "blocks.0.lstm.hook_h+blocks.1.lstm.hook_h", "in"),
             ("hybrid-joint", "blocks.0.lstm.hook_h+blocks.1.lstm.hook_h", "beyond"),
             ("hybrid-joint", "blocks.1.hook_resid_post", "beyond"), ("hybrid-dat", "blocks.1.lstm.hook_h", "in"),
             ("lstm", "blocks.0.lstm.hook_h", "in"))
    out = []
    for label, hook, train in picks:
        cells = []
        for lo, hi in PROBE_BUCKETS:
            hit = [r for r in rows if (r["label"], r["hook"], r["train_positions"], r["position_lo"], r["position_hi"])
                   == (label, hook, train, lo, hi)]
            cells.append(f"{hit[0]['probe_acc']:.2f}" if hit else "–")
        out.append([label, _hook(hook), train, *cells])
    return _table(["preset", "hook", "trained on", *[f"t = {lo}-{hi}" for lo, hi in PROBE_BUCKETS]], out)


def probes_interventions(root: Path) -> str:
    """Interventions per LSTM block (all at once = -1), the later answers (L_train: in range; longer: beyond it)."""
    rows = _probes(root)["results"]
    lengths = sorted({r["length"] for r in rows if r["analysis"] == "intervention"})
    out = []
    for label in dict.fromkeys(r["label"] for r in rows if r["analysis"] == "intervention"):
        for block in sorted({r["block"] for r in rows if r["analysis"] == "intervention" and r["label"] == label},
                            key=lambda b: (b != -1, b)):
            out.append([label, "every block" if block == -1 else f"block {block}",
                        _iv(rows, label, "full", block, "model_acc", lengths),
                        _iv(rows, label, "full", block, "changed_frac", lengths),
                        _iv(rows, label, "full", block, "iia", lengths),
                        _iv(rows, label, "subspace", block, "changed_frac", lengths),
                        _iv(rows, label, "subspace", block, "iia", lengths),
                        _iv(rows, label, "same_sum", block, "changed_frac", lengths, 3),
                        " / ".join(_verdict(rows, label, block, L) for L in lengths)])
    head = " / ".join(map(str, lengths))
    return _table(["preset", "patched", f"model accuracy (L {head})", "full: changed", "full: IIA",
                   "subspace: changed", "subspace: IIA", "same-sum: changed", "verdict"], out)


def probes_controls(root: Path) -> str:
    """The probes' control rows, instrument checks apart from controls."""
    data = _probes(root)
    groups: dict[tuple[str, str], list[dict]] = {}
    for c in data["controls"]:
        groups.setdefault((c.get("kind", "unlabelled"), c["control"]), []).append(c)
    out = []
    for (kind, name), cs in sorted(groups.items()):
        failed = [c for c in cs if not c["passed"]]
        where = "; ".join(_probe_control_where(c) for c in failed) or "—"
        out.append([kind, f"`{name}`", f"{len(cs) - len(failed)} of {len(cs)}", _probe_control_range(name, cs),
                    where])
    fits = [r for r in data["results"] if r["analysis"] == "probe" and r["scope"] == "length"
            and r.get("control_target", "permuted") == "permuted"]
    unconverged = sum(not r["converged"] for r in fits)
    return (_table(["kind", "row", "passed", "values", "failed on"], out)
            + f"\n\nProbe rows whose fits did not all converge: {unconverged} of {len(fits)}.")


def _probe_control_where(c: dict) -> str:
    if c["control"] == "same_sum":
        return f"{c['label']} L {c['length']} (changed {c['changed_frac']:.3f})"
    if c["control"] == "permuted_target" or c["control"].startswith("window"):
        return f"{c['label']} `{c['hook']}` trained {c['train_positions']} (selectivity {c['selectivity']:.2f})"
    if c["control"] == "random_subspace":
        return f"{c['label']} L {c['length']} (IIA {c['iia_subspace']:.2f} vs random {c['iia_random']:.2f})"
    return f"{c['label']}"


def _probe_control_range(name: str, cs: list[dict]) -> str:
    if name == "same_sum":
        v = [c["changed_frac"] for c in cs]
        return f"answers changed {min(v):.3f}-{max(v):.3f}"
    if name == "permuted_target" or name.startswith("window"):
        v = [c["selectivity"] for c in cs]
        return f"selectivity {min(v):.2f}-{max(v):.2f}"
    if name == "random_subspace":
        return (f"IIA, probe subspace {min(c['iia_subspace'] for c in cs):.2f}-"
                f"{max(c['iia_subspace'] for c in cs):.2f}, random {min(c['iia_random'] for c in cs):.2f}-"
                f"{max(c['iia_random'] for c in cs):.2f}")
    if name == "shuffled_labels":
        return (f"accuracy {min(c['acc'] for c in cs):.2f}-{max(c['acc'] for c in cs):.2f} "
                f"(majority {min(c['majority_acc'] for c in cs):.2f}-{max(c['majority_acc'] for c in cs):.2f})")
    if name == "identity_patch":
        return (f"answers changed ≤ {max(c['changed_frac'] for c in cs):.3f}, "
                f"\\|logit diff\\| ≤ {max(c['max_abs_logit_diff'] for c in cs):.1e}")
    return ""


BLOCKS.update({
    "probes-table": probes_table,
    "probes-hooks": probes_hooks,
    "probes-position": probes_position,
    "probes-interventions": probes_interventions,
    "probes-controls": probes_controls,
})


# --- study/docs/shortcuts.md ------------------------------------------------------------------------------------------
PRESETS = ("lstm", "transformer", "hybrid-joint", "hybrid-dat")


def _sc(root: Path, test: str) -> list[dict]:
    return [r for r in _shortcuts(root)["results"] if r["test"] == test]


def _lengths(root: Path) -> list[int]:
    return sorted({r["length"] for r in _sc(root, "attention_knockout")})


def _hit(rows: list[dict], **match: object) -> dict | None:
    hits = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return hits[0] if hits else None


def _effect(r: dict | None) -> str:
    if r is None:
        return "—"
    if not r.get("applicable", True):
        return "N/A"
    return _ci(r["effect"], r["ci_low"], r["ci_high"])


def _train_length(rows: list[dict]) -> int:
    return min(r["length"] for r in rows if r.get("length") is not None)


def shortcuts_tests(root: Path) -> str:
    """The four tests on every shipped checkpoint, effect [95 % CI] by length."""
    lengths = _lengths(root)
    lt = lengths[0]
    ko, sp, ir, off = (_sc(root, t) for t in ("attention_knockout", "sum_preserving", "identity_run", "offset_score"))
    ks = sorted({r["k"] for r in sp})
    rows = []
    for label in PRESETS:
        no_attention = not any(r["label"] == label and r["applicable"] for r in ko)
        for blocks, sub, what in (("all", "state", "knock-out, all gates 0: state drop"),
                                  ("1", "state", "knock-out, block 1 gate 0: state drop"),
                                  ("all", "recall", "knock-out, all gates 0: recall drop")):
            if no_attention:
                if blocks != "1":
                    rows.append([label, what, *["N/A"] * len(lengths)])
                continue
            cells = [_effect(_hit(ko, label=label, blocks=blocks, subtask=sub, length=L)) for L in lengths]
            rows.append([label, what, *cells])
        for k in ks:
            rows.append([label, f"sum-preserving, k = {k:g}: answers changed",
                         *[_effect(_hit(sp, label=label, k=k, length=L)) for L in lengths]])
        for head, what in ((0.0, "opening the stream"), (5.0, "after 5 positions")):
            rows.append([label, f"identity run r = L − {lt} {what}: state drop after it",
                         *["—" if L == lt else _effect(_hit(ir, label=label, head=head, where="after", subtask="state",
                                                             length=L)) for L in lengths]])
        for method, what in (("index", "index shift"), ("pad", "leading zeros")):
            r = _hit(off, label=label, method=method, subtask="all")
            rows.append([label, f"offset score by {what} (at L_train)", _effect(r), *["—"] * (len(lengths) - 1)])
    return _table(["preset", "test (effect [95% CI])", *[f"L {L}" for L in lengths]], rows)


def shortcuts_knockout(root: Path) -> str:
    """Every knock-out: accuracy before → after, and the drop with its interval, by length."""
    return _knockout_table(root, ("hybrid-joint", "hybrid-dat", "transformer"), _lengths(root))


def shortcuts_sums(root: Path) -> str:
    """Sum-preserving perturbation: answers changed, among the right ones, skipped sequences."""
    sp = _sc(root, "sum_preserving")
    lengths = sorted({r["length"] for r in sp})
    rows = []
    for label in PRESETS:
        for k in sorted({r["k"] for r in sp}):
            cells = []
            for L in lengths:
                r = _hit(sp, label=label, k=k, length=L)
                if r is None or not r["applicable"]:
                    cells.append("N/A")
                    continue
                flag = " (flagged)" if r["flagged"] else ""
                cells.append(f"{_effect(r)}{flag}; {_f(r['changed_if_right'])} of the {int(r['n_right'])} right")
            rows.append([label, f"{k:g}", *cells])
    return _table(["preset", "k", *[f"L {L}: changed [95% CI]; changed among the answers that were right"
                                    for L in lengths]], rows)


def shortcuts_runs(root: Path) -> str:
    """Identity runs: accuracy without → with the run, inside it and after it, by run length r."""
    ir = _sc(root, "identity_run")
    runs = sorted({r["run"] for r in ir})
    rows = []
    for label in PRESETS:
        for head in sorted({r["head"] for r in ir}):
            for where, sub in (("inside", "state"), ("after", "state"), ("after", "recall")):
                cells = []
                for run in runs:
                    r = _hit(ir, label=label, head=head, where=where, subtask=sub, run=run)
                    cells.append("—" if r is None else
                                 f"{r['baseline_acc']:.2f} → {r['acc']:.2f} ({_f(r['effect'])})")
                rows.append([label, "opening the stream" if head == 0 else f"after {head:g} positions",
                             f"{sub}, {where}", *cells])
    return _table(["preset", "run starts", "answers", *[f"r = {run:g}: accuracy without → with (drop)"
                                                        for run in runs]], rows)


def shortcuts_offset(root: Path) -> str:
    """Positional offset at L_train: the score per subtask and the state accuracy at each offset."""
    off, sc = _sc(root, "positional_offset"), _sc(root, "offset_score")
    offsets = sorted({r["offset"] for r in off if r.get("offset") is not None})
    rows = []
    for label in PRESETS:
        for method in ("index", "pad"):
            scores = [_hit(sc, label=label, method=method, subtask=s) for s in ("state", "recall", "all")]
            if not scores[0]["applicable"]:
                rows.append([label, method, "N/A", "N/A", "N/A", *["N/A"] * len(offsets)])
                continue
            cells = []
            for k in offsets:
                r = _hit(off, label=label, method=method, subtask="state", offset=k)
                cells.append("—" if r is None else f"{r['baseline_acc']:.2f} → {r['acc']:.2f}")
            flag = " (flagged)" if scores[2]["flagged"] else ""
            rows.append([label, method, _effect(scores[0]), _effect(scores[1]), _effect(scores[2]) + flag, *cells])
    return _table(["preset", "method", "score: state", "score: recall", "score: all",
                   *[f"state accuracy, offset {k:g}" for k in offsets]], rows)


def shortcuts_dependence(root: Path) -> str:
    """Position dependence (not scored): the normalised drop where there is a positional code."""
    pdp = [r for r in _sc(root, "position_dependence") if r["applicable"]]
    rows = [[r["label"], r["perturbation"], r["subtask"], f"{r['baseline_acc']:.2f} → {r['acc']:.2f}",
             _f(r["norm_drop"], 2)] for r in pdp]
    return _table(["preset", "code", "subtask", "accuracy", "normalised drop"], rows)


def shortcuts_window(root: Path) -> str:
    """Window test at L_train: accuracy on the old and new labels, agreement with the old predictions, the score."""
    win, score = _sc(root, "window"), _sc(root, "window_score")
    rows = []
    for label in PRESETS:
        s = _hit(score, label=label)
        for r in sorted((r for r in win if r["label"] == label), key=lambda r: r["k"]):
            rows.append([label, r["k"], _f(r["acc_old"]), _f(r["acc_new"]), _f(r["agree_old"]),
                         _f(r["p_label_same"]), _f(r["retained"])])
        rows.append([label, "score", "", "", "", "", f"{_f(s['effect'])}" + (" (windowed)" if s["windowed"] else "")])
    return _table(["preset", "k", "acc_old", "acc_new", "agree_old", "p_label_same", "retained / window score"], rows)


def shortcuts_heads(root: Path) -> str:
    """Attention diagnostics at L_train, mean over the heads of a layer."""
    heads = [r for r in _sc(root, "head") if r["applicable"]]
    rows = []
    for label in PRESETS:
        for layer in sorted({r["layer"] for r in heads if r["label"] == label}):
            hs = [r for r in heads if r["label"] == label and r["layer"] == layer]

            def mean(key: str, hs: list[dict] = hs) -> float:
                return sum(r[key] for r in hs) / len(hs)

            rows.append([f"{label} L{layer}", f"{mean('pos_share'):.2f}", f"{mean('rel_share'):.2f}",
                         f"{mean('recall_value_mass'):.2f} ({max(r['recall_value_mass'] for r in hs):.2f})",
                         f"{mean('entropy'):.2f} ({hs[0]['uniform_entropy']:.2f})",
                         f"{mean('mean_distance'):.1f} ({hs[0]['uniform_distance']:.1f})"])
    return _table(["model, layer", "pos share", "rel share", "recall value mass (best head)", "entropy (uniform)",
                   "mean distance (uniform)"], rows)


def shortcuts_entropy(root: Path) -> str:
    """Attention versus length: mean distance (mean over heads) and the best head's recall value mass."""
    ent = [r for r in _sc(root, "entropy") if r["applicable"]]
    lengths = sorted({r["length"] for r in ent})
    rows = []
    for label in PRESETS:
        for layer in sorted({r["layer"] for r in ent if r["label"] == label}):
            cells = []
            for L in lengths:
                hs = [r for r in ent if (r["label"], r["layer"], r["length"]) == (label, layer, L)]
                cells.append(f"{sum(r['mean_distance'] for r in hs) / len(hs):.1f} / "
                             f"{max(r['recall_value_mass'] for r in hs):.2f}")
            rows.append([f"{label} L{layer}", *cells])
    return _table(["model, layer", *[f"L {L}: mean distance / best recall value mass" for L in lengths]], rows)


def shortcuts_controls(root: Path) -> str:
    """Every control row of the shipped run, by kind and name, with the checkpoints it ran on."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for c in _shortcuts(root)["controls"]:
        groups.setdefault((c.get("kind", "unlabelled"), c["control"]), []).append(c)
    rows = []
    for (kind, name), cs in sorted(groups.items()):
        where = ", ".join(dict.fromkeys(Path(str(c.get("checkpoint", "—"))).stem for c in cs))
        rows.append([kind, f"`{name}`", f"{sum(c['passed'] for c in cs)} of {len(cs)}", where])
    total = sum(len(cs) for cs in groups.values())
    passed = sum(c["passed"] for cs in groups.values() for c in cs)
    return _table(["kind", "row", "passed", "on"], rows) + f"\n\n{passed} of {total} rows passed."


def shortcuts_runtime(root: Path) -> str:
    """The `run_time` rows: wall seconds of `analyze()` per checkpoint in the shipped run."""
    rows = [[r["label"], f"{r['seconds']:.1f}"] for r in _sc(root, "run_time")]
    return _table(["preset", "wall seconds (`run_time`)"], rows)


BLOCKS.update({
    "shortcuts-tests": shortcuts_tests,
    "shortcuts-knockout": shortcuts_knockout,
    "shortcuts-sums": shortcuts_sums,
    "shortcuts-runs": shortcuts_runs,
    "shortcuts-offset": shortcuts_offset,
    "shortcuts-dependence": shortcuts_dependence,
    "shortcuts-window": shortcuts_window,
    "shortcuts-heads": shortcuts_heads,
    "shortcuts-entropy": shortcuts_entropy,
    "shortcuts-controls": shortcuts_controls,
    "shortcuts-runtime": shortcuts_runtime,
})
