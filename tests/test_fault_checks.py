"""Nothing is charged to a learner while its infrastructure is broken (issue 34, section 2).

A harness whose proxy died does not always fail its turn: hermes-agent answers "API call failed
after 3 retries: Connection error." as its reply. The runner asks the cell's services for a fault
after such a reply, before a wrong answer is adopted and at every instance end that charges; a
fault ends the attempt uncharged, and the instance runs again from its start, its earlier steps
superseded in the records (`records.standing`) and never replayed.

Fast tier: the real CellRunner and run folder, on a hermes-agent cell whose services are a fake
(a learner that plays a fixed script from the counts it is shown, and a proxy that dies on cue);
no Docker, no model.
"""

from __future__ import annotations

import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness_adapters.base import Learner, Turn
from harness_adapters.harness import FailureKind, HarnessError
from harness_adapters.program_check import local_executor
from orchestrator.records import CellPaths, read_events, standing
from orchestrator.run import cell_runner as runner_module
from orchestrator.run import slot_driver
from orchestrator.run.cell_services import CellServices, HostStateDir
from orchestrator.run.grid_config import load_grid
from orchestrator.run.cell_runner import CellRunner
from orchestrator.run.slot_driver import InfrastructureFault
from orchestrator.run.schedule import build_schedule

GRID = """\
name: fake-proxy
seed: 2
track: {name: own, tasks: 3, visits: 1, epilogue: 0, fresh_reference: false}
orders: [sequential]
efforts: [low]
learners: [hermes-agent]
model: {endpoint: "http://127.0.0.1:9/v1", name: fake}
limits: {max_malformed: 2}
workers: 1
"""
LOST = "API call failed after 3 retries: Connection error."  # hermes' reply with its proxy gone


class Proxy:
    """The cell's proxy container: it dies at the learner's `dies_at`-th turn of the whole cell
    (counted from 1) and stays dead until the cell's services are started again."""

    def __init__(self, dies_at: int | None = None):
        self.dies_at = dies_at
        self.turns = 0
        self.dead = False
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.dead = False

    def turn(self) -> None:
        self.turns += 1
        if self.turns == self.dies_at:
            self.dead = True

    def fault(self) -> str | None:
        return "the proxy container carc-fake-proxy is exited (exit code 137, OOM killed: False)" \
            if self.dead else None


class ScriptedHarness(Learner):
    """A harness that buys one demonstration, answers wrong once, then right; with its proxy
    dead it says so as its reply (`says`) or fails its turn (`raises`)."""

    name = "hermes-agent"

    def __init__(self, state_dir: Path, proxy: Proxy, answers: dict[str, tuple], when_dead: str):
        super().__init__(state_dir, None)
        self.proxy, self.answers, self.when_dead = proxy, answers, when_dead

    def begin(self, view) -> None:
        self.task, self.demos, self.wrong = view.task_id, view.demos_used, view.attempts_used

    def act(self) -> Turn:
        self.proxy.turn()
        if self.proxy.dead:
            if self.when_dead == "raises":
                raise HarnessError(FailureKind.CRASH, f"hermes failed: {LOST}")
            return Turn(text=LOST)
        if self.demos == 0:
            return Turn(text='{"action": "request_demos"}')
        grid = [[9]] if self.wrong == 0 else [list(row) for row in self.answers[self.task]]
        return Turn(text='{"action": "submit", "grid": %s}' % grid)

    def observe(self, outcome, attempts_used, demos_used) -> None:
        self.demos, self.wrong = demos_used, attempts_used


def setup(tmp_path: Path, monkeypatch, proxy: Proxy, when_dead: str = "says"):
    """The cell, its folder, and its services faked: a fresh Proxy start per services start."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "grid.yaml").write_text(textwrap.dedent(GRID))
    grid = load_grid(tmp_path / "grid.yaml")
    [cell] = grid.cells()
    answers = {s.task_id: s.instance().test_output for s in build_schedule(grid, cell)}
    cell_dir = tmp_path / "runs" / "fake-proxy" / "cells" / cell.cell

    @contextmanager
    def services(grid, cell, cell_dir, upstream, wipes=None):
        proxy.start()
        learner = ScriptedHarness(CellPaths(cell_dir).state, proxy, answers, when_dead)
        yield CellServices("http://proxy.invalid/v1", HostStateDir(CellPaths(cell_dir).state), local_executor,
                           harness=learner, infrastructure=[proxy.fault])

    monkeypatch.setattr(runner_module, "cell_services", services)
    return grid, cell, cell_dir


def ends(cell_dir: Path) -> list[tuple]:
    return [(e.slot, e.status, e.cost, e.demos_used, e.attempts_used, e.malformed, e.failure_kind)
            for e in read_events(CellPaths(cell_dir).events) if e.type == "instance_end"]


def learner_steps(cell_dir: Path) -> list[tuple]:
    """The steps that count as the learner's (what every reader of the records reads)."""
    return [(e.slot, e.step, e.outcome, e.cost) for e in standing(read_events(CellPaths(cell_dir).events))
            if e.type == "step"]


@pytest.fixture
def clean(tmp_path, monkeypatch):
    grid, cell, cell_dir = setup(tmp_path / "clean", monkeypatch, Proxy())
    CellRunner(grid, cell, cell_dir, "http://127.0.0.1:9/v1").run()
    assert [e[1] for e in ends(cell_dir)] == ["solved"] * 3  # the script: a demo, a wrong answer, the answer
    return ends(cell_dir), learner_steps(cell_dir)


def test_a_harness_replying_connection_errors_over_a_dead_proxy_is_not_charged_and_the_instance_reruns(
        tmp_path, monkeypatch, clean):
    """The proxy dies at the 5th turn (slot 1's second): hermes' "API call failed after 3
    retries" reply is a malformed step, and with max_malformed 2 the instance used to end failed
    at 16. Now the first such reply finds the dead proxy: an infrastructure_fault, no charged
    instance_end, and the instance runs again on fresh services, ending as in a clean run."""
    proxy = Proxy(dies_at=5)
    grid, cell, cell_dir = setup(tmp_path / "faulted", monkeypatch, proxy)
    CellRunner(grid, cell, cell_dir, "http://127.0.0.1:9/v1").run()
    events = read_events(CellPaths(cell_dir).events)
    [fault] = [e for e in events if e.type == "infrastructure_fault"]
    assert fault.slot == 1 and "exited (exit code 137" in fault.error and LOST in fault.error
    assert proxy.starts == 2  # the services were started again for the rerun
    assert ends(cell_dir) == clean[0]  # nothing charged for the fault, nothing lost or doubled
    assert not [e for e in events if e.type == "instance_end" and e.cost == 16]
    assert not [e for e in events if e.type == "step" and e.outcome == "malformed"]
    assert learner_steps(cell_dir) == clean[1]
    # append-only: the superseded attempt's step stays in the log, before the fault, and the
    # rerun begins with an instance_start of its own, never a replay
    before = events[:events.index(fault)]
    assert [e.step for e in before if e.type == "step" and e.slot == 1] == [1]
    after = [e.type for e in events[events.index(fault) + 1:] if e.slot == 1]
    assert after[0] == "instance_start" and "resumed" not in after


def test_a_fault_found_at_the_malformed_cap_is_not_charged(tmp_path, monkeypatch, clean):
    """A reply no pattern knows (a harness that words its failure otherwise): the instance end
    that would charge (the malformed cap) asks the services first."""
    proxy = Proxy(dies_at=5)
    grid, cell, cell_dir = setup(tmp_path / "faulted", monkeypatch, proxy)
    monkeypatch.setattr(ScriptedHarness, "act", _wordless_when_dead(ScriptedHarness.act))
    CellRunner(grid, cell, cell_dir, "http://127.0.0.1:9/v1").run()
    events = read_events(CellPaths(cell_dir).events)
    [fault] = [e for e in events if e.type == "infrastructure_fault"]
    assert fault.slot == 1 and fault.step == 2  # two malformed replies: the second reached the cap
    assert ends(cell_dir) == clean[0] and learner_steps(cell_dir) == clean[1]


def _wordless_when_dead(act):
    def wordless(self) -> Turn:
        turn = act(self)
        return Turn(text="sorry, something went wrong") if turn.text == LOST else turn
    return wordless


def test_a_wrong_answer_over_a_dead_proxy_is_not_adopted(tmp_path, monkeypatch, clean):
    """The proxy found dead when a wrong answer comes in (slot 1's second turn): the verdict is
    not adopted, nothing is charged, the instance reruns."""
    proxy = Proxy()
    grid, cell, cell_dir = setup(tmp_path / "faulted", monkeypatch, proxy)
    original = ScriptedHarness.act

    def dies_after_answering(self) -> Turn:
        turn = original(self)
        if self.proxy.turns == 5 and self.proxy.starts == 1:
            self.proxy.dead = True  # the answer came back, then the container died
        return turn
    monkeypatch.setattr(ScriptedHarness, "act", dies_after_answering)
    CellRunner(grid, cell, cell_dir, "http://127.0.0.1:9/v1").run()
    events = read_events(CellPaths(cell_dir).events)
    [fault] = [e for e in events if e.type == "infrastructure_fault"]
    assert fault.slot == 1 and fault.step == 1 and "incorrect" in fault.error
    assert ends(cell_dir) == clean[0] and learner_steps(cell_dir) == clean[1]


def test_resume_after_a_fault_starts_the_instance_afresh_and_never_replays_its_earlier_steps(
        tmp_path, monkeypatch, clean):
    """The services cannot be restarted (no restarts left): the run stops at the fault. Resumed,
    the faulted instance starts from its start (instance_start, step 1), the steps before the
    fault are not replayed to the learner nor counted, and the run ends as a clean one."""
    monkeypatch.setattr(slot_driver, "INFRASTRUCTURE_RESTARTS", 0)
    proxy = Proxy(dies_at=5)
    grid, cell, cell_dir = setup(tmp_path / "faulted", monkeypatch, proxy, when_dead="raises")
    with pytest.raises(InfrastructureFault, match="stopped after 0 restarts"):
        CellRunner(grid, cell, cell_dir, "http://127.0.0.1:9/v1").run()
    seen: list = []
    original = ScriptedHarness.begin

    def begin(self, view) -> None:
        seen.append((view.task_id, len(view.history)))
        original(self, view)
    monkeypatch.setattr(ScriptedHarness, "begin", begin)
    CellRunner(grid, cell, cell_dir, "http://127.0.0.1:9/v1").run()  # resume
    events = read_events(CellPaths(cell_dir).events)
    assert [e.type for e in events].count("infrastructure_fault") == 1
    assert not [e for e in events if e.type == "resumed"]
    assert all(history == 0 for _, history in seen)  # nothing replayed as the learner's
    assert ends(cell_dir) == clean[0] and learner_steps(cell_dir) == clean[1]
    assert not [e for e in standing(events) if e.type == "learner_error"]


@pytest.mark.parametrize("harness, text", [
    ("hermes-agent", LOST),
    ("openclaw", "⚠️ Agent failed before reply: LLM request failed: network connection error."),
    ("prime-agent", "Connection error."),
])
def test_each_harness_declares_how_it_tells_of_a_lost_connection(harness, text):
    from harness_adapters import registry

    adapter = registry.adapter(harness)
    assert adapter.reports_lost_connection(text)
    assert not adapter.reports_lost_connection('{"action": "submit", "grid": [[1, 2], [3, 4]]}')


def test_every_reader_of_the_records_leaves_a_superseded_attempt_out(tmp_path, monkeypatch, clean):
    """The malformed replies of an attempt an infrastructure fault superseded are not the
    learner's: the conformance check counts none, the inspector dates the instance from its
    rerun, the collective trainer's and the planner's readers go through the same `standing`."""
    from orchestrator.run.conformance import ConformanceCell, check_instances
    from stores_inspector.cell import _instances
    from stores_inspector.reading import Problems

    grid, cell, cell_dir = setup(tmp_path / "faulted", monkeypatch, Proxy(dies_at=5))
    monkeypatch.setattr(ScriptedHarness, "act", _wordless_when_dead(ScriptedHarness.act))
    CellRunner(grid, cell, cell_dir, "http://127.0.0.1:9/v1").run()
    events = read_events(CellPaths(cell_dir).events)
    [fault] = [e for e in events if e.type == "infrastructure_fault"]
    assert sum(e.type == "step" and e.outcome == "malformed" for e in events) == 1  # kept, superseded
    check = check_instances({"cell": ConformanceCell.load(cell_dir)}, 3)
    assert check.ok and "0 malformed replies" in check.reason, check.reason
    instance = _instances(cell_dir, Problems("cell"))[fault.slot]
    assert instance.start_t > fault.t and instance.first_action_t > fault.t
    assert (instance.status, instance.cost) == ("solved", 2)


ARC3_GRID = """\
name: arc3-fake-proxy
seed: 3
track: {name: arc3, environments_dir: games, visits: 3}
orders: [sequential]
efforts: [low]
learners: [hermes-agent]
model: {endpoint: "http://127.0.0.1:9/v1", name: fake}
limits: {max_malformed: 2}
"""


def run_arc3_harness(tmp_path: Path, monkeypatch, proxy: Proxy) -> Path:
    """A hermes-agent cell on arc3 (tests/arc3_fake.py's game) whose harness always moves right
    (the fake game's solution), and says it lost its connection while its proxy is dead."""
    import json

    from harness_adapters.harness import ConversationHarness
    from orchestrator.rows import row
    from orchestrator.run import arc3_runner
    from orchestrator.run.arc3_runner import Arc3CellRunner
    from tests.arc3_fake import FakeGame

    class RightMover(ConversationHarness):
        name = "hermes-agent"

        def __init__(self):  # no sandbox, no prompts: the conversation is all it has
            self.row, self.turns, self.deadline = row("memory-on"), [], None
            self.open = self.broken = False
            self.session = self.task_id = self.pending = ""

        def open_conversation(self, session: str) -> None:
            pass

        def send(self, message: str) -> Turn:
            proxy.turn()
            return Turn(text=LOST if proxy.dead else '{"action": "ACTION4"}')

    games = tmp_path / "games" / "fake" / "0001"
    games.mkdir(parents=True)
    (games / "metadata.json").write_text(json.dumps({"game_id": "fake-0001", "title": "Fake",
                                                     "baseline_actions": [2, 3, 4]}))
    (tmp_path / "grid.yaml").write_text(ARC3_GRID)
    grid = load_grid(tmp_path / "grid.yaml")
    [cell] = grid.cells()
    cell_dir = tmp_path / "run" / "cells" / cell.cell

    @contextmanager
    def services(grid, cell, cell_dir, upstream):
        proxy.start()
        yield CellServices("http://proxy.invalid/v1", HostStateDir(CellPaths(cell_dir).state), local_executor,
                           harness=RightMover(), infrastructure=[proxy.fault])

    monkeypatch.setattr(arc3_runner, "cell_services", services)
    Arc3CellRunner(grid, cell, cell_dir, env_factory=FakeGame, model_base_url="http://127.0.0.1:9/v1").run()
    return cell_dir


def test_an_arc3_harness_over_a_dead_proxy_is_not_charged_and_the_level_is_played_again(tmp_path, monkeypatch):
    """The arc3 runner asks through the same helper: the harness's "API call failed" reply in
    level 1 finds the dead proxy, the level is not charged and is played again from its start."""
    clean = ends(run_arc3_harness(tmp_path / "clean", monkeypatch, Proxy()))
    assert [e[1:3] for e in clean] == [("solved", 2), ("solved", 3), ("solved", 4)]
    proxy = Proxy(dies_at=5)  # level 1's second move (level 0: two moves and its end)
    cell_dir = run_arc3_harness(tmp_path / "faulted", monkeypatch, proxy)
    events = read_events(CellPaths(cell_dir).events)
    [fault] = [e for e in events if e.type == "infrastructure_fault"]
    assert fault.slot == 1 and LOST in fault.error and proxy.starts == 2
    assert ends(cell_dir) == clean
    assert not [e for e in standing(events) if e.type == "step" and e.outcome == "malformed"]
