"""Benchmark: orchestration overhead per instance and instances per second, on the offline model.

Runs one cell of each ladder learner over a short own-generator stream against a real embedded
solver-model server, then prints, per learner: instances, wall seconds, model seconds (time spent
inside HTTP calls), orchestration overhead per instance (wall minus model time) and instances/s.

    python bench/core.py [--tasks 6] [--visits 4] [--effort low]
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orchestrator.records import RunPaths, read_events
from orchestrator.run.grid_config import load_grid
from orchestrator.run.grid_run import model_service
from orchestrator.run.runner import CellRunner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--visits", type=int, default=4)
    parser.add_argument("--effort", default="low")
    args = parser.parse_args()
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
        table = Table(title=f"core overhead ({args.tasks} tasks x {args.visits} visits, effort {args.effort})")
        for column in ("learner", "instances", "wall s", "model s", "model calls",
                       "overhead ms/instance", "overhead share", "instances/s"):
            table.add_column(column, justify="right")
        with model_service(grid, run.logs) as (base_url,):
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


if __name__ == "__main__":
    main()
