"""Counting: the output's size or content is a count of cells, colours or objects in the input."""

from __future__ import annotations

import random

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask, Redraw

TALLY = 1  # count-objects-square marks its tally in blue


def _spots(rng: random.Random, height: int, width: int, count: int) -> list[canvas.Cell]:
    if count > height * width:
        raise Redraw
    return [(i // width, i % width) for i in rng.sample(range(height * width), count)]


def _count_cells_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(3, 10), rng.randint(3, 10)
    colour, count = rng.choice(canvas.NONZERO), rng.randint(1, 10)
    board = canvas.blank(height, width)
    canvas.stamp(board, _spots(rng, height, width, count), colour)
    return Demo(canvas.freeze(board), ((colour,) * count,))


def _count_cells(grid: Grid) -> Grid:
    counts = canvas.colour_counts(grid)
    if len(counts) != 1:
        return grid
    (colour, count), = counts.items()
    return ((colour,) * count,)


def _scattered_counts(rng: random.Random, counts: list[int]) -> tuple[canvas.Board, list[int]]:
    """A board with counts[i] cells of colour i, at random places; returns the board and colours."""
    height, width = rng.randint(3, 10), rng.randint(3, 10)
    colours = rng.sample(canvas.NONZERO, len(counts))
    spots = _spots(rng, height, width, sum(counts))
    board = canvas.blank(height, width)
    start = 0
    for colour, count in zip(colours, counts):
        canvas.stamp(board, spots[start : start + count], colour)
        start += count
    return board, colours


def _majority_pair(rng: random.Random) -> Demo:
    top = rng.randint(3, 9)
    counts = [top] + [rng.randint(1, top - 1) for _ in range(rng.randint(1, 3))]
    board, colours = _scattered_counts(rng, counts)
    return Demo(canvas.freeze(board), ((colours[0],),))


def _majority(grid: Grid) -> Grid:
    ranked = canvas.colour_counts(grid).most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return grid
    return ((ranked[0][0],),) if ranked else grid


def _minority_pair(rng: random.Random) -> Demo:
    least = rng.randint(1, 4)
    counts = [least] + [rng.randint(least + 1, 9) for _ in range(rng.randint(1, 3))]
    board, colours = _scattered_counts(rng, counts)
    return Demo(canvas.freeze(board), ((colours[0],),))


def _minority(grid: Grid) -> Grid:
    ranked = canvas.colour_counts(grid).most_common()
    if len(ranked) > 1 and ranked[-1][1] == ranked[-2][1]:
        return grid
    return ((ranked[-1][0],),) if ranked else grid


def _histogram_pair(rng: random.Random) -> Demo:
    counts = sorted(rng.sample(range(1, 9), rng.randint(2, 4)), reverse=True)
    board, colours = _scattered_counts(rng, counts)
    rows = tuple((colour,) * count + (0,) * (counts[0] - count) for colour, count in zip(colours, counts))
    return Demo(canvas.freeze(board), rows)


def _histogram(grid: Grid) -> Grid:
    ranked = sorted(canvas.colour_counts(grid).items(), key=lambda item: (-item[1], item[0]))
    if not ranked:
        return grid
    width = ranked[0][1]
    return tuple(tuple(colour if i < count else 0 for i in range(width)) for colour, count in ranked)


def _objects(rng: random.Random, count: int, colours: list[int]) -> canvas.Board:
    low = 5 + count // 2  # room for the objects, so large counts are not mostly redrawn
    height, width = rng.randint(low, 13), rng.randint(low, 13)
    layout = canvas.Layout(height, width)
    board = canvas.blank(height, width)
    for colour in colours[:count]:
        box_h, box_w = rng.randint(1, 3), rng.randint(1, 3)
        cells = canvas.sprite(rng, box_h, box_w, rng.uniform(0.4, 1.0))
        canvas.stamp(board, cells, colour, layout.place(rng, box_h, box_w))
    return board


def _count_objects_pair(rng: random.Random) -> Demo:
    colour, count = rng.choice(canvas.NONZERO), rng.randint(1, 8)
    return Demo(canvas.freeze(_objects(rng, count, [colour] * count)), ((colour,) * count,))


def _count_objects(grid: Grid) -> Grid:
    found = canvas.blobs(grid)
    if not found or len({b.colour for b in found}) != 1:
        return grid
    return ((found[0].colour,) * len(found),)


def _objects_square_pair(rng: random.Random) -> Demo:
    count = rng.randint(1, 9)
    board = _objects(rng, count, [rng.choice(canvas.NONZERO) for _ in range(count)])
    tally = [TALLY] * count + [0] * (9 - count)
    return Demo(canvas.freeze(board), canvas.freeze([tally[0:3], tally[3:6], tally[6:9]]))


def _objects_square(grid: Grid) -> Grid:
    count = len(canvas.blobs(grid))
    return tuple(tuple(TALLY if r * 3 + c < count else 0 for c in range(3)) for r in range(3))


TASKS = (
    OwnTask("own-count-cells-bar", "counting", "a one-row bar as long as the number of coloured cells, in their colour",
            "stream", _count_cells_pair, _count_cells),
    OwnTask("own-majority-colour", "counting", "a 1x1 grid of the most frequent colour", "stream",
            _majority_pair, _majority),
    OwnTask("own-colour-histogram", "counting",
            "one row per colour, as long as its count, most frequent first", "stream",
            _histogram_pair, _histogram),
    OwnTask("own-count-objects-bar", "counting", "a one-row bar as long as the number of objects, in their colour",
            "heldout", _count_objects_pair, _count_objects),
    OwnTask("own-minority-colour", "counting", "a 1x1 grid of the least frequent colour", "heldout",
            _minority_pair, _minority),
    OwnTask("own-count-objects-square", "counting",
            "a 3x3 grid with as many blue cells, in reading order, as the input has objects", "heldout",
            _objects_square_pair, _objects_square),
)
