"""What a cell runs with: its journaling proxy, its state volume, and where programs are run.

Every learner's model calls pass a journaling mitmproxy: the ladder learners (which live in the
runner's process) get a host-side `mitmdump` in reverse mode in front of the model endpoint;
harness learners get a proxy container beside their sandbox (harness adapters). The proxy holds
the real key; the learner only ever has the placeholder. The program library's programs run in a
Docker container with no network (`sandbox.engine: docker`) or a host subprocess (`process`).
"""

from __future__ import annotations

import os
import shutil
import tarfile
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Protocol
from urllib.parse import urlsplit

from harness_adapters import registry
from harness_adapters.base import Learner
from harness_adapters.chat_model import ChatModel
from harness_adapters.program_check import ProgramExecutor, SandboxExecutor, local_executor
from orchestrator.errors import ConfigError
from orchestrator.prompts import PromptSet
from orchestrator.records import CellPaths, SandboxRecord
from orchestrator.rows import row
from orchestrator.run.grid_config import EMBEDDED, HARNESSES, Cell, GridConfig, run_prices
from orchestrator.run.standby import Prepared, StandbyCell
from proxy.host import CONTROL_FILE
from sandboxes.engines import harness_engine, sandbox_engine
from sandboxes.environment import LeftOut, StateVolume, SNAPSHOT_GZIP_LEVEL, durable_replace
from sandboxes.snapshot_archive import SnapshotArchive


class HostStateDir:
    """A learner's state as a host folder (the ladder learners): wipe, snapshot, restore."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def wipe(self) -> None:
        shutil.rmtree(self.path)
        self.path.mkdir()

    def recover(self) -> None:
        pass  # a folder has no processes of its own

    def snapshot(self, dest: Path) -> list[LeftOut]:
        """The folder as `dest`, its sparse files kept sparse (`sandboxes/snapshot_archive.py`)."""
        tmp = dest.with_suffix(".tmp")
        with tarfile.open(tmp, "w:gz", compresslevel=SNAPSHOT_GZIP_LEVEL) as tar:
            archive = SnapshotArchive(tar, dest.parent)
            for path in [self.path, *sorted(self.path.rglob("*"))]:
                name = "." if path == self.path else "./" + path.relative_to(self.path).as_posix()
                member = tar.gettarinfo(path, name)
                if member is None:  # a socket: nothing to keep
                    continue
                if member.isfile():
                    with open(path, "rb") as data:
                        archive.add(member, data)
                else:
                    archive.add(member)
        durable_replace(tmp, dest)
        return []  # the ladder's own files: nothing is ever left out

    def restore(self, source: Path | None) -> None:
        self.wipe()
        if source is not None:
            with tarfile.open(source) as tar:
                tar.extractall(self.path, filter="data")

    def collect_logs(self, dest: Path) -> list[Path]:
        return []  # a ladder learner's only log is its transcript, kept by the runner


class ControlFile:
    """The slot control file of a proxy container (the orchestrator owns it; the sandbox cannot see it)."""

    def __init__(self, path: Path):
        self.path = path

    def set_slot(self, slot: int | None, phase: str) -> None:
        from proxy.journal import write_slot
        write_slot(self.path, slot, phase)


class SlotControl(Protocol):
    """Tells a proxy which instance slot (and side of its verdict) the calls belong to."""

    def set_slot(self, slot: int | None, phase: str) -> None: ...


@dataclass
class CellServices:
    model_base_url: str          # what the learner calls: the proxy, never the endpoint itself
    state: StateVolume           # HostStateDir for the ladder; the harness's state volume
    executor: ProgramExecutor
    proxy: SlotControl | None = None  # proxy.host.HostProxy, or the ControlFile of a proxy container
    harness: Learner | None = None  # the harness learner living in the cell's sandbox
    # what can break under a learner without being its doing: the proxy, the containers
    infrastructure: list[Callable[[], str | None]] = field(default_factory=list)

    def fault(self) -> str | None:
        """The first infrastructure fault found (a proxy or a container stopped), or None."""
        for check in self.infrastructure:
            found = check()
            if found:
                return found
        return None

    def set_slot(self, slot: int | None, phase: str) -> None:
        """Tell the proxy which instance slot (and which side of its verdict) calls belong to."""
        if self.proxy is not None:
            self.proxy.set_slot(slot, phase)


class HostProgramsRefused(ConfigError):
    """A grid whose model-written programs would run as host processes able to read the API key."""


def carc_uid() -> int:
    """The uid carc runs as, which host programs share unless it is root (a seam for tests)."""
    return os.geteuid()


def host_programs_refusal(grid: GridConfig, uid: int | None = None,
                          environ: Mapping[str, str] | None = None) -> str | None:
    """Why this grid must not run here, or None: with `sandbox.engine: process` a learner's
    model-written programs run as host processes, as nobody when carc is root, else with carc's
    own uid, and then they can read carc's environment, the API key among it, from
    /proc/<carc's pid>/environ. Refused when such a learner is in the grid, carc is not root and
    the grid has a secret: a model endpoint other than the embedded one with its key variable set."""
    if grid.sandbox.engine != "process":
        return None
    runners = sorted({e.learner for e in grid.learners
                      if e.learner not in HARNESSES and registry.learner_class(e.learner).runs_programs})
    uid = carc_uid() if uid is None else uid
    key_env = grid.model.api_key_env
    secret = grid.model.endpoint != EMBEDDED and bool(key_env) and \
        bool((os.environ if environ is None else environ).get(key_env))
    if not runners or uid == 0 or not secret:
        return None
    return (f"sandbox.engine process runs {', '.join(runners)}'s model-written programs as host processes "
            f"with carc's own uid ({uid}), which can read the API key in ${key_env} from "
            f"/proc/<carc's pid>/environ: use sandbox.engine: docker (the default), or run carc as root "
            f"(host programs then run as nobody)")


def refuse_host_programs(grid: GridConfig) -> None:
    """Raise HostProgramsRefused when `host_programs_refusal` finds a reason (at run and cell start)."""
    reason = host_programs_refusal(grid)
    if reason is not None:
        raise HostProgramsRefused(reason)


def sandbox_limits(grid: GridConfig):
    """A cell's container limits, from the grid's `sandbox` and `limits` sections."""
    from sandboxes.docker_sandbox import Limits
    return Limits(cpus=grid.sandbox.cpus, memory=grid.sandbox.memory, pids=grid.sandbox.pids,
                  snapshot_bytes=grid.limits.snapshot_mb << 20, snapshot_s=grid.limits.snapshot_s,
                  state_bytes=None if grid.limits.state_mb is None else grid.limits.state_mb << 20)


def journal_dir(cell_dir: Path) -> Path:
    return CellPaths(cell_dir).journal


def ladder_learner(cell: Cell, state_dir: Path, prompts: PromptSet, model: ChatModel,
                   executor: ProgramExecutor = local_executor) -> Learner:
    """A ladder learner of the registry (harness_adapters/learners.yaml), built for its cell."""
    cls = registry.learner_class(cell.learner)
    if cls.runs_programs:
        return cls(state_dir, prompts, model, executor=executor)
    return cls(state_dir, prompts, model)


@contextmanager
def cell_services(grid: GridConfig, cell: Cell, cell_dir: Path, upstream: str,
                  wipes: int | None = None) -> Iterator[CellServices]:
    """Start the cell's proxy (and program sandbox); everything is torn down on exit, always.
    `wipes`: how many wipes the pass will ask for (a harness row prepares no standby beyond them)."""
    from proxy.host import HostProxy

    if cell.learner in HARNESSES:
        with harness_services(grid, cell, cell_dir, upstream, wipes) as services:
            yield services
        return
    refuse_host_programs(grid)  # a Ray node may run as another user than the run's start
    with ExitStack() as stack:
        # The program sandbox starts (in a thread: engine calls only) while the proxy does.
        starting = None
        engine = sandbox_engine(grid.sandbox.engine)
        if cell.learner == "program-library" and engine.isolates_programs:
            from sandboxes.docker_sandbox import SandboxSpec
            from sandboxes.images import ensure_image

            spec = SandboxSpec(ensure_image("base", grid.sandbox.base), run=CellPaths(cell_dir).run.name,
                               cell=cell.cell, proxy=None, volume=False,
                               limits=sandbox_limits(grid))
            pool = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="program-sandbox"))
            starting = pool.submit(engine.open, spec)
            stack.callback(_teardown_once_started, starting)
        proxy = None
        base_url = upstream
        if grid.proxy.journal:
            host = urlsplit(upstream).netloc
            proxy = stack.enter_context(HostProxy(
                journal_dir(cell_dir), cell.cell, upstream, allow=(host,),
                key_env=grid.model.api_key_env, mode="reverse",
                prices=run_prices(CellPaths(cell_dir).run.root)))
            base_url = proxy.base_url
        executor: ProgramExecutor = local_executor
        record = SandboxRecord(proxy="host-mitmdump" if proxy else None, model_base_url=base_url,
                               upstream=upstream, program_checks="host-process")
        if starting is not None:
            sandbox = starting.result()
            executor = SandboxExecutor(sandbox)
            stack.callback(executor.close)  # first: the checker goes before its container
            record = record.model_copy(update={"program_checks": engine.name, "image": sandbox.spec.image,
                                               "container": sandbox.container.name})
        record.write(CellPaths(cell_dir).sandbox)  # how this cell was isolated, for the audit
        checks = ([proxy.fault] if proxy else []) + \
            ([executor.sandbox.fault] if isinstance(executor, SandboxExecutor) else [])
        yield CellServices(base_url, HostStateDir(CellPaths(cell_dir).state), executor, proxy,
                           infrastructure=checks)


def _teardown_once_started(starting: Future) -> None:
    """Tear down a sandbox started in the background (one that failed to start removed itself)."""
    try:
        sandbox = starting.result()
    except BaseException:  # noqa: BLE001 - its start failed; the error reached the cell already
        return
    sandbox.teardown()


def harness_spec(grid: GridConfig, cell: Cell, run_dir: Path, name: str, journal: Path, upstream: str):
    """The sandbox of a harness cell, or of one user or the curator of a collective row (`name`
    tells them apart): the harness's image, and a proxy container journaling into `journal`."""
    from sandboxes.docker_sandbox import ProxySpec, SandboxSpec
    from sandboxes.images import ensure_image

    return SandboxSpec(
        ensure_image(registry.adapter(cell.learner).recipe, grid.sandbox.base), run=run_dir.name, cell=name,
        proxy=ProxySpec(ensure_image("proxy", grid.sandbox.base), journal, upstream,
                        key_env=grid.model.api_key_env, prices=run_prices(run_dir)),
        limits=sandbox_limits(grid))


def prepare_harness(box, grid: GridConfig, cell: Cell, row_name: str, prompts: PromptSet) -> Prepared:
    """The harness on the started sandbox `box`: an empty volume with its config, its processes
    started, its learner built for the row `row_name`."""
    from harness_adapters.harness import HarnessCell

    adapter = registry.adapter(cell.learner)
    harness_cell = HarnessCell(box, prompts, grid.model.name, cell.effort, row_name,
                               dict(grid.harness_options.get(adapter.name, {})), api=grid.model.api)
    state = adapter.make_state(harness_cell)
    state.restore(None)  # an empty volume with the harness's config: a fresh start
    return Prepared(box, state, adapter.make_learner(harness_cell))


@contextmanager
def harness_services(grid: GridConfig, cell: Cell, cell_dir: Path, upstream: str,
                     wipes: int | None = None) -> Iterator[CellServices]:
    """A harness cell: its image, its sandbox and proxy container, its state volume; a wiped
    row's standby sandboxes (`wipes`: how many wipes are to come, when known)."""
    adapter = registry.adapter(cell.learner)
    paths = CellPaths(cell_dir)
    spec = harness_spec(grid, cell, paths.run.root, cell.cell, journal_dir(cell_dir), upstream)
    prompts = PromptSet.load(grid.prompts)

    def standby(generation: int) -> Prepared:
        box = sandbox.standby(generation)
        try:
            ready = prepare_harness(box, grid, cell, cell.row, prompts)
            ready.learner.prestart()
            return ready
        except BaseException:
            box.teardown()
            raise

    sandbox = harness_engine(grid.sandbox.engine).open(spec)
    standbys = None
    try:
        first = prepare_harness(sandbox, grid, cell, cell.row, prompts)
        state, learner, fault = first.state, first.learner, sandbox.fault
        if row(cell.row).wiped_before_each and grid.sandbox.standby:
            first.learner.prestart()  # the cell's own sandbox is as fresh as a standby
            standbys = StandbyCell(first, standby, wipes)
            state, learner, fault = standbys.state, standbys.learner, standbys.fault
        SandboxRecord(proxy="container", model_base_url=sandbox.reverse_base_url(), upstream=upstream,
                      image=spec.image, container=sandbox.container.name, harness=adapter.name,
                      version=adapter.version).write(paths.sandbox)
        yield CellServices(sandbox.reverse_base_url(), state, local_executor,
                           ControlFile(journal_dir(cell_dir) / CONTROL_FILE), learner,
                           infrastructure=[fault])
    finally:
        if standbys is not None:
            standbys.close()
            standbys.current.sandbox.retire()
        sandbox.teardown()
