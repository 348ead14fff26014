"""The solver model's grid DSL: each primitive on a hand-made grid, its learners, its portable source."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.arc import MAX_SIDE, Grid, as_grid
from solver_model import dsl
from solver_model.search import Program, Step


def G(*rows: str) -> Grid:
    """A grid from strings of digits, one per row."""
    return tuple(tuple(int(ch) for ch in row) for row in rows)


def run(name: str, grid: Grid, *params) -> Grid | None:
    return Program((Step(name, tuple(params)),))(grid)


OBJECTS = G("1100", "1002", "0000")  # a 3-cell object of 1 and a 1-cell object of 2

# (primitive, params, input, expected output): one hand-made case for every primitive.
CASES = [
    ("identity", (), G("12", "34"), G("12", "34")),
    ("rot90", (), G("12", "34"), G("31", "42")),
    ("rot180", (), G("12", "34"), G("43", "21")),
    ("rot270", (), G("12", "34"), G("24", "13")),
    ("flip_h", (), G("12", "34"), G("21", "43")),
    ("flip_v", (), G("12", "34"), G("34", "12")),
    ("transpose", (), G("12", "34"), G("13", "24")),
    ("anti_transpose", (), G("12", "34"), G("42", "31")),
    ("colour_map", ((0, 0), (1, 5), (2, 6)), G("120", "021"), G("560", "065")),
    ("remove_colour", (5,), G("151", "050"), G("101", "000")),
    ("keep_colour", (1,), G("152", "010"), G("100", "010")),
    ("keep_majority_colour", (), G("112", "030"), G("110", "000")),
    ("keep_minority_colour", (), G("1122", "0320"), G("0000", "0300")),
    ("paint_majority", (), G("1122", "0320"), G("2222", "0220")),
    ("swap_two_colours", (), G("120", "210"), G("210", "120")),
    ("invert_colour", (), G("30", "03"), G("03", "30")),
    ("crop_bbox", (), G("000", "010", "011"), G("10", "11")),
    ("extract_colour", (2,), G("1002", "0020", "1000"), G("02", "20")),
    ("crop_largest_object", (), OBJECTS, G("11", "10")),
    ("crop_smallest_object", (), OBJECTS, G("2")),
    ("keep_largest_object", (), OBJECTS, G("1100", "1000", "0000")),
    ("keep_smallest_object", (), OBJECTS, G("0000", "0002", "0000")),
    ("recolour_largest", (7,), OBJECTS, G("7700", "7002", "0000")),
    ("recolour_smallest", (7,), OBJECTS, G("1100", "1007", "0000")),
    ("recolour_border_objects", (4,), G("1000", "0020", "0000", "0003"), G("4000", "0020", "0000", "0004")),
    ("recolour_by_size", ((1, 5), (3, 6)), OBJECTS, G("6600", "6005", "0000")),
    ("flip_in_place", (), G("0000", "0120", "0300"), G("0000", "0210", "0030")),
    ("hollow", (), G("1111", "1111", "1111"), G("1111", "1001", "1111")),
    ("outline", (8,), G("000", "010", "000"), G("888", "818", "888")),
    ("fill_bbox", (), G("100", "010", "001"), G("111", "111", "111")),
    ("fill_enclosed", (4,), G("11111", "10001", "11111", "00000"), G("11111", "14441", "11111", "00000")),
    ("remove_noise", (), G("100", "000", "022"), G("000", "000", "022")),
    ("connect_dots", (), G("0100", "2002", "0100"), G("0100", "2222", "0100")),
    ("connect_rows", (), G("1001", "1000"), G("1111", "1000")),
    ("connect_cols", (), G("10", "00", "10"), G("10", "10", "10")),
    ("rays_right", (), G("0100", "0020"), G("0111", "0022")),
    ("rays_left", (), G("0100", "0020"), G("1100", "2220")),
    ("rays_down", (), G("01", "00", "20"), G("01", "01", "21")),
    ("rays_up", (), G("01", "00", "20"), G("21", "20", "20")),
    ("cross_lines", (), G("000", "010", "000"), G("010", "111", "010")),
    ("draw_border", (8,), G("0000", "0100", "0000", "0000"), G("8888", "8108", "8008", "8888")),
    ("gravity_down", (), G("10", "02", "00"), G("00", "00", "12")),
    ("gravity_up", (), G("10", "02", "00"), G("12", "00", "00")),
    ("gravity_left", (), G("010", "203"), G("100", "230")),
    ("gravity_right", (), G("010", "203"), G("001", "023")),
    ("shift_down", (), G("12", "34"), G("00", "12")),
    ("shift_up", (), G("12", "34"), G("34", "00")),
    ("shift_left", (), G("12", "34"), G("20", "40")),
    ("shift_right", (), G("12", "34"), G("01", "03")),
    ("scale_2", (), G("12"), G("1122", "1122")),
    ("scale_3", (), G("1"), G("111", "111", "111")),
    ("downscale_2", (), G("1122", "1122"), G("12")),
    ("downscale_3", (), G("111", "111", "111"), G("1")),
    ("tile_1x2", (), G("12"), G("1212")),
    ("tile_2x1", (), G("12"), G("12", "12")),
    ("tile_2x2", (), G("1", "2"), G("11", "22", "11", "22")),
    ("tile_3x3", (), G("10"), G("101010", "101010", "101010")),
    ("mirror_right", (), G("12"), G("1221")),
    ("mirror_down", (), G("1", "2"), G("1", "2", "2", "1")),
    ("mirror_quad", (), G("12", "30"), G("1221", "3003", "3003", "1221")),
    ("left_half", (), G("12345"), G("12")),
    ("right_half", (), G("12345"), G("45")),
    ("top_half", (), G("1", "2", "3", "4"), G("1", "2")),
    ("bottom_half", (), G("1", "2", "3", "4"), G("3", "4")),
    ("halves_and", (3,), G("10511", "11501"), G("30", "03")),
    ("halves_or", (3,), G("10511", "11501"), G("33", "33")),
    ("halves_xor", (3,), G("10511", "11501"), G("03", "30")),
    ("halves_nor", (3,), G("10500", "00500"), G("03", "33")),
    ("symmetrize_h", (5,), G("1255", "3003"), G("1221", "3003")),
    ("symmetrize_v", (5,), G("12", "34", "55", "12"), G("12", "34", "34", "12")),
    ("symmetrize_rot", (5,), G("12", "55"), G("12", "21")),
    ("symmetrize", (5,), G("55", "12"), G("12", "12")),
    ("majority_cell", (), G("1122", "0320"), G("2")),
    ("minority_cell", (), G("1122", "0320"), G("3")),
    ("bar_cells", (), G("10", "11"), G("111")),
    ("bar_objects", (), G("101", "000", "101"), G("1111")),
    ("sort_rows", (), G("110", "000", "100"), G("000", "100", "110")),
    ("sort_cols", (), G("101", "100"), G("011", "001")),
    ("dedupe_rows", (), G("12", "12", "34", "12"), G("12", "34", "12")),
    ("dedupe_cols", (), G("1123", "1123"), G("123", "123")),
]


def test_the_dsl_has_at_least_35_uniquely_named_primitives():
    names = [p.name for p in dsl.PRIMITIVES]
    assert len(names) >= 35
    assert len(set(names)) == len(names)


def test_every_primitive_has_a_hand_made_case():
    assert {name for name, *_ in CASES} == set(dsl.BY_NAME)


@pytest.mark.parametrize("name, params, grid, expected", CASES, ids=[c[0] for c in CASES])
def test_primitive_on_its_hand_made_case(name, params, grid, expected):
    assert run(name, grid, *params) == expected


@pytest.mark.parametrize("name, params, grid, expected", CASES, ids=[c[0] for c in CASES])
def test_pure_twin_agrees_on_the_hand_made_case(name, params, grid, expected):
    pure = dsl.BY_NAME[name].pure
    assert as_grid(pure([list(row) for row in grid], *params)) == expected


@pytest.mark.parametrize("name, grid", [
    ("swap_two_colours", G("123")),
    ("invert_colour", G("120")),
    ("crop_bbox", G("00", "00")),
    ("extract_colour", G("11")),  # with colour 2, absent
    ("downscale_2", G("12", "11")),
    ("downscale_3", G("11", "11")),
    ("crop_largest_object", G("101")),  # two objects of one cell: a tie
    ("crop_smallest_object", G("000")),
    ("left_half", G("1", "2")),
    ("top_half", G("12")),
    ("halves_and", G("1")),
    ("majority_cell", G("12")),
    ("minority_cell", G("00")),
    ("bar_cells", tuple((1,) * 31 for _ in range(2))),
    ("scale_3", tuple((1,) * 11 for _ in range(11))),  # 33 cells a side is too big
    ("tile_3x3", tuple((1,) * 11 for _ in range(2))),
    ("flip_in_place", G("0")),
])
def test_primitive_that_does_not_apply_returns_none(name, grid):
    params = (2,) if dsl.BY_NAME[name].learn else ()
    assert run(name, grid, *params) is None


def test_colour_map_does_not_apply_to_a_colour_its_pairs_never_showed():
    assert run("colour_map", G("13"), (1, 2), (2, 1)) is None


def test_object_ties_make_largest_and_smallest_inapplicable():
    assert run("keep_largest_object", G("1010")) is None
    assert run("recolour_smallest", G("20", "00", "03"), 5) is None


def test_objects_are_eight_connected_same_coloured_cells_in_reading_order():
    found = dsl.pure__objects([[1, 0, 2], [0, 1, 2], [3, 0, 0]])
    assert [(colour, sorted(cells)) for colour, cells in found] == [
        (1, [(0, 0), (1, 1)]), (2, [(0, 2), (1, 2)]), (3, [(2, 0)])]


def test_halves_split_at_a_middle_separator_row_when_the_width_has_none():
    assert run("halves_or", G("10", "00", "55", "00", "01"), 2) == G("20", "02")


# --- learners ----------------------------------------------------------------------------------

def examples(*pairs: tuple[Grid, Grid]):
    return [(dsl.to_array(a), dsl.to_array(b)) for a, b in pairs]


def test_colour_map_is_learned_from_every_pair_together():
    learned = dsl.learn_colour_map(examples((G("12"), G("56")), (G("30"), G("40"))))
    assert learned == [((0, 0), (1, 5), (2, 6), (3, 4))]


def test_colour_map_is_not_learned_when_one_colour_goes_two_ways():
    assert dsl.learn_colour_map(examples((G("11"), G("23")))) == []
    assert dsl.learn_colour_map(examples((G("1"), G("2")), (G("1"), G("3")))) == []


def test_colour_map_is_not_learned_from_different_shapes_or_no_change():
    assert dsl.learn_colour_map(examples((G("12"), G("1", "2")))) == []
    assert dsl.learn_colour_map(examples((G("12"), G("12")))) == []


def test_fill_colour_is_learned_from_the_first_pair_as_the_one_colour_painted():
    assert dsl.learn_new_colour(examples((G("101", "000"), G("141", "040")))) == [(4,)]
    assert dsl.learn_new_colour(examples((G("100"), G("145")))) == []


def test_dropped_kept_and_mask_colours_come_from_the_first_pair():
    pair = examples((G("1250"), G("1200")))
    assert dsl.learn_dropped_colours(pair) == [(5,)]
    assert dsl.learn_kept_colours(pair) == [(1,), (2,)]
    assert dsl.learn_mask_colour(pair) == [(5,)]


def test_size_to_colour_map_is_learned_from_objects_and_their_output_colours():
    learned = dsl.learn_size_colours(examples((OBJECTS, G("6600", "6005", "0000"))))
    assert learned == [((1, 5), (3, 6))]


def test_halves_colour_is_the_outputs_one_colour():
    assert dsl.learn_output_colour(examples((G("1051"), G("03")))) == [(3,)]


# --- portable source ---------------------------------------------------------------------------

PARAMETRIC = {p.name for p in dsl.PRIMITIVES if p.learn is not None}


def random_params(name: str, rng: random.Random) -> tuple:
    if name not in PARAMETRIC:
        return ()
    if name == "colour_map":  # a full table half the time, so the map mostly applies
        sources = range(10) if rng.random() < 0.5 else rng.sample(range(10), rng.randint(1, 4))
        return tuple(sorted((s, rng.randrange(10)) for s in sources))
    if name == "recolour_by_size":
        return tuple(sorted((s, rng.randrange(10)) for s in rng.sample(range(1, 7), rng.randint(1, 3))))
    return (rng.randrange(10),)


def random_grid(rng: random.Random) -> Grid:
    """Grids shaped to reach every primitive's paths: sparse, blocky, symmetric, split, objects."""
    height, width = rng.randint(1, 12), rng.randint(1, 12)
    palette = [0] * rng.randint(0, 3) + rng.sample(range(1, 10), rng.randint(1, 3))
    density = rng.random()
    grid = [[rng.choice(palette) if rng.random() < density else 0 for _ in range(width)] for _ in range(height)]
    kind = rng.randrange(5)
    if kind == 1:
        k = rng.choice((2, 3))
        grid = [[v for v in row[:5] for _ in range(k)] for row in grid[:5] for _ in range(k)]
    elif kind == 2:
        grid = [row + row[::-1] for row in grid]
        grid = grid + grid[::-1]
        mask = rng.randrange(10)
        for _ in range(rng.randint(0, 6)):
            grid[rng.randrange(len(grid))][rng.randrange(len(grid[0]))] = mask
    elif kind == 3:
        separator = rng.randint(1, 9)
        grid = [row + [separator] + [rng.choice(palette) for _ in row] for row in grid]
    elif kind == 4:
        grid = [[0] * width for _ in range(height)]
        for _ in range(rng.randint(0, 4)):
            colour, top, left = rng.randint(1, 9), rng.randrange(height), rng.randrange(width)
            for r in range(top, min(top + rng.randint(1, 3), height)):
                for c in range(left, min(left + rng.randint(1, 3), width)):
                    grid[r][c] = colour
    return as_grid([row[:MAX_SIDE] for row in grid[:MAX_SIDE]])


def source_output(program: Program, grid: Grid) -> Grid | None:
    namespace: dict = {}
    exec(compile(program.source(), "<program>", "exec"), namespace)
    out = namespace["transform"]([list(row) for row in grid])
    return None if out is None else as_grid(out)


@pytest.mark.parametrize("name", [p.name for p in dsl.PRIMITIVES])
def test_source_of_each_primitive_reproduces_it_on_random_grids(name):
    rng = random.Random(f"source-{name}")
    for _ in range(60):
        program = Program((Step(name, random_params(name, rng)),))
        grid = random_grid(rng)
        assert source_output(program, grid) == program(grid), (program.describe(), grid)


def test_source_of_random_chains_reproduces_them():
    rng = random.Random(11)
    names = [p.name for p in dsl.PRIMITIVES]
    for _ in range(300):
        steps = tuple(Step(n, random_params(n, rng)) for n in rng.sample(names, rng.randint(2, 3)))
        program = Program(steps)
        grid = random_grid(rng)
        assert source_output(program, grid) == program(grid), (program.describe(), grid)


def test_source_holds_exactly_the_functions_its_steps_need():
    source = Program((Step("rot90"),)).source()
    defined = [line.split("(")[0][4:] for line in source.splitlines() if line.startswith("def ")]
    assert defined == ["rot90", "transform"]
    source = Program((Step("crop_largest_object"), Step("scale_2"))).source()
    defined = [line.split("(")[0][4:] for line in source.splitlines() if line.startswith("def ")]
    assert sorted(defined) == ["_by_size", "_crop_object", "_objects", "crop_largest_object", "scale_2", "transform"]


def test_source_starts_with_the_program_line_and_imports_nothing():
    program = Program((Step("flip_h"), Step("colour_map", ((0, 0), (1, 2), (3, 4)))))
    source = program.source()
    assert source.splitlines()[0] == "# program: flip_h | colour_map{0:0,1:2,3:4}"
    assert "import" not in source and "pure_" not in source and "numpy" not in source


# --- never raises ------------------------------------------------------------------------------

@st.composite
def grids(draw, max_side: int = MAX_SIDE) -> Grid:
    height, width = draw(st.integers(1, max_side)), draw(st.integers(1, max_side))
    palette = draw(st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True))
    cells = draw(st.lists(st.sampled_from(palette), min_size=height * width, max_size=height * width))
    return tuple(tuple(cells[r * width : (r + 1) * width]) for r in range(height))


@settings(max_examples=120, deadline=None)
@given(grid=grids(), seed=st.integers(0, 2**16))
def test_no_primitive_raises_and_each_returns_a_valid_grid_or_none(grid, seed):
    rng = random.Random(seed)
    for primitive in dsl.PRIMITIVES:
        out = run(primitive.name, grid, *random_params(primitive.name, rng))
        assert out is None or as_grid(out) == out


@settings(max_examples=60, deadline=None)
@given(state=grids(12), output=grids(12))
def test_no_learner_raises_on_any_pair_of_grids(state, output):
    for primitive in dsl.PRIMITIVES:
        if primitive.learn is not None:
            for params in primitive.learn(examples((state, output))):
                out = run(primitive.name, state, *params)
                assert out is None or as_grid(out) == out
