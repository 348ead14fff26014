"""Running a grid: the run directory, the embedded model server, cells in parallel, progress.

`start_run` creates `runs/<run-id>/` with the grid; `resume_run` continues one. Cells run in
worker processes (one cell per process at a time); each cell writes only inside its own folder.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import httpx
import structlog
import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness_adapters import registry
from orchestrator.errors import ConfigError, RunFailed
from orchestrator.records import RunPaths
from orchestrator.rows import STATELESS_ROWS
from proxy.host import die_with_parent, free_port
from orchestrator.run.cell_services import refuse_host_programs
from orchestrator.run.grid_config import (EMBEDDED, HARNESSES, Cell, GridConfig, grid_differences, load_grid, run_prices,
                                         write_run_grid)
from sandboxes.engines import harness_engine, sandbox_engine

log = structlog.get_logger("carc.grid")


@contextmanager
def model_service(grid: GridConfig, log_dir: Path, servers: int = 1,
                  host: str = "127.0.0.1", tag: str = "", processes: int = 1,
                  prior: Path | None = None) -> Iterator[list[str]]:
    """Base URLs learners use: the grid's endpoint, or fresh embedded solver-model servers.

    The embedded model is CPU-bound, so one single-process server per core is started (each dies
    with this process, and only with it: a signal to the process group does not reach it); cells
    are spread over them. `tag` names their logs apart
    (`model-server-<tag>N.log`: the Ray executor starts one per cell attempt, on its node).
    `prior`: serve the embedded model as trained to this primitive prior (a collective grid's
    trained row, orchestrator/run/collective/training.py).
    """
    if grid.model.endpoint != EMBEDDED:
        yield [grid.model.endpoint.rstrip("/")]
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    procs, urls = [], []
    try:
        for number in range(servers):
            port = free_port()
            out = open(log_dir / f"model-server-{tag}{number}.log", "ab")
            cmd = [sys.executable, "-m", "orchestrator.cli", "model", "serve", "--host",
                   host, "--port", str(port),
                   "--usage-log", str(log_dir / f"model-usage-{tag}{number}.jsonl"),
                   "--seed", str(grid.model.seed), "--workers", str(processes)]
            if grid.model.timing is not None:
                cmd += ["--timing", grid.model.timing.model_dump_json()]
            if prior is not None:
                cmd += ["--prior", str(prior)]
            # a session of its own: Ctrl-C (SIGINT to the terminal's process group) stops the
            # run, which ends its instances before it stops the model, not the model under them
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=lambda: die_with_parent(signal.SIGKILL)))
            out.close()
            urls.append(f"http://{host}:{port}/v1")
        for proc, base_url in zip(procs, urls):
            _wait_ready(proc, base_url, log_dir)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_ready(proc: subprocess.Popen, base_url: str, log_dir: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the embedded model server exited with code {proc.returncode}; "
                               f"see the logs in {log_dir}")
        try:
            if httpx.get(f"{base_url}/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the embedded model server did not answer on {base_url} in 60 s")
        time.sleep(0.2)


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
    from orchestrator.run.runner import cell_runner

    grid = load_grid(grid_path)
    cell = Cell.model_validate_json(cell_json)

    def progress(done: int, total: int) -> None:
        _progress_queue.put((cell.cell, done, total))

    return cell_runner(grid, cell, Path(cell_dir), base_url, progress=progress).run()


class RunInterrupted(Exception):
    """The run was stopped (Ctrl-C, SIGTERM): its workers are gone, its containers, volumes and
    networks pruned; every record written stands and `--resume` continues from them."""

    def __init__(self, run_dir: Path):
        super().__init__(f"interrupted; continue with `carc grid run --resume {run_dir}`")
        self.run_dir = run_dir


class GridMismatch(ConfigError):
    """A run folder was asked to continue with a grid other than the one it was started with."""


def stopped_cells(run_dir: Path) -> list[str]:
    """The cells of a run whose latest record is a stop at limits.usd_per_cell."""
    from orchestrator.records import last_stop, read_events
    return [cell.name for cell in RunPaths(run_dir).cell_folders()
            if cell.events.exists() and last_stop(read_events(cell.events)) is not None]


def set_usd_per_cell(run_dir: Path, usd: float) -> None:
    """Change the stored grid's limits.usd_per_cell (the one field a run may change: it decides
    when a cell stops, never what a verdict is)."""
    if not usd > 0:
        raise ConfigError(f"--usd-per-cell {usd}: give a positive number of dollars")
    path = RunPaths(run_dir).grid
    grid = load_grid(path)
    grid.limits.usd_per_cell = usd
    text = path.read_text()
    data = yaml.safe_load(text)
    data.setdefault("limits", {})["usd_per_cell"] = float(usd)
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header + yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)
    log.info("usd_per_cell_set", run=str(run_dir), usd=usd)


def start_run(grid_path: Path, runs_dir: Path, run_id: str | None = None,
              workers: int | None = None) -> Path:
    """Create `runs/<run-id>/` holding the validated grid (`open_run`), and run it."""
    run_dir = open_run(grid_path, runs_dir, run_id)
    execute(run_dir, workers)
    return run_dir


def open_run(grid_path: Path, runs_dir: Path, run_id: str | None = None) -> Path:
    """Create `runs/<run-id>/` holding the validated grid. A run id that exists is continued when the grid is the
    same one (limits.usd_per_cell may differ: the stored one is raised or lowered to it), and
    refused naming the differences when not."""
    grid = load_grid(grid_path)
    run = RunPaths(runs_dir / (run_id or f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{grid.name}"))
    if run.grid.exists():
        stored = load_grid(run.grid)
        if stored.limits.usd_per_cell != grid.limits.usd_per_cell and grid.limits.usd_per_cell:
            set_usd_per_cell(run.root, grid.limits.usd_per_cell)
            stored = load_grid(run.grid)
        differences = grid_differences(stored, grid)
        if differences:
            raise GridMismatch(f"{run.root} was started with another grid: {'; '.join(differences[:8])}. "
                               f"Continue it with `carc grid run --resume {run.root}`, or give another --run-id")
    else:
        run.cells.mkdir(parents=True, exist_ok=True)
        write_run_grid(grid, Path(grid_path), run.root)
    return run.root


def run_grid_path(run_dir: Path) -> Path:
    """The grid a run folder runs: its own validated copy, whatever became of the original."""
    return RunPaths(run_dir).grid


def needs_docker(grid: GridConfig) -> bool:
    if grid.track.name == "arc3":  # the engine runs in its own container
        return True
    learners = {c.learner for c in grid.cells()}
    return bool(learners & HARNESSES) or (sandbox_engine(grid.sandbox.engine).needs_docker
                                          and "program-library" in learners)


def model_host(grid: GridConfig, cells: Iterable[Cell] | None = None) -> str:
    """Where this machine's model servers listen for `cells` (default: the grid's): where the
    harness engine's proxies reach the host (docker's: the host's bridge address, which no
    sandbox reaches), or loopback when no harness is among them."""
    if not any(cell.learner in HARNESSES for cell in (grid.cells() if cells is None else cells)):
        return "127.0.0.1"
    return harness_engine(grid.sandbox.engine).model_host()


def harness_learners(grid: GridConfig) -> list[str]:
    return sorted({c.learner for c in grid.cells()} & HARNESSES)


def prepare_sandboxes(grid: GridConfig, run_dir: Path, show_progress: bool) -> None:
    """Build (or find) the images before any cell starts, and clear a crashed attempt's leftovers."""
    from rich.console import Console

    from sandboxes.docker_sandbox import prune
    from sandboxes.images import ensure_image

    with Console().status("preparing sandbox images ...") if show_progress else nullcontext():
        if grid.track.name == "arc3":
            ensure_image("arc3-engine", grid.sandbox.base)  # Python >= 3.12 and the official engine
        else:
            ensure_image("base", grid.sandbox.base)
        for name in harness_learners(grid):
            ensure_image("proxy", grid.sandbox.base)
            ensure_image(registry.adapter(name).recipe, grid.sandbox.base)
    pruned = prune(run=run_dir.name)
    if pruned.containers:
        log.info("pruned_leftovers", run=run_dir.name, containers=len(pruned.containers))


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
                         "orchestrator.run.collective.runner.execute_collective (carc grid run does)")
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
