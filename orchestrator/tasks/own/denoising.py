"""Denoising: remove stray pixels and small specks, repair stripes and rectangles under noise."""

from __future__ import annotations

import random
from collections import Counter

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask, Redraw

NOISE = 5  # denoise-rectangles sprinkles grey
SMALL = 3  # remove-small-objects erases objects of fewer cells than this


def _isolated_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(6, 15), rng.randint(6, 15)
    layout = canvas.Layout(height, width)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for _ in range(rng.randint(1, 4)):
        box_h, box_w = rng.randint(1, 4), rng.randint(2, 4)
        if rng.random() < 0.5:
            box_h, box_w = box_w, box_h
        cells, colour = canvas.sprite(rng, box_h, box_w, rng.uniform(0.5, 1.0)), rng.choice(canvas.NONZERO)
        at = layout.place(rng, box_h, box_w)
        canvas.stamp(before, cells, colour, at)
        canvas.stamp(after, cells, colour, at)
    for _ in range(rng.randint(1, 6)):
        canvas.stamp(before, [(0, 0)], rng.choice(canvas.NONZERO), layout.place(rng, 1, 1))
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _remove_isolated(grid: Grid) -> Grid:
    height, width = len(grid), len(grid[0])

    def alone(r: int, c: int) -> bool:
        return not any(
            0 <= r + dr < height and 0 <= c + dc < width and grid[r + dr][c + dc] for dr, dc in canvas.STEPS8
        )

    return tuple(tuple(0 if v and alone(r, c) else v for c, v in enumerate(row)) for r, row in enumerate(grid))


def _stripes_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(3, 10), rng.randint(4, 12)
    before, after = [], []
    for _ in range(height):
        colour = rng.choice(canvas.NONZERO)
        row = [colour] * width
        for c in rng.sample(range(width), rng.randint(0, (width - 1) // 2)):
            row[c] = rng.choice([v for v in range(10) if v != colour])
        before.append(row)
        after.append([colour] * width)
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _clean_stripes(grid: Grid) -> Grid:
    rows = []
    for row in grid:
        ranked = Counter(row).most_common(2)
        if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
            return grid
        rows.append((ranked[0][0],) * len(row))
    return tuple(rows)


def _rectangles_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(6, 15), rng.randint(6, 15)
    layout = canvas.Layout(height, width)
    after = canvas.blank(height, width)
    colours = [c for c in canvas.NONZERO if c != NOISE]
    for colour in rng.sample(colours, rng.randint(1, 4)):
        box_h, box_w = rng.randint(3, 6), rng.randint(3, 6)
        canvas.stamp(after, canvas.rect_cells(box_h, box_w), colour, layout.place(rng, box_h, box_w))
    before = canvas.thaw(canvas.freeze(after))
    for index in rng.sample(range(height * width), rng.randint(2, max(2, height * width // 12))):
        before[index // width][index % width] = NOISE
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _clean_rectangles(grid: Grid) -> Grid:
    """Each colour but grey is a solid rectangle spanning its cells' bounding box; the rest is black."""
    board = canvas.blank(len(grid), len(grid[0]))
    for colour in sorted(canvas.colour_counts(grid)):
        if colour == NOISE:
            continue
        cells = tuple((r, c) for r, row in enumerate(grid) for c, v in enumerate(row) if v == colour)
        top, left, bottom, right = canvas.Blob(colour, cells).box
        for r in range(top, bottom + 1):
            board[r][left : right + 1] = [colour] * (right - left + 1)
    return canvas.freeze(board)


def _small_objects_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(6, 15), rng.randint(6, 15)
    layout = canvas.Layout(height, width)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for _ in range(rng.randint(1, 4)):
        box_h, box_w = rng.randint(2, 5), rng.randint(2, 5)
        cells, colour = canvas.sprite(rng, box_h, box_w, rng.uniform(0.5, 1.0)), rng.choice(canvas.NONZERO)
        if len(cells) < SMALL + 1:
            raise Redraw
        at = layout.place(rng, box_h, box_w)
        canvas.stamp(before, cells, colour, at)
        canvas.stamp(after, cells, colour, at)
    for _ in range(rng.randint(1, 5)):
        cells = canvas.polyomino(rng, rng.randint(1, SMALL - 1))
        canvas.stamp(before, cells, rng.choice(canvas.NONZERO), layout.place(rng, *canvas.extent(cells)))
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _remove_small(grid: Grid) -> Grid:
    board = canvas.thaw(grid)
    for blob in canvas.blobs(grid):
        if blob.size < SMALL:
            canvas.stamp(board, blob.cells, 0)
    return canvas.freeze(board)


TASKS = (
    OwnTask("own-remove-isolated-pixels", "denoising", "erase every coloured cell that has no coloured neighbour",
            "stream", _isolated_pair, _remove_isolated),
    OwnTask("own-denoise-row-stripes", "denoising", "every row becomes a solid stripe of its most common colour",
            "stream", _stripes_pair, _clean_stripes),
    OwnTask("own-denoise-rectangles", "denoising",
            "remove grey noise: restore each coloured rectangle and blank the background", "heldout",
            _rectangles_pair, _clean_rectangles),
    OwnTask("own-remove-small-objects", "denoising", "erase every object of fewer than 3 cells", "heldout",
            _small_objects_pair, _remove_small),
)
