"""Lengths: multiples of the training length, and the one grammar every ``--lengths`` flag reads."""

from __future__ import annotations

from collections.abc import Sequence

from probe.errors import ProbeError

FACTORS = (1, 2, 3, 4, 8, 16)
"""The multiples of L_train that reports show (where evaluated): every one to 4x, then 8x and 16x."""

GRAMMAR = ("a comma list (25,75) of lengths and inclusive ranges START:STOP (1:100) or START:STOP:STEP "
           "(1:400:25), e.g. 1:100,125:400:25")


def multiples(train_length: int, factors: Sequence[int] = (1, 2, 3, 4)) -> list[int]:
    """``factor x train_length`` for each factor: the lengths an analysis reports by default."""
    return [int(f) * int(train_length) for f in factors]


def up_to(train_length: int, factor: int = 4) -> list[int]:
    """Every length from 1 to ``factor x train_length``: a whole accuracy-vs-length curve."""
    return list(range(1, factor * train_length + 1))


def stepped(train_length: int, factor: int = 4, per: int = 5) -> list[int]:
    """Every ``train_length / per``-th length up to ``factor x train_length`` (5, 10, ..., 100 for 25): the same
    curve as ``up_to`` at a fifth of the cost, the multiples of L_train included."""
    step = max(1, train_length // per)
    every = range(step, factor * train_length + 1, step)
    return sorted({*every, *multiples(train_length, range(1, factor + 1))})


def parse_lengths(spec: str, flag: str = "--lengths") -> list[int]:
    """``"25,75"``, ``"1:100"`` (inclusive), ``"1:400:25"``, or a comma list of any of these (``"1:100,125:400:25"``:
    every length to 4x, then every 25 to 16x) as a sorted list of distinct positive lengths."""
    usage = f"use {GRAMMAR}"
    if not spec.strip():
        raise ProbeError(f"empty {flag}: {usage}")
    out: set[int] = set()
    for item in (p.strip() for p in spec.split(",")):
        if not item:
            continue
        try:
            if ":" in item:
                parts = [int(p) for p in item.split(":")]
                if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] < 1):
                    raise ValueError
                start, stop, step = parts[0], parts[1], parts[2] if len(parts) == 3 else 1
                values = range(start, stop + 1, step)
                if not values:
                    raise ProbeError(f"bad {flag} {spec!r}: an empty range {item} (START is after STOP)")
                out.update(values)
            else:
                out.add(int(item))
        except ValueError:
            raise ProbeError(f"bad {flag} {spec!r}: {usage}") from None
    if not out or min(out) < 1:
        raise ProbeError(f"bad {flag} {spec!r}: lengths must be positive integers")
    return sorted(out)
