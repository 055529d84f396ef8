"""Markdown tables: one writer for every table that probe renders (sweep reports, comparisons, figure indexes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def pipe_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub pipe table: the header, a ``|---|`` rule and one line per row, cells written with ``str`` and no
    trailing newline. A cell that may hold ``|`` must escape it itself (``\\|``): here it would split the cell."""
    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(c) for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)])
