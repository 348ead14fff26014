"""Tiling and scaling: repeat, mirror-tile, upscale and downscale the input grid.

Generators build with numpy (`np.tile`, `np.kron`); the reference rules index plain tuples.
"""

from __future__ import annotations

import random

import numpy as np

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask


def _small(rng: random.Random, low: int = 2, high: int = 6, colours: int | None = None) -> np.ndarray:
    height, width = rng.randint(low, high), rng.randint(low, high)
    palette = rng.sample(canvas.NONZERO, colours or rng.randint(1, 4))
    board = canvas.scatter(rng, height, width, palette, rng.uniform(0.3, 0.8))
    canvas.ensure_colours(rng, board, palette[:1])
    return np.array(board, dtype=int)


def _pair(before: np.ndarray, after: np.ndarray) -> Demo:
    return Demo(canvas.freeze(before.tolist()), canvas.freeze(after.tolist()))


def _upscaled(grid: Grid, factor: int) -> Grid:
    return tuple(tuple(v for v in row for _ in range(factor)) for row in grid for _ in range(factor))


def _tile_pair(rng: random.Random) -> Demo:
    grid = _small(rng)
    return _pair(grid, np.tile(grid, (2, 2)))


def _tile(grid: Grid) -> Grid:
    return tuple(row + row for row in grid) * 2


def _upscale3_pair(rng: random.Random) -> Demo:
    grid = _small(rng, 1, 7)
    return _pair(grid, np.kron(grid, np.ones((3, 3), dtype=int)))


def _upscale2_pair(rng: random.Random) -> Demo:
    grid = _small(rng, 1, 8)
    return _pair(grid, np.kron(grid, np.ones((2, 2), dtype=int)))


def _mirror_right_pair(rng: random.Random) -> Demo:
    grid = _small(rng, 2, 8)
    return _pair(grid, np.hstack([grid, np.fliplr(grid)]))


def _mirror_right(grid: Grid) -> Grid:
    return tuple(row + row[::-1] for row in grid)


def _mirror_tile_pair(rng: random.Random) -> Demo:
    grid = _small(rng, 2, 6)
    top = np.hstack([grid, np.fliplr(grid)])
    return _pair(grid, np.vstack([top, np.flipud(top)]))


def _mirror_tile(grid: Grid) -> Grid:
    top = tuple(row + row[::-1] for row in grid)
    return top + top[::-1]


def _upscale_flip_pair(rng: random.Random) -> Demo:
    grid = _small(rng, 2, 7)
    return _pair(grid, np.flipud(np.kron(grid, np.ones((2, 2), dtype=int))))


def _upscale_flip(grid: Grid) -> Grid:
    return _upscaled(grid, 2)[::-1]


def _downscale_pair(rng: random.Random) -> Demo:
    grid = _small(rng, 1, 6)
    return _pair(np.kron(grid, np.ones((3, 3), dtype=int)), grid)


def _downscale(grid: Grid) -> Grid:
    return tuple(row[::3] for row in grid[::3])


def _self_tile_pair(rng: random.Random) -> Demo:
    grid = _small(rng, 3, 3, colours=1)
    return _pair(grid, np.kron(grid != 0, grid))


def _self_tile(grid: Grid) -> Grid:
    blank_row = (0,) * len(grid[0])
    return tuple(
        tuple(v for cell in grid[big_r] for v in (grid[small_r] if cell else blank_row))
        for big_r in range(len(grid))
        for small_r in range(len(grid))
    )


TASKS = (
    OwnTask("own-tile-2x2", "tiling", "repeat the grid twice across and twice down", "stream",
            _tile_pair, _tile),
    OwnTask("own-upscale-3", "tiling", "scale the grid up by 3: every cell becomes a 3x3 block", "stream",
            _upscale3_pair, lambda grid: _upscaled(grid, 3)),
    OwnTask("own-mirror-extend-right", "tiling", "append the grid's left-right mirror image on its right", "stream",
            _mirror_right_pair, _mirror_right),
    OwnTask("own-upscale-then-flip", "tiling", "scale the grid up by 2, then mirror it top to bottom", "stream",
            _upscale_flip_pair, _upscale_flip),
    OwnTask("own-upscale-2", "tiling", "scale the grid up by 2: every cell becomes a 2x2 block", "heldout",
            _upscale2_pair, lambda grid: _upscaled(grid, 2)),
    OwnTask("own-mirror-tile-2x2", "tiling",
            "a 2x2 arrangement of the grid and its mirror images, symmetric both ways", "heldout",
            _mirror_tile_pair, _mirror_tile),
    OwnTask("own-downscale-3", "tiling", "shrink a grid of 3x3 solid blocks to one cell per block", "heldout",
            _downscale_pair, _downscale),
    OwnTask("own-self-tile", "tiling",
            "a 3x3 pattern becomes 9x9: each coloured cell is replaced by the whole pattern, black by black",
            "heldout", _self_tile_pair, _self_tile),
)
