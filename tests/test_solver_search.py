"""The solver model's program search: what it finds at each effort, in what order, and its contracts."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness_adapters.program_check import run_program
from orchestrator.arc import Demo, Grid
from solver_model.search import EFFORTS, Program, Step, consistent, search


def G(*rows: str) -> Grid:
    return tuple(tuple(int(ch) for ch in row) for row in rows)


def noise(seed: int, height: int, width: int, colours=(1, 2, 3), density: float = 0.5) -> Grid:
    rng = random.Random(seed)
    return tuple(tuple(rng.choice(colours) if rng.random() < density else 0 for _ in range(width))
                 for _ in range(height))


def scene(seed: int, colour: int) -> Grid:
    """A 9x9 grid with one solid rectangle of `colour` and two single cells of other colours."""
    rng = random.Random(seed)
    grid = [[0] * 9 for _ in range(9)]
    width = rng.randint(2, 4)
    for r in range(1, 4):
        for c in range(1, 1 + width):
            grid[r][c] = colour
    grid[6][6], grid[7][3] = rng.choice([k for k in (1, 2, 3) if k != colour]), 9
    return tuple(map(tuple, grid))


def pairs_of(program: Program, inputs) -> list[Demo]:
    return [Demo(grid, program(grid)) for grid in inputs]


def answers(pairs, effort, test_input):
    return [p(test_input) for p in search(pairs, effort, test_input)]


ROT_THEN_MAP = Program((Step("rot90"), Step("colour_map", ((0, 0), (1, 5), (2, 6), (3, 4)))))
CROP_THEN_SCALE = Program((Step("crop_largest_object"), Step("scale_2")))
CROP_SCALE_MAP = Program((Step("crop_largest_object"), Step("scale_2"), Step("colour_map", ((1, 4), (2, 5), (3, 6)))))


def test_single_flip_is_found_at_low_effort():
    pairs = [Demo(g, tuple(row[::-1] for row in g)) for g in (noise(1, 3, 4), noise(2, 5, 2))]
    found = search(pairs, "low")
    assert found[0].describe() == "flip_h"


def test_rot90_then_colour_map_found_from_two_pairs():
    pairs = pairs_of(ROT_THEN_MAP, [noise(1, 3, 4), noise(2, 4, 5)])
    test = noise(3, 5, 3)
    found = search(pairs, "low", test)
    assert found[0].describe() == "rot90 | colour_map{0:0,1:5,2:6,3:4}"
    assert found[0](test) == ROT_THEN_MAP(test)


def test_colour_map_learned_across_pairs_covers_a_colour_seen_only_in_the_second_pair():
    pairs = [Demo(G("12"), G("56")), Demo(G("30"), G("40"))]
    assert search(pairs, "low")[0].describe() == "colour_map{0:0,1:5,2:6,3:4}"


def test_colour_map_gives_no_answer_for_a_test_colour_the_pairs_never_showed():
    pairs = [Demo(G("56", "78"), G("65", "87"))]
    found = search(pairs, "low", G("12", "34"))
    assert [p.describe() for p in found] == ["flip_h"]


def test_fill_colour_is_learned_from_the_pairs():
    pairs = [Demo(G("1110", "1010", "1110"), G("1110", "1410", "1110")),
             Demo(G("222", "202", "202", "222"), G("222", "242", "242", "222"))]
    found = search(pairs, "low", G("333", "303", "333"))
    assert found[0].describe() == "fill_enclosed{4}"
    assert found[0](G("333", "303", "333")) == G("333", "343", "333")


def test_crop_largest_then_scale_found_at_medium_but_not_low():
    pairs = pairs_of(CROP_THEN_SCALE, [scene(1, 1), scene(2, 2)])
    test = scene(3, 3)
    assert CROP_THEN_SCALE(test) not in answers(pairs, "low", test)
    found = search(pairs, "medium", test)
    assert found[0].describe() == "crop_largest_object | scale_2"


def test_three_step_program_found_at_high_but_not_medium():
    pairs = pairs_of(CROP_SCALE_MAP, [scene(1, 1), scene(2, 2), scene(3, 3)])
    test = scene(4, 2)
    assert CROP_SCALE_MAP(test) not in answers(pairs, "medium", test)
    found = search(pairs, "high", test)
    assert found[0].describe() == "crop_largest_object | scale_2 | colour_map{1:4,2:5,3:6}"
    assert found[0](test) == CROP_SCALE_MAP(test)


def test_every_program_found_is_consistent_with_the_pairs_and_simplest_first():
    pairs = pairs_of(CROP_THEN_SCALE, [scene(1, 1), scene(2, 2)])
    found = search(pairs, "high", scene(3, 3))
    assert found and all(consistent(p, pairs) for p in found)
    lengths = [len(p.steps) for p in found]
    assert lengths == sorted(lengths)


def test_consistent_says_whether_a_program_reproduces_every_pair():
    pairs = [Demo(G("12"), G("21")), Demo(G("30"), G("03"))]
    assert consistent(Program((Step("flip_h"),)), pairs)
    assert not consistent(Program((Step("flip_v"),)), pairs)


def test_excluded_program_is_skipped_and_the_next_is_offered():
    pairs = pairs_of(ROT_THEN_MAP, [noise(1, 3, 4)])
    test = noise(3, 5, 3)
    first = search(pairs, "high", test)
    assert len(first) >= 2
    again = search(pairs, "high", test, exclude={first[0].describe()})
    assert first[0].describe() not in [p.describe() for p in again]
    assert again[0].describe() == first[1].describe()


def test_one_program_per_distinct_test_answer():
    symmetric = G("121", "303")  # flip_h and identity agree on this pair
    pairs = [Demo(symmetric, symmetric)]
    lopsided = search(pairs, "medium", G("120", "300"))
    outputs = [p(G("120", "300")) for p in lopsided]
    assert len(outputs) == len(set(outputs))
    assert {"identity", "flip_h"} <= {p.describe() for p in lopsided}
    mirrored = search(pairs, "medium", G("121", "000"))
    assert "flip_h" not in [p.describe() for p in mirrored]  # same answer as identity there
    assert len(mirrored) < len(lopsided)


def test_without_a_test_input_every_consistent_program_is_listed():
    pairs = [Demo(G("1200", "2100"), G("2100", "1200"))]
    described = [p.describe() for p in search(pairs, "low")]
    assert {"flip_v", "swap_two_colours", "colour_map{0:0,1:2,2:1}"} <= set(described)


def test_chains_that_return_to_the_input_are_not_listed_for_an_identity_task():
    pairs = [Demo(G("12", "30"), G("12", "30")), Demo(G("405",), G("405",))]
    described = [p.describe() for p in search(pairs, "high")]
    assert described[0] == "identity"
    assert "scale_2 | downscale_2" not in described and "rot90 | rot270" not in described


def test_programs_inapplicable_to_the_test_input_are_dropped():
    pairs = [Demo(G("1122", "1122"), G("12")), Demo(G("33", "33", "44", "44"), G("3", "4"))]
    assert "downscale_2" in [p.describe() for p in search(pairs, "low")]
    assert "downscale_2" not in [p.describe() for p in search(pairs, "low", G("123", "456"))]


@pytest.mark.parametrize("effort", EFFORTS)
def test_same_call_twice_gives_the_same_programs(effort):
    pairs = pairs_of(CROP_THEN_SCALE, [scene(1, 1), scene(2, 2)])
    first = [p.describe() for p in search(pairs, effort, scene(3, 3))]
    assert first == [p.describe() for p in search(pairs, effort, scene(3, 3))]


def test_no_pairs_give_no_programs():
    assert search([], "high", G("1")) == []


def test_an_unknown_effort_is_rejected_with_the_known_ones_named():
    with pytest.raises(ValueError, match="low, medium, high"):
        search([Demo(G("1"), G("1"))], "extreme")


def test_describe_is_stable_text_with_bound_parameters():
    program = Program((Step("rot90"), Step("colour_map", ((0, 0), (1, 2))), Step("outline", (8,))))
    assert program.describe() == "rot90 | colour_map{0:0,1:2} | outline{8}"


def test_a_program_needs_known_steps():
    with pytest.raises(ValueError):
        Program(())
    with pytest.raises(ValueError, match="unknown DSL primitive"):
        Program((Step("teleport"),))


def test_calling_a_program_on_a_non_grid_returns_none():
    assert Program((Step("identity"),))(((1, 2), (3,))) is None


def test_found_programs_source_reproduces_them_in_a_fresh_namespace():
    pairs = pairs_of(CROP_SCALE_MAP, [scene(1, 1), scene(2, 2), scene(3, 3)])
    tests = [scene(seed, colour) for seed in range(4, 8) for colour in (1, 2, 3)]
    for program in search(pairs, "high", tests[0]):
        namespace: dict = {}
        exec(compile(program.source(), "<program>", "exec"), namespace)
        for grid in tests:
            out = namespace["transform"]([list(row) for row in grid])
            assert (None if out is None else tuple(map(tuple, out))) == program(grid)


@pytest.mark.slow
def test_found_program_passes_the_program_check_in_a_separate_process():
    """Integration: the real checker runs the source in a fresh `python -I -S` subprocess."""
    pairs = pairs_of(ROT_THEN_MAP, [noise(1, 3, 4), noise(2, 4, 5)])
    test = noise(3, 5, 3)
    program = search(pairs, "medium", test)[0]
    results = run_program(program.source(), [d.input for d in pairs] + [test])
    assert [r.output for r in results] == [d.output for d in pairs] + [program(test)]


@st.composite
def small_grids(draw) -> Grid:
    height, width = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    cells = draw(st.lists(st.integers(0, 4), min_size=height * width, max_size=height * width))
    return tuple(tuple(cells[r * width : (r + 1) * width]) for r in range(height))


@settings(max_examples=40, deadline=None)
@given(pairs=st.lists(st.builds(Demo, small_grids(), small_grids()), min_size=1, max_size=3),
       test_input=st.none() | small_grids())
def test_search_never_raises_and_only_returns_consistent_programs(pairs, test_input):
    for program in search(pairs, "medium", test_input):
        assert consistent(program, pairs)
        if test_input is not None:
            assert program(test_input) is not None


# --- explore: one reply's bounded search in a drawn order -------------------------------------

import numpy as np  # noqa: E402

from solver_model.search import BUDGETS, SAMPLED, Level, explore  # noqa: E402


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize("effort", EFFORTS)
def test_explore_evaluates_at_most_the_caps_of_its_effort(effort):
    pairs = pairs_of(CROP_SCALE_MAP, [scene(1, 1), scene(2, 2)])
    for seed in range(5):
        result = explore(pairs, effort, rng(seed), scene(3, 3))
        assert 0 < result.evaluated <= sum(level.cap for level in SAMPLED[effort])


def test_explore_is_deterministic_given_the_generator_and_differs_across_generators():
    pairs = [Demo(G("1230", "0012"), G("4560", "0045"))]  # a colour map; many chains also fit
    runs = {seed: explore(pairs, "medium", rng(seed), G("2103")) for seed in range(8)}
    again = explore(pairs, "medium", rng(3), G("2103"))
    assert [p.describe() for p in again.found] == [p.describe() for p in runs[3].found]
    orders = {tuple(p.describe() for p in run.found) for run in runs.values()}
    assert len(orders) > 1  # another draw explores another part of the space


def test_explore_only_finds_programs_that_fit_and_keeps_a_partial_fit_that_does_not():
    # flip_h fits the first pair only; nothing in two steps fits the second.
    pairs = [Demo(G("12", "34"), G("21", "43")), Demo(G("56", "78"), G("99", "99"))]
    level = Level(frozenset({"flip_h", "flip_v", "rot90"}), frozenset(), 10)
    result = explore(pairs, "low", rng(0), G("10", "01"), levels=(level,))
    assert result.found == ()
    assert result.partial is not None and result.partial.describe() == "flip_h"
    assert result.partial_fit == pytest.approx(0.5)  # pair one right, pair two no cell right
    assert not consistent(result.partial, pairs)


def test_explore_never_keeps_an_excluded_program_as_its_partial_fit():
    pairs = [Demo(G("12", "34"), G("21", "43")), Demo(G("56", "78"), G("99", "99"))]
    level = Level(frozenset({"flip_h", "flip_v", "rot90"}), frozenset(), 10)
    result = explore(pairs, "low", rng(0), G("10", "01"), exclude={"flip_h"}, levels=(level,))
    assert result.partial is None or result.partial.describe() != "flip_h"


def test_explore_with_a_cap_too_small_misses_what_a_larger_cap_finds():
    pairs = pairs_of(CROP_THEN_SCALE, [scene(1, 1), scene(2, 2)])
    wide = BUDGETS["medium"]  # the exhaustive caps: every two-step chain is reached
    narrow = tuple(Level(level.final, level.extend, 1) for level in wide)
    hits = sum(bool(explore(pairs, "medium", rng(seed), scene(3, 3), levels=wide).found)
               for seed in range(4))
    misses = sum(not explore(pairs, "medium", rng(seed), scene(3, 3), levels=narrow).found
                 for seed in range(4))
    assert hits == 4 and misses == 4


def test_explore_with_no_pairs_evaluates_nothing():
    assert explore([], "low", rng(0), G("1")).evaluated == 0


# --- a primitive prior (a model trained between rounds, solver_model/prior.py) ------------------

def test_a_primitive_prior_brings_what_it_counts_forward_within_the_same_compute():
    from solver_model.prior import PrimitivePrior

    pairs = [Demo(((1, 2, 3), (4, 5, 6)), ((3, 2, 1), (6, 5, 4))),
             Demo(((7, 0), (0, 8)), ((0, 7), (8, 0)))]  # flip_h: one step, among ~80
    trained = PrimitivePrior().add([["flip_h"]] * 200)
    uniform_hits = trained_hits = 0
    for seed in range(40):
        uniform = explore(pairs, "low", np.random.default_rng(seed))
        learnt = explore(pairs, "low", np.random.default_rng(seed), prior=trained)
        assert learnt.evaluated <= sum(level.cap for level in SAMPLED["low"])  # no more compute
        uniform_hits += any(p.describe() == "flip_h" for p in uniform.found)
        trained_hits += any(p.describe() == "flip_h" for p in learnt.found)
    assert trained_hits >= 38 and uniform_hits <= 20, (uniform_hits, trained_hits)
    again = explore(pairs, "low", np.random.default_rng(3), prior=trained)
    assert again == explore(pairs, "low", np.random.default_rng(3), prior=trained)  # a function of its inputs


def test_a_prior_counts_programs_refuses_unknown_primitives_and_reads_back(tmp_path):
    from solver_model.prior import PrimitivePrior

    prior = PrimitivePrior().add([["crop_bbox", "flip_h"], ["identity"], ["flip_h"]])
    assert prior.programs == 3 and prior.counts == {"crop_bbox": 1, "flip_h": 2, "identity": 1}
    prior.save(tmp_path / "prior.json")
    assert PrimitivePrior.load(tmp_path / "prior.json") == prior
    with pytest.raises(ValueError, match="unknown DSL primitive"):
        PrimitivePrior({"no_such_step": 1})
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json: not a primitive prior"):
        PrimitivePrior.load(tmp_path / "bad.json")
