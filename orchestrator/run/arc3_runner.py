"""The arc3 cell runner: one player through a stream of game levels, with the records of every track.

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
import fcntl
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from contextlib import ExitStack

import structlog

from harness_adapters import registry
from harness_adapters.arc3_harness import Arc3Harness
from harness_adapters.chat_model import ChatModel, ModelUnavailable, Usage
from orchestrator.arc3 import (COMPLEX, Arc3Action, Arc3Env, LevelProtocol, Observation,
                               parse_arc3_action)
from orchestrator.protocol import Malformed, MalformedReply, Status
from orchestrator.records import (RECORDS_FORMAT, CellFence, CellPaths, Event, EventLog,
                                  RecordsUnwritable, current_attempt, read_events, truncate_torn_tail)
from orchestrator.run.cell_services import HostStateDir, cell_services
from orchestrator.run.grid_config import HARNESSES, Cell, GridConfig
from orchestrator.run.runner import (INFRASTRUCTURE_RESTARTS, CellStopped, InfrastructureFault, SpendMeter,
                                     interrupt_on_fault, journaled_usage, lost_connection_test)
from orchestrator.run.schedule import ScheduledSlot, build_schedule
from orchestrator.tasks.base import derive_seed
from proxy.journal import JOURNAL_FILE, JournalTail

log = structlog.get_logger("carc.arc3")

LOCK_TRIES = 30  # x 0.1 s
EXTRA_TURNS = 50  # turns beyond the cap and the malformed cap before a level is given up


class ReplayMismatch(RuntimeError):
    """A resumed level played its logged actions again and the engine answered otherwise."""


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


@dataclass
class Arc3CellRunner:
    """Runs one arc3 cell in `cell_dir`; `progress(done, total)` after each level."""

    grid: GridConfig
    cell: Cell
    cell_dir: Path
    env_factory: Callable[[], Arc3Env] | None = None  # default: the cell's engine container
    progress: Callable[[int, int], None] = lambda done, total: None
    fence: CellFence | None = None
    model_base_url: str | None = None  # the model a model-driven player calls (through the cell's proxy)

    def __post_init__(self) -> None:
        self.paths = CellPaths(self.cell_dir)
        for folder in (self.paths.state, self.paths.snapshots, self.paths.transcripts):
            folder.mkdir(parents=True, exist_ok=True)
        self.cell.record().write(self.paths.settings)
        self.limits = self.grid.limits.limits()
        self.journal_tail: JournalTail | None = None

    def run(self) -> str:
        lock = open(self.paths.lock, "w")
        for attempt in range(LOCK_TRIES):
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == LOCK_TRIES - 1:
                    lock.close()
                    raise RuntimeError(f"{self.cell_dir}: another process is running this cell") from None
                time.sleep(0.1)
        try:
            for restart in range(INFRASTRUCTURE_RESTARTS + 1):
                try:
                    self._run()
                    return "done"
                except CellStopped as exc:
                    log.warning("cell_stopped", cell=self.cell.cell, reason=str(exc))
                    return "stopped"
                except InfrastructureFault as exc:
                    if restart == INFRASTRUCTURE_RESTARTS:
                        raise InfrastructureFault(
                            f"{exc}; stopped after {INFRASTRUCTURE_RESTARTS} restarts of the engine "
                            "(resume with `carc grid run --resume` once the cause is fixed)") from exc
                    # a fresh engine, and the interrupted level played again from its start
                    log.warning("arc3_engine_restart", cell=self.cell.cell, fault=str(exc), restart=restart + 1)
        finally:
            lock.close()

    def _run(self) -> None:
        schedule = build_schedule(self.grid, self.cell)
        truncate_torn_tail(self.paths.events)
        events = read_events(self.paths.events)
        finished = {e.slot for e in events if e.type == "instance_end"}
        # one seed for every player of a stream: the explorer, its library twin and the twin's wiped
        # row meet a level the first time alike, so what differs after is memory alone
        seed = derive_seed(self.cell.seed, "arc3-player")
        with ExitStack() as stack:
            self.services = None
            if self.cell.learner in HARNESSES:  # its own sandbox, volume and proxy, as on the grid tracks
                if self.model_base_url is None:
                    raise ValueError(f"{self.cell.learner} on arc3 needs a model; none was given to the cell")
                self.services = stack.enter_context(cell_services(self.grid, self.cell, self.cell_dir,
                                                                  self.model_base_url))
                self.state = self.services.state
                self.player = Arc3Harness(self.services.harness, self.cell.row)
                stack.callback(self.player.close)
                self._play(schedule, events, finished)
                return
            player_class = registry.arc3_class(self.cell.learner)
            if getattr(player_class, "uses_model", False):  # its calls pass the cell's journaling proxy
                if self.model_base_url is None:
                    raise ValueError(f"{self.cell.learner} on arc3 needs a model; none was given to the cell")
                self.services = stack.enter_context(cell_services(self.grid, self.cell, self.cell_dir,
                                                                  self.model_base_url))
                endpoint = self.grid.model.endpoint_for(self.cell.effort, self.services.model_base_url)
                if self.services.proxy is not None:  # the proxy injects the real key; the player has none
                    endpoint = endpoint.model_copy(update={"api_key_env": ""})
                self.state = self.services.state
                self.player = player_class(self.paths.state, self.cell.effort, seed, model=ChatModel(endpoint))
            else:
                self.state = HostStateDir(self.paths.state)
                self.player = player_class(self.paths.state, self.cell.effort, seed)
            self._play(schedule, events, finished)

    def _play(self, schedule: list[ScheduledSlot], events: list[Event], finished: set[int]) -> None:
        try:
            env = self.env_factory() if self.env_factory is not None else open_engine(
                self.grid, self.cell, self.cell_dir)
        except Exception as exc:
            raise InfrastructureFault(f"the arc3 engine did not start: {exc}") from exc
        try:
            with EventLog(self.paths.events, self.fence) as journal:
                if events:  # resuming: the state as it was after the last finished slot
                    done = [s for s in schedule if s.index in finished]
                    self.state.restore(self.paths.snapshot(done[-1].index) if done else None)
                spend = SpendMeter(self.paths, self.services is not None and self.services.proxy is not None)
                for position, slot in enumerate(schedule):
                    if slot.index in finished:
                        continue
                    partial = current_attempt(events, slot.index)
                    self._check_limits(slot, spend, journal, started=bool(partial))
                    self._run_slot(env, slot, journal, partial)
                    self.progress(position + 1, len(schedule))
        finally:
            env.close()

    def _event(self, kind: str, slot: ScheduledSlot, **fields) -> Event:
        return Event(type=kind, cell=self.cell.cell, slot=slot.index, phase=slot.phase,
                     task=slot.task_id, visit=slot.visit, exposure=slot.exposure, t=time.time(),
                     **fields)

    def _check_limits(self, slot: ScheduledSlot, spend: SpendMeter, journal: EventLog,
                      started: bool) -> None:
        """Before a level: stop the cell, recorded, once it has spent limits.usd_per_cell; a level
        already begun (a resumed one) is finished first."""
        cap = self.grid.limits.usd_per_cell
        if cap is None or started:
            return
        spent = spend.total()
        if spent >= cap:
            reason = (f"limits.usd_per_cell: ${spent:.4f} spent of ${cap:.4f} before this level; "
                      f"raise it and resume: carc grid run --resume {self.paths.run.root} --usd-per-cell X")
            journal.append(self._event("stopped", slot, reason=reason, cost_usd=spent))
            raise CellStopped(reason)

    def _journal_usage(self, slot: int, since: float) -> Usage:
        if self.journal_tail is None:
            self.journal_tail = JournalTail(self.paths.journal / JOURNAL_FILE)
        return journaled_usage(self.journal_tail, slot, since)

    def _engine(self, journal: EventLog, slot: ScheduledSlot, call: Callable[[], Observation]) -> Observation:
        """An engine call; its failure is the infrastructure's, never charged: the level is
        journaled as interrupted and played again from its start on a fresh engine."""
        try:
            return call()
        except Exception as exc:
            journal.append(self._event("infrastructure_fault", slot,
                                       error=f"the arc3 engine failed: {type(exc).__name__}: {exc}"[:2000]))
            raise InfrastructureFault(f"slot {slot.index}: the arc3 engine failed: {exc}") from exc

    def _replay(self, env: Arc3Env, slot: ScheduledSlot, protocol: LevelProtocol,
                partial: list[Event], journal: EventLog) -> LevelProtocol:
        """Play a resumed level's logged steps again: nothing charged twice, the player and the
        engine brought back to where the records say they were."""
        for event in (e for e in partial if e.type == "step"):
            data = event.action or {}
            if "malformed" in data:
                if getattr(self.player, "uses_model", False) and not getattr(self.player, "resumes_fresh", False):
                    self.player.replay_reply(event.reply or "")
                protocol.check(Malformed(data["malformed"]))
                self.player.told(event.message or data["malformed"], protocol.current)
                continue
            action = parse_arc3_action(data)
            if isinstance(action, Malformed):
                raise ReplayMismatch(f"{self.paths.events}: slot {slot.index} step {event.step}: "
                                     f"the logged action does not parse ({action.reason})")
            if getattr(self.player, "resumes_fresh", False):
                pass  # a harness: a new conversation at the level's current frame, below
            elif getattr(self.player, "uses_model", False):  # its conversation back, not a new call
                self.player.replay_reply(event.reply or json.dumps(action_json(action)))
            else:
                chosen = self.player.choose(protocol.current)
                if chosen != action:
                    log.warning("arc3_replay_choice_differs", cell=self.cell.cell, slot=slot.index,
                                step=event.step, logged=action_json(action), chosen=action_json(chosen))
            if event.outcome != "played":
                protocol.check(action)
                self.player.told(event.message or "", protocol.current)
                continue
            observation = self._engine(journal, slot, lambda: env.act(action))
            digest = (event.note or {}).get("frame")
            if digest is not None and digest != frame_digest(observation):
                raise ReplayMismatch(f"{self.paths.events}: slot {slot.index} step {event.step}: the "
                                     f"engine answered the logged action otherwise on resume (game "
                                     f"{slot.task_id} is not deterministic); the level cannot resume exactly")
            acted = protocol.played(observation)
            self.player.observe(action, observation)
            if acted.completed:
                self.player.completed(protocol.game_id, protocol.level)
        if getattr(self.player, "resumes_fresh", False):
            self.player.begin(protocol.game_id, protocol.level, protocol.current, baseline=protocol.baseline,
                              cap=protocol.cap, actions=protocol.actions)
        return protocol

    def _run_slot(self, env: Arc3Env, slot: ScheduledSlot, journal: EventLog,
                  partial: list[Event]) -> None:
        source = slot.source
        level = source.level(slot.task_id, slot.visit)
        baseline = source.baseline(slot.task_id, level)
        if slot.wipe_before and not partial:
            self.state.wipe()
        start = self._engine(journal, slot, lambda: env.start(slot.task_id, level))
        protocol = LevelProtocol(slot.task_id, level, baseline, start, self.limits.max_malformed)
        began = time.monotonic()
        deadline = began + self.limits.wall_clock_s
        self.player.deadline = deadline  # a model call is cut at the level's wall clock
        self.player.begin(slot.task_id, level, start, baseline=baseline, cap=protocol.cap)
        if self.services is not None:
            self.services.set_slot(slot.index, "before")
        usage = Usage()
        step_no = 0
        since = partial[0].t if partial else time.time()  # when this attempt of the level began
        if partial:
            protocol = self._replay(env, slot, protocol, partial, journal)
            step_no = sum(e.type == "step" for e in partial)
            for e in (e for e in partial if e.type == "step"):
                usage = usage + Usage(e.model_calls or 0, e.prompt_tokens or 0, e.completion_tokens or 0,
                                      e.model_s or 0.0, e.cost_usd or 0.0)
            journal.append(self._event("resumed", slot, step=step_no, cost=protocol.actions,
                                       level=level, format=RECORDS_FORMAT), durable=False)
        else:
            journal.append(self._event("instance_start", slot, format=RECORDS_FORMAT, level=level,
                                       wiped_before=slot.wipe_before), durable=False)
        most = protocol.cap + self.limits.max_malformed + EXTRA_TURNS
        lost_connection = lost_connection_test(self.cell.learner)

        def superseded() -> Event:
            """The fault's record, with what the attempt it ends spent (a harness's: journaled)."""
            spent = self._journal_usage(slot.index, since) if self.cell.learner in HARNESSES else usage
            return self._event("infrastructure_fault", slot, step=step_no, level=level, model_calls=spent.calls,
                               prompt_tokens=spent.prompt_tokens, completion_tokens=spent.completion_tokens,
                               model_s=round(spent.seconds, 4), cost_usd=spent.usd)

        def interrupt(context: str, settle: bool = False) -> None:
            """Before a charge: a fault under the level ends this attempt, uncharged (runner.py)."""
            interrupt_on_fault(self.services, journal, superseded, context, settle)

        wall_clock = f"wall-clock limit of {self.limits.wall_clock_s:g} s exceeded"
        try:
            while not protocol.over and step_no < most:
                if time.monotonic() > deadline:
                    interrupt(wall_clock)
                    protocol.expire(wall_clock, "wall-clock")
                    break
                action = self.player.choose(protocol.current)
                spent = getattr(self.player, "usage", None) or Usage()
                reply = getattr(self.player, "last_text", None)
                applied = copy.copy(protocol)  # adopted once its event is on disk
                answer = applied.check(action)
                observation = None
                if answer is None:
                    observation = self._engine(journal, slot, lambda: env.act(action))
                    acted = applied.played(observation)
                    outcome, message = "played", None
                else:
                    outcome = "malformed" if isinstance(answer, MalformedReply) else "refused"
                    message = answer.reason
                said_lost = outcome == "malformed" and lost_connection(reply or "")
                if said_lost or (applied.over and applied.status is not Status.SOLVED):
                    interrupt(f"the player's reply, {outcome}: {(reply or '')[:300]!r}", settle=said_lost)
                journal.append(self._event(
                    "step", slot, step=step_no + 1,
                    action=action_json(action) if isinstance(action, Arc3Action) else {"malformed": action.reason},
                    outcome=outcome, message=message, cost=applied.actions, malformed=applied.malformed,
                    over=applied.over, reply=reply, model_calls=spent.calls,
                    prompt_tokens=spent.prompt_tokens, completion_tokens=spent.completion_tokens,
                    model_s=round(spent.seconds, 4), cost_usd=spent.usd,
                    note=None if observation is None else {
                        "frame": frame_digest(observation), "state": observation.state,
                        "levels_completed": observation.levels_completed}))
                protocol = applied
                step_no += 1
                usage = usage + spent
                if observation is not None:
                    self.player.observe(action, observation)
                    if acted.completed:
                        self.player.completed(slot.task_id, level)
                else:
                    self.player.told(message or "", protocol.current)
                if protocol.over and self.services is not None:
                    self.services.set_slot(slot.index, "after")
            if not protocol.over:
                no_verdict = f"{step_no} turns without completing the level or reaching its cap"
                interrupt(no_verdict)
                protocol.expire(no_verdict, "no-verdict")
        except (RecordsUnwritable, ReplayMismatch, InfrastructureFault):
            raise
        except ModelUnavailable as exc:
            interrupt(f"the player saw: model unavailable: {exc}", settle=True)
            journal.append(self._event("learner_error", slot, error=f"model unavailable: {exc}"[:2000],
                                       failure_kind="model-unavailable"))
            protocol.expire(f"model unavailable: {exc}"[:300], "model-unavailable")
        except Exception as exc:  # the player's bug fails the level, charged in full
            interrupt(f"the player saw: {type(exc).__name__}: {exc}", settle=True)
            log.error("arc3_level_error", cell=self.cell.cell, slot=slot.index, exc_info=exc)
            journal.append(self._event("learner_error", slot, error=f"{type(exc).__name__}: {exc}"[:2000],
                                       failure_kind="learner-error"))
            protocol.expire(f"{type(exc).__name__}: {exc}"[:300], "learner-error")
        if hasattr(self.player, "end_level"):  # a harness hears how the level went (it may store)
            try:
                self.player.end_level(protocol.status.value == "solved", protocol.actions)
            except Exception as exc:
                log.warning("arc3_end_level_error", cell=self.cell.cell, slot=slot.index, error=str(exc)[:500])
                journal.append(self._event("learner_error", slot, error=f"end: {exc}"[:2000]))
        if self.cell.learner in HARNESSES:  # a harness does not count its calls; the proxy does
            usage = self._journal_usage(slot.index, since)
        charge = protocol.charge
        transcript = {"game": slot.task_id, "level": level, "baseline": baseline, "actions": protocol.actions}
        if hasattr(self.player, "transcript"):
            transcript["conversation"] = self.player.transcript()
        else:
            transcript["path"] = [action_json(a) for a in getattr(self.player, "path", [])]
        self.paths.transcript(slot.index).write_text(json.dumps(transcript, indent=1))
        self.state.snapshot(self.paths.snapshot(slot.index))
        journal.append(self._event(
            "instance_end", slot, status=protocol.status.value, cost=charge.cost, budget=charge.cap,
            level=level, reason=protocol.failure_reason, failure_kind=protocol.failure_kind,
            malformed=protocol.malformed, demos_used=0, attempts_used=0,
            wall_s=round(time.monotonic() - began, 4), model_calls=usage.calls,
            prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
            model_s=round(usage.seconds, 4), cost_usd=usage.usd))
        if self.services is not None:
            self.services.set_slot(None, "between")


def is_arc3(grid: GridConfig) -> bool:
    return grid.track.name == "arc3"
