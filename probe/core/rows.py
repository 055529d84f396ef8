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
