"""The test-only fault points: a named point of a run where the process that reaches it faults
itself (orchestrator/fault_points.py), so an interrupt test never races the run."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator import fault_points
from orchestrator.errors import ConfigError

APPEND = textwrap.dedent("""\
    import signal, sys, time
    from pathlib import Path
    # Ctrl-C raises KeyboardInterrupt, as `carc grid run` makes sure (a parent that ignores SIGINT,
    # as a pytest-xdist worker does, passes that on, and python then keeps ignoring it)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from orchestrator.records import Event, EventLog
    root = Path(sys.argv[1])
    logs = {name: EventLog(root / name / "events.jsonl") for name in ("u0000", "u0001")}
    for slot in range(4):
        for name, log in logs.items():
            for step in range(1, 4):
                log.append(Event(type="step", cell="c", slot=slot, phase="stream", task="t", visit=1,
                                 exposure=1, step=step, t=time.time()))
    print("ended", flush=True)
""")


def test_a_spec_is_parsed_and_a_wrong_one_names_the_variable_and_the_form():
    point = fault_points.parse("freeze after 2 step of slot 3 in /u0001/")
    assert (point.action, point.after, point.event_type, point.slot, point.where) == ("freeze", 2, "step", 3, "/u0001/")
    assert fault_points.parse("sigint-group after 150 step").slot is None
    for wrong in ("halt after 2 step", "freeze after step", "freeze after 2 step of 3"):
        with pytest.raises(ConfigError, match="CARC_TEST_FAULT=.*expected '<action> after <n>"):
            fault_points.parse(wrong)


def test_only_the_records_it_names_count_and_it_fires_once(monkeypatch):
    point = fault_points.parse("sigint-group after 2 step of slot 1 in /u0001/")
    fired = []
    monkeypatch.setattr(fault_points, "_armed", lambda spec: point)
    monkeypatch.setattr(fault_points, "_do", fired.append)
    for path, kind, slot in [("/r/u0000/e", "step", 1), ("/r/u0001/e", "step", 0), ("/r/u0001/e", "instance_end", 1),
                             ("/r/u0001/e", "step", 1), ("/r/u0001/e", "step", 1), ("/r/u0001/e", "step", 1)]:
        fault_points.reached(Path(path), kind, slot)
        assert fired == ([] if point.seen < 2 else ["sigint-group"])
    assert point.seen == 2 and fired == ["sigint-group"]


def _start(tmp_path: Path, spec: str, mark: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, fault_points.FAULT_ENV: spec}
    if mark is not None:
        env[fault_points.MARK_ENV] = str(mark)
    return subprocess.Popen([sys.executable, "-c", APPEND, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                            start_new_session=True, text=True)


def _steps(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def test_freeze_stops_the_process_right_after_the_named_record_and_marks_who_once(tmp_path):
    mark = tmp_path / "fault.mark"
    proc = _start(tmp_path, "freeze after 2 step of slot 1 in /u0001/", mark)
    try:
        deadline = time.monotonic() + 60
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "it never reached its point"
            time.sleep(0.01)
        pid, where = mark.read_text().split()
        assert int(pid) == proc.pid and where == str(tmp_path / "u0001" / "events.jsonl")
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, "the process did not stop itself"
            time.sleep(0.01)
        # stopped just after its point: slots 0 and 1 whole in u0000, slot 0 and steps 1-2 of slot 1 in u0001
        assert (_steps(tmp_path / "u0000" / "events.jsonl"), _steps(tmp_path / "u0001" / "events.jsonl")) == (6, 5)
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=60) == 0 and proc.stdout.read() == "ended\n"
        # the mark is taken: a second process (a retried attempt) passes the same point
        again = _start(tmp_path / "again", "freeze after 2 step of slot 1 in /u0001/", mark)
        assert again.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("action, code", [("sigint-group", -signal.SIGINT), ("sigkill-group", -signal.SIGKILL)])
def test_a_signal_to_the_group_lands_after_exactly_the_named_count(tmp_path, action, code):
    """At the 5th step (an uncaught KeyboardInterrupt ends python by SIGINT)."""
    proc = _start(tmp_path, f"{action} after 5 step")
    assert proc.wait(timeout=60) == code
    assert _steps(tmp_path / "u0000" / "events.jsonl") + _steps(tmp_path / "u0001" / "events.jsonl") == 5


TINY_GRID = """\
name: tiny
seed: 2
track: {name: own, tasks: 3, visits: 3, epilogue: 0, fresh_reference: false}
orders: [sequential]
efforts: [low]
learners: [stateless-floor]
sandbox: {engine: process}
workers: 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("ignored", [False, True], ids=["sigint-default", "sigint-ignored-by-the-parent"])
def test_ctrl_c_stops_a_run_even_when_it_was_started_with_sigint_ignored(tmp_path, ignored):
    """A run started as a script's background job (or by a CI runner) inherits SIGINT ignored,
    and Python then never raises KeyboardInterrupt: the run went on to its end and exited 0
    (measured: 6 of 6 Ctrl-Cs sent 6-46 s into a collective run were lost). `carc grid run`
    takes SIGINT back, so Ctrl-C stops it wherever it was started."""
    run = tmp_path / "runs" / "tiny"
    (run / "cells").mkdir(parents=True)
    (run / "grid.yaml").write_text(TINY_GRID)

    def parent_ignored_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.SIG_DFL)
    env = {**os.environ, fault_points.FAULT_ENV: "sigint-group after 3 step"}
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume", str(run),
                           "--no-report"], env=env, capture_output=True, text=True, timeout=300,
                          start_new_session=True, preexec_fn=parent_ignored_sigint)
    assert done.returncode == 130, done.stdout[-2000:] + done.stderr[-2000:]
    assert "interrupted; continue with `carc grid run --resume" in done.stdout
    ended = (run / "cells").glob("*/events.jsonl")
    assert sum(text.count('"type":"instance_end"') for text in (p.read_text() for p in ended)) < 9
