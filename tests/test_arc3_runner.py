"""The arc3 cell runner on the tiny deterministic game behind the engine interface
(`tests/arc3_fake.py`): records, charges, the library twin's return, wipes, exact resume. The same
runner drives the real engine container in tests/test_arc3_engine.py."""

from __future__ import annotations

import fcntl
import json
import time
from pathlib import Path

import pytest

from orchestrator.analysis.report import load_run
from orchestrator.analysis.measures import instances_frame
from orchestrator.records import CellFence, CellPaths, read_events, standing
from orchestrator.run.arc3_runner import Arc3CellRunner
from orchestrator.run.grid_config import GridFileError, load_grid
from orchestrator.run.slot_driver import ReplayMismatch
from tests.arc3_fake import FakeGame

GRID = """\
name: arc3-fake
seed: 3
track: {{name: arc3, environments_dir: games, visits: {visits}}}
orders: [sequential]
efforts: [low]
learners: [arc3-explorer, arc3-library, {{learner: arc3-library, row: wiped}}]
"""


@pytest.fixture
def grid_path(tmp_path) -> Path:
    meta = tmp_path / "games" / "fake" / "0001"
    meta.mkdir(parents=True)
    (meta / "metadata.json").write_text(json.dumps({"game_id": "fake-0001", "title": "Fake",
                                                     "baseline_actions": [2, 3, 4]}))
    path = tmp_path / "grid.yaml"
    path.write_text(GRID.format(visits=6))
    return path


def run_cell(grid_path: Path, run: Path, learner_index: int, game: FakeGame | None = None) -> Path:
    grid = load_grid(grid_path)
    cell = grid.cells()[learner_index]
    folder = run / "cells" / cell.cell
    Arc3CellRunner(grid, cell, folder, env_factory=lambda: game or FakeGame()).run()
    return folder


def ends(folder: Path) -> list:
    return [e for e in read_events(folder / "events.jsonl") if e.type == "instance_end"]


def test_a_stream_of_levels_is_charged_against_five_times_each_baseline(grid_path, tmp_path):
    folder = run_cell(grid_path, tmp_path / "run", 0)
    done = ends(folder)
    assert [(e.task, e.visit, e.level) for e in done] == [("fake-0001", v, v % 3) for v in range(6)]
    assert [e.budget for e in done] == [10, 15, 20, 10, 15, 20]
    steps = [e for e in read_events(folder / "events.jsonl") if e.type == "step"]
    for end in done:
        mine = [s for s in steps if s.slot == end.slot]
        played = sum(s.outcome == "played" for s in mine)
        assert end.cost == (played if end.status == "solved" else end.budget)
        assert [s.cost for s in mine if s.outcome == "played"] == list(range(1, played + 1))


def test_the_library_twin_returns_cheaper_and_its_wiped_row_does_not(grid_path, tmp_path):
    library = ends(run_cell(grid_path, tmp_path / "run", 1))
    wiped = ends(run_cell(grid_path, tmp_path / "run", 2))
    for k in range(3):
        first, second = library[k], library[k + 3]
        if first.status == "solved":
            assert second.status == "solved" and second.cost <= first.cost
    assert all(e.status for e in wiped)
    starts = [e for e in read_events(tmp_path / "run" / "cells" / "arc3-library-wiped.low.sequential.s3"
                                     / "events.jsonl") if e.type == "instance_start"]
    assert all(e.wiped_before for e in starts)


def test_the_analysis_scores_a_level_as_its_share_of_its_own_budget(grid_path, tmp_path):
    run_cell(grid_path, tmp_path / "run", 0)
    cells, events = load_run(tmp_path / "run")
    frame = instances_frame(events, cells)
    assert (frame["share"] == frame["cost"] / frame["budget"]).all()
    assert set(frame["budget"]) == {10, 15, 20} and frame["level"].tolist() == [0, 1, 2, 0, 1, 2]


class Killed(BaseException):
    """A kill: nothing of the runner runs after it (as SIGKILL)."""


class KilledAfter(FakeGame):
    """Killed after `n` actions."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def act(self, action):
        if self.n == 0:
            raise Killed()
        self.n -= 1
        return super().act(action)


def test_a_run_killed_mid_level_resumes_exactly_without_charging_twice(grid_path, tmp_path):
    whole = ends(run_cell(grid_path, tmp_path / "whole", 1))
    run = tmp_path / "killed"
    for n in (4, 7, 3):  # killed three times, each inside a level
        with pytest.raises(Killed):
            run_cell(grid_path, run, 1, KilledAfter(n))
    folder = run_cell(grid_path, run, 1)
    resumed = ends(folder)
    assert [(e.slot, e.status, e.cost, e.level) for e in resumed] == \
        [(e.slot, e.status, e.cost, e.level) for e in whole]
    events = read_events(folder / "events.jsonl")
    # a kill may come while a resumed level replays its actions (the engine is asked again), before
    # its `resumed` record
    assert 1 <= sum(e.type == "resumed" for e in events) <= 3
    for end in resumed:
        steps = [s.step for s in events if s.slot == end.slot and s.type == "step"]
        assert steps == list(range(1, len(steps) + 1))  # no gap, no repeat


class Failing(FakeGame):
    """An engine that fails (a container gone) once, after `n` actions."""

    def __init__(self, n: int, failed: list):
        super().__init__()
        self.n, self.failed = n, failed

    def act(self, action):
        if self.n == 0 and not self.failed:
            self.failed.append(True)
            raise ConnectionError("engine container gone")
        self.n -= 1
        return super().act(action)


def test_an_engine_failure_is_not_charged_and_the_level_is_played_again_from_its_start(grid_path, tmp_path):
    whole = ends(run_cell(grid_path, tmp_path / "whole", 1))
    failed: list = []
    grid = load_grid(grid_path)
    cell = grid.cells()[1]
    folder = tmp_path / "run" / "cells" / cell.cell
    Arc3CellRunner(grid, cell, folder, env_factory=lambda: Failing(5, failed)).run()
    events = read_events(folder / "events.jsonl")
    assert failed and [e.type for e in events].count("infrastructure_fault") == 1
    assert [(e.status, e.cost) for e in ends(folder)] == [(e.status, e.cost) for e in whole]
    assert not any(e.type == "learner_error" for e in events)
    # the level under the fault starts over on the fresh engine: its earlier actions superseded
    [fault] = [e for e in events if e.type == "infrastructure_fault"]
    after = [e for e in events[events.index(fault) + 1:] if e.slot == fault.slot]
    assert after[0].type == "instance_start" and not any(e.type == "resumed" for e in after)
    assert [e.step for e in standing(events) if e.type == "step" and e.slot == fault.slot] == \
        [e.step for e in after if e.type == "step"] == list(range(1, sum(e.type == "step" for e in after) + 1))


def test_a_game_that_answers_otherwise_on_resume_is_named_not_scored(grid_path, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(Killed):
        run_cell(grid_path, run, 0, KilledAfter(2))

    class Shifted(FakeGame):  # another board: the logged frames do not come back
        def goal(self):
            return (self.level + 3, 0)
    with pytest.raises(ReplayMismatch, match="not deterministic"):
        run_cell(grid_path, run, 0, Shifted())


def test_an_arc3_grid_names_what_is_wrong(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("name: x\ntrack: {name: arc3, environments_dir: games, epilogue: 3}\n"
                    "learners: [arc3-explorer]\n")
    with pytest.raises(GridFileError, match="track arc3 has no held-out epilogue"):
        load_grid(path)
    path.write_text("name: x\ntrack: {name: arc3, environments_dir: games}\nlearners: [demo-cache-floor]\n")
    with pytest.raises(GridFileError, match="demo-cache-floor plays own, arc1, arc2, not track arc3 "
                                            r"\(which stateless-floor, arc3-explorer, arc3-library, hermes-agent play\)"):
        load_grid(path)
    path.write_text("name: x\ntrack: {name: own}\nlearners: [arc3-library]\n")
    with pytest.raises(GridFileError, match="arc3-library plays arc3, not track own"):
        load_grid(path)


def test_the_report_has_the_arc3_levels_with_the_retention_view(grid_path, tmp_path):
    from orchestrator.analysis.report import write_report
    run = tmp_path / "run"
    for k in range(3):
        run_cell(grid_path, run, k)
    (run / "grid.yaml").write_text(grid_path.read_text())
    text = write_report(run, resamples=200).read_text()
    section = text.split("## ARC-AGI-3 levels", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| arc3")}
    assert set(rows) == {"arc3-explorer.low.sequential.s3", "arc3-library.low.sequential.s3",
                         "arc3-library-wiped.low.sequential.s3"}, section
    header = next(line for line in section.splitlines() if line.startswith("| cell"))
    library = dict(zip([c.strip() for c in header.strip("|").split("|")],
                       rows["arc3-library.low.sequential.s3"]))
    assert library["levels"] == "6" and library["levels met twice"] == "3", library
    # the twin's second meetings replay what won the first: cheaper, on this deterministic game
    assert library["2nd minus 1st (points)"].startswith("-"), library


# ----- the stateless floor: the bare model, through the cell's journaling proxy -----

def test_the_stateless_floor_plays_through_the_embedded_model_and_the_proxy(grid_path, tmp_path):
    from orchestrator.run.model_service import model_service
    from proxy.journal import read_journal
    path = tmp_path / "floor.yaml"
    path.write_text(GRID.format(visits=3).replace(
        "learners: [arc3-explorer, arc3-library, {learner: arc3-library, row: wiped}]",
        "learners: [stateless-floor]"))
    from orchestrator.run.run_folder import open_run, run_grid_path
    run = open_run(path, tmp_path / "runs", "floor")
    grid = load_grid(run_grid_path(run))
    cell = grid.cells()[0]
    folder = run / "cells" / cell.cell
    with model_service(grid, tmp_path / "logs") as urls:
        Arc3CellRunner(grid, cell, folder, env_factory=FakeGame, model_base_url=urls[0]).run()
    events = read_events(folder / "events.jsonl")
    done = [e for e in events if e.type == "instance_end"]
    steps = [e for e in events if e.type == "step"]
    assert len(done) == 3 and all(e.model_calls >= 1 for e in done)
    assert all(s.reply and s.reply.startswith('{"action"') for s in steps)
    assert sum(e.model_calls for e in done) == len(steps)  # one call per action
    calls = [j for j in read_journal(folder / "journal") if j.slot is not None]
    assert len(calls) == len(steps) and {j.slot for j in calls} == {0, 1, 2}
    conversation = CellPaths(folder).read_transcripts()[0]["conversation"]
    assert conversation[0]["role"] == "system" and "ARC-AGI-3" in conversation[0]["content"]


def test_a_cell_stops_at_its_dollar_cap_before_a_level_and_continues_when_raised(grid_path, tmp_path):
    from orchestrator.run.model_service import model_service
    from orchestrator.run.run_folder import open_run, run_grid_path, set_usd_per_cell
    path = tmp_path / "floor.yaml"
    path.write_text(GRID.format(visits=3).replace(
        "learners: [arc3-explorer, arc3-library, {learner: arc3-library, row: wiped}]",
        "learners: [stateless-floor]\nmodel: {endpoint: embedded, name: carc-solver, "
        "input_usd_per_mtok: 1000, output_usd_per_mtok: 1000}\nlimits: {usd_per_cell: 0.0001}"))
    run = open_run(path, tmp_path / "runs", "capped")
    grid = load_grid(run_grid_path(run))
    cell = grid.cells()[0]
    folder = run / "cells" / cell.cell
    with model_service(grid, tmp_path / "logs") as urls:
        runner = Arc3CellRunner(grid, cell, folder, env_factory=FakeGame, model_base_url=urls[0])
        assert runner.run() == "stopped"
        events = read_events(folder / "events.jsonl")
        assert events[-1].type == "stopped" and len(ends(folder)) == 1
        set_usd_per_cell(run, 1000.0)
        grid = load_grid(run_grid_path(run))
        assert Arc3CellRunner(grid, cell, folder, env_factory=FakeGame, model_base_url=urls[0]).run() == "done"
    assert [e.slot for e in ends(folder)] == [0, 1, 2]


def test_a_fenced_retry_waits_for_the_stale_attempt_that_still_holds_the_cells_lock(grid_path, tmp_path,
                                                                                   monkeypatch):
    """Ray's retry of an arc3 cell (a fenced attempt) finds the attempt it replaced still holding
    the cell's lock, until that one's next record is refused: it waits for it, as a grid cell's
    retry does, instead of failing after the local pool's 30 polls (3 s). The stale attempt lets
    go at the 45th poll; the polls are counted, never slept."""
    grid = load_grid(grid_path)
    cell = grid.cells()[0]
    folder = tmp_path / "run" / "cells" / cell.cell
    CellFence.take(folder, "the attempt on the lost node")
    retry = CellFence.take(folder, "Ray's retry")
    stale = open(CellPaths(folder).lock, "w")
    fcntl.flock(stale, fcntl.LOCK_EX)
    polls: list[float] = []

    def poll(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 45:
            stale.close()  # the stale attempt's record was refused: it ends, its lock with it

    monkeypatch.setattr(time, "sleep", poll)
    assert Arc3CellRunner(grid, cell, folder, env_factory=FakeGame, fence=retry).run() == "done"
    assert polls[:45] == [0.1] * 45 and len(ends(folder)) == 6
