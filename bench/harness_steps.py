"""Where a harness instance's orchestration goes: each step of a memory-off cell's lifecycle, timed.

    python bench/harness_steps.py [--harness hermes-agent --harness openclaw] [--rounds 3]

For each harness, a memory-off cell's services are made in-process (sandbox, proxy container,
state volume; no model is called) and each step the runner takes around an instance is timed over
`--rounds` rounds: the cell's start, a wipe in place (the harness's processes ended, the volume
emptied, its config written, its processes started again), a standby swap (the wipe when the
standby is ready), the snapshot and log collection after an instance, one `docker exec`, and for
hermes-agent the conversation's driver start (cold, and prestarted on a standby). Prints median
seconds per step; the machine's load is printed too (the steps are CPU-bound: compare under
equal load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from orchestrator.records import RunPaths  # noqa: E402
from orchestrator.run.cell_services import harness_services  # noqa: E402
from orchestrator.run.grid_config import GridConfig  # noqa: E402

console = Console(width=150)
UPSTREAM = "http://host.docker.internal:9/v1"  # nothing answers: no step calls the model


def cell_of(root: Path, harness: str, standby: bool):
    data = {"name": "steps", "seed": 1, "orders": ["sequential"], "efforts": ["low"],
            "track": {"name": "own", "tasks": 1, "visits": 1, "epilogue": 0, "fresh_reference": False},
            "model": {"endpoint": UPSTREAM, "name": "carc-solver"},
            "learners": [{"learner": harness, "row": "memory-off"}], "sandbox": {"standby": standby}}
    run = RunPaths(root / f"bench-steps-{os.getpid()}-{harness}-{standby}")
    run.cells.mkdir(parents=True)
    run.grid.write_text(yaml.safe_dump(data))
    grid = GridConfig.model_validate(data)
    cell = grid.cells()[0]
    return grid, cell, run.cells / cell.cell


def timed(fn) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def steps(harness: str, rounds: int, root: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}

    def note(name: str, seconds: float) -> None:
        out.setdefault(name, []).append(seconds)

    # wiped in place: no standby
    grid, cell, cell_dir = cell_of(root, harness, standby=False)
    start = time.monotonic()
    with harness_services(grid, cell, cell_dir, UPSTREAM) as services:
        note("cell start (sandbox, proxy, harness)", time.monotonic() - start)
        sandbox = services.state.sandbox
        learner = services.harness
        for _ in range(rounds):
            note("one docker exec (true)", timed(lambda: sandbox.exec(["true"])))
            note("wipe in place", timed(services.state.wipe))
            note("snapshot", timed(lambda: services.state.snapshot(cell_dir / "snap.tar.gz")))
            note("collect logs", timed(lambda: services.state.collect_logs(cell_dir / "logs")))
            if harness == "hermes-agent":
                note("hermes driver start, cold", timed(lambda: learner.open_conversation("carc-bench")))
                learner.close_conversation()
    # with a standby
    grid, cell, cell_dir = cell_of(root, harness, standby=True)
    with harness_services(grid, cell, cell_dir, UPSTREAM) as services:
        standbys = services.state.cell
        for _ in range(rounds):
            standbys.standby.result()  # ready: the swap alone is what the instance waits for
            if harness == "hermes-agent":
                time.sleep(10)  # the prestarted driver has loaded hermes by now (on an idle machine)
            standbys.pristine = False  # as after an instance
            note("wipe = standby swap", timed(services.state.wipe))
            if harness == "hermes-agent":
                learner = standbys.current.learner
                note("hermes driver start, prestarted", timed(lambda: learner.open_conversation("carc-bench")))
                learner.close_conversation()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", action="append")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    harnesses = args.harness or ["hermes-agent", "openclaw"]
    console.print(f"load before: {os.getloadavg()[0]:.2f}")
    table = Table(title="memory-off cell, median s per step")
    table.add_column("harness")
    table.add_column("step")
    table.add_column("median s", justify="right")
    table.add_column("rounds", justify="right")
    with tempfile.TemporaryDirectory(prefix="carc-bench-") as tmp:
        for harness in harnesses:
            with console.status(f"{harness}: timing the steps"):
                for name, values in steps(harness, args.rounds, Path(tmp)).items():
                    table.add_row(harness, name, f"{statistics.median(values):.2f}", str(len(values)))
    console.print(table)
    console.print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
