"""The probe analysis of one model: probes per hook and position band, their controls, interventions, verdicts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from probe.checkpoint import Checkpoint
from probe.core.cells import cell_label, is_recurrent_hook, recurrent_modules
from probe.core.inputs import check_inputs
from probe.core.lengths import multiples
from probe.core.meta import variant_name
from probe.core.progress import note, progress_iter
from probe.core.rows import CONTROL, INSTRUMENT, labelled
from probe.core.seeds import PROBES
from probe.models import HookedSequenceModel
from probe.probes.controls import MARGIN, control_target_rows, pooled, shuffled_labels_row
from probe.probes.fit import (
    BANDS,
    Activations,
    band_mask,
    cell_paths,
    collect_activations,
    converged,
    fit_probe,
    is_state_hook,
    lstm_blocks,
    random_init_like,
    readout_basis,
    resolve_hooks,
    slot_block,
    state_names,
)
from probe.probes.interventions import SAME_SUM_MAX, interchange_intervention
from probe.probes.outputs import output_interchange
from probe.probes.targets import resolve_windows
from probe.tasks import TaskConfig
from probe.wrapped import WrappedModel

TRAIN_BANDS = ("in", "beyond")
"""Every hook's probe is trained twice: on t <= L_train of length-L_train sequences (``in``), and on
L_train < t <= 3 L_train of held-out length-3 L_train sequences (``beyond``). Each vector of a block's recurrent
state (``fit.state_names``: the LSTM's h and c), the vectors that the subspace intervention edits, is also trained on
both together (``all``)."""

DECODABLE = 0.8
"""A state is "decodable" at a block when a probe on its recurrent state reaches this accuracy and beats each control
(control target, random init, majority class) by at least ``MARGIN``."""

USED = 0.5
"""An intervention "moves" the answers when at least this fraction of later answers follow the counterfactual."""

JOINT_MIN = 0.05
"""A block is "used jointly" when patching it alone moves at least this fraction of answers above the chance floor
(a block whose state moves none, like the LSTM preset's block 1, is "not used" even though patching every block
at once moves them all)."""

SUBSPACE_SHARE = 0.5
"""s_t is "isolated" when the probe-subspace interchange moves at least this share of what the whole-state
interchange moves (and the same-sum source changes nothing): the rest of the state then adds little."""


@dataclass
class ProbeResult:
    """Probe accuracies with their controls beside every number, the interventions, verdicts and controls.

    ``by_length``: one row per (hook, train_positions, length, test_positions); ``by_position``: one row per (hook,
    train_positions, length, position bucket); both with ``probe_acc, control_acc, selectivity, random_init_acc,
    majority_acc, n``. ``interventions``: one row per (kind, block, length, test_positions).
    ``verdicts``: one row per (block, length). ``controls``: rows with ``passed``. ``window_targets`` (only with
    ``windows``): one row per (control_target, hook, train_positions, length, test_positions), the columns of
    ``by_length`` with ``control_acc`` / ``selectivity`` those of a probe of the windowed sum ``control_target``.
    """

    checkpoint: str
    train_length: int
    hooks: list[str]
    by_length: pd.DataFrame
    by_position: pd.DataFrame
    interventions: pd.DataFrame
    verdicts: pd.DataFrame
    controls: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    window_targets: pd.DataFrame = field(default_factory=pd.DataFrame)

    def beyond(self, train_positions: str = "in") -> pd.DataFrame:
        """Rows of probes trained on ``train_positions`` and tested on t > L_train."""
        df = self.by_length
        return df[(df.train_positions == train_positions) & (df.test_positions == "beyond")]

    def best_hook(self, contains: str = "", train_positions: str = "in", test_positions: str = "beyond",
                  among: Sequence[str] | None = None) -> str | None:
        """Highest accuracy at ``test_positions`` (pooled over the test lengths) of the probes trained on
        ``train_positions``, among hooks whose name contains ``contains`` (or the hooks ``among``; first in hook
        order on ties)."""
        hooks = [h for h in (self.hooks if among is None else among) if contains in h]
        df = self.by_length
        rows = df[(df.train_positions == train_positions) & (df.test_positions == test_positions) & df.hook.isin(hooks)]
        if rows.empty:
            return None
        acc = {h: pooled(r, ["probe_acc"]).probe_acc for h, r in rows.groupby("hook", sort=False)}
        return max((h for h in hooks if h in acc), key=lambda h: acc[h])


def _summarise(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    out = df.groupby(by, sort=True).agg(
        probe_acc=("probe", "mean"), control_acc=("control", "mean"),
        random_init_acc=("random_init", "mean"), majority_acc=("majority", "mean"), n=("probe", "size"),
    ).reset_index()
    out["selectivity"] = out.probe_acc - out.control_acc
    return out


def _training_data(model: HookedSequenceModel, task: TaskConfig, hooks: Sequence[str], n_in: int, n_beyond: int,
                   seed: int, control: str, control_seed: int, targets: Sequence[str] = ()) -> Activations:
    L = task.train_length
    # The models are causal and have no end marker, so position t of a length-L_train sequence is the last
    # position of a length-t one: every position of L_train-long sequences covers the lengths 1..L_train.
    inside = collect_activations(model, task, [L], n_in, hooks, seed, control, control_seed, targets)
    far = collect_activations(model, task, [3 * L], n_beyond, hooks, seed + 250_000, control, control_seed, targets)
    return Activations.concat([inside, far.select(band_mask(far.position, L, "beyond"))])


def probe_model(
    model: HookedSequenceModel | WrappedModel, task: TaskConfig, lengths: Sequence[int] | None = None,
    hooks: Sequence[str] | None = None, n_train: int = 200, n_train_beyond: int = 100, n_test: int = 48,
    seed: int = 0, patching: bool = True, n_patch: int = 48, control: str = "permuted", name: str = "<model>",
    progress: bool = False, windows: Sequence[int | str] = (), random_subspaces: int = 0,
) -> ProbeResult:
    """Probe every hook for s_t, trained in range and beyond it, tested on ``n_test`` fresh sequences per test length
    (default 1x..4x L_train) by position band, controls beside every number; then intervene on the recurrent state
    (whole state, same-sum source, probe subspace) and give each recurrent block a verdict per length.

    ``windows`` (``targets.WINDOWS`` for the default set; ``"L"`` = L_train): each hook's probe rows are repeated in
    ``window_targets`` beside a probe of the sum of the last k numbers, with a ``window{k}_target`` control.
    ``random_subspaces``: draws of the random-subspace baseline of the subspace interchange. Both are off by default
    so that a caller that prints the result (a notebook) gets the same tables as before they existed.

    A wrapped model: each layer of a named ``nn.LSTM`` / ``nn.GRU``, and each scan state a bridged Mamba / Mamba-2
    mixer exposes (``probe.bridge.ScanState``), is a block of the state interventions; every other named recurrent
    module, and a bridged mixer beside its scan state (an upper bound on what that state moves), gets the
    module-level interchange of its outputs (``probe.probes.outputs``: kinds ``output`` and ``output_same_sum``, no
    verdict)."""
    check_inputs("probe.probes.probe_model", model=model, task=task)
    model.eval()
    L = task.train_length
    window_names = resolve_windows(windows, L)
    lengths = list(lengths) if lengths else multiples(L)
    hooks = resolve_hooks(model, hooks)
    blocks = lstm_blocks(model)
    subspace_hooks = [n for i in blocks for n in state_names(model, i)] if patching else []
    hooks += [h for h in subspace_hooks if h not in hooks]  # the subspace intervention edits these vectors
    rand = random_init_like(model, seed)
    train_seed, test_seed = PROBES + seed * 1_000_000, PROBES + seed * 1_000_000 + 500_000
    note(f"{name}: activations of {len(hooks)} hooks, trained and random-init model", progress)
    train = _training_data(model, task, hooks, n_train, n_train_beyond, train_seed, control, seed, window_names)
    rtrain = _training_data(rand, task, hooks, n_train, n_train_beyond, train_seed, control, seed)
    test = collect_activations(model, task, lengths, n_test, hooks, test_seed, control, seed, window_names)
    rtest = collect_activations(rand, task, lengths, n_test, hooks, test_seed, control, seed)
    width = max(1, L // 5)
    keys = pd.DataFrame({"length": test.length, "position_lo": (test.position - 1) // width * width + 1})
    keys["position_hi"] = keys.position_lo + width - 1
    keys["bucket_band"] = np.where(keys.position_hi <= L, "in", np.where(keys.position_lo > L, "beyond", "all"))
    test_bands = {b: band_mask(test.position, L, b) for b in BANDS}
    by_len, by_pos, by_window, bases = [], [], [], {}
    jobs = [(h, b) for h in hooks for b in TRAIN_BANDS + (("all",) if h in subspace_hooks else ())]
    it: Iterable[tuple[str, str]] = progress_iter(jobs, f"probes {name}", progress)
    for hook, band in it:
        sel = band_mask(train.position, L, band)
        x, y = train.x(hook)[sel], train.labels[sel]
        probe = fit_probe(x, y, seed)
        ctrl = fit_probe(x, train.control[sel], seed)
        rsel = band_mask(rtrain.position, L, band)
        rprobe = fit_probe(rtrain.x(hook)[rsel], rtrain.labels[rsel], seed)
        values, counts = np.unique(y, return_counts=True)
        xt = test.x(hook)
        scored = keys.assign(probe=probe.predict(xt) == test.labels, control=ctrl.predict(xt) == test.control,
                             random_init=rprobe.predict(rtest.x(hook)) == rtest.labels,
                             majority=test.labels == values[counts.argmax()])
        info = {"hook": hook, "train_positions": band, "probe_train_acc": float(probe.score(x, y)),
                "converged": all(converged(p) for p in (probe, ctrl, rprobe))}
        for tb, mask in test_bands.items():
            if mask.any():
                by_len.append(_summarise(scored[mask], ["length"]).assign(test_positions=tb, **info))
        for target in window_names:
            # the same s_t probe, its control column now a probe of the windowed sum: a hook that decodes the
            # window better than s_t beyond L_train is the signature of a windowed shortcut
            wprobe = fit_probe(x, train.targets[target][sel], seed)
            windowed = scored.assign(control=wprobe.predict(xt) == test.targets[target])
            winfo = {**info, "converged": all(converged(p) for p in (probe, wprobe, rprobe))}
            for tb, mask in test_bands.items():
                if mask.any():
                    by_window.append(_summarise(windowed[mask], ["length"])
                                     .assign(test_positions=tb, control_target=target, **winfo))
        by_pos.append(_summarise(scored, ["length", "position_lo", "position_hi", "bucket_band"])
                      .rename(columns={"bucket_band": "test_positions"}).assign(hook=hook, train_positions=band))
        if band == "all":
            bases[hook] = readout_basis(probe)
    order = {h: k for k, h in enumerate(hooks)}
    lead = ["hook", "train_positions", "length", "test_positions"]

    def arrange(df: pd.DataFrame, extra: list[str]) -> pd.DataFrame:
        df = df.assign(_h=df.hook.map(order), _b=df.train_positions.map(BANDS.index),
                       _t=df.test_positions.map(BANDS.index))
        df = df.sort_values(["_h", "_b", "length", *extra, "_t"]).drop(columns=["_h", "_b", "_t"])
        return df[lead + [c for c in df.columns if c not in lead]].reset_index(drop=True)

    by_length = arrange(pd.concat(by_len, ignore_index=True), [])
    by_length.insert(4, "factor", by_length.length / L)
    by_position = arrange(pd.concat(by_pos, ignore_index=True), ["position_lo"])
    controls = control_target_rows(by_length, control)
    window_targets = pd.DataFrame()
    if by_window:
        window_targets = arrange(pd.concat(by_window, ignore_index=True), [])
        window_targets.insert(4, "factor", window_targets.length / L)
        order_t = {t: k for k, t in enumerate(window_names)}
        window_targets = window_targets.sort_values("control_target", key=lambda c: c.map(order_t), kind="stable")
        window_targets = window_targets.reset_index(drop=True)
        for target in window_names:
            rows = window_targets[window_targets.control_target == target]
            controls += [{**r, "control_target": target} for r in control_target_rows(rows, target)]
    in_rows = by_length[(by_length.train_positions == "in") & (by_length.test_positions == "in")]
    best_in = str(in_rows.groupby("hook", sort=False).probe_acc.mean().reindex(hooks).idxmax())
    controls.append(shuffled_labels_row(train, test, best_in, L, seed))
    if patching:
        note(f"{name}: interventions on the recurrent state", progress)
    interventions, ctrl_rows = (interchange_intervention(model, task, lengths, n_patch, seed, bases=bases,
                                                         random_draws=random_subspaces)
                                if patching else (pd.DataFrame(), pd.DataFrame()))
    verdicts = (verdict_rows(interventions, by_length, L, cell_paths(model)) if not interventions.empty
                else pd.DataFrame())
    if patching and isinstance(model, WrappedModel):  # modules whose state cannot be set: their outputs from t on
        outputs, output_ctrl = output_interchange(model, task, lengths, n_patch, seed)
        interventions = pd.concat([interventions, outputs], ignore_index=True)
        ctrl_rows = pd.concat([ctrl_rows, output_ctrl], ignore_index=True)
    result_controls = pd.concat([pd.DataFrame(controls), ctrl_rows], ignore_index=True)
    meta = {"train_positions_n": int(len(train.labels)), "test_positions_n": int(len(test.labels)), "m": task.m,
            "position_bucket": width, "n_train": n_train, "n_train_beyond": n_train_beyond, "n_test": n_test,
            "control_target": control, "subspace_rank": {k: int(v.shape[1]) for k, v in bases.items()},
            # the recurrent modules in the model's own names and cell kinds, for labels (headline)
            "recurrent_modules": [list(m) for m in recurrent_modules(model)]}
    if window_names:
        meta["window_targets"] = window_names
    if patching and random_subspaces:
        meta["random_subspace_draws"] = random_subspaces
    return ProbeResult(name, L, hooks, by_length, by_position, interventions, verdicts, result_controls, meta,
                       window_targets)


def _band_at(length: int, train_length: int) -> str:
    """The positions a length's verdict rests on: beyond L_train where the length has any, else the training range."""
    return "beyond" if length > train_length else "in"


def verdict_rows(interventions: pd.DataFrame, by_length: pd.DataFrame, train_length: int,
                 cells: Sequence[str] = ()) -> pd.DataFrame:
    """Per (recurrent block, length): is s_t decodable from that block's state, and is it what the answers use?

    *decodable*: the best probe on a hook of the block's recurrent sublayer (by default its state vectors and the
    whole state joined: ``lstm.hook_h`` / ``hook_c`` / (h, c) for the LSTM) -- trained in range or beyond it --
    reaches ``DECODABLE`` and beats control-target, random-init and majority accuracy by ``MARGIN``,
    at the length's ``beyond`` positions (``in`` at lengths within L_train). *used*: the whole-state interchange
    moves at least ``USED`` of the later answers to the counterfactual, the probe-subspace interchange at least
    ``SUBSPACE_SHARE`` of that, **and** the same-sum source changes at most ``SAME_SUM_MAX`` of them: the whole
    state alone says that the state is sufficient, not that s_t is the variable used. Otherwise "state used, s_t
    not isolated" (the whole state moves the answers, s_t's subspace does not or the rest of the history also
    does), "used jointly" (the block alone moves some answers, at least ``JOINT_MIN`` above the chance floor, and
    every block together moves at least ``USED``), or "not used". ``cells``: a wrapped model's ``cell_paths``
    (block k is its k-th hooked cell).
    """
    iv = interventions.set_index(["kind", "block", "length", "test_positions"])
    rows = []
    for (block, length), _ in interventions.groupby(["block", "length"], sort=False):
        band = _band_at(int(length), train_length)

        def get(kind: str, column: str, b: int = int(block), band: str = band, length: int = int(length)) -> float:
            key = (kind, b, length, band)
            return float(iv.loc[key, column]) if key in iv.index else float("nan")

        hooks = [h for h in by_length.hook.unique()
                 if (slot_block(h, cells) == block if block >= 0 else is_state_hook(h, cells))]
        sel = by_length[by_length.hook.isin(hooks) & (by_length.length == length) & (by_length.test_positions == band)]
        full, same, sub = get("full", "iia"), get("same_sum", "changed_frac"), get("subspace", "iia")
        used = full >= USED and sub >= SUBSPACE_SHARE * full and same <= SAME_SUM_MAX
        # a block whose own state moves some answers (above the chance floor) while every block together moves most
        jointly = block >= 0 and get("full", "iia", -1) >= USED and full - get("full", "unpatched_cf") >= JOINT_MIN
        usage = ("used" if used else "state used, s_t not isolated" if full >= USED
                 else "used jointly" if jointly else "not used")
        row: dict[str, Any] = {"block": int(block), "length": int(length), "test_positions": band, "iia_full": full,
                               "same_sum_changed": same, "iia_subspace": sub}
        if sel.empty:
            rows.append({**row, "hook": None, "probe_acc": float("nan"), "verdict": "not probed, " + usage})
            continue
        best = sel.loc[sel.probe_acc.idxmax()]
        floor = max(best.random_init_acc, best.control_acc, best.majority_acc)
        decodable = best.probe_acc >= DECODABLE and best.probe_acc - floor >= MARGIN
        rows.append({**row, "hook": best.hook, "probe_train_positions": best.train_positions,
                     "probe_acc": float(best.probe_acc), "control_acc": float(best.control_acc),
                     "verdict": ("decodable, " if decodable else "not decodable, ") + usage})
    return pd.DataFrame(rows)


CONTROL_KINDS = {"shuffled_labels": INSTRUMENT, "identity_patch": INSTRUMENT, "same_sum": CONTROL,
                 "output_same_sum": CONTROL,
                 "random_subspace": CONTROL, "window": CONTROL}
"""Kinds of the probe rows: the control targets (``<target>_target``, every other name; ``window{k}_target``: a
windowed sum) are targets a shortcut-taking model could decode instead, the same-sum interchange a source that would
move a model whose state is more than s_t, and the random subspace a baseline that would move the answers as much
as the probe's subspace if that subspace were nothing special: each could refute the claim (controls); shuffled
labels (a pipeline that leaks labels) and the identity patch (patching machinery) check the method (instrument
checks)."""


def run_probes(ckpt: Checkpoint, device: torch.device | str = "cpu", **kw: Any) -> ProbeResult:
    """``probe_model`` on a checkpoint's model and its own task."""
    check_inputs("probe.probes.run_probes", ckpt=ckpt)
    model = ckpt.build_model(device)
    result = probe_model(model, ckpt.task_config, name=str(ckpt.path or ckpt.name), **kw)
    result.meta.update(family=ckpt.model_config.family, schedule=ckpt.schedule, label=variant_name(ckpt),
                       step=ckpt.step, train_seed=ckpt.seed)
    return result


def headline(result: ProbeResult, factors: Sequence[int] = (2, 3)) -> dict[str, Any]:
    """One flat row at beyond-range positions of each length f x L_train: the best hook and the best hook inside a
    recurrent module (``recurrent_*``; ``cell`` names its kind in the model's terms: ``lstm``, ``gru``, ...; by
    in-range-trained accuracy), each with its in-range-trained and beyond-trained accuracy and the control target's;
    and the whole-state interventions (every recurrent block at once) on the beyond-range answers."""
    out: dict[str, Any] = {"checkpoint": result.checkpoint}
    df = result.by_length
    modules = [tuple(m) for m in result.meta.get("recurrent_modules", [])]
    if not modules:  # a result made before the modules were recorded: probe's own slot name
        modules = [(h.split(".lstm.")[0] + ".lstm", "lstm") for h in result.hooks if ".lstm.hook_" in h]
    recurrent = [h for h in result.hooks if is_recurrent_hook(h, modules)]
    out["cell"] = cell_label(modules)
    for label, among in (("best", result.hooks), ("recurrent", recurrent)):
        hook = result.best_hook(among=among)
        out[f"{label}_hook"] = hook
        if hook is None:
            continue
        for f in factors:
            for band in TRAIN_BANDS:
                r = df[(df.hook == hook) & (df.train_positions == band) & (df.test_positions == "beyond")
                       & (df.length == f * result.train_length)]
                if len(r):
                    out[f"{label}_acc_{band}_{f}x"] = float(r.probe_acc.iloc[0])
                    out[f"{label}_control_{band}_{f}x"] = float(r.control_acc.iloc[0])
    iv = result.interventions
    if not iv.empty:
        iv = iv[(iv.block == iv.block.min()) & (iv.test_positions == "beyond")]  # -1 (all blocks) if several
        for f in factors:
            for kind, col in (("full", "iia"), ("same_sum", "changed_frac"), ("subspace", "iia")):
                r = iv[(iv.kind == kind) & (iv.length == f * result.train_length)]
                if len(r):
                    out[f"{kind}_{col}_{f}x"] = float(r[col].iloc[0])
    return out


def result_rows(result: ProbeResult, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Tidy rows of one result: ``(results, controls)``; each control row has its ``kind`` (``CONTROL_KINDS``)."""
    base = {"checkpoint": result.checkpoint, "seed": seed, "family": result.meta.get("family"),
            "schedule": result.meta.get("schedule"), "label": result.meta.get("label"),
            "control_target": result.meta.get("control_target")}
    rows = [{**base, "analysis": "probe", "scope": "length", "position_lo": None, "position_hi": None, **r}
            for r in result.by_length.to_dict("records")]
    rows += [{**base, "analysis": "probe", "scope": "position", **r} for r in result.by_position.to_dict("records")]
    rows += [{**base, "analysis": "intervention", **r} for r in result.interventions.to_dict("records")]
    rows += [{**base, "analysis": "verdict", **r} for r in result.verdicts.to_dict("records")]
    # last, so that a reader that takes the first matching probe row still gets the control_target of the others
    rows += [{**base, "analysis": "probe", "scope": "length", "position_lo": None, "position_hi": None, **r}
             for r in result.window_targets.to_dict("records")]
    controls = []
    for r in result.controls.to_dict("records"):
        r = {k: v for k, v in r.items() if not (isinstance(v, float) and np.isnan(v))}
        # a column with gaps turns ints into floats in pandas; undo that for the integer fields
        controls.append({**base, **{k: int(v) if k in ("block", "length", "n") else v for k, v in r.items()}})
    return rows, labelled(controls, CONTROL_KINDS, default=CONTROL)


def summary_table(result: ProbeResult) -> pd.DataFrame:
    """Hook x length at beyond-range positions: ``in-trained / beyond-trained (control)`` accuracies, for printing."""
    df = result.by_length[result.by_length.test_positions == "beyond"]
    if df.empty:  # no length beyond L_train: nothing to show here (the in-range rows are in by_length)
        return pd.DataFrame(index=pd.Index(result.hooks, name="hook"))
    wide = df.pivot_table(index=["hook", "length"], columns="train_positions",
                          values=["probe_acc", "control_acc"]).reset_index()
    cell = wide[("probe_acc", "in")].map("{:.2f}".format) + " / " + wide[("probe_acc", "beyond")].map(
        "{:.2f}".format) + " (c " + wide[("control_acc", "beyond")].map("{:.2f}".format) + ")"
    table = pd.DataFrame({"hook": wide["hook"], "length": wide["length"], "cell": cell})
    table = table.pivot(index="hook", columns="length", values="cell").reindex(result.hooks)
    table.columns = [f"L={c}" for c in table.columns]
    return table
