"""Symmetry: complete a symmetric pattern where a black patch hides part of it, or make one symmetric.

Completed patterns use colours 1..9 only, so black marks exactly the hidden cells.
"""

from __future__ import annotations

import random

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask, Redraw


def _palette(rng: random.Random) -> list[int]:
    return rng.sample(canvas.NONZERO, rng.randint(2, 5))


def _mirrored_pattern(rng: random.Random) -> canvas.Board:
    """A full left-right symmetric pattern, 4..12 on each side."""
    height, width = rng.randint(4, 12), rng.randint(4, 12)
    half = canvas.scatter(rng, height, (width + 1) // 2, _palette(rng), 1.0)
    return [row + row[: width // 2][::-1] for row in half]


def _mask(rng: random.Random, height: int, width: int, max_h: int, max_w: int,
          rows: range | None = None, cols: range | None = None) -> tuple[int, int, int, int]:
    """A random (top, left, bottom, right) patch, inclusive, inside `rows` x `cols`."""
    rows = rows or range(height)
    cols = cols or range(width)
    patch_h, patch_w = rng.randint(1, min(max_h, len(rows))), rng.randint(1, min(max_w, len(cols)))
    top = rng.randint(rows.start, rows.stop - patch_h)
    left = rng.randint(cols.start, cols.stop - patch_w)
    return top, left, top + patch_h - 1, left + patch_w - 1


def _hide(board: canvas.Board, box: tuple[int, int, int, int]) -> canvas.Board:
    top, left, bottom, right = box
    return [
        [0 if top <= r <= bottom and left <= c <= right else v for c, v in enumerate(row)]
        for r, row in enumerate(board)
    ]


def _mirror_patch(rng: random.Random) -> tuple[canvas.Board, tuple[int, int, int, int]]:
    full = _mirrored_pattern(rng)
    height, width = len(full), len(full[0])
    # the patch stays in one half, so each hidden cell's mirror image is visible
    cols = range(0, width // 2) if rng.random() < 0.5 else range((width + 1) // 2, width)
    return full, _mask(rng, height, width, max(1, height // 2), len(cols), cols=cols)


def _complete_mirror_pair(rng: random.Random) -> Demo:
    full, box = _mirror_patch(rng)
    return Demo(canvas.freeze(_hide(full, box)), canvas.freeze(full))


def _complete_mirror(grid: Grid) -> Grid:
    return tuple(tuple(v or row[-1 - c] for c, v in enumerate(row)) for row in grid)


def _reveal_pair(rng: random.Random) -> Demo:
    full, box = _mirror_patch(rng)
    return Demo(canvas.freeze(_hide(full, box)), canvas.crop(canvas.freeze(full), box))


def _reveal(grid: Grid) -> Grid:
    hidden = [(r, c) for r, row in enumerate(grid) for c, v in enumerate(row) if v == 0]
    if not hidden:
        return grid
    return canvas.crop(_complete_mirror(grid), canvas.Blob(0, tuple(hidden)).box)


def _make_symmetric_pair(rng: random.Random, across: bool) -> Demo:
    height, width = rng.randint(2, 10), rng.randint(1, 7)
    half = canvas.scatter(rng, height, width, _palette(rng), rng.uniform(0.4, 0.9))
    canvas.ensure_colours(rng, half, [rng.choice(canvas.NONZERO)])
    before = [row + [0] * width for row in half]
    after = [row + row[::-1] for row in half]
    if not across:  # the same construction turned on its side: top half given, bottom to fill
        before, after = (canvas.thaw(tuple(zip(*board))) for board in (before, after))
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _make_symmetric_left_right(grid: Grid) -> Grid:
    half = len(grid[0]) // 2
    return tuple(row[:half] + row[:half][::-1] for row in grid)


def _make_symmetric_top_bottom(grid: Grid) -> Grid:
    top = grid[: len(grid) // 2]
    return top + top[::-1]


def _fourfold_pair(rng: random.Random) -> Demo:
    quarter_h, quarter_w = rng.randint(2, 6), rng.randint(2, 6)
    quarter = canvas.scatter(rng, quarter_h, quarter_w, _palette(rng), 1.0)
    top = [row + row[::-1] for row in quarter]
    full = top + top[::-1]
    height, width = len(full), len(full[0])
    box = _mask(rng, height, width, quarter_h, quarter_w)
    hidden = _hide(full, box)
    for r in range(height):
        for c in range(width):
            if not any(hidden[a][b] for a, b in _orbit(r, c, height, width)):
                raise Redraw
    return Demo(canvas.freeze(hidden), canvas.freeze(full))


def _orbit(r: int, c: int, height: int, width: int) -> list[canvas.Cell]:
    return [(r, c), (r, width - 1 - c), (height - 1 - r, c), (height - 1 - r, width - 1 - c)]


def _complete_fourfold(grid: Grid) -> Grid:
    height, width = len(grid), len(grid[0])
    return tuple(
        tuple(max(grid[a][b] for a, b in _orbit(r, c, height, width)) if v == 0 else v for c, v in enumerate(row))
        for r, row in enumerate(grid)
    )


def _rotational_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(3, 12), rng.randint(3, 12)
    full = canvas.scatter(rng, height, width, _palette(rng), 1.0)
    for r in range(height):
        for c in range(width):
            if (r, c) > (height - 1 - r, width - 1 - c):
                full[r][c] = full[height - 1 - r][width - 1 - c]
    # a patch above the middle row never hides a cell's half-turn partner
    box = _mask(rng, height, width, max(1, height // 2), width, rows=range(0, max(1, height // 2)))
    return Demo(canvas.freeze(_hide(full, box)), canvas.freeze(full))


def _complete_rotational(grid: Grid) -> Grid:
    return tuple(
        tuple(v or grid[-1 - r][-1 - c] for c, v in enumerate(row)) for r, row in enumerate(grid)
    )


TASKS = (
    OwnTask("own-complete-mirror-symmetry", "symmetry",
            "fill the black patch of a left-right symmetric pattern from its mirror image", "stream",
            _complete_mirror_pair, _complete_mirror),
    OwnTask("own-make-symmetric-left-right", "symmetry",
            "the blank right half becomes the mirror image of the left half", "stream",
            lambda rng: _make_symmetric_pair(rng, across=True), _make_symmetric_left_right),
    OwnTask("own-reveal-hidden-patch", "symmetry",
            "output what the black patch hides in a left-right symmetric pattern", "stream",
            _reveal_pair, _reveal),
    OwnTask("own-complete-fourfold-symmetry", "symmetry",
            "fill the black patch of a pattern symmetric both left-right and top-bottom", "heldout",
            _fourfold_pair, _complete_fourfold),
    OwnTask("own-complete-rotational-symmetry", "symmetry",
            "fill the black patch of a pattern that is unchanged by a half turn", "heldout",
            _rotational_pair, _complete_rotational),
    OwnTask("own-make-symmetric-top-bottom", "symmetry",
            "the blank bottom half becomes the mirror image of the top half", "heldout",
            lambda rng: _make_symmetric_pair(rng, across=False), _make_symmetric_top_bottom),
)
