"""The arc3 cell runner: one player through a stream of game levels, played under the
`LevelProtocol` by the one slot driver (`orchestrator/run/slot_driver.py`), with the records of
every track.

For every slot (a game's level, `orchestrator/tasks/arc3_games.py`): wipe the state if the row
says so -> the engine puts the game on the level (not charged) -> instance_start -> per action:
the protocol checks it (malformed or unavailable: free), the engine plays it, one fsynced `step`
event (the action, its charge so far, a digest of the frame it produced) before the player hears
the answer -> snapshot of the state -> instance_end with the level's charge (`cost`) and its full
charge (`budget` = 5 x the level's human baseline).

A killed run resumes at the first slot without an instance_end: the state comes back from the
previous slot's snapshot, the level is entered again and its logged actions are played again
(not charged again), the player choosing each of them anew from the same state, and the frame
digests must agree, so a game that is not deterministic is said to be so instead of scored.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import structlog

from harness_adapters import registry
from harness_adapters.arc3_harness import Arc3Harness
from harness_adapters.chat_model import ChatModel, ModelUnavailable, Usage
from orchestrator.arc3 import (COMPLEX, Arc3Action, Arc3Env, LevelProtocol, Observation,
                               parse_arc3_action)
from orchestrator.protocol import Malformed, MalformedReply, Status
from orchestrator.records import CellFence, CellPaths, Event, EventLog, read_events, truncate_torn_tail
from orchestrator.run.cell_services import HostStateDir, cell_services
from orchestrator.run.grid_config import HARNESSES, Cell, GridConfig
from orchestrator.run.schedule import ScheduledSlot, build_schedule
from orchestrator.run.slot_driver import (InfrastructureFault, LearnerFailure, Move, Play, ReplayMismatch,
                                          SlotDriver, SpendMeter, WallClock, usage_fields)
from orchestrator.tasks.base import derive_seed
from proxy.journal import JournalTail

log = structlog.get_logger("carc.arc3")

EXTRA_TURNS = 50  # turns beyond the cap and the malformed cap before a level is given up


def frame_digest(observation: Observation) -> str:
    last = observation.frames[-1] if observation.frames else ()
    data = json.dumps([last, observation.state, observation.levels_completed]).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def action_json(action: Arc3Action) -> dict:
    return {"action": action.name, **({"x": action.x, "y": action.y} if action.name == COMPLEX else {})}


def open_engine(grid: GridConfig, cell: Cell, cell_dir: Path) -> Arc3Env:
    """The cell's own engine container, serving the grid's games folder to this process only."""
    from orchestrator.run.arc3_engine import open_engine_env
    return open_engine_env(grid, cell, cell_dir)


class LevelPlay(Play):
    """An arc3 level under the `LevelProtocol`: the protocol checks each action (malformed or
    unavailable: free), the engine plays it, and the step records a digest of the frame it
    produced; a resumed level plays its logged actions again and the digests must agree."""

    who = "player"

    def __init__(self, slot: ScheduledSlot, runner: Arc3CellRunner, journal: EventLog):
        self.slot = slot
        self.runner = runner
        self.player = runner.player
        self.env = runner.env
        self.journal = journal
        self.event = runner._event
        self.limits = runner.limits
        self.level = slot.source.level(slot.task_id, slot.visit)
        self.baseline = slot.source.baseline(slot.task_id, self.level)
        self.protocol: LevelProtocol

    def record_fields(self) -> dict:
        return {"level": self.level}

    def _engine(self, call: Callable[[], Observation]) -> Observation:
        """An engine call; its failure is the infrastructure's, never charged: the level is
        journaled as interrupted and played again from its start on a fresh engine."""
        try:
            return call()
        except Exception as exc:
            self.journal.append(self.event("infrastructure_fault", self.slot,
                                           error=f"the arc3 engine failed: {type(exc).__name__}: {exc}"[:2000]))
            raise InfrastructureFault(f"slot {self.slot.index}: the arc3 engine failed: {exc}") from exc

    def open(self, partial: list[Event], deadline: float) -> None:
        slot = self.slot
        start = self._engine(lambda: self.env.start(slot.task_id, self.level))
        self.protocol = LevelProtocol(slot.task_id, self.level, self.baseline, start, self.limits.max_malformed)
        self.player.deadline = deadline  # a model call is cut at the level's wall clock
        self.player.begin(slot.task_id, self.level, start, baseline=self.baseline, cap=self.protocol.cap)
        if partial:
            self._replay(partial)

    def _replay(self, partial: list[Event]) -> None:
        """Play a resumed level's logged steps again: nothing charged twice, the player and the
        engine brought back to where the records say they were."""
        player, protocol, slot = self.player, self.protocol, self.slot
        events_path = self.runner.paths.events
        for event in (e for e in partial if e.type == "step"):
            data = event.action or {}
            if "malformed" in data:
                if getattr(player, "uses_model", False) and not getattr(player, "resumes_fresh", False):
                    player.replay_reply(event.reply or "")
                protocol.check(Malformed(data["malformed"]))
                player.told(event.message or data["malformed"], protocol.current)
                continue
            action = parse_arc3_action(data)
            if isinstance(action, Malformed):
                raise ReplayMismatch(f"{events_path}: slot {slot.index} step {event.step}: "
                                     f"the logged action does not parse ({action.reason})")
            if getattr(player, "resumes_fresh", False):
                pass  # a harness: a new conversation at the level's current frame, below
            elif getattr(player, "uses_model", False):  # its conversation back, not a new call
                player.replay_reply(event.reply or json.dumps(action_json(action)))
            else:
                chosen = player.choose(protocol.current)
                if chosen != action:
                    log.warning("arc3_replay_choice_differs", cell=self.runner.cell.cell, slot=slot.index,
                                step=event.step, logged=action_json(action), chosen=action_json(chosen))
            if event.outcome != "played":
                protocol.check(action)
                player.told(event.message or "", protocol.current)
                continue
            observation = self._engine(lambda: self.env.act(action))
            digest = (event.note or {}).get("frame")
            if digest is not None and digest != frame_digest(observation):
                raise ReplayMismatch(f"{events_path}: slot {slot.index} step {event.step}: the "
                                     f"engine answered the logged action otherwise on resume (game "
                                     f"{slot.task_id} is not deterministic); the level cannot resume exactly")
            acted = protocol.played(observation)
            player.observe(action, observation)
            if acted.completed:
                player.completed(protocol.game_id, protocol.level)
        if getattr(player, "resumes_fresh", False):
            player.begin(protocol.game_id, protocol.level, protocol.current, baseline=protocol.baseline,
                         cap=protocol.cap, actions=protocol.actions)

    def cost(self) -> int:
        return self.protocol.actions

    def wants_turn(self, steps: int) -> bool:
        return not self.protocol.over and steps < self.protocol.cap + self.limits.max_malformed + EXTRA_TURNS

    def move(self, steps: int, deadline: float) -> Move | WallClock:
        if time.monotonic() > deadline:
            return WallClock()
        player = self.player
        action = player.choose(self.protocol.current)
        spent = getattr(player, "usage", None) or Usage()
        reply = getattr(player, "last_text", None)
        applied = copy.copy(self.protocol)
        answer = applied.check(action)
        observation = None
        if answer is None:
            observation = self._engine(lambda: self.env.act(action))
            acted = applied.played(observation)
            outcome, message = "played", None
        else:
            outcome = "malformed" if isinstance(answer, MalformedReply) else "refused"
            message = answer.reason
        step = self.event(
            "step", self.slot, step=steps + 1,
            action=action_json(action) if isinstance(action, Arc3Action) else {"malformed": action.reason},
            outcome=outcome, message=message, cost=applied.actions, malformed=applied.malformed,
            over=applied.over, reply=reply, **usage_fields(spent),
            note=None if observation is None else {
                "frame": frame_digest(observation), "state": observation.state,
                "levels_completed": observation.levels_completed})

        def tell() -> None:
            if observation is None:
                player.told(message or "", applied.current)
                return
            player.observe(action, observation)
            if acted.completed:
                player.completed(self.slot.task_id, self.level)

        return Move(step, applied, spent, reply or "", applied.over and applied.status is not Status.SOLVED, tell)

    def no_verdict(self, steps: int) -> str:
        return f"{steps} turns without completing the level or reaching its cap"

    def failure(self, exc: Exception) -> LearnerFailure:
        if isinstance(exc, ModelUnavailable):
            return LearnerFailure(f"model unavailable: {exc}", "model-unavailable")
        return LearnerFailure(f"{type(exc).__name__}: {exc}", "learner-error", bug=exc)

    def end(self) -> None:
        if hasattr(self.player, "end_level"):  # a harness hears how the level went (it may store)
            self.player.end_level(self.protocol.status.value == "solved", self.protocol.actions)

    def transcript(self) -> dict:
        kept: dict[str, Any] = {"game": self.slot.task_id, "level": self.level, "baseline": self.baseline,
                                "actions": self.protocol.actions}
        if hasattr(self.player, "transcript"):
            kept["conversation"] = self.player.transcript()
        else:
            kept["path"] = [action_json(a) for a in getattr(self.player, "path", [])]
        return kept

    def end_record(self) -> dict:
        charge = self.protocol.charge
        return dict(cost=charge.cost, budget=charge.cap, demos_used=0, attempts_used=0)


@dataclass
class Arc3CellRunner(SlotDriver):
    """Runs one arc3 cell in `cell_dir`; `progress(done, total)` after each level."""

    grid: GridConfig
    cell: Cell
    cell_dir: Path
    env_factory: Callable[[], Arc3Env] | None = None  # default: the cell's engine container
    progress: Callable[[int, int], None] = lambda done, total: None
    fence: CellFence | None = None  # this attempt's fencing token (the Ray executor); None: the local pool
    model_base_url: str | None = None  # the model a model-driven player calls (through the cell's proxy)

    unit = "level"
    restarted = "the engine"

    def __post_init__(self) -> None:
        self.paths = CellPaths(self.cell_dir)
        for folder in (self.paths.state, self.paths.snapshots):
            folder.mkdir(parents=True, exist_ok=True)
        self.cell.record().write(self.paths.settings)
        self.limits = self.grid.limits.limits()
        self.journal_tail: JournalTail | None = None
        self.services = None

    def _run(self) -> None:
        schedule = build_schedule(self.grid, self.cell)
        truncate_torn_tail(self.paths.events)
        events = read_events(self.paths.events)
        # one seed for every player of a stream: the explorer, its library twin and the twin's wiped
        # row meet a level the first time alike, so what differs after is memory alone
        seed = derive_seed(self.cell.seed, "arc3-player")
        with ExitStack() as stack:
            self.services = None
            player_class = None if self.cell.learner in HARNESSES else registry.arc3_class(self.cell.learner)
            # a harness has its own sandbox, volume and proxy, as on the grid tracks; a model-driven
            # player's calls pass the cell's journaling proxy
            if player_class is None or getattr(player_class, "uses_model", False):
                if self.model_base_url is None:
                    raise ValueError(f"{self.cell.learner} on arc3 needs a model; none was given to the cell")
                self.services = stack.enter_context(cell_services(self.grid, self.cell, self.cell_dir,
                                                                  self.model_base_url))
                self.state = self.services.state
            else:
                self.state = HostStateDir(self.paths.state)
            if player_class is None:
                self.player = Arc3Harness(self.services.harness, self.cell.row)
                stack.callback(self.player.close)
            elif self.services is not None:
                endpoint = self.grid.model.endpoint_for(self.cell.effort, self.services.model_base_url)
                if self.services.proxy is not None:  # the proxy injects the real key; the player has none
                    endpoint = endpoint.model_copy(update={"api_key_env": ""})
                self.player = player_class(self.paths.state, self.cell.effort, seed, model=ChatModel(endpoint))
            else:
                self.player = player_class(self.paths.state, self.cell.effort, seed)
            try:
                self.env = self.env_factory() if self.env_factory is not None else open_engine(
                    self.grid, self.cell, self.cell_dir)
            except Exception as exc:
                raise InfrastructureFault(f"the arc3 engine did not start: {exc}") from exc
            stack.callback(self.env.close)
            with EventLog(self.paths.events, self.fence) as journal:
                if events:  # resuming: the state as it was after the last finished slot
                    finished = {e.slot for e in events if e.type == "instance_end"}
                    done = [s for s in schedule if s.index in finished]
                    self._restore(done[-1] if done else None)
                self._run_slots(schedule, events, journal, self.progress,
                                SpendMeter(self.paths, self.services is not None and self.services.proxy is not None))

    def _play(self, slot: ScheduledSlot, journal: EventLog) -> LevelPlay:
        return LevelPlay(slot, self, journal)


def is_arc3(grid: GridConfig) -> bool:
    return grid.track.name == "arc3"
