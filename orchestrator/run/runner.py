"""The cell runner: one learner through its schedule, with append-only records and exact resume.

For every slot: (wipe the state if the row says so) -> instance_start -> the conversation, one
fsynced `step` event per action before the learner hears the answer -> learner.end -> snapshot of
the state -> instance_end. A killed run resumes at the first slot without an instance_end: the
state is restored from the previous slot's snapshot, the protocol is rebuilt by replaying the
logged steps (nothing is charged twice), and the learner gets its conversation back.

Nothing is charged to the learner while its infrastructure is broken: before a wrong answer is
adopted, at every instance end that charges, after a learner error and after a harness reply that
tells of a lost model connection, the cell's services are asked for a fault (`interrupt_on_fault`).
A fault is journaled (`infrastructure_fault`) and the instance runs again from its start on fresh
services; its steps before the fault are superseded (`records.standing`), never replayed.
"""

from __future__ import annotations

import copy
import fcntl
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import structlog

from harness_adapters import registry
from harness_adapters.base import InstanceView, Learner, StepRecord
from harness_adapters.chat_model import ChatModel, ModelUnavailable, Usage
from harness_adapters.harness import HarnessError
from orchestrator.arc import as_grid
from orchestrator.prompts import PromptSet
from orchestrator.protocol import (Action, DemoGiven, FailureKind, Finished, InstanceProtocol, Malformed,
                                   MalformedReply, Outcome, Refused, Status, Verdict, extract_action)
from orchestrator.records import (RECORDS_FORMAT, SNAPSHOT_LEFT_OUT_KEPT, CellFence, CellPaths, Event,
                                  EventLog, RecordsUnwritable, current_attempt, read_events, truncate_torn_tail)
from orchestrator.run.cell_services import CellServices, cell_services, ladder_learner
from orchestrator.run.grid_config import HARNESSES, Cell, GridConfig, price_table
from orchestrator.run.schedule import ScheduledSlot, build_schedule
from orchestrator.tasks.base import ArcInstance
from proxy.journal import JOURNAL_FILE, JournalTail

log = structlog.get_logger("carc.runner")

# A learner that keeps talking after the verdict (harnesses may) is stopped after this many turns.
MAX_TURNS_AFTER_OVER = 4
# How often a cell's services are restarted after an infrastructure fault before the cell stops.
INFRASTRUCTURE_RESTARTS = 2
# After a sign that the infrastructure failed (a learner error, a harness's reply telling of a lost
# connection) and no fault seen yet: the wait before the services are asked again.
FAULT_SETTLE_S = 2.0


class CellStopped(Exception):
    """The cell reached a limit of the grid (limits.usd_per_cell) before an instance: it stops
    cleanly, recorded, and continues on resume once the limit is raised."""


class InfrastructureFault(RuntimeError):
    """The cell's proxy or a container stopped under an instance. Never charged to the learner:
    the instance is journaled as interrupted and run again from its start."""


def interrupt_on_fault(services: CellServices | None, journal: EventLog, event: Callable[[], Event],
                       context: str, settle: bool = False, cause: BaseException | None = None) -> None:
    """Ask the cell's services for an infrastructure fault before anything is charged; when one is
    found, journal `event()` (an `infrastructure_fault`) with it and `context` (what the learner
    saw, or what failed), and raise InfrastructureFault: nothing is charged, and the instance runs
    again from its start. `settle`: there is a sign of a fault, so services that report none are
    asked once more after FAULT_SETTLE_S (a container being killed can end a stream before the
    engine says it stopped). The one place every runner (grid, collective, arc3) asks; returns
    when there is no fault."""
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


def charges_a_failure(outcome: Outcome, before: InstanceProtocol, after: InstanceProtocol) -> bool:
    """Whether a step charges the learner for failing: a wrong answer, or the step that ends the
    instance failed (the malformed cap)."""
    return ((isinstance(outcome, Verdict) and not outcome.correct)
            or (after.over and not before.over and after.status is not Status.SOLVED))

MAX_TURNS = 200
LOCK_TRIES = 30  # x 0.1 s
# A fenced attempt (Ray executor) may find the stale attempt it replaced still holding the lock
# until that one's next record is refused: it waits this long for it.
FENCED_LOCK_TRIES = 6000  # x 0.1 s


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


def outcome_from_event(event: Event, instance: ArcInstance) -> Outcome:
    """Rebuild the outcome a step event recorded (for replay to a resumed learner)."""
    label = event.outcome
    if label == "demo":
        number = event.demos_used or 0
        return DemoGiven(instance.demos[number - 1], number)
    if label in ("correct", "incorrect"):
        return Verdict(label == "correct", bool(event.over))
    if label == "refused":
        return Refused(event.message or "")
    if label == "malformed":
        return MalformedReply(event.message or "", bool(event.over))
    return Finished()


def action_from_event(event: Event) -> Action | Malformed:
    data = event.action or {}
    if "malformed" in data:
        return Malformed(data["malformed"])
    grid = as_grid(data["grid"]) if "grid" in data else None
    return Action(data["action"], grid)


@dataclass
class CellRunner:
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
        for folder in (self.paths.state, self.paths.snapshots, self.paths.transcripts):
            folder.mkdir(parents=True, exist_ok=True)
        self.cell.record().write(self.paths.settings)
        self.limits = self.grid.limits.limits()
        self.prompts = PromptSet.load(self.grid.prompts)

    def run(self) -> str:
        """Run the cell to its end; returns "done", or "stopped" when a limit stopped it."""
        lock = open(self.paths.lock, "w")
        # `carc status` tries the lock for an instant to see whether the cell runs: a short wait
        # tells that from another runner, which holds it for the whole cell.
        tries = LOCK_TRIES if self.fence is None else FENCED_LOCK_TRIES
        for attempt in range(tries):
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == tries - 1:
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
                            f"{exc}; stopped after {INFRASTRUCTURE_RESTARTS} restarts of the cell's "
                            f"services (resume with `carc grid run --resume` once the cause is fixed)") from exc
                    # Fresh services, and the interrupted instance run again from its start (its
                    # steps before the fault superseded), exactly as a resumed run would.
                    log.warning("infrastructure_fault_restart", cell=self.cell.cell, fault=str(exc),
                                restart=restart + 1)
        finally:
            lock.close()

    def _run(self) -> None:
        schedule = build_schedule(self.grid, self.cell)
        truncate_torn_tail(self.events_path)
        events = read_events(self.events_path)
        finished = {e.slot for e in events if e.type == "instance_end"}
        with cell_services(self.grid, self.cell, self.cell_dir, self.model_base_url) as services:
            self.services = services
            endpoint = self.grid.model.endpoint_for(self.cell.effort, services.model_base_url)
            price = price_table(self.grid).lookup(self.grid.model.name)
            if price is not None:  # the learner counts its dollars as the proxy does
                endpoint = endpoint.model_copy(update={"input_usd_per_mtok": price.input_per_m,
                                                       "output_usd_per_mtok": price.output_per_m})
            if services.proxy is not None:  # the proxy injects the real key; the learner has none
                endpoint = endpoint.model_copy(update={"api_key_env": ""})
            learner = services.harness or ladder_learner(
                self.cell, self.state_dir, self.prompts, ChatModel(endpoint), services.executor)
            try:
                with EventLog(self.events_path, self.fence) as journal:
                    if events:  # resuming: the state must be as it was after the last finished slot
                        done = [s for s in schedule if s.index in finished]
                        self._restore(done[-1] if done else None)
                    spend = SpendMeter(self.paths, services.proxy is not None)
                    for position, slot in enumerate(schedule):
                        if slot.index in finished:
                            continue
                        partial = current_attempt(events, slot.index)
                        self._check_limits(slot, spend, journal, started=bool(partial))
                        try:
                            self._run_slot(slot, learner, journal, partial)
                        except (InfrastructureFault, RecordsUnwritable):
                            raise
                        except Exception as exc:  # outside the learner's turn: a wipe, a snapshot
                            interrupt_on_fault(services, journal, lambda: self._event("infrastructure_fault", slot),
                                               f"{type(exc).__name__}: {exc}", cause=exc)
                            raise
                        services.set_slot(None, "between")
                        following = schedule[position + 1] if position + 1 < len(schedule) else None
                        if (following is not None and not following.wipe_before
                                and self.grid.sandbox.standby):  # its state is as it is now
                            learner.prestart()
                        self.progress(position + 1, len(schedule))
            finally:
                learner.close()

    def _check_limits(self, slot: ScheduledSlot, spend: "SpendMeter", journal: EventLog,
                      started: bool) -> None:
        """Before an instance: stop the cell, recorded, when it has spent its dollars. An
        instance already begun (a resumed one) is finished first: a verdict is never cut off."""
        cap = self.grid.limits.usd_per_cell
        if cap is None or started:
            return
        spent = spend.total()
        if spent >= cap:
            reason = (f"limits.usd_per_cell: ${spent:.4f} spent of ${cap:.4f} before this instance; "
                      f"raise it and resume: carc grid run --resume {self.paths.run.root} "
                      "--usd-per-cell X")
            journal.append(self._event("stopped", slot, reason=reason, cost_usd=spent))
            raise CellStopped(reason)

    def _journal_usage(self, slot: int, since: float) -> Usage:
        if self.journal_tail is None:
            self.journal_tail = JournalTail(self.paths.journal / JOURNAL_FILE)
        return journaled_usage(self.journal_tail, slot, since)

    # --- state volume: wipe, snapshot, restore --------------------------------------------------

    def _restore(self, previous: ScheduledSlot | None) -> None:
        """Put the state back as it was after the last finished instance (empty before the first)."""
        source = None if previous is None else self.paths.snapshot(previous.index)
        self.services.state.restore(source)

    # --- one instance -------------------------------------------------------------------------

    def _event(self, kind: str, slot: ScheduledSlot, **fields) -> Event:
        return Event(type=kind, cell=self.cell.cell, slot=slot.index, phase=slot.phase,
                     task=slot.task_id, visit=slot.visit, exposure=slot.exposure, t=time.time(),
                     **fields)

    def _run_slot(self, slot: ScheduledSlot, learner: Learner, journal: EventLog,
                  partial: list[Event]) -> None:
        """One instance; `partial`: its current attempt's records (a resumed one), else empty."""
        instance = slot.instance()
        protocol = InstanceProtocol(instance, self.limits)
        history: list[StepRecord] = []
        usage = Usage()
        if slot.wipe_before:
            self.services.state.wipe()
        self.services.set_slot(slot.index, "after" if protocol.over else "before")
        # when this attempt began: a harness's calls of this slot from before it were a
        # superseded attempt's (an infrastructure fault), not this instance's
        since = partial[0].t if partial else time.time()
        if partial:
            for event in partial:
                if event.type != "step":
                    continue
                action = action_from_event(event)
                outcome = protocol.step(action)
                assert outcome_label(outcome) == event.outcome, (
                    f"{self.events_path}: replay of slot {slot.index} step {event.step} disagrees")
                history.append(StepRecord(action, outcome, event.reply or "", event.note or {}))
                usage = usage + Usage(event.model_calls or 0, event.prompt_tokens or 0,
                                      event.completion_tokens or 0, event.model_s or 0.0,
                                      event.cost_usd or 0.0)
            journal.append(self._event("resumed", slot, step=len(history), cost=protocol.cost,
                                       format=RECORDS_FORMAT), durable=False)
        else:  # charges nothing: made durable by the next record (EventLog.append)
            journal.append(self._event("instance_start", slot, format=RECORDS_FORMAT,
                                       wiped_before=slot.wipe_before), durable=False)
        start = time.monotonic()
        deadline = start + self.limits.wall_clock_s
        learner_error: tuple[str, FailureKind] | None = None
        crashed: Exception | None = None
        step_no = len(history)
        lost_connection = lost_connection_test(self.cell.learner)

        def superseded() -> Event:
            """The fault's record, with what the attempt it ends spent (a harness's: journaled)."""
            spent = usage if self.services.harness is None else self._journal_usage(slot.index, since)
            return self._event("infrastructure_fault", slot, step=step_no, model_calls=spent.calls,
                               prompt_tokens=spent.prompt_tokens, completion_tokens=spent.completion_tokens,
                               model_s=round(spent.seconds, 4), cost_usd=spent.usd)

        def interrupt(context: str, settle: bool = False) -> None:
            """Before a charge: a fault under the instance ends this attempt, uncharged."""
            interrupt_on_fault(self.services, journal, superseded, context, settle)

        # The deadline reaches the learner: a harness turn or model call is cut at the wall clock.
        view = InstanceView(slot.task_id, instance.test_input, protocol.wrong,
                            protocol.demos_used, tuple(history), deadline=deadline)
        wall_clock = f"wall-clock limit of {self.limits.wall_clock_s:g} s exceeded"
        try:
            learner.begin(view)
            turns_after_over = 0
            while not protocol.finished and step_no < MAX_TURNS:
                if protocol.over:
                    if not learner.talks_after_verdict:
                        break
                    turns_after_over += 1
                    if turns_after_over > MAX_TURNS_AFTER_OVER:
                        break
                turn = learner.act()
                action = turn.action if turn.action is not None else extract_action(turn.text)
                if time.monotonic() > deadline:
                    if not protocol.over:  # the wall clock fails it, charged in full
                        interrupt(f"{wall_clock}; the learner's last reply: {(turn.text or '')[:300]!r}")
                    protocol.expire(wall_clock, "wall-clock")
                    break
                # The step is applied to a copy and adopted only once its event is on disk, so
                # an action is never in effect without its record.
                applied = copy.copy(protocol)
                outcome = applied.step(action)
                said_lost = isinstance(outcome, MalformedReply) and lost_connection(turn.text or "")
                if said_lost or charges_a_failure(outcome, protocol, applied):
                    interrupt(f"the learner's reply, {outcome_label(outcome)}: {(turn.text or '')[:300]!r}",
                              settle=said_lost)
                journal.append(self._event(
                    "step", slot, step=step_no + 1,
                    action=action.to_json() if isinstance(action, Action) else {"malformed": action.reason},
                    reply=turn.text or None, outcome=outcome_label(outcome),
                    message=getattr(outcome, "reason", None), note=turn.note or None,
                    cost=applied.cost, demos_used=applied.demos_used,
                    attempts_used=applied.wrong, malformed=applied.malformed,
                    over=applied.over, model_calls=turn.usage.calls,
                    prompt_tokens=turn.usage.prompt_tokens,
                    completion_tokens=turn.usage.completion_tokens,
                    model_s=round(turn.usage.seconds, 4), cost_usd=turn.usage.usd))
                protocol = applied
                step_no += 1
                usage = usage + turn.usage
                if protocol.over:
                    self.services.set_slot(slot.index, "after")
                learner.observe(outcome, protocol.wrong, protocol.demos_used)
            if not protocol.over:  # the learner stopped, or MAX_TURNS: charged in full below
                interrupt(f"the conversation ended after {step_no} turns without a verdict")
        except (RecordsUnwritable, InfrastructureFault):
            raise  # not the learner's doing: the run stops (records) or the instance reruns (fault)
        except ModelUnavailable as exc:
            learner_error = f"model unavailable: {exc}", "model-unavailable"
        except HarnessError as exc:
            learner_error = str(exc), exc.kind.value
        except Exception as exc:  # a learner bug must not take the run down; it fails the instance
            learner_error = f"learner error: {type(exc).__name__}: {exc}", "learner-error"
            crashed = exc
        if learner_error:
            interrupt(f"the learner saw: {learner_error[0]}", settle=True)
            if crashed is not None:  # a bug's traceback, not a killed container's
                log.error("learner_error", cell=self.cell.cell, slot=slot.index, exc_info=crashed)
            error, kind = learner_error
            journal.append(self._event("learner_error", slot, error=error[:2000], failure_kind=kind))
            if time.monotonic() > deadline:  # the turn was cut at the wall clock: that is why
                protocol.expire(wall_clock, "wall-clock")
            protocol.expire(error[:300], kind)
        elif not protocol.over:
            protocol.expire(f"the conversation ended after {step_no} turns without a verdict", "no-verdict")
        try:
            learner.end(protocol.status.value == "solved")
        except Exception as exc:
            # the verdict turn failed under a fault: what the learner keeps of this instance is lost
            interrupt(f"the learner's verdict turn failed: {exc}"[:500], settle=True)
            learner_error = learner_error or (f"end: {exc}", "learner-error")
            if isinstance(exc, HarnessError):  # the harness failed the verdict turn: its reason says it
                log.warning("learner_end_error", cell=self.cell.cell, slot=slot.index, error=str(exc)[:500])
            else:
                log.exception("learner_end_error", cell=self.cell.cell, slot=slot.index)
            journal.append(self._event("learner_error", slot, error=f"end: {exc}"[:2000]))
        if learner_error:  # whatever the failed harness left running ends; its volume stays
            try:
                self.services.state.recover()
            except Exception as exc:  # the next instance meets the harness as it is, and says so
                log.exception("recover_error", cell=self.cell.cell, slot=slot.index)
                journal.append(self._event("learner_error", slot, error=f"recover: {exc}"[:2000]))
        self._keep_transcript(slot, learner.transcript())
        left_out = [entry.line() for entry in self._snapshot(slot)]
        try:  # a harness's logs (also those outside the volume), per instance
            self.services.state.collect_logs(self.paths.slot_logs(slot.index))
        except Exception as exc:  # a lost log must not lose the verdict
            log.warning("log_collection_failed", cell=self.cell.cell, slot=slot.index, error=str(exc))
        if self.services.harness is not None:  # a harness does not count its calls; the proxy does
            usage = self._journal_usage(slot.index, since)
        journal.append(self._event(
            "instance_end", slot, status=protocol.status.value, cost=protocol.cost,
            reason=protocol.failure_reason, failure_kind=protocol.failure_kind,
            demos_used=protocol.demos_used,
            attempts_used=protocol.wrong, malformed=protocol.malformed,
            first_submit_demos=protocol.first_submit_demos,
            first_answer_correct=protocol.first_answer_correct,
            wall_s=round(time.monotonic() - start, 4), model_calls=usage.calls,
            prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
            model_s=round(usage.seconds, 4), cost_usd=usage.usd,
            snapshot_left_out=left_out[:SNAPSHOT_LEFT_OUT_KEPT] or None, snapshot_left_out_n=len(left_out) or None))


    def _keep_transcript(self, slot: ScheduledSlot, transcript: list) -> None:
        self.paths.transcript(slot.index).write_text(json.dumps(transcript, indent=1))

    def _snapshot(self, slot: ScheduledSlot) -> list:
        """Snapshot the state after the instance (resume restores it); what it left out."""
        return self.services.state.snapshot(self.paths.snapshot(slot.index))


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
