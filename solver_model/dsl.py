"""The grid DSL of the embedded solver model: primitives from a grid to a grid.

Every primitive exists twice, and both must agree cell for cell:
- `apply`, on numpy arrays (uint8), which the program search runs thousands of times;
- `pure`, plain standard-library Python on lists of lists, whose source text becomes the body of
  a model-written program (`Program.source()` in `solver_model.search`).

The pure functions are named `pure_<primitive>` and their helpers `pure__<helper>`; the prefix is
dropped when their source is copied into a program, so a program reads `rot90(grid)`. Pure
functions use builtins only (no module constants, no imports), so their text runs on its own.

A primitive never raises on a valid grid: it returns None when it does not apply (the program is
then inapplicable). Results larger than 30 a side or empty are rejected by `apply_step` (and by the
same check in a program's `transform`). Background is colour 0. Objects are 8-connected groups of
same-coloured non-zero cells, as in `orchestrator.tasks.own.canvas.blobs`.

Parametric primitives learn their parameters from examples, pairs of (grid reached so far, the
pair's output); learning sees the demonstration pairs only, never a test output.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.arc import MAX_SIDE, Grid

Array = np.ndarray
Params = tuple
Example = tuple[Array, Array]  # (grid reached so far on a pair, that pair's output)
Board = list[list[int]]

# --- conversions -------------------------------------------------------------------------------


def to_array(grid: Grid) -> Array:
    return np.array(grid, dtype=np.uint8)


def to_grid(array: Array) -> Grid:
    return tuple(tuple(row) for row in array.tolist())


def valid(array: Array | None) -> bool:
    """Whether a primitive's result is a grid: two dimensions of 1 to 30 cells."""
    return (array is not None and array.ndim == 2
            and 1 <= array.shape[0] <= MAX_SIDE and 1 <= array.shape[1] <= MAX_SIDE)


def _from_pure(pure: Callable[..., Board | None], objects: bool = False) -> Callable[..., Array | None]:
    """The array form of a primitive whose work is graph search anyway (objects, flood fill).

    With `objects`, the pure function is handed the grid's objects, found once per grid.
    """
    def apply(array: Array, *params: int) -> Array | None:
        if objects:
            out = pure(array.tolist(), *params, found=_objects(array.shape, array.tobytes()))
        else:
            out = pure(array.tolist(), *params)
        return None if out is None else np.array(out, dtype=np.uint8)
    return apply


# Small on purpose: the search applies the object primitives to one grid back to back.
@functools.lru_cache(maxsize=256)
def _objects(shape: tuple[int, int], data: bytes) -> list:
    """`pure__objects` of the grid with these bytes; callers must not change the list."""
    return pure__objects(np.frombuffer(data, dtype=np.uint8).reshape(shape).tolist())


# --- pure helpers ------------------------------------------------------------------------------


def pure__colour_counts(grid):
    counts = [0] * 10
    for row in grid:
        for value in row:
            counts[value] += 1
    return counts


def pure__majority(grid):
    """The most frequent non-zero colour, or None when there is none or a tie."""
    counts = pure__colour_counts(grid)[1:]
    best = max(counts)
    if best == 0 or counts.count(best) > 1:
        return None
    return counts.index(best) + 1


def pure__minority(grid):
    """The least frequent non-zero colour present, or None when there is none or a tie."""
    counts = pure__colour_counts(grid)[1:]
    present = [n for n in counts if n > 0]
    if not present:
        return None
    least = min(present)
    if present.count(least) > 1:
        return None
    return counts.index(least) + 1


def pure__objects(grid):
    """8-connected groups of same-coloured non-zero cells, as (colour, cells), in reading order."""
    height, width = len(grid), len(grid[0])
    stride = width + 2
    # A flat copy framed by -1 cells, so neighbours need no bounds checks; visited cells become -1.
    flat = [-1] * (stride * (height + 2))
    for r, row in enumerate(grid):
        flat[(r + 1) * stride + 1 : (r + 1) * stride + 1 + width] = row
    steps = (-stride - 1, -stride, -stride + 1, -1, 1, stride - 1, stride, stride + 1)
    found = []
    for start in range(stride + 1, stride * (height + 1)):
        colour = flat[start]
        if colour <= 0:
            continue
        flat[start] = -1
        stack, cells = [start], []
        while stack:
            at = stack.pop()
            cells.append((at // stride - 1, at % stride - 1))
            for step in steps:
                if flat[at + step] == colour:
                    flat[at + step] = -1
                    stack.append(at + step)
        found.append((colour, cells))
    return found


def pure__by_size(found, largest):
    """The object with the most (or fewest) cells, or None when there is none or a tie."""
    if not found:
        return None
    sizes = [len(cells) for _, cells in found]
    size = max(sizes) if largest else min(sizes)
    if sizes.count(size) > 1:
        return None
    return found[sizes.index(size)]


def pure__crop_object(chosen):
    if chosen is None:
        return None
    colour, cells = chosen
    top, bottom = min(r for r, _ in cells), max(r for r, _ in cells)
    left, right = min(c for _, c in cells), max(c for _, c in cells)
    inside = set(cells)
    return [[colour if (r, c) in inside else 0 for c in range(left, right + 1)] for r in range(top, bottom + 1)]


def pure__keep_object(grid, chosen):
    if chosen is None:
        return None
    inside = set(chosen[1])
    return [[v if (r, c) in inside else 0 for c, v in enumerate(row)] for r, row in enumerate(grid)]


def pure__recolour_object(grid, chosen, colour):
    if chosen is None:
        return None
    inside = set(chosen[1])
    return [[colour if (r, c) in inside else v for c, v in enumerate(row)] for r, row in enumerate(grid)]


def pure__near_nonzero(grid):
    """For each cell, whether any of its 8 neighbours is non-zero."""
    height, width = len(grid), len(grid[0])
    near = [[False] * width for _ in range(height)]
    for r in range(height):
        for c in range(width):
            near[r][c] = any(
                grid[y][x] != 0
                for y in range(max(r - 1, 0), min(r + 2, height))
                for x in range(max(c - 1, 0), min(c + 2, width))
                if (y, x) != (r, c)
            )
    return near


def pure__connected(line):
    """The line with the gap between each two consecutive same-coloured cells filled."""
    out = list(line)
    last = None
    for i, value in enumerate(line):
        if value:
            if last is not None and line[last] == value:
                for j in range(last + 1, i):
                    out[j] = value
            last = i
    return out


def pure__carry(line):
    """The line with each black cell taking the nearest colour before it."""
    out, colour = [], 0
    for value in line:
        colour = value or colour
        out.append(colour)
    return out


def pure__halves(grid):
    """The two halves either side of a middle separator line, else the two exact halves."""
    height, width = len(grid), len(grid[0])
    if width % 2 == 1 and width > 1:
        middle = [row[width // 2] for row in grid]
        if middle[0] != 0 and middle.count(middle[0]) == height:
            return [row[: width // 2] for row in grid], [row[width // 2 + 1 :] for row in grid]
    if height % 2 == 1 and height > 1:
        middle = grid[height // 2]
        if middle[0] != 0 and middle.count(middle[0]) == width:
            return [list(row) for row in grid[: height // 2]], [list(row) for row in grid[height // 2 + 1 :]]
    if width % 2 == 0:
        return [row[: width // 2] for row in grid], [row[width // 2 :] for row in grid]
    if height % 2 == 0:
        return [list(row) for row in grid[: height // 2]], [list(row) for row in grid[height // 2 :]]
    return None


def pure__combine_halves(grid, colour, rule):
    """`colour` where rule[2 * (first half set) + (second half set)] holds, else 0."""
    halves = pure__halves(grid)
    if halves is None:
        return None
    first, second = halves
    return [
        [colour if rule[2 * (x != 0) + (y != 0)] else 0 for x, y in zip(row_a, row_b)]
        for row_a, row_b in zip(first, second)
    ]


def pure__downscale(grid, k):
    height, width = len(grid), len(grid[0])
    if height % k or width % k:
        return None
    small = [row[::k] for row in grid[::k]]
    for r in range(height):
        for c in range(width):
            if grid[r][c] != small[r // k][c // k]:
                return None
    return small


# --- pure primitives ---------------------------------------------------------------------------
# Symmetries of the square.


def pure_identity(grid):
    return [list(row) for row in grid]


def pure_rot90(grid):
    """A quarter turn clockwise."""
    return [list(row) for row in zip(*grid[::-1])]


def pure_rot180(grid):
    return [list(row)[::-1] for row in grid[::-1]]


def pure_rot270(grid):
    """A quarter turn anticlockwise."""
    return [list(row) for row in zip(*grid)][::-1]


def pure_flip_h(grid):
    """Mirror left to right."""
    return [list(row)[::-1] for row in grid]


def pure_flip_v(grid):
    """Mirror top to bottom."""
    return [list(row) for row in grid[::-1]]


def pure_transpose(grid):
    return [list(row) for row in zip(*grid)]


def pure_anti_transpose(grid):
    return [list(row) for row in zip(*[list(r)[::-1] for r in grid[::-1]])]


# Colours.


def pure_colour_map(grid, *pairs):
    """Each (from, to) pair recolours every `from` cell; a colour with no pair makes it inapplicable."""
    mapping = dict(pairs)
    if any(v not in mapping for row in grid for v in row):
        return None
    return [[mapping[v] for v in row] for row in grid]


def pure_remove_colour(grid, colour):
    return [[0 if v == colour else v for v in row] for row in grid]


def pure_keep_colour(grid, colour):
    return [[v if v == colour else 0 for v in row] for row in grid]


def pure_keep_majority_colour(grid):
    colour = pure__majority(grid)
    if colour is None:
        return None
    return [[v if v == colour else 0 for v in row] for row in grid]


def pure_keep_minority_colour(grid):
    colour = pure__minority(grid)
    if colour is None:
        return None
    return [[v if v == colour else 0 for v in row] for row in grid]


def pure_paint_majority(grid):
    """Every non-zero cell takes the most frequent non-zero colour."""
    colour = pure__majority(grid)
    if colour is None:
        return None
    return [[colour if v else 0 for v in row] for row in grid]


def pure_swap_two_colours(grid):
    present = [k for k, n in enumerate(pure__colour_counts(grid)) if n and k]
    if len(present) != 2:
        return None
    a, b = present
    return [[b if v == a else a if v == b else v for v in row] for row in grid]


def pure_invert_colour(grid):
    """In a grid of one colour on black, black and the colour trade places."""
    present = [k for k, n in enumerate(pure__colour_counts(grid)) if n and k]
    if len(present) != 1:
        return None
    colour = present[0]
    return [[0 if v else colour for v in row] for row in grid]


# Cropping and objects.


def pure_crop_bbox(grid):
    rows = [r for r, row in enumerate(grid) if any(row)]
    cols = [c for c in range(len(grid[0])) if any(row[c] for row in grid)]
    if not rows:
        return None
    return [list(row[cols[0] : cols[-1] + 1]) for row in grid[rows[0] : rows[-1] + 1]]


def pure_extract_colour(grid, colour):
    """The cells of one colour, cropped to their bounding box."""
    rows = [r for r, row in enumerate(grid) if colour in row]
    cols = [c for c in range(len(grid[0])) if any(row[c] == colour for row in grid)]
    if not rows:
        return None
    return [[v if v == colour else 0 for v in row[cols[0] : cols[-1] + 1]] for row in grid[rows[0] : rows[-1] + 1]]


# Object primitives take the grid's objects as `found` when the caller already has them.


def pure_crop_largest_object(grid, found=None):
    return pure__crop_object(pure__by_size(pure__objects(grid) if found is None else found, True))


def pure_crop_smallest_object(grid, found=None):
    return pure__crop_object(pure__by_size(pure__objects(grid) if found is None else found, False))


def pure_keep_largest_object(grid, found=None):
    return pure__keep_object(grid, pure__by_size(pure__objects(grid) if found is None else found, True))


def pure_keep_smallest_object(grid, found=None):
    return pure__keep_object(grid, pure__by_size(pure__objects(grid) if found is None else found, False))


def pure_recolour_largest(grid, colour, found=None):
    return pure__recolour_object(grid, pure__by_size(pure__objects(grid) if found is None else found, True), colour)


def pure_recolour_smallest(grid, colour, found=None):
    return pure__recolour_object(grid, pure__by_size(pure__objects(grid) if found is None else found, False), colour)


def pure_recolour_border_objects(grid, colour, found=None):
    """Objects touching the grid's edge take `colour`."""
    height, width = len(grid), len(grid[0])
    out = [list(row) for row in grid]
    for _, cells in pure__objects(grid) if found is None else found:
        if any(r in (0, height - 1) or c in (0, width - 1) for r, c in cells):
            for r, c in cells:
                out[r][c] = colour
    return out


def pure_recolour_by_size(grid, *pairs, found=None):
    """Each (size, colour) pair recolours every object of that many cells; other objects stay."""
    mapping = dict(pairs)
    out = [list(row) for row in grid]
    for _, cells in pure__objects(grid) if found is None else found:
        if len(cells) in mapping:
            for r, c in cells:
                out[r][c] = mapping[len(cells)]
    return out


def pure_fill_bbox(grid, found=None):
    """Paint the black cells inside each object's bounding box in the object's colour."""
    out = [list(row) for row in grid]
    for colour, cells in pure__objects(grid) if found is None else found:
        top, bottom = min(r for r, _ in cells), max(r for r, _ in cells)
        left, right = min(c for _, c in cells), max(c for _, c in cells)
        for r in range(top, bottom + 1):
            for c in range(left, right + 1):
                if grid[r][c] == 0:
                    out[r][c] = colour
    return out


def pure_flip_in_place(grid):
    """Mirror the bounding box of the non-zero cells left to right where it stands."""
    rows = [r for r, row in enumerate(grid) if any(row)]
    cols = [c for c in range(len(grid[0])) if any(row[c] for row in grid)]
    if not rows:
        return None
    out = [list(row) for row in grid]
    for r in range(rows[0], rows[-1] + 1):
        out[r][cols[0] : cols[-1] + 1] = out[r][cols[0] : cols[-1] + 1][::-1]
    return out


def pure_hollow(grid):
    """Blank every non-zero cell whose four neighbours all have its colour."""
    height, width = len(grid), len(grid[0])
    out = [list(row) for row in grid]
    for r in range(1, height - 1):
        for c in range(1, width - 1):
            v = grid[r][c]
            if v and grid[r - 1][c] == v and grid[r + 1][c] == v and grid[r][c - 1] == v and grid[r][c + 1] == v:
                out[r][c] = 0
    return out


def pure_outline(grid, colour):
    """Paint `colour` on every black cell next to (or diagonal to) a non-zero cell."""
    near = pure__near_nonzero(grid)
    return [[colour if v == 0 and near[r][c] else v for c, v in enumerate(row)] for r, row in enumerate(grid)]


def pure_fill_enclosed(grid, colour):
    """Paint `colour` on black cells that no 4-connected black path joins to the grid's edge."""
    height, width = len(grid), len(grid[0])
    outside = [[False] * width for _ in range(height)]
    stack = [(r, c) for r in range(height) for c in (0, width - 1)]
    stack += [(r, c) for r in (0, height - 1) for c in range(width)]
    while stack:
        r, c = stack.pop()
        if 0 <= r < height and 0 <= c < width and not outside[r][c] and grid[r][c] == 0:
            outside[r][c] = True
            stack += [(r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)]
    return [[colour if v == 0 and not outside[r][c] else v for c, v in enumerate(row)] for r, row in enumerate(grid)]


def pure_remove_noise(grid):
    """Blank every non-zero cell with no non-zero neighbour (diagonals count)."""
    near = pure__near_nonzero(grid)
    return [[v if v == 0 or near[r][c] else 0 for c, v in enumerate(row)] for r, row in enumerate(grid)]


# Lines.


def pure_connect_rows(grid):
    return [pure__connected(row) for row in grid]


def pure_connect_cols(grid):
    columns = [pure__connected(list(col)) for col in zip(*grid)]
    return [list(row) for row in zip(*columns)]


def pure_connect_dots(grid):
    """Join same-coloured neighbours along rows and columns; a row line wins where lines cross."""
    rows = pure_connect_rows(grid)
    cols = pure_connect_cols(grid)
    return [[a or b for a, b in zip(row_a, row_b)] for row_a, row_b in zip(rows, cols)]


def pure_rays_right(grid):
    """Each black cell takes the nearest colour to its left: every colour runs right to the next."""
    return [pure__carry(row) for row in grid]


def pure_rays_left(grid):
    return [pure__carry(row[::-1])[::-1] for row in grid]


def pure_rays_down(grid):
    return [list(row) for row in zip(*[pure__carry(col) for col in zip(*grid)])]


def pure_rays_up(grid):
    return [list(row) for row in zip(*[pure__carry(col[::-1])[::-1] for col in zip(*grid)])]


def pure_cross_lines(grid):
    """Each non-zero cell paints the black cells of its row and column; later cells (in reading
    order) paint over earlier ones, so a black cell takes the later of its row's and column's
    last non-zero cells."""
    height, width = len(grid), len(grid[0])
    row_last = [max([c for c in range(width) if grid[r][c]], default=-1) for r in range(height)]
    col_last = [max([r for r in range(height) if grid[r][c]], default=-1) for c in range(width)]
    out = [list(row) for row in grid]
    for r in range(height):
        for c in range(width):
            if grid[r][c]:
                continue
            by_row = r * width + row_last[r] if row_last[r] >= 0 else -1
            by_col = col_last[c] * width + c if col_last[c] >= 0 else -1
            if by_row > by_col:
                out[r][c] = grid[r][row_last[r]]
            elif by_col >= 0:
                out[r][c] = grid[col_last[c]][c]
    return out


def pure_draw_border(grid, colour):
    height, width = len(grid), len(grid[0])
    return [
        [colour if r in (0, height - 1) or c in (0, width - 1) else v for c, v in enumerate(row)]
        for r, row in enumerate(grid)
    ]


# Gravity and shifts: non-zero cells move, keeping their order.


def pure_gravity_down(grid):
    columns = []
    for col in zip(*grid):
        cells = [v for v in col if v]
        columns.append([0] * (len(col) - len(cells)) + cells)
    return [list(row) for row in zip(*columns)]


def pure_gravity_up(grid):
    columns = []
    for col in zip(*grid):
        cells = [v for v in col if v]
        columns.append(cells + [0] * (len(col) - len(cells)))
    return [list(row) for row in zip(*columns)]


def pure_gravity_left(grid):
    out = []
    for row in grid:
        cells = [v for v in row if v]
        out.append(cells + [0] * (len(row) - len(cells)))
    return out


def pure_gravity_right(grid):
    out = []
    for row in grid:
        cells = [v for v in row if v]
        out.append([0] * (len(row) - len(cells)) + cells)
    return out


def pure_shift_down(grid):
    return [[0] * len(grid[0])] + [list(row) for row in grid[:-1]]


def pure_shift_up(grid):
    return [list(row) for row in grid[1:]] + [[0] * len(grid[0])]


def pure_shift_left(grid):
    return [list(row[1:]) + [0] for row in grid]


def pure_shift_right(grid):
    return [[0] + list(row[:-1]) for row in grid]


# Scaling and tiling.


def pure_scale_2(grid):
    return [[v for v in row for _ in range(2)] for row in grid for _ in range(2)]


def pure_scale_3(grid):
    return [[v for v in row for _ in range(3)] for row in grid for _ in range(3)]


def pure_downscale_2(grid):
    """The inverse of scale_2: applies only when the grid is made of uniform 2x2 blocks."""
    return pure__downscale(grid, 2)


def pure_downscale_3(grid):
    return pure__downscale(grid, 3)


def pure_tile_1x2(grid):
    return [list(row) * 2 for row in grid]


def pure_tile_2x1(grid):
    return [list(row) for _ in range(2) for row in grid]


def pure_tile_2x2(grid):
    return [list(row) * 2 for _ in range(2) for row in grid]


def pure_tile_3x3(grid):
    return [list(row) * 3 for _ in range(3) for row in grid]


def pure_mirror_right(grid):
    """The grid, then its left-right mirror image beside it."""
    return [list(row) + list(row)[::-1] for row in grid]


def pure_mirror_down(grid):
    """The grid, then its top-bottom mirror image below it."""
    return [list(row) for row in grid] + [list(row) for row in grid[::-1]]


def pure_mirror_quad(grid):
    top = [list(row) + list(row)[::-1] for row in grid]
    return top + [list(row) for row in top[::-1]]


# Halves.


def pure_left_half(grid):
    width = len(grid[0])
    if width < 2:
        return None
    return [list(row[: width // 2]) for row in grid]


def pure_right_half(grid):
    width = len(grid[0])
    if width < 2:
        return None
    return [list(row[width - width // 2 :]) for row in grid]


def pure_top_half(grid):
    height = len(grid)
    if height < 2:
        return None
    return [list(row) for row in grid[: height // 2]]


def pure_bottom_half(grid):
    height = len(grid)
    if height < 2:
        return None
    return [list(row) for row in grid[height - height // 2 :]]


def pure_halves_and(grid, colour):
    return pure__combine_halves(grid, colour, (0, 0, 0, 1))


def pure_halves_or(grid, colour):
    return pure__combine_halves(grid, colour, (0, 1, 1, 1))


def pure_halves_xor(grid, colour):
    return pure__combine_halves(grid, colour, (0, 1, 1, 0))


def pure_halves_nor(grid, colour):
    return pure__combine_halves(grid, colour, (1, 0, 0, 0))


# Symmetry completion: cells of the mask colour take their mirror image's colour.


def pure_symmetrize_h(grid, mask):
    return [
        [row[-1 - c] if v == mask and row[-1 - c] != mask else v for c, v in enumerate(row)]
        for row in grid
    ]


def pure_symmetrize_v(grid, mask):
    return [
        [grid[-1 - r][c] if v == mask and grid[-1 - r][c] != mask else v for c, v in enumerate(row)]
        for r, row in enumerate(grid)
    ]


def pure_symmetrize_rot(grid, mask):
    return [
        [grid[-1 - r][-1 - c] if v == mask and grid[-1 - r][-1 - c] != mask else v for c, v in enumerate(row)]
        for r, row in enumerate(grid)
    ]


def pure_symmetrize(grid, mask):
    """Mask cells take the first unmasked of their left-right, top-bottom and half-turn images."""
    out = [list(row) for row in grid]
    for r, row in enumerate(grid):
        for c, v in enumerate(row):
            if v != mask:
                continue
            for image in (grid[r][-1 - c], grid[-1 - r][c], grid[-1 - r][-1 - c]):
                if image != mask:
                    out[r][c] = image
                    break
    return out


# Counts.


def pure_majority_cell(grid):
    colour = pure__majority(grid)
    return None if colour is None else [[colour]]


def pure_minority_cell(grid):
    colour = pure__minority(grid)
    return None if colour is None else [[colour]]


def pure_bar_cells(grid):
    """A one-row bar of the majority colour, one cell per non-zero cell."""
    colour = pure__majority(grid)
    count = sum(1 for row in grid for v in row if v)
    if colour is None or count > 30:
        return None
    return [[colour] * count]


def pure_bar_objects(grid, found=None):
    """A one-row bar of the majority colour, one cell per object."""
    colour = pure__majority(grid)
    count = len(pure__objects(grid) if found is None else found)
    if colour is None or count > 30:
        return None
    return [[colour] * count]


# Ordering.


def pure_sort_rows(grid):
    """Rows ordered by their number of non-zero cells, fewest first (stable)."""
    order = sorted(range(len(grid)), key=lambda r: sum(1 for v in grid[r] if v))
    return [list(grid[r]) for r in order]


def pure_sort_cols(grid):
    columns = [list(col) for col in zip(*grid)]
    order = sorted(range(len(columns)), key=lambda c: sum(1 for v in columns[c] if v))
    return [list(row) for row in zip(*[columns[c] for c in order])]


def pure_dedupe_rows(grid):
    """Drop each row equal to the row above it."""
    return [list(row) for r, row in enumerate(grid) if r == 0 or list(row) != list(grid[r - 1])]


def pure_dedupe_cols(grid):
    columns = [list(col) for col in zip(*grid)]
    kept = [col for c, col in enumerate(columns) if c == 0 or col != columns[c - 1]]
    return [list(row) for row in zip(*kept)]


# --- array primitives --------------------------------------------------------------------------


def _colour_counts(a: Array) -> Array:
    return np.bincount(a.ravel(), minlength=10)


def _majority(a: Array) -> int | None:
    counts = _colour_counts(a)[1:]
    best = counts.max()
    if best == 0 or np.count_nonzero(counts == best) > 1:
        return None
    return int(np.argmax(counts)) + 1


def _minority(a: Array) -> int | None:
    counts = _colour_counts(a)[1:]
    present = counts > 0
    if not present.any():
        return None
    least = counts[present].min()
    hits = np.flatnonzero((counts == least) & present)
    return None if hits.size > 1 else int(hits[0]) + 1


def _present(a: Array) -> list[int]:
    """Non-zero colours present, ascending."""
    return [int(k) for k in np.flatnonzero(_colour_counts(a)[1:]) + 1]


def _near_nonzero(a: Array) -> Array:
    padded = np.pad(a != 0, 1)
    height, width = a.shape
    near = np.zeros(a.shape, dtype=bool)
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            if (dy, dx) != (1, 1):
                near |= padded[dy : dy + height, dx : dx + width]
    return near


def _crop_to(mask: Array, a: Array) -> Array | None:
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero(mask.any(axis=0))
    return a[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]


def _colour_map(a: Array, *pairs: tuple[int, int]) -> Array | None:
    table = np.full(10, 255, dtype=np.uint8)  # 255: a colour the pairs never showed
    for source, target in pairs:
        table[source] = target
    out = table[a]
    return None if (out == 255).any() else out


def _keep_only(a: Array, colour: int | None) -> Array | None:
    return None if colour is None else np.where(a == colour, a, 0).astype(np.uint8)


def _paint_majority(a: Array) -> Array | None:
    colour = _majority(a)
    return None if colour is None else np.where(a != 0, colour, 0).astype(np.uint8)


def _swap_two_colours(a: Array) -> Array | None:
    present = _present(a)
    if len(present) != 2:
        return None
    x, y = present
    out = a.copy()
    out[a == x] = y
    out[a == y] = x
    return out


def _invert_colour(a: Array) -> Array | None:
    present = _present(a)
    if len(present) != 1:
        return None
    return np.where(a == 0, present[0], 0).astype(np.uint8)


def _extract_colour(a: Array, colour: int) -> Array | None:
    mask = a == colour
    return _crop_to(mask, np.where(mask, a, 0).astype(np.uint8))


def _hollow(a: Array) -> Array:
    out = a.copy()
    inner = a[1:-1, 1:-1]
    mask = ((inner != 0) & (a[:-2, 1:-1] == inner) & (a[2:, 1:-1] == inner)
            & (a[1:-1, :-2] == inner) & (a[1:-1, 2:] == inner))
    out[1:-1, 1:-1][mask] = 0
    return out


def _outline(a: Array, colour: int) -> Array:
    return np.where((a == 0) & _near_nonzero(a), colour, a).astype(np.uint8)


def _remove_noise(a: Array) -> Array:
    return np.where(_near_nonzero(a), a, 0).astype(np.uint8)


def _rays_right(a: Array) -> Array:
    # Index of the last non-zero cell at or before each cell; cells before any point at column 0.
    last = np.maximum.accumulate(np.where(a != 0, np.arange(a.shape[1]), 0), axis=1)
    return np.take_along_axis(a, last, axis=1)


def _cross_lines(a: Array) -> Array:
    height, width = a.shape
    nonzero = a != 0
    row_last = np.where(nonzero, np.arange(width), -1).max(axis=1)
    col_last = np.where(nonzero, np.arange(height)[:, None], -1).max(axis=0)
    rows, cols = np.indices(a.shape)
    # Reading-order index of the last painter along each cell's row and column (-1: none).
    by_row = np.where(row_last[:, None] >= 0, rows * width + row_last[:, None], -1)
    by_col = np.where(col_last[None, :] >= 0, col_last[None, :] * width + cols, -1)
    row_colour = a[rows, np.maximum(row_last, 0)[:, None]]
    col_colour = a[np.maximum(col_last, 0)[None, :], cols]
    painted = np.where(by_row > by_col, row_colour, np.where(by_col >= 0, col_colour, 0))
    return np.where(nonzero, a, painted).astype(np.uint8)


def _flip_in_place(a: Array) -> Array | None:
    rows = np.flatnonzero((a != 0).any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero((a != 0).any(axis=0))
    out = a.copy()
    box = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
    out[box] = a[box][:, ::-1]
    return out


def _draw_border(a: Array, colour: int) -> Array:
    out = a.copy()
    out[0, :] = out[-1, :] = colour
    out[:, 0] = out[:, -1] = colour
    return out


def _gravity(a: Array, axis: int, nonzero_last: bool) -> Array:
    # A stable sort on "is this cell black?" moves the coloured cells and keeps their order.
    key = (a != 0) if nonzero_last else (a == 0)
    return np.take_along_axis(a, np.argsort(key, axis=axis, kind="stable"), axis=axis)


def _shift(a: Array, dy: int, dx: int) -> Array:
    height, width = a.shape
    out = np.zeros_like(a)
    out[max(dy, 0) : height + min(dy, 0), max(dx, 0) : width + min(dx, 0)] = \
        a[max(-dy, 0) : height + min(-dy, 0), max(-dx, 0) : width + min(-dx, 0)]
    return out


def _scale(a: Array, k: int) -> Array:
    return np.repeat(np.repeat(a, k, axis=0), k, axis=1)


def _downscale(a: Array, k: int) -> Array | None:
    height, width = a.shape
    if height % k or width % k:
        return None
    small = a[::k, ::k]
    return small if np.array_equal(_scale(small, k), a) else None


def _mirror_quad(a: Array) -> Array:
    top = np.hstack([a, a[:, ::-1]])
    return np.vstack([top, top[::-1]])


def _halves(a: Array) -> tuple[Array, Array] | None:
    height, width = a.shape
    if width % 2 == 1 and width > 1:
        middle = a[:, width // 2]
        if middle[0] != 0 and (middle == middle[0]).all():
            return a[:, : width // 2], a[:, width // 2 + 1 :]
    if height % 2 == 1 and height > 1:
        middle = a[height // 2]
        if middle[0] != 0 and (middle == middle[0]).all():
            return a[: height // 2], a[height // 2 + 1 :]
    if width % 2 == 0:
        return a[:, : width // 2], a[:, width // 2 :]
    if height % 2 == 0:
        return a[: height // 2], a[height // 2 :]
    return None


def _combine_halves(rule: tuple[int, int, int, int]) -> Callable[[Array, int], Array | None]:
    table = np.array(rule, dtype=bool)

    def apply(a: Array, colour: int) -> Array | None:
        halves = _halves(a)
        if halves is None:
            return None
        first, second = halves
        return np.where(table[2 * (first != 0) + (second != 0)], colour, 0).astype(np.uint8)
    return apply


def _symmetrize_with(*images: Callable[[Array], Array]) -> Callable[[Array, int], Array]:
    def apply(a: Array, mask: int) -> Array:
        out = a
        for image in images:
            mirrored = image(a)
            out = np.where((out == mask) & (mirrored != mask), mirrored, out).astype(np.uint8)
        return out
    return apply


def _cell(colour: int | None) -> Array | None:
    return None if colour is None else np.full((1, 1), colour, dtype=np.uint8)


def _bar_cells(a: Array) -> Array | None:
    colour, count = _majority(a), int(np.count_nonzero(a))
    if colour is None or count > MAX_SIDE:
        return None
    return np.full((1, count), colour, dtype=np.uint8)


def _sort_lines(a: Array, axis: int) -> Array:
    order = np.argsort(np.count_nonzero(a, axis=1 - axis), kind="stable")
    return a[order] if axis == 0 else a[:, order]


def _dedupe_lines(a: Array, axis: int) -> Array:
    if axis == 0:
        return a[np.concatenate([[True], (a[1:] != a[:-1]).any(axis=1)])]
    return a[:, np.concatenate([[True], (a[:, 1:] != a[:, :-1]).any(axis=0)])]


# --- learning parameters from examples ---------------------------------------------------------


def learn_colour_map(examples: Sequence[Example]) -> list[Params]:
    """The one cell-wise colour substitution consistent with every example (same shapes), if any.

    The table holds every colour the examples show, unchanged ones too: the pairs say nothing
    about other colours, so the map does not apply to a grid holding one.
    """
    mapping: dict[int, int] = {}
    for state, output in examples:
        if state.shape != output.shape:
            return []
        codes = np.unique(state.astype(np.int16) * 10 + output)
        for code in codes.tolist():
            source, target = divmod(code, 10)
            if mapping.setdefault(source, target) != target:
                return []
    if all(s == t for s, t in mapping.items()):
        return []
    return [tuple(sorted(mapping.items()))]


def learn_dropped_colours(examples: Sequence[Example]) -> list[Params]:
    """Each non-zero colour of the first example's grid that its output lacks."""
    state, output = examples[0]
    kept = set(_present(output))
    return [(c,) for c in _present(state) if c not in kept]


def learn_kept_colours(examples: Sequence[Example]) -> list[Params]:
    """Each non-zero colour the first example's output shares with a grid of several colours."""
    state, output = examples[0]
    present = _present(state)
    if len(present) < 2:
        return []
    kept = set(_present(output))
    return [(c,) for c in present if c in kept]


def learn_mask_colour(examples: Sequence[Example]) -> list[Params]:
    """Each colour (black included) of the first example's grid that its same-shaped output lacks."""
    state, output = examples[0]
    if state.shape != output.shape:
        return []
    counts_in, counts_out = _colour_counts(state), _colour_counts(output)
    return [(c,) for c in range(10) if counts_in[c] and not counts_out[c]]


def learn_new_colour(examples: Sequence[Example]) -> list[Params]:
    """The one colour the first example's output paints over cells of its same-shaped grid."""
    state, output = examples[0]
    if state.shape != output.shape:
        return []
    painted = np.unique(output[state != output])
    return [(int(painted[0]),)] if painted.size == 1 else []


def learn_size_colours(examples: Sequence[Example]) -> list[Params]:
    """The one object-size to colour substitution consistent with every example (same shapes)."""
    mapping: dict[int, int] = {}
    changed = False
    for state, output in examples:
        if state.shape != output.shape:
            return []
        for colour, cells in _objects(state.shape, state.tobytes()):
            painted = {int(output[r, c]) for r, c in cells}
            if len(painted) != 1:
                return []
            target = painted.pop()
            if mapping.setdefault(len(cells), target) != target:
                return []
            changed = changed or target != colour
    return [tuple(sorted(mapping.items()))] if changed else []


def learn_output_colour(examples: Sequence[Example]) -> list[Params]:
    """The one non-zero colour of the first example's output."""
    present = _present(examples[0][1])
    return [(present[0],)] if len(present) == 1 else []


# --- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Primitive:
    """One DSL primitive: its array form, its portable form and, if parametric, its learner.

    `final_only` marks primitives whose parameters are learned from the pair's output cell by
    cell; as an earlier step of a program they cannot be learned, so the search never tries it.
    """

    name: str
    apply: Callable[..., Array | None]
    pure: Callable[..., Board | None]
    learn: Callable[[Sequence[Example]], list[Params]] | None = None
    final_only: bool = False

    def __post_init__(self) -> None:
        if self.pure.__name__ != f"pure_{self.name}":
            raise ValueError(f"primitive {self.name!r} needs a pure function named pure_{self.name}")


def _p(name: str, apply: Callable[..., Array | None], learn=None, final_only: bool = False) -> Primitive:
    return Primitive(name, apply, globals()[f"pure_{name}"], learn, final_only)


def _pure(name: str, learn=None, final_only: bool = False, objects: bool = False) -> Primitive:
    pure = globals()[f"pure_{name}"]
    return Primitive(name, _from_pure(pure, objects), pure, learn, final_only)


SYMMETRIES: tuple[Primitive, ...] = (
    _p("identity", lambda a: a),
    _p("rot90", lambda a: np.rot90(a, -1)),
    _p("rot180", lambda a: a[::-1, ::-1]),
    _p("rot270", lambda a: np.rot90(a, 1)),
    _p("flip_h", lambda a: a[:, ::-1]),
    _p("flip_v", lambda a: a[::-1]),
    _p("transpose", lambda a: a.T),
    _p("anti_transpose", lambda a: a[::-1, ::-1].T),
)

PRIMITIVES: tuple[Primitive, ...] = SYMMETRIES + (
    _p("colour_map", _colour_map, learn_colour_map, final_only=True),
    _p("remove_colour", lambda a, c: np.where(a == c, 0, a).astype(np.uint8), learn_dropped_colours),
    _p("keep_colour", _keep_only, learn_kept_colours),
    _p("keep_majority_colour", lambda a: _keep_only(a, _majority(a))),
    _p("keep_minority_colour", lambda a: _keep_only(a, _minority(a))),
    _p("paint_majority", _paint_majority),
    _p("swap_two_colours", _swap_two_colours),
    _p("invert_colour", _invert_colour),
    _p("crop_bbox", lambda a: _crop_to(a != 0, a)),
    _p("extract_colour", _extract_colour, learn_kept_colours),
    _pure("crop_largest_object", objects=True),
    _pure("crop_smallest_object", objects=True),
    _pure("keep_largest_object", objects=True),
    _pure("keep_smallest_object", objects=True),
    _pure("recolour_largest", learn_new_colour, final_only=True, objects=True),
    _pure("recolour_smallest", learn_new_colour, final_only=True, objects=True),
    _pure("recolour_border_objects", learn_new_colour, final_only=True, objects=True),
    _pure("recolour_by_size", learn_size_colours, final_only=True, objects=True),
    _p("flip_in_place", _flip_in_place),
    _p("hollow", _hollow),
    _p("outline", _outline, learn_new_colour, final_only=True),
    _pure("fill_bbox", objects=True),
    _pure("fill_enclosed", learn_new_colour, final_only=True),
    _p("remove_noise", _remove_noise),
    _pure("connect_dots"),
    _pure("connect_rows"),
    _pure("connect_cols"),
    _p("rays_right", _rays_right),
    _p("rays_left", lambda a: _rays_right(a[:, ::-1])[:, ::-1]),
    _p("rays_down", lambda a: _rays_right(a.T).T),
    _p("rays_up", lambda a: _rays_right(a[::-1].T).T[::-1]),
    _p("cross_lines", _cross_lines),
    _p("draw_border", _draw_border, learn_new_colour, final_only=True),
    _p("gravity_down", lambda a: _gravity(a, 0, True)),
    _p("gravity_up", lambda a: _gravity(a, 0, False)),
    _p("gravity_left", lambda a: _gravity(a, 1, False)),
    _p("gravity_right", lambda a: _gravity(a, 1, True)),
    _p("shift_down", lambda a: _shift(a, 1, 0)),
    _p("shift_up", lambda a: _shift(a, -1, 0)),
    _p("shift_left", lambda a: _shift(a, 0, -1)),
    _p("shift_right", lambda a: _shift(a, 0, 1)),
    _p("scale_2", lambda a: _scale(a, 2)),
    _p("scale_3", lambda a: _scale(a, 3)),
    _p("downscale_2", lambda a: _downscale(a, 2)),
    _p("downscale_3", lambda a: _downscale(a, 3)),
    _p("tile_1x2", lambda a: np.tile(a, (1, 2))),
    _p("tile_2x1", lambda a: np.tile(a, (2, 1))),
    _p("tile_2x2", lambda a: np.tile(a, (2, 2))),
    _p("tile_3x3", lambda a: np.tile(a, (3, 3))),
    _p("mirror_right", lambda a: np.hstack([a, a[:, ::-1]])),
    _p("mirror_down", lambda a: np.vstack([a, a[::-1]])),
    _p("mirror_quad", _mirror_quad),
    _p("left_half", lambda a: a[:, : a.shape[1] // 2] if a.shape[1] >= 2 else None),
    _p("right_half", lambda a: a[:, a.shape[1] - a.shape[1] // 2 :] if a.shape[1] >= 2 else None),
    _p("top_half", lambda a: a[: a.shape[0] // 2] if a.shape[0] >= 2 else None),
    _p("bottom_half", lambda a: a[a.shape[0] - a.shape[0] // 2 :] if a.shape[0] >= 2 else None),
    _p("halves_and", _combine_halves((0, 0, 0, 1)), learn_output_colour, final_only=True),
    _p("halves_or", _combine_halves((0, 1, 1, 1)), learn_output_colour, final_only=True),
    _p("halves_xor", _combine_halves((0, 1, 1, 0)), learn_output_colour, final_only=True),
    _p("halves_nor", _combine_halves((1, 0, 0, 0)), learn_output_colour, final_only=True),
    _p("symmetrize_h", _symmetrize_with(lambda a: a[:, ::-1]), learn_mask_colour, final_only=True),
    _p("symmetrize_v", _symmetrize_with(lambda a: a[::-1]), learn_mask_colour, final_only=True),
    _p("symmetrize_rot", _symmetrize_with(lambda a: a[::-1, ::-1]), learn_mask_colour, final_only=True),
    _p("symmetrize", _symmetrize_with(lambda a: a[:, ::-1], lambda a: a[::-1], lambda a: a[::-1, ::-1]),
       learn_mask_colour, final_only=True),
    _p("majority_cell", lambda a: _cell(_majority(a))),
    _p("minority_cell", lambda a: _cell(_minority(a))),
    _p("bar_cells", _bar_cells),
    _pure("bar_objects", objects=True),
    _p("sort_rows", lambda a: _sort_lines(a, 0)),
    _p("sort_cols", lambda a: _sort_lines(a, 1)),
    _p("dedupe_rows", lambda a: _dedupe_lines(a, 0)),
    _p("dedupe_cols", lambda a: _dedupe_lines(a, 1)),
)

BY_NAME: dict[str, Primitive] = {p.name: p for p in PRIMITIVES}
ORDER: dict[str, int] = {p.name: i for i, p in enumerate(PRIMITIVES)}
SYMMETRY_NAMES: frozenset[str] = frozenset(p.name for p in SYMMETRIES)


def apply_step(name: str, params: Params, array: Array) -> Array | None:
    """One primitive on an array; None when it does not apply or its result is not a valid grid."""
    out = BY_NAME[name].apply(array, *params)
    return out if valid(out) else None


# --- portable source ---------------------------------------------------------------------------

_PURE_PREFIX = re.compile(r"\bpure_")


def _pure_dependencies(function: Callable) -> list[Callable]:
    """The pure helpers `function` calls, transitively, each before the functions that use it."""
    ordered: list[Callable] = []

    def visit(fn: Callable) -> None:
        for name in fn.__code__.co_names + _nested_names(fn.__code__):
            helper = globals().get(name) if name.startswith("pure_") else None
            if helper is not None and helper is not fn and helper not in ordered:
                visit(helper)
        if fn not in ordered:
            ordered.append(fn)
    visit(function)
    return ordered


def _nested_names(code) -> tuple[str, ...]:
    """Global names used inside lambdas and comprehensions nested in a function."""
    names: tuple[str, ...] = ()
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names += const.co_names + _nested_names(const)
    return names


def portable_source(names: Sequence[str]) -> str:
    """Standalone source of the pure functions for these primitives and exactly the helpers they use.

    Each function is renamed without its `pure_` prefix, so primitive `rot90` is `def rot90(grid)`.
    """
    functions: list[Callable] = []
    for name in names:
        for fn in _pure_dependencies(BY_NAME[name].pure):
            if fn not in functions:
                functions.append(fn)
    text = "\n\n".join(inspect.getsource(fn).rstrip() + "\n" for fn in functions)
    return _PURE_PREFIX.sub("", text)
