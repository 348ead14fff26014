"""Geometry: flips, rotations and transposes of the whole grid or of one object.

Generators transform with numpy; the reference rules re-derive the result with plain tuples.
"""

from __future__ import annotations

import random

import numpy as np

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask

# flip-then-recolour: a fixed cycle of the three colours its inputs use.
CYCLE_RECOLOUR = {1: 2, 2: 3, 3: 1}


def _noise(rng: random.Random, colours: tuple[int, ...] | None = None) -> np.ndarray:
    height, width = rng.randint(2, 10), rng.randint(2, 10)
    palette = colours or tuple(rng.sample(canvas.NONZERO, rng.randint(2, 5)))
    board = canvas.scatter(rng, height, width, palette, rng.uniform(0.35, 0.8))
    return np.array(board, dtype=int)


def _pair(before: np.ndarray, after: np.ndarray) -> Demo:
    return Demo(canvas.freeze(before.tolist()), canvas.freeze(after.tolist()))


def _flip_horizontal_pair(rng: random.Random) -> Demo:
    grid = _noise(rng)
    return _pair(grid, np.fliplr(grid))


def _flip_horizontal(grid: Grid) -> Grid:
    return tuple(row[::-1] for row in grid)


def _flip_vertical_pair(rng: random.Random) -> Demo:
    grid = _noise(rng)
    return _pair(grid, np.flipud(grid))


def _flip_vertical(grid: Grid) -> Grid:
    return grid[::-1]


def _rotate_clockwise_pair(rng: random.Random) -> Demo:
    grid = _noise(rng)
    return _pair(grid, np.rot90(grid, k=-1))


def _rotate_clockwise(grid: Grid) -> Grid:
    return tuple(zip(*grid[::-1]))


def _rotate_half_pair(rng: random.Random) -> Demo:
    grid = _noise(rng)
    return _pair(grid, np.rot90(grid, k=2))


def _rotate_half(grid: Grid) -> Grid:
    return tuple(row[::-1] for row in grid[::-1])


def _transpose_pair(rng: random.Random) -> Demo:
    grid = _noise(rng)
    return _pair(grid, grid.T)


def _transpose(grid: Grid) -> Grid:
    return tuple(zip(*grid))


def _rotate_anticlockwise_pair(rng: random.Random) -> Demo:
    grid = _noise(rng)
    return _pair(grid, np.rot90(grid, k=1))


def _rotate_anticlockwise(grid: Grid) -> Grid:
    return tuple(zip(*grid))[::-1]


def _flip_then_recolour_pair(rng: random.Random) -> Demo:
    grid = _noise(rng, colours=(1, 2, 3))
    board = grid.tolist()
    canvas.ensure_colours(rng, board, (1, 2, 3))
    grid = np.array(board, dtype=int)
    table = np.arange(10)
    for old, new in CYCLE_RECOLOUR.items():
        table[old] = new
    return _pair(grid, table[np.flipud(grid)])


def _flip_then_recolour(grid: Grid) -> Grid:
    return tuple(tuple(CYCLE_RECOLOUR.get(v, v) for v in row) for row in grid[::-1])


def _mirror_object_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(5, 14), rng.randint(5, 14)
    box_h, box_w = rng.randint(2, min(5, height)), rng.randint(3, min(6, width))
    cells = canvas.sprite(rng, box_h, box_w, rng.uniform(0.4, 0.8))
    main, accent = rng.sample(canvas.NONZERO, 2)
    accents = set(rng.sample(cells, rng.randint(1, max(1, len(cells) // 3))))
    top, left = rng.randint(0, height - box_h), rng.randint(0, width - box_w)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for r, c in cells:
        colour = accent if (r, c) in accents else main
        before[top + r][left + c] = colour
        after[top + r][left + box_w - 1 - c] = colour
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _mirror_object(grid: Grid) -> Grid:
    box = canvas.nonzero_box(grid)
    if box is None:
        return grid
    top, left, bottom, right = box
    board = canvas.thaw(grid)
    for r in range(top, bottom + 1):
        board[r][left : right + 1] = board[r][left : right + 1][::-1]
    return canvas.freeze(board)


TASKS = (
    OwnTask("own-flip-horizontal", "geometry", "mirror the grid left to right", "stream",
            _flip_horizontal_pair, _flip_horizontal),
    OwnTask("own-flip-vertical", "geometry", "mirror the grid top to bottom", "heldout",
            _flip_vertical_pair, _flip_vertical),
    OwnTask("own-rotate-clockwise", "geometry", "rotate the grid a quarter turn clockwise", "stream",
            _rotate_clockwise_pair, _rotate_clockwise),
    OwnTask("own-rotate-half-turn", "geometry", "rotate the grid half a turn", "heldout",
            _rotate_half_pair, _rotate_half),
    OwnTask("own-transpose", "geometry", "transpose the grid (mirror in the main diagonal)", "stream",
            _transpose_pair, _transpose),
    OwnTask("own-rotate-anticlockwise", "geometry", "rotate the grid a quarter turn anticlockwise", "heldout",
            _rotate_anticlockwise_pair, _rotate_anticlockwise),
    OwnTask("own-flip-then-recolour", "geometry",
            "mirror the grid top to bottom, then recolour 1->2, 2->3, 3->1", "stream",
            _flip_then_recolour_pair, _flip_then_recolour),
    OwnTask("own-mirror-object-in-place", "geometry",
            "mirror the single two-coloured object left to right inside its own bounding box", "heldout",
            _mirror_object_pair, _mirror_object),
)
