"""Benchmark: the CPU one model call costs on the instrument's path, and the floor it puts under a run.

Every model call of a run passes the learner's SDK client, a journaling proxy (mitmdump, the
collective row proxy's settings: tags on, request bodies in raw/) and the model server. This sends
`--calls` calls of one conversation along that path to the embedded model, whose answer is the
cheapest it gives (the opening of an instance without pairs: buy one), so what is measured is the
path, not the model's search. It prints, per request size, the CPU milliseconds per call of each
process (client, proxy, model server) and the same without the proxy.

With `--run RUN` (a collective run folder, finished or stopped) it reads each row's model calls
per instance from the users' records, multiplies by the instances the grid has, and prints the
least CPU time the whole grid's calls take on this path alone, and so the least wall time on this
machine's cores: the part of a run no faster learner or search could remove.

    python bench/call_path.py [--calls 300] [--sizes 1,30,100] [--run runs/ID [--grid GRID]]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness_adapters.chat_model import ChatModel, ModelEndpoint  # noqa: E402
from orchestrator.prompts import PromptSet  # noqa: E402
from orchestrator.run.grid_config import load_grid  # noqa: E402
from orchestrator.run.collective.schedule import user_schedule  # noqa: E402
from orchestrator.run.model_service import _wait_ready  # noqa: E402
from proxy.host import HostProxy, free_port  # noqa: E402
from proxy.journal import make_tag  # noqa: E402


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process and its children still alive."""
    process = psutil.Process(pid)
    total = 0.0
    for p in [process] + process.children(recursive=True):
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def conversation(kb: int) -> list[dict]:
    """An instance's opening (no pair held: the model buys one) with `kb` KB of earlier exchange
    that the model reads and ignores, as a late call of a long conversation carries."""
    prompts = PromptSet.load()
    grid = tuple(tuple((r * 7 + c) % 10 for c in range(10)) for r in range(10))
    messages = [{"role": "system", "content": prompts.render("system")},
                {"role": "user", "content": prompts.instance_message("own-bench", grid, 0, 0)}]
    filler = "An earlier reply, read and set aside by the model. " * 20  # ~1 KB
    for _ in range(max(0, kb - 1)):
        messages += [{"role": "assistant", "content": filler[:len(filler) // 2]},
                     {"role": "user", "content": filler[len(filler) // 2:]}]
    return messages


def measure(base_url: str, messages: list[dict], calls: int, server: int, proxy: int | None) -> dict:
    model = ChatModel(ModelEndpoint(base_url=base_url, model="carc-solver", api_key_env=""))
    model.set_tag(make_tag(0, 0, "before"))
    model.complete(messages)  # connection and first-use costs out of the count
    before = (time.process_time(), cpu_s(server), cpu_s(proxy) if proxy else 0.0, time.perf_counter())
    for _ in range(calls):
        model.complete(messages)
    after = (time.process_time(), cpu_s(server), cpu_s(proxy) if proxy else 0.0, time.perf_counter())
    client, srv, prx, wall = (1000 * (b - a) / calls for a, b in zip(before, after))
    body = len(json.dumps({"model": "carc-solver", "messages": messages}))
    return {"body_kb": body / 1024, "client": client, "proxy": prx, "server": srv,
            "total": client + prx + srv, "wall": wall}


def row_calls(run_dir: Path, grid_path: Path | None = None) -> dict[str, tuple[int, int, int]]:
    """Per row: (instances finished, model calls of those, instances the grid has): the run's
    grid, or `grid_path` (the same rows at another size: a small run's rates, the full grid's count)."""
    grid = load_grid(grid_path or run_dir / "grid.yaml")
    assert grid.collective is not None, f"{grid_path or run_dir}: not a collective grid"
    cells = {c.cell: c for c in grid.cells()}
    seen: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for events in sorted((run_dir / "cells").glob("*/users/*/events.jsonl")):
        row = events.parent.parent.parent.name
        for line in events.read_text().splitlines():
            if '"instance_end"' in line:
                event = json.loads(line)
                seen[row][0] += 1
                seen[row][1] += event.get("model_calls") or 0
    users = grid.collective.users
    return {row: (n, calls, sum(len(user_schedule(grid, cells[row], u)) for u in range(users)))
            for row, (n, calls) in sorted(seen.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--sizes", default="1,30,100", help="request sizes to measure, in KB of conversation")
    parser.add_argument("--run", type=Path, help="a collective run folder: the floor its calls put under it")
    parser.add_argument("--grid", type=Path, help="with --run: count the instances of this grid (the same "
                                                  "rows, more users) at the run's calls per instance")
    args = parser.parse_args()
    console = Console(width=150)
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        log = Path(tmp) / "model-server.log"
        with open(log, "wb") as out:
            server = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "model", "serve",
                                       "--port", str(port), "--effort", "low"],
                                      stdout=out, stderr=subprocess.STDOUT)
        upstream = f"http://127.0.0.1:{port}/v1"
        try:
            _wait_ready(server, upstream, Path(tmp))
            with HostProxy(Path(tmp) / "journal", "bench", upstream, allow=(f"127.0.0.1:{port}",),
                           mode="reverse", tags=True, requests="raw") as proxy:
                proxy_pid = proxy._process.pid
                table = Table(title=f"CPU per model call, ms ({args.calls} calls each, sequential)")
                for column in ("path", "request KB", "client", "proxy", "model server", "total CPU", "wall"):
                    table.add_column(column, justify="right")
                floor_ms = {}
                for kb in sizes:
                    messages = conversation(kb)
                    for path, url, pid in (("SDK -> proxy -> model", proxy.base_url, proxy_pid),
                                           ("SDK -> model", upstream, None)):
                        m = measure(url, messages, args.calls, server.pid, pid)
                        if pid:
                            floor_ms[kb] = m
                        table.add_row(path, f"{m['body_kb']:.0f}", f"{m['client']:.2f}",
                                      f"{m['proxy']:.2f}" if pid else "-", f"{m['server']:.2f}",
                                      f"{m['total']:.2f}", f"{m['wall']:.2f}")
                console.print(table)
        finally:
            server.terminate()
            server.wait(10)
    if args.run is None:
        return
    small = floor_ms[min(sizes)]["total"]
    cores = os.cpu_count() or 1
    table = Table(title=f"{args.grid or args.run}: the least CPU its model calls take on this path "
                        f"({small:.2f} ms a call, the smallest request's)")
    for column in ("row", "instances seen", "calls / instance", "instances in grid", "calls in grid", "CPU s"):
        table.add_column(column, justify="right")
    total_calls = 0.0
    for row, (n, calls, planned) in row_calls(args.run, args.grid).items():
        per = calls / n if n else 0.0
        total_calls += per * planned
        table.add_row(row, f"{n:,}", f"{per:.1f}", f"{planned:,}", f"{per * planned:,.0f}",
                      f"{per * planned * small / 1000:,.0f}")
    console.print(table)
    floor_s = total_calls * small / 1000 / cores
    console.print(f"{total_calls:,.0f} calls x {small:.2f} ms / {cores} cores = at least "
                  f"{floor_s:,.0f} s ({floor_s / 60:.0f} min) of wall time for the calls' path alone")


if __name__ == "__main__":
    main()
