"""A collective grid on a Ray cluster: `carc grid run GRID --executor ray [--address ADDR]`.

One Ray task per (row, round, user): the user's slots of that round, on whichever node Ray
places it, with the same options as a cell's task (a `docker` slot, the sandbox's CPUs and
memory, `max_retries` for a lost node). The driver (the head) keeps the rounds: a row submits the
tasks of round r only after its update step wrote `shared/round-r/`, and runs the update step of
round r+1 only after every user's task of round r has ended. The update step runs on the head,
exactly as on the local executor (a harness row's curator in a sandbox there: the head needs a
Docker engine then).

Each task is a new attempt at its user: it takes the user's fencing token (`CellFence`,
`users/uNNNN/attempt.json`) before it reads anything, so an attempt lost behind a partition has
every further record refused, and the retried one resumes the user from its records, exactly as
a cell's does. Every task starts its own services on its node: the embedded model (with the
round's trained prior on a trained row; about a second per task, against the round's 25
instances), and a journaling proxy of its own that writes into the user's own journal
(`users/uNNNN/journal/`, as a harness user's proxy container does; the local executor's ladder
rows share one proxy per row): no two nodes append to one file.

Records go straight into the run folder (`--durability shared`: a filesystem every node mounts at
the same path); `--durability head` (records through the head's actor) is for cells only.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import structlog
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.errors import ConfigError, RunFailed
from orchestrator.records import CellFence, RunPaths
from orchestrator.rows import row
from orchestrator.run.collective.rounds import (Checkers, UserRunner, round_model, row_failures,
                                                row_services, shares, update_shared)
from orchestrator.run.collective.schedule import rounds, user_schedule
from orchestrator.run.collective.training import RoundModel
from orchestrator.run.grid_config import HARNESSES, Cell, load_grid
from orchestrator.run.ray_executor import attempt_holder, cell_options, connect, on_every_node, prepare_node

log = structlog.get_logger("carc.collective.ray")


def run_user_round(run_dir: str, cell_json: str, user: int, number: int) -> int:
    """One attempt at one user's round `number`, on whichever node Ray placed it; how many
    instances it ran."""
    import ray

    from orchestrator.run.model_service import model_host, model_service
    from sandboxes.docker_sandbox import NODE_ENV

    os.environ[NODE_ENV] = ray.get_runtime_context().get_node_id()  # a node back from the dead finds its objects
    run = RunPaths(run_dir)
    if not run.grid.exists():
        raise RuntimeError(
            f"{run.grid} is not on this node ({socket.gethostname()}): a collective grid on Ray needs the "
            "run folder on a filesystem every node mounts at the same path (e.g. NFS)")
    grid = load_grid(run.grid)
    cell = Cell.model_validate_json(cell_json)
    paths = run.cell(cell.cell)
    user_paths = paths.user(user)
    fence = CellFence.take(user_paths.root, attempt_holder())
    log.info("user_attempt", cell=cell.cell, user=user, round=number, token=fence.token, holder=fence.holder)
    shared = paths.shared_round(number) if shares(grid, cell) else None
    tag = f"{cell.cell}-u{user:04d}-r{number}.{fence.token}-"
    checkers = Checkers(grid, run.name, tag)
    try:
        with ExitStack() as stack:
            trained = shared is not None and row(cell.row).shared == "model"
            upstream, name = "", ""
            if not (trained and RoundModel.read(shared) is not None):  # the grid's model, served here
                upstream = stack.enter_context(model_service(grid, run.logs, 1, model_host(grid), tag=tag))[0]
            if trained:  # the round's model: the grid's until the first update
                upstream, name = stack.enter_context(round_model(grid, cell, run.root, shared, number, upstream))
            runner = UserRunner(grid, cell, user_paths.root, "", fence=fence, schedule=user_schedule(grid, cell, user),
                                user=user, upstream=upstream, model_name=name)
            services = None if cell.learner in HARNESSES else stack.enter_context(
                row_services(grid, cell, user_paths, upstream, checkers))
            readable = shared if row(cell.row).shared == "learner" else None
            return runner.run_round(number, services, readable, threading.Event(), lambda: None)
    finally:
        checkers.close()


def execute_collective_ray(run_dir: Path, workers: int | None = None, address: str | None = None,
                           show_progress: bool = True, durability: str = "shared") -> list[str]:
    """Run (or continue) every row of the collective run in `run_dir` through all its rounds,
    each user's round a Ray task (`execute_collective`'s counterpart). Returns []."""
    import ray

    from orchestrator.run.grid_config import run_prices
    from orchestrator.run.model_service import model_host, model_service
    from orchestrator.run.run_folder import RunInterrupted, run_grid_path
    from orchestrator.run.status import mark_started

    if durability != "shared":
        raise ConfigError(f"--durability {durability}: a collective grid on Ray writes into the run folder "
                         "itself (--durability shared: a filesystem every node mounts at the same path); "
                         "records through the head's actor are for single-user grids")
    run_dir = Path(run_dir).resolve()
    grid = load_grid(run_grid_path(run_dir))
    run = RunPaths(run_dir)
    cells = grid.cells()
    run_prices(run_dir)
    users, plan = grid.collective_settings.users, rounds(grid)
    curated = [c for c in cells if c.learner in HARNESSES and shares(grid, c)]
    owned = connect(address, workers or grid.workers)
    task = ray.remote(run_user_round)
    stop = threading.Event()
    live: set = set()  # refs not yet ended, for cancelling on Ctrl-C
    lock = threading.Lock()
    failures: list[str] = []
    try:
        on_every_node(prepare_node, run.name, grid)
        mark_started(run_dir)
        progress = Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), disable=not show_progress)
        # the curators' model, on the head (their sandboxes run here); ladder updates need none
        with ExitStack() as head, progress:
            upstream = head.enter_context(model_service(grid, run.logs, 1, model_host(grid), tag="head-")
                                          )[0] if curated else ""
            bars = {c.cell: progress.add_task(c.cell, total=users * len(user_schedule(grid, c, 0))) for c in cells}
            ended = _Ended(run, cells, users)

            def drive(cell: Cell) -> None:
                paths = run.cell(cell.cell)
                paths.root.mkdir(parents=True, exist_ok=True)
                cell.record().write(paths.settings)
                for number in range(plan.total):
                    if shares(grid, cell):
                        update_shared(grid, cell, paths, number, upstream)
                    with lock:  # submitted and listed at once: Ctrl-C cancels every task it lets start
                        if stop.is_set():
                            return
                        refs = [task.options(**cell_options(grid, cell)).remote(
                            str(run_dir), cell.model_dump_json(), u, number) for u in range(users)]
                        live.update(refs)
                    errors = []
                    for user, ref in enumerate(refs):
                        try:
                            ray.get(ref)
                        except Exception as exc:  # the others of the round end first; the row stops
                            cause = getattr(exc, "cause", None) or exc
                            errors.append(f"user {user}: {type(cause).__name__}: {cause}")
                        with lock:
                            live.discard(ref)
                    if errors:
                        raise RuntimeError(f"round {number}: " + "; ".join(errors[:5]))

            with ThreadPoolExecutor(len(cells), thread_name_prefix="row") as rows:
                drivers = {rows.submit(drive, c): c for c in cells}
                try:
                    while not all(f.done() for f in drivers):
                        _show(progress, bars, ended)
                        time.sleep(0.5)
                except BaseException:
                    with lock:
                        stop.set()  # no row submits another round; the records written stand
                        for ref in live:
                            try:
                                ray.cancel(ref, force=True)
                            except Exception:  # already ended
                                pass
                    raise
                _show(progress, bars, ended)
                failures += row_failures(run_dir, drivers)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the CLI turns it into this)
        raise RunInterrupted(run_dir) from None
    finally:
        try:
            on_every_node(prepare_node, run.name, None)
        except Exception as exc:  # a node lost at the very end: its engine keeps the labels
            log.warning("prune_on_nodes_failed", run=run.name, error=str(exc))
        if curated:  # the curators' sandboxes ran here
            from sandboxes.docker_sandbox import prune
            prune(run=run.name)
        if owned:
            ray.shutdown()
    if failures:
        raise RunFailed("rows failed (resume with `carc grid run --resume RUN --executor ray`):\n"
                           + "\n".join(failures))
    return []


class _Ended:
    """Instances ended per row, read from its users' events as they grow (each file from where
    the last read stopped: a hundred users' records are not read whole twice a second)."""

    def __init__(self, run: RunPaths, cells: list[Cell], users: int):
        self.files = {c.cell: [run.cell(c.cell).user(u).events for u in range(users)] for c in cells}
        self.read: dict[Path, tuple[int, int]] = {}  # file -> (bytes read, instance ends in them)

    def count(self, cell: str) -> int:
        total = 0
        for path in self.files[cell]:
            offset, ended = self.read.get(path, (0, 0))
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except FileNotFoundError:
                data = b""
            whole = data[:data.rfind(b"\n") + 1]  # a line still being written is read next time
            for line in whole.splitlines():
                try:
                    ended += json.loads(line).get("type") == "instance_end"
                except ValueError:  # a torn line a killed attempt left: resume cuts it
                    pass
            self.read[path] = (offset + len(whole), ended)
            total += ended
        return total


def _show(progress: Progress, bars: dict[str, int], ended: _Ended) -> None:
    for cell, bar in bars.items():
        progress.update(bar, completed=ended.count(cell))
