"""`carc status RUN` from another process while the run is in flight, after it was killed, and
when it is done. A real `carc grid run` in a subprocess (embedded model, host proxy, no Docker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.records import RunPaths
from orchestrator.run.status import run_status

GRID = """\
name: status
seed: 3
track: {name: own, tasks: 3, visits: 3, epilogue: 0, fresh_reference: false}
efforts: [low]
learners: [stateless-floor, demo-cache-floor, {learner: program-library, row: wiped}]
sandbox: {engine: process}
workers: 2
"""


def _start(tmp_path: Path, run_id: str) -> tuple[subprocess.Popen, Path]:
    grid = tmp_path / "grid.yaml"
    grid.write_text(textwrap.dedent(GRID))
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "grid", "run", str(grid), "--runs-dir",
         str(tmp_path / "runs"), "--run-id", run_id, "--no-report"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    return process, tmp_path / "runs" / run_id


def _wait_for(condition, process: subprocess.Popen, what: str, limit_s: float = 300):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process.poll() is not None and not condition():
            raise AssertionError(f"the run ended before {what}: {process.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {limit_s} s")


def _wait_group_gone(pgid: int, limit_s: float = 30) -> None:
    """SIGKILL is delivered at once but a worker releases its cell's lock only when it has exited:
    waiting for the leader alone leaves a worker that still holds a lock for a moment."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process group {pgid} still alive {limit_s} s after SIGKILL")


def _status(run: Path):
    if not (RunPaths(run).grid.exists() and (RunPaths(run).logs / "run.json").exists()):
        return None
    return run_status(run)


@pytest.mark.slow
def test_status_in_flight_then_done(tmp_path):
    process, run = _start(tmp_path, "live")
    try:
        live = _wait_for(lambda: (s := _status(run)) and s.counts()["running"] and s.finished >= 2 and s,
                         process, "a running cell with finished instances")
        assert live.process_alive and live.total == 3 * 9
        assert live.rate_per_hour and live.rate_per_hour > 0 and live.eta_s is not None
        running = [c for c in live.cells if c.state == "running"]
        assert 1 <= len(running) <= 2  # two workers
        out = CliRunner().invoke(app, ["status", str(run)])
        assert out.exit_code == 0 and "running" in out.output
        assert process.wait(timeout=600) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    done = run_status(run)
    assert done.counts()["done"] == 3 and done.finished == done.total == 27
    assert not done.process_alive and done.eta_s is None
    data = json.loads(CliRunner().invoke(app, ["status", str(run), "--json"]).output)
    assert data["counts"]["done"] == 3 and data["finished"] == 27
    assert all(c["budget"] is not None and 0 <= c["budget"] <= 1 for c in data["cells"])


@pytest.mark.slow
def test_a_killed_run_shows_its_begun_cells_as_interrupted(tmp_path):
    process, run = _start(tmp_path, "killed")
    try:
        _wait_for(lambda: (s := _status(run)) and s.finished >= 3, process, "three finished instances")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        _wait_group_gone(process.pid)
    status = run_status(run)
    assert not status.process_alive
    states = {c.cell: c.state for c in status.cells}
    begun = {c.cell for c in status.cells if c.finished and c.finished < c.total}
    assert begun and all(states[c] == "interrupted" for c in begun)
    assert set(states.values()) <= {"interrupted", "waiting", "done"}
    assert status.eta_s is None


def test_the_status_table_fits_80_columns_with_one_line_per_cell_and_every_failure_whole():
    """In an 80-column terminal a harness grid's cell names (learner-row, the effort, order and
    seed said once above) stay on one line each, and a failed cell's reason is printed whole
    below the table (it used to squeeze the cell column out of the table)."""
    from rich.console import Console

    from orchestrator.cli import _status_table, short_cell_names
    from orchestrator.run.status import CellStatus, RunStatus

    rows = ["hermes-agent", "hermes-agent-memory-off", "hermes-agent-program-procedure",
            "openclaw-asked-to-store", "prime-agent-memory-off", "demo-cache-floor"]
    reason = "the sandbox container carc-a690cda827-hermes-agent.low.sequential.s2-sandbox exited " * 2
    cells = [CellStatus(f"{row}.low.sequential.s2", state, 12, 1600, 0.453, 0.6, 12.3456, 33.2,
                        reason if state == "failed" else None)
             for row, state in zip(rows, ["running", "done", "failed", "waiting", "interrupted", "stopped"])]
    status = RunStatus("20261207T120000Z-offline-demo-harnesses", cells, True, 0.0, 72, 9600,
                       74.07, 120.0, 3600.0)
    console = Console(width=80, record=True)
    console.print(_status_table(status))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    for row, cell in zip(rows, cells):
        [line] = [line for line in lines if line.split(" ")[0] == row]
        assert cell.state in line and "12/1600" in line and "12.3456" in line
    assert "cells: <name>.low.sequential.s2" in text
    assert " ".join(reason.split()) in " ".join(" ".join(lines).split())
    # the parts that differ are kept, wherever they are; names of different shapes are left whole
    assert short_cell_names(["a.low.s1", "a.high.s1"]) == (["low", "high"], "a.*.s1")
    assert short_cell_names(["a.low.s1", "b.low.s2"]) == (["a.s1", "b.s2"], "*.low.*")
    assert short_cell_names(["a.low.s1", "b.low"]) == (["a.low.s1", "b.low"], "")
