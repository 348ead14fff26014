"""One cell's records as the runner wrote them: settings, instances, journal, transcripts.

Layout read (orchestrator/records.py): `cell.json`, `sandbox.json`, `events.jsonl` (or `.zst` /
`.gz`), `journal/journal.jsonl`, `transcripts/NNNNN.json`, `snapshots/NNNNN.tar.gz`, `logs/NNNNN/`;
a collective grid's harness user the same in `users/uNNNN/`, its transcripts in one gzip file.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.records import CellPaths, Event, UserPaths, standing
from orchestrator.rows import STATELESS_ROWS, row_name
from proxy.journal import JOURNAL_FILE, JournalEntry
from stores_inspector.reading import Problems, read_json, read_jsonl

GRID = re.compile(r"\[\s*\[[\d,\s\[\]]*\]\s*\]")
MIN_GRID_CHARS = 13  # "[[1,2],[3,4]]": smaller grids are too common to name a task


def compact_grid(text: str) -> str:
    return re.sub(r"\s+", "", text)


@dataclass
class Instance:
    """One instance slot: its task, when it started, acted, got its verdict, and what it cost."""

    slot: int
    task: str
    visit: int
    exposure: int
    phase: str
    start_t: float | None = None
    first_action_t: float | None = None
    verdict_t: float | None = None  # the step that ended the protocol (last verdict)
    end_t: float | None = None
    status: str | None = None
    cost: int | None = None
    demos_used: int | None = None
    first_submit_demos: int | None = None
    first_answer_correct: bool | None = None

    wiped_before: bool | None = None  # carc emptied the state volume before this instance

    @property
    def returning(self) -> bool:
        return self.visit > 0


@dataclass
class InspectedCell:
    name: str
    folder: Path
    settings: dict[str, Any]
    harness: str | None
    instances: dict[int, Instance]
    journal: list[JournalEntry]
    transcripts: dict[int, list[Any]]
    problems: Problems
    _starts: list[tuple[float, int]] = field(default_factory=list)

    @classmethod
    def read(cls, folder: Path) -> "InspectedCell":
        """A cell folder, or a collective grid's user folder (`cells/<row>/users/uNNNN/`, named
        `<row>/uNNNN`: the row's settings, the user's own records)."""
        user = is_user_folder(folder)
        name = f"{folder.parent.parent.name}/{folder.name}" if user else folder.name
        problems = Problems(name)
        paths = UserPaths(folder) if user else CellPaths(folder)
        settings_path = paths.cell.settings if user else paths.settings
        settings = read_json(_read(settings_path, problems, required=True), "cell.json", problems) or {}
        sandbox = read_json(_read(paths.sandbox, problems), "sandbox.json", problems) or {}
        harness = sandbox.get("harness") or settings.get("learner")
        instances = _instances(folder, problems)
        for instance in instances.values():
            if instance.wiped_before is None:  # format 1 records do not say: the row's rule then
                instance.wiped_before = row_name(settings.get("row")) in STATELESS_ROWS or instance.phase == "fresh"
        transcripts = _transcripts(paths, problems)
        records = cls(name, folder, settings, harness, instances, _journal(folder, problems), transcripts,
                      problems)
        records._starts = sorted((i.start_t, i.slot) for i in records.instances.values() if i.start_t)
        return records

    @property
    def row(self) -> str:
        return self.settings.get("row", "")

    def slot_at(self, t: float) -> int | None:
        """The instance slot running (or last run) at time t; None before the first."""
        index = bisect.bisect_right(self._starts, (t, float("inf"))) - 1
        return self._starts[index][1] if index >= 0 else None

    def call_slot(self, entry: JournalEntry) -> int | None:
        """The slot a call belongs to: its tag, or for a call between instances the one before."""
        return entry.slot if entry.slot is not None else self.slot_at(entry.t_start)

    def protocol_texts(self, slot: int) -> list[str]:
        """The messages carc itself sent in this instance (task id, test input, demos, verdicts)."""
        texts = []
        for turn in self.transcripts.get(slot, []):
            if isinstance(turn, dict):
                text = turn.get("user") if "user" in turn else (
                    turn.get("content") if turn.get("role") == "user" else None)
                if isinstance(text, str) and text:
                    texts.append(text)
        return texts

    def task_grids(self) -> dict[str, set[str]]:
        """Grid texts (compact JSON) seen in each task's instances, from the transcripts."""
        grids: dict[str, set[str]] = {}
        for slot, instance in self.instances.items():
            for text in self.protocol_texts(slot):
                for match in GRID.findall(text):
                    grid = compact_grid(match)
                    if len(grid) >= MIN_GRID_CHARS:
                        grids.setdefault(instance.task, set()).add(grid)
        return grids


def _read(path: Path, problems: Problems, required: bool = False) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        if required:
            problems.add(path.name, "missing")
        return None
    except OSError as exc:
        problems.add(path.name, f"unreadable ({exc})")
        return None


def _first_existing(folder: Path, names: tuple[str, ...]) -> Path | None:
    return next((folder / n for n in names if (folder / n).exists()), None)


def _instances(folder: Path, problems: Problems) -> dict[int, Instance]:
    log = CellPaths(folder).events  # also read compressed, as an archived run may keep it
    path = _first_existing(folder, (log.name, f"{log.name}.zst", f"{log.name}.gz"))
    if path is None:
        problems.add("events.jsonl", "missing: no instances, the timeline has no task names")
        return {}
    known = set(Event.model_fields)
    events = []
    for row in read_jsonl(_read(path, problems), path.name, problems):
        try:
            events.append(Event.model_validate({k: v for k, v in row.items() if k in known}))
        except (ValueError, AttributeError) as exc:
            problems.add(path.name, f"an event skipped ({str(exc)[:200]})")
    instances: dict[int, Instance] = {}
    for event in standing(events):  # an instance rerun after an infrastructure fault: its rerun
        instance = instances.setdefault(event.slot, Instance(
            event.slot, event.task, event.visit, event.exposure, event.phase))
        if event.type in ("instance_start", "resumed") and instance.start_t is None:
            instance.start_t = event.t
        if event.type == "instance_start" and event.wiped_before is not None:
            instance.wiped_before = event.wiped_before
        elif event.type == "step":
            if instance.first_action_t is None:
                instance.first_action_t = event.t
            if event.over and instance.verdict_t is None:
                instance.verdict_t = event.t
        elif event.type == "instance_end":
            instance.end_t, instance.status, instance.cost = event.t, event.status, event.cost
            instance.demos_used, instance.first_submit_demos = event.demos_used, event.first_submit_demos
            instance.first_answer_correct = event.first_answer_correct
            if event.snapshot_left_out_n:
                shown = "; ".join(f"{_shorten(line.split(chr(9))[0])} ({line.split(chr(9))[-1]})"
                                  for line in (event.snapshot_left_out or [])[:3])
                problems.add(f"snapshots/{event.slot:05d}.tar.gz",
                             f"carc left {event.snapshot_left_out_n} file(s) of the state out of this "
                             f"snapshot, e.g. {shown}: what the inspector says of them is unknown")
    return instances


def _shorten(path: str, keep: int = 60) -> str:
    return path if len(path) <= 2 * keep else f"{path[:keep]}…{path[-keep:]}"


def _journal(folder: Path, problems: Problems) -> list[JournalEntry]:
    path = _first_existing(CellPaths(folder).journal, (JOURNAL_FILE, f"{JOURNAL_FILE}.zst", f"{JOURNAL_FILE}.gz"))
    if path is None:
        problems.add("journal/journal.jsonl", "missing: no mechanisms from model calls, no return check")
        return []
    entries = []
    for row in read_jsonl(_read(path, problems), f"journal/{path.name}", problems):
        try:
            entries.append(JournalEntry.from_json(json.dumps(row), path.parent))
        except (TypeError, ValueError) as exc:
            problems.add(f"journal/{path.name}", f"an entry skipped ({str(exc)[:200]})")
    return sorted(entries, key=lambda e: e.t_start or 0.0)


def is_user_folder(folder: Path) -> bool:
    return folder.parent.name == "users" and (folder.parent.parent / "cell.json").exists()


def _transcripts(paths: CellPaths, problems: Problems) -> dict[int, list[Any]]:
    """A cell's or user's conversations by slot (an arc3 level's record keeps its conversation)."""
    try:
        kept = paths.read_transcripts(problems.add)
    except OSError as exc:
        problems.add(paths.transcripts_file.name, f"unreadable ({exc})")
        return {}
    return {slot: value if isinstance(value, list) else [] for slot, value in kept.items()}
