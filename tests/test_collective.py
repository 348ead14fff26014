"""The collective regime end to end: many users of one row in rounds, the update step between
rounds, on the real embedded model behind each row's real journaling proxy.

The runs prove from their records: results do not depend on how many workers ran the users
(order independence); nothing a user does inside a round reaches another user before the next
round's shared state; a SIGKILLed run and a killed update step resume exactly.
"""

import hashlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from harness_adapters.demo_cache_floor import DemoCache, DemoCacheFloor
from harness_adapters.program_library import ProgramLibrary
from orchestrator import fault_points
from orchestrator.arc import Demo
from orchestrator.tasks.frames import Frame
from orchestrator.run.collective import rounds as collective_runner
from orchestrator.run.collective.schedule import rounds, user_schedule, user_seed
from orchestrator.run.collective.training import RoundModel, RoundTrainer
from orchestrator.records import RunPaths, read_events
from orchestrator.run.grid_config import GridConfig, load_grid
from orchestrator.run.collective.rounds import execute_collective as execute
from proxy.journal import read_journal

GRID = """\
name: collective-tiny
seed: 5
track: {name: own, tasks: 3, visits: 2, epilogue: 2}
collective: {users: 4, round_slots: 3}
efforts: [low]
learners:
  - stateless-floor
  - {learner: demo-cache-floor, row: collective}
  - program-library
  - {learner: program-library, row: collective}
  - {learner: stateless-floor, row: trained}
sandbox: {engine: process}
workers: 4
"""
USERS, SLOTS = 4, 3 * 2 + 2  # per user: the stream, then the epilogue
ROWS = 5


def make_run(root: Path, name: str) -> Path:
    run_dir = root / "runs" / name
    (run_dir / "cells").mkdir(parents=True)
    (run_dir / "grid.yaml").write_text(textwrap.dedent(GRID))
    return run_dir


def outcomes(run_dir: Path) -> dict[tuple, tuple]:
    """(cell, user, slot) -> what its instance was and how it ended."""
    out = {}
    for cell in RunPaths(run_dir).cell_folders():
        for user in cell.user_folders():
            for e in read_events(user.events):
                if e.type == "instance_end":
                    out[(cell.name, e.user, e.slot)] = (e.round, e.phase, e.task, e.visit, e.status, e.cost,
                                                        e.demos_used, e.attempts_used)
    return out


def shared_digests(run_dir: Path) -> dict[str, str]:
    """Every shared state file's content hash (update.json without its timing)."""
    out = {}
    for cell in RunPaths(run_dir).cell_folders():
        for path in sorted((cell.root / "shared").rglob("*")) if (cell.root / "shared").exists() else []:
            if path.is_file():
                data = path.read_bytes()
                if path.name == collective_runner.UPDATE_FILE:
                    record = json.loads(data)
                    record.pop("seconds")
                    data = json.dumps(record, sort_keys=True).encode()
                out[str(path.relative_to(run_dir))] = hashlib.sha256(data).hexdigest()
    return out


def assert_records_consistent(run_dir: Path) -> None:
    cells = RunPaths(run_dir).cell_folders()
    assert len(cells) == ROWS
    for cell in cells:
        users = cell.user_folders()
        assert [u.number for u in users] == list(range(USERS))
        for user in users:
            events = read_events(user.events)
            ends = Counter(e.slot for e in events if e.type == "instance_end")
            assert sorted(ends) == list(range(SLOTS)), f"{user.root}"
            assert set(ends.values()) == {1}, f"{user.root}: a slot ended twice"
            steps = defaultdict(list)
            for e in events:
                if e.type == "step":
                    steps[e.slot].append(e)
            for end in (e for e in events if e.type == "instance_end"):
                numbers = [s.step for s in steps[end.slot]]
                assert numbers == list(range(1, len(numbers) + 1)), f"{user.root} slot {end.slot}: {numbers}"
                charged = sum(s.outcome in ("demo", "incorrect") for s in steps[end.slot])
                assert end.cost == (charged if end.status == "solved" else 16), f"{user.root} slot {end.slot}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = make_run(tmp_path_factory.mktemp("collective"), "reference")
    execute(run_dir, show_progress=False)
    return run_dir


# --- the grid and the schedule ------------------------------------------------------------------

def _grid(**changes) -> GridConfig:
    data = {"name": "x", "collective": {"users": 6, "round_slots": 4},
            "track": {"name": "own", "tasks": 3, "visits": 2, "epilogue": 2},
            "learners": ["stateless-floor", {"learner": "program-library", "row": "collective"}]}
    data.update(changes)
    return GridConfig.model_validate(data)


def test_a_collective_grid_refuses_what_it_cannot_run_and_says_what_to_do():
    assert _grid().problems() == []
    assert _grid().track.fresh_reference is False
    framed = _grid(track={"name": "arc1", "source": "frames", "tasks": 3, "visits": 2, "epilogue": 0}).problems()
    assert framed == []
    arc3 = _grid(track={"name": "arc3", "tasks": 1, "visits": 1, "epilogue": 0,
                        "environments_dir": "/nonexistent"}).problems()
    assert any(where == ("track", "name") and "arc3's games" in message for where, message in arc3)
    harness = _grid(learners=[{"learner": "hermes-agent", "row": "memory-on"},
                              {"learner": "hermes-agent", "row": "collective"}]).problems()
    assert harness == []
    procedure = _grid(learners=[{"learner": "hermes-agent", "row": "program-procedure"}]).problems()
    assert any("not a collective grid's" in message for _, message in procedure)
    wiped = _grid(learners=[{"learner": "program-library", "row": "wiped"}]).problems()
    assert any("not a collective grid's" in message for _, message in wiped)
    single = GridConfig.model_validate({"name": "x", "learners": [
        {"learner": "demo-cache-floor", "row": "collective"}]}).problems()
    assert single and "is for collective grids" in single[0][1]
    trained = {"learner": "stateless-floor", "row": "trained"}
    assert _grid(learners=["stateless-floor", trained]).problems() == []
    assert "is for collective grids" in GridConfig.model_validate(
        {"name": "x", "learners": [trained]}).problems()[0][1]
    remote = _grid(learners=[trained], model={"endpoint": "https://api.example.com/v1", "name": "m"}).problems()
    assert any(where == ("collective", "trainer") and "trains the embedded model" in message
               for where, message in remote)
    unknown = _grid(learners=[trained], collective={"users": 2, "trainer": "no-such"}).problems()
    assert any("no-such" in message and "primitive-prior" in message for _, message in unknown)
    custom = _grid(learners=[trained], collective={
        "users": 2, "trainer": "orchestrator.run.collective.training:PrimitivePriorTrainer"}).problems()
    assert custom == []
    not_one = _grid(learners=[trained], collective={"users": 2, "trainer": "json:dumps"}).problems()
    assert any("not a RoundTrainer" in message for _, message in not_one)


def test_users_share_the_tasks_not_the_streams_or_grids_and_the_epilogue_comes_in_two_halves():
    grid = _grid()
    cell = grid.cells()[1]
    schedules = [user_schedule(grid, cell, u) for u in range(6)]
    assert len({user_seed(grid.seed, u) for u in range(6)}) == 6
    tasks = [sorted({s.slot.task_id for s in sched if s.slot.phase == "stream"}) for sched in schedules]
    assert all(t == tasks[0] for t in tasks) and len(tasks[0]) == 3
    orders = {tuple(s.slot.task_id for s in sched) for sched in schedules}
    assert len(orders) > 1
    first = {(s.slot.task_id, s.slot.visit): s.slot.instance().test_input for s in schedules[0]}
    second = {(s.slot.task_id, s.slot.visit): s.slot.instance().test_input for s in schedules[1]}
    assert any(first[k] != second[k] for k in first)  # users meet different grids of a task
    plan = rounds(grid)
    assert (plan.stream, plan.total) == (2, 4)
    for u, sched in enumerate(schedules):
        assert [s.round for s in sched if s.slot.phase == "stream"] == [i // 4 for i in range(6)]
        assert {s.round for s in sched if s.slot.phase == "epilogue"} == {2 if u < 3 else 3}



@pytest.mark.parametrize("track", [{"name": "arc1", "source": "frames"}, {"name": "arc2"}])
def test_on_a_frames_track_no_two_users_get_the_same_frame_of_a_task(track):
    """Every (user, task, visit) of the stream comes in a frame of its own, drawn from one sequence
    of distinct frames per task; the held-out epilogue (public pairs) in a recolouring of each
    user's own. Users still share the tasks, and a frame keeps the task's test pair."""
    from orchestrator.tasks.frames import UserFrames

    grid = _grid(track={**track, "tasks": 3, "visits": 3, "epilogue": 2})
    cell = grid.cells()[1]
    schedules = [user_schedule(grid, cell, u) for u in range(6)]
    frames: dict[str, list] = defaultdict(list)
    held_out: dict[str, list] = defaultdict(list)
    for sched in schedules:
        for s in sched:
            source = s.slot.source
            assert isinstance(source, UserFrames)
            (frames if s.slot.phase == "stream" else held_out)[s.slot.task_id].append(
                source.frame(s.slot.task_id, s.slot.visit))
    assert len(frames) == 3 and all(len(f) == 6 * 3 == len(set(f)) for f in frames.values())
    assert len(held_out) == 2 and all(len(f) == 6 == len(set(f)) for f in held_out.values())
    assert all(f.symmetry == "identity" for fs in held_out.values() for f in fs)  # recoloured only
    slot = schedules[4][0].slot  # an instance is its task's test pair under the user's frame
    frame, instance = slot.source.frame(slot.task_id, slot.visit), slot.instance()
    assert instance.test_input == frame.apply(slot.source.source.framed_instance(
        slot.task_id, slot.visit, slot.seed, Frame()).test_input)
    with pytest.raises(ValueError, match="has 3"):
        slot.source.frame(slot.task_id, 3)


@pytest.mark.slow
def test_a_collective_grid_on_arc1_frames_runs_every_users_instances_and_reports_them(tmp_path):
    from orchestrator.analysis.collective_report import write_collective_report

    run_dir = tmp_path / "runs" / "frames"
    (run_dir / "cells").mkdir(parents=True)
    (run_dir / "grid.yaml").write_text(textwrap.dedent("""\
        name: collective-frames
        seed: 1
        track: {name: arc1, source: frames, tasks: 2, visits: 2, epilogue: 2}
        collective: {users: 4, round_slots: 2}
        efforts: [low]
        learners: [stateless-floor, {learner: demo-cache-floor, row: collective}]
        sandbox: {engine: process}
        workers: 2
        """))
    execute(run_dir, show_progress=False)
    ends = outcomes(run_dir)
    assert len(ends) == 2 * 4 * (2 * 2 + 2)
    assert {phase for _, phase, *_ in ends.values()} == {"stream", "epilogue"}
    report = write_collective_report(run_dir).read_text()
    assert "## Collective regime: New tasks: the epilogue halves" in report


def test_the_user_pool_serves_the_row_with_the_fewest_users_running_not_the_first_come():
    """Two threads; row a queues four users before row b queues two. First come, first served
    would start a1-a4 before b1; the pool starts b1 as soon as a thread frees."""
    import queue
    import threading

    started: queue.Queue = queue.Queue()
    gates = {name: threading.Event() for name in ("a1", "a2", "a3", "a4", "b1", "b2")}

    def user(name: str) -> str:
        started.put(name)
        assert gates[name].wait(10)
        return name

    def next_started() -> str:
        return started.get(timeout=10)

    order = []
    with collective_runner.RowPool(2) as pool:
        futures = [pool.submit("a", user, f"a{n}") for n in range(1, 5)]
        order += sorted([next_started(), next_started()])
        futures += [pool.submit("b", user, f"b{n}") for n in range(1, 3)]
        for name in ("a1", "a2", "b1", "a3"):
            gates[name].set()
            order.append(next_started())
        gates["b2"].set()
        gates["a4"].set()
        assert [f.result(10) for f in futures] == ["a1", "a2", "a3", "a4", "b1", "b2"]
        failing = pool.submit("c", lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(10)
    assert order == ["a1", "a2", "b1", "a3", "b2", "a4"]


def test_the_update_step_pools_pairs_and_keeps_the_program_most_users_keep(tmp_path):
    def pair(n: int) -> Demo:
        return Demo(((n,),), ((n + 1,),))

    users = []
    for k, (pairs, program) in enumerate([([1, 2], "A"), ([2, 3], "B"), ([3], "B"), ([], None)]):
        folder = tmp_path / f"u{k}"
        DemoCache(folder).add("t", [pair(n) for n in pairs])
        if program:
            (folder / "programs").mkdir(parents=True)
            (folder / "programs" / "t.py").write_text(program)
        folder.mkdir(exist_ok=True)
        users.append(folder)
    previous = tmp_path / "previous"
    DemoCache(previous).add("t", [pair(7)])
    (previous / "programs").mkdir()
    (previous / "programs" / "t.py").write_text("A")
    (previous / "programs" / "old.py").write_text("C")
    out = tmp_path / "out"
    out.mkdir()
    counts = ProgramLibrary.merge_shared(previous, users, out)
    assert DemoCache(out).get("t") == [pair(7), pair(1), pair(2), pair(3)]
    assert (out / "programs" / "t.py").read_text() == "B"  # 2 votes against 1
    assert (out / "programs" / "old.py").read_text() == "C"  # no user keeps one: the previous stays
    assert counts == {"tasks": 1, "pairs": 4, "programs": 2}
    # the same inputs in another order of arrival give the same pool order only by user number
    again = tmp_path / "again"
    again.mkdir()
    DemoCacheFloor.merge_shared(previous, users, again)
    assert DemoCache(again).get("t") == DemoCache(out).get("t")


# --- whole runs ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_planned_from_itself_every_row_is_billed_its_users_instances_and_journal_lines(reference):
    """`carc grid plan --pilot` on a collective run: a row's instances are every user's, its calls
    the lines of the row's proxy (shared by its users), read from the users' own events."""
    from orchestrator.run.plan import plan_grid

    plan = plan_grid(load_grid(reference / "grid.yaml"), pilot_dir=reference, images=False)
    for cell in plan.cells:
        folder = RunPaths(reference).cell(cell.cell)
        ends = sum(1 for user in folder.user_folders() for e in read_events(user.events) if e.type == "instance_end")
        assert (cell.source, cell.instances, cell.curated_tasks) == ("pilot", ends, 0), cell.cell
        assert cell.calls == sum(1 for e in read_journal(folder.journal) if not e.refused), cell.cell


@pytest.mark.slow
def test_a_run_records_every_users_instances_once_and_tags_every_call_with_its_user(reference):
    assert_records_consistent(reference)
    grid = load_grid(reference / "grid.yaml")
    for cell in RunPaths(reference).cell_folders():
        entries = read_journal(cell.journal)
        assert entries and all(e.user is not None and e.slot is not None for e in entries), cell.name
        counted = Counter()  # the calls each instance's learner counted, by (user, slot)
        for user in cell.user_folders():
            for e in read_events(user.events):
                if e.type == "step":
                    counted[(e.user, e.slot)] += e.model_calls or 0
        calls = Counter((e.user, e.slot) for e in entries if not e.refused)
        assert calls == +counted, cell.name  # every call journaled under its own user and slot
        assert all(e.request is None and "x-carc-tag" not in json.dumps(e.request_body()) for e in entries)
        if "collective" in cell.name or "trained" in cell.name:
            written = sorted(p.name for p in (cell.root / "shared").iterdir())
            assert written == [f"round-{r:03d}" for r in range(rounds(grid).total)]
    from orchestrator.run.status import run_status
    status = run_status(reference)
    assert (status.finished, status.total) == (ROWS * USERS * SLOTS,) * 2
    assert {c.state for c in status.cells} == {"done"}


@pytest.mark.slow
def test_nothing_crosses_between_users_inside_a_round(reference):
    """A user's own state holds only pairs of its own instances; the shared state of round r
    holds only pairs of instances of rounds before r (so no user saw in round r what another
    bought in it)."""
    grid = load_grid(reference / "grid.yaml")
    cells = {c.cell: c for c in grid.cells()}
    for cell in RunPaths(reference).cell_folders():
        if not cell.name.startswith("demo-cache-floor-collective"):
            continue
        demos_of: dict[Demo, set[tuple[int, int]]] = defaultdict(set)  # pair -> {(user, round)}
        for u in range(USERS):
            for s in user_schedule(grid, cells[cell.name], u):
                for demo in s.slot.instance().demos:
                    demos_of[demo].add((u, s.round))
        for user in cell.user_folders():
            own = DemoCache(user.state)
            for path in own.folder.glob("*.json"):
                for demo in own.get(path.stem):
                    assert any(u == user.number for u, _ in demos_of[demo]), f"{user.root}: {path.stem}"
        checked = 0
        for number in range(rounds(grid).total):
            shared = DemoCache(cell.shared_round(number))
            for path in shared.folder.glob("*.json") if shared.folder.is_dir() else []:
                for demo in shared.get(path.stem):
                    assert any(r < number for _, r in demos_of[demo]), f"round {number}: {path.stem}"
                    checked += 1
        assert checked > 0


@pytest.mark.slow
def test_the_report_has_the_collective_section_and_results_hold_every_instance(reference):
    import pandas as pd
    from orchestrator.analysis.collective_report import write_collective_report

    report = write_collective_report(reference, resamples=500).read_text()
    for title in ("Rows", "Budget by round", "Budget by collective exposure", "Paired on (user, slot)",
                  "New tasks: the epilogue halves", "Update steps"):
        assert f"## Collective regime: {title}" in report
    instances = pd.read_parquet(reference / "results" / "instances.parquet")
    assert len(instances) == ROWS * USERS * SLOTS
    assert sorted(instances["user"].unique()) == list(range(USERS))
    assert (RunPaths(reference).report_html).stat().st_size > 0


@pytest.mark.slow
def test_the_trained_row_meets_its_twin_until_its_first_update_then_calls_the_trained_model(reference):
    """Round 0 of the trained row is its memory-on twin's, instance for instance; each update
    counts a verified program for every instance of the round it can explain; later rounds call
    a model server started with that round's prior."""
    from solver_model.prior import PrimitivePrior

    grid = load_grid(reference / "grid.yaml")
    got = outcomes(reference)
    cells = {c.row: c.cell for c in grid.cells() if c.learner == "stateless-floor"}
    floor, trained = cells["memory-on"], cells["trained"]
    first = {(u, s): v for (c, u, s), v in got.items() if c == trained and v[0] == 0}
    assert first and first == {(u, s): v for (c, u, s), v in got.items() if c == floor and v[0] == 0}
    paths = RunPaths(reference).cell(trained)
    total = 0
    for number in range(1, rounds(grid).total):
        update = json.loads((paths.shared_round(number) / collective_runner.UPDATE_FILE).read_text())
        solved = sum(1 for (c, u, s), v in got.items() if c == trained and v[0] == number - 1 and v[4] == "solved")
        assert update["instances_solved"] == solved
        assert update["programs"] + update["unexplained"] == solved
        total += update["programs"]
        prior = PrimitivePrior.load(paths.shared_round(number) / "prior.json")
        assert prior.programs == update["trained_on"] == total
        assert sum(prior.counts.values()) >= prior.programs
        logs = list((reference / "logs").glob(f"model-server-{trained}-round{number}-*.log"))
        assert logs, f"round {number}: no model server was started with its prior"
    assert total > 0
    assert not (paths.shared_round(0) / "model.json").exists()  # round 0: the grid's own model


class EndpointTrainer(RoundTrainer):
    """A trainer of a model served elsewhere, as one that fine-tunes at a provider would be:
    each update names the endpoint and the model of the next round (`ENDPOINT`, set by the test)."""

    ENDPOINT = ""

    def between_rounds(self, records, previous, out) -> dict[str, int]:
        seen = sum(1 for _ in records.instances())
        before = RoundModel.read(previous)
        total = (before.trained_on if before else 0) + seen
        RoundModel(endpoint=self.ENDPOINT, name=f"carc-solver-tuned-{records.number + 1}",
                   trained_on=total).write(out)
        return {"instances": seen}


@pytest.mark.slow
def test_a_trained_model_served_elsewhere_is_called_by_name_through_the_rows_proxy(tmp_path):
    """A trainer may name a model at another endpoint (a model it fine-tuned): from the first
    update on, every call of the row's users goes through the row's journaling proxy to that
    endpoint, under that round's name; round 0 calls the grid's model."""
    from tests.solver_endpoint import SolverEndpoint, serve

    url, server = serve()
    EndpointTrainer.ENDPOINT = url
    SolverEndpoint.arm(None)
    try:
        run_dir = tmp_path / "runs" / "tuned"
        (run_dir / "cells").mkdir(parents=True)
        (run_dir / "grid.yaml").write_text(textwrap.dedent("""\
            name: tuned
            seed: 5
            track: {name: own, tasks: 2, visits: 2, epilogue: 0}
            collective: {users: 2, round_slots: 2, trainer: "tests.test_collective:EndpointTrainer"}
            efforts: [low]
            learners: [{learner: stateless-floor, row: trained}]
            sandbox: {engine: process}
            workers: 2
            """))
        assert execute(run_dir, show_progress=False) == []
    finally:
        server.shutdown()
    cell = RunPaths(run_dir).cell_folders()[0]
    rounds_of = {(e.user, e.slot): e.round for u in cell.user_folders() for e in read_events(u.events)
                 if e.type == "instance_end"}
    assert sorted(set(rounds_of.values())) == [0, 1]
    entries = [e for e in read_journal(cell.journal) if not e.refused]
    names = {(e.user, e.slot): e.request_body()["model"] for e in entries}
    assert {names[key] for key, number in rounds_of.items() if number == 0} == {"carc-solver"}
    assert {names[key] for key, number in rounds_of.items() if number == 1} == {"carc-solver-tuned-1"}
    later = sum(1 for e in entries if rounds_of[(e.user, e.slot)] == 1)
    assert later and SolverEndpoint.calls == later  # every call of round 1 reached the endpoint
    model = RoundModel.read(cell.root / "shared" / "round-001")
    assert model.endpoint == url and model.trained_on == 4


def test_a_round_model_is_one_model_and_says_which_field_is_wrong():
    with pytest.raises(ValueError, match="exactly one of prior"):
        RoundModel(trained_on=1)
    with pytest.raises(ValueError, match="exactly one of prior"):
        RoundModel(prior="prior.json", endpoint="https://api.example.com/v1")
    with pytest.raises(ValueError, match="not an http"):
        RoundModel(endpoint="file:///etc/passwd")
    with pytest.raises(ValueError, match="give endpoint too"):
        RoundModel(prior="prior.json", name="m")


def _run_cli(run_dir: Path, workers: int | None = None, fault: str | None = None) -> subprocess.Popen:
    """The CLI on `run_dir`, its output appended to `cli.log` beside the run folder (read by
    `_cli_log` when an exit code is not the one expected); `fault`: the point where it faults
    itself (orchestrator/fault_points.py)."""
    log = (run_dir.parent / "cli.log").open("ab")
    log.write(f"--- carc grid run --resume (workers={workers}, fault={fault})\n".encode())
    log.flush()
    env = {k: v for k, v in os.environ.items() if k != fault_points.FAULT_ENV}
    if fault:
        env[fault_points.FAULT_ENV] = fault
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume",
                             str(run_dir), "--no-report",
                             *(["--workers", str(workers)] if workers else [])],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _cli_log(run_dir: Path) -> str:
    return (run_dir.parent / "cli.log").read_text(errors="replace")[-6000:]


@pytest.mark.slow
def test_ctrl_c_then_sigkill_mid_round_then_resume_loses_double_charges_and_wrongly_charges_nothing(
        reference, tmp_path):
    """First SIGINT to the run's whole process group (Ctrl-C in a terminal): the users end the
    instances they are in on a model that is still up, and the run stops, no instance failed as
    model-unavailable. Then SIGKILL mid-round, twice. The run resumed on two workers equals the
    uninterrupted one on four: nothing lost, nothing charged twice, and the worker count changes
    no result. (One run for the three: each is a whole grid's time. Two workers, not one: the
    rest of the grid is CPU, and one worker leaves one of the machine's two cores idle.)"""
    run_dir = make_run(tmp_path, "interrupted")
    # Ctrl-C from the run itself once it has recorded 120 steps: never racing its end
    assert _run_cli(run_dir, fault="sigint-group after 120 step").wait(timeout=300) == 130, _cli_log(run_dir)
    stopped = outcomes(run_dir)
    assert 0 < len(stopped) < len(outcomes(reference))
    assert {key: stopped[key] for key in stopped} == {key: outcomes(reference)[key] for key in stopped}
    for _ in range(2):  # SIGKILL of the whole run, 50 steps into each resume
        assert _run_cli(run_dir, fault="sigkill-group after 50 step").wait(timeout=300) == -signal.SIGKILL, \
            _cli_log(run_dir)
    assert _run_cli(run_dir, workers=2).wait(timeout=600) == 0, _cli_log(run_dir)
    assert_records_consistent(run_dir)
    assert outcomes(run_dir) == outcomes(reference)
    assert shared_digests(run_dir) == shared_digests(reference)


def _update_then_hang(run_dir: str, cell_id: str, number: int, where: str) -> None:
    """In a child: the update step, made to stop for good at `where` (to be SIGKILLed there)."""
    grid = load_grid(Path(run_dir) / "grid.yaml")
    cell = next(c for c in grid.cells() if c.cell == cell_id)
    if where == "before-rename":  # the folder is whole, update.json included; its rename hangs
        real = os.replace

        def replace(source, target):
            if Path(source).is_dir():
                time.sleep(3600)
            real(source, target)
        collective_runner.os.replace = replace
    else:  # halfway through the merge: after the pool of pairs, before the programs
        original = DemoCacheFloor.merge_shared.__func__

        def hang(cls, previous, kept, out):
            original(cls, previous, kept, out)
            time.sleep(3600)
        DemoCacheFloor.merge_shared = classmethod(hang)
    collective_runner.update_shared(grid, cell, RunPaths(run_dir).cell(cell_id), number)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["mid-merge", "before-rename"])
def test_an_update_step_killed_midway_is_done_again_whole(reference, tmp_path, where):
    """Two copies of the finished run lose the shared state of their last round. In one the
    update step runs through; in the other it is killed (SIGKILL) inside the merge or just
    before the rename, then run again: both write the same shared state, and no half-written
    folder is left or read."""
    import shutil
    grid = load_grid(reference / "grid.yaml")
    cell = next(c for c in grid.cells() if c.learner == "program-library" and c.row == "collective")
    last = rounds(grid).total - 1
    copies = {}
    for name in ("whole", "killed"):
        copies[name] = tmp_path / name
        shutil.copytree(reference, copies[name])
        shutil.rmtree(RunPaths(copies[name]).cell(cell.cell).shared_round(last))
    collective_runner.update_shared(grid, cell, RunPaths(copies["whole"]).cell(cell.cell), last)

    paths = RunPaths(copies["killed"]).cell(cell.cell)
    child = multiprocessing.get_context("fork").Process(
        target=_update_then_hang, args=(str(copies["killed"]), cell.cell, last, where))
    child.start()
    tmp = paths.shared_round(last).with_name(paths.shared_round(last).name + ".tmp")
    marker = tmp / (collective_runner.UPDATE_FILE if where == "before-rename" else "demos")
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert tmp.exists() and not paths.shared_round(last).exists(), "the kill did not land mid-update"
    collective_runner.update_shared(grid, cell, paths, last)
    assert not tmp.exists()

    def mine(run: Path) -> dict:
        return {k.split("/", 1)[1]: v for k, v in shared_digests(run).items() if cell.cell in k}
    assert mine(copies["killed"]) == mine(copies["whole"])
    assert len(mine(copies["whole"])) > 2


def test_the_collective_executor_on_a_grid_without_users_says_so_under_python_O(tmp_path):
    """Code that only a collective grid reaches asks for `grid.collective_settings`: a grid
    without a `collective:` section is a ConfigError naming it, also under `python -O` (it was an
    `assert`: gone there, and an AttributeError on None further on)."""
    run_dir = tmp_path / "runs" / "single"
    (run_dir / "cells").mkdir(parents=True)
    (run_dir / "grid.yaml").write_text("name: single\ntrack: {name: own, tasks: 1, visits: 1}\n"
                                       "learners: [stateless-floor]\nsandbox: {engine: process}\n")
    script = ("import sys\nfrom orchestrator.errors import ConfigError\n"
              "from orchestrator.run.collective.rounds import execute_collective\n"
              "try:\n    execute_collective(sys.argv[1], show_progress=False)\n"
              "except ConfigError as exc:\n    print(exc)\n    sys.exit(3)\n")
    ran = subprocess.run([sys.executable, "-O", "-c", script, str(run_dir)], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, timeout=120)
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert "'single' is not a collective grid" in ran.stdout
