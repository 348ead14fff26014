"""ARC grids and demonstration pairs: the values every other module passes around.

A grid is an immutable tuple of rows of ints in 0..9, 1..30 cells on each side. Grids cross
process and JSON boundaries as lists of lists; `as_grid` / `grid_json` are the one conversion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import CarcError

Grid = tuple[tuple[int, ...], ...]

MAX_SIDE = 30
COLOURS = range(10)


SPELL_LIMIT = 200  # characters of a learner's value echoed in a message


class GridError(CarcError, ValueError):
    """A value that is not a valid ARC grid; the message says exactly what is wrong."""


def spell(value: Any, limit: int = SPELL_LIMIT) -> str:
    """A learner's value as JSON text (`null`, `true`, not Python's), cut to `limit` characters
    with "…", and with any lone surrogate escaped, so a message echoing it stays bounded and
    encodable."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        try:
            text = repr(value)
        except (ValueError, RecursionError):  # an int past Python's 4,300-digit limit for str()
            text = f"<{json_type(value)} too large to write>"
    if len(text) > limit:
        text = text[:limit] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _got(value: Any) -> str:
    """What a learner gave instead of an array, for "got ...": `null`, or its JSON type and
    value (`string "[[1]]"`), capped."""
    return "null" if value is None else f"{json_type(value)} {spell(value, 40)}"


def as_grid(value: Any) -> Grid:
    """Validate a JSON-like value (list of lists of ints) and return it as a `Grid`.

    Raises `GridError` naming the first problem: not a list, empty, ragged, bad cell, too big.
    """
    if not isinstance(value, (list, tuple)):
        raise GridError(f"grid must be an array of rows, got {_got(value)}")
    if not 1 <= len(value) <= MAX_SIDE:
        raise GridError(f"grid has {len(value)} rows; it must have 1 to {MAX_SIDE}")
    rows: list[tuple[int, ...]] = []
    width = None
    for r, row in enumerate(value):
        if not isinstance(row, (list, tuple)):
            raise GridError(f"row {r} must be an array of cells, got {_got(row)}")
        if width is None:
            width = len(row)
            if not 1 <= width <= MAX_SIDE:
                raise GridError(f"row 0 has {width} cells; rows must have 1 to {MAX_SIDE}")
        elif len(row) != width:
            raise GridError(f"grid is not rectangular: row 0 has {width} cells, row {r} has {len(row)}")
        for c, cell in enumerate(row):
            # bool is an int subclass; true/false are not colours.
            if isinstance(cell, bool) or not isinstance(cell, int):
                raise GridError(f"cell [{r}][{c}] is {spell(cell, 40)}; cells must be integers 0 to 9")
            if cell not in COLOURS:
                raise GridError(f"cell [{r}][{c}] is {spell(cell, 40)}; cells must be integers 0 to 9")
        rows.append(tuple(row))
    return tuple(rows)


def grid_list(grid: Grid) -> list[list[int]]:
    return [list(row) for row in grid]


def grid_json(grid: Grid) -> str:
    """Compact, canonical JSON text of a grid (the form used in prompts and records)."""
    return json.dumps(grid_list(grid), separators=(",", ":"))


def shape(grid: Grid) -> tuple[int, int]:
    return len(grid), len(grid[0])


@dataclass(frozen=True)
class Demo:
    """One demonstration pair of a task: an input grid and its output under the task's rule."""

    input: Grid
    output: Grid

    def to_json(self) -> dict[str, list[list[int]]]:
        return {"input": grid_list(self.input), "output": grid_list(self.output)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> "Demo":
        return cls(as_grid(value["input"]), as_grid(value["output"]))
