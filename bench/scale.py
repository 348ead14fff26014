"""How many cells one machine holds: throughput, CPU and memory as concurrent cells grow.

    python bench/scale.py [--levels 2,4,8,16,32] [--kinds ladder,hermes-agent] [--timing hosted]
                          [--tasks 1] [--visits 2] [--executors local,ray] [--quick]

For every cell kind and concurrency level N, runs one grid of N cells at `workers: N` (the same
learner at N seeds) on the embedded model with real-model timing (`model.timing`, default the
`hosted` profile: solver_model/CALIBRATION.md), so each cell mostly waits on its model as it would
on a provider. Prints per level: instances per hour (while cells run: from the first instance's start
to the last one's end; the whole run's wall, start-up included, beside it), orchestration seconds per instance (an
instance's wall time minus the time at least one of its model calls was in flight, from its
proxy journal: the harness's own work is in it), CPU % of one core (the run's
process tree and its Docker containers, sampled; over the whole run, the model servers' share of
it, and the cells' own while they ran: the figure `carc grid plan` divides by), peak RSS per cell (the same), and errors (failed
cells and model calls that failed). Then the knee: the last level where doubling the cells still
bought at least 1.5x the instances per hour.

Kinds: `ladder` (the stateless floor: the runner's process and a host mitmdump per cell) or a
harness name (`hermes-agent`, the lightest; `openclaw`, heavier): a sandbox and a proxy container
per cell. `--quick`: levels 2,4,8, the ladder only, one instance per cell. `--executors
local,ray` runs every level on the process pool and on a one-node Ray (`--executor ray`).

The CPU and RSS samples are taken every `--sample-s` seconds: a process that lives shorter than
that is missed (its CPU is small by the same token). Other users of the machine are not counted,
but they slow the run down: note `uptime` beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from orchestrator.records import RunPaths, read_events  # noqa: E402

# Only light imports at the top: the cells' worker processes are spawned, and a spawned process
# imports the main module (this file) again; `carc grid run`'s is orchestrator/cli.py, which
# imports typer and rich only. A heavy import here would weigh on every cell measured.

console = Console(width=170)
CGROUP = Path("/sys/fs/cgroup")


# --- sampling what a run costs --------------------------------------------------------------------

@dataclass
class Usage:
    """CPU seconds and peak RSS of a process tree and a run's containers, sampled on a thread."""

    run: str
    interval: float = 1.0
    cpu: dict[tuple, float] = field(default_factory=dict)  # (pid, create_time) | ("c", id) -> seconds
    model_pids: set[tuple] = field(default_factory=set)     # the embedded model's servers
    peak_rss: float = 0.0
    samples: int = 0
    series: list[tuple[float, float, float]] = field(default_factory=list)  # (epoch s, CPU s, model CPU s)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._client = None
        try:
            from sandboxes.images import docker_client
            self._client = docker_client()
        except Exception:  # noqa: BLE001 - a ladder run needs no engine
            pass

    def __enter__(self) -> "Usage":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.interval):
            rss = 0.0
            for proc in [me] + me.children(recursive=True):
                try:
                    with proc.oneshot():
                        times = proc.cpu_times()
                        key = (proc.pid, proc.create_time())
                        self.cpu[key] = times.user + times.system
                        rss += proc.memory_info().rss
                    if key not in self.model_pids and _is_model_server(proc):
                        self.model_pids.add(key)
                except psutil.Error:
                    continue
            rss += self._containers()
            self.peak_rss = max(self.peak_rss, rss)
            self.samples += 1
            self.series.append((time.time(), self.cpu_seconds(), self.model_cpu_seconds()))

    def _containers(self) -> float:
        """Each of the run's containers' CPU seconds (cgroup v1 cpuacct, or v2 cpu.stat) and the
        memory they use now."""
        if self._client is None:
            return 0.0
        rss = 0.0
        try:
            containers = self._client.containers.list(filters={"label": f"org.carc.run={self.run}"})
        except Exception:  # noqa: BLE001 - the engine busy for a moment: skip this sample
            return 0.0
        for container in containers:
            cpu, memory = _cgroup_usage(container.id)
            if cpu is not None:
                self.cpu[("c", container.id)] = cpu
            rss += memory or 0.0
        return rss

    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())

    def between(self, start: float, end: float) -> tuple[float, float]:
        """CPU seconds, and the model's of them, spent between two epoch times (the samples nearest)."""
        inside = [s for s in self.series if start <= s[0] <= end]
        if len(inside) < 2:
            return 0.0, 0.0
        return inside[-1][1] - inside[0][1], inside[-1][2] - inside[0][2]

    def model_cpu_seconds(self) -> float:
        """The embedded model's share (its search: a provider's machines, not this one, would do it)."""
        return sum(self.cpu.get(key, 0.0) for key in self.model_pids)


def _is_model_server(proc: psutil.Process) -> bool:
    try:
        line = proc.cmdline()
    except psutil.Error:
        return False
    return "model" in line and "serve" in line


def _cgroup_usage(container_id: str) -> tuple[float | None, float | None]:
    v1_cpu = CGROUP / "cpuacct" / "docker" / container_id / "cpuacct.usage"
    v1_mem = CGROUP / "memory" / "docker" / container_id / "memory.usage_in_bytes"
    v2 = CGROUP / "system.slice" / f"docker-{container_id}.scope"
    try:
        if v1_cpu.exists():
            return int(v1_cpu.read_text()) / 1e9, float(v1_mem.read_text()) if v1_mem.exists() else None
        if v2.exists():
            stat = dict(line.split() for line in (v2 / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6, float((v2 / "memory.current").read_text())
    except (OSError, ValueError, KeyError):
        pass
    return None, None


# --- one level ------------------------------------------------------------------------------------

@dataclass
class Level:
    executor: str
    kind: str
    cells: int
    instances: int
    wall_s: float           # the whole run: model servers and workers started, cells, teardown
    span_s: float           # the first instance's start to the last one's end
    orchestration_s: float  # per instance
    model_s: float          # per instance
    cpu_percent: float      # of one core, over the run
    model_cpu_percent: float  # of which the embedded model's servers
    run_cpu_percent: float    # while cells ran (the span), the model's left out: what cells cost
    rss_mb_per_cell: float
    errors: int
    note: str = ""

    @property
    def cpu_s_per_instance(self) -> float:
        """CPU seconds one instance cost this machine, the embedded model's search left out (start-up
        and teardown included): what `carc grid plan` divides the cores by (scale_priors.yaml)."""
        return (self.cpu_percent - self.model_cpu_percent) / 100 * self.wall_s / (self.instances or 1)

    @property
    def per_hour(self) -> float:
        """Instances per hour while cells run (start-up and teardown, paid once per run, left out)."""
        return self.instances / self.span_s * 3600 if self.span_s else 0.0


def grid_for(kind: str, cells: int, args: argparse.Namespace) -> dict:
    learner = "stateless-floor" if kind == "ladder" else kind
    return {"name": f"scale-{kind}-{cells}", "seeds": list(range(cells)),
            "track": {"name": "own", "tasks": args.tasks, "visits": args.visits, "epilogue": 0,
                      "fresh_reference": False},
            "orders": ["sequential"],
            "model": {"endpoint": "embedded", "name": "carc-solver", "timing": args.timing},
            "efforts": [args.effort], "learners": [learner], "workers": cells,
            "sandbox": {"engine": "process" if kind == "ladder" else "docker"}}


def run_local(run: Path, cells: int) -> None:
    from orchestrator.run.local_pool import execute
    execute(run, workers=cells, show_progress=False)


def run_ray(run: Path, cells: int) -> None:
    """`carc grid run --executor ray` on a one-node Ray started for the level on this machine
    with `cells` docker slots (its start is in the level's wall time, not in the instances'
    orchestration); `bench/ray_executor.py` measures a three-node cluster against the pool."""
    from orchestrator.run.ray_executor import execute_ray_run
    execute_ray_run(run, workers=cells, show_progress=False)


# The executors a level can run on: a function (run folder, cells) -> None.
EXECUTORS: dict[str, Callable[[Path, int], None]] = {"local": run_local, "ray": run_ray}


def measure(executor: str, kind: str, cells: int, args: argparse.Namespace, root: Path) -> Level:
    from orchestrator.analysis.journal_summary import instance_walls, journal_frame  # pandas
    paths = RunPaths(root / f"{executor}-{kind}-{cells}")
    paths.cells.mkdir(parents=True)
    paths.grid.write_text(yaml.safe_dump(grid_for(kind, cells, args), sort_keys=False))
    note = ""
    started = time.monotonic()
    with Usage(paths.root.name, args.sample_s) as usage:
        try:
            EXECUTORS[executor](paths.root, cells)
        except Exception as exc:  # noqa: BLE001 - a level with failed cells is a figure too
            note = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    wall = time.monotonic() - started
    frame = journal_frame(paths.root)
    instances, orchestration, model_s, failed_cells = 0, 0.0, 0.0, 0
    times = [(e.type, e.t) for cell_dir in paths.cell_folders() if cell_dir.events.exists()
             for e in read_events(cell_dir.events) if e.type in ("instance_start", "instance_end")]
    starts = [t for kind, t in times if kind == "instance_start"]
    ends = [t for kind, t in times if kind == "instance_end"]
    span = max(ends) - min(starts) if starts and ends else 0.0
    in_span, model_in_span = usage.between(min(starts), max(ends)) if span else (0.0, 0.0)
    for cell_dir in paths.cell_folders():
        walls = instance_walls(paths.root, cell_dir.name)
        failed_cells += not walls
        calls = frame[(frame["cell"] == cell_dir.name) & frame["slot"].isin(list(walls))] if len(frame) else frame
        latency = covered(calls)
        instances += len(walls)
        model_s += latency
        orchestration += sum(walls.values()) - latency
    errors = int(frame["error"].sum()) if len(frame) else 0
    n = instances or 1
    return Level(executor, kind, cells, instances, wall, span, orchestration / n, model_s / n,
                 100 * usage.cpu_seconds() / wall, 100 * usage.model_cpu_seconds() / wall,
                 100 * (in_span - model_in_span) / span if span else 0.0, usage.peak_rss / cells / 2**20,
                 errors + failed_cells, note)


def covered(calls) -> float:
    """Seconds during which at least one of `calls` was waiting on the model: the union of their
    intervals. A harness can call the model in parallel (hermes-agent's background review beside
    its conversation): summed latencies then pass the instance's wall time."""
    spans = sorted((t, t + (latency or 0.0)) for t, latency in zip(calls["t_start"], calls["latency_s"])
                   if t == t) if len(calls) else []
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def knee(levels: list[Level]) -> tuple[Level | None, str]:
    """The last level where doubling (or so) the cells still bought 1.5x the throughput, and why
    the next did not."""
    for previous, level in zip(levels, levels[1:]):
        gain = level.per_hour / previous.per_hour if previous.per_hour else 0.0
        growth = level.cells / previous.cells
        if gain < 1 + 0.5 * (growth - 1):
            return previous, (f"{previous.cells} -> {level.cells} cells bought x{gain:.2f} instances/h "
                              f"(CPU {previous.cpu_percent:.0f} -> {level.cpu_percent:.0f} % of a core, "
                              f"orchestration {previous.orchestration_s:.1f} -> {level.orchestration_s:.1f} s/instance)")
    return (levels[-1] if levels else None), "not reached: throughput still grew with every level"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="2,4,8,16,32", help="concurrent cells, comma-separated")
    parser.add_argument("--kinds", default="ladder,hermes-agent",
                        help="ladder and/or harness names (hermes-agent, openclaw, prime-agent)")
    parser.add_argument("--executors", default="local", help=f"of {', '.join(EXECUTORS)}")
    parser.add_argument("--timing", default="hosted", help="a model.timing profile")
    parser.add_argument("--effort", default="low")
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--visits", type=int, default=2)
    parser.add_argument("--sample-s", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="also write the levels here (for plan's scale priors)")
    parser.add_argument("--keep", type=Path, help="keep the runs in this folder (else a temporary one)")
    parser.add_argument("--quick", action="store_true", help="levels 2,4,8, the ladder, one instance per cell")
    args = parser.parse_args()
    if args.quick:
        args.levels, args.kinds, args.visits = "2,4,8", "ladder", 1
    levels = [int(x) for x in args.levels.split(",")]
    kinds = args.kinds.split(",")
    executors = args.executors.split(",")
    unknown = [e for e in executors if e not in EXECUTORS]
    if unknown:
        parser.error(f"--executors: no executor {', '.join(unknown)}; known: {', '.join(EXECUTORS)}")
    console.print(f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; "
                  f"load at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}", highlight=False)
    results: list[Level] = []
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with (nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory(prefix="carc-scale-")) as tmp:
        for executor in executors:
            for kind in kinds:
                for cells in levels:
                    with console.status(f"{executor}: {cells} x {kind} ..."):
                        level = measure(executor, kind, cells, args, Path(tmp))
                    results.append(level)
                    console.print(f"  {executor} {kind} {cells}: {level.per_hour:.0f} instances/h, "
                                  f"load {os.getloadavg()[0]:.2f}", highlight=False)
    table = Table(title=f"scale: timing {args.timing}, effort {args.effort}, "
                        f"{args.tasks} task(s) x {args.visits} visit(s) per cell")
    for column in ("executor", "kind", "cells", "instances", "wall s", "span s", "instances/h",
                   "orchestration s/inst", "model s/inst", "CPU % (1 core)", "of it model %", "cells' CPU % in span", "CPU s/inst", "RSS MB/cell", "errors", "note"):
        table.add_column(column, justify="left" if column in ("executor", "kind", "note") else "right")
    for r in results:
        table.add_row(r.executor, r.kind, str(r.cells), str(r.instances), f"{r.wall_s:.0f}", f"{r.span_s:.0f}",
                      f"{r.per_hour:.0f}", f"{r.orchestration_s:.2f}", f"{r.model_s:.1f}",
                      f"{r.cpu_percent:.0f}", f"{r.model_cpu_percent:.0f}", f"{r.run_cpu_percent:.0f}", f"{r.cpu_s_per_instance:.1f}", f"{r.rss_mb_per_cell:.0f}", str(r.errors), r.note)
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"load": os.getloadavg(), "args": {k: str(v) if isinstance(v, Path) else v
                                                                           for k, v in vars(args).items()},
                                         "levels": [asdict(r) | {"per_hour": r.per_hour, "cpu_s_per_instance": r.cpu_s_per_instance}
                                                    for r in results]},
                                        indent=1))
    for executor in executors:
        for kind in kinds:
            at, why = knee([r for r in results if (r.executor, r.kind) == (executor, kind)])
            if at is not None:
                console.print(f"knee {executor} {kind}: {at.cells} cells: {why}", highlight=False)
    console.print(f"load at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}", highlight=False)


if __name__ == "__main__":
    main()
