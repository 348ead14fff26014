"""Filling and lines: flood enclosed regions, fill frames and rooms, draw lines, rays and borders."""

from __future__ import annotations

import random

from orchestrator.arc import Demo, Grid
from orchestrator.tasks.own import canvas
from orchestrator.tasks.own.registry import OwnTask, Redraw

ENCLOSED_FILL = 4  # fill-enclosed paints enclosed black cells yellow
WALL = 5
BORDER = 8
FRAME_COLOURS = (1, 2, 3, 5, 6, 7, 8, 9)


def _fill_enclosed_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(7, 16), rng.randint(7, 16)
    layout = canvas.Layout(height, width)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    frames = rng.randint(1, 3)
    open_frame = rng.randrange(frames + 1) if frames > 1 else frames  # index `frames` means none is open
    for i in range(frames):
        box_h, box_w = rng.randint(3, 7), rng.randint(3, 7)
        at = layout.place(rng, box_h, box_w)
        outline = canvas.frame_cells(box_h, box_w)
        colour = rng.choice(FRAME_COLOURS)
        if i == open_frame:
            gaps = [(r, c) for r, c in outline if (r in (0, box_h - 1)) != (c in (0, box_w - 1))]
            outline.remove(rng.choice(gaps))
        canvas.stamp(before, outline, colour, at)
        canvas.stamp(after, outline, colour, at)
        if i != open_frame:
            canvas.stamp(after, canvas.rect_cells(box_h - 2, box_w - 2), ENCLOSED_FILL, (at[0] + 1, at[1] + 1))
    for _ in range(rng.randint(0, 3)):
        length, colour = rng.randint(2, 4), rng.choice(FRAME_COLOURS)
        cells = [(0, c) for c in range(length)] if rng.random() < 0.5 else [(r, 0) for r in range(length)]
        at = layout.place(rng, *canvas.extent(cells))
        canvas.stamp(before, cells, colour, at)
        canvas.stamp(after, cells, colour, at)
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _fill_enclosed(grid: Grid) -> Grid:
    outside = canvas.outside_zeros(grid)
    return tuple(
        tuple(ENCLOSED_FILL if v == 0 and (r, c) not in outside else v for c, v in enumerate(row))
        for r, row in enumerate(grid)
    )


def _fill_frames_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(6, 15), rng.randint(6, 15)
    layout = canvas.Layout(height, width)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for colour in rng.sample(canvas.NONZERO, rng.randint(1, 4)):
        box_h, box_w = rng.randint(3, 6), rng.randint(3, 6)
        at = layout.place(rng, box_h, box_w)
        canvas.stamp(before, canvas.frame_cells(box_h, box_w), colour, at)
        canvas.stamp(after, canvas.rect_cells(box_h, box_w), colour, at)
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _fill_frames(grid: Grid) -> Grid:
    """Each enclosed black region takes the colour of a cell that walls it in."""
    height, width = len(grid), len(grid[0])
    outside = canvas.outside_zeros(grid)
    board = canvas.thaw(grid)
    enclosed = tuple(
        tuple(1 if v == 0 and (r, c) not in outside else 0 for c, v in enumerate(row)) for r, row in enumerate(grid)
    )
    for hole in canvas.blobs(enclosed, diagonal=False):
        walls = sorted(
            grid[r + dr][c + dc]
            for r, c in hole.cells
            for dr, dc in canvas.STEPS4
            if 0 <= r + dr < height and 0 <= c + dc < width and grid[r + dr][c + dc]
        )
        if walls:
            canvas.stamp(board, hole.cells, walls[0])
    return canvas.freeze(board)


def _connect_dots_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(5, 14), rng.randint(5, 14)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    used: set[canvas.Cell] = set()
    for colour in rng.sample(canvas.NONZERO, rng.randint(1, 4)):
        line = _free_line(rng, height, width, used)
        used.update(line)
        canvas.stamp(before, [line[0], line[-1]], colour)
        canvas.stamp(after, line, colour)
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _free_line(rng: random.Random, height: int, width: int, used: set[canvas.Cell]) -> list[canvas.Cell]:
    """A row or column segment of at least 3 cells that neither touches nor crosses `used`."""
    for _ in range(30):
        if rng.random() < 0.5:
            r, (a, b) = rng.randrange(height), sorted(rng.sample(range(width), 2))
            line = [(r, c) for c in range(a, b + 1)]
        else:
            c, (a, b) = rng.randrange(width), sorted(rng.sample(range(height), 2))
            line = [(r, c) for r in range(a, b + 1)]
        halo = {(r + dr, c + dc) for r, c in line for dr, dc in canvas.STEPS8}
        if len(line) >= 3 and not (halo | set(line)) & used:
            return line
    raise Redraw


def _connect_dots(grid: Grid) -> Grid:
    board = canvas.thaw(grid)
    cells_by_colour: dict[int, list[canvas.Cell]] = {}
    for r, row in enumerate(grid):
        for c, v in enumerate(row):
            if v:
                cells_by_colour.setdefault(v, []).append((r, c))
    for colour, cells in sorted(cells_by_colour.items()):
        if len(cells) != 2:
            continue
        (r0, c0), (r1, c1) = cells
        if r0 == r1:
            canvas.stamp(board, [(r0, c) for c in range(min(c0, c1), max(c0, c1) + 1)], colour)
        elif c0 == c1:
            canvas.stamp(board, [(r, c0) for r in range(min(r0, r1), max(r0, r1) + 1)], colour)
    return canvas.freeze(board)


def _rows_from_marker_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(3, 12), rng.randint(3, 12)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for r in rng.sample(range(height), rng.randint(1, max(1, height - 1))):
        colour = rng.choice(canvas.NONZERO)
        before[r][0] = colour
        after[r] = [colour] * width
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _rows_from_marker(grid: Grid) -> Grid:
    return tuple(row if row[0] == 0 else (row[0],) * len(row) for row in grid)


def _draw_border_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(3, 12), rng.randint(3, 12)
    inner = canvas.scatter(rng, height - 2, width - 2, [c for c in canvas.NONZERO if c != BORDER],
                           rng.uniform(0.0, 0.6))
    before = [[0] * width] + [[0, *row, 0] for row in inner] + [[0] * width]
    after = [[BORDER] * width] + [[BORDER, *row, BORDER] for row in inner] + [[BORDER] * width]
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _draw_border(grid: Grid) -> Grid:
    height, width = len(grid), len(grid[0])
    return tuple(
        tuple(BORDER if r in (0, height - 1) or c in (0, width - 1) else v for c, v in enumerate(row))
        for r, row in enumerate(grid)
    )


def _bands(walls: list[int], size: int) -> list[tuple[int, int]]:
    """(wall before, wall after) for each band of cells between consecutive walls or the edges."""
    return list(zip([-1, *walls], [*walls, size]))


def _flood_rooms_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(7, 15), rng.randint(7, 15)
    wall_rows = sorted(rng.sample(range(1, height - 1), rng.randint(1, 2)))
    wall_cols = sorted(rng.sample(range(1, width - 1), rng.randint(1, 2)))
    for walls in (wall_rows, wall_cols):
        if any(b - a < 2 for a, b in zip(walls, walls[1:])):  # two walls side by side leave no room
            raise Redraw
    before = canvas.blank(height, width)
    for r in wall_rows:
        before[r] = [WALL] * width
    for c in wall_cols:
        for r in range(height):
            before[r][c] = WALL
    rooms = [(r0 + 1, r1, c0 + 1, c1) for r0, r1 in _bands(wall_rows, height) for c0, c1 in _bands(wall_cols, width)]
    after = canvas.thaw(canvas.freeze(before))
    seeds = rng.randint(1, 2)
    colours = rng.sample([c for c in canvas.NONZERO if c != WALL], seeds)
    for (top, bottom, left, right), colour in zip(rng.sample(rooms, seeds), colours):
        before[rng.randrange(top, bottom)][rng.randrange(left, right)] = colour
        for r in range(top, bottom):
            after[r][left:right] = [colour] * (right - left)
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _flood_rooms(grid: Grid) -> Grid:
    """Every colour that is neither black nor wall spreads through the black cells it can reach."""
    height, width = len(grid), len(grid[0])
    board = canvas.thaw(grid)
    seeds = [(r, c) for r in range(height) for c in range(width) if grid[r][c] not in (0, WALL)]
    for r, c in seeds:
        colour, stack = grid[r][c], [(r, c)]
        while stack:
            cr, cc = stack.pop()
            for dr, dc in canvas.STEPS4:
                nr, nc = cr + dr, cc + dc
                if 0 <= nr < height and 0 <= nc < width and board[nr][nc] == 0:
                    board[nr][nc] = colour
                    stack.append((nr, nc))
    return canvas.freeze(board)


def _cross_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(3, 12), rng.randint(3, 12)
    r, c, colour = rng.randrange(height), rng.randrange(width), rng.choice(canvas.NONZERO)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    before[r][c] = colour
    after[r] = [colour] * width
    for row in after:
        row[c] = colour
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _cross(grid: Grid) -> Grid:
    dots = [(r, c, v) for r, row in enumerate(grid) for c, v in enumerate(row) if v]
    if len(dots) != 1:
        return grid
    r0, c0, colour = dots[0]
    return tuple(
        tuple(colour if r == r0 or c == c0 else 0 for c in range(len(row))) for r, row in enumerate(grid)
    )


def _rays_right_pair(rng: random.Random) -> Demo:
    height, width = rng.randint(3, 12), rng.randint(3, 12)
    before, after = canvas.blank(height, width), canvas.blank(height, width)
    for r in rng.sample(range(height), rng.randint(1, min(height, 4))):
        c, colour = rng.randrange(width - 1), rng.choice(canvas.NONZERO)
        before[r][c] = colour
        after[r][c:] = [colour] * (width - c)
    return Demo(canvas.freeze(before), canvas.freeze(after))


def _rays_right(grid: Grid) -> Grid:
    rows = []
    for row in grid:
        painted, colour = [], 0
        for v in row:
            colour = v or colour
            painted.append(colour)
        rows.append(tuple(painted))
    return tuple(rows)


TASKS = (
    OwnTask("own-fill-enclosed", "filling", "black cells enclosed by a closed outline turn yellow", "stream",
            _fill_enclosed_pair, _fill_enclosed),
    OwnTask("own-connect-dots", "filling",
            "join each pair of same-coloured dots in a row or column with a line of their colour", "stream",
            _connect_dots_pair, _connect_dots),
    OwnTask("own-fill-rows-from-marker", "filling", "a dot in the first column paints its whole row", "stream",
            _rows_from_marker_pair, _rows_from_marker),
    OwnTask("own-draw-border", "filling", "paint the outermost ring of the grid light blue (8)", "stream",
            _draw_border_pair, _draw_border),
    OwnTask("own-fill-frames-own-colour", "filling", "fill each hollow rectangle with its own outline colour",
            "heldout", _fill_frames_pair, _fill_frames),
    OwnTask("own-flood-rooms-from-seed", "filling",
            "a coloured seed floods the room between grey walls it sits in", "heldout",
            _flood_rooms_pair, _flood_rooms),
    OwnTask("own-draw-cross", "filling", "the one dot extends along its whole row and column", "heldout",
            _cross_pair, _cross),
    OwnTask("own-extend-rays-right", "filling", "every dot extends as a ray to the right edge", "heldout",
            _rays_right_pair, _rays_right),
)
