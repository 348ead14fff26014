"""Gravity: cells or whole objects fall towards an edge, stopping at walls and at each other."""

from __future__ import annotations

import random

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask

WALL = 5


def _fallen_columns(rng: random.Random, height: int, width: int) -> tuple[canvas.Board, canvas.Board]:
    """A board of loose cells and the same cells fallen to the bottom of their columns."""
    palette = rng.sample([c for c in canvas.NONZERO if c != WALL], rng.randint(1, 4))
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for c in range(width):
        rows = sorted(rng.sample(range(height), rng.randint(0, height - 1)))
        for i, r in enumerate(rows):
            colour = rng.choice(palette)
            before[r][c] = colour
            after[height - len(rows) + i][c] = colour
    return before, after


def _transposed(board: canvas.Board) -> canvas.Board:
    return [list(col) for col in zip(*board)]


def _down_pair(rng: random.Random) -> Demo:
    before, after = _fallen_columns(rng, rng.randint(3, 10), rng.randint(3, 10))
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _right_pair(rng: random.Random) -> Demo:
    before, after = _fallen_columns(rng, rng.randint(3, 10), rng.randint(3, 10))
    return Demo(canvas.freeze(_transposed(before)), canvas.freeze(_transposed(after)))


def _left_pair(rng: random.Random) -> Demo:
    before, after = _fallen_columns(rng, rng.randint(3, 10), rng.randint(3, 10))
    # transposing turns a fall to the bottom into a fall to the right; mirroring rows makes it left
    before, after = ([row[::-1] for row in _transposed(board)] for board in (before, after))
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _pack_right(row: tuple[int, ...]) -> tuple[int, ...]:
    cells = tuple(v for v in row if v)
    return (0,) * (len(row) - len(cells)) + cells


def _fall_down(grid: Grid) -> Grid:
    return tuple(zip(*(_pack_right(col) for col in zip(*grid))))


def _fall_right(grid: Grid) -> Grid:
    return tuple(_pack_right(row) for row in grid)


def _fall_left(grid: Grid) -> Grid:
    return tuple(_pack_right(row[::-1])[::-1] for row in grid)


def _slide_object_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(4, 14), rng.randint(2, 14)
    box_h, box_w = rng.randint(1, min(5, height - 1)), rng.randint(1, min(5, width))
    cells = canvas.sprite(rng, box_h, box_w, rng.uniform(0.4, 0.9))
    main, accent = rng.sample(canvas.NONZERO, 2)
    colours = {cell: (accent if rng.random() < 0.25 else main) for cell in cells}
    top, left = rng.randint(0, height - box_h - 1), rng.randint(0, width - box_w)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for (r, c), colour in colours.items():
        before[top + r][left + c] = colour
        after[height - box_h + r][left + c] = colour
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _slide_object(grid: Grid) -> Grid:
    box = canvas.nonzero_box(grid)
    if box is None:
        return grid
    drop = len(grid) - 1 - box[2]
    board = canvas.blank(len(grid), len(grid[0]))
    for r, row in enumerate(grid):
        for c, v in enumerate(row):
            if v:
                board[r + drop][c] = v
    return canvas.freeze(board)


def _obstacles_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(4, 12), rng.randint(3, 12)
    palette = rng.sample([c for c in canvas.NONZERO if c != WALL], rng.randint(1, 3))
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for c in range(width):
        walls = [r for r in range(height) if rng.random() < 0.18]
        for r in walls:
            before[r][c] = after[r][c] = WALL
        for top, floor in zip([-1, *walls], [*walls, height]):
            span = range(top + 1, floor)
            rows = sorted(rng.sample(span, rng.randint(0, len(span))))
            for i, r in enumerate(rows):
                colour = rng.choice(palette)
                before[r][c] = colour
                after[floor - len(rows) + i][c] = colour
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _fall_onto_walls(grid: Grid) -> Grid:
    columns = []
    for col in zip(*grid):
        settled: list[int] = []
        segment: list[int] = []
        for v in (*col, WALL):
            if v == WALL:
                settled.extend(_pack_right(tuple(segment)))
                settled.append(WALL)
                segment = []
            else:
                segment.append(v)
        columns.append(tuple(settled[:-1]))
    return tuple(zip(*columns))


def _sort_bars_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(3, 10), rng.randint(3, 10)
    colour = rng.choice(canvas.NONZERO)
    heights = [rng.randint(1, height) for _ in range(width)]
    return Demo(canvas.freeze(_bars(heights, height, colour)), canvas.freeze(_bars(sorted(heights), height, colour)))


def _bars(heights: list[int], height: int, colour: int) -> canvas.Board:
    return [[colour if height - r <= h else 0 for h in heights] for r in range(height)]


def _sort_bars(grid: Grid) -> Grid:
    counts = canvas.colour_counts(grid)
    if len(counts) != 1:
        return grid
    columns = sorted((tuple(v for v in col if v) for col in zip(*grid)), key=len)
    return tuple(zip(*((0,) * (len(grid) - len(col)) + col for col in columns)))


TASKS = (
    OwnTask("own-gravity-down", "gravity", "every coloured cell falls to the bottom of its column, keeping order",
            "stream", _down_pair, _fall_down),
    OwnTask("own-gravity-right", "gravity", "every coloured cell slides to the right end of its row, keeping order",
            "stream", _right_pair, _fall_right),
    OwnTask("own-slide-object-down", "gravity", "the one object drops as a whole until it rests on the bottom edge",
            "stream", _slide_object_pair, _slide_object),
    OwnTask("own-gravity-left", "gravity", "every coloured cell slides to the left end of its row, keeping order",
            "heldout", _left_pair, _fall_left),
    OwnTask("own-gravity-onto-walls", "gravity",
            "coloured cells fall down their column and stop on grey walls, which stay put", "heldout",
            _obstacles_pair, _fall_onto_walls),
    OwnTask("own-sort-bars", "gravity", "bottom-standing bars are reordered from shortest to tallest, left to right",
            "heldout", _sort_bars_pair, _sort_bars),
)
