"""Benchmark: the analysis of a collective run at the seed's size, 160,000 verdicts.

Writes a synthetic collective run folder (the records the collective runner writes: every
user's `instance_end` events, on the users' real schedules) of 8 rows (4 learners x 2 efforts)
x 100 users x 200 instances, then times, separately: reading it (`collective.collective_frame`),
every table of the collective section with 10,000 task-bootstrap resamples
(`collective.collective_tables`), and the whole report (results/*.parquet, report.md,
report.html). The target for frame + tables is under 10 s.

    python bench/collective_analysis.py [--users 100] [--tasks 25] [--visits 8] [--resamples 10000]
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from orchestrator.analysis import collective
from orchestrator.analysis.collective_report import write_collective_report
from orchestrator.records import Event, RunPaths
from orchestrator.run.collective.schedule import user_schedule
from orchestrator.run.grid_config import load_grid

TARGET_S = 10.0


def write_run(root: Path, users: int, tasks: int, visits: int) -> int:
    """A collective run folder with synthetic verdicts; returns how many."""
    run = RunPaths(root)
    run.cells.mkdir(parents=True)
    run.grid.write_text(textwrap.dedent(f"""\
        name: bench-collective
        track: {{name: own, tasks: {tasks}, visits: {visits}, epilogue: 0}}
        collective: {{users: {users}, round_slots: 25}}
        efforts: [low, medium]
        learners:
          - stateless-floor
          - {{learner: demo-cache-floor, row: collective}}
          - program-library
          - {{learner: program-library, row: collective}}
        """))
    grid = load_grid(run.grid)
    rng = np.random.default_rng(0)
    written = 0
    for k, cell in enumerate(grid.cells()):
        paths = run.cell(cell.cell)
        paths.root.mkdir()
        cell.record().write(paths.settings)
        rate = {"stateless-floor": 0.0, "demo-cache-floor": 0.04, "program-library": 0.08}[cell.learner]
        shared = 0.02 if cell.row == "collective" else 0.0
        for user in range(users):
            schedule = user_schedule(grid, cell, user)
            folder = paths.user(user)
            folder.root.mkdir(parents=True)
            exposure = np.array([s.slot.exposure for s in schedule])
            rounds = np.array([s.round for s in schedule])
            fails = rng.random(len(schedule)) < 0.3 * np.clip(1 - rate * exposure - shared * rounds, 0, 1)
            cost = np.where(fails, 16, rng.integers(0, 6, len(schedule)))
            with open(folder.events, "w", encoding="utf-8") as handle:
                for s, c in zip(schedule, cost):
                    slot = s.slot
                    handle.write(Event(type="instance_end", cell=cell.cell, slot=slot.index, phase=slot.phase,
                                       task=slot.task_id, visit=slot.visit, exposure=slot.exposure,
                                       t=float(slot.index), status="failed" if c == 16 else "solved",
                                       cost=int(c), demos_used=int(min(c, 8)), attempts_used=0,
                                       model_calls=int(min(c, 8)) + 1, wall_s=0.1, user=user,
                                       round=s.round).line() + "\n")
            written += len(schedule)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=25)
    parser.add_argument("--visits", type=int, default=8)
    parser.add_argument("--resamples", type=int, default=10_000)
    args = parser.parse_args()
    times: list[tuple[str, float, str]] = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "run"
        start = time.perf_counter()
        verdicts = write_run(root, args.users, args.tasks, args.visits)
        times.append(("records written (synthetic, not analysis)", time.perf_counter() - start,
                      f"{verdicts:,} instance records"))
        start = time.perf_counter()
        frame = collective.collective_frame(root)
        times.append(("instance frame", time.perf_counter() - start, f"{len(frame):,} rows"))
        start = time.perf_counter()
        tables = collective.collective_tables(frame, 0, args.resamples)
        times.append(("tables", time.perf_counter() - start, ", ".join(tables)))
        analysis_s = times[1][1] + times[2][1]
        start = time.perf_counter()
        write_collective_report(root, 0, args.resamples)
        times.append(("whole report (frame, tables, parquet, md, html)", time.perf_counter() - start, ""))
    table = Table(title=f"collective analysis: {verdicts:,} verdicts, {args.resamples:,} resamples")
    for column, justify in (("step", "left"), ("seconds", "right"), ("what", "left")):
        table.add_column(column, justify=justify)
    for step, seconds, what in times:
        table.add_row(step, f"{seconds:.2f}", what)
    table.add_row("frame + tables", f"{analysis_s:.2f}",
                  f"target < {TARGET_S:.0f} s: {'met' if analysis_s < TARGET_S else 'MISSED'}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
