"""Tables that fit the console: when a table is wider than the console, its
least needed columns are left out (and named under it) until it fits; text
columns wrap at word boundaries but never below ``WRAP_WIDTH`` cells. Every
command that prints a table also has ``--json``, which holds every column."""

from __future__ import annotations

import json
from dataclasses import dataclass

import typer
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from .app import console

__all__ = ["Col", "fit", "show", "print_json", "JSON"]

WRAP_WIDTH = 28
JSON = typer.Option(False, "--json", help="print every field as JSON instead of a table")


@dataclass(frozen=True)
class Col:
    """A table column.

    Attributes:
        header: its title.
        drop: 0 keeps it at any width; a higher value is left out earlier when the
            table is too wide.
        wrap: a text column (wraps at word boundaries, at least ``WRAP_WIDTH`` cells).
        justify: "left" or "right".
    """

    header: str
    drop: int = 0
    wrap: bool = False
    justify: str = "left"


def _table(title: str | None, cols: list[Col], rows: list[list[str]], shown: list[int], caption: str | None) -> Table:
    table = Table(title=title, caption=caption, caption_justify="left")
    for i in shown:
        c = cols[i]
        table.add_column(c.header, justify=c.justify, no_wrap=not c.wrap, min_width=WRAP_WIDTH if c.wrap else None)
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def fit(
    title: str | None, cols: list[Col], rows: list[list[str]], width: int, caption: str | None = None
) -> tuple[Table, list[str]]:
    """The table of ``rows`` (one string per column, rich markup allowed) at most
    ``width`` cells wide where the kept columns allow it.

    Returns:
        ``(table, left_out)``: the rich table and the headers left out, in the
        order they were dropped (highest ``drop`` first, the rightmost of a tie first).
    """
    shown, left_out = list(range(len(cols))), []
    while True:
        droppable = [i for i in shown if cols[i].drop > 0]
        if _least_width(cols, rows, shown) <= width or not droppable:
            return _table(title, cols, rows, shown, caption), left_out
        worst = max(droppable, key=lambda i: (cols[i].drop, i))
        shown.remove(worst)
        left_out.append(cols[worst].header)


def _least_width(cols: list[Col], rows: list[list[str]], shown: list[int]) -> int:
    """The narrowest the table can be: each kept column as wide as its widest cell
    (a text column: its longest word, at least ``WRAP_WIDTH``), plus a cell of
    padding on each side and the borders."""
    total = len(shown) + 1
    for i in shown:
        cells = [Text.from_markup(cols[i].header)] + [Text.from_markup(row[i]) for row in rows]
        if cols[i].wrap:
            words = [cell_len(w) for cell in cells for w in cell.plain.split()]
            total += max([WRAP_WIDTH, *words]) + 2
        else:
            total += max(cell.cell_len for cell in cells) + 2
    return total


def show(title: str | None, cols: list[Col], rows: list[list[str]], caption: str | None = None) -> None:
    """Print the table fitted to the console, naming the columns left out."""
    table, left_out = fit(title, cols, rows, console.width, caption)
    console.print(table)
    if left_out:
        console.print(
            f"not shown at {console.width} columns: {', '.join(left_out)} (--json has every column)",
            highlight=False,
            markup=False,
        )


def print_json(data) -> None:
    """``data`` as JSON on stdout, never wrapped (for scripts)."""
    print(json.dumps(data, indent=2, default=str), flush=True)
