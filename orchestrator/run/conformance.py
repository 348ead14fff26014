"""Conformance of a harness adapter: a short real stream on the scripted model, then the checks.

`run_conformance` starts the scripted tool-using model (harness_adapters/scripted_model.py) on the
Docker bridge gateway, runs a memory-on and a memory-off cell of the harness through a short own
track in sequential order (real image, sandbox, proxy container, journal), and checks the records
(the scripted model writes a note naming the task on every instance's first message):

    persistence  memory-on keeps the first instance's note in its state (snapshot), and brings it
                 back in the opening request of a returning instance (journal)
    wipe         memory-off never shows a note of an earlier instance, in requests or snapshots
    journaling   every slot and every call the learner counted has a journal line; no errors but
                 404 probes of non-model paths and answered calls the harness hung up on
    instances    every instance ended exactly once with a protocol status, no learner errors
    verdict      the verdict reaches the harness in the same conversation as the task
    teardown     no container, network or volume of the run is left when its cells have ended

Every check reads the run folder tolerantly: a missing or broken file fails that check with the
reason, it never crashes the report. The checks are plain functions, tested on hand-made folders.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tarfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness_adapters.scripted_model import NOTE, scripted_model_server
from orchestrator.records import CellPaths, Event, RunPaths, read_events, standing
from orchestrator.run.grid_config import Cell
from proxy.journal import JOURNAL_FILE, JournalEntry, read_journal
from sandboxes.docker_sandbox import LABEL_RUN, prune

NOTE_PATTERN = re.compile(re.escape(NOTE).replace(re.escape("{task}"), r"(\S+)"))
TASK_PATTERN = re.compile(r"Task id: (\S+)")
MODEL_NAME = "carc-scripted"
PROTOCOL_STATUSES = ("solved", "failed")
CLIENT_ABORT = "Client disconnected"  # mitmproxy's flow error when the client hangs up
MAX_MEMBER_BYTES = 64 << 20  # a snapshot member bigger than this is not searched for notes


@dataclass(frozen=True)
class Check:
    """One conformance check: passed or not, and why (what was seen, or what to look at)."""

    name: str
    ok: bool
    reason: str


@dataclass
class ConformanceReport:
    """The checks of one conformance run; its records stay in `run_dir`."""

    harness: str
    run_id: str
    run_dir: Path
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> str:
        return json.dumps({"harness": self.harness, "run_id": self.run_id, "ok": self.ok,
                           "seconds": round(self.seconds, 1),
                           "checks": [dataclasses.asdict(c) for c in self.checks]}, indent=1)


def report_table(report: ConformanceReport) -> Table:
    table = Table("check", "", "reason", title=f"conformance of {report.harness} "
                  f"({report.run_id}, {report.seconds:.0f} s)", title_justify="left")
    for check in report.checks:
        table.add_row(check.name, "[green]pass[/green]" if check.ok else "[red]FAIL[/red]",
                      Text(check.reason))  # reasons quote harness errors like "[timeout] ...": no markup
    return table


def print_report(report: ConformanceReport, console: Console | None = None) -> None:
    (console or Console()).print(report_table(report))


# --- reading a cell folder ----------------------------------------------------------------------

@dataclass
class ConformanceCell:
    """What the checks read of one cell folder; `unreadable` says which record could not be read
    ("events" or "journal") and why."""

    folder: Path
    events: list[Event] = field(default_factory=list)
    journal: list[JournalEntry] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, folder: Path) -> "ConformanceCell":
        records = cls(folder)
        paths = CellPaths(folder)
        events, journal = paths.events, paths.journal / JOURNAL_FILE
        if not folder.is_dir():
            records.unreadable = dict.fromkeys(("events", "journal"), f"{folder}: no cell folder")
            return records
        try:
            if not events.exists():
                records.unreadable["events"] = f"{events}: missing"
            records.events = standing(read_events(events))  # what stands as the learner's
        except (OSError, ValueError) as exc:
            records.unreadable["events"] = str(exc)
        try:
            records.journal = sorted(read_journal(journal), key=lambda e: e.t_start)
        except FileNotFoundError:
            records.unreadable["journal"] = f"{journal}: missing"
        except (OSError, ValueError, TypeError) as exc:
            records.unreadable["journal"] = f"{journal}: {exc}"
        return records

    def slots(self) -> dict[int, tuple[str, int]]:
        """slot -> (task, visit), from the instance events."""
        return {e.slot: (e.task, e.visit) for e in self.events
                if e.type in ("instance_start", "instance_end")}

    def calls(self, slot: int) -> list[JournalEntry]:
        return [e for e in self.journal if e.slot == slot]

    def opening(self, slot: int, task: str) -> int | None:
        """Index in `calls(slot)` of the first request carrying the task's instance message: the
        model has not answered in this instance yet, so a note there came from the harness."""
        for number, entry in enumerate(self.calls(slot)):
            if task in TASK_PATTERN.findall(request_text(entry)):
                return number
        return None

    def snapshot(self, slot: int) -> Path:
        return CellPaths(self.folder).snapshot(slot)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def request_text(entry: JournalEntry) -> str:
    """Every string of a request body (messages, system prompt, tools), one per line."""
    return "\n".join(_strings(entry.request_body()))


def notes_in(text: str) -> set[str]:
    """The tasks whose scripted-model note appears in `text`."""
    return set(NOTE_PATTERN.findall(text))


def snapshot_notes(path: Path) -> set[str]:
    """The tasks whose note is in any file of a state snapshot (raises OSError / TarError)."""
    found: set[str] = set()
    with tarfile.open(path) as tar:
        for member in tar:
            if member.isfile() and member.size <= MAX_MEMBER_BYTES:
                data = tar.extractfile(member).read()
                found |= notes_in(data.decode("utf-8", errors="replace"))
    return found


def _unreadable(name: str, records: ConformanceCell, label: str,
                needs: tuple[str, ...] = ("events", "journal")) -> Check | None:
    """A failed check when a record the check needs is missing (or has no instances)."""
    problems = list(dict.fromkeys(records.unreadable[n] for n in needs if n in records.unreadable))
    if not problems and not records.slots():
        problems = [f"no instance events in {records.folder / 'events.jsonl'}"]
    return Check(name, False, f"{label}: " + "; ".join(problems)) if problems else None


def _has_verdict(entry: JournalEntry, task: str) -> bool:
    text = request_text(entry)
    return "Verdict:" in text and task in TASK_PATTERN.findall(text)


# --- the checks ---------------------------------------------------------------------------------

def check_note_kept(on: ConformanceCell) -> Check:
    """(a) memory-on's snapshot after the last instance still holds the first instance's note."""
    name = "persistence: note kept in state"
    if failed := _unreadable(name, on, "memory-on", ("events",)):
        return failed
    slots = on.slots()
    first_task, last = slots[min(slots)][0], max(slots)
    try:
        notes = snapshot_notes(on.snapshot(last))
    except (OSError, tarfile.TarError, EOFError) as exc:
        return Check(name, False, f"memory-on snapshot of slot {last}: {exc}")
    if first_task in notes:
        return Check(name, True, f"slot {last} snapshot holds {NOTE.format(task=first_task)!r}")
    return Check(name, False, f"the snapshot after slot {last} ({on.snapshot(last).name}) has no "
                 f"{NOTE.format(task=first_task)!r} (notes found: {sorted(notes) or 'none'}); "
                 f"the harness's memory did not land on /state or was not kept")


def check_note_returns(on: ConformanceCell) -> Check:
    """(a) the first instance's note is in the opening request of a returning instance."""
    name = "persistence: note back in a request"
    if failed := _unreadable(name, on, "memory-on"):
        return failed
    slots = on.slots()
    first_task = slots[min(slots)][0]
    note = NOTE.format(task=first_task)
    returning = sorted(s for s, (task, visit) in slots.items() if task == first_task and visit > 0)
    if not returning:
        return Check(name, False, f"memory-on: task {first_task} never returns in this stream")
    seen = []
    for slot in returning:
        opening = on.opening(slot, first_task)
        if opening is None:
            seen.append(f"slot {slot}: no request holds 'Task id: {first_task}'")
        elif first_task in notes_in(request_text(on.calls(slot)[opening])):
            return Check(name, True, f"slot {slot} (visit {slots[slot][1]}): call {opening + 1} "
                         f"of the instance holds {note!r}")
        else:
            seen.append(f"slot {slot}: the opening request has no note")
    return Check(name, False, "; ".join(seen) + " (the harness does not bring its memory back "
                 "into a new conversation)")


def check_no_leak_in_requests(off: ConformanceCell) -> Check:
    """(b) memory-off never sends the model a note written on an earlier instance."""
    name = "wipe: no earlier note in requests"
    if failed := _unreadable(name, off, "memory-off"):
        return failed
    leaks = []
    for slot, (task, _) in sorted(off.slots().items()):
        opening = off.opening(slot, task)
        for number, entry in enumerate(off.calls(slot)):
            notes = notes_in(request_text(entry))
            earlier = notes - {task}
            if task in notes and (opening is None or number <= opening):
                earlier.add(task)  # before the model answered in this instance: left over
            if earlier:
                leaks.append(f"slot {slot} call {number + 1} ({entry.id}): notes of {sorted(earlier)}")
    if leaks:
        return Check(name, False, "memory-off leaked: " + "; ".join(leaks[:5]))
    return Check(name, True, f"{len(off.journal)} requests, none with an earlier note")


def check_no_leak_in_snapshots(off: ConformanceCell) -> Check:
    """(b) each memory-off snapshot holds at most the current instance's note."""
    name = "wipe: snapshots hold only the current note"
    if failed := _unreadable(name, off, "memory-off", ("events",)):
        return failed
    problems = []
    for slot, (task, _) in sorted(off.slots().items()):
        try:
            extra = snapshot_notes(off.snapshot(slot)) - {task}
        except (OSError, tarfile.TarError, EOFError) as exc:
            problems.append(f"slot {slot}: {exc}")
            continue
        if extra:
            problems.append(f"slot {slot} (task {task}) holds notes of {sorted(extra)}")
    if problems:
        return Check(name, False, "memory-off: " + "; ".join(problems[:5]))
    return Check(name, True, f"{len(off.slots())} snapshots, each with at most its own note")


def expected_probe(entry: JournalEntry) -> bool:
    """A 404 on a non-model path: harnesses probe for optional endpoints (/api/tags, /props)."""
    return entry.status == 404 and entry.api == "other"


def client_abort(entry: JournalEntry) -> bool:
    """The harness dropped a call the model answered (hermes' background review may): the line
    is complete, the harness just did not wait for the end."""
    return entry.status is not None and entry.status < 400 and not entry.refused \
        and all(p.strip().startswith(CLIENT_ABORT) for p in (entry.error or "").split(";"))


def journal_failure(entry: JournalEntry) -> bool:
    failed = entry.error or entry.refused or entry.status is None or entry.status >= 400
    return bool(failed) and not expected_probe(entry) and not client_abort(entry)


def check_journaling(cells: dict[str, ConformanceCell]) -> Check:
    """(c) every slot and every learner-counted call has a journal line; no journal errors."""
    name = "journaling"
    problems, lines, aborts = [], 0, 0
    for label, records in cells.items():
        if failed := _unreadable(name, records, label):
            problems.append(failed.reason)
            continue
        lines += len(records.journal)
        counted = {e.slot: e.model_calls for e in records.events
                   if e.type == "instance_end" and e.model_calls is not None}
        for slot in sorted(records.slots()):
            model_lines = [e for e in records.calls(slot) if e.api != "other"]
            if not records.calls(slot):
                problems.append(f"{label} slot {slot}: no journal line")
            elif counted.get(slot, 0) > len(model_lines):
                problems.append(f"{label} slot {slot}: the learner counted {counted[slot]} model "
                                f"calls, the journal has {len(model_lines)}")
        aborts += sum(1 for entry in records.journal if entry.error and client_abort(entry))
        for entry in filter(journal_failure, records.journal):
            problems.append(f"{label} {entry.method} {entry.url} -> {entry.status}: "
                            f"{(entry.error or 'no answer')[:160]}")
    if problems:
        return Check(name, False, "; ".join(problems[:6]))
    dropped = f"; {aborts} answered calls the harness hung up on" if aborts else ""
    return Check(name, True, f"{lines} journal lines, every slot and counted call journaled{dropped}")


def check_instances(cells: dict[str, ConformanceCell], expected: int | None) -> Check:
    """(d) every instance ended exactly once with a protocol status; no learner errors."""
    name = "instances end once, replies parsed"
    problems, malformed = [], 0
    for label, records in cells.items():
        if failed := _unreadable(name, records, label, ("events",)):
            problems.append(failed.reason)
            continue
        ends = [e for e in records.events if e.type == "instance_end"]
        count = Counter(e.slot for e in ends)
        wanted = range(expected) if expected is not None else sorted(records.slots())
        missing = [s for s in wanted if s not in count]
        twice = sorted(s for s, n in count.items() if n > 1)
        strays = sorted(s for s in count if s not in wanted)
        if missing or twice or strays:
            problems.append(f"{label}: instance_end missing for slots {missing}, repeated for "
                            f"{twice}, unexpected for {strays}")
        bad = [f"slot {e.slot}: {e.status!r}" for e in ends if e.status not in PROTOCOL_STATUSES]
        if bad:
            problems.append(f"{label}: not a protocol status: {', '.join(bad)}")
        errors = [e for e in records.events if e.type == "learner_error"]
        if errors:
            problems.append(f"{label}: {len(errors)} learner errors, first (slot {errors[0].slot}): "
                            f"{(errors[0].error or '')[:200]}")
        malformed += sum(1 for e in records.events if e.type == "step" and e.outcome == "malformed")
    if problems:
        return Check(name, False, "; ".join(problems))
    return Check(name, True, f"every instance ended once; {malformed} malformed replies answered")


def check_verdict_in_conversation(cells: dict[str, ConformanceCell]) -> Check:
    """(e) a call after the verdict carries both the verdict and the instance's task id."""
    name = "verdict in the same conversation"
    problems, found = [], []
    for label, records in cells.items():
        if failed := _unreadable(name, records, label):
            problems.append(failed.reason)
            continue
        slots = records.slots()
        hits = {e.slot for e in records.journal
                if e.phase == "after" and e.slot in slots and _has_verdict(e, slots[e.slot][0])}
        if hits:
            found.append(f"{label}: {len(hits)} of {len(slots)} instances")
        else:
            problems.append(f"{label}: no call after a verdict holds 'Verdict:' and the instance's "
                            f"'Task id:' (the verdict went to a new conversation, or nowhere)")
    if problems:
        return Check(name, False, "; ".join(problems))
    return Check(name, True, "; ".join(found))


@dataclass(frozen=True)
class DockerObject:
    """A container, network or volume as the teardown check sees it."""

    kind: str  # container | network | volume
    name: str
    labels: dict[str, str]


def docker_objects(client=None) -> list[DockerObject]:
    """Every container, network and volume carrying carc's run label (any run)."""
    from sandboxes.images import docker_client
    client = client or docker_client()
    filters = {"label": LABEL_RUN}
    found = [DockerObject("container", c.name, c.labels or {})
             for c in client.containers.list(all=True, filters=filters, ignore_removed=True)]
    found += [DockerObject("network", n.name, n.attrs.get("Labels") or {})
              for n in client.networks.list(filters=filters)]
    found += [DockerObject("volume", v.name, v.attrs.get("Labels") or {})
              for v in client.volumes.list(filters=filters)]
    return found


def check_teardown(run_id: str, objects: list[DockerObject]) -> Check:
    """(f) nothing labelled with the run is left once its cells ended (before any prune)."""
    left = [f"{o.kind} {o.name}" for o in objects if o.labels.get(LABEL_RUN) == run_id]
    if left:
        return Check("clean teardown", False, f"left behind: {', '.join(left)} "
                     f"(`carc sandboxes prune --run {run_id}` removes them)")
    return Check("clean teardown", True, f"no container, network or volume labelled {run_id}")


# --- the run ------------------------------------------------------------------------------------

def conformance_cells(name: str, seed: int, effort: str) -> dict[str, Cell]:
    return {row: Cell(learner=name, row=row, model=MODEL_NAME, effort=effort, order="sequential",
                      seed=seed, track="own") for row in ("memory-on", "memory-off")}


def grid_text(name: str, endpoint: str, tasks: int, visits: int, seed: int, effort: str) -> str:
    return yaml.safe_dump({
        "name": f"conformance-{name}", "seed": seed,
        "track": {"name": "own", "tasks": tasks, "visits": visits, "epilogue": 0,
                  "fresh_reference": False},
        "orders": ["sequential"], "model": {"endpoint": endpoint, "name": MODEL_NAME},
        "efforts": [effort],
        "learners": [name, {"learner": name, "row": "memory-off"}], "workers": 2}, sort_keys=False)


def run_stream(name: str, run_dir: Path, cells: dict[str, Cell], tasks: int, visits: int,
               seed: int, effort: str, show_progress: bool) -> tuple[Check, int | None]:
    """Run the two cells on the scripted model; the check says whether the stream ran, and how
    many instances each cell has (None when the grid did not load)."""
    from orchestrator.run.grid_config import load_grid
    from orchestrator.run.local_pool import execute
    from orchestrator.run.schedule import build_schedule

    started, expected = time.monotonic(), None
    try:
        with scripted_model_server() as endpoint:
            grid_path = RunPaths(run_dir).grid
            grid_path.write_text(grid_text(name, endpoint, tasks, visits, seed, effort))
            expected = len(build_schedule(load_grid(grid_path), cells["memory-on"]))
            # no closing prune: it would hide what the cells' teardowns left behind
            execute(run_dir, show_progress=show_progress, prune_at_end=False)
    except Exception as exc:  # a failed check; the records are still checked, as far as they go
        return Check("stream ran", False, f"{type(exc).__name__}: {exc}"), expected
    return Check("stream ran", True, f"{len(cells)} cells x {expected} instances in "
                 f"{time.monotonic() - started:.0f} s"), expected


def run_conformance(name: str, workdir: Path, tasks: int = 2, visits: int = 2, seed: int = 5,
                    effort: str = "low", show_progress: bool = False) -> ConformanceReport:
    """Run registered harness `name` through a short stream on the scripted model in
    `workdir/runs/<run-id>/`, check the records, and remove the run's Docker objects."""
    started = time.monotonic()
    run_id = f"conformance-{name}-{uuid.uuid4().hex[:6]}"
    run_dir = Path(workdir) / "runs" / run_id
    RunPaths(run_dir).cells.mkdir(parents=True)
    cells = conformance_cells(name, seed, effort)
    ran, expected = run_stream(name, run_dir, cells, tasks, visits, seed, effort, show_progress)
    try:
        teardown = check_teardown(run_id, docker_objects())
    except Exception as exc:
        teardown = Check("clean teardown", False, f"could not list Docker objects: {exc}")
    try:
        prune(run=run_id)
    except Exception:  # the teardown check already says what was left
        pass
    records = {row: ConformanceCell.load(RunPaths(run_dir).cell(cell.cell).root) for row, cell in cells.items()}
    on, off = records["memory-on"], records["memory-off"]
    report = ConformanceReport(name, run_id, run_dir, [
        ran, check_note_kept(on), check_note_returns(on),
        check_no_leak_in_requests(off), check_no_leak_in_snapshots(off),
        check_journaling(records), check_instances(records, expected),
        check_verdict_in_conversation(records), teardown])
    report.seconds = time.monotonic() - started
    (run_dir / "conformance.json").write_text(report.to_json())
    return report
