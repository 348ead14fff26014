"""Objects: find the connected shapes on black and crop, keep, recolour or hollow them.

An object is a same-coloured, 8-connected group; generators keep objects a cell apart so the
reference rules can find them again by connectivity alone.
"""

from __future__ import annotations

import random

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask, Redraw

GREY = 5
SOLID, HOLLOW = 1, 2  # recolour-hollow-solid
EDGE_COLOUR = 2  # recolour-border-objects


def _board(rng: random.Random, low: int = 7, high: int = 14) -> tuple[int, int]:
    return rng.randint(low, high), rng.randint(low, high)


def _objects(rng: random.Random, height: int, width: int, count: int, max_side: int = 5,
             colours: list[int] | None = None) -> list[tuple[list[canvas.Cell], int, canvas.Cell]]:
    """`count` separated sprites (cells, colour, top-left); distinct colours unless `colours` given."""
    layout = canvas.Layout(height, width)
    palette = colours or rng.sample(canvas.NONZERO, count)
    placed = []
    for colour in palette[:count]:
        box_h, box_w = rng.randint(1, max_side), rng.randint(1, max_side)
        cells = canvas.sprite(rng, box_h, box_w, rng.uniform(0.4, 0.9))
        placed.append((cells, colour, layout.place(rng, box_h, box_w)))
    return placed


def _alone(cells: list[canvas.Cell], colour: int, scale: int = 1) -> canvas.Board:
    box_h, box_w = canvas.extent(cells)
    board = canvas.blank(box_h * scale, box_w * scale)
    for r, c in cells:
        for dr in range(scale):
            for dc in range(scale):
                board[r * scale + dr][c * scale + dc] = colour
    return board


def _draw(height: int, width: int, placed) -> canvas.Board:
    board = canvas.blank(height, width)
    for cells, colour, at in placed:
        canvas.stamp(board, cells, colour, at)
    return board


def _crop_box_pair(rng: random.Random) -> Demo:
    height, width = _board(rng, 4, 14)
    box_h, box_w = rng.randint(1, min(6, height)), rng.randint(1, min(6, width))
    if box_h * box_w == 1:
        raise Redraw
    cells = canvas.sprite(rng, box_h, box_w, rng.uniform(0.4, 0.9))
    main, accent = rng.sample(canvas.NONZERO, 2)
    two_tone = rng.random() < 0.5
    piece = [[(accent if two_tone and rng.random() < 0.3 else main) if (r, c) in cells else 0
              for c in range(box_w)] for r in range(box_h)]
    top, left = rng.randint(0, height - box_h), rng.randint(0, width - box_w)
    board = canvas.blank(height, width)
    for r in range(box_h):
        board[top + r][left : left + box_w] = piece[r]
    return Demo(canvas.freeze(board), canvas.freeze(piece))


def _crop_box(grid: Grid) -> Grid:
    box = canvas.nonzero_box(grid)
    return grid if box is None else canvas.crop(grid, box)


def _by_size_pair(rng: random.Random, pick, keep_in_place: bool = False, scale: int = 1) -> Demo:
    height, width = _board(rng)
    placed = _objects(rng, height, width, rng.randint(2, 4))
    sizes = [len(cells) for cells, _, _ in placed]
    if len(set(sizes)) != len(sizes):
        raise Redraw
    chosen = placed[sizes.index(pick(sizes))]
    before = _draw(height, width, placed)
    if keep_in_place:
        return Demo(canvas.freeze(before), canvas.freeze(_draw(height, width, [chosen])))
    return Demo(canvas.freeze(before), canvas.freeze(_alone(chosen[0], chosen[1], scale)))


def _chosen_blob(grid: Grid, pick) -> canvas.Blob | None:
    found = canvas.blobs(grid)
    sizes = [b.size for b in found]
    if not found or sizes.count(pick(sizes)) != 1:
        return None
    return found[sizes.index(pick(sizes))]


def _extract_smallest(grid: Grid) -> Grid:
    blob = _chosen_blob(grid, min)
    return grid if blob is None else canvas.blob_grid(blob)


def _extract_largest(grid: Grid) -> Grid:
    blob = _chosen_blob(grid, max)
    return grid if blob is None else canvas.blob_grid(blob)


def _keep_largest(grid: Grid) -> Grid:
    blob = _chosen_blob(grid, max)
    if blob is None:
        return grid
    board = canvas.blank(len(grid), len(grid[0]))
    canvas.stamp(board, blob.cells, blob.colour)
    return canvas.freeze(board)


def _largest_scaled(grid: Grid) -> Grid:
    blob = _chosen_blob(grid, max)
    if blob is None:
        return grid
    small = canvas.blob_grid(blob)
    return tuple(tuple(v for v in row for _ in range(2)) for row in small for _ in range(2))


def _hollow_solid_pair(rng: random.Random) -> Demo:
    height, width = _board(rng, 8, 15)
    layout = canvas.Layout(height, width)
    kinds = [rng.random() < 0.5 for _ in range(rng.randint(2, 5))]
    kinds[:2] = [True, False]
    rng.shuffle(kinds)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for solid in kinds:
        box_h, box_w = rng.randint(3, 5), rng.randint(3, 5)
        cells = canvas.rect_cells(box_h, box_w) if solid else canvas.frame_cells(box_h, box_w)
        at = layout.place(rng, box_h, box_w)
        canvas.stamp(before, cells, GREY, at)
        canvas.stamp(after, cells, SOLID if solid else HOLLOW, at)
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _hollow_solid(grid: Grid) -> Grid:
    board = canvas.thaw(grid)
    for blob in canvas.blobs(grid):
        if blob.colour == GREY:
            top, left, bottom, right = blob.box
            solid = blob.size == (bottom - top + 1) * (right - left + 1)
            canvas.stamp(board, blob.cells, SOLID if solid else HOLLOW)
    return canvas.freeze(board)


def _hollow_out_pair(rng: random.Random) -> Demo:
    height, width = _board(rng, 5, 15)
    layout = canvas.Layout(height, width)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for colour in rng.sample(canvas.NONZERO, rng.randint(1, 4)):
        box_h, box_w = rng.randint(3, 6), rng.randint(3, 6)
        at = layout.place(rng, box_h, box_w)
        canvas.stamp(before, canvas.rect_cells(box_h, box_w), colour, at)
        canvas.stamp(after, canvas.frame_cells(box_h, box_w), colour, at)
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _hollow_out(grid: Grid) -> Grid:
    height, width = len(grid), len(grid[0])

    def inner(r: int, c: int) -> bool:
        return all(
            0 <= r + dr < height and 0 <= c + dc < width and grid[r + dr][c + dc] == grid[r][c]
            for dr, dc in canvas.STEPS8
        )

    return tuple(tuple(0 if v and inner(r, c) else v for c, v in enumerate(row)) for r, row in enumerate(grid))


def _touches_edge(cells: list[canvas.Cell], at: canvas.Cell, height: int, width: int) -> bool:
    box_h, box_w = canvas.extent(cells)
    return at[0] == 0 or at[1] == 0 or at[0] + box_h == height or at[1] + box_w == width


def _border_objects_pair(rng: random.Random) -> Demo:
    height, width = _board(rng)
    placed = _objects(rng, height, width, rng.randint(3, 6), max_side=4, colours=[GREY] * 6)
    touching = [_touches_edge(cells, at, height, width) for cells, _, at in placed]
    if all(touching) or not any(touching):
        raise Redraw
    recoloured = [(cells, EDGE_COLOUR if edge else GREY, at) for (cells, _, at), edge in zip(placed, touching)]
    return Demo(canvas.freeze(_draw(height, width, placed)), canvas.freeze(_draw(height, width, recoloured)))


def _border_objects(grid: Grid) -> Grid:
    height, width = len(grid), len(grid[0])
    board = canvas.thaw(grid)
    for blob in canvas.blobs(grid):
        if any(r in (0, height - 1) or c in (0, width - 1) for r, c in blob.cells):
            canvas.stamp(board, blob.cells, EDGE_COLOUR)
    return canvas.freeze(board)


TASKS = (
    OwnTask("own-crop-bounding-box", "objects", "crop the grid to the bounding box of its one object", "stream",
            _crop_box_pair, _crop_box),
    OwnTask("own-extract-largest-object", "objects", "output the object with the most cells, cropped", "heldout",
            lambda rng: _by_size_pair(rng, max), _extract_largest),
    OwnTask("own-extract-smallest-object", "objects", "output the object with the fewest cells, cropped", "stream",
            lambda rng: _by_size_pair(rng, min), _extract_smallest),
    OwnTask("own-keep-largest-object", "objects", "erase every object but the one with the most cells", "heldout",
            lambda rng: _by_size_pair(rng, max, keep_in_place=True), _keep_largest),
    OwnTask("own-recolour-hollow-solid", "objects",
            "grey rectangles become blue if solid, red if hollow frames", "stream",
            _hollow_solid_pair, _hollow_solid),
    OwnTask("own-recolour-border-objects", "objects", "grey objects touching the grid's edge turn red", "heldout",
            _border_objects_pair, _border_objects),
    OwnTask("own-hollow-out-rectangles", "objects", "blank the interior of every solid rectangle, keeping its outline",
            "stream", _hollow_out_pair, _hollow_out),
    OwnTask("own-crop-largest-then-upscale", "objects",
            "crop the object with the most cells, then scale it up by 2", "heldout",
            lambda rng: _by_size_pair(rng, max, scale=2), _largest_scaled),
)
