"""The grid cell runner: one learner through its schedule of instances, played under the grid's
`InstanceProtocol` by the one slot driver (`orchestrator/run/slot_driver.py`: records, resume,
faults, the dollar cap).

Every action of the learner is applied to a copy of the protocol and adopted once its `step`
event is on disk; a resumed instance's protocol is rebuilt by replaying the logged steps, and the
learner gets its conversation back (`InstanceView.history`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness_adapters.base import InstanceView, Learner, StepRecord
from harness_adapters.chat_model import ChatModel, ModelUnavailable
from harness_adapters.harness import HarnessError
from orchestrator.arc import as_grid
from orchestrator.prompts import PromptSet
from orchestrator.protocol import (Action, DemoGiven, InstanceProtocol, Malformed, MalformedReply,
                                   Outcome, Refused, Status, Verdict, extract_action)
from orchestrator.records import CellFence, CellPaths, Event, EventLog, read_events, truncate_torn_tail
from orchestrator.run.cell_services import cell_services, ladder_learner
from orchestrator.run.grid_config import Cell, GridConfig, price_table
from orchestrator.run.schedule import ScheduledSlot, build_schedule
from orchestrator.run.slot_driver import (LearnerFailure, Move, Play, ReplayMismatch, SlotDriver, SpendMeter,
                                          WallClock, usage_fields)
from proxy.journal import JournalTail

# A learner that keeps talking after the verdict (harnesses may) is stopped after this many turns.
MAX_TURNS_AFTER_OVER = 4
MAX_TURNS = 200

def charges_a_failure(outcome: Outcome, before: InstanceProtocol, after: InstanceProtocol) -> bool:
    """Whether a step charges the learner for failing: a wrong answer, or the step that ends the
    instance failed (the malformed cap)."""
    return ((isinstance(outcome, Verdict) and not outcome.correct)
            or (after.over and not before.over and after.status is not Status.SOLVED))


def outcome_label(outcome: Outcome) -> str:
    if isinstance(outcome, DemoGiven):
        return "demo"
    if isinstance(outcome, Verdict):
        return "correct" if outcome.correct else "incorrect"
    if isinstance(outcome, Refused):
        return "refused"
    if isinstance(outcome, MalformedReply):
        return "malformed"
    return "finished"


def action_from_event(event: Event) -> Action | Malformed:
    data = event.action or {}
    if "malformed" in data:
        return Malformed(data["malformed"])
    grid = as_grid(data["grid"]) if "grid" in data else None
    return Action(data["action"], grid)



class InstancePlay(Play):
    """A grid instance under the `InstanceProtocol`: the learner acts, the protocol answers (a
    demo, a verdict), and a resumed instance's logged steps are replayed into the protocol."""

    def __init__(self, slot: ScheduledSlot, learner: Learner, runner: CellRunner):
        self.slot = slot
        self.learner = learner
        self.event = runner._event
        self.events_path = runner.paths.events
        self.instance = slot.instance()
        self.protocol = InstanceProtocol(self.instance, runner.limits)
        self.history: list[StepRecord] = []
        self.deadline = 0.0
        self.turns_after_over = 0

    def open(self, partial: list[Event], deadline: float) -> None:
        self.deadline = deadline
        for event in (e for e in partial if e.type == "step"):
            action = action_from_event(event)
            outcome = self.protocol.step(action)
            if outcome_label(outcome) != event.outcome:
                raise ReplayMismatch(
                    f"{self.events_path}: replay of slot {self.slot.index} step {event.step} disagrees: "
                    f"the records say {event.outcome}, the protocol answers {outcome_label(outcome)}; "
                    "the instance cannot resume exactly")
            self.history.append(StepRecord(action, outcome, event.reply or "", event.note or {}))

    def cost(self) -> int:
        return self.protocol.cost

    def begin(self) -> None:
        # The deadline reaches the learner: a harness turn or model call is cut at the wall clock.
        self.learner.begin(InstanceView(self.slot.task_id, self.instance.test_input, self.protocol.wrong,
                                        self.protocol.demos_used, tuple(self.history), deadline=self.deadline))

    def wants_turn(self, steps: int) -> bool:
        if self.protocol.finished or steps >= MAX_TURNS:
            return False
        if self.protocol.over:  # a learner that talks after the verdict is heard a few turns more
            if not self.learner.talks_after_verdict:
                return False
            self.turns_after_over += 1
            return self.turns_after_over <= MAX_TURNS_AFTER_OVER
        return True

    def move(self, steps: int, deadline: float) -> Move | WallClock:
        turn = self.learner.act()
        action = turn.action if turn.action is not None else extract_action(turn.text)
        if time.monotonic() > deadline:
            return WallClock(turn.text or "")
        applied = copy.copy(self.protocol)
        outcome = applied.step(action)
        step = self.event(
            "step", self.slot, step=steps + 1,
            action=action.to_json() if isinstance(action, Action) else {"malformed": action.reason},
            reply=turn.text or None, outcome=outcome_label(outcome),
            message=getattr(outcome, "reason", None), note=turn.note or None,
            cost=applied.cost, demos_used=applied.demos_used, attempts_used=applied.wrong,
            malformed=applied.malformed, over=applied.over, **usage_fields(turn.usage))
        return Move(step, applied, turn.usage, turn.text or "", charges_a_failure(outcome, self.protocol, applied),
                    lambda: self.learner.observe(outcome, applied.wrong, applied.demos_used))

    def no_verdict(self, steps: int) -> str:
        return f"the conversation ended after {steps} turns without a verdict"

    def failure(self, exc: Exception) -> LearnerFailure:
        if isinstance(exc, ModelUnavailable):
            return LearnerFailure(f"model unavailable: {exc}", "model-unavailable")
        if isinstance(exc, HarnessError):
            return LearnerFailure(str(exc), exc.kind.value)
        return LearnerFailure(f"learner error: {type(exc).__name__}: {exc}", "learner-error", bug=exc)

    def end(self) -> None:
        self.learner.end(self.protocol.status.value == "solved")

    def transcript(self) -> list:
        return self.learner.transcript()

    def end_record(self) -> dict:
        protocol = self.protocol
        return dict(cost=protocol.cost, demos_used=protocol.demos_used, attempts_used=protocol.wrong,
                    first_submit_demos=protocol.first_submit_demos,
                    first_answer_correct=protocol.first_answer_correct)


@dataclass
class CellRunner(SlotDriver):
    """Runs one cell in `cell_dir`; `progress(slot_index, total)` is called after each instance."""

    grid: GridConfig
    cell: Cell
    cell_dir: Path
    model_base_url: str
    progress: Callable[[int, int], None] = lambda done, total: None
    fence: CellFence | None = None  # this attempt's fencing token (the Ray executor); None: the local pool

    def __post_init__(self) -> None:
        self.paths = CellPaths(self.cell_dir)
        self.events_path = self.paths.events
        self.state_dir = self.paths.state
        self.journal_tail: JournalTail | None = None
        self.services = None
        for folder in (self.paths.state, self.paths.snapshots):
            folder.mkdir(parents=True, exist_ok=True)
        self.cell.record().write(self.paths.settings)
        self.limits = self.grid.limits.limits()
        self.prompts = PromptSet.load(self.grid.prompts)

    def _run(self) -> None:
        schedule = build_schedule(self.grid, self.cell)
        truncate_torn_tail(self.events_path)
        events = read_events(self.events_path)
        finished = {e.slot for e in events if e.type == "instance_end"}
        wipes = sum(1 for slot in schedule if slot.index not in finished and slot.wipe_before)
        with cell_services(self.grid, self.cell, self.cell_dir, self.model_base_url, wipes) as services:
            self.services = services
            self.state = services.state
            endpoint = self.grid.model.endpoint_for(self.cell.effort, services.model_base_url)
            price = price_table(self.grid).lookup(self.grid.model.name)
            if price is not None:  # the learner counts its dollars as the proxy does
                endpoint = endpoint.model_copy(update={"input_usd_per_mtok": price.input_per_m,
                                                       "output_usd_per_mtok": price.output_per_m})
            if services.proxy is not None:  # the proxy injects the real key; the learner has none
                endpoint = endpoint.model_copy(update={"api_key_env": ""})
            self.learner = services.harness or ladder_learner(
                self.cell, self.state_dir, self.prompts, ChatModel(endpoint), services.executor)
            try:
                with EventLog(self.events_path, self.fence) as journal:
                    if events:  # resuming: the state must be as it was after the last finished slot
                        done = [s for s in schedule if s.index in finished]
                        self._restore(done[-1] if done else None)
                    self._run_slots(schedule, events, journal, self.progress,
                                    SpendMeter(self.paths, services.proxy is not None),
                                    prestart=self.learner.prestart if self.grid.sandbox.standby else None)
            finally:
                self.learner.close()

    def _play(self, slot: ScheduledSlot, journal: EventLog) -> InstancePlay:
        return InstancePlay(slot, self.learner, self)


def cell_runner(grid: GridConfig, cell: Cell, cell_dir: Path, base_url: str, *,
                fence: CellFence | None = None,
                progress: Callable[[int, int], None] = lambda done, total: None) -> SlotDriver:
    """The slot driver of one cell, for the local pool's workers and the Ray executor's attempts
    alike: levels of games through the cell's engine (the arc3 track), or conversations over
    grids (every other track)."""
    if grid.track.name == "arc3":
        from orchestrator.run.arc3_runner import Arc3CellRunner
        return Arc3CellRunner(grid, cell, cell_dir, progress=progress, model_base_url=base_url, fence=fence)
    return CellRunner(grid, cell, cell_dir, base_url, progress, fence=fence)
