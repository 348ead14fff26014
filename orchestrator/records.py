"""The run folder: its layout (`RunPaths`, `CellPaths`), and its typed records with one serializer.

    runs/<run-id>/
      grid.yaml                 the validated grid, paths resolved: the only grid resume reads
      grid.original.yaml        the grid file as the user wrote it (for the audit)
      prompts.yaml, labels.*    copies of the files the grid names, so the folder resumes alone
      report.md, report.html    the report (orchestrator/analysis), rendered from results/
      results/                  instances.parquet (one row per instance), measures.parquet
                                (every number of the report, long format, unrounded)
      inspect/                  what the harnesses kept (stores_inspector)
      logs/                     the embedded model servers' logs and usage counts
      cells/<cell-id>/
        cell.json               the cell's settings (`CellRecord`)
        sandbox.json            how the cell was isolated (`SandboxRecord`)
        events.jsonl            one fsynced `Event` per instance start, action + verdict, end
        journal/                the proxy journal: journal.jsonl, raw/, slot.json
        transcripts.jsonl.gz    the learner's conversation per instance: one gzip member per
                                instance ({"slot", "messages"}), appended at its end (a slot run
                                again appends again; the last member is the one read). Runs of
                                carc before 2026-12-08 kept transcripts/<slot>.json: still read.
        state/                  a ladder learner's private state (a harness's is its volume)
        snapshots/<slot>.tar.gz the state after each finished instance (resume restores these)
        logs/<slot>/            what a harness's logs gained during the instance
      cells/<cell-id>/ of a collective grid (orchestrator/run/collective/): cell.json, sandbox.json,
                                journal/ (one proxy for every user of the row), and
        users/u<user>/          per user: events.jsonl (events carry user and round), state/,
                                snapshots/ (only the latest: the state after the user's last
                                finished instance), transcripts.jsonl.gz (as a cell's)
        shared/round-<r>/       the shared state users read during round r (the learner's own
                                layout), written whole by the update step; update.json says what
                                went into it

Every event is written, flushed and fsynced before the learner is answered, so a killed run
never loses a verdict the learner saw; resume replays the log and charges nothing twice.
Every reader and writer of the folder takes its paths from here.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import time
import zlib
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal

from pydantic import BaseModel, ConfigDict

from orchestrator import fault_points
from orchestrator.errors import MachineError
from orchestrator.protocol import FailureKind

# infrastructure_fault: the cell's proxy or a container stopped under an instance; nothing is charged
# for it and the instance is run again from its start (after the services restart, or on resume):
# the slot's events before it are superseded (`standing`).
# stopped: the cell reached a limit (limits.usd_per_cell) before this slot's instance began; the
# slot was not started, and runs on resume once the limit is raised.
EventType = Literal["instance_start", "step", "instance_end", "resumed", "learner_error",
                    "infrastructure_fault", "stopped"]
Phase = Literal["stream", "epilogue", "fresh"]
# Version of the records below; readers take a record without one as format 1 (before wiped_before,
# failure_kind and the typed cell and sandbox records).
RECORDS_FORMAT = 2


class RunPaths:
    """Where everything of one run lives (the tree in the module docstring)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.grid = self.root / "grid.yaml"
        self.grid_original = self.root / "grid.original.yaml"
        self.cells = self.root / "cells"
        self.logs = self.root / "logs"
        self.report_md = self.root / "report.md"
        self.report_html = self.root / "report.html"
        self.results = self.root / "results"
        self.inspect = self.root / "inspect"

    @property
    def name(self) -> str:
        return self.root.resolve().name

    def cell(self, cell_id: str) -> "CellPaths":
        return CellPaths(self.cells / cell_id)

    def cell_folders(self) -> list["CellPaths"]:
        """Every cell folder of the run, by name."""
        if not self.cells.is_dir():
            return []
        return [CellPaths(p) for p in sorted(self.cells.iterdir()) if p.is_dir()]


class CellPaths:
    """Where everything of one cell lives."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.settings = self.root / "cell.json"
        self.sandbox = self.root / "sandbox.json"
        self.events = self.root / "events.jsonl"
        self.journal = self.root / "journal"
        self.transcripts_file = self.root / "transcripts.jsonl.gz"
        self.transcripts_legacy = self.root / "transcripts"  # <slot>.json: runs before 2026-12-08
        self.state = self.root / "state"
        self.snapshots = self.root / "snapshots"
        self.logs = self.root / "logs"
        self.lock = self.root / ".lock"
        self.attempt = self.root / "attempt.json"  # the fencing token of the cell's current attempt
        self.attempt_lock = self.root / ".attempt.lock"

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def run(self) -> RunPaths:
        return RunPaths(self.root.parent.parent)

    def snapshot(self, slot: int) -> Path:
        return self.snapshots / f"{slot:05d}.tar.gz"

    def append_transcript(self, slot: int, messages: Any) -> None:
        """The instance's conversation, as one gzip member appended to the cell's (or user's)
        transcripts file: written whole at the instance's end, so a kill tears at most this one."""
        line = json.dumps({"slot": slot, "messages": messages}, ensure_ascii=False) + "\n"
        with gzip.open(self.transcripts_file, "ab", compresslevel=3) as handle:
            handle.write(line.encode("utf-8", "surrogatepass"))

    def read_transcripts(self, problem: Callable[[str, str], None] | None = None) -> dict[int, Any]:
        """The conversations by slot: the last member for a slot run twice; a member torn by a
        kill is skipped. An older run's `transcripts/<slot>.json` files are read first (a resumed
        old run has both). A file or member that is not a record is reported to `problem` (the
        file's name, what is wrong) and skipped; without `problem`, it raises ValueError."""
        def bad(name: str, message: str) -> None:
            if problem is None:
                raise ValueError(f"{self.root / name}: {message}")
            problem(name, message)

        out: dict[int, Any] = {}
        if self.transcripts_legacy.is_dir():
            for path in sorted(self.transcripts_legacy.glob("*.json")):
                if path.stem.isdigit():
                    try:
                        out[int(path.stem)] = json.loads(path.read_text(encoding="utf-8"))
                    except (OSError, ValueError) as exc:
                        bad(f"transcripts/{path.name}", f"unreadable ({exc})")
        if not self.transcripts_file.exists():
            return out
        try:
            with gzip.open(self.transcripts_file, "rt", encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if not line.endswith("\n"):
                        continue  # torn by a kill
                    try:
                        record = json.loads(line)
                        out[int(record["slot"])] = record["messages"]
                    except (ValueError, KeyError, TypeError) as exc:
                        bad(self.transcripts_file.name, f"line {number} is not a transcript record ({exc})")
        except (EOFError, gzip.BadGzipFile, zlib.error):  # the last member was cut short by a kill
            pass
        return out

    def slot_logs(self, slot: int) -> Path:
        return self.logs / f"{slot:05d}"

    # --- a collective grid's cell: one folder per user, the shared state per round ----------

    @property
    def users(self) -> Path:
        return self.root / "users"

    def user(self, user: int) -> "UserPaths":
        return UserPaths(self.users / f"u{user:04d}")

    def user_folders(self) -> list["UserPaths"]:
        if not self.users.is_dir():
            return []
        return [UserPaths(p) for p in sorted(self.users.iterdir()) if p.is_dir()]

    def shared_round(self, number: int) -> Path:
        return self.root / "shared" / f"round-{number:03d}"


class UserPaths(CellPaths):
    """One user of a collective grid's cell: a cell's layout, inside the cell's `users/`."""

    @property
    def number(self) -> int:
        return int(self.root.name.removeprefix("u"))

    @property
    def cell(self) -> CellPaths:
        return CellPaths(self.root.parent.parent)

    @property
    def run(self) -> RunPaths:
        return self.cell.run

    def latest_snapshot(self) -> Path | None:
        """The user's state after its last instance so far (None before its first)."""
        found = sorted(self.snapshots.glob("*.tar.gz"))
        return found[-1] if found else None


class JsonRecord(BaseModel):
    """A record kept as one JSON file (written atomically), read back typed."""

    model_config = ConfigDict(extra="ignore")  # a newer carc's extra fields do not stop an older reader

    @classmethod
    def read(cls, path: Path) -> "JsonRecord":
        return cls.model_validate_json(path.read_text(encoding="utf-8"))

    def write(self, path: Path) -> None:
        write_json(path, self.model_dump())


class CellRecord(JsonRecord):
    """`cell.json`: the settings of one cell (what the report and the inspector group by)."""

    cell: str
    label: str
    learner: str
    row: str = "memory-on"
    model: str
    effort: str
    order: str
    seed: int
    track: str
    format: int = 1


class SandboxRecord(JsonRecord):
    """`sandbox.json`: how a cell was isolated, for the audit (one key set for every cell)."""

    proxy: Literal["host-mitmdump", "container"] | None  # None: no journaling proxy
    model_base_url: str  # what the learner called
    upstream: str  # where the proxy forwarded to
    program_checks: str | None = None  # where programs ran: host-process, or the engine's name (docker)
    image: str | None = None
    container: str | None = None
    harness: str | None = None
    version: str | None = None  # the harness's pinned version
    format: int = RECORDS_FORMAT


SNAPSHOT_LEFT_OUT_KEPT = 50


class Event(BaseModel):
    """One line of `events.jsonl`. Fields not relevant to a type are left out of the line."""

    model_config = ConfigDict(extra="forbid", use_enum_values=True)  # failure_kind: its string

    type: EventType
    cell: str
    slot: int
    phase: Phase
    task: str
    visit: int
    exposure: int
    t: float  # unix time the event was written
    format: int | None = None  # RECORDS_FORMAT, on instance_start and resumed (absent: format 1)
    wiped_before: bool | None = None  # instance_start: the learner's state was emptied before it
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
    failure_kind: FailureKind | None = None  # instance_end of a failed instance, and learner_error
    # instance_end: files of the learner's state its snapshot did not keep ("path<TAB>bytes<TAB>why",
    # at most SNAPSHOT_LEFT_OUT_KEPT of them; `snapshot_left_out_n` counts them all)
    snapshot_left_out: list[str] | None = None
    snapshot_left_out_n: int | None = None
    # arc3: the level served (0-based; instance_start, instance_end), and on instance_end the
    # instance's full charge: 5 x the level's human baseline (absent: the grid tracks' 16)
    level: int | None = None
    budget: int | None = None
    # the collective regime: the user whose stream this is, and the round the slot is in
    user: int | None = None
    round: int | None = None

    def line(self) -> str:
        """The event as one JSON line. Never fails on a string a learner sent: text that UTF-8
        cannot carry (a lone surrogate, e.g. a reply cut mid-emoji) is written as JSON escapes,
        which read back to the same string."""
        fields = self.model_dump(mode="json", exclude_none=True)
        text = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = json.dumps(fields, ensure_ascii=True, separators=(",", ":"))
        return text

    @classmethod
    def from_line(cls, line: str) -> "Event":
        return cls.model_validate(json.loads(line))


class RecordsUnwritable(MachineError):
    """The run folder would not take a record (disk full, permissions, a lost mount): the run
    stops here, and nothing is charged to the learner for it; resume starts from the last
    record written."""


def last_stop(events: list[Event]) -> Event | None:
    """The `stopped` event a cell ended on, or None when it ran on after it (or never stopped)."""
    last = next((e for e in reversed(events) if e.type in ("stopped", "instance_start", "resumed")), None)
    return last if last is not None and last.type == "stopped" else None


def standing(events: Iterable[Event]) -> list[Event]:
    """The events that stand, in order: an instance under which the infrastructure failed runs
    again from its start, so a slot's events before its last `infrastructure_fault` (per user)
    are superseded and left out; the faults themselves stay. Every reader of steps or of an
    unfinished instance reads through this, so a superseded step never counts as the learner's."""
    events = list(events)
    last = {(e.user, e.slot): i for i, e in enumerate(events) if e.type == "infrastructure_fault"}
    return [e for i, e in enumerate(events)
            if e.type == "infrastructure_fault" or i > last.get((e.user, e.slot), -1)]


def current_attempt(events: Iterable[Event], slot: int) -> list[Event]:
    """The slot's records of its current attempt (a resumed instance replays these): its standing
    events but the stops and faults. Empty: the instance starts afresh."""
    return [e for e in standing(events) if e.slot == slot and e.type not in ("stopped", "infrastructure_fault")]


class StaleAttempt(RecordsUnwritable):
    """A later attempt of this cell took its folder (the Ray executor retried the cell after its
    node was lost, while this attempt still runs, e.g. on a partitioned node): this attempt writes
    no more records and stops."""


class CellFence:
    """The fencing token of one attempt at a cell (`attempt.json` in the cell's folder).

    `take` makes the next token the cell's current one, so every earlier attempt is stale from
    then on; `held` checks, under the fence's lock, that this attempt's token is still the current
    one, and the caller writes while it holds it: a stale attempt can never append after the
    attempt that replaced it read the folder. `attempt.json` also lists every attempt (token,
    holder, time), for the audit. The lock is flock(2) on `.attempt.lock` beside it (NFSv4
    carries it between machines)."""

    def __init__(self, root: Path | str, token: int, holder: str):
        self.paths = CellPaths(root)
        self.token = token
        self.holder = holder

    @classmethod
    @contextmanager
    def _locked(cls, paths: CellPaths) -> Iterator[None]:
        paths.root.mkdir(parents=True, exist_ok=True)
        with open(paths.attempt_lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @staticmethod
    def read(root: Path | str) -> dict[str, Any]:
        """The cell's attempt record: {"token": current, "attempts": [{token, holder, t}, ...]}."""
        path = CellPaths(root).attempt
        if not path.exists():
            return {"token": 0, "attempts": []}
        return json.loads(path.read_text(encoding="utf-8"))

    @classmethod
    def take(cls, root: Path | str, holder: str) -> "CellFence":
        """A new attempt at the cell: its token is the current one + 1 (fsynced before it returns)."""
        paths = CellPaths(root)
        with cls._locked(paths):
            record = cls.read(root)
            token = int(record["token"]) + 1
            record = {"token": token,
                      "attempts": [*record["attempts"], {"token": token, "holder": holder, "t": time.time()}]}
            tmp = paths.attempt.with_name(paths.attempt.name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(record, indent=1))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, paths.attempt)
        return cls(root, token, holder)

    def stale(self, current: dict[str, Any]) -> StaleAttempt:
        newer = current["attempts"][-1] if current.get("attempts") else {}
        return StaleAttempt(
            f"{self.paths.attempt}: attempt {self.token} of cell {self.paths.name} ({self.holder}) is "
            f"stale: attempt {current['token']} ({newer.get('holder', '?')}) took the cell over; this "
            "attempt writes nothing more and stops (the newer one continues from the records)")

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the fence while writing a record; `StaleAttempt` when a newer attempt took it."""
        with self._locked(self.paths):
            current = self.read(self.paths.root)
            if int(current["token"]) != self.token:
                raise self.stale(current)
            yield

    def written(self, path: Path, line: str) -> None:
        """After a record is on this node's disk, under the fence: in the run folder itself
        (shared), nothing more; the Ray executor's `HeadFence` sends it to the head."""


class EventLog:
    """Append-only, fsynced JSON-lines log of one cell. With a fence (an attempt of the Ray
    executor), every append first proves the attempt is still the cell's current one."""

    def __init__(self, path: Path, fence: CellFence | None = None):
        self.path = path
        self.fence = fence
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")
        self._unsynced = False

    def append(self, event: Event, durable: bool = True) -> None:
        """Write, flush and fsync one event. A failed write raises `RecordsUnwritable` (a stale
        attempt's, `StaleAttempt`, before anything is written); a line it left torn is what
        `read_events` already skips.

        `durable=False` (only for a record that charges nothing and decides nothing, such as
        instance_start) writes and flushes it, so a killed process keeps it, and leaves its fsync
        to the next record's, which every charge or verdict comes with: only a machine that
        loses power before that record can lose it, and then the slot reads as not yet begun,
        which is how resume would have treated it anyway (nothing of it was charged)."""
        line = event.line() + "\n"
        try:
            with self.fence.held() if self.fence is not None else nullcontext():
                self._write(line, durable)
                if self.fence is not None:
                    self.fence.written(self.path, line)
        except (OSError, ValueError) as exc:  # the fence could not be locked or read
            raise RecordsUnwritable(f"{self.path}: cannot check this attempt's fence ({exc}); "
                                    "fix the folder, then resume the run") from exc
        fault_points.reached(self.path, event.type, event.slot)  # a test's named fault, if armed

    def _write(self, line: str, durable: bool = True) -> None:
        try:
            self._fh.write(line)
            self._fh.flush()
            if durable:
                os.fsync(self._fh.fileno())  # also makes every line before it durable
            self._unsynced = not durable
        except OSError as exc:
            raise RecordsUnwritable(f"{self.path}: cannot append an event ({exc.strerror or exc}); "
                                    "free space or fix the folder, then resume the run") from exc

    def close(self) -> None:
        try:
            if self._unsynced:
                os.fsync(self._fh.fileno())
        finally:
            self._fh.close()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: Path, kind: EventType | None = None) -> list[Event]:
    """Every complete event line of a log, or only those of type `kind` (a line that does not
    name it is not parsed: a collective run's steps are millions). A torn last line (killed
    mid-write) is ignored."""
    if not path.exists():
        return []
    events = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.endswith("\n"):
                break  # the writer died mid-line; that event was never acknowledged
            if kind is not None and f'"{kind}"' not in line:
                continue
            try:
                event = Event.from_line(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a valid event: {exc}") from exc
            if kind is None or event.type == kind:
                events.append(event)
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
    write_text(path, json.dumps(value, indent=1, sort_keys=True))


def write_text(path: Path, text: str) -> None:
    """Write text atomically (temp file + rename) so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
