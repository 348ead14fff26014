"""Cells on a Ray cluster: `carc grid run GRID --executor ray [--address ADDR]`.

Each cell is one Ray task. It needs one unit of the custom resource `docker` (a node offers as
many as the cells it can host: `carc node join`), the grid's `sandbox.cpus` and
`sandbox.memory`. An attempt at a cell takes the cell's fencing token (`CellFence`, the cell's
`attempt.json`) before it reads anything, starts an embedded model server on its own node when
the grid uses the embedded model (the model is deterministic per seed and conversation, so
every node answers alike), and runs the ordinary `CellRunner` on the cell's folder, which
resumes exactly from the records already there.

Durability: the run folder is the head's, and every node reaches it at the same path (a shared
filesystem such as NFS): each record is fsynced into it by the node that writes it, before the
learner is answered, exactly as the local pool writes it. A node lost mid-instance is Ray's to
notice: the task is retried (`max_retries`) on a node that has room, the new attempt takes a
new token (the lost one, were it still running behind a partition, has every further record
refused with `StaleAttempt`) and resumes the cell from the folder. The new attempt removes the
old attempt's containers, network and volume by name on its node; before the cells start and
after they end, a task on every node with the `docker` resource prunes whatever the run left
there (the objects are labelled with the run), so no node keeps anything of the run.

Ray's own retries count node failures only; a cell that raised (a learner bug outside an
instance, a stale attempt) fails as in the local pool and is recorded in `logs/failures.jsonl`.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

import structlog
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.records import CellFence, RunPaths, read_events
from orchestrator.run.grid_config import Cell, GridConfig, load_grid

log = structlog.get_logger("carc.ray")

DOCKER_RESOURCE = "docker"  # how many cells a node hosts
CELL_RETRIES = 3  # attempts after a lost node (Ray's max_retries)
NODE_TASK_TIMEOUT_S = 900  # preparing images may build them on a fresh node
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class NoDockerNodes(RuntimeError):
    """The Ray cluster offers no `docker` resource: no node can host a cell."""


def memory_bytes(text: str) -> int:
    """Docker's memory notation (`2g`, `512m`, `1073741824`) in bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)b?\s*", str(text).lower())
    if not match:
        raise ValueError(f"grid sandbox.memory {text!r}: give bytes or a number with k, m, g or t")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def cell_options(grid: GridConfig) -> dict:
    """What one cell asks of its node: a `docker` slot, the sandbox's CPUs and memory."""
    return {"num_cpus": grid.sandbox.cpus, "memory": memory_bytes(grid.sandbox.memory),
            "resources": {DOCKER_RESOURCE: 1}, "max_retries": CELL_RETRIES, "retry_exceptions": False}


def attempt_holder() -> str:
    """Who runs this attempt: the Ray node, its address and the process."""
    import ray
    context = ray.get_runtime_context()
    return f"node {context.get_node_id()} ({socket.gethostname()}), pid {os.getpid()}"


def run_cell_attempt(run_dir: str, cell_json: str) -> str:
    """One attempt at one cell, on whichever node Ray placed it: "done" or "stopped"."""
    from orchestrator.run.grid_run import harness_learners, model_service
    from orchestrator.run.runner import CellRunner

    run = RunPaths(run_dir)
    if not run.grid.exists():
        raise RuntimeError(
            f"{run.grid} is not on this node ({socket.gethostname()}): the Ray executor needs the run "
            "folder on a filesystem every node mounts at the same path (e.g. NFS)")
    grid = load_grid(run.grid)
    cell = Cell.model_validate_json(cell_json)
    paths = run.cell(cell.cell)
    fence = CellFence.take(paths.root, attempt_holder())
    log.info("cell_attempt", cell=cell.cell, token=fence.token, holder=fence.holder)
    host = "127.0.0.1"
    if cell.learner in harness_learners(grid):  # proxy containers reach the host's docker0
        from sandboxes.images import docker_client
        from sandboxes.networks import host_address
        host = host_address(docker_client())
    with model_service(grid, run.logs, 1, host, tag=f"{cell.cell}.{fence.token}-") as urls:
        return CellRunner(grid, cell, paths.root, urls[0], fence=fence).run()


def prepare_node(run_name: str, grid_path: str | None) -> dict:
    """On one node: build (or find) the images the grid needs, and prune the run's leftovers."""
    from orchestrator.run.grid_run import harness_learners, needs_docker
    from sandboxes.docker_sandbox import prune

    if grid_path is not None:
        grid = load_grid(grid_path)
        if needs_docker(grid):
            from harness_adapters import registry
            from sandboxes.images import ensure_image
            ensure_image("base", grid.sandbox.base)
            for name in harness_learners(grid):
                ensure_image("proxy", grid.sandbox.base)
                ensure_image(registry.adapter(name).recipe, grid.sandbox.base)
    pruned = prune(run=run_name)
    return {"node": socket.gethostname(), "containers": pruned.containers,
            "networks": pruned.networks, "volumes": pruned.volumes}


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


def execute_ray_run(run_dir: Path, workers: int | None = None, address: str | None = None,
                    show_progress: bool = True) -> list[str]:
    """Run (or continue) every cell of the run in `run_dir` on the Ray cluster at `address`
    (`grid_run.execute`'s counterpart); returns the cells that stopped at a limit."""
    from orchestrator.run.grid_run import RunInterrupted, run_grid_path, run_prices

    grid_path = run_grid_path(run_dir)
    grid = load_grid(grid_path)
    run_prices(run_dir)  # before any attempt: they only read it
    try:  # each node prepares its images and prunes the run's leftovers itself
        return execute_ray(run_dir, grid_path, grid, grid.cells(), address, workers, show_progress)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (the CLI turns it into this)
        raise RunInterrupted(run_dir) from None


def execute_ray(run_dir: Path, grid_path: Path, grid: GridConfig, cells: list[Cell],
                address: str | None, workers: int | None, show_progress: bool) -> list[str]:
    """Run the cells as Ray tasks; returns the cells stopped at a limit (as `_execute` does)."""
    import ray

    from orchestrator.run.grid_run import run_order
    from orchestrator.run.schedule import build_schedule
    from orchestrator.run.status import mark_started, record_failure

    run_dir = run_dir.resolve()
    run = RunPaths(run_dir)
    owned = connect(address, workers or min(grid.workers, len(cells)))
    try:
        on_every_node(prepare_node, run.name, str(grid_path.resolve()))
        mark_started(run_dir)
        cells = run_order(cells)
        task = ray.remote(run_cell_attempt).options(**cell_options(grid))
        refs = {task.remote(str(run_dir), c.model_dump_json()): c for c in cells}
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
                    _show(progress, bars, run)
        except BaseException:
            for ref in refs:  # the records written stand; the prune below removes what they ran
                ray.cancel(ref, force=True)
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
        raise RuntimeError("cells failed (resume with `carc grid run --resume RUN --executor ray`):\n"
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
                 node_ip: str | None = None, block: bool = False) -> list[str]:
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
    if block:
        command.append("--block")
    return command
