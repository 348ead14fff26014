"""Where a run's units of work run, chosen once for every kind of grid.

A grid's unit of work is a cell (a single-user grid, on the grid protocol or the ARC-AGI-3
level protocol) or a row's user for one round (a collective grid). An executor runs the units:
`local`, a process pool (cells) or a pool of user threads (a collective grid's rows) on this
machine; `ray`, a Ray task per unit on a cluster, retried when its node is lost. To the CLI every
grid is a grid: `run(run_dir, executor)` picks the entry for the grid's regime and the executor,
and a Ctrl-C (or SIGTERM) ends every one of them as `RunInterrupted`.

A cell's slot driver is chosen in one place too, for both executors: `cell_runner.cell_runner`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from orchestrator.errors import ConfigError, MachineError
from orchestrator.records import RunPaths
from orchestrator.run.grid_config import load_grid

EXECUTORS = ("local", "ray")


def run(run_dir: Path, executor: str = "local", workers: int | None = None, *, address: str | None = None,
        durability: str = "shared", show_progress: bool = True) -> list[str]:
    """Run (or continue) every unit of the run in `run_dir` on `executor`; returns the cells that
    stopped at a limit (limits.usd_per_cell). `address` and `durability` are the Ray executor's."""
    from orchestrator.run.run_folder import RunInterrupted

    check(executor, address, durability)
    run_dir = Path(run_dir)
    collective = load_grid(RunPaths(run_dir).grid).collective is not None
    try:
        if executor == "local" and collective:  # users in rounds, rows side by side, in threads
            from orchestrator.run.collective.rounds import execute_collective
            return execute_collective(run_dir, workers, show_progress)
        if executor == "local":  # a process per cell
            from orchestrator.run.local_pool import execute
            return execute(run_dir, workers, show_progress)
        if collective:  # a Ray task per user and round
            from orchestrator.run.collective.on_ray import execute_collective_ray
            return execute_collective_ray(run_dir, workers, address, show_progress, durability)
        from orchestrator.run.ray_executor import execute_ray_run  # a Ray task per cell
        return execute_ray_run(run_dir, workers, address, show_progress, durability)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the CLI turns it into this)
        raise RunInterrupted(run_dir) from None


def check(executor: str, address: str | None = None, durability: str = "shared") -> None:
    """That the executor and its options can run here (a ConfigError or MachineError naming the
    option and the fix)."""
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor {executor}: give one of {', '.join(EXECUTORS)}")
    if executor == "local" and (address is not None or durability != "shared"):
        raise ConfigError("--address and --durability are for --executor ray")
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise MachineError("--executor ray needs Ray, which is not installed: pip install 'carc[ray]'")
