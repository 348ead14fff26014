"""The slot driver: the one instance loop every runner (a grid cell, an ARC-AGI-3 cell, a
collective user) drives, with append-only records and exact resume.

A runner says where the state lives (its services, or a host folder) and how a slot is played:
a `Play`, the track's protocol (`orchestrator/run/cell_runner.py`: the grid's `InstanceProtocol`;
`orchestrator/run/arc3_runner.py`: arc3's `LevelProtocol` on an engine). The driver does the rest,
once. For every slot: (wipe the state if the row says so) -> instance_start -> the conversation,
one fsynced `step` event per action before the learner hears the answer -> the learner's end ->
the transcript, the snapshot of the state and the logs -> instance_end. Around the slots: the
cell's lock (a fenced attempt waits out the stale one it replaced), the dollar cap before every
instance, and fresh services after an infrastructure fault.

A killed run resumes at the first slot without an instance_end: the state is restored from the
previous slot's snapshot, the play replays the logged steps (nothing is charged twice; a replay
that disagrees with the records raises `ReplayMismatch`), and the learner gets its conversation
back.

Nothing is charged to the learner while its infrastructure is broken: before a charge, at every
instance end that charges, after a learner error and after a reply that tells of a lost model
connection, the services are asked for a fault (`interrupt_on_fault`). A fault is journaled
(`infrastructure_fault`) and the instance runs again from its start on fresh services; its steps
before the fault are superseded (`records.standing`), never replayed.
"""

from __future__ import annotations

import fcntl
import threading
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import structlog

from harness_adapters import registry
from harness_adapters.chat_model import Usage
from harness_adapters.harness import HarnessError
from orchestrator.errors import CarcError, InfrastructureError
from orchestrator.protocol import FailureKind, Limits
from orchestrator.records import (RECORDS_FORMAT, SNAPSHOT_LEFT_OUT_KEPT, CellPaths, Event, EventLog,
                                  RecordsUnwritable, current_attempt, read_events)
from orchestrator.run.cell_services import CellServices
from orchestrator.run.grid_config import HARNESSES, Cell, GridConfig
from orchestrator.run.schedule import ScheduledSlot
from proxy.journal import JOURNAL_FILE, JournalTail
from sandboxes.environment import StateVolume

log = structlog.get_logger("carc.runner")
T = TypeVar("T")

# How often a cell's services are restarted after an infrastructure fault before the cell stops.
INFRASTRUCTURE_RESTARTS = 2
# After a sign that the infrastructure failed (a learner error, a harness's reply telling of a lost
# connection) and no fault seen yet: the wait before the services are asked again.
FAULT_SETTLE_S = 2.0
LOCK_POLL_S = 0.1
# `carc status` tries the lock for an instant to see whether the cell runs: a short wait tells
# that from another runner, which holds it for the whole cell.
LOCK_TRIES = 30  # x LOCK_POLL_S
# A fenced attempt (Ray executor) may find the stale attempt it replaced still holding the lock
# until that one's next record is refused: it waits this long for it.
FENCED_LOCK_TRIES = 6000  # x LOCK_POLL_S


class CellStopped(Exception):
    """The cell reached a limit of the grid (limits.usd_per_cell) before an instance: it stops
    cleanly, recorded, and continues on resume once the limit is raised."""


class InfrastructureFault(InfrastructureError):
    """The cell's proxy or a container stopped under an instance. Never charged to the learner:
    the instance is journaled as interrupted and run again from its start."""


class ReplayMismatch(CarcError, RuntimeError):
    """A resumed instance replayed its logged steps and the protocol (or the engine) answered
    otherwise than the records say: it cannot resume exactly."""


@dataclass(frozen=True)
class LearnerFailure:
    """Why the learner's turn failed, as journaled (`learner_error`) and charged: the message, its
    failure kind, and the exception when it was a bug of the learner (logged with its traceback)."""

    message: str
    kind: FailureKind
    bug: BaseException | None = None


@dataclass
class WallClock:
    """The instance's wall clock ran out before the turn's action was taken; `last_reply`: what
    the learner said in the turn that ran past it (None: no turn was taken)."""

    last_reply: str | None = None


@dataclass
class Move:
    """One turn under the track's protocol, applied to a copy of it (`applied`), adopted only once
    its `step` record is on disk; `tell` then gives the learner the answer."""

    step: Event
    applied: Any
    usage: Usage
    reply: str
    charges: bool  # the move charges the learner for failing (the fault probe runs before it)
    tell: Callable[[], None]


class Play(ABC):
    """One slot's instance under its track's protocol: what a grid instance and an arc3 level do
    differently. The driver calls `open` (the protocol; on resume the logged steps again), then
    `begin`, `wants_turn` and `move` per turn, `end`, `transcript` and `end_record`."""

    protocol: Any  # InstanceProtocol | LevelProtocol: over, status, failure_reason, expire
    who = "learner"  # how fault contexts name the one playing

    def record_fields(self) -> dict:
        """Fields the slot's start, fault and end records carry beside the common ones."""
        return {}

    @abstractmethod
    def open(self, partial: list[Event], deadline: float) -> None:
        """The protocol at the instance's start, and on resume (`partial`: the current attempt's
        records) the logged steps replayed into it; raises ReplayMismatch when they disagree."""

    @abstractmethod
    def cost(self) -> int:
        """The charge so far (the `resumed` record's)."""

    def begin(self) -> None:
        """The learner's turn begins (after the start record)."""

    @abstractmethod
    def wants_turn(self, steps: int) -> bool:
        """Whether the learner takes another turn after `steps`."""

    @abstractmethod
    def move(self, steps: int, deadline: float) -> Move | WallClock:
        """The learner's next action, applied to a copy of the protocol, as step `steps + 1`."""

    @abstractmethod
    def no_verdict(self, steps: int) -> str:
        """Why an instance that stopped before its verdict fails."""

    @abstractmethod
    def failure(self, exc: Exception) -> LearnerFailure:
        """What an exception out of the learner's turn means for the instance."""

    @abstractmethod
    def end(self) -> None:
        """The learner hears how the instance went (it may store)."""

    @abstractmethod
    def transcript(self) -> Any:
        """What is kept of the instance's conversation."""

    @abstractmethod
    def end_record(self) -> dict:
        """The track's fields of the instance_end record (its charge)."""


def interrupt_on_fault(services: CellServices | None, journal: EventLog, event: Callable[[], Event],
                       context: str, settle: bool = False, cause: BaseException | None = None) -> None:
    """Ask the cell's services for an infrastructure fault before anything is charged; when one is
    found, journal `event()` (an `infrastructure_fault`) with it and `context` (what the learner
    saw, or what failed), and raise InfrastructureFault: nothing is charged, and the instance runs
    again from its start. `settle`: there is a sign of a fault, so services that report none are
    asked once more after FAULT_SETTLE_S (a container being killed can end a stream before the
    engine says it stopped). Returns when there is no fault."""
    if services is None:
        return
    fault = services.fault()
    if not fault and settle:
        time.sleep(FAULT_SETTLE_S)
        fault = services.fault()
    if not fault:
        return
    record = event().model_copy(update={"error": f"{fault} ({context})"[:2000]})
    journal.append(record)
    who = f"user {record.user} slot {record.slot}" if record.user is not None else f"slot {record.slot}"
    raise InfrastructureFault(f"{who}: {fault}") from cause


def lost_connection_test(learner: str) -> Callable[[str], bool]:
    """Whether a reply text of the cell's learner tells of a lost model connection: its harness
    adapter's `connection_error_patterns` (a ladder learner's is a ModelUnavailable, never a reply)."""
    if learner not in HARNESSES:
        return lambda text: False
    return registry.adapter(learner).reports_lost_connection


def journaled_usage(tail: JournalTail, slot: int, since: float) -> Usage:
    """An instance's model calls as its cell's proxy journaled them (those the tail has not yet
    given), made since its current attempt began at `since` (the calls of an attempt an
    infrastructure fault superseded are not the instance's)."""
    mine = [e for e in tail.new_entries()  # not endpoint probes
            if e.slot == slot and e.t_start >= since and not e.refused and e.api != "other"]
    return Usage(len(mine), sum(e.prompt_tokens or 0 for e in mine),
                 sum(e.completion_tokens or 0 for e in mine),
                 sum(e.latency_s or 0.0 for e in mine), sum(e.cost_usd or 0.0 for e in mine))


def usage_fields(usage: Usage) -> dict:
    """The usage fields of a step, fault or instance_end record."""
    return dict(model_calls=usage.calls, prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens, model_s=round(usage.seconds, 4),
                cost_usd=usage.usd)


def recorded_usage(events: list[Event]) -> Usage:
    """What the logged steps of a resumed instance spent."""
    usage = Usage()
    for e in events:
        if e.type == "step":
            usage = usage + Usage(e.model_calls or 0, e.prompt_tokens or 0, e.completion_tokens or 0,
                                  e.model_s or 0.0, e.cost_usd or 0.0)
    return usage


@contextmanager
def cell_lock(path: Path, tries: int, cell_dir: Path) -> Iterator[None]:
    """Hold the cell's lock (flock on `path`) for the block, trying `tries` times LOCK_POLL_S apart."""
    lock = open(path, "w")
    try:
        for attempt in range(tries):
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == tries - 1:
                    raise RuntimeError(f"{cell_dir}: another process is running this cell") from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        lock.close()


class SpendMeter:
    """Dollars a cell has spent: every call of its proxy journal (retries, a harness's own calls
    and calls after the verdict included), read incrementally; without a journal, the learner's
    own count in its instance records."""

    def __init__(self, paths: CellPaths, journaled: bool):
        self.paths = paths
        self.tail = JournalTail(paths.journal / JOURNAL_FILE) if journaled else None
        self.spent = 0.0

    def total(self) -> float:
        if self.tail is not None:
            self.spent += sum(e.cost_usd or 0.0 for e in self.tail.new_entries())
            return self.spent
        events = read_events(self.paths.events)
        ends = {e.slot: e for e in events if e.type == "instance_end"}
        superseded = [e for e in events if e.type == "infrastructure_fault"]  # attempts rerun, still paid
        return sum(e.cost_usd or 0.0 for e in (*ends.values(), *superseded))


def run_restarting(attempt: Callable[[], T], exhausted: Callable[[InfrastructureFault], Exception] | None,
                   restartable: bool = True, **where: Any) -> T:
    """`attempt()`, run again after an InfrastructureFault (its services fresh, the interrupted
    instance from its start, its steps before the fault superseded, exactly as a resumed run
    would), up to INFRASTRUCTURE_RESTARTS times. Past that, or when not `restartable`, the fault
    goes on: as `exhausted(fault)` says, or unchanged when `exhausted` is None. The one restart
    policy of cells and collective users."""
    for restart in range(INFRASTRUCTURE_RESTARTS + 1):
        try:
            return attempt()
        except InfrastructureFault as exc:
            if not restartable or restart == INFRASTRUCTURE_RESTARTS:
                if exhausted is None:
                    raise
                raise exhausted(exc) from exc
            log.warning("infrastructure_fault_restart", fault=str(exc), restart=restart + 1, **where)
    raise AssertionError("unreachable")


class SlotDriver(ABC):
    """The instance loop, for a runner that has `grid`, `cell`, `cell_dir`, `paths`, `limits`,
    `fence` and `journal_tail`; while it runs, `services` (None: none, the state a host folder)
    and `state` (where the learner's state lives). A runner implements `_run` (its services and
    learner around `_run_slots`) and `_play` (its track's protocol for a slot)."""

    grid: GridConfig
    cell: Cell
    cell_dir: Path
    limits: Limits
    paths: Any  # CellPaths | UserPaths
    fence: Any  # CellFence | None: this attempt's fencing token (the Ray executor)
    services: CellServices | None
    state: StateVolume
    journal_tail: JournalTail | None
    unit = "instance"  # what the dollar cap's record calls a slot
    restarted = "the cell's services"  # what a restart after an infrastructure fault renews

    def run(self) -> str:
        """Run the cell to its end; returns "done", or "stopped" when a limit stopped it."""
        def attempt() -> str:
            try:
                self._run()
                return "done"
            except CellStopped as exc:
                log.warning("cell_stopped", cell=self.cell.cell, reason=str(exc))
                return "stopped"

        def exhausted(exc: InfrastructureFault) -> InfrastructureFault:
            return InfrastructureFault(
                f"{exc}; stopped after {INFRASTRUCTURE_RESTARTS} restarts of {self.restarted} "
                "(resume with `carc grid run --resume` once the cause is fixed)")

        with cell_lock(self.paths.lock, LOCK_TRIES if self.fence is None else FENCED_LOCK_TRIES, self.cell_dir):
            return run_restarting(attempt, exhausted, cell=self.cell.cell)

    @abstractmethod
    def _run(self) -> None:
        """One pass over the cell's unfinished slots, on fresh services."""

    @abstractmethod
    def _play(self, slot: ScheduledSlot, journal: EventLog) -> Play:
        """The slot's instance under the track's protocol."""

    def _run_slots(self, slots: list[ScheduledSlot], events: list[Event], journal: EventLog,
                   progress: Callable[[int, int], None], spend: SpendMeter | None = None,
                   prestart: Callable[[], None] | None = None, stop: threading.Event | None = None) -> int:
        """Every slot of `slots` without an instance_end in `events`, in order; returns how many
        ran. `spend`: the dollar cap is checked before each; `prestart`: the learner's standby
        start of the next instance, when it keeps the state; `stop`: checked before each."""
        finished = {e.slot for e in events if e.type == "instance_end"}
        ran = 0
        for position, slot in enumerate(slots):
            if slot.index in finished:
                continue
            if stop is not None and stop.is_set():
                break
            partial = current_attempt(events, slot.index)
            if spend is not None:
                self._check_limits(slot, spend, journal, started=bool(partial))
            try:
                self._run_slot(slot, journal, partial)
            except (InfrastructureFault, RecordsUnwritable, ReplayMismatch):
                raise
            except Exception as exc:  # outside the learner's turn: a wipe, a snapshot
                interrupt_on_fault(self.services, journal, lambda: self._event("infrastructure_fault", slot),
                                   f"{type(exc).__name__}: {exc}", cause=exc)
                raise
            if self.services is not None:
                self.services.set_slot(None, "between")
            following = slots[position + 1] if position + 1 < len(slots) else None
            if prestart is not None and following is not None and not following.wipe_before:
                prestart()  # its state is as it is now
            ran += 1
            progress(position + 1, len(slots))
        return ran

    def _check_limits(self, slot: ScheduledSlot, spend: SpendMeter, journal: EventLog,
                      started: bool) -> None:
        """Before an instance: stop the cell, recorded, when it has spent its dollars. An
        instance already begun (a resumed one) is finished first: a verdict is never cut off."""
        cap = self.grid.limits.usd_per_cell
        if cap is None or started:
            return
        spent = spend.total()
        if spent >= cap:
            reason = (f"limits.usd_per_cell: ${spent:.4f} spent of ${cap:.4f} before this {self.unit}; "
                      f"raise it and resume: carc grid run --resume {self.paths.run.root} "
                      "--usd-per-cell X")
            journal.append(self._event("stopped", slot, reason=reason, cost_usd=spent))
            raise CellStopped(reason)

    def _journal_usage(self, slot: int, since: float) -> Usage:
        if self.journal_tail is None:
            self.journal_tail = JournalTail(self.paths.journal / JOURNAL_FILE)
        return journaled_usage(self.journal_tail, slot, since)

    def _event(self, kind: str, slot: ScheduledSlot, **fields) -> Event:
        return Event(type=kind, cell=self.cell.cell, slot=slot.index, phase=slot.phase,
                     task=slot.task_id, visit=slot.visit, exposure=slot.exposure, t=time.time(),
                     **fields)

    # --- the state: restore, snapshot ----------------------------------------------------------

    def _restore(self, previous: ScheduledSlot | None) -> None:
        """Put the state back as it was after the last finished instance (empty before the first)."""
        self.state.restore(None if previous is None else self.paths.snapshot(previous.index))

    def _snapshot(self, slot: ScheduledSlot) -> list:
        """Snapshot the state after the instance (resume restores it); what it left out."""
        return self.state.snapshot(self.paths.snapshot(slot.index))

    # --- one instance -------------------------------------------------------------------------

    def _counts_by_journal(self) -> bool:
        """A harness does not count its calls; its proxy's journal does."""
        return self.services is not None and self.services.harness is not None

    def _set_slot(self, slot: ScheduledSlot, phase: str) -> None:
        if self.services is not None:
            self.services.set_slot(slot.index, phase)

    def _run_slot(self, slot: ScheduledSlot, journal: EventLog, partial: list[Event]) -> None:
        """One instance; `partial`: its current attempt's records (a resumed one), else empty."""
        play = self._play(slot, journal)
        if slot.wipe_before:
            self.state.wipe()
        self._set_slot(slot, "before")
        # when this attempt began: a harness's calls of this slot from before it were a
        # superseded attempt's (an infrastructure fault), not this instance's
        since = partial[0].t if partial else time.time()
        start = time.monotonic()
        deadline = start + self.limits.wall_clock_s
        play.open(partial, deadline)
        usage = recorded_usage(partial)
        steps = sum(e.type == "step" for e in partial)
        if partial:
            journal.append(self._event("resumed", slot, step=steps, cost=play.cost(), format=RECORDS_FORMAT,
                                       **play.record_fields()), durable=False)
        else:  # charges nothing: made durable by the next record (EventLog.append)
            journal.append(self._event("instance_start", slot, format=RECORDS_FORMAT,
                                       wiped_before=slot.wipe_before, **play.record_fields()), durable=False)
        lost_connection = lost_connection_test(self.cell.learner)

        def superseded() -> Event:
            """The fault's record, with what the attempt it ends spent (a harness's: journaled)."""
            spent = self._journal_usage(slot.index, since) if self._counts_by_journal() else usage
            return self._event("infrastructure_fault", slot, step=steps, **play.record_fields(),
                               **usage_fields(spent))

        def interrupt(context: str, settle: bool = False) -> None:
            """Before a charge: a fault under the instance ends this attempt, uncharged."""
            interrupt_on_fault(self.services, journal, superseded, context, settle)

        wall_clock = f"wall-clock limit of {self.limits.wall_clock_s:g} s exceeded"
        failure: LearnerFailure | None = None
        try:
            play.begin()
            while play.wants_turn(steps):
                move = play.move(steps, deadline)
                if isinstance(move, WallClock):
                    if not play.protocol.over:  # the wall clock fails it, charged in full
                        last = "" if move.last_reply is None else (
                            f"; the {play.who}'s last reply: {move.last_reply[:300]!r}")
                        interrupt(wall_clock + last)
                    play.protocol.expire(wall_clock, "wall-clock")
                    break
                said_lost = move.step.outcome == "malformed" and lost_connection(move.reply)
                if said_lost or move.charges:
                    interrupt(f"the {play.who}'s reply, {move.step.outcome}: {move.reply[:300]!r}",
                              settle=said_lost)
                journal.append(move.step)
                play.protocol = move.applied
                steps += 1
                usage = usage + move.usage
                if play.protocol.over:
                    self._set_slot(slot, "after")
                move.tell()
            if not play.protocol.over:  # the learner stopped, or the turn cap: charged in full
                no_verdict = play.no_verdict(steps)
                interrupt(no_verdict)
                play.protocol.expire(no_verdict, "no-verdict")
        except (RecordsUnwritable, InfrastructureFault, ReplayMismatch):
            raise  # not the learner's doing: the run stops (records) or the instance reruns (fault)
        except Exception as exc:  # a learner's failure must not take the run down; it fails the instance
            failure = play.failure(exc)
        if failure is not None:
            interrupt(f"the {play.who} saw: {failure.message}", settle=True)
            if failure.bug is not None:  # a bug's traceback, not a killed container's
                log.error("learner_error", cell=self.cell.cell, slot=slot.index, exc_info=failure.bug)
            journal.append(self._event("learner_error", slot, error=failure.message[:2000],
                                       failure_kind=failure.kind))
            if time.monotonic() > deadline:  # the turn was cut at the wall clock: that is why
                play.protocol.expire(wall_clock, "wall-clock")
            play.protocol.expire(failure.message[:300], failure.kind)
        try:
            play.end()
        except Exception as exc:
            # the verdict turn failed under a fault: what the learner keeps of this instance is lost
            interrupt(f"the {play.who}'s verdict turn failed: {exc}"[:500], settle=True)
            failure = failure or LearnerFailure(f"end: {exc}", "learner-error")
            if isinstance(exc, HarnessError):  # the harness failed the verdict turn: its reason says it
                log.warning("learner_end_error", cell=self.cell.cell, slot=slot.index, error=str(exc)[:500])
            else:
                log.exception("learner_end_error", cell=self.cell.cell, slot=slot.index)
            journal.append(self._event("learner_error", slot, error=f"end: {exc}"[:2000]))
        if failure is not None:  # whatever the failed harness left running ends; its volume stays
            try:
                self.state.recover()
            except Exception as exc:  # the next instance meets the harness as it is, and says so
                log.exception("recover_error", cell=self.cell.cell, slot=slot.index)
                journal.append(self._event("learner_error", slot, error=f"recover: {exc}"[:2000]))
        self.paths.append_transcript(slot.index, play.transcript())
        left_out = [entry.line() for entry in self._snapshot(slot)]
        try:  # a harness's logs (also those outside the volume), per instance
            self.state.collect_logs(self.paths.slot_logs(slot.index))
        except Exception as exc:  # a lost log must not lose the verdict
            log.warning("log_collection_failed", cell=self.cell.cell, slot=slot.index, error=str(exc))
        if self._counts_by_journal():
            usage = self._journal_usage(slot.index, since)
        protocol = play.protocol
        journal.append(self._event(
            "instance_end", slot, status=protocol.status.value, reason=protocol.failure_reason,
            failure_kind=protocol.failure_kind, malformed=protocol.malformed,
            wall_s=round(time.monotonic() - start, 4), **usage_fields(usage), **play.record_fields(),
            **play.end_record(), snapshot_left_out=left_out[:SNAPSHOT_LEFT_OUT_KEPT] or None,
            snapshot_left_out_n=len(left_out) or None))
