"""Drawing grids for the own generators and reading them back for the reference rules.

Generators build on a mutable `Board` (a list of row lists) and freeze it into a `Grid`; every
random choice goes through the `random.Random` passed in, and sets are sorted before a choice so
the draw never depends on iteration order.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from orchestrator.arc import Grid
from orchestrator.tasks.own.registry import Redraw

Cell = tuple[int, int]
Board = list[list[int]]

STEPS4 = ((-1, 0), (1, 0), (0, -1), (0, 1))
STEPS8 = STEPS4 + ((-1, -1), (-1, 1), (1, -1), (1, 1))
NONZERO = tuple(range(1, 10))


def blank(height: int, width: int, colour: int = 0) -> Board:
    return [[colour] * width for _ in range(height)]


def freeze(board: Sequence[Sequence[int]]) -> Grid:
    return tuple(tuple(int(v) for v in row) for row in board)


def thaw(grid: Grid) -> Board:
    return [list(row) for row in grid]


def scatter(rng: random.Random, height: int, width: int, colours: Sequence[int], density: float) -> Board:
    """A board whose cells are, independently, a random colour from `colours` with probability `density`."""
    return [
        [rng.choice(colours) if rng.random() < density else 0 for _ in range(width)]
        for _ in range(height)
    ]


def ensure_colours(rng: random.Random, board: Board, colours: Sequence[int]) -> None:
    """Paint each of `colours` on its own random cell, so every one of them is present."""
    height, width = len(board), len(board[0])
    if len(colours) > height * width:
        raise Redraw
    for colour, index in zip(colours, rng.sample(range(height * width), len(colours))):
        board[index // width][index % width] = colour


def stamp(board: Board, cells: Iterable[Cell], colour: int, at: Cell = (0, 0)) -> None:
    top, left = at
    for r, c in cells:
        board[top + r][left + c] = colour


def rect_cells(height: int, width: int) -> list[Cell]:
    return [(r, c) for r in range(height) for c in range(width)]


def frame_cells(height: int, width: int) -> list[Cell]:
    return [(r, c) for r, c in rect_cells(height, width) if r in (0, height - 1) or c in (0, width - 1)]


def _l_path(rng: random.Random, start: Cell, end: Cell) -> list[Cell]:
    (r0, c0), (r1, c1) = start, end
    rows = range(r0, r1 + 1) if r1 >= r0 else range(r0, r1 - 1, -1)
    cols = range(c0, c1 + 1) if c1 >= c0 else range(c0, c1 - 1, -1)
    if rng.random() < 0.5:
        return [(r, c0) for r in rows] + [(r1, c) for c in cols]
    return [(r0, c) for c in cols] + [(r, c1) for r in rows]


def sprite(rng: random.Random, height: int, width: int, fill: float = 0.6) -> list[Cell]:
    """A random 4-connected shape whose bounding box is exactly `height` x `width`, sorted cells."""
    centre = (rng.randrange(height), rng.randrange(width))
    anchors = [
        (0, rng.randrange(width)),
        (height - 1, rng.randrange(width)),
        (rng.randrange(height), 0),
        (rng.randrange(height), width - 1),
    ]
    cells = {centre}
    for anchor in anchors:
        cells.update(_l_path(rng, centre, anchor))
    target = max(len(cells), round(fill * height * width))
    while len(cells) < target:
        frontier = sorted(
            {
                (r + dr, c + dc)
                for r, c in cells
                for dr, dc in STEPS4
                if 0 <= r + dr < height and 0 <= c + dc < width
            }
            - cells
        )
        cells.add(rng.choice(frontier))
    return sorted(cells)


def polyomino(rng: random.Random, size: int) -> list[Cell]:
    """A random 4-connected shape of exactly `size` cells, shifted to start at (0, 0)."""
    cells = {(0, 0)}
    while len(cells) < size:
        frontier = sorted({(r + dr, c + dc) for r, c in cells for dr, dc in STEPS4} - cells)
        cells.add(rng.choice(frontier))
    top = min(r for r, _ in cells)
    left = min(c for _, c in cells)
    return sorted((r - top, c - left) for r, c in cells)


def extent(cells: Iterable[Cell]) -> tuple[int, int]:
    """Height and width of the bounding box of cells that start at (0, 0)."""
    cells = list(cells)
    return max(r for r, _ in cells) + 1, max(c for _, c in cells) + 1


class Layout:
    """Places boxes on a board so that no two touch, not even diagonally (a gap of `margin`)."""

    def __init__(self, height: int, width: int) -> None:
        self.height = height
        self.width = width
        self.boxes: list[tuple[int, int, int, int]] = []

    def place(self, rng: random.Random, height: int, width: int, margin: int = 1, tries: int = 60) -> Cell:
        """Top-left corner of a free `height` x `width` box; raises `Redraw` if none is found."""
        if height > self.height or width > self.width:
            raise Redraw
        for _ in range(tries):
            top = rng.randint(0, self.height - height)
            left = rng.randint(0, self.width - width)
            if all(
                top + height + margin <= t
                or t + h + margin <= top
                or left + width + margin <= l
                or l + w + margin <= left
                for t, l, h, w in self.boxes
            ):
                self.boxes.append((top, left, height, width))
                return top, left
        raise Redraw


@dataclass(frozen=True)
class Blob:
    """A connected group of same-coloured non-background cells, as the reference rules see it."""

    colour: int
    cells: tuple[Cell, ...]

    @property
    def size(self) -> int:
        return len(self.cells)

    @property
    def box(self) -> tuple[int, int, int, int]:
        """(top, left, bottom, right), inclusive."""
        rows = [r for r, _ in self.cells]
        cols = [c for _, c in self.cells]
        return min(rows), min(cols), max(rows), max(cols)


def blobs(grid: Grid, diagonal: bool = True, background: int = 0) -> list[Blob]:
    """Connected same-colour groups of non-background cells, in reading order of their first cell."""
    height, width = len(grid), len(grid[0])
    steps = STEPS8 if diagonal else STEPS4
    seen = [[False] * width for _ in range(height)]
    found: list[Blob] = []
    for r in range(height):
        for c in range(width):
            colour = grid[r][c]
            if seen[r][c] or colour == background:
                continue
            seen[r][c] = True
            stack, cells = [(r, c)], []
            while stack:
                cr, cc = stack.pop()
                cells.append((cr, cc))
                for dr, dc in steps:
                    nr, nc = cr + dr, cc + dc
                    if 0 <= nr < height and 0 <= nc < width and not seen[nr][nc] and grid[nr][nc] == colour:
                        seen[nr][nc] = True
                        stack.append((nr, nc))
            found.append(Blob(colour, tuple(sorted(cells))))
    return found


def nonzero_box(grid: Grid) -> tuple[int, int, int, int] | None:
    """(top, left, bottom, right) of all non-zero cells, inclusive; None for an empty grid."""
    cells = [(r, c) for r, row in enumerate(grid) for c, v in enumerate(row) if v]
    if not cells:
        return None
    return Blob(0, tuple(cells)).box


def crop(grid: Grid, box: tuple[int, int, int, int]) -> Grid:
    top, left, bottom, right = box
    return tuple(row[left : right + 1] for row in grid[top : bottom + 1])


def blob_grid(blob: Blob) -> Grid:
    """The blob alone, cropped to its bounding box, background 0."""
    top, left, bottom, right = blob.box
    board = blank(bottom - top + 1, right - left + 1)
    for r, c in blob.cells:
        board[r - top][c - left] = blob.colour
    return freeze(board)


def colour_counts(grid: Grid) -> Counter[int]:
    """How many cells of each non-zero colour."""
    return Counter(v for row in grid for v in row if v)


def outside_zeros(grid: Grid) -> set[Cell]:
    """Zero cells reachable from the grid's edge through zero cells (4-connected)."""
    height, width = len(grid), len(grid[0])
    stack = [
        (r, c)
        for r in range(height)
        for c in range(width)
        if (r in (0, height - 1) or c in (0, width - 1)) and grid[r][c] == 0
    ]
    reached = set(stack)
    while stack:
        r, c = stack.pop()
        for dr, dc in STEPS4:
            nr, nc = r + dr, c + dc
            if 0 <= nr < height and 0 <= nc < width and grid[nr][nc] == 0 and (nr, nc) not in reached:
                reached.add((nr, nc))
                stack.append((nr, nc))
    return reached
