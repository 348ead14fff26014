"""Logic: two halves split by a grey line are overlaid cell by cell with a boolean rule.

The first half uses blue, the second red; the output marks the cells where the rule holds.
"""

from __future__ import annotations

import random
from typing import Callable

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask

FIRST, SECOND, DIVIDER = 1, 2, 5
AND_MARK, OR_MARK, XOR_MARK, DIFFERENCE_MARK = 3, 4, 6, 8

Rule = Callable[[bool, bool], bool]


def _halves_pair(rng: random.Random, rule: Rule, mark: int, stacked: bool) -> Demo:
    height, width = rng.randint(3, 6), rng.randint(3, 6)
    first = canvas.scatter(rng, height, width, (FIRST,), rng.uniform(0.3, 0.7))
    second = canvas.scatter(rng, height, width, (SECOND,), rng.uniform(0.3, 0.7))
    overlay = [[mark if rule(bool(a), bool(b)) else 0 for a, b in zip(ra, rb)] for ra, rb in zip(first, second)]
    if stacked:
        before = first + [[DIVIDER] * width] + second
    else:
        before = [ra + [DIVIDER] + rb for ra, rb in zip(first, second)]
    return Demo(canvas.freeze(before), canvas.freeze(overlay))


def _overlay(grid: Grid, rule: Rule, mark: int) -> Grid:
    """Split at the all-grey row or column and combine the halves cell by cell."""
    for r, row in enumerate(grid):
        if all(v == DIVIDER for v in row):
            first, second = grid[:r], grid[r + 1 :]
            break
    else:
        columns = list(zip(*grid))
        c = next((i for i, col in enumerate(columns) if all(v == DIVIDER for v in col)), None)
        if c is None:
            return grid
        first, second = tuple(row[:c] for row in grid), tuple(row[c + 1 :] for row in grid)
    if len(first) != len(second) or not first or len(first[0]) != len(second[0]):
        return grid
    return tuple(
        tuple(mark if rule(a == FIRST, b == SECOND) else 0 for a, b in zip(ra, rb)) for ra, rb in zip(first, second)
    )


def _both(a: bool, b: bool) -> bool:
    return a and b


def _either(a: bool, b: bool) -> bool:
    return a or b


def _exactly_one(a: bool, b: bool) -> bool:
    return a != b


def _first_only(a: bool, b: bool) -> bool:
    return a and not b


TASKS = (
    OwnTask("own-halves-and", "logic", "left and right halves overlaid: green where both are coloured", "stream",
            lambda rng: _halves_pair(rng, _both, AND_MARK, stacked=False),
            lambda grid: _overlay(grid, _both, AND_MARK)),
    OwnTask("own-halves-or", "logic", "left and right halves overlaid: yellow where either is coloured", "stream",
            lambda rng: _halves_pair(rng, _either, OR_MARK, stacked=False),
            lambda grid: _overlay(grid, _either, OR_MARK)),
    OwnTask("own-halves-xor", "logic", "left and right halves overlaid: magenta where exactly one is coloured",
            "heldout",
            lambda rng: _halves_pair(rng, _exactly_one, XOR_MARK, stacked=False),
            lambda grid: _overlay(grid, _exactly_one, XOR_MARK)),
    OwnTask("own-stacked-difference", "logic",
            "top and bottom halves overlaid: light blue where the top is coloured and the bottom is not", "heldout",
            lambda rng: _halves_pair(rng, _first_only, DIFFERENCE_MARK, stacked=True),
            lambda grid: _overlay(grid, _first_only, DIFFERENCE_MARK)),
)
