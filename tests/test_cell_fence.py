"""The fencing token of a cell attempt (orchestrator/records.py `CellFence`): once a newer attempt
takes the cell, a stale one (a partitioned node still running) cannot append another record."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.records import CellFence, CellPaths, Event, EventLog, StaleAttempt, read_events


def event(step: int, attempt: int) -> Event:
    return Event(type="step", cell="c", slot=0, phase="stream", task="t", visit=1, exposure=1,
                 t=time.time(), step=step, note={"attempt": attempt})


def test_a_stale_attempts_write_is_refused_and_the_new_attempts_is_kept(tmp_path):
    paths = CellPaths(tmp_path / "cell")
    first = CellFence.take(paths.root, "node a")
    with EventLog(paths.events, first) as log:
        log.append(event(1, 1))
        second = CellFence.take(paths.root, "node b")
        with pytest.raises(StaleAttempt) as refused:
            log.append(event(2, 1))
    message = str(refused.value)
    assert "attempt 1" in message and "node a" in message and "attempt 2 (node b)" in message
    assert str(paths.attempt) in message
    with EventLog(paths.events, second) as log:
        log.append(event(2, 2))
    assert [(e.step, e.note["attempt"]) for e in read_events(paths.events)] == [(1, 1), (2, 2)]
    record = CellFence.read(paths.root)
    assert record["token"] == 2 and [a["holder"] for a in record["attempts"]] == ["node a", "node b"]


def test_no_stale_record_lands_after_the_takeover_even_mid_stream(tmp_path):
    """A writer appending as fast as it can while another attempt takes the cell: every line it
    got in was written before the takeover, and it stops at the first refused one."""
    paths = CellPaths(tmp_path / "cell")
    stale = CellFence.take(paths.root, "stale")
    written: list[int] = []
    stopped: list[BaseException] = []

    def writer() -> None:
        with EventLog(paths.events, stale) as log:
            try:
                for step in range(1, 100_000):
                    log.append(event(step, 1))
                    written.append(step)
            except StaleAttempt as exc:
                stopped.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    while len(written) < 50:
        time.sleep(0.001)
    newer = CellFence.take(paths.root, "newer")
    at_takeover = len(written)
    thread.join(30)
    assert stopped, "the stale writer was never refused"
    # at most the one append that held the fence while it was taken completes after it
    assert len(written) <= at_takeover + 1
    lines = read_events(paths.events)
    assert [e.step for e in lines] == written
    with EventLog(paths.events, newer) as log:
        log.append(event(len(written) + 1, 2))
    assert read_events(paths.events)[-1].note == {"attempt": 2}


def test_an_unfenced_log_is_unchanged(tmp_path):
    """The local pool passes no fence: appends need no attempt.json."""
    paths = CellPaths(tmp_path / "cell")
    with EventLog(paths.events) as log:
        log.append(event(1, 0))
    assert len(read_events(paths.events)) == 1 and not paths.attempt.exists()
