"""Colour: fixed colour maps, swaps, inversions, erasures and recolouring by a cue in the grid."""

from __future__ import annotations

import random

import numpy as np

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask, Redraw

FIXED_MAP = {1: 5, 2: 6, 3: 4, 4: 9}
GREY = 5
# recolour-by-size: an object of n cells takes colour SIZE_COLOURS[n].
SIZE_COLOURS = {1: 4, 2: 2, 3: 1, 4: 3}


def _size(rng: random.Random, low: int = 3, high: int = 12) -> tuple[int, int]:
    return rng.randint(low, high), rng.randint(low, high)


def _colour_map_pair(rng: random.Random) -> Demo:
    height, width = _size(rng, 2, 10)
    board = canvas.scatter(rng, height, width, tuple(FIXED_MAP), rng.uniform(0.4, 0.9))
    canvas.ensure_colours(rng, board, tuple(FIXED_MAP))
    table = np.arange(10)
    for old, new in FIXED_MAP.items():
        table[old] = new
    return Demo(canvas.freeze(board), canvas.freeze(table[np.array(board)].tolist()))


def _colour_map(grid: Grid) -> Grid:
    return tuple(tuple(FIXED_MAP.get(v, v) for v in row) for row in grid)


def _colour_cycle_pair(rng: random.Random) -> Demo:
    height, width = _size(rng, 2, 10)
    colours = tuple(rng.sample(canvas.NONZERO, rng.randint(3, 6)))
    board = canvas.scatter(rng, height, width, colours, rng.uniform(0.4, 0.9))
    after = [[(v % 9) + 1 if v else 0 for v in row] for row in board]
    return Demo(canvas.freeze(board), canvas.freeze(after))


def _colour_cycle(grid: Grid) -> Grid:
    step = {c: c + 1 for c in range(1, 9)} | {9: 1, 0: 0}
    return tuple(tuple(step[v] for v in row) for row in grid)


def _swap_two_pair(rng: random.Random) -> Demo:
    height, width = _size(rng, 2, 10)
    a, b = rng.sample(canvas.NONZERO, 2)
    board = canvas.scatter(rng, height, width, (a, b), rng.uniform(0.4, 0.9))
    canvas.ensure_colours(rng, board, (a, b))
    swap = {a: b, b: a}
    return Demo(canvas.freeze(board), canvas.freeze([[swap.get(v, v) for v in row] for row in board]))


def _swap_two(grid: Grid) -> Grid:
    present = sorted(canvas.colour_counts(grid))
    if len(present) != 2:
        return grid
    a, b = present
    return tuple(tuple(b if v == a else a if v == b else v for v in row) for row in grid)


def _invert_pair(rng: random.Random) -> Demo:
    height, width = _size(rng, 2, 10)
    colour = rng.choice(canvas.NONZERO)
    board = canvas.scatter(rng, height, width, (colour,), rng.uniform(0.3, 0.7))
    canvas.ensure_colours(rng, board, (colour, 0))
    after = [[0 if v else colour for v in row] for row in board]
    return Demo(canvas.freeze(board), canvas.freeze(after))


def _invert(grid: Grid) -> Grid:
    present = sorted(canvas.colour_counts(grid))
    if len(present) != 1:
        return grid
    colour = present[0]
    return tuple(tuple(colour if v == 0 else 0 for v in row) for row in grid)


def _erase_grey_pair(rng: random.Random) -> Demo:
    height, width = _size(rng, 2, 10)
    others = rng.sample([c for c in canvas.NONZERO if c != GREY], rng.randint(1, 4))
    board = canvas.scatter(rng, height, width, (GREY, *others), rng.uniform(0.4, 0.9))
    canvas.ensure_colours(rng, board, (GREY,))
    return Demo(canvas.freeze(board), canvas.freeze([[0 if v == GREY else v for v in row] for row in board]))


def _erase_grey(grid: Grid) -> Grid:
    return tuple(tuple(v if v != GREY else 0 for v in row) for row in grid)


def _majority_fill_pair(rng: random.Random) -> Demo:
    height, width = _size(rng, 4, 12)
    colours = rng.sample(canvas.NONZERO, rng.randint(2, 4))
    budget = (height * width) // 2
    top = rng.randint(3, max(3, budget // 2))
    counts = [top] + [rng.randint(1, top - 1) for _ in colours[1:]]
    if sum(counts) > height * width:
        raise Redraw
    spots = rng.sample(range(height * width), sum(counts))
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    start = 0
    for colour, count in zip(colours, counts):
        for index in spots[start : start + count]:
            before[index // width][index % width] = colour
            after[index // width][index % width] = colours[0]
        start += count
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _majority_fill(grid: Grid) -> Grid:
    ranked = canvas.colour_counts(grid).most_common()
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return grid
    winner = ranked[0][0]
    return tuple(tuple(winner if v else 0 for v in row) for row in grid)


def _row_marker_pair(rng: random.Random) -> Demo:
    height, width = _size(rng, 3, 10)
    markers = [c for c in canvas.NONZERO if c != GREY]
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    density = rng.uniform(0.3, 0.7)
    for r in range(height):
        marker = rng.choice(markers)
        before[r][0] = after[r][0] = marker
        for c in range(2, width):
            if rng.random() < density:
                before[r][c], after[r][c] = GREY, marker
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _row_marker(grid: Grid) -> Grid:
    return tuple(tuple(row[0] if v == GREY and c > 0 else v for c, v in enumerate(row)) for row in grid)


def _recolour_by_size_pair(rng: random.Random) -> Demo:
    height, width = _size(rng, 5, 12)
    layout = canvas.Layout(height, width)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    sizes = [rng.randint(1, 4) for _ in range(rng.randint(3, 7))]
    if len(set(sizes)) < 2:
        raise Redraw
    for size in sizes:
        cells = canvas.polyomino(rng, size)
        at = layout.place(rng, *canvas.extent(cells))
        canvas.stamp(before, cells, GREY, at)
        canvas.stamp(after, cells, SIZE_COLOURS[size], at)
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _recolour_by_size(grid: Grid) -> Grid:
    board = canvas.thaw(grid)
    for blob in canvas.blobs(grid):
        if blob.colour == GREY and blob.size in SIZE_COLOURS:
            canvas.stamp(board, blob.cells, SIZE_COLOURS[blob.size])
    return canvas.freeze(board)


TASKS = (
    OwnTask("own-colour-map-fixed", "colour", "recolour 1->5, 2->6, 3->4, 4->9", "stream",
            _colour_map_pair, _colour_map),
    OwnTask("own-colour-cycle", "colour", "shift every colour up by one, 9 wrapping to 1; black stays", "heldout",
            _colour_cycle_pair, _colour_cycle),
    OwnTask("own-swap-two-colours", "colour", "swap the two colours present on black", "stream",
            _swap_two_pair, _swap_two),
    OwnTask("own-invert-single-colour", "colour",
            "black cells take the grid's one colour and coloured cells turn black", "heldout",
            _invert_pair, _invert),
    OwnTask("own-erase-grey", "colour", "turn every grey cell black", "stream",
            _erase_grey_pair, _erase_grey),
    OwnTask("own-majority-colour-fill", "colour", "recolour every coloured cell with the most frequent colour",
            "heldout", _majority_fill_pair, _majority_fill),
    OwnTask("own-recolour-by-row-marker", "colour",
            "grey cells take the colour of the marker in the first column of their row", "stream",
            _row_marker_pair, _row_marker),
    OwnTask("own-recolour-by-size", "colour",
            "grey objects are recoloured by cell count: 1->4, 2->2, 3->1, 4->3", "heldout",
            _recolour_by_size_pair, _recolour_by_size),
)
