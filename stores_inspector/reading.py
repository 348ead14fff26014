"""Reading stores that may be damaged: every reader records what it could not read and goes on.

A harness can be killed mid-write, a snapshot can catch a SQLite database between a page write
and its WAL checkpoint, a store can come from a newer version. None of that may stop an audit:
the reader keeps whatever is readable and adds a `Problem` that says where and what was lost.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

try:  # openclaw compresses transcript events with zstd; optional so a missing wheel is a Problem
    import zstandard
except ImportError:  # pragma: no cover - depends on the environment
    zstandard = None

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class Problem:
    """Something the inspector could not read (or read only in part)."""

    cell: str
    where: str  # file (and member or table) it concerns
    what: str  # what was lost and why


class Problems(list):
    """The problems of one cell; `guard` turns an exception into a Problem and goes on."""

    def __init__(self, cell: str) -> None:
        super().__init__()
        self.cell = cell

    def add(self, where: str | Path, what: str) -> None:
        self.append(Problem(self.cell, str(where), what))

    @contextlib.contextmanager
    def guard(self, where: str | Path, what: str = "could not be read") -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # an unreadable store must not stop the audit
            self.add(where, f"{what}: {type(exc).__name__}: {exc}"[:500])


def decompress(data: bytes, where: str, problems: Problems) -> bytes | None:
    """Bytes as stored, gunzipped or un-zstd'ed by their magic number; None if that fails."""
    try:
        if data.startswith(GZIP_MAGIC):
            return gzip.decompress(data)
        if data.startswith(ZSTD_MAGIC):
            if zstandard is None:
                problems.add(where, "zstd-compressed; install the `zstandard` package to read it")
                return None
            return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    except Exception as exc:
        problems.add(where, f"could not decompress: {type(exc).__name__}: {exc}")
        return None
    return data


def salvage_json(text: str) -> Any:
    """The longest readable prefix of truncated JSON, with its open brackets closed.

    Cuts after the last complete member of the innermost open container (a value followed by
    `,` or a closing bracket), then appends the closers; raises ValueError if nothing is left.
    """
    stack: list[str] = []
    in_string = escaped = False
    cut, cut_stack = -1, []
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
            cut, cut_stack = i + 1, list(stack)  # an empty container is complete as it stands
        elif ch in "}]":
            if not stack:
                break
            stack.pop()
            cut, cut_stack = i + 1, list(stack)
        elif ch == ",":
            cut, cut_stack = i, list(stack)
    if cut < 0:
        raise ValueError("no complete JSON value")
    return json.loads(text[:cut] + "".join(reversed(cut_stack)))


def read_json(data: str | bytes | None, where: str, problems: Problems) -> Any:
    """Parsed JSON; a truncated file gives its readable prefix and a Problem; None if unreadable."""
    if data is None:
        return None
    if isinstance(data, bytes):
        data = decompress(data, where, problems)
        if data is None:
            return None
        data = data.decode("utf-8", errors="replace")
    try:
        return json.loads(data)
    except ValueError as exc:
        try:
            value = salvage_json(data)
        except ValueError:
            problems.add(where, f"not JSON ({exc}); nothing readable")
            return None
        problems.add(where, f"truncated or invalid JSON ({exc}); read the complete part before it")
        return value


def read_jsonl(data: str | bytes | None, where: str, problems: Problems) -> list[Any]:
    """Every parseable line; bad lines are skipped and counted in one Problem."""
    if data is None:
        return []
    if isinstance(data, bytes):
        data = decompress(data, where, problems)
        if data is None:
            return []
        data = data.decode("utf-8", errors="replace")
    rows, bad = [], []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            bad.append(number)
    if bad:
        problems.add(where, f"{len(bad)} unreadable line(s) skipped (first: line {bad[0]})")
    return rows


@contextlib.contextmanager
def open_sqlite(path: Path, where: str, problems: Problems) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection to a copy of the database with its -wal and -shm.

    The copy means a live or locked database is never touched, and the WAL's committed pages
    are applied to the copy. Yields None (and records why) when the copy cannot be opened.
    """
    if not path.exists():
        problems.add(where, "missing")
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="carc-inspect-db-") as tmp:
        copy = Path(tmp) / path.name
        for suffix in ("", "-wal", "-shm"):
            source = path.with_name(path.name + suffix)
            if source.exists():
                shutil.copyfile(source, copy.with_name(copy.name + suffix))
        connection = None
        try:
            # read-write on our copy so SQLite can replay the WAL; the original stays untouched
            connection = sqlite3.connect(f"file:{copy}?mode=rw", uri=True)
            connection.execute("select count(*) from sqlite_master").fetchone()
            connection.execute("pragma query_only = on")
        except sqlite3.Error as exc:
            problems.add(where, f"not a readable SQLite database ({exc})")
            if connection is not None:
                connection.close()
            connection = None
        try:
            yield connection
        finally:
            if connection is not None:
                connection.close()


def query(connection: sqlite3.Connection | None, sql: str, where: str, problems: Problems,
          params: tuple = ()) -> list[sqlite3.Row]:
    """Rows of one query, or [] with a Problem (missing table, malformed page, ...)."""
    if connection is None:
        return []
    connection.row_factory = sqlite3.Row
    try:
        return connection.execute(sql, params).fetchall()
    except sqlite3.Error as exc:
        problems.add(where, f"query failed ({exc}): {sql[:120]}")
        return []


def tables(connection: sqlite3.Connection | None) -> set[str]:
    if connection is None:
        return set()
    try:
        return {r[0] for r in connection.execute("select name from sqlite_master where type='table'")}
    except sqlite3.Error:
        return set()


def check_version(found: Any, known: set[Any], where: str, problems: Problems) -> None:
    """Record a Problem for a schema version this inspector was not written against."""
    if found not in known:
        problems.add(where, f"unknown schema version {found!r} (known: {', '.join(map(str, sorted(known)))}); "
                            "read the fields that match, the rest may be missing")
