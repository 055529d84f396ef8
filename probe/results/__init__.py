"""The one loader of grid results: a sweep's run folders, or the compact form committed under ``results/``."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import pandas as pd

from probe.cli import tidy
from probe.core.lengths import FACTORS, parse_lengths
from probe.core.stats import SOLVED
from probe.errors import ProbeError
from probe.hardware import trained_as
from probe.training.config import TrainConfig
from probe.training.schedule import Schedule

RUNS, CURVES, TRAINING, WINDOWS = "runs.jsonl", "curves.csv", "training.csv", "windows.csv"
EVAL, METRICS, FINAL, SWEEP = "eval.json", "metrics.jsonl", "final.pt", "sweep.json"
SUBTASKS = ("state", "recall", "all")
_CURVE_COLUMNS = ["variant", "seed", "length", "subtask", "n_tokens", "correct", "seq_acc"]
_WINDOW_COLUMNS = ["variant", "run", "seed", "window", "lo", "hi", "beyond", "subtask", "n_tokens", "right",
                   "token_acc", "seq_acc", "chance"]
"""A grid's windows (the metric of record, ``probe.windows``): one row per run x window x subtask."""
_INT_KEYS = {"seed", "train_length", "steps", "switch_step", "eval_samples"}
_SEED_DIR = re.compile(r"^seed(-?\d+)$")
# Training logs are for plots and thresholds (did the LSTM phase reach 95 % by step S?): 6 significant digits keep
# every such decision and cut the file to a third.
_LOG_DIGITS = 6
# A run summary's floats are written to 6 significant digits too, for the reader of the file; the loader gives back
# the exact values from the counts beside them (``_restore``): 6 digits alone would not keep every threshold (a
# token accuracy c / n within 5e-7 of 0.99 rounds onto it once n > 20 000, and the windows count up to 41 000).
_SUMMARY_DIGITS = 6


@dataclass
class Grid:
    """A grid's runs: ``runs`` (one summary row per run), ``curves`` (one row per run x length x subtask:
    ``variant, run, seed, label, train_length, length, subtask, token_acc, seq_acc, n_tokens, checkpoint``),
    ``training`` (the runs' training logs), ``windows`` (accuracy per window of stream positions, per subtask and
    factor: the metric of record, ``probe.windows``) and, when read from run folders, each run's ``final.pt``."""

    name: str
    runs: pd.DataFrame
    curves: pd.DataFrame
    training: pd.DataFrame = field(default_factory=pd.DataFrame)
    checkpoints: dict[str, Path] = field(default_factory=dict)
    source: str = "compact"
    windows: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=_WINDOW_COLUMNS))

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(self.runs.variant)) if len(self.runs) else []


def is_compact(path: str | Path) -> bool:
    return (Path(path) / RUNS).is_file()


def has_run_folders(path: str | Path) -> bool:
    return any(_SEED_DIR.match(p.parent.name) for p in Path(path).glob(f"*/seed*/{EVAL}"))


def load_grid(path: str | Path, members: list[tuple[str, int]] | None = None,
              config: dict[str, Any] | None = None) -> Grid:
    """Read a grid from ``path``: its run folders (``VARIANT/seedS/eval.json``, with ``final.pt`` where kept) if
    it has any, else its compact files; a JSON file is read as one ``probe.evaluate --json`` envelope.
    ``members`` restricts and orders the runs; ``config`` (a sweep config as in ``sweep.json``) supplies what an
    old run folder does not record (precision, switch)."""
    path = Path(path)
    if path.is_file():
        return _from_envelope(path)
    if not path.is_dir():
        raise ProbeError(f"{path}: no such grid directory")
    if has_run_folders(path):
        grid = _from_run_folders(path, members, config)
        if is_compact(path):  # runs committed earlier and not present as folders here
            grid = merge(_from_compact(path), grid)
    elif is_compact(path):
        grid = _from_compact(path)
    else:
        raise ProbeError(f"{path}: neither run folders (VARIANT/seedS/{EVAL}) nor a compact grid ({RUNS}); "
                         "is this a sweep's --out directory or a results/ grid?")
    if members is not None:
        keep = {f"{v}/seed{s}" for v, s in members}
        order = {f"{v}/seed{s}": i for i, (v, s) in enumerate(members)}
        grid = _subset(grid, keep, order)
    return grid


def load_runs(path: str | Path) -> pd.DataFrame:
    """Per-run summaries of a grid (see the module docstring)."""
    return load_grid(path).runs


def load_curves(path: str | Path) -> pd.DataFrame:
    """Accuracy at every evaluated length of every run of a grid."""
    return load_grid(path).curves


# --- reading run folders -------------------------------------------------------------------------------------------
def _config_meta(config: dict[str, Any] | None, variant: str) -> tuple[Any, Any, Any] | None:
    """(model, task, train) configs of a variant of a sweep config, or None if the config does not name it."""
    if not config:
        return None
    from probe.training.overrides import build_configs

    for v in config.get("variant", []):
        if v.get("name", v.get("preset")) == variant:
            overrides = list(config.get("set", [])) + list(v.get("set", []))
            steps = v.get("steps", config.get("steps"))
            try:
                return build_configs(v["preset"], v.get("task", config.get("task", "interleaved")), overrides,
                                     steps=steps)
            except ProbeError:
                return None
    return None


def _train_meta(train: Any, log: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps, precision, optimizer and the schedule's name and switch step of a ``TrainConfig`` (or its dict, as a
    checkpoint stores it). The switch is the step attention came on: the logged one of an adaptive schedule, else
    the configured one; None when attention is on and training from step 0."""
    if train is None:
        return {}
    if isinstance(train, dict):
        try:
            train = TrainConfig.from_dict(train)
        except (TypeError, ValueError, ProbeError):
            return {k: train.get(k) for k in ("steps", "precision", "optimizer_impl")}
    meta: dict[str, Any] = {"steps": train.steps, "precision": train.precision,
                            "optimizer_impl": train.optimizer_impl, "schedule": None, "switch_step": None}
    try:
        sched = Schedule(train.schedule, train.steps)
        meta["schedule"] = train.schedule.name
        if not (sched.gate(0) > 0 and sched.attention_trains(0)):
            meta["switch_step"] = int(sched.effective_switch)
    except ProbeError:
        pass
    event = next((r["step"] for r in log if r.get("event") == "attention switched on"), None)
    if event is not None:
        meta["switch_step"] = int(event)
    return meta


def _wall_s(log: list[dict[str, Any]]) -> float | None:
    """Training time from the log. A resumed run's times continue from the time its checkpoint recorded (the whole run,
    the stretch before the interrupt included); a run resumed before that was recorded restarted its clock, so each
    stretch's last time is summed."""
    times = [r["elapsed_s"] for r in log if "elapsed_s" in r]
    if not times:
        return None
    total, last = 0.0, 0.0
    for t in times:
        if t < last:
            total += last
        last = t
    return round(total + last, 1)


def _read_log(folder: Path) -> list[dict[str, Any]]:
    path = folder / METRICS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_summary(variant: str, seed: int, curve: pd.DataFrame, scores: dict[str, float],
                meta: dict[str, Any]) -> dict[str, Any]:
    """The per-run summary: ``meta`` plus accuracies at each evaluated multiple of L_train and the scores."""
    lt = int(meta["train_length"])
    row: dict[str, Any] = {"variant": variant, "seed": int(seed), "run": f"{variant}/seed{seed}", **meta}
    lengths = sorted(int(n) for n in curve.length.unique())
    row["eval_lengths"] = lengths_spec(lengths)
    # and the state answers modulo each factor of m where the evaluation had them (probe.evaluate --factors)
    factor_rows = sorted((s for s in curve.subtask.unique() if str(s).startswith("state_mod")),
                         key=lambda s: int(s[len("state_mod"):]))
    for subtask in (*SUBTASKS, *factor_rows):
        part = curve[curve.subtask == subtask].set_index("length")
        if part.empty:
            continue
        for f in FACTORS:
            if f * lt in part.index:
                row[f"{subtask}_acc_{f}x"] = _num(part.token_acc[f * lt])
                row[f"{subtask}_seq_acc_{f}x"] = _num(part.seq_acc[f * lt])
        if subtask in scores:
            row[f"{subtask}_score"] = _num(scores[subtask])
    return row


def _num(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def read_run_folder(folder: Path, variant: str, seed: int,
                    config: dict[str, Any] | None = None) -> tuple[dict[str, Any], pd.DataFrame, list[dict]]:
    """One run folder's summary, curve and training log. Its configs come from ``final.pt`` when there, else
    from ``config`` (the sweep's), else from what ``eval.json`` records."""
    env = json.loads((folder / EVAL).read_text())
    rows = env["results"]
    curve = pd.DataFrame([r for r in rows if r.get("length") is not None])
    scores = {r["subtask"]: r["token_acc"] for r in rows if r.get("metric") == "lengthgen_score"}
    log = _read_log(folder)
    train: Any = None
    train_length = None
    used = None  # the precision the run trained in (``auto`` resolved), where its checkpoint records it
    trained_on = None  # the device it trained on: its checkpoint's record, else its log's first line
    if (folder / FINAL).exists():
        from probe.checkpoint import load_checkpoint

        ckpt = load_checkpoint(folder / FINAL)
        train, train_length = dict(ckpt.train_config or {}), ckpt.task_config.train_length
        used, trained_on = trained_as(ckpt.extra)
    else:
        built = _config_meta(config, variant)
        if built is not None:
            train, train_length = built[2], built[1].train_length
    if train_length is None:
        train_length = int(curve.train_length.iloc[0]) if "train_length" in curve else int(curve.length.max()) // 4
    tm = _train_meta(train, log)
    first = rows[0] if rows else {}
    meta = {"label": first.get("label"), "train_length": int(train_length),
            "steps": int(log[-1]["step"]) if log else tm.get("steps"), "wall_s": _wall_s(log),
            "precision": used or tm.get("precision", first.get("precision")),
            "optimizer_impl": tm.get("optimizer_impl", first.get("optimizer_impl")),
            "schedule": tm.get("schedule"), "switch_step": tm.get("switch_step"), "eval_samples": _eval_samples(curve),
            "trained_on": trained_on or _logged_device(folder)}
    curve = curve.assign(variant=variant, seed=int(seed))
    # the evaluation lines only (each carries the loss): a gradient policy's per-step lines (the placebo's norms,
    # one a step) would make training.csv thousands of lines a run; they stay in the run folder's metrics.jsonl
    training = [{"variant": variant, "seed": int(seed), **r} for r in log if "loss" in r]
    return run_summary(variant, seed, curve, scores, meta), curve, training


_LOG_DEVICE = re.compile(r"^=== .* pid \d+ on (\S+?):")


def _logged_device(folder: Path) -> str | None:
    """The device a sweep's worker ran the run on, from the first line ``probe.sweep`` writes to its train.log
    (``=== DATE RUN (new) pid N on cpu: COMMAND``); None when there is no such line."""
    log = folder / "train.log"
    if not log.exists():
        return None
    with open(log, errors="replace") as f:
        m = _LOG_DEVICE.match(f.readline())
    return m.group(1) if m else None


def read_run_windows(folder: Path, variant: str, seed: int) -> pd.DataFrame:
    """The window rows (``metric`` "window") of a run folder's eval.json, in ``Grid.windows``' columns (empty when
    the evaluation predates the windows)."""
    rows = [r for r in json.loads((folder / EVAL).read_text())["results"] if r.get("metric") == "window"]
    return _tidy_windows(pd.DataFrame(rows).assign(variant=variant, seed=int(seed)) if rows else pd.DataFrame())


def _tidy_windows(w: pd.DataFrame) -> pd.DataFrame:
    if w.empty:
        return pd.DataFrame(columns=_WINDOW_COLUMNS)
    w = w.assign(run=w.variant + "/seed" + w.seed.astype(int).astype(str), seed=w.seed.astype(int),
                 n_tokens=w.n_tokens.astype(int), lo=w.lo.astype(int), hi=w.hi.astype(int),
                 beyond=w.beyond.astype(bool))
    if "right" not in w:
        # right / asked was rounded once; rounding back recovers the integer exactly (asked < 2^52)
        w["right"] = [round(a * n) if n and math.isfinite(a) else 0
                      for a, n in zip(w.token_acc.astype(float), w.n_tokens, strict=True)]
    w["token_acc"] = [r / n if n else math.nan for r, n in zip(w.right, w.n_tokens, strict=True)]
    return w[_WINDOW_COLUMNS].reset_index(drop=True)


def window_columns(windows: pd.DataFrame) -> dict[str, dict[str, float | None]]:
    """Per run: ``{subtask}_win_{lo}x_{hi}x`` (token accuracy at positions in (lo, hi] x L_train), the columns a
    run's summary carries for each window."""
    from probe.windows import window_key

    out: dict[str, dict[str, float | None]] = {}
    for r in windows.itertuples(index=False):
        out.setdefault(r.run, {})[f"{r.subtask}_win_{window_key(r.window)}"] = _num(r.token_acc)
    return out


def _eval_samples(curve: pd.DataFrame) -> int | None:
    """Sequences per length, which an evaluation file does not record: at length 1 every sequence of the tasks
    here holds exactly one answer, so it is the answer count there (None if length 1 was not evaluated)."""
    part = curve[(curve.subtask == "all") & (curve.length == 1)]
    return int(part.n_tokens.iloc[0]) if len(part) else None


def _from_run_folders(path: Path, members: list[tuple[str, int]] | None,
                      config: dict[str, Any] | None) -> Grid:
    if config is None and (path / SWEEP).exists():
        config = json.loads((path / SWEEP).read_text()).get("config")
    found = []
    for ev in sorted(path.glob(f"*/seed*/{EVAL}")):
        m = _SEED_DIR.match(ev.parent.name)
        if m:
            found.append((ev.parent.parent.name, int(m.group(1))))
    if members is not None:
        found = [vs for vs in members if vs in set(found)]
    elif config:  # the config's variant order, not the alphabet's
        names = [v.get("name", v.get("preset")) for v in config.get("variant", [])]
        found.sort(key=lambda vs: (names.index(vs[0]) if vs[0] in names else len(names), vs[0], vs[1]))
    summaries, curves, training, checkpoints, windows = [], [], [], {}, []
    for variant, seed in found:
        folder = path / variant / f"seed{seed}"
        summary, curve, log = read_run_folder(folder, variant, seed, config)
        w = read_run_windows(folder, variant, seed)
        summary.update(window_columns(w).get(summary["run"], {}))
        summaries.append(summary)
        curves.append(curve)
        windows.append(w)
        training += log
        if (folder / FINAL).exists():
            checkpoints[summary["run"]] = folder / FINAL
    name = config.get("name", path.name) if config else path.name
    grid = _grid(name, summaries, curves, training, checkpoints, "runs")
    grid.windows = _concat_windows(windows)
    return grid


def _concat_windows(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=_WINDOW_COLUMNS)


def _grid(name: str, summaries: list[dict], curves: list[pd.DataFrame], training: list[dict],
          checkpoints: dict[str, Path], source: str) -> Grid:
    runs = pd.DataFrame(summaries)
    curve = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(columns=_CURVE_COLUMNS)
    return Grid(name, runs, _tidy_curves(curve, runs), pd.DataFrame(training), checkpoints, source)


def _tidy_curves(curve: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """The curves' columns, whatever the source, with each run's label and training length."""
    if curve.empty:
        return pd.DataFrame(columns=["variant", "run", "seed", "label", "train_length", "length", "subtask",
                                     "token_acc", "seq_acc", "n_tokens", "checkpoint"])
    meta = runs.set_index("run")[["label", "train_length"]] if len(runs) else None
    out = curve.drop(columns=[c for c in ("label", "train_length", "checkpoint", "run", "precision",
                                          "optimizer_impl", "correct", "metric") if c in curve])
    out = out.assign(run=out.variant + "/seed" + out.seed.astype(int).astype(str), seed=out.seed.astype(int),
                     length=out.length.astype(int), n_tokens=out.n_tokens.astype(int))
    out = out.join(meta, on="run")
    out["checkpoint"] = out.run + "/" + FINAL
    cols = ["variant", "run", "seed", "label", "train_length", "length", "subtask", "token_acc", "seq_acc",
            "n_tokens", "checkpoint"]
    return out[cols].reset_index(drop=True)


def _from_envelope(path: Path) -> Grid:
    """A ``probe.evaluate --json`` file over ``.../VARIANT/seedS/final.pt`` checkpoints (the reproduction's
    ``evaluate.json``); variant = the folder above ``seedS``. ``runs.json`` beside it adds steps and wall time."""
    try:
        env = json.loads(path.read_text())
        rows = env["results"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ProbeError(f"{path}: not a probe.evaluate --json envelope") from None
    times = {}
    if (path.parent / "runs.json").exists():
        for r in json.loads((path.parent / "runs.json").read_text()):
            times[str(Path(r["run"]))] = r
    frame = pd.DataFrame(rows)
    summaries, curves = [], []
    for ckpt, part in frame.groupby("checkpoint", sort=False):
        folder = Path(ckpt).parent
        variant, seed = folder.parent.name, int(_SEED_DIR.match(folder.name).group(1))
        curve = part[part.length.notna()].assign(variant=variant, seed=seed)
        scores = {r.subtask: r.token_acc for r in part[part.get("metric") == "lengthgen_score"].itertuples()}
        t = times.get(str(folder), {})
        meta = {"label": part.label.iloc[0], "train_length": int(curve.length.max()) // 4,
                "steps": t.get("steps"), "wall_s": t.get("wall_s"), "precision": None, "optimizer_impl": None,
                "schedule": None, "switch_step": None, "eval_samples": _eval_samples(curve)}
        summaries.append(run_summary(variant, seed, curve, scores, meta))
        curves.append(curve)
    return _grid(path.parent.name, summaries, curves, [], {}, "envelope")


# --- the compact form ----------------------------------------------------------------------------------------------
def _from_compact(path: Path) -> Grid:
    summaries = [json.loads(line) for line in (path / RUNS).read_text().splitlines() if line.strip()]
    curve = _read_curves(path / CURVES) if (path / CURVES).exists() else pd.DataFrame(columns=_CURVE_COLUMNS)
    training = pd.read_csv(path / TRAINING) if (path / TRAINING).exists() else pd.DataFrame()
    name = path.name
    if (path / SWEEP).exists():
        name = json.loads((path / SWEEP).read_text()).get("config", {}).get("name", name)
    windows = pd.DataFrame(columns=_WINDOW_COLUMNS)
    if (path / WINDOWS).exists():
        windows = _tidy_windows(pd.read_csv(path / WINDOWS, dtype={"variant": str}, converters={"seq_acc": _seq_value}))
    runs = pd.DataFrame(summaries)
    curves = _tidy_curves(curve, runs)
    runs = pd.DataFrame(_restore(summaries, curves, windows))
    return Grid(name, runs, curves, training, {}, "compact", windows)


def _significant(x: Any, digits: int) -> Any:
    """A finite float to ``digits`` significant digits; anything else as it is."""
    return float(f"{x:.{digits}g}") if isinstance(x, float) and math.isfinite(x) else x


def _score(curve: pd.DataFrame, train_length: int, factor: int = 3) -> dict[str, float]:
    """``probe.evaluate.lengthgen_score`` (which imports torch), the same computation on the same rows."""
    beyond = curve[(curve.length > train_length) & (curve.length <= factor * train_length)]
    return {s: float(g.token_acc.mean()) for s, g in beyond.groupby("subtask")}


def _restore(summaries: list[dict[str, Any]], curves: pd.DataFrame, windows: pd.DataFrame) -> list[dict[str, Any]]:
    """The run summaries with each float that the counts beside it give (its accuracies at the multiples of L_train
    and its scores from ``curves``, its window accuracies from ``windows``) back as the exact value it was rounded
    from. A value is replaced only where it is that value to ``_SUMMARY_DIGITS``: one written by hand stays."""
    per_window = window_columns(windows) if len(windows) else {}
    per_run = dict(tuple(curves.groupby("run", sort=False))) if len(curves) else {}
    out = []
    for s in summaries:
        exact: dict[str, Any] = dict(per_window.get(s.get("run"), {}))
        curve = per_run.get(s.get("run"))
        if curve is not None and s.get("train_length") is not None:
            lt = int(s["train_length"])
            exact.update(run_summary(s["variant"], s["seed"], curve, _score(curve, lt), {"train_length": lt}))
        out.append({k: exact[k] if isinstance(v, float) and isinstance(exact.get(k), float)
                    and _significant(exact[k], _SUMMARY_DIGITS) == v else v for k, v in s.items()})
    return out


def _read_curves(path: Path) -> pd.DataFrame:
    """``curves.csv`` back in long form (one row per run x length x subtask), token accuracy as the exact float the
    evaluation computed: right / asked, both integers."""
    header = pd.read_csv(path, nrows=0).columns
    # pandas parses floats round-trip exactly; a share of sequences may be written as a fraction (_seq_text)
    wide = pd.read_csv(path, dtype={"variant": str},
                       converters={c: _seq_value for c in header if c.endswith("_seq")})
    subtasks = [c[:-len("_seq")] for c in wide.columns if c.endswith("_seq")]  # every subtask has its share
    for t in subtasks:
        for col in ("n", "correct"):
            sources = _sum_of(t, col)
            if f"{t}_{col}" not in wide and sources and all(c in wide for c in sources):
                wide[f"{t}_{col}"] = sum(wide[c] for c in sources)  # a column the writer left out (_sum_of)
    frames = []
    for t in subtasks:
        part = wide[["variant", "seed", "length", f"{t}_n", f"{t}_correct", f"{t}_seq"]].dropna(subset=[f"{t}_n"])
        part = part.rename(columns={f"{t}_n": "n_tokens", f"{t}_correct": "correct", f"{t}_seq": "seq_acc"})
        frames.append(part.assign(subtask=t, n_tokens=part.n_tokens.astype(int), correct=part.correct.astype(int)))
    long = pd.concat(frames).sort_index(kind="stable") if frames else pd.DataFrame(columns=_CURVE_COLUMNS)
    long["token_acc"] = [c / n if n else math.nan for c, n in zip(long.correct, long.n_tokens, strict=True)]
    return long.reset_index(drop=True)


def _subset(grid: Grid, keep: set[str], order: dict[str, int] | None = None) -> Grid:
    runs = grid.runs[grid.runs.run.isin(keep)]
    if order:
        runs = runs.assign(_o=runs.run.map(order)).sort_values("_o").drop(columns="_o")
    curves = grid.curves[grid.curves.run.isin(keep)]
    training = grid.training
    if len(training):
        key = training.variant + "/seed" + training.seed.astype(int).astype(str)
        training = training[key.isin(keep)]
    return Grid(grid.name, runs.reset_index(drop=True), curves.reset_index(drop=True),
                training.reset_index(drop=True), {k: v for k, v in grid.checkpoints.items() if k in keep},
                grid.source, grid.windows[grid.windows.run.isin(keep)].reset_index(drop=True))


def merge(old: Grid, new: Grid) -> Grid:
    """``old``'s runs with ``new``'s added; a run in both is ``new``'s. Variants keep their first order."""
    replaced = set(new.runs.run) if len(new.runs) else set()
    kept = set(old.runs.run) - replaced if len(old.runs) else set()
    old = _subset(old, kept)
    runs = pd.concat([old.runs, new.runs], ignore_index=True)
    order = list(dict.fromkeys(runs.variant))
    runs = runs.assign(_v=runs.variant.map(order.index)).sort_values(["_v", "seed"], kind="stable")
    runs = runs.drop(columns="_v").reset_index(drop=True)
    curves = pd.concat([old.curves, new.curves], ignore_index=True)
    training = pd.concat([t for t in (old.training, new.training) if len(t)], ignore_index=True) \
        if len(old.training) or len(new.training) else pd.DataFrame()
    return Grid(new.name, runs, curves, training, {**old.checkpoints, **new.checkpoints}, new.source,
                _concat_windows([old.windows, new.windows]))


def _sum_of(subtask: str, col: str) -> tuple[str, ...]:
    """The curves.csv columns whose sum a column of ``subtask`` is, where the task makes it so: the answers of "all"
    are the state's and the recall's together, and the state modulo a factor of m is asked where the state is.
    ``write_grid`` leaves such a column out when the sum holds on every row of the grid."""
    if col not in ("n", "correct"):
        return ()
    if subtask == "all":
        return (f"state_{col}", f"recall_{col}")
    if subtask.startswith("state_mod") and col == "n":
        return ("state_n",)
    return ()


def _curves_text(c: pd.DataFrame) -> str:
    """``curves.csv``: one line per run x length, the subtasks side by side (half the size of one line per
    subtask), less the columns that are the sum of others on every line (``_sum_of``)."""
    key = ["variant", "seed", "length"]
    if c.empty:
        return ",".join(key) + "\n"
    subtasks = list(dict.fromkeys(c.subtask))
    c = c.drop_duplicates([*key, "subtask"], keep="last")
    lines = c[key].drop_duplicates().reset_index(drop=True)
    lines = lines.assign(seed=lines.seed.astype(int), length=lines.length.astype(int))
    n = c.n_tokens.astype(int)
    acc = c.token_acc.astype(float)
    # right / asked was rounded once; rounding back recovers the integer exactly (asked < 2^52)
    c = c.assign(seed=c.seed.astype(int), length=c.length.astype(int), n=n,
                 correct=[round(a * k) if k and math.isfinite(a) else 0 for a, k in zip(acc, n, strict=True)],
                 seq=c.seq_acc.map(_seq_text))
    columns: dict[str, pd.Series] = {}
    for t in subtasks:
        part = lines.merge(c[c.subtask == t][[*key, "n", "correct", "seq"]], on=key, how="left")
        columns[f"{t}_n"], columns[f"{t}_correct"] = part.n.astype("Int64"), part.correct.astype("Int64")
        columns[f"{t}_seq"] = part.seq.fillna("")
    for name in list(columns):
        t, _, col = name.rpartition("_")
        sources = _sum_of(t, col)
        if sources and all(s in columns for s in sources) and columns[name].notna().all() \
                and (columns[name] == sum(columns[s] for s in sources)).fillna(False).all():
            del columns[name]
    wide = pd.concat([lines, pd.DataFrame(columns)], axis=1)
    return wide.to_csv(index=False, lineterminator="\n")


def _seq_text(x: float) -> str:
    """A share of sequences as the fraction it is (``4/15``; ``1``, ``0``), which reads back as the same float; a
    float that is no such fraction as its repr. A third of curves.csv's size was these shares' 17 digits."""
    if x is None or not math.isfinite(x):
        return ""
    f = Fraction(float(x)).limit_denominator(1 << 20)  # sequences per length are far fewer than 2^20
    if f.numerator / f.denominator != float(x):
        return repr(float(x))
    return str(f.numerator) if f.denominator == 1 else f"{f.numerator}/{f.denominator}"


def _seq_value(text: str) -> float:
    """``_seq_text`` read back: the same float."""
    if not text:
        return math.nan
    num, _, den = text.partition("/")
    return float(num) / float(den) if den else float(num)


def write_grid(grid: Grid, dst: str | Path) -> list[Path]:
    """Write ``grid`` in compact form to ``dst`` (created if needed); returns the files written. Up to four files, none
    indented:

    - ``runs.jsonl``: one line per run, its summary: ``variant, seed, run, label, train_length, steps, wall_s,
      precision, optimizer_impl, schedule, switch_step, eval_samples, eval_lengths`` (the lengths grammar), and per
      subtask ``{subtask}_acc_{f}x`` (token accuracy), ``{subtask}_seq_acc_{f}x`` (every answer of a sequence right)
      at each evaluated multiple f of L_train (1-4, 8, 16) and ``{subtask}_score`` (mean token accuracy over
      (L, 3L]); floats to 6 significant digits, which the loader makes exact again from the counts in curves.csv and
      windows.csv (``_restore``);
    - ``curves.csv``: every run's accuracy at every evaluated length, one line per run x length with per subtask
      ``{subtask}_n`` (answers asked), ``{subtask}_correct`` and ``{subtask}_seq`` (share of sequences all right);
      token accuracy is ``correct / n``, so it reads back bit for bit. A column that is the sum of others on every
      line (``_sum_of``: the answers of "all" are the state's and the recall's) is left out and read back as that sum;
    - ``training.csv``: every run's ``metrics.jsonl`` (evaluation during training), with ``variant, seed`` columns,
      numbers to 6 significant digits; the per-step lines a gradient policy adds are not read into it;
    - ``windows.csv`` (where the evaluation had windows): ``variant, seed, window, lo, hi, beyond, subtask, n_tokens,
      right, seq_acc, chance`` per run, window of stream positions and subtask (``state_mod{q}``: a factor of the
      modulus); token accuracy is ``right / n_tokens``. The run summaries carry the same accuracies as
      ``{subtask}_win_{lo}x_{hi}x``.
    """
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in grid_texts(grid).items():
        (dst / name).write_text(text)
        paths.append(dst / name)
    return paths


def grid_texts(grid: Grid) -> dict[str, str]:
    """The compact files of ``grid`` (``write_grid``), file name -> text, without writing them."""
    runs = [{k: int(v) if k in _INT_KEYS and v is not None else _significant(v, _SUMMARY_DIGITS)
             for k, v in r.items()} for r in tidy(grid.runs.to_dict("records"))]
    texts = {RUNS: "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in runs),
             CURVES: _curves_text(grid.curves)}
    if len(grid.training):
        t = grid.training.copy()
        for col in t.columns:
            if t[col].dtype.kind == "f" and col not in ("step",):
                t[col] = t[col].map(lambda x: _significant(x, _LOG_DIGITS))
        texts[TRAINING] = t.to_csv(index=False, lineterminator="\n")
    if len(grid.windows):
        w = grid.windows.drop(columns=["run", "token_acc"])
        w["seq_acc"] = w.seq_acc.map(_seq_text)
        texts[WINDOWS] = w.to_csv(index=False, lineterminator="\n")
    return texts


def import_runs(src: str | Path, dst: str | Path, config: dict[str, Any] | None = None) -> Grid:
    """Convert the finished run folders of ``src`` (a sweep's ``--out``) into the compact grid ``dst``, keeping the
    runs ``dst`` already holds that ``src`` does not have. Returns the merged grid."""
    src, dst = Path(src), Path(dst)
    new = load_grid(src, config=config)
    if new.runs.empty:
        raise ProbeError(f"{src}: no finished run ({EVAL}) to import")
    grid = merge(_from_compact(dst), new) if is_compact(dst) else new
    write_grid(grid, dst)
    return grid


def lengths_spec(lengths: list[int]) -> str:
    """A sorted list of lengths in the lengths grammar's range form: ``[1..100, 125, 150, ...]`` ->
    ``"1:100,125:400:25"`` (a run of equal steps is one range)."""
    parts, i = [], 0
    n = len(lengths)
    while i < n:
        j = i
        step = lengths[i + 1] - lengths[i] if i + 1 < n else 1
        while j + 1 < n and lengths[j + 1] - lengths[j] == step:
            j += 1
        if j - i >= 2 or (j > i and step == 1):
            parts.append(f"{lengths[i]}:{lengths[j]}" + (f":{step}" if step != 1 else ""))
            i = j + 1
        else:
            parts.append(str(lengths[i]))
            i += 1
    return ",".join(parts)


def parse_lengths_spec(spec: str) -> list[int]:
    """Inverse of ``lengths_spec``: several comma-separated ranges or single lengths."""
    out: list[int] = []
    for part in spec.split(","):
        out += parse_lengths(part) if ":" in part else [int(part)]
    return sorted(set(out))


__all__ = ["CURVES", "FACTORS", "Grid", "RUNS", "SOLVED", "TRAINING", "WINDOWS", "grid_texts", "has_run_folders",
           "import_runs",
           "is_compact", "lengths_spec", "load_curves", "load_grid", "load_runs", "merge", "parse_lengths_spec",
           "read_run_folder", "read_run_windows", "run_summary", "window_columns", "write_grid"]
