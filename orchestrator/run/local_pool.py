"""The local executor: a run's cells in a pool of worker processes on this machine, one cell per
process at a time, each writing only inside its own folder; progress per cell (rich).
`orchestrator/run/ray_executor.py` runs the same cells on a Ray cluster; `executors.run` picks.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import structlog
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.errors import ConfigError, RunFailed
from orchestrator.records import RunPaths
from orchestrator.rows import STATELESS_ROWS
from orchestrator.run.cell_services import refuse_host_programs
from orchestrator.run.grid_config import HARNESSES, Cell, GridConfig, load_grid, run_prices
from orchestrator.run.model_service import model_host, model_service
from orchestrator.run.run_folder import (RunInterrupted, needs_docker, open_run, prepare_sandboxes,
                                         run_grid_path)
from proxy.host import die_with_parent

log = structlog.get_logger("carc.grid")


_progress_queue = None



def _init_worker(progress_queue, warm_proxy: bool = False) -> None:
    """Pool worker setup: die with the parent, report progress through the shared queue, and
    (for ladder cells behind the journaling proxy) have a warm proxy ready for the first cell."""
    global _progress_queue
    die_with_parent(signal.SIGKILL)
    _progress_queue = progress_queue
    if warm_proxy:
        from proxy.host import prepare_spare
        try:
            prepare_spare()
        except Exception as exc:  # the cell's own proxy start reports it, with what to do
            log.warning("proxy_spare_failed", error=str(exc))



def _run_cell(grid_path: str, cell_json: str, cell_dir: str, base_url: str) -> str:
    """Worker entry point: run one cell, reporting progress through the worker's queue; returns
    "done", or "stopped" when the cell reached a limit (limits.usd_per_cell)."""
    from orchestrator.run.cell_runner import cell_runner

    grid = load_grid(grid_path)
    cell = Cell.model_validate_json(cell_json)

    def progress(done: int, total: int) -> None:
        _progress_queue.put((cell.cell, done, total))

    return cell_runner(grid, cell, Path(cell_dir), base_url, progress=progress).run()



def start_run(grid_path: Path, runs_dir: Path, run_id: str | None = None,
              workers: int | None = None) -> Path:
    """Create `runs/<run-id>/` holding the validated grid (`open_run`), and run it."""
    run_dir = open_run(grid_path, runs_dir, run_id)
    execute(run_dir, workers)
    return run_dir



def execute(run_dir: Path, workers: int | None = None, show_progress: bool = True,
            prune_at_end: bool = True) -> list[str]:
    """Run (or continue) every cell of the run in `run_dir`; returns the cells that stopped at
    a limit (limits.usd_per_cell). `prune_at_end=False` leaves what the cells' own teardowns
    left behind (the conformance check looks for it). The cells run in a local process pool;
    `orchestrator.run.ray_executor.execute_ray_run` runs them on a Ray cluster instead."""
    grid_path = run_grid_path(run_dir)
    grid = load_grid(grid_path)
    if grid.collective is not None:
        raise ConfigError(f"{run_dir}: a collective grid runs its users in rounds: "
                         "orchestrator.run.collective.rounds.execute_collective (carc grid run does)")
    refuse_host_programs(grid)
    cells = grid.cells()
    run_prices(run_dir)  # before any worker: they only read it
    docker_used = needs_docker(grid)
    if docker_used:
        prepare_sandboxes(grid, run_dir, show_progress)
    try:
        return _execute(run_dir, grid_path, grid, cells, workers, show_progress)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the CLI turns it into this)
        raise RunInterrupted(run_dir) from None
    finally:
        if docker_used and prune_at_end:  # teardown runs in every cell; this catches what a killed worker left
            from sandboxes.docker_sandbox import prune
            prune(run=run_dir.name)



EFFORT_RANK = {"low": 0, "medium": 1, "high": 2}



def run_order(cells: list[Cell]) -> list[Cell]:
    """The order cells are started in: the likeliest longest first, so that no long cell starts
    last while the other workers sit idle. A row wiped before every instance restarts its
    harness each time; a harness costs more than a ladder learner; the program library runs
    its programs and is re-asked; a higher effort searches longer. Cells are independent, so
    the order changes no result, only when the grid ends."""
    def weight(cell: Cell) -> tuple:
        harness = cell.learner in HARNESSES
        return (harness and cell.row in STATELESS_ROWS, harness, cell.learner == "program-library",
                EFFORT_RANK.get(cell.effort, 1))
    return sorted(cells, key=weight, reverse=True)  # stable: the grid's order among equals



def _execute(run_dir: Path, grid_path: Path, grid: GridConfig, cells: list[Cell],
             workers: int | None, show_progress: bool) -> list[str]:
    from orchestrator.run.status import mark_started, record_failure
    workers = workers or min(grid.workers, len(cells))
    cells = run_order(cells)
    mark_started(run_dir)
    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue()
    servers = max(1, min(workers, os.cpu_count() or 1))
    with model_service(grid, RunPaths(run_dir).logs, servers, model_host(grid, cells)) as urls:
        progress = Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), disable=not show_progress)
        warm_proxy = grid.proxy.journal and any(c.learner not in HARNESSES for c in cells)
        with progress, ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                           initargs=(events, warm_proxy)) as pool:
            bars = {c.cell: progress.add_task(c.cell, total=None, start=False) for c in cells}
            futures = {pool.submit(_run_cell, str(grid_path), c.model_dump_json(),
                                   str(RunPaths(run_dir).cell(c.cell).root), urls[k % len(urls)]): c
                       for k, c in enumerate(cells)}
            pending = set(futures)
            failures: list[str] = []
            stopped: list[str] = []
            try:
                while pending:
                    _drain(events, progress, bars)
                    done = [f for f in pending if f.done()]
                    for future in done:
                        pending.discard(future)
                        try:
                            if future.result() == "stopped":
                                stopped.append(futures[future].cell)
                        except Exception as exc:  # report every failed cell, keep the others running
                            failures.append(f"{futures[future].cell}: {type(exc).__name__}: {exc}")
                            record_failure(run_dir, futures[future].cell, f"{type(exc).__name__}: {exc}")
                    time.sleep(0.1)
            except BaseException:
                # Leaving the pool would wait for every running cell; they are stopped instead
                # (the records they wrote stand; `execute` prunes what their sandboxes left).
                _stop_workers(pool)
                raise
            _drain(events, progress, bars)
    if failures:
        raise RunFailed("cells failed (resume with `carc grid run --resume RUN`):\n" + "\n".join(failures))
    return stopped



def _stop_workers(pool: ProcessPoolExecutor) -> None:
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        try:
            process.kill()
        except (OSError, ValueError):
            pass
    pool.shutdown(wait=False, cancel_futures=True)



def _drain(events, progress: Progress, bars: dict[str, int]) -> None:
    while True:
        try:
            cell, done, total = events.get_nowait()
        except queue.Empty:
            return
        # The clock of a cell starts with its first instance, not when it was queued.
        progress.start_task(bars[cell])
        progress.update(bars[cell], completed=done, total=total)
