"""Benchmark: the Ray executor's overhead against the local process pool, on one small ladder grid.

Runs the same grid (own tasks, the two floors, effort low, embedded model) twice: with the local
pool (`carc grid run`) and with `--executor ray` on a Ray cluster of three nodes on this machine
(`ray.cluster_utils.Cluster`, loopback only: a head with no cell slot and two nodes with
`docker: W/2` slots each). Prints, per executor: the cluster's start (Ray only, paid once per
cluster, not per run), the run's wall time, the mean time from the run's start to each cell's
first instance (dispatch, the cell's model server and proxy), orchestration seconds per instance
(the run's wall time x workers, less the time inside model calls, over the instances), and
whether the verdicts are the same; then the ratios.

    python bench/ray_executor.py [--tasks 4] [--visits 2] [--cells 4] [--workers 2] [--durability shared|head]
    python bench/ray_executor.py --users 8 [--tasks 4] [--visits 2] [--workers 2]

With `--users U` the grid is collective (U users, rounds of `tasks` slots; rows: the stateless
floor and the collective demo-cache floor, one seed): the local executor's user pool against one
Ray task per (row, round, user), each starting its own model server and proxy; "to first
instance" is then over every user of every row.

"to first instance" is the mean over cells of the time from the run's start to the cell's first
instance, queueing behind other cells included; for Ray it also holds connecting to the cluster,
the image check and prune task on every node, and each cell's own model server start.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every node on 127.0.0.1

from orchestrator.records import RunPaths, read_events  # noqa: E402
from orchestrator.run.collective.on_ray import execute_collective_ray  # noqa: E402
from orchestrator.run.collective.rounds import execute_collective  # noqa: E402
from orchestrator.run.local_pool import execute  # noqa: E402
from orchestrator.run.ray_executor import execute_ray_run  # noqa: E402

LEARNERS = ["stateless-floor", "demo-cache-floor"]


def grid_text(tasks: int, visits: int, seeds: int, workers: int) -> str:
    return (f"name: bench-ray\nseeds: [{', '.join(str(s) for s in range(seeds))}]\n"
            f"track: {{name: own, tasks: {tasks}, visits: {visits}, epilogue: 0, fresh_reference: false}}\n"
            f"orders: [sequential]\nmodel: {{endpoint: embedded, name: carc-solver}}\nefforts: [low]\n"
            f"learners: [{', '.join(LEARNERS)}]\nworkers: {workers}\n")


def collective_grid_text(tasks: int, visits: int, users: int, workers: int) -> str:
    return (f"name: bench-ray-collective\nseed: 0\n"
            f"track: {{name: own, tasks: {tasks}, visits: {visits}, epilogue: 0, fresh_reference: false}}\n"
            f"collective: {{users: {users}, round_slots: {tasks}}}\n"
            f"orders: [sequential]\nmodel: {{endpoint: embedded, name: carc-solver}}\nefforts: [low]\n"
            f"learners: [stateless-floor, {{learner: demo-cache-floor, row: collective}}]\nworkers: {workers}\n")


def measure(run: Path, started: float, wall: float, workers: int) -> dict:
    logs = {}  # a cell's events, or each collective user's
    for cell in RunPaths(run).cell_folders():
        for folder in cell.user_folders() or [cell]:
            logs[(cell.name, folder.root.name)] = read_events(folder.events)
    ends = [(key, e) for key, events in logs.items() for e in events if e.type == "instance_end"]
    firsts = [min(e.t for e in events if e.type == "instance_start") - started for events in logs.values()]
    model_s = sum(e.model_s or 0.0 for _, e in ends)
    return {"instances": len(ends), "wall": wall, "first": sum(firsts) / len(firsts),
            "orchestration": (wall * workers - model_s) / len(ends),
            "verdicts": {(*key, e.slot): (e.status, e.cost) for key, e in ends}}


def run_grid(root: Path, name: str, text: str, workers: int, address: str | None = None,
             durability: str = "shared") -> dict:
    run = root / name
    (run / "cells").mkdir(parents=True)
    (run / "grid.yaml").write_text(text)
    started = time.time()
    clock = time.perf_counter()
    collective = "collective:" in text
    if address is None and collective:
        execute_collective(run, workers, show_progress=False)
    elif address is None:
        execute(run, workers, show_progress=False)
    elif collective:
        execute_collective_ray(run, workers, address, show_progress=False, durability=durability)
    else:
        execute_ray_run(run, workers, address, show_progress=False, durability=durability)
    return measure(run, started, time.perf_counter() - clock, workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--visits", type=int, default=2)
    parser.add_argument("--cells", type=int, default=4, help="cells in the grid (2 learners x cells/2 seeds)")
    parser.add_argument("--workers", type=int, default=2, help="cells at once, in both executors")
    parser.add_argument("--durability", default="shared", choices=["shared", "head"])
    parser.add_argument("--users", type=int, default=0, help="a collective grid of this many users")
    args = parser.parse_args()
    from ray.cluster_utils import Cluster

    console = Console(width=160)
    text = (collective_grid_text(args.tasks, args.visits, args.users, args.workers) if args.users else
            grid_text(args.tasks, args.visits, max(1, args.cells // len(LEARNERS)), args.workers))
    what = (f"a collective grid: 2 rows x {args.users} users" if args.users else f"{args.cells} ladder cells")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        local = run_grid(root, "local", text, args.workers)
        clock = time.perf_counter()
        small = {"object_store_memory": 80 << 20, "include_dashboard": False}
        cluster = Cluster(initialize_head=True, connect=False,
                          head_node_args={"num_cpus": 1, "resources": {"docker": 0}, **small})
        try:
            per_node = max(1, args.workers // 2)
            for _ in range(2):
                cluster.add_node(num_cpus=per_node, memory=4 << 30, resources={"docker": per_node}, **small)
            cluster.wait_for_nodes()
            cluster_s = time.perf_counter() - clock
            ray = run_grid(root, "ray", text, args.workers, cluster.address, args.durability)
        finally:
            cluster.shutdown()
    table = Table(title=f"Ray executor against the local pool ({what}, {args.tasks} tasks "
                        f"x {args.visits} visits, {args.workers} at once; load {load[0]:.1f} at the start)")
    for column in ("executor", "instances", "cluster start s", "run wall s", "to first instance s",
                   "orchestration s/instance", "same verdicts"):
        table.add_column(column, justify="right")
    table.add_row("local pool", str(local["instances"]), "-", f"{local['wall']:.2f}", f"{local['first']:.2f}",
                  f"{local['orchestration']:.3f}", "reference")
    table.add_row(f"ray ({args.durability})", str(ray["instances"]), f"{cluster_s:.2f}", f"{ray['wall']:.2f}", f"{ray['first']:.2f}",
                  f"{ray['orchestration']:.3f}", "yes" if ray["verdicts"] == local["verdicts"] else "NO")
    console.print(table)
    console.print(f"ray / local: run wall {ray['wall'] / local['wall']:.2f}x, orchestration per instance "
                  f"{ray['orchestration'] / local['orchestration']:.2f}x; load now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
