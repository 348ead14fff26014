"""Benchmark: the full analysis of the collective configuration's record set, 160,000 verdicts.

The seed's collective configuration is 100 users x 1,600 instances. Modelled here as 100 cells on
one workstreams schedule of 200 tasks x 8 visits: one stateless floor and 99 users that learn at
their own rate, each verdict an `instance_end` Event. Times, separately: the instance frame, every
table (`measures.run_measures` when it exists, else `measures.analyse`) with 10,000 bootstrap
resamples, the figures' curves and drawings, and the HTML page; the target for frame + tables is
under 10 s.

    python bench/analysis.py [--users 100] [--tasks 200] [--resamples 10000]
                             [--tables auto|measures|analyse] [--html OUT.html]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from orchestrator.analysis import measures, plots, report, report_html, tables
from orchestrator.records import Event
from orchestrator.streams import PRESETS, build_stream

TARGET_S = 10.0


def records(users: int, tasks: int, visits: int, seed: int = 0) -> tuple[dict, dict]:
    """(cells, events by cell) of `users` cells on one schedule: the first a stateless floor,
    the others buying fewer pairs and failing less the more often they met a task."""
    settings = dataclasses.replace(PRESETS["workstreams"], visits=visits)
    stream = build_stream([f"task-{k:03d}" for k in range(tasks)], settings, seed)
    slot_task = np.array([int(s.task_id.split("-")[1]) for s in stream.slots])
    exposure = np.array([s.exposure for s in stream.slots])
    rng = np.random.default_rng(seed)
    difficulty = rng.beta(2.0, 3.0, size=tasks)[slot_task]
    cells, events = {}, {}
    for user in range(users):
        floor = user == 0
        cell = "stateless-floor.collective" if floor else f"user-{user:03d}.collective"
        learner = measures.FLOOR if floor else "program-library"
        cells[cell] = {"cell": cell, "label": cell.split(".")[0], "learner": learner,
                       "row": "memory-on", "model": "carc-solver", "effort": "medium",
                       "order": "workstreams", "seed": seed, "track": "collective"}
        rate = 0.0 if floor else rng.uniform(0.02, 0.12)
        fails = rng.random(len(stream)) < difficulty * (1 - rate * exposure)
        pairs = rng.integers(1, 6, len(stream))
        recalled = rng.random(len(stream)) < rate * exposure  # answered from memory, no pair
        wrong = (rng.random(len(stream)) < 0.2).astype(int)
        cost = np.where(fails, 16, np.where(recalled, 0, pairs) + wrong)
        events[cell] = [
            Event(type="instance_end", cell=cell, slot=s.index, phase="stream", task=s.task_id,
                  visit=s.visit, exposure=s.exposure, t=float(s.index),
                  status="failed" if c == 16 else "solved", cost=int(c),
                  first_submit_demos=int(min(c, 8)), first_answer_correct=bool(c < 16 and w == 0),
                  wall_s=2.0, model_calls=int(min(c, 8)) + 1, prompt_tokens=900 + 400 * int(c),
                  completion_tokens=120, model_s=0.6 + 0.3 * int(c), cost_usd=0.0)
            for s, c, w in zip(stream.slots, cost, wrong)]
    return cells, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--visits", type=int, default=8)
    parser.add_argument("--resamples", type=int, default=measures.RESAMPLES)
    parser.add_argument("--tables", choices=("auto", "measures", "analyse"), default="auto",
                        help="auto and measures: tables.run_measures (every table); analyse: the first four")
    parser.add_argument("--html", type=Path, help="also write the page here")
    args = parser.parse_args()
    console = Console(width=120)
    times: list[tuple[str, float, str]] = []

    start = time.perf_counter()
    cells, events = records(args.users, args.tasks, args.visits)
    verdicts = sum(len(v) for v in events.values())
    times.append(("records (synthetic Events, not analysis)", time.perf_counter() - start,
                  f"{verdicts:,} verdicts, {len(cells)} cells"))

    start = time.perf_counter()
    frame = measures.instances_frame(events, cells)
    times.append(("instances frame", time.perf_counter() - start, f"{len(frame):,} rows"))

    rng = np.random.default_rng(0)
    start = time.perf_counter()
    if args.tables != "analyse":
        every = tables.run_measures(frame, cells, rng, args.resamples)
        what = f"run_measures: {', '.join(every)}"
    else:
        result = measures.analyse(frame, cells, rng, args.resamples)
        what = "analyse: cells, exposure, floor differences, forward transfer"
    times.append(("tables", time.perf_counter() - start, what))
    analysis_s = times[1][1] + times[2][1]
    if args.tables != "analyse":  # results/: the long measures written and read back, the instances
        import tempfile

        from orchestrator.analysis import journal_summary, results
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            long, layout = results.to_long(every)
            results.write_measures(Path(folder) / results.MEASURES, long, layout)
            back = results.read_tables(Path(folder) / results.MEASURES)
            times.append(("measures.parquet written + read back", time.perf_counter() - start,
                          f"{len(long):,} long rows, {len(back)} tables"))
            start = time.perf_counter()
            instances = results.instances_table(frame, journal_summary.instance_compute(
                journal_summary.journal_frame(Path(folder))))
            results.write_instances(Path(folder) / results.INSTANCES, instances)
            size = (Path(folder) / results.INSTANCES).stat().st_size
            times.append(("instances.parquet", time.perf_counter() - start,
                          f"{len(instances):,} rows, {size / 1e6:.1f} MB"))

    # the figures take the first report's tables; outside the target
    result = measures.analyse(frame, cells, np.random.default_rng(0), args.resamples) \
        if args.tables != "analyse" else result
    start = time.perf_counter()
    figure_rng = np.random.default_rng(1)
    exposure = plots.exposure_curves(frame, figure_rng, args.resamples)
    gaps = plots.gap_curves(frame, figure_rng, args.resamples)
    times.append(("figure curves", time.perf_counter() - start,
                  f"{len(exposure)} exposure and {len(gaps)} gap points"))
    start = time.perf_counter()
    pngs = [plots.budget_by_exposure(exposure), plots.budget_by_gap(gaps),
            plots.savings_against_floor(result.floor_differences),
            plots.compute_against_budget(result.cells)]
    times.append(("figure drawing", time.perf_counter() - start,
                  f"{len(pngs)} PNGs, {sum(map(len, pngs)) / 1e6:.1f} MB"))
    start = time.perf_counter()
    unfinished = measures.unfinished_instances(events)
    page = report_html.render_html(
        "bench", "Synthetic collective configuration.",
        report.report_sections(result, unfinished),
        [report_html.Figure(f"figure {k}", png, f"figure {k}") for k, png in enumerate(pngs)])
    times.append(("HTML page", time.perf_counter() - start, f"{len(page) / 1e6:.1f} MB"))
    if args.html:
        args.html.write_text(page, encoding="utf-8")

    table = Table(title=f"analysis of {verdicts:,} verdicts ({args.users} cells x "
                        f"{args.tasks} tasks x {args.visits} visits, {args.resamples:,} resamples)")
    for column, justify in (("step", "left"), ("seconds", "right"), ("what", "left")):
        table.add_column(column, justify=justify)
    for step, seconds, what in times:
        table.add_row(step, f"{seconds:.2f}", what)
    table.add_row("frame + tables", f"{analysis_s:.2f}",
                  f"target < {TARGET_S:.0f} s: {'met' if analysis_s < TARGET_S else 'MISSED'}")
    console.print(table)


if __name__ == "__main__":
    main()
