"""Benchmark: orchestration overhead per instance and instances per second, on the offline model.

Runs one cell of each ladder learner over a short own-generator stream against a real embedded
solver-model server, then prints, per learner: instances, wall seconds, model seconds (time spent
inside HTTP calls), orchestration overhead per instance (wall minus model time) and instances/s.

    python bench/core.py [--tasks 6] [--visits 4] [--effort low] [--cold-proxy]

As a grid worker does, the bench has a warm spare of the host proxy ready before the first cell
(proxy.host.prepare_spare); --cold-proxy starts every cell's mitmdump from scratch instead.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import textwrap
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orchestrator.records import RunPaths, read_events
from orchestrator.run.grid_config import load_grid
from orchestrator.run.model_service import model_service
from orchestrator.run.cell_runner import CellRunner
from orchestrator.run.schedule import build_schedule
from proxy.host import prepare_spare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--visits", type=int, default=4)
    parser.add_argument("--effort", default="low")
    parser.add_argument("--cold-proxy", action="store_true",
                        help="no warm proxy spare: every cell's mitmdump starts cold")
    args = parser.parse_args()
    if args.cold_proxy:
        os.environ["CARC_PROXY_SPARE"] = "0"
    else:
        prepare_spare()
    console = Console(width=160)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run = RunPaths(tmp)
        run.grid.write_text(textwrap.dedent(f"""\
            name: bench
            track: {{name: own, tasks: {args.tasks}, visits: {args.visits}, epilogue: 0}}
            efforts: [{args.effort}]
            learners: [stateless-floor, demo-cache-floor, program-library]
            """))
        grid = load_grid(run.grid)
        proxy = "cold proxy" if args.cold_proxy else "warm proxy spare"
        table = Table(title=f"core overhead ({args.tasks} tasks x {args.visits} visits, effort {args.effort}, {proxy})")
        for column in ("learner", "instances", "wall s", "model s", "model calls",
                       "overhead ms/instance", "overhead share", "instances/s"):
            table.add_column(column, justify="right")
        with model_service(grid, run.logs) as (base_url,):
            # Once per worker process, not per instance: the model SDK's import (the ChatModel
            # imports it on first use) and the stream's schedule (cached per process). The first
            # cell would otherwise carry them over its 24 instances alone.
            start = time.perf_counter()
            import openai  # noqa: F401
            for cell in grid.cells():
                build_schedule(grid, cell)
            once = time.perf_counter() - start
            for cell in grid.cells():
                cell_dir = run.cell(cell.cell).root
                start = time.perf_counter()
                CellRunner(grid, cell, cell_dir, base_url).run()
                wall = time.perf_counter() - start
                ends = [e for e in read_events(run.cell(cell.cell).events) if e.type == "instance_end"]
                model_s = sum(e.model_s or 0 for e in ends)
                calls = sum(e.model_calls or 0 for e in ends)
                n = len(ends)
                table.add_row(cell.learner, str(n), f"{wall:.2f}", f"{model_s:.2f}", str(calls),
                              f"{1000 * (wall - model_s) / n:.1f}", f"{(wall - model_s) / wall:.2f}",
                              f"{n / wall:.2f}")
        console.print(table)
        console.print(f"once per worker process, outside the table: the model SDK import and the "
                      f"stream's schedule, {1000 * once:.0f} ms")


if __name__ == "__main__":
    main()
