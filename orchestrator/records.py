"""Run records: the append-only event log of a cell, its instance results, and their one serializer.

Layout of a run directory (SPEC section 8):

    runs/<run-id>/grid.yaml                  the grid as run (validated, normalised)
    runs/<run-id>/cells/<cell-id>/cell.json  the cell's settings
    .../events.jsonl                         one line per instance start, action, verdict, end
    .../summary.json                         per-instance results and the cell's totals
    .../transcripts/<slot>.json              the learner's conversation per instance
    .../state/                               the learner's private state (volume for harnesses)
    .../snapshots/<slot>.tar.gz              the state after each finished instance

Every event is written, flushed and fsynced before the learner is answered, so a killed run
never loses a verdict the learner saw; resume replays the log and charges nothing twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

EventType = Literal["instance_start", "step", "instance_end", "resumed", "learner_error"]
Phase = Literal["stream", "epilogue", "fresh"]


class Event(BaseModel):
    """One line of `events.jsonl`. Fields not relevant to a type are left out of the line."""

    model_config = ConfigDict(extra="forbid")

    type: EventType
    cell: str
    slot: int
    phase: Phase
    task: str
    visit: int
    exposure: int
    t: float  # unix time the event was written
    # step events
    step: int | None = None
    action: dict[str, Any] | None = None  # the parsed action, or {"malformed": reason}
    reply: str | None = None  # the learner's reply text that carried the action
    outcome: str | None = None  # demo | correct | incorrect | refused | malformed | finished
    message: str | None = None  # what the learner was told (reason of a refusal or malformation)
    note: dict[str, Any] | None = None  # learner's own note (e.g. the program that made a submission)
    cost: int | None = None  # instance cost so far, after this step
    demos_used: int | None = None
    attempts_used: int | None = None
    malformed: int | None = None
    over: bool | None = None
    # model compute for this step (journaled, not scored)
    model_calls: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model_s: float | None = None
    cost_usd: float | None = None
    # instance_end
    status: str | None = None
    reason: str | None = None
    first_submit_demos: int | None = None
    first_answer_correct: bool | None = None
    wall_s: float | None = None
    error: str | None = None

    def line(self) -> str:
        return self.model_dump_json(exclude_none=True)


class EventLog:
    """Append-only, fsynced JSON-lines log of one cell."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")

    def append(self, event: Event) -> None:
        self._fh.write(event.line() + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: Path) -> list[Event]:
    """Every complete event line of a log. A torn last line (killed mid-write) is ignored."""
    if not path.exists():
        return []
    events = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.endswith("\n"):
                break  # the writer died mid-line; that event was never acknowledged
            try:
                events.append(Event.model_validate_json(line))
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a valid event: {exc}") from exc
    return events


def truncate_torn_tail(path: Path) -> None:
    """Drop a partial last line so appends start on a fresh line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with open(path, "r+b") as fh:
            fh.truncate(cut)


def write_json(path: Path, value: Any) -> None:
    """Write JSON atomically (temp file + rename) so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
