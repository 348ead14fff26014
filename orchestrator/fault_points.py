"""Faults a test injects at a named point of a run, instead of racing the run with a signal.

A test that interrupts a run from outside (Ctrl-C, SIGKILL, a Ray node lost mid-instance) has to
hope the run is where it wants it when the signal lands: inside an instance, not yet at its end.
Instead the test names the point in the environment of the run it starts, and the process that
reaches it does the fault to itself:

    CARC_TEST_FAULT="<action> after <n> <event type>[ of slot <s>][ in <path part>]"

    sigint-group after 150 step                     Ctrl-C, once this process has recorded 150 steps
    sigkill-group after 60 step                     the whole run killed there
    freeze after 2 step of slot 3 in /u0001/        this process stops itself (SIGSTOP) after the
                                                    2nd step of slot 3 of a matching events file
    mark after 1 step of slot 2                     only the mark (below): the test acts on it, as
                                                    when the process to signal is not this one's
                                                    group (a Ray task's driver)

The count is of records appended by this process (`EventLog.append`, after the record is on disk
and outside its fence: a frozen process holds no lock), whose events file's path contains
`<path part>` and whose slot is `<s>`. With CARC_TEST_FAULT_MARK set to a file, the fault happens
once per mark (the first process to create it; a retried attempt on another node does not fault
again) and the file holds `<pid> <events file>`, which tells the test who faulted and where.

Never set outside tests: nothing in carc sets it, and an unset variable costs one lookup per
process (the spec is parsed once).
"""

from __future__ import annotations

import os
import re
import signal
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from orchestrator.errors import ConfigError

FAULT_ENV = "CARC_TEST_FAULT"
MARK_ENV = "CARC_TEST_FAULT_MARK"
ACTIONS = ("sigint-group", "sigkill-group", "freeze", "mark")
_SPEC = re.compile(r"^(?P<action>[a-z-]+) after (?P<n>\d+) (?P<type>[a-z_]+)"
                   r"(?: of slot (?P<slot>\d+))?(?: in (?P<where>\S+))?$")


@dataclass
class FaultPoint:
    action: str
    after: int
    event_type: str
    slot: int | None = None
    where: str | None = None

    def __post_init__(self) -> None:
        self.seen = 0
        self.fired = False
        self.lock = threading.Lock()

    def matches(self, path: Path, event_type: str, slot: int | None) -> bool:
        return (event_type == self.event_type and (self.slot is None or slot == self.slot)
                and (self.where is None or self.where in str(path)))


def parse(spec: str) -> FaultPoint:
    found = _SPEC.match(spec.strip())
    if found is None or found["action"] not in ACTIONS:
        raise ConfigError(f"{FAULT_ENV}={spec!r}: expected '<action> after <n> <event type>"
                          f"[ of slot <s>][ in <path part>]' with <action> one of {', '.join(ACTIONS)}")
    return FaultPoint(found["action"], int(found["n"]), found["type"],
                      int(found["slot"]) if found["slot"] else None, found["where"])


@lru_cache(maxsize=1)
def _armed(spec: str | None) -> FaultPoint | None:
    return parse(spec) if spec else None


def reached(path: Path, event_type: str, slot: int | None) -> None:
    """Called once a record of `event_type` (slot `slot`) is appended to `path`: does the armed
    fault when this is its point."""
    point = _armed(os.environ.get(FAULT_ENV))
    if point is None or point.fired or not point.matches(path, event_type, slot):
        return
    with point.lock:
        point.seen += 1
        if point.fired or point.seen < point.after:
            return
        point.fired = True
        if not _claim_mark(path):
            return
    _do(point.action)


def _claim_mark(path: Path) -> bool:
    mark = os.environ.get(MARK_ENV)
    if not mark:
        return True
    try:
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False  # another process (an earlier attempt) already did this fault
    with os.fdopen(fd, "w") as out:
        out.write(f"{os.getpid()} {path}\n")
        out.flush()
        os.fsync(out.fileno())
    return True


def _do(action: str) -> None:
    if action == "sigint-group":
        os.killpg(os.getpgrp(), signal.SIGINT)
    elif action == "sigkill-group":
        os.killpg(os.getpgrp(), signal.SIGKILL)
    elif action == "freeze":  # every thread of this process stops, as a partitioned node's would
        os.kill(os.getpid(), signal.SIGSTOP)
    # "mark": nothing more; the mark file written by _claim_mark is the whole fault
