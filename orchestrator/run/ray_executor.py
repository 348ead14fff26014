"""Cells on a Ray cluster: `carc grid run GRID --executor ray [--address ADDR]`.

Each cell is one Ray task. It needs one unit of the custom resource `docker` (a node offers as
many as the cells it can host: `carc node join`), the grid's `sandbox.cpus` and
`sandbox.memory`. An attempt at a cell takes the cell's fencing token (`CellFence`, the cell's
`attempt.json`) before it reads anything, starts an embedded model server on its own node when
the grid uses the embedded model (the model is deterministic per seed and conversation, so
every node answers alike), and runs the ordinary `CellRunner` on the cell's folder, which
resumes exactly from the records already there.

Durability (`--durability`): "shared", the default: the run folder is the head's and every node
reaches it at the same path (a shared filesystem such as NFS): each record is fsynced into it by
the node that writes it, before the learner is answered, exactly as the local pool writes it.
"head": a `HeadRecords` actor on the head holds the folder; an attempt works in a copy on its
node laid down from the head's, and every record it appends reaches the head (with every file of
the cell that changed before it) before the learner is answered.

A node lost mid-instance is Ray's to notice: the task is retried (`max_retries`) on a node that
has room, the new attempt takes a new token (the lost one, were it still running behind a
partition, has every further record refused with `StaleAttempt`) and resumes the cell from the
head's records. The new attempt removes the old attempt's containers, network and volume by name
on its node; before the cells start and after they end, a task on every node with the `docker`
resource prunes whatever the run left there (the objects are labelled with the run), so no node
keeps anything of the run.

Ray's own retries count node failures only; a cell that raised (a learner bug outside an
instance, a stale attempt) fails as in the local pool and is recorded in `logs/failures.jsonl`.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator import fault_points
from orchestrator.errors import ConfigError, MachineError, RunFailed
from orchestrator.records import CellFence, RecordsUnwritable, RunPaths, read_events
from orchestrator.run.grid_config import Cell, GridConfig, load_grid

if TYPE_CHECKING:
    from sandboxes.docker_sandbox import Pruned

log = structlog.get_logger("carc.ray")

DOCKER_RESOURCE = "docker"  # how many cells a node hosts
CELL_RETRIES = 3  # attempts after a lost node (Ray's max_retries)
NODE_TASK_TIMEOUT_S = 900  # preparing images may build them on a fresh node
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class NoDockerNodes(MachineError):
    """The Ray cluster offers no `docker` resource: no node can host a cell."""


def memory_bytes(text: str) -> int:
    """Docker's memory notation (`2g`, `512m`, `1073741824`) in bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)b?\s*", str(text).lower())
    if not match:
        raise ValueError(f"grid sandbox.memory {text!r}: give bytes or a number with k, m, g or t")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def cell_options(grid: GridConfig, cell: Cell | None = None) -> dict:
    """What one cell reserves on its node: a `docker` slot, and CPU and memory. A cell that waits on
    its model (a real endpoint, or the embedded model with `model.timing`) reserves what a running
    cell of its kind was measured to hold (`scale_priors.yaml`: the cores its CPU keeps busy over
    its model wait, its peak memory; `carc grid plan` counts cells the same way), at most the
    sandbox's limits, which stay its caps: reserving the limits would let a 2-core node run 2 such
    cells where it holds ~20 (bench/scale.py). The embedded model without timing searches on the
    cell's node as fast as it can: then the cell reserves the sandbox's CPUs and memory."""
    cpus, memory = grid.sandbox.cpus, memory_bytes(grid.sandbox.memory)
    if cell is not None and not (grid.model.endpoint == "embedded" and grid.model.timing is None):
        from orchestrator.run.plan import load_scale_priors
        _, cost = load_scale_priors().cost(cell.learner)
        cpus = min(cpus, max(0.001, round(cost.cpu_cores, 3)))
        memory = min(memory, int(cost.rss_mb * 2**20))
    options = {"num_cpus": cpus, "memory": memory, "resources": {DOCKER_RESOURCE: 1},
               "max_retries": CELL_RETRIES, "retry_exceptions": False}
    armed = {name: os.environ[name] for name in (fault_points.FAULT_ENV, fault_points.MARK_ENV)
             if os.environ.get(name)}
    if armed:  # a test's named fault point reaches the attempts, wherever they run
        options["runtime_env"] = {"env_vars": armed}
    return options


def attempt_holder() -> str:
    """Who runs this attempt: the Ray node, its address and the process."""
    import ray
    context = ray.get_runtime_context()
    return f"node {context.get_node_id()} ({socket.gethostname()}), pid {os.getpid()}"


def run_cell_attempt(run_dir: str, cell_json: str, records=None) -> str:
    """One attempt at one cell, on whichever node Ray placed it: "done" or "stopped". With
    `records` (a `HeadRecords` actor: --durability head) the cell runs in a working copy on this
    node, laid down from the head's copy, and every record goes to the head as it is written."""
    import ray
    from sandboxes.docker_sandbox import NODE_ENV
    cell = Cell.model_validate_json(cell_json)
    # the attempt's Docker objects carry its node: a node lost mid-run that comes back finds them
    os.environ[NODE_ENV] = ray.get_runtime_context().get_node_id()
    if records is not None:
        return _attempt_with_head_copy(Path(run_dir).name, cell, records)
    run = RunPaths(run_dir)
    if not run.grid.exists():
        raise RuntimeError(
            f"{run.grid} is not on this node ({socket.gethostname()}): --durability shared needs the "
            "run folder on a filesystem every node mounts at the same path (e.g. NFS); or run with "
            "--durability head")
    paths = run.cell(cell.cell)
    fence = CellFence.take(paths.root, attempt_holder())
    return _run_attempt(run, cell, fence)


def _run_attempt(run: RunPaths, cell: Cell, fence: CellFence) -> str:
    from orchestrator.run.cell_runner import cell_runner
    from orchestrator.run.model_service import model_host, model_service

    grid = load_grid(run.grid)
    paths = run.cell(cell.cell)
    log.info("cell_attempt", cell=cell.cell, token=fence.token, holder=fence.holder)
    with model_service(grid, run.logs, 1, model_host(grid, [cell]), tag=f"{cell.cell}.{fence.token}-") as urls:
        return cell_runner(grid, cell, paths.root, urls[0], fence=fence).run()


# --- --durability head: records reach the head as they are written ------------------------------

# What a working copy never sends: its locks and fence (the head keeps its own), the events (sent
# line by line), a ladder learner's live state (resume restores it from the snapshots).
UNSENT = {".lock", ".attempt.lock", "attempt.json", "events.jsonl"}
APPENDED = {"journal/journal.jsonl"}  # appended by the proxy: sent from where the last send ended


class HeadRecords:
    """A Ray actor on the head (one per run) holding the run folder: each attempt takes its
    fencing token here and gets the head's copy of its cell; every record an attempt writes
    arrives here, with every file of the cell that changed before it (snapshots, transcripts, the
    proxy journal), and is fsynced under the fence."""

    def __init__(self, run_dir: str):
        self.run = RunPaths(run_dir)
        self.locks: dict[str, tuple[int, object]] = {}  # cell -> (token, the held lock file)

    def run_files(self) -> dict[str, bytes]:
        """The run's own files (grid, prices, prompts, labels): what an attempt reads besides its cell."""
        return {p.name: p.read_bytes() for p in self.run.root.iterdir() if p.is_file()}

    def take(self, cell: str, holder: str) -> tuple[int, dict[str, bytes]]:
        """A new attempt at `cell`: its token, and the head's copy of the cell's folder."""
        root = self.run.cell(cell).root
        fence = CellFence.take(root, holder)
        self._hold(cell, fence.token)
        files = {}
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and path.name not in UNSENT - {"events.jsonl"} and not rel.startswith("state/"):
                files[rel] = path.read_bytes()
        return fence.token, files

    def _hold(self, cell: str, token: int) -> None:
        """The cell's lock, held on the head for the attempt with `token` (the one `carc status`
        tries, as the runner holds it in the local pool and with a shared folder); a newer
        attempt's take moves it to that attempt."""
        self.release(cell)
        paths = self.run.cell(cell)
        handle = open(paths.lock, "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process runs the cell (a local resume): it shows running
            handle.close()
            return
        self.locks[cell] = (token, handle)

    def release(self, cell: str, token: int | None = None) -> None:
        """Let go of the cell's lock (of the attempt with `token` only, when given)."""
        held = self.locks.get(cell)
        if held is None or (token is not None and held[0] != token):
            return
        del self.locks[cell]
        held[1].close()

    def write(self, cell: str, token: int, changes: list[tuple[str, int | None, bytes]],
              line: str | None) -> None:
        """Apply an attempt's changed files, then append its record; `StaleAttempt` when a newer
        attempt took the cell (nothing is written then)."""
        paths = self.run.cell(cell)
        with CellFence(paths.root, token, "").held():
            for rel, offset, data in changes:
                target = paths.root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                if offset is None:  # a whole file, replaced atomically
                    tmp = target.with_name(target.name + ".part")
                    with open(tmp, "wb") as handle:
                        handle.write(data)
                        handle.flush()
                        os.fsync(handle.fileno())
                    os.replace(tmp, target)
                else:  # an appended file, from where the attempt's last send ended
                    with open(target, "ab") as handle:
                        handle.truncate(offset)
                        handle.write(data)
                        handle.flush()
                        os.fsync(handle.fileno())
            if line is not None:
                with open(paths.events, "a", encoding="utf-8") as handle:
                    handle.write(line)
                    handle.flush()
                    os.fsync(handle.fileno())

    def write_logs(self, files: dict[str, bytes]) -> None:
        """The attempt's model-server logs, into the run's logs/."""
        self.run.logs.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (self.run.logs / name).write_bytes(data)


class HeadFence(CellFence):
    """The fence of an attempt whose records go to the head: checked there, at every record."""

    def __init__(self, root: Path, token: int, holder: str, records, cell: str,
                 offsets: dict[str, int], seen: dict[str, tuple[int, int]]):
        super().__init__(root, token, holder)
        self.records, self.cell = records, cell
        self.offsets = offsets  # appended files: bytes the head has
        self.seen = seen  # other files: (size, mtime_ns) the head has

    @contextmanager
    def held(self):
        yield  # the working copy is this attempt's alone; the head checks the token

    def written(self, path: Path, line: str) -> None:
        self.send(line)

    def changes(self) -> list[tuple[str, int | None, bytes]]:
        root = self.paths.root
        out = []
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            if not path.is_file() or path.name in UNSENT or rel.startswith("state/") \
                    or path.name.endswith((".tmp", ".part")):
                continue
            stat = path.stat()
            if rel in APPENDED:
                start = self.offsets.get(rel, 0)
                if stat.st_size > start:
                    with open(path, "rb") as handle:
                        handle.seek(start)
                        data = handle.read(stat.st_size - start)
                    out.append((rel, start, data))
                    self.offsets[rel] = start + len(data)
            elif self.seen.get(rel) != (stat.st_size, stat.st_mtime_ns):
                out.append((rel, None, path.read_bytes()))
                self.seen[rel] = (stat.st_size, stat.st_mtime_ns)
        return out

    def send(self, line: str | None = None) -> None:
        """Every changed file, then the record, to the head; `StaleAttempt` if it refuses."""
        import ray
        try:
            ray.get(self.records.write.remote(self.cell, self.token, self.changes(), line))
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, RecordsUnwritable):
                raise exc.cause from None
            raise RecordsUnwritable(f"the head did not take a record of {self.cell}: {exc}") from exc
        except Exception as exc:  # the head's actor is gone: the run stops, nothing is charged
            raise RecordsUnwritable(f"the head did not take a record of {self.cell} "
                                    f"({type(exc).__name__}: {exc}); resume the run") from exc


def working_root(run_name: str, cell: str, token: int) -> Path:
    """Where an attempt keeps its working copy on its node (CARC_RAY_WORKDIR, else the temp dir);
    the run's own name last, so its Docker objects carry the run's label."""
    base = Path(os.environ.get("CARC_RAY_WORKDIR") or Path(tempfile.gettempdir()) / "carc-ray")
    return base / f"{cell}.{token}" / run_name


def _attempt_with_head_copy(run_name: str, cell: Cell, records) -> str:
    import ray
    token, files = ray.get(records.take.remote(cell.cell, attempt_holder()))
    root = working_root(run_name, cell.cell, token)
    if root.exists():
        shutil.rmtree(root)
    run = RunPaths(root)
    run.cells.mkdir(parents=True)
    for name, data in ray.get(records.run_files.remote()).items():
        (root / name).write_bytes(data)
    paths = run.cell(cell.cell)
    offsets, seen = {}, {}
    for rel, data in files.items():
        target = paths.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        stat = target.stat()
        if rel in APPENDED:
            offsets[rel] = len(data)
        else:
            seen[rel] = (stat.st_size, stat.st_mtime_ns)
    fence = HeadFence(paths.root, token, attempt_holder(), records, cell.cell, offsets, seen)
    try:
        return _run_attempt(run, cell, fence)
    finally:  # what followed the last record (the journal's last lines, logs), then the logs
        try:
            fence.send()
            if run.logs.is_dir():
                ray.get(records.write_logs.remote({p.name: p.read_bytes() for p in run.logs.iterdir()
                                                   if p.is_file() and p.name.startswith("model-")}))
        except RecordsUnwritable as exc:
            log.warning("final_send_refused", cell=cell.cell, error=str(exc))
        try:
            ray.get(records.release.remote(cell.cell, token))
        except Exception as exc:  # noqa: BLE001 - the head's actor gone: it held nothing more
            log.warning("release_failed", cell=cell.cell, error=str(exc))
        shutil.rmtree(root.parent, ignore_errors=True)


def prepare_node(run_name: str, grid: GridConfig | None) -> dict:
    """On one node: build (or find) the images the grid needs, and prune the run's leftovers and
    whatever attempts of nodes no longer alive left on this engine (a lost node that came back)."""
    from orchestrator.run.run_folder import harness_learners, needs_docker
    from sandboxes.docker_sandbox import prune, prune_dead_nodes

    if grid is not None:
        if needs_docker(grid):
            from harness_adapters import registry
            from sandboxes.images import ensure_image
            ensure_image("base", grid.sandbox.base)
            for name in harness_learners(grid):
                ensure_image("proxy", grid.sandbox.base)
                ensure_image(registry.adapter(name).recipe, grid.sandbox.base)
    pruned = prune(run=run_name)
    pruned += prune_dead_nodes(alive_node_ids())
    return {"node": socket.gethostname(), "containers": pruned.containers,
            "networks": pruned.networks, "volumes": pruned.volumes}


def alive_node_ids() -> set[str]:
    import ray
    return {node["NodeID"] for node in ray.nodes() if node.get("Alive")}


def docker_nodes() -> list[dict]:
    import ray
    return [node for node in ray.nodes()
            if node.get("Alive") and node.get("Resources", {}).get(DOCKER_RESOURCE, 0) > 0]


def on_every_node(function, *args) -> list:
    """Run `function(*args)` once on every live node that hosts cells; its results."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(function)
    refs = [remote.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        node["NodeID"], soft=False)).remote(*args) for node in docker_nodes()]
    return ray.get(refs, timeout=NODE_TASK_TIMEOUT_S)


def connect(address: str | None, workers: int) -> bool:
    """Join the cluster at `address` (or RAY_ADDRESS); with neither, start Ray on this machine
    offering `workers` docker slots. True when this call started the connection."""
    import ray
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    else:
        ray.init(resources={DOCKER_RESOURCE: workers}, include_dashboard=False,
                 logging_level="WARNING", log_to_driver=False)
    total = ray.cluster_resources().get(DOCKER_RESOURCE, 0)
    if total <= 0:
        ray.shutdown()
        raise NoDockerNodes(f"the Ray cluster at {address} has no node with the `{DOCKER_RESOURCE}` "
                            f"resource: join one with `carc node join {address}`")
    return True


DURABILITY = ("shared", "head")


def execute_ray_run(run_dir: Path, workers: int | None = None, address: str | None = None,
                    show_progress: bool = True, durability: str = "shared") -> list[str]:
    """Run (or continue) every cell of the run in `run_dir` on the Ray cluster at `address`
    (`local_pool.execute`'s counterpart); returns the cells that stopped at a limit."""
    from orchestrator.run.grid_config import run_prices
    from orchestrator.run.run_folder import RunInterrupted, run_grid_path

    grid_path = run_grid_path(run_dir)
    grid = load_grid(grid_path)
    if grid.collective is not None:
        raise ConfigError(f"{run_dir}: a collective grid runs its users in rounds: "
                         "orchestrator.run.collective.on_ray.execute_collective_ray (carc grid run does)")
    run_prices(run_dir)  # before any attempt: they only read it
    try:  # each node prepares its images and prunes the run's leftovers itself
        return execute_ray(run_dir, grid_path, grid, grid.cells(), address, workers, show_progress,
                           durability)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the CLI turns it into this)
        raise RunInterrupted(run_dir) from None


def execute_ray(run_dir: Path, grid_path: Path, grid: GridConfig, cells: list[Cell],
                address: str | None, workers: int | None, show_progress: bool,
                durability: str = "shared") -> list[str]:
    """Run the cells as Ray tasks; returns the cells stopped at a limit (as `_execute` does).
    `durability`: "shared", every node writes into the run folder (a shared filesystem); "head",
    records reach the head's folder through a `HeadRecords` actor as they are written."""
    import ray

    from orchestrator.run.local_pool import run_order
    from orchestrator.run.schedule import build_schedule
    from orchestrator.run.status import mark_started, record_failure

    run_dir = run_dir.resolve()
    run = RunPaths(run_dir)
    owned = connect(address, workers or min(grid.workers, len(cells)))
    try:
        on_every_node(prepare_node, run.name, grid)
        mark_started(run_dir)
        cells = run_order(cells)
        records = None
        if durability == "head":
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            head = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
            records = ray.remote(HeadRecords).options(num_cpus=0, scheduling_strategy=head).remote(str(run_dir))
        elif durability != "shared":
            raise ConfigError(f"--durability {durability}: give one of {', '.join(DURABILITY)}")
        task = ray.remote(run_cell_attempt)
        refs = {task.options(**cell_options(grid, c)).remote(str(run_dir), c.model_dump_json(), records): c
                for c in cells}
        failures: list[str] = []
        stopped: list[str] = []
        progress = Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), disable=not show_progress)
        try:
            with progress:
                bars = {c.cell: progress.add_task(c.cell, total=len(build_schedule(grid, c))) for c in cells}
                pending = list(refs)
                while pending:
                    done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
                    for ref in done:
                        cell = refs[ref].cell
                        try:
                            if ray.get(ref) == "stopped":
                                stopped.append(cell)
                        except Exception as exc:  # report every failed cell, keep the others running
                            cause = getattr(exc, "cause", None) or exc
                            failures.append(f"{cell}: {type(cause).__name__}: {cause}")
                            record_failure(run_dir, cell, f"{type(cause).__name__}: {cause}")
                            if records is not None:  # Ray gave the cell up: it runs nowhere
                                records.release.remote(cell)
                    _show(progress, bars, run)
        except BaseException:
            for ref in refs:  # the records written stand; the prune below removes what they ran
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # already ended
                    pass
            raise
        finally:
            try:
                on_every_node(prepare_node, run.name, None)
            except Exception as exc:  # a node lost at the very end: its engine keeps the labels
                log.warning("prune_on_nodes_failed", run=run.name, error=str(exc))
    finally:
        if owned:
            ray.shutdown()
    if failures:
        raise RunFailed("cells failed (resume with `carc grid run --resume RUN --executor ray`):\n"
                           + "\n".join(failures))
    return stopped


def _show(progress: Progress, bars: dict[str, int], run: RunPaths) -> None:
    """Progress from the run folder itself: instances ended per cell."""
    for cell, bar in bars.items():
        events = run.cell(cell).events
        if events.exists():
            progress.update(bar, completed=sum(e.type == "instance_end" for e in read_events(events)))



# --- carc node join -----------------------------------------------------------------------------

# What a node must have before it hosts a cell; the other checks of `carc doctor` are shown as
# warnings (a harness image is built on the node the first time a grid needs it, the proxy's CA
# is made by its first start).
NODE_REQUIRED = ("docker engine", "host address", "image base", "image proxy")
CELL_MEMORY = 2 << 30  # the grid's default sandbox.memory: what one cell is counted as


def default_slots(cpus: int | None = None, memory: int | None = None) -> int:
    """How many cells a node hosts when `--cells` is not given: one per core, at most one per
    2 GiB of memory (a default cell's sandbox limit), at least one."""
    import psutil
    cpus = cpus or os.cpu_count() or 1
    memory = memory or psutil.virtual_memory().total
    return max(1, min(cpus, memory // CELL_MEMORY))


def node_checks() -> tuple[list, list]:
    """`carc doctor`'s checks on this node: (those a join needs, every other one that failed)."""
    from orchestrator.doctor import Check, run_checks
    checks = run_checks()
    named = {c.name: c for c in checks}
    required = [named.get(name) or Check(name, False, "not checked: no Docker engine answers",
                                         "scripts/docker-up.sh, then carc doctor")
                for name in NODE_REQUIRED]
    return required, [c for c in checks if c.name not in NODE_REQUIRED and not c.ok]


def join_command(address: str, slots: int, cpus: int | None = None, memory: int | None = None,
                 node_ip: str | None = None) -> list[str]:
    """Ray's own `ray start` joining this node to the cluster at `address` with its `docker` slots."""
    import json
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--address", address,
               "--resources", json.dumps({DOCKER_RESOURCE: slots})]
    if cpus is not None:
        command += ["--num-cpus", str(cpus)]
    if memory is not None:
        command += ["--memory", str(memory)]
    if node_ip is not None:
        command += ["--node-ip-address", node_ip]
    return command


def prune_after_join(address: str) -> "Pruned":
    """On a node that has just joined the cluster at `address`: remove what attempts of node ids
    the cluster does not count alive left on this engine. A node lost mid-run that comes back has
    a new node id; its old attempt's containers, networks and volumes go here (and, failing that,
    at the next run's start, `prepare_node`)."""
    import ray

    from sandboxes.docker_sandbox import prune_dead_nodes
    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    try:
        return prune_dead_nodes(alive_node_ids())
    finally:
        ray.shutdown()


def node_running() -> bool:
    """Whether a Ray node (its raylet) runs on this machine."""
    import psutil
    for proc in psutil.process_iter(["name"]):
        if proc.info.get("name") == "raylet":
            return True
    return False
