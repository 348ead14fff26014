"""Pattern continuation: extend a periodic pattern, repair holes in a tiling, continue diagonals."""

from __future__ import annotations

import random

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask


def _palette(rng: random.Random) -> list[int]:
    return rng.sample(canvas.NONZERO, rng.randint(2, 4))


def _row_pattern_pair(rng: random.Random) -> Demo:
    period, height, width = rng.randint(2, 4), rng.randint(1, 8), rng.randint(9, 20)
    motif = canvas.scatter(rng, height, period, _palette(rng), 1.0)
    full = [[row[c % period] for c in range(width)] for row in motif]
    shown = rng.randint(2 * period, width - 1)
    before = [row[:shown] + [0] * (width - shown) for row in full]
    return Demo(canvas.freeze(before), canvas.freeze(full))


def _continue_rows(grid: Grid) -> Grid:
    """The shown columns run until the first all-black column; repeat their shortest period."""
    columns = list(zip(*grid))
    shown = next((i for i, col in enumerate(columns) if not any(col)), len(columns))
    for period in range(1, shown // 2 + 1):
        if all(columns[i] == columns[i - period] for i in range(period, shown)):
            return tuple(zip(*(columns[i % period] for i in range(len(columns)))))
    return grid


def _block_down_pair(rng: random.Random) -> Demo:
    block_h, width = rng.randint(1, 4), rng.randint(2, 10)
    height = rng.randint(block_h + 1, 20)
    block = canvas.scatter(rng, block_h, width, _palette(rng), 1.0)
    before = block + canvas.blank(height - block_h, width)
    after = [block[r % block_h] for r in range(height)]
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _repeat_block_down(grid: Grid) -> Grid:
    block = [row for row in grid if all(row)]
    if not block or any(grid[: len(block)][i] != block[i] for i in range(len(block))):
        return grid
    return tuple(block[r % len(block)] for r in range(len(grid)))


def _repair_tiling_pair(rng: random.Random) -> Demo:
    tile_h, tile_w = rng.randint(2, 4), rng.randint(2, 4)
    height, width = rng.randint(2 * tile_h + 2, 16), rng.randint(2 * tile_w + 2, 16)
    tile = canvas.scatter(rng, tile_h, tile_w, _palette(rng), 1.0)
    full = [[tile[r % tile_h][c % tile_w] for c in range(width)] for r in range(height)]
    before = canvas.thaw(canvas.freeze(full))
    for _ in range(rng.randint(1, 2)):
        patch_h, patch_w = rng.randint(1, 4), rng.randint(1, 4)
        top, left = rng.randint(0, height - patch_h), rng.randint(0, width - patch_w)
        for r in range(top, top + patch_h):
            before[r][left : left + patch_w] = [0] * patch_w
    return Demo(canvas.freeze(before), canvas.freeze(full))


def _repair_tiling(grid: Grid) -> Grid:
    """Find the smallest tile that agrees with every visible cell and covers every position; apply it."""
    height, width = len(grid), len(grid[0])
    candidates = sorted(
        ((h, w) for h in range(1, height // 2 + 1) for w in range(1, width // 2 + 1)),
        key=lambda hw: (hw[0] * hw[1], hw),
    )
    for tile_h, tile_w in candidates:
        tile: dict[canvas.Cell, int] = {}
        consistent = True
        for r, row in enumerate(grid):
            for c, v in enumerate(row):
                if v and tile.setdefault((r % tile_h, c % tile_w), v) != v:
                    consistent = False
                    break
            if not consistent:
                break
        if consistent and len(tile) == tile_h * tile_w:
            return tuple(tuple(tile[(r % tile_h, c % tile_w)] for c in range(width)) for r in range(height))
    return grid


def _diagonal_rays_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(4, 14), rng.randint(4, 14)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    diagonals = rng.sample(range(-(width - 2), height - 1), rng.randint(1, 3))
    for diagonal in diagonals:
        # cells with r - c == diagonal that are not on the last row or column
        spots = [(r, r - diagonal) for r in range(height - 1) if 0 <= r - diagonal < width - 1]
        r, c = rng.choice(spots)
        colour = rng.choice(canvas.NONZERO)
        before[r][c] = colour
        while r < height and c < width:
            after[r][c] = colour
            r, c = r + 1, c + 1
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _diagonal_rays(grid: Grid) -> Grid:
    board = canvas.thaw(grid)
    height, width = len(grid), len(grid[0])
    for r, row in enumerate(grid):
        for c, v in enumerate(row):
            if v:
                for step in range(min(height - r, width - c)):
                    board[r + step][c + step] = v
    return canvas.freeze(board)


TASKS = (
    OwnTask("own-continue-row-pattern", "pattern",
            "continue the periodic columns on the left across the blank right part", "stream",
            _row_pattern_pair, _continue_rows),
    OwnTask("own-repeat-block-down", "pattern", "repeat the top block of rows down to the bottom edge", "stream",
            _block_down_pair, _repeat_block_down),
    OwnTask("own-repair-periodic-tiling", "pattern", "fill the black holes of a periodic tiling from the tile",
            "heldout", _repair_tiling_pair, _repair_tiling),
    OwnTask("own-extend-diagonal-rays", "pattern", "every dot extends as a ray down and to the right", "heldout",
            _diagonal_rays_pair, _diagonal_rays),
)
