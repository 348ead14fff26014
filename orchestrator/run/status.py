"""`carc status RUN`: where a run stands, read from its folder alone, from any shell.

Per cell: its state, instances finished of its schedule, budget and solved share of its finished
stream instances, dollars spent (the instance records: the proxy journal's count for harnesses,
the learner's own at the run's prices for the ladder), seconds per instance. For the run: cells
by state, instances, dollars, the finishing rate since the run (re)started and the estimated
finish at that rate.

A cell's state:
- done: every slot of its schedule has an instance_end;
- running: a process holds the cell's lock (the runner holds it while it runs the cell; on Ray
  with `--durability head`, the head's records actor holds it for the cell's attempt);
- stopped: its last record is a stop at limits.usd_per_cell;
- failed: the run's process recorded the cell's failure (`logs/failures.jsonl`) after the
  cell's last record;
- waiting: not begun, or begun and not running, while the run's process is alive;
- interrupted: begun, not running, and no run process alive: `carc grid run --resume RUN`.

Reading only: the lock is tried and let go at once, nothing is written.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.records import CellPaths, RunPaths, last_stop, read_events
from orchestrator.run.grid_config import load_grid
from orchestrator.run.collective.schedule import user_schedule
from orchestrator.run.schedule import build_schedule

RUN_FILE = "run.json"          # in logs/: the pid and start time of the process running the grid
FAILURES_FILE = "failures.jsonl"  # in logs/: one line per cell the run's process saw fail
STATES = ("done", "running", "stopped", "failed", "waiting", "interrupted")


@dataclass
class CellStatus:
    cell: str
    state: str
    finished: int
    total: int
    budget: float | None  # mean budget share of finished stream instances
    solved: float | None
    usd: float
    seconds_per_instance: float | None
    failure: str | None = None


@dataclass
class RunStatus:
    run: str
    cells: list[CellStatus]
    process_alive: bool
    started: float | None  # unix time the run's process (re)started
    finished: int
    total: int
    usd: float
    rate_per_hour: float | None  # instances finished per hour since `started`
    eta_s: float | None

    def counts(self) -> dict[str, int]:
        return {state: sum(c.state == state for c in self.cells) for state in STATES}

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "counts": self.counts()}, indent=1)


def mark_started(run_dir: Path) -> None:
    """Written by the run's process as it starts executing: how `status` knows it is alive."""
    path = RunPaths(run_dir).logs / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{RUN_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "started": time.time()}))
    tmp.replace(path)


def record_failure(run_dir: Path, cell: str, error: str) -> None:
    path = RunPaths(run_dir).logs / FAILURES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"cell": cell, "t": time.time(), "error": error[:2000]}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _locked(paths: CellPaths) -> bool:
    """Whether another process holds the cell's lock (the runner, while it runs the cell)."""
    if not paths.lock.exists():
        return False
    with open(paths.lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _failures(run: RunPaths) -> dict[str, dict]:
    path = run.logs / FAILURES_FILE
    out: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            out[entry.get("cell", "")] = entry
    return out


def run_status(run_dir: Path, now: float | None = None) -> RunStatus:
    run = RunPaths(run_dir)
    grid = load_grid(run.grid)
    now = time.time() if now is None else now
    started, alive = None, False
    run_file = run.logs / RUN_FILE
    if run_file.exists():
        info = json.loads(run_file.read_text())
        started, alive = info.get("started"), _alive(int(info.get("pid", 0)))
    failures = _failures(run)
    cells, recent = [], 0
    lengths: dict[tuple, int] = {}  # cells on one stream share its length: build it once
    for cell in grid.cells():
        paths = run.cell(cell.cell)
        stream = (cell.track, cell.order, cell.seed)
        if stream not in lengths:
            lengths[stream] = len(build_schedule(grid, cell)) if grid.collective is None else \
                grid.collective.users * len(user_schedule(grid, cell, 0))
        total = lengths[stream]
        if grid.collective is not None:  # a row of users: every user's records
            events = sorted((e for user in paths.user_folders() for e in read_events(user.events)),
                            key=lambda e: e.t)
        else:
            events = read_events(paths.events) if paths.events.exists() else []
        ends = {(e.user, e.slot): e for e in events if e.type == "instance_end"}
        stream = [e for e in ends.values() if e.phase == "stream"]
        walls = [e.wall_s for e in ends.values() if e.wall_s is not None]
        if started is not None:
            recent += sum(1 for e in ends.values() if e.t >= started)
        failure = failures.get(cell.cell)
        last_t = events[-1].t if events else 0.0
        if len(ends) >= total:
            state = "done"
        elif _locked(paths) or (grid.collective is not None and alive and events):
            state = "running"
        elif last_stop(events) is not None:
            state = "stopped"
        elif failure is not None and failure["t"] >= last_t:
            state = "failed"
        else:
            state = "waiting" if alive or not events else "interrupted"
        cells.append(CellStatus(
            cell=cell.cell, state=state, finished=len(ends), total=total,
            budget=sum(e.cost or 0 for e in stream) / 16 / len(stream) if stream else None,
            solved=sum(e.status == "solved" for e in stream) / len(stream) if stream else None,
            usd=sum(e.cost_usd or 0.0 for e in ends.values()),
            seconds_per_instance=sum(walls) / len(walls) if walls else None,
            failure=failure["error"] if state == "failed" else None))
    finished, total = sum(c.finished for c in cells), sum(c.total for c in cells)
    rate = None
    if started is not None and now > started and recent:
        rate = recent / (now - started) * 3600
    eta = (total - finished) / rate * 3600 if rate and alive else None
    return RunStatus(run=run.name, cells=cells, process_alive=alive, started=started,
                     finished=finished, total=total, usd=sum(c.usd for c in cells),
                     rate_per_hour=rate, eta_s=eta)
