"""Markdown tables: one writer for every table that probe renders (sweep reports, comparisons, figure indexes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def pipe_row(cells: Sequence[object]) -> str:
    """One line of a pipe table, cells written with ``str``. A cell that may hold ``|`` must escape it itself
    (``\\|``): here it would split the cell."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def pipe_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub pipe table: the header, a ``|---|`` rule and one ``pipe_row`` per row, with no trailing newline."""
    return "\n".join([pipe_row(header), "|" + "---|" * len(header), *(pipe_row(r) for r in rows)])
