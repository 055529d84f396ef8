"""Control and instrument-check rows: one schema for every analysis's ``controls`` list.

Two kinds, labelled in the ``kind`` column. An *instrument* check verifies that the method computes what it says
(an oracle with a known answer, an identity, two routes that must agree): necessary, but it cannot refute a claim
about a checkpoint. A *control* is a way the claim about this checkpoint could have come out false (a baseline, a
placebo, a target the model could have computed instead). Every row has ``control`` (its name), ``kind`` and
``passed``; the other columns (``value``, ``threshold``, ``expected``, ``what``, ...) say what was compared.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

INSTRUMENT = "instrument"
CONTROL = "control"
KINDS = (INSTRUMENT, CONTROL)
Kind = Literal["instrument", "control"]


def check_row(name: str, kind: Kind, passed: bool, **columns: Any) -> dict[str, Any]:
    """One row: ``control`` (the name), ``kind``, ``passed`` and any further columns."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: use one of {KINDS}")
    return {"control": name, "kind": kind, "passed": bool(passed), **columns}


def threshold_row(checkpoint: str, name: str, value: float, threshold: float, what: str,
                  kind: Kind = INSTRUMENT, **extra: Any) -> dict[str, Any]:
    """A row that passes when ``value <= threshold``; ``what`` says which failure it reveals."""
    return {"checkpoint": checkpoint, **check_row(name, kind, bool(value <= threshold), value=float(value),
                                                  threshold=threshold, what=what), **extra}


def labelled(rows: Iterable[dict[str, Any]], kinds: dict[str, Kind], default: Kind = INSTRUMENT,
             ) -> list[dict[str, Any]]:
    """``rows`` with ``kind`` set from ``kinds`` (control name or a prefix of it -> kind; the longest prefix wins),
    ``default`` for the others; a row that already has a kind keeps it."""
    out = []
    for row in rows:
        if "kind" not in row:
            name = str(row.get("control", ""))
            match = max((k for k in kinds if name.startswith(k)), key=len, default=None)
            row = {**row, "kind": kinds[match] if match is not None else default}
        out.append(row)
    return out


PLACE = ("hook", "train_positions", "length", "block", "subtask", "positions", "range")
"""Columns that say where a row was measured, shown in its line when present."""


def _num(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def control_line(row: dict[str, Any]) -> str:
    """The line a person reads for one control or instrument row, in every analysis's plain output: ok / FAIL, its
    kind and name, where it was measured, its value against its threshold (``passes_if``: the comparison that
    passes) and what a failure means (``what``), so that a failed control tells a broken tool from a model."""
    where = " ".join(f"{k}={_num(row[k])}" for k in PLACE
                     if k in row and row[k] is not None and row[k] == row[k])
    value = row.get("value")
    threshold, expected = row.get("threshold"), row.get("expected")
    rule = (f"{row.get('passes_if', '<=')} {_num(threshold)}" if threshold is not None else
            str(expected) if expected is not None else "no threshold recorded")
    shown = f"value {_num(value)} (passes if {rule})" if value is not None else f"(passes if {rule})"
    what = row.get("what") or "no meaning recorded"
    head = f"{'ok  ' if row.get('passed') else 'FAIL'} {row.get('kind', 'control')} {row.get('control')}"
    return f"  {head}{' ' + where if where else ''}: {shown}; {what}"
