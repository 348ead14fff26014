"""The proxy journal: one JSON line per model call, and the slot control file the proxy reads.

Stdlib only: the mitmproxy addon imports this inside the proxy's own environment, and the
orchestrator and inspector import it in carc's environment, where mitmproxy is not installed.

Layout of a journal directory:

    journal.jsonl            one `JournalEntry` per line, flushed and fsynced before the proxy
                             answers the next hook; the parsed request body is on the line, or
                             (a proxy started with `carc_requests=raw`: the collective regime's
                             row proxies, whose requests carry whole libraries) only in raw/,
                             read back by `JournalEntry.request_body`
    raw/<id>.req.gz          the request as the client sent it (HTTP/1 form, placeholder key;
                             in reverse mode the Host header already names the upstream)
    raw/<id>.resp.gz         the response as the client received it (HTTP/1 form, de-chunked)
    proxy.ready              {"pid", "listen", "t"}: the addon is loaded and the proxy listens
    in-flight.jsonl          a `begin` line (the entry as far as known) for each call forwarded
                             upstream and an `end` line once its journal line is written; a proxy
                             killed mid-call leaves a begin without an end, and the next writer of
                             the journal (a restarted proxy, or the host at teardown:
                             `settle_in_flight`) journals it as an error line, so the journal
                             counts every call the upstream may have billed
    .writer.lock             flock(2)ed by the journal's one writer while it lives: a proxy of a
                             killed run can outlive it by a second or more (its parent's death
                             signals it, and it shuts down), and the next writer waits for it to
                             end before it cuts a torn tail or settles the calls left in flight

The slot control file is owned by the orchestrator (the sandbox cannot reach it): it says which
instance slot the cell is on and whether the verdict has been given, so every call is tagged with
the slot and phase it happened in.
"""

from __future__ import annotations

import dataclasses
import fcntl
import gzip
import json
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

Phase = Literal["before", "after", "between"]
Mode = Literal["reverse", "regular", "dns"]
Api = Literal["openai-chat", "openai-responses", "anthropic-messages", "other"]

JOURNAL_FILE = "journal.jsonl"
RAW_DIR = "raw"
READY_FILE = "proxy.ready"  # written by the addon once it is loaded and the proxy listens
IN_FLIGHT_FILE = "in-flight.jsonl"
IN_FLIGHT_COMPACT_BYTES = 1 << 20
WRITER_LOCK_FILE = ".writer.lock"
WRITER_WAIT_S = 60.0  # how long a new writer waits for the last one to end
# The size of a call's request over this is its prompt tokens' upper bound, for pricing a call
# whose answer was never seen (a token is rarely under 3 bytes of JSON).
BYTES_PER_TOKEN_AT_LEAST = 3
PHASES: tuple[str, ...] = get_args(Phase)


@dataclass
class JournalEntry:
    """One model call (or one refused attempt) as the proxy saw it."""

    id: str  # the mitmproxy flow id; names the raw files
    cell: str
    slot: int | None  # instance slot from the control file when the request arrived
    phase: Phase | None  # before / after the verdict, or between instances
    mode: Mode
    method: str
    url: str
    host: str
    api: Api
    model: str | None
    stream: bool
    status: int | None  # HTTP status the client got; None when no response arrived
    refused: bool  # the proxy refused it (host not allowlisted) and nothing went upstream
    request: Any  # parsed JSON request body, or None
    response: Any  # parsed JSON response body, or the reassembled stream, or None
    t_start: float  # unix seconds: request headers arrived at the proxy
    t_first_byte: float | None  # first response byte (first body chunk for streams)
    t_end: float
    latency_s: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None  # None when the model has no price in the table
    error: str | None = None  # why the call did not end in a 2xx answer, or what went wrong
    raw_request: str | None = None  # path of the gzip file, relative to the journal directory
    raw_response: str | None = None
    user: int | None = None  # the collective regime's user (from the call's tag), else None
    request_kept: Literal["inline", "raw"] = "inline"  # where the JSON request body is: `request`, or raw_request only
    directory: Path | None = field(default=None, repr=False, compare=False)  # the journal's; set on reading

    def to_json(self) -> str:
        """The entry as one JSON line (no trailing newline)."""
        data = dataclasses.asdict(self)
        del data["directory"]
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str, directory: Path | None = None) -> JournalEntry:
        """Parse one journal line; keys this version does not know are ignored."""
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError(f"a journal line must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} - {"directory"}
        return cls(**{k: v for k, v in data.items() if k in known}, directory=directory)

    def request_body(self) -> Any:
        """The parsed JSON request body: the line's own, or the one in raw/ when the proxy kept
        it only there; None when there is none (or it is not JSON)."""
        if self.request_kept != "raw":
            return self.request
        if self.raw_request is None or self.directory is None:
            return None
        return raw_body(self.directory / self.raw_request)


def raw_body(path: Path) -> Any:
    """The JSON body of a raw request file (HTTP/1 head, blank line, body as sent, gzipped by
    `JournalWriter.write_raw`); None when the body is empty, encoded oddly or not JSON."""
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            coding = value.strip().lower()
            if coding not in (b"gzip", b"deflate"):
                return None
            try:
                body = zlib.decompress(body, 47 if coding == b"gzip" else 15)
            except zlib.error:
                return None
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def read_journal(path: str | os.PathLike[str]) -> list[JournalEntry]:
    """All entries of a journal file (or of `journal.jsonl` in a directory).

    A torn last line (the proxy was killed mid-write) is skipped; a bad line anywhere else is an
    error naming the file and line.
    """
    path = Path(path)
    if path.is_dir():
        path = path / JOURNAL_FILE
    lines = path.read_text(encoding="utf-8").split("\n")
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entries.append(JournalEntry.from_json(line, path.parent))
        except (ValueError, TypeError) as e:
            if number == len(lines):  # no newline after it: the write was cut off
                break
            raise ValueError(f"{path}:{number}: not a journal entry ({e})") from e
    return entries


class JournalWriter:
    """Appends entries and raw payloads to a journal directory; every line is fsynced.

    A line is either whole in the file or not there at all: a write the disk refuses half-way
    (ENOSPC) is cut back off before the error goes on, and a torn last line left by a proxy killed
    mid-write is cut off when the next proxy opens the journal, so a later line never lands on the
    end of a torn one."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        (self.directory / RAW_DIR).mkdir(parents=True, exist_ok=True)
        self._lock_fd = _sole_writer(self.directory)
        self.path = self.directory / JOURNAL_FILE
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _cut_torn_tail(self._fd, self.path)
        self.in_flight_path = self.directory / IN_FLIGHT_FILE
        self.abandoned = self._settle_abandoned()
        self._in_flight_fd = os.open(self.in_flight_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._open_calls: set[str] = set()

    def begin(self, entry: JournalEntry) -> None:
        """Mark a call as in flight (its entry as known when it went upstream) until `settled`:
        one appended line, not synced (it has to outlive the proxy's process, not the machine)."""
        os.write(self._in_flight_fd, ('{"begin":' + entry.to_json() + "}\n").encode())
        self._open_calls.add(entry.id)

    def settled(self, entry_id: str) -> None:
        """The call's line is written: it is no longer in flight. With none in flight, a grown
        marker file is emptied (a row proxy makes millions of calls)."""
        if entry_id not in self._open_calls:
            return
        self._open_calls.discard(entry_id)
        os.write(self._in_flight_fd, ('{"end":' + json.dumps(entry_id) + "}\n").encode())
        if not self._open_calls and os.fstat(self._in_flight_fd).st_size > IN_FLIGHT_COMPACT_BYTES:
            os.ftruncate(self._in_flight_fd, 0)

    def _settle_abandoned(self) -> int:
        """Journal the calls a previous proxy of this journal left in flight (it was killed):
        an error line each, priced at most as their request could cost; returns how many."""
        try:
            text = self.in_flight_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return 0
        begun: dict[str, JournalEntry] = {}
        ended: set[str] = set()
        for line in text.splitlines():
            try:
                mark = json.loads(line)
                if "begin" in mark:
                    entry = JournalEntry.from_json(json.dumps(mark["begin"]))
                    begun[entry.id] = entry
                else:
                    ended.add(mark["end"])
            except (ValueError, TypeError, KeyError, AttributeError):
                continue  # a line torn by the kill
        left = [entry for id_, entry in begun.items() if id_ not in ended]
        if left:
            written = {e.id for e in read_journal(self.path)}
            now = time.time()
            for entry in left:
                if entry.id in written:  # killed between its line and its end mark
                    continue
                entry.t_end, entry.latency_s = now, now - entry.t_start
                entry.error = ("the proxy stopped while this call was in flight (killed, or its "
                               "container died): no answer was journaled; found "
                               f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))} when the "
                               "journal was next opened" + (entry.error or ""))
                self.write(entry)
        os.truncate(self.in_flight_path, 0)
        return len(left)

    def write(self, entry: JournalEntry) -> None:
        self.write_line(entry.to_json())

    def write_line(self, line: str) -> None:
        """Append one already-serialized entry; durable when this returns."""
        data = (line + "\n").encode("utf-8")
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass  # the reader skips a torn last line; the next open cuts it
            raise

    def write_raw(self, entry_id: str, kind: Literal["req", "resp"], data: bytes) -> str:
        """Store raw bytes gzip-compressed; returns the path relative to the journal directory."""
        relative = f"{RAW_DIR}/{entry_id}.{kind}.gz"
        with gzip.open(self.directory / relative, "wb", compresslevel=3) as f:  # 2x faster than 6, 75% of its ratio
            f.write(data)
        return relative

    def close(self) -> None:
        os.close(self._fd)
        os.close(self._in_flight_fd)
        os.close(self._lock_fd)  # the next writer may start


def _sole_writer(directory: Path, wait_s: float | None = None) -> int:
    """The journal's writer lock, held (an open descriptor) until the writer closes or dies. Waits
    for a writer still alive, such as the proxy of a run killed a moment ago."""
    wait_s = WRITER_WAIT_S if wait_s is None else wait_s
    fd = os.open(directory / WRITER_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise TimeoutError(
                    f"{directory}: another proxy still writes this journal after {wait_s:.0f} s "
                    f"(it holds {WRITER_LOCK_FILE}); end it (`fuser {directory / WRITER_LOCK_FILE}` "
                    "names it) and start again") from None
            time.sleep(0.05)


def settle_in_flight(directory: str | os.PathLike[str]) -> int:
    """After a journal's proxy stopped for good (teardown): journal the calls it left in flight.
    Never while a proxy still writes the journal. Returns how many were found."""
    directory = Path(directory)
    marks = directory / IN_FLIGHT_FILE
    if not marks.is_file() or marks.stat().st_size == 0:
        return 0
    writer = JournalWriter(directory)
    writer.close()
    return writer.abandoned


def _cut_torn_tail(fd: int, path: Path) -> None:
    """Cut the file back to its last newline (it ends mid-line when a writer was killed)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    with open(path, "rb") as f:
        position = size
        while position > 0:
            step = min(1 << 16, position)
            f.seek(position - step)
            block = f.read(step)
            if position == size and block.endswith(b"\n"):
                return
            newline = block.rfind(b"\n")
            if newline >= 0:
                os.ftruncate(fd, position - step + newline + 1)
                return
            position -= step
    os.ftruncate(fd, 0)


# The collective regime's per-call tag (one proxy serves every user of a row): "user/slot/phase",
# e.g. "17/42/before"; set by the ladder's ChatModel, read and removed by the proxy (carc_tags).
TAG_HEADER = "x-carc-tag"


def make_tag(user: int, slot: int | None, phase: Phase) -> str:
    return f"{user}/{'' if slot is None else slot}/{phase}"


def parse_tag(tag: str) -> tuple[int | None, int | None, Phase | None]:
    """(user, slot, phase) of a tag; (None, None, None) for one that is not a tag."""
    parts = tag.split("/")
    if len(parts) != 3 or not parts[0].isdigit() or not (parts[1] == "" or parts[1].isdigit()) \
            or parts[2] not in PHASES:
        return None, None, None
    return int(parts[0]), int(parts[1]) if parts[1] else None, parts[2]  # type: ignore[return-value]


def write_slot(control_path: str | os.PathLike[str], slot: int | None, phase: Phase) -> None:
    """Tell the proxy which slot and phase the cell is in; atomic (the proxy never sees half).

    Not fsynced: the file is a live signal to a running proxy, not a record (the calls' own
    lines carry their slot), and after a crash the runner writes it again before any call."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    if slot is not None and (not isinstance(slot, int) or isinstance(slot, bool)):
        raise ValueError(f"slot must be an int or None, got {slot!r}")
    control_path = Path(control_path)
    control_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = control_path.with_name(f".{control_path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"slot": slot, "phase": phase, "t": time.time()}))
    os.replace(tmp, control_path)


def read_slot(control_path: str | os.PathLike[str]) -> tuple[int | None, Phase | None]:
    """The (slot, phase) last written by `write_slot`; (None, None) when there is no file yet."""
    try:
        text = Path(control_path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    try:
        data = json.loads(text)
        slot, phase = data["slot"], data["phase"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{control_path}: not a slot control file ({e}); "
                         "it is written only by journal.write_slot") from e
    if phase not in PHASES or not (slot is None or isinstance(slot, int)):
        raise ValueError(f"{control_path}: slot {slot!r} / phase {phase!r} are not valid")
    return slot, phase


class JournalTail:
    """The complete lines a journal gained since the last call (a bad or torn line is skipped):
    the runner's per-instance account of a harness's model calls."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.offset = 0

    def new_entries(self) -> list[JournalEntry]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data.rfind(b"\n") + 1
        self.offset += complete
        entries = []
        for line in data[:complete].split(b"\n"):
            if line.strip():
                try:
                    entries.append(JournalEntry.from_json(line.decode("utf-8", "replace"), self.path.parent))
                except (ValueError, TypeError):
                    continue
        return entries
