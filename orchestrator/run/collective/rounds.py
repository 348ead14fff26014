"""Running a collective grid: every user of every row through its rounds, and the update steps.

A row (a cell of the grid: learner x row x effort) serves `collective.users` users. Round r runs
each user's slots of round r (`schedule.user_schedule`) with the row's frozen shared state
`shared/round-r/`; users are independent inside a round (their own state, the same frozen shared
state, a model whose answer depends only on the conversation), so the order and the number of
workers they run with change no result. When every user has finished round r, the update step
(`update_shared`: the learner's own `merge_shared`) writes `shared/round-(r+1)/` from the shared
state of round r and every user's state at the end of it, whole or not at all (a folder renamed
into place). Rows that share nothing (the stateless floor, memory-on: each user's independent
learner, or `share: false`) go through the same rounds with no shared state.

Each user's instances run exactly as a cell's (`CellRunner` on the one slot driver,
`orchestrator/run/slot_driver.py`: fsynced step events, the protocol replayed on resume), so a
killed run resumes at any instance of any user, and at any update. One journaling proxy per row
serves all its users; each call carries its user, slot and phase in a tag the proxy reads and
removes (proxy.journal.TAG_HEADER).
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import itertools
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import structlog
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness_adapters import registry
from harness_adapters.chat_model import ChatModel
from harness_adapters.program_check import ProgramExecutor, SandboxExecutor, local_executor
from orchestrator.errors import RunFailed
from orchestrator.run.collective.schedule import UserSlot, rounds, user_schedule
from orchestrator.prompts import PromptSet
from orchestrator.records import (CellPaths, EventLog, RunPaths, SandboxRecord, UserPaths, read_events,
                                  truncate_torn_tail, write_json)
from orchestrator.rows import row
from orchestrator.run.collective.training import RoundModel, RoundRecords, trainer_class
from orchestrator.run.cell_services import CellServices, HostStateDir, ladder_learner, refuse_host_programs, sandbox_limits
from orchestrator.run.grid_config import HARNESSES, Cell, GridConfig, load_grid, price_table, run_prices
from orchestrator.run.collective.harness_rows import CURATOR, LIBRARY, curate, user_sandbox
from orchestrator.run.cell_runner import CellRunner
from orchestrator.run.schedule import ScheduledSlot
from orchestrator.run.slot_driver import run_restarting
from sandboxes.engines import sandbox_engine
from proxy.journal import make_tag

log = structlog.get_logger("carc.collective")

UPDATE_FILE = "update.json"


def shares(grid: GridConfig, cell: Cell) -> bool:
    """Whether the row has update steps: a shared state its learners read (row collective) or a
    model trained between rounds (row trained)."""
    return grid.collective is not None and grid.collective_settings.share and row(cell.row).shared is not None


class TagControl:
    """A user's `SlotControl`: its calls carry (user, slot, phase) to the row's proxy."""

    def __init__(self, model: ChatModel, user: int):
        self.model = model
        self.user = user

    def set_slot(self, slot: int | None, phase: str) -> None:
        self.model.set_tag(make_tag(self.user, slot, phase))  # type: ignore[arg-type]


@dataclass
class UserRunner(CellRunner):
    """One user of a collective row: `CellRunner`'s instances, with the row's services shared."""

    user: int = 0
    schedule: list[UserSlot] = field(default_factory=list)
    upstream: str = ""  # a harness user's proxy container calls this model URL
    model_name: str = ""  # the model a trained row's round calls ("": the grid's)

    def __post_init__(self) -> None:  # no cell.json per user: the row's cell folder has it
        self.paths = UserPaths(self.cell_dir)
        self.events_path = self.paths.events
        self.state_dir = self.paths.state
        self.journal_tail = None
        for folder in (self.paths.state, self.paths.snapshots):
            folder.mkdir(parents=True, exist_ok=True)
        self.limits = self.grid.limits.limits()
        self.prompts = PromptSet.load(self.grid.prompts)
        self.round_of = {u.slot.index: u.round for u in self.schedule}

    def _event(self, kind: str, slot: ScheduledSlot, **fields):
        return super()._event(kind, slot, user=self.user, round=self.round_of[slot.index], **fields)

    def run_round(self, number: int, row_services: CellServices | None, shared_dir: Path | None,
                  stop: threading.Event, done: Callable[[], None]) -> int:
        """Run this user's unfinished slots of round `number`; returns how many instances ran.
        A harness user's sandbox that fails under it (an infrastructure fault) is replaced and
        the instance run again from its start, as a single-user cell does."""
        return run_restarting(lambda: self._run_round(number, row_services, shared_dir, stop, done),
                              None, restartable=self.cell.learner in HARNESSES,
                              cell=self.cell.cell, user=self.user)

    @contextmanager
    def _services(self, row_services: CellServices | None, shared_dir: Path | None) -> Iterator[CellServices]:
        """A harness user's sandbox for the round; a ladder user's view of its row's services."""
        if self.cell.learner in HARNESSES:
            library = shared_dir / LIBRARY if shared_dir is not None else None
            with user_sandbox(self.grid, self.cell, self.paths, self.upstream, library) as services:
                yield services
            return
        assert row_services is not None
        endpoint = self.grid.model.endpoint_for(self.cell.effort, row_services.model_base_url)
        if self.model_name:
            endpoint = endpoint.model_copy(update={"model": self.model_name})
        price = price_table(self.grid).lookup(endpoint.model) or price_table(self.grid).lookup(self.grid.model.name)
        if price is not None:
            endpoint = endpoint.model_copy(update={"input_usd_per_mtok": price.input_per_m,
                                                   "output_usd_per_mtok": price.output_per_m})
        if row_services.proxy is not None:  # the proxy injects the real key; the learner has none
            endpoint = endpoint.model_copy(update={"api_key_env": ""})
        self.model = ChatModel(endpoint)
        yield CellServices(row_services.model_base_url, HostStateDir(self.state_dir), row_services.executor,
                           TagControl(self.model, self.user) if row_services.proxy is not None else None,
                           infrastructure=row_services.infrastructure)

    def _run_round(self, number: int, row_services: CellServices | None, shared_dir: Path | None,
                   stop: threading.Event, done: Callable[[], None]) -> int:
        slots = [u.slot for u in self.schedule if u.round == number]
        truncate_torn_tail(self.events_path)
        events = read_events(self.events_path)
        finished = {e.slot for e in events if e.type == "instance_end"}
        todo = [s for s in slots if s.index not in finished]
        if not todo:
            return 0
        with self._services(row_services, shared_dir) as services:
            self.services = services
            self.state = services.state
            # The state as it was after this user's last finished instance (a killed instance's
            # writes, if any, are undone), whatever round that was in.
            before = [u.slot for u in self.schedule if u.slot.index in finished]
            self._restore(before[-1] if before else None)
            self.learner = services.harness or ladder_learner(self.cell, self.state_dir, self.prompts, self.model,
                                                              services.executor)
            self.learner.shared_dir = shared_dir if services.harness is None else None
            try:
                with EventLog(self.events_path, self.fence) as journal:  # fenced on Ray
                    return self._run_slots(todo, events, journal, lambda *_: done(), stop=stop)
            finally:
                self.learner.close()

    def _snapshot(self, slot: ScheduledSlot) -> list:
        """The state after this instance. A ladder user's earlier snapshot goes (resume and the
        update step only ever need the latest); a harness user's are kept, as a single-user
        cell's, for the inspector's account of what it kept and when."""
        left_out = self.state.snapshot(self.paths.snapshot(slot.index))
        if self.cell.learner in HARNESSES:
            return left_out
        for path in self.paths.snapshots.glob("*.tar.gz"):
            if path != self.paths.snapshot(slot.index):
                path.unlink(missing_ok=True)
        return left_out


def update_shared(grid: GridConfig, cell: Cell, paths: CellPaths, number: int, upstream: str = "") -> Path:
    """Write the shared state of round `number` (round 0: empty) from round `number - 1`'s
    shared state and every user's state after its last instance, unless it is written already
    (a harness's: its curator session, calling the model at `upstream`). Resumable: the folder
    is built beside its place and renamed into it when whole."""
    target = paths.shared_round(number)
    if target.exists():
        return target
    tmp = target.with_name(target.name + ".tmp")
    if (tmp / CURATOR).is_dir():  # a killed curator's calls are records too: kept beside the round
        aborted = target.with_name(target.name + ".aborted")
        aborted.mkdir(exist_ok=True)
        os.replace(tmp / CURATOR, aborted / f"attempt-{len(list(aborted.iterdir())) + 1}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.monotonic()
    record: dict = {"round": number, "users": 0}
    if number > 0:
        previous = update_shared(grid, cell, paths, number - 1, upstream)
    if number > 0 and row(cell.row).shared == "model":
        trainer = trainer_class(grid.collective_settings.trainer)(grid, cell)
        counts = trainer.between_rounds(RoundRecords(paths, number - 1, grid.collective_settings.users), previous, tmp)
        if RoundModel.read(tmp) is None:  # what the next round serves is readable before it is kept
            raise RuntimeError(f"trainer {grid.collective_settings.trainer} wrote no {tmp.name}/model.json")
        record.update(users=grid.collective_settings.users, **counts)
    elif number > 0 and cell.learner in HARNESSES:
        tasks = {u.slot.task_id for u in user_schedule(grid, cell, 0)}  # every user meets every task
        record.update(users=grid.collective_settings.users,
                      **curate(grid, cell, paths, number, previous, tmp, upstream, tasks))
    elif number > 0:
        with tempfile.TemporaryDirectory(prefix="carc-update-") as scratch:
            kept = []
            for user in range(grid.collective_settings.users):
                snapshot = paths.user(user).latest_snapshot()
                if snapshot is None:
                    continue
                folder = Path(scratch) / f"u{user:04d}"
                folder.mkdir()
                with tarfile.open(snapshot) as tar:
                    tar.extractall(folder, filter="data")
                kept.append(folder)
            counts = registry.learner_class(cell.learner).merge_shared(previous, kept, tmp)
        record.update(users=len(kept), **counts)
    record["seconds"] = round(time.monotonic() - started, 3)
    write_json(tmp / UPDATE_FILE, record)
    _fsync_tree(tmp)
    os.replace(tmp, target)
    _fsync_dir(target.parent)
    log.info("shared_state_written", cell=cell.cell, round=number, **{k: v for k, v in record.items() if k != "round"})
    return target


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            with open(Path(folder) / name, "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(Path(folder))


def _fsync_dir(folder: Path) -> None:
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


class Checkers:
    """Program checks for the program library's users: one long-lived checker container (no
    network) per worker thread, started on first use (`sandbox.engine: docker`), or host
    subprocesses (`process`)."""

    def __init__(self, grid: GridConfig, run_name: str, name: str = ""):
        self.grid = grid
        self.run_name = run_name
        self.name = name  # apart from every other Checkers' containers on the engine (Ray: one per task)
        self.local = threading.local()
        self.started: list[SandboxExecutor] = []
        self.numbered = 0
        self.lock = threading.Lock()

    def executor(self) -> ProgramExecutor:
        engine = sandbox_engine(self.grid.sandbox.engine)
        if not engine.isolates_programs:
            return local_executor
        current = getattr(self.local, "executor", None)
        if current is None:
            from sandboxes.docker_sandbox import SandboxSpec
            from sandboxes.images import ensure_image
            with self.lock:
                number = self.numbered
                self.numbered += 1
            spec = SandboxSpec(ensure_image("base", self.grid.sandbox.base), run=self.run_name,
                               cell=f"collective-checker-{self.name}{number}", proxy=None, volume=False,
                               limits=sandbox_limits(self.grid))
            current = SandboxExecutor(engine.open(spec))
            self.local.executor = current
            with self.lock:
                self.started.append(current)
        return current

    def fault(self) -> str | None:
        current = getattr(self.local, "executor", None)
        return current.sandbox.fault() if current is not None else None

    def close(self) -> None:
        with self.lock:
            started, self.started = self.started, []
        for executor in started:
            try:
                executor.close()
            finally:
                executor.sandbox.teardown()


class _ThreadExecutor:
    """The executor of whichever worker thread calls it (a learner is built in its thread)."""

    def __init__(self, checkers: Checkers):
        self.checkers = checkers

    def __call__(self, *args, **kwargs):
        return self.checkers.executor()(*args, **kwargs)


@contextmanager
def row_services(grid: GridConfig, cell: Cell, paths: CellPaths, upstream: str,
                 checkers: Checkers) -> Iterator[CellServices]:
    """A row's proxy (tags on: its users' calls carry user, slot and phase; request bodies kept
    only in raw/, gzipped: a row's requests carry its library, a hundred users' worth of lines)
    and program checks."""
    from proxy.host import HostProxy

    refuse_host_programs(grid)  # a Ray node may run as another user than the run's start
    with ExitStack() as stack:
        proxy = None
        base_url = upstream
        if grid.proxy.journal:
            proxy = stack.enter_context(HostProxy(
                paths.journal, cell.cell, upstream, allow=(urlsplit(upstream).netloc,),
                key_env=grid.model.api_key_env, mode="reverse", prices=run_prices(paths.run.root),
                tags=True, requests="raw"))
            base_url = proxy.base_url
        runs_programs = registry.learner_class(cell.learner).runs_programs
        engine = sandbox_engine(grid.sandbox.engine)
        checks = (engine.name if engine.isolates_programs else "host-process") if runs_programs else None
        SandboxRecord(proxy="host-mitmdump" if proxy else None, model_base_url=base_url, upstream=upstream,
                      program_checks=checks).write(paths.sandbox)
        yield CellServices(base_url, HostStateDir(paths.state), _ThreadExecutor(checkers), proxy,
                           infrastructure=([proxy.fault] if proxy else []) + [checkers.fault])


@contextmanager
def round_model(grid: GridConfig, cell: Cell, run_dir: Path, shared: Path, number: int,
                untrained: str) -> Iterator[tuple[str, str]]:
    """(base URL, model name) of the model a trained row's users call in round `number`: the
    grid's model until the first update, then the round's: the embedded model served with its
    trained prior, or the model it names at another endpoint."""
    from orchestrator.run.model_service import model_service

    model = RoundModel.read(shared)
    if model is None:
        yield untrained, grid.model.name
        return
    if model.endpoint is not None:
        yield model.endpoint, model.name or grid.model.name
        return
    with model_service(grid, RunPaths(run_dir).logs, 1, tag=f"{cell.cell}-round{number}-",
                       processes=os.cpu_count() or 1, prior=model.prior_path(shared)) as urls:
        yield urls[0], grid.model.name


def execute_collective(run_dir: Path, workers: int | None = None, show_progress: bool = True) -> list[str]:
    """Run (or continue) every row of the collective run in `run_dir` through all its rounds.
    Returns [] (a collective row has no dollar cap of its own yet)."""
    from orchestrator.run.run_folder import needs_docker, prepare_sandboxes, run_grid_path
    from orchestrator.run.status import mark_started

    run_dir = Path(run_dir)
    grid = load_grid(run_grid_path(run_dir))
    refuse_host_programs(grid)
    cells = grid.cells()
    run_prices(run_dir)
    docker = needs_docker(grid)  # harness rows' sandboxes, the program library's checks
    if docker:
        prepare_sandboxes(grid, run_dir, show_progress)
    mark_started(run_dir)
    workers = workers or grid.workers
    users = grid.collective_settings.users
    plan = rounds(grid)
    schedules = {c.cell: [user_schedule(grid, c, u) for u in range(users)] for c in cells}
    stop = threading.Event()
    failures: list[str] = []
    progress = Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), disable=not show_progress)
    checkers = Checkers(grid, run_dir.name)
    try:
        _run_rows(grid, run_dir, cells, schedules, plan, workers, checkers, progress, stop, failures)
    finally:  # after every user thread has ended: no check is ever cut off by its teardown
        checkers.close()
        if docker:  # catches what a killed checker or user left
            from sandboxes.docker_sandbox import prune
            prune(run=run_dir.name)
    if failures:
        raise RunFailed("rows failed (resume with `carc grid run --resume RUN`):\n" + "\n".join(failures))
    return []



class RowPool:
    """The user threads every row shares: a free thread takes the oldest waiting user of the row
    with the fewest users running (ties: the row served longest ago), so every row with work
    runs at once and none waits behind another row's round. (A first-come-first-served pool let
    two rows take all 16 threads for the first rounds while four rows stood at 0.)

    Threads live as long as the pool, so the checkers' one container per thread stays theirs.
    `shutdown` runs what is queued, as a ThreadPoolExecutor's does: a stopped run's users end
    before their next instance."""

    def __init__(self, workers: int, name: str = "user"):
        self._changed = threading.Condition()
        self._waiting: dict[str, deque[tuple[Future, Callable[..., Any], tuple]]] = {}
        self._running: Counter[str] = Counter()
        self._served: dict[str, int] = {}
        self._ticks = itertools.count()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{n}", daemon=True)
                         for n in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, key: str, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._changed:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            self._waiting.setdefault(key, deque()).append((future, fn, args))
            self._changed.notify()
        return future

    def _take(self) -> tuple[str, tuple[Future, Callable[..., Any], tuple]] | None:
        keys = [k for k, jobs in self._waiting.items() if jobs]
        if not keys:
            return None
        key = min(keys, key=lambda k: (self._running[k], self._served.get(k, -1)))
        self._running[key] += 1
        self._served[key] = next(self._ticks)
        return key, self._waiting[key].popleft()

    def _work(self) -> None:
        while True:
            with self._changed:
                while (taken := self._take()) is None:
                    if self._closed:
                        return
                    self._changed.wait()
            key, (future, fn, args) = taken
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = fn(*args)
                    except BaseException as exc:  # noqa: BLE001 - the caller's to see, as in an executor
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                with self._changed:
                    self._running[key] -= 1

    def shutdown(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> RowPool:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def row_failures(run_dir: Path, drivers: dict[Future, Cell]) -> list[str]:
    """Wait for every row's driver; each row that raised, recorded in logs/failures.jsonl (the
    other rows went on; resume continues this one)."""
    from orchestrator.run.status import record_failure

    failures = []
    for future, cell in drivers.items():
        try:
            future.result()
        except Exception as exc:
            failures.append(f"{cell.cell}: {type(exc).__name__}: {exc}")
            record_failure(run_dir, cell.cell, f"{type(exc).__name__}: {exc}")
    return failures


def _run_rows(grid: GridConfig, run_dir: Path, cells: list[Cell], schedules: dict, plan, workers: int,
              checkers: Checkers, progress: Progress, stop: threading.Event, failures: list[str]) -> None:
    from orchestrator.run.model_service import model_host, model_service

    users = len(next(iter(schedules.values())))
    host = model_host(grid)
    # the embedded model: one server whose processes (one per core) share its port, so every
    # row's proxy has one upstream and the kernel spreads the calls
    with model_service(grid, RunPaths(run_dir).logs, 1, host=host, processes=os.cpu_count() or 1) as urls, \
            progress, RowPool(workers) as pool, ExitStack() as stack:

        def drive(cell: Cell) -> None:
            paths = RunPaths(run_dir).cell(cell.cell)
            paths.root.mkdir(parents=True, exist_ok=True)
            cell.record().write(paths.settings)
            total = sum(len(s) for s in schedules[cell.cell])
            done_before = sum(sum(1 for e in read_events(paths.user(u).events) if e.type == "instance_end")
                              for u in range(users))
            bar = progress.add_task(cell.cell, total=total, completed=done_before)
            runners = [UserRunner(grid, cell, paths.user(u).root, "", schedule=schedules[cell.cell][u], user=u,
                                  upstream=urls[0]) for u in range(users)]
            trained = shares(grid, cell) and row(cell.row).shared == "model"
            with ExitStack() as row_stack:
                # one proxy for the row's whole run; a trained row's follows its model, round by
                # round; a harness's users have one each, in their sandboxes
                services = None if trained or cell.learner in HARNESSES else row_stack.enter_context(
                    row_services(grid, cell, paths, urls[0], checkers))
                for number in range(plan.total):
                    shared = update_shared(grid, cell, paths, number, urls[0]) if shares(grid, cell) else None
                    with ExitStack() as round_stack:
                        if trained:
                            assert shared is not None
                            upstream, name = round_stack.enter_context(
                                round_model(grid, cell, run_dir, shared, number, urls[0]))
                            for runner in runners:
                                runner.model_name = name
                            services = round_stack.enter_context(
                                row_services(grid, cell, paths, upstream, checkers))
                        readable = shared if row(cell.row).shared == "learner" else None
                        jobs: list[Future] = [pool.submit(cell.cell, r.run_round, number, services, readable,
                                                          stop, lambda: progress.advance(bar))
                                              for r in runners]
                        wait(jobs)
                    errors = [f"user {runners[k].user}: {type(j.exception()).__name__}: {j.exception()}"
                              for k, j in enumerate(jobs) if j.exception() is not None]
                    if errors:
                        raise RuntimeError(f"round {number}: " + "; ".join(errors[:5]))
                    if stop.is_set():
                        return

        rows = stack.enter_context(ThreadPoolExecutor(len(cells), thread_name_prefix="row"))
        drivers = {rows.submit(drive, c): c for c in cells}
        try:
            failures += row_failures(run_dir, drivers)
        except BaseException:
            stop.set()  # every user stops before its next instance; the records stand
            raise
