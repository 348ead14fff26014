"""Per-instance overhead of each harness: wall time minus the time its model calls took.

    python bench/harnesses.py [--tasks 3] [--visits 2] [--harness hermes-agent --harness openclaw]

Runs one grid on the embedded solver model with a memory-on and a memory-off cell per harness
(the real packages in their sandboxes, through their proxies) and the stateless floor for scale,
then prints, per cell: instances, wall s per instance, model s per instance (the proxy journal's
latencies of the instance's slot), overhead s per instance, model calls and endpoint probes per
instance; and each image's size. prime-agent is included when CARC_PRIME_AGENT_SOURCE is set.

`wall s` is an instance's own wall clock (instance_start to instance_end), which leaves out what
happens before instance_start: a memory-off row's wipe and harness restart. `cycle s` is what an
instance costs the cell in all: the time from one instance_end to the next (so the cell's start
is left out: the first instance has no cycle), and `cycle overhead s` is that minus its model s.
`between s` is the part of the cycle between one instance_end and the next instance_start: the
wipe (or the standby's swap) on the instance's critical path.
`--no-standby` runs the wiped rows without a prepared standby sandbox (grid `sandbox.standby`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from harness_adapters import registry  # noqa: E402
from orchestrator.analysis.journal_summary import instance_walls, journal_frame  # noqa: E402
from orchestrator.records import RunPaths, read_events  # noqa: E402
from orchestrator.run.local_pool import execute  # noqa: E402
from sandboxes.images import docker_client, ensure_image, image_size_mb  # noqa: E402

console = Console(width=200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--visits", type=int, default=2)
    parser.add_argument("--harness", action="append")
    parser.add_argument("--no-standby", action="store_true",
                        help="memory-off rows wipe in place (grid sandbox.standby: false)")
    args = parser.parse_args()
    harnesses = args.harness or ["hermes-agent", "openclaw"] + (
        ["prime-agent"] if os.environ.get("CARC_PRIME_AGENT_SOURCE") else [])

    client = docker_client()
    sizes = {}
    for name in harnesses:
        start = time.monotonic()
        tag = ensure_image(registry.adapter(name).recipe, "auto", client)
        sizes[name] = (tag, image_size_mb(client, tag), time.monotonic() - start)
    learners = ["stateless-floor"] + [e for name in harnesses
                                      for e in (name, {"learner": name, "row": "memory-off"})]
    grid = {"name": "bench-harnesses", "seed": 1,
            "track": {"name": "own", "tasks": args.tasks, "visits": args.visits, "epilogue": 0,
                      "fresh_reference": False},
            "orders": ["sequential"], "model": {"endpoint": "embedded", "name": "carc-solver"},
            "efforts": ["low"], "learners": learners, "workers": 2}
    if args.no_standby:
        grid["sandbox"] = {"standby": False}
    with tempfile.TemporaryDirectory(prefix="carc-bench-") as tmp:
        paths = RunPaths(Path(tmp) / "runs" / f"bench-harnesses-{int(time.time())}")
        paths.cells.mkdir(parents=True)
        paths.grid.write_text(yaml.safe_dump(grid, sort_keys=False))
        run = paths.root
        started = time.monotonic()
        with console.status(f"running {len(learners) * 1} cells x {args.tasks * args.visits} instances"):
            execute(run, show_progress=False)
        elapsed = time.monotonic() - started
        frame = journal_frame(run)
        table = Table(title=f"per instance, embedded model ({elapsed:.0f} s in all)")
        for column in ("cell", "instances", "wall s", "model s", "overhead s", "cycle s",
                       "cycle overhead s", "between s", "model calls", "probes"):
            table.add_column(column, justify="left" if column == "cell" else "right", no_wrap=True)
        for cell_dir in (c.root for c in paths.cell_folders()):
            walls = instance_walls(run, cell_dir.name)
            calls = frame[(frame["cell"] == cell_dir.name) & frame["slot"].isin(list(walls))]
            n = len(walls) or 1
            wall = sum(walls.values()) / n
            model = calls["latency_s"].fillna(0).sum() / n
            probes = int(calls["probe"].sum())
            events = read_events(paths.cell(cell_dir.name).events)
            ends = sorted((e.t, e.slot) for e in events if e.type == "instance_end")
            starts = {e.slot: e.t for e in events if e.type == "instance_start"}
            cycles = {slot: t - before for (before, _), (t, slot) in zip(ends, ends[1:])}
            cycle_model = calls[calls["slot"].isin(list(cycles))]["latency_s"].fillna(0).sum()
            cycle = f"{sum(cycles.values()) / len(cycles):.2f}" if cycles else "-"
            cycle_overhead = (f"{(sum(cycles.values()) - cycle_model) / len(cycles):.2f}"
                              if cycles else "-")
            between = [starts[slot] - before for (before, _), (_, slot) in zip(ends, ends[1:]) if slot in starts]
            table.add_row(cell_dir.name, str(len(walls)), f"{wall:.2f}", f"{model:.2f}",
                          f"{wall - model:.2f}", cycle, cycle_overhead,
                          f"{sum(between) / len(between):.2f}" if between else "-",
                          f"{(len(calls) - probes) / n:.1f}", f"{probes / n:.1f}")
        console.print(table)
    for name, (tag, size, seconds) in sizes.items():
        console.print(f"image {name:<14} {tag:<40} {size:6.0f} MB  (ensure_image {seconds:.1f} s)")


if __name__ == "__main__":
    main()
