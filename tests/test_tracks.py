"""From a grid's track to a cell's schedule: sources, task choice, epilogue, fresh reference; the CLI."""

import textwrap

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.prompts import PromptError, PromptSet
from orchestrator.run.grid_config import load_grid
from orchestrator.run.schedule import build_schedule

FAKE_GENERATORS = """\
import random


def generate_0a0a0a0a(diff_lb, diff_ub):
    h, w = random.randint(2, 6), random.randint(2, 6)
    g = tuple(tuple(random.randint(1, 9) for _ in range(w)) for _ in range(h))
    return {'input': g, 'output': tuple(r[::-1] for r in g)}
"""
FAKE_VERIFIERS = "def verify_0a0a0a0a(I):\n    return tuple(r[::-1] for r in I)\n"


def grid_file(tmp_path, track: str, learners: str = "[stateless-floor, {learner: program-library, row: wiped}]"):
    path = tmp_path / "grid.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: t
        seed: 5
        track: {track}
        orders: [sequential, random]
        learners: {learners}
        """))
    return load_grid(path)


def test_own_track_schedule_is_stream_then_epilogue_then_fresh_reference(tmp_path):
    grid = grid_file(tmp_path, "{name: own, tasks: 4, visits: 3, epilogue: 2}")
    cell = grid.cells()[0]
    slots = build_schedule(grid, cell)
    assert [s.phase for s in slots] == ["stream"] * 12 + ["epilogue"] * 2 + ["fresh"] * 2
    assert [s.index for s in slots] == list(range(16))
    assert all(s.task_id.startswith("own-") for s in slots)
    stream_tasks = {s.task_id for s in slots if s.phase == "stream"}
    held_out = {s.task_id for s in slots if s.phase == "epilogue"}
    assert not stream_tasks & held_out
    epilogue = [s for s in slots if s.phase == "epilogue"]
    fresh = [s for s in slots if s.phase == "fresh"]
    assert [s.task_id for s in epilogue] == [s.task_id for s in fresh]
    assert epilogue[0].instance() == fresh[0].instance()
    assert all(s.wipe_before for s in fresh) and not any(s.wipe_before for s in epilogue)


def test_the_kth_visit_is_the_same_instance_in_every_order(tmp_path):
    grid = grid_file(tmp_path, "{name: own, tasks: 4, visits: 3, epilogue: 0}")
    sequential, random_order = [build_schedule(grid, c) for c in grid.cells()[:4:2]]
    assert sequential[0].phase == "stream" and grid.cells()[2].order == "random"
    by_visit = {(s.task_id, s.visit): s.instance() for s in sequential}
    assert [s.task_id for s in sequential] != [s.task_id for s in random_order]
    for s in random_order:
        assert s.instance() == by_visit[(s.task_id, s.visit)]


def test_wiped_row_wipes_before_every_slot(tmp_path):
    grid = grid_file(tmp_path, "{name: own, tasks: 2, visits: 2, epilogue: 1}")
    wiped = next(c for c in grid.cells() if c.row == "wiped")
    assert all(s.wipe_before for s in build_schedule(grid, wiped))


def test_arc1_frames_track_serves_training_tasks_and_an_arc1_evaluation_epilogue(tmp_path):
    from orchestrator.tasks.public import arc1_tasks
    grid = grid_file(tmp_path, "{name: arc1, tasks: 3, visits: 2, epilogue: 2}")
    slots = build_schedule(grid, grid.cells()[0])
    training, evaluation = arc1_tasks("training"), arc1_tasks("evaluation")
    assert all(s.task_id in training for s in slots if s.phase == "stream")
    assert all(s.task_id in evaluation for s in slots if s.phase != "stream")
    first, second = [s.instance() for s in slots if s.task_id == slots[0].task_id]
    assert first.test_input != second.test_input or first.demos != second.demos  # a new frame


def test_arc2_track_serves_tasks_new_in_the_second_edition(tmp_path):
    from orchestrator.tasks.public import arc2_new_eval_tasks
    grid = grid_file(tmp_path, "{name: arc2, tasks: 3, visits: 2, epilogue: 0}")
    slots = build_schedule(grid, grid.cells()[0])
    assert all(s.task_id in arc2_new_eval_tasks() for s in slots)
    assert slots[0].instance().test_input


def test_rearc_track_generates_through_the_checkout_the_grid_names(tmp_path):
    checkout = tmp_path / "re-arc"
    checkout.mkdir()
    (checkout / "generators.py").write_text(FAKE_GENERATORS)
    (checkout / "verifiers.py").write_text(FAKE_VERIFIERS)
    grid = grid_file(tmp_path, "{name: arc1, rearc_path: re-arc, tasks: 1, visits: 2, epilogue: 1}")
    assert grid.track.source == "rearc" and grid.track.rearc_path == checkout.resolve()
    slots = build_schedule(grid, grid.cells()[0])
    stream = [s for s in slots if s.phase == "stream"]
    assert [s.task_id for s in stream] == ["0a0a0a0a", "0a0a0a0a"]
    instance = stream[0].instance()
    assert instance.test_output == tuple(r[::-1] for r in instance.test_input)
    assert len(instance.demos) == 8 and stream[1].instance() != instance


def test_more_tasks_than_the_source_has_is_an_error_naming_the_field(tmp_path):
    grid = grid_file(tmp_path, "{name: own, tasks: 300, epilogue: 0}")
    with pytest.raises(ValueError, match="track.tasks: 300 tasks asked for"):
        build_schedule(grid, grid.cells()[0])


def test_prompt_file_replaces_templates_and_rejects_unknown_names(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("verdict_correct: 'Right. Over.'\n")
    prompts = PromptSet.load(path)
    assert prompts.render("verdict_correct") == "Right. Over."
    assert "Task id: t" in prompts.instance_message("t", ((1,),), 0, 0)
    path.write_text("verdict: 'x'\n")
    with pytest.raises(PromptError, match="unknown template name"):
        PromptSet.load(path)


def test_cli_stream_show_prints_the_gap_summary():
    result = CliRunner().invoke(app, ["stream", "show", "--order", "workstreams", "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert "gap median" in result.output and "gap 90th percentile" in result.output


def test_cli_grid_check_reports_a_bad_grid_with_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nlearners: [nobody]\n")
    result = CliRunner().invoke(app, ["grid", "check", str(path)])
    assert result.exit_code == 2
    assert f"{path}:2: learners[0]" in result.output.replace("\n", "")
