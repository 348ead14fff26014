"""Frames (a symmetry of the square plus a recolouring), the labels file, and the framed source."""

import itertools
import json
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.arc import Demo
from orchestrator.tasks.base import TaskSource
from orchestrator.tasks.frames import (SYMMETRIES, Frame, FramedSource, LabelsError,
                                       apply_symmetry, compose, derive_symmetry_labels,
                                       inverse_symmetry, label_by_equivariance,
                                       load_symmetry_labels, render_symmetry_labels)
from orchestrator.tasks.public import PublicTask, arc1_tasks, arc2_new_eval_tasks

GENERIC = ((1, 2, 3), (4, 5, 6))

grids = st.integers(1, 6).flatmap(lambda h: st.integers(1, 6).flatmap(
    lambda w: st.lists(st.lists(st.integers(0, 9), min_size=w, max_size=w), min_size=h, max_size=h)
)).map(lambda rows: tuple(map(tuple, rows)))
frames = st.builds(Frame, st.sampled_from(SYMMETRIES),
                   st.permutations(range(1, 10)).map(lambda p: (0, *p)))


def instance_bytes(inst) -> bytes:
    return json.dumps([inst.task_id, inst.visit, inst.test_input, inst.test_output,
                       [d.to_json() for d in inst.demos]]).encode()


def labels_file(tmp_path, text: str):
    path = tmp_path / "labels.yaml"
    path.write_text(text)
    return path


def toy_tasks() -> dict[str, PublicTask]:
    """Two tasks with asymmetric, many-coloured grids, so every frame looks different."""
    def demo(k: int) -> Demo:
        g = ((k % 10, 1, 2), (3, 4, 5))
        return Demo(g, apply_symmetry("rot180", g))
    train = tuple(demo(k) for k in range(6, 9))
    return {"labelled": PublicTask("labelled", train, (demo(1),)),
            "unlabelled": PublicTask("unlabelled", train, (demo(1),))}


ALL_EIGHT = "labelled: [" + ", ".join(SYMMETRIES) + "]\n"


# ----- the group -----

def test_the_eight_symmetries_of_the_square_are_distinct():
    assert len(SYMMETRIES) == 8
    assert len({apply_symmetry(s, GENERIC) for s in SYMMETRIES}) == 8


def test_named_symmetries_act_as_documented():
    g = ((1, 2), (3, 4))
    assert apply_symmetry("rot90", g) == ((3, 1), (4, 2))  # clockwise
    assert apply_symmetry("rot270", g) == ((2, 4), (1, 3))
    assert apply_symmetry("rot180", g) == ((4, 3), (2, 1))
    assert apply_symmetry("flip_h", g) == ((2, 1), (4, 3))  # left <-> right
    assert apply_symmetry("flip_v", g) == ((3, 4), (1, 2))  # top <-> bottom
    assert apply_symmetry("transpose", g) == ((1, 3), (2, 4))
    assert apply_symmetry("antitranspose", g) == ((4, 2), (3, 1))


def test_symmetries_form_a_group_closed_associative_with_inverses():
    for a, b in itertools.product(SYMMETRIES, repeat=2):
        assert compose(a, b) in SYMMETRIES
        assert apply_symmetry(compose(a, b), GENERIC) == apply_symmetry(a, apply_symmetry(b, GENERIC))
    for a, b, c in itertools.product(SYMMETRIES, repeat=3):
        assert compose(a, compose(b, c)) == compose(compose(a, b), c)
    for s in SYMMETRIES:
        assert compose(s, "identity") == compose("identity", s) == s
        assert compose(s, inverse_symmetry(s)) == compose(inverse_symmetry(s), s) == "identity"
    assert inverse_symmetry("rot90") == "rot270"
    assert all(inverse_symmetry(s) == s for s in ("rot180", "flip_h", "flip_v", "transpose"))


@given(grids, frames)
def test_a_frame_undone_by_its_inverse_gives_back_the_grid(grid, frame):
    assert frame.inverse().apply(frame.apply(grid)) == grid


@given(grids, frames)
def test_a_frames_recolouring_keeps_background_0_where_the_symmetry_puts_it(grid, frame):
    framed, moved = frame.apply(grid), apply_symmetry(frame.symmetry, grid)
    for row_f, row_m in zip(framed, moved):
        for f, m in zip(row_f, row_m):
            assert (f == 0) == (m == 0)


def test_a_recolouring_that_moves_background_or_is_not_a_permutation_is_refused():
    with pytest.raises(ValueError, match="keeps 0"):
        Frame("identity", (1, 0, 2, 3, 4, 5, 6, 7, 8, 9))
    with pytest.raises(ValueError, match="permutation"):
        Frame("identity", (0, 1, 1, 3, 4, 5, 6, 7, 8, 9))
    with pytest.raises(ValueError, match="unknown symmetry 'rot45'"):
        Frame("rot45")


# ----- the framed source -----

def test_framed_source_is_a_task_source():
    source = FramedSource(toy_tasks(), name="arc1-frames")
    assert isinstance(source, TaskSource) and source.name == "arc1-frames"


def test_eight_visits_of_a_task_allowed_all_symmetries_use_eight_distinct_frames_one_per_symmetry(tmp_path):
    source = FramedSource(toy_tasks(), "t", labels_file(tmp_path, ALL_EIGHT))
    for seed in range(5):
        used = [source.frame("labelled", v, seed) for v in range(8)]
        assert len(set(used)) == 8
        assert sorted(f.symmetry for f in used) == sorted(SYMMETRIES)
        instances = {instance_bytes(source.instance("labelled", v, seed)) for v in range(8)}
        assert len(instances) == 8


def test_no_visit_reuses_an_earlier_visits_frame_and_none_is_the_bare_public_pairs(tmp_path):
    source = FramedSource(toy_tasks(), "t", labels_file(tmp_path, ALL_EIGHT))
    for task_id in ("labelled", "unlabelled"):
        used = [source.frame(task_id, v, seed=11) for v in range(100)]
        assert len(set(used)) == 100
        assert not any(f.is_identity for f in used)


def test_an_unlabelled_task_gets_the_identity_symmetry_only_with_varying_recolourings(tmp_path):
    source = FramedSource(toy_tasks(), "t", labels_file(tmp_path, ALL_EIGHT))
    assert source.allowed_symmetries("unlabelled") == ("identity",)
    used = [source.frame("unlabelled", v, seed=2) for v in range(30)]
    assert {f.symmetry for f in used} == {"identity"}
    assert len({f.colours for f in used}) == 30


def test_a_visit_is_the_same_bytes_for_seed_task_and_visit_in_any_order(tmp_path):
    path = labels_file(tmp_path, ALL_EIGHT)
    calls = [(t, v) for t in ("labelled", "unlabelled") for v in range(10)]
    forward = {c: instance_bytes(FramedSource(toy_tasks(), "t", path).instance(*c, seed=5)) for c in calls}
    source = FramedSource(toy_tasks(), "t", path)
    shuffled = calls[1::2] + calls[::2]
    assert {c: instance_bytes(source.instance(*c, seed=5)) for c in shuffled} == forward
    assert source.instance("labelled", 3, seed=6) != source.instance("labelled", 3, seed=5)


def test_every_pair_of_an_instance_is_shown_in_the_visits_one_frame(tmp_path):
    tasks = toy_tasks()
    source = FramedSource(tasks, "t", labels_file(tmp_path, ALL_EIGHT))
    for visit in range(8):
        inst, frame = source.instance("labelled", visit, 4), source.frame("labelled", visit, 4)
        back = frame.inverse()
        assert Demo(back.apply(inst.test_input), back.apply(inst.test_output)) == tasks["labelled"].test[0]
        assert sorted(map(repr, (back.apply_demo(d) for d in inst.demos))) == \
            sorted(map(repr, tasks["labelled"].train))


def test_arc2_frames_serve_every_new_evaluation_task():
    source = FramedSource(arc2_new_eval_tasks(), name="arc2-frames")
    for task_id in source.task_ids():
        inst = source.instance(task_id, 0, seed=1)
        assert inst.demos and inst.test_output


# ----- the labels file -----

def test_a_bad_symmetry_name_is_an_error_naming_file_line_task_and_name(tmp_path):
    path = labels_file(tmp_path, '# header\n"abc12345": [identity]\n"0d3d703e": [rot90, rot45]\n')
    with pytest.raises(LabelsError) as err:
        FramedSource(toy_tasks(), "t", path)
    message = str(err.value)
    assert f"{path}:3" in message and "'0d3d703e'" in message and "'rot45'" in message
    assert "flip_h" in message  # lists the names that are known


@pytest.mark.parametrize("text, complaint", [
    ("- abc\n- def\n", "expected a mapping"),
    ("abc12345: rot90\n", "task 'abc12345': expected a list"),
    ("abc12345: [rot90]\nabc12345: [rot180]\n", "listed twice"),
    ("abc12345: [rot90\n", "not valid YAML"),
])
def test_a_malformed_labels_file_is_an_error_naming_the_file(tmp_path, text, complaint):
    path = labels_file(tmp_path, text)
    with pytest.raises(LabelsError, match=complaint) as err:
        load_symmetry_labels(path)
    assert str(path) in str(err.value)


def test_a_missing_labels_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(LabelsError, match="nope.yaml"):
        load_symmetry_labels(tmp_path / "nope.yaml")


def test_task_ids_are_read_as_written_and_identity_is_always_allowed(tmp_path):
    labels = load_symmetry_labels(labels_file(tmp_path, "00576224: [flip_h]\n1e5: []\n"))
    assert labels == {"00576224": ("identity", "flip_h"), "1e5": ("identity",)}


def test_an_empty_labels_file_labels_nothing(tmp_path):
    assert load_symmetry_labels(labels_file(tmp_path, "# only a header\n")) == {}


def test_the_shipped_labels_file_is_exactly_the_mechanical_derivation():
    shipped = resources.files("orchestrator").joinpath("data", "symmetry_labels.yaml").read_text()
    assert shipped == render_symmetry_labels(derive_symmetry_labels())
    assert "NOT listed gets the" in shipped and "identity symmetry only" in shipped


def test_a_mirror_task_keeps_the_symmetries_under_which_its_rule_is_the_same_rule():
    task = arc1_tasks("training")["67a3c6ac"]  # every output is the input mirrored left <-> right
    allowed = label_by_equivariance(task)
    assert allowed == ("identity", "rot180", "flip_h", "flip_v")
    for s in allowed:
        frame = Frame(s)
        assert all(frame.apply(p.output) == apply_symmetry("flip_h", frame.apply(p.input))
                   for p in task.pairs)
    # Under rot90 the framed pairs would show a top <-> bottom mirror: another rule.
    rotated = Frame("rot90")
    assert not all(rotated.apply(p.output) == apply_symmetry("flip_h", rotated.apply(p.input))
                   for p in task.pairs)


def test_a_task_that_is_not_a_fixed_rearrangement_of_cells_is_left_identity_only():
    assert label_by_equivariance(arc1_tasks("training")["1e0a9b12"]) == ("identity",)  # gravity
    assert not set(arc2_new_eval_tasks()) & set(load_symmetry_labels())
