"""Fault injection: what carc's records look like after each kind of fault, against a clean run.

    python bench/faults.py [--kills 20] [--scenario sigkill --scenario proxy ...]

Every scenario runs a short grid on the embedded solver (served on loopback by this script, so a
fault can be injected at a chosen model call) once clean and once with the fault, then prints per
scenario: faults injected, recovered (the run finished with every instance recorded), records lost
(instances of the clean run missing), double charges (a slot ended twice), verdicts that differ
from the clean run, and carc containers, volumes and networks left for the run id (and state
volume files that no volume owns any more).

Scenarios:
  sigkill    the `carc grid run` process tree SIGKILLed at random points (--kills), resumed each time
  proxy      the cell's host mitmdump SIGKILLed mid-call (ladder cell)
  container  the program library's program container `docker kill`ed mid-call
  disk       the run folder on a tmpfs that fills mid-run; space is given back and the run resumed
  upstream-429-retry-after, upstream-429, upstream-500, upstream-hang, upstream-truncated,
  upstream-reset
             the model endpoint fails one call mid-run as a provider does (a hang outlasts the
             grid's 10 s model timeout); the ladder client retries it, so the verdicts must equal
             the clean run's, and the journal must hold the failed attempt ("journal errors")
  harness-killed, harness-hangs, harness-exits, harness-fork-bomb, harness-memory-hog
             a hermes-agent cell (memory-on, on the embedded model, wall clock 120 s per instance)
             faulted after the first model call of its second instance: the sandbox container
             `docker kill`ed (infrastructure: never charged, the instance reruns, the verdicts must
             equal the clean run's), or, as the sandbox user, every harness process stopped
             (SIGSTOP) or killed, a fork bomb, a process that touches 8 GiB. The harness faults are
             the learner's own: that instance may fail, with its reason ("fault verdict"); every
             later instance must still run and end. "host lag" is the worst delay of a 50 ms timer
             on the host while the fault ran.
  harness-stream-cut
             the hermes-agent cell on the embedded model served by this script, whose 22nd chat
             call (in the second instance) streams two chunks and then breaks the connection
             mid-body, as a provider's stream does; compared with the same endpoint unbroken.
             What the harness makes of it is its own (hermes retries or fails the turn); the
             journal must hold the broken call.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from orchestrator.records import read_events  # noqa: E402
from orchestrator.run.grid_run import execute  # noqa: E402
from proxy.journal import read_journal  # noqa: E402
from tests.solver_endpoint import UPSTREAM_FAULTS, SolverEndpoint, serve  # noqa: E402

console = Console(width=150)

GRID = """\
name: faults
seed: 2
track: {{name: own, tasks: 4, visits: 3, epilogue: 0, fresh_reference: false}}
orders: [sequential]
efforts: [low]
learners: [stateless-floor, program-library]
workers: 2
sandbox: {{engine: docker}}
model: {{endpoint: '{url}', name: carc-solver, timeout_s: 10}}
"""
UPSTREAM = [f"upstream-{kind}" for kind in UPSTREAM_FAULTS]
HARNESS_GRID = """\
name: harness-faults
seed: 2
track: {name: own, tasks: 2, visits: 2, epilogue: 0, fresh_reference: false}
orders: [sequential]
efforts: [low]
learners: [hermes-agent]
workers: 1
limits: {wall_clock_s: 120}
model: {endpoint: embedded, name: carc-solver}
"""
# run in the harness's sandbox as its own user (uid 1000), detached, as a tool call of the harness would
HARNESS_FAULTS = {
    "harness-killed": None,  # `docker kill` of the sandbox container, from the host
    "harness-hangs": "kill -STOP -1",
    "harness-exits": "kill -KILL -1",
    "harness-fork-bomb": "bomb() { bomb | bomb & }; bomb",
    "harness-memory-hog": "python3 -c 'x = bytearray(b\"\\1\") * (8 << 30)'",
}


def new_run(root: Path, name: str, grid: str) -> Path:
    run_dir = root / name
    (run_dir / "cells").mkdir(parents=True)
    (run_dir / "grid.yaml").write_text(grid)
    return run_dir


def finishes(run_dir: Path) -> bool:
    """Run the grid in this process; False (and why, printed) when the run raises."""
    try:
        execute(run_dir, show_progress=False)
        return True
    except Exception as exc:  # noqa: BLE001 - reported in the table
        console.print(f"[red]{run_dir.name}: {exc}")
        return False


def verdicts(run_dir: Path) -> dict[str, list[tuple]]:
    out = {}
    for cell in sorted((run_dir / "cells").iterdir()):
        events = read_events(cell / "events.jsonl") if (cell / "events.jsonl").exists() else []
        out[cell.name] = [(e.slot, e.status, e.cost) for e in events if e.type == "instance_end"]
    return out


def leaks(run_id: str) -> int:
    """carc containers, volumes and networks of the run, and state-volume files (with their loop
    devices) that no volume owns any more."""
    from sandboxes.docker_sandbox import LABEL_RUN
    from sandboxes.images import docker_client
    from sandboxes.state_volumes import STATE_IMAGES
    client, label = docker_client(), {"label": f"{LABEL_RUN}={run_id}"}
    owned = {v.name for v in client.volumes.list()}
    orphans = [f for f in STATE_IMAGES.glob("*.ext4") if f.name.removesuffix(".ext4") not in owned]
    return (len(client.containers.list(all=True, filters=label)) + len(client.volumes.list(filters=label))
            + len(client.networks.list(filters=label)) + len(orphans))


def compare(clean: dict, run_dir: Path, injected: int, finished: bool) -> dict:
    got = verdicts(run_dir)
    ended = {c: {slot for slot, *_ in v} for c, v in got.items()}
    lost = sum(1 for c, v in clean.items() for slot, *_ in v if slot not in ended.get(c, set()))
    double = sum(n - 1 for c in got.values() for n in Counter(slot for slot, *_ in c).values() if n > 1)
    differ = sum(1 for c, v in clean.items() for a in v if a not in got.get(c, []))
    faults = sum(1 for cell in (run_dir / "cells").iterdir() if (cell / "events.jsonl").exists()
                 for e in read_events(cell / "events.jsonl") if e.type == "infrastructure_fault")
    journal_errors = 0
    for journal in (run_dir / "cells").glob("*/journal/journal.jsonl"):
        try:
            journal_errors += sum(1 for entry in read_journal(journal)
                                  if entry.error or entry.status is None or entry.status >= 400)
        except ValueError as exc:  # a line that is not an entry: reported, not a crash of the bench
            console.print(f"[red]{exc}")
            journal_errors = -1
            break
    return {"injected": injected, "recovered": "yes" if finished and not lost else "no", "lost": lost,
            "double": double, "differ": differ, "journaled faults": faults,
            "journal errors": journal_errors, "leaks": leaks(run_dir.name)}


def cli(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume", str(run_dir),
                             "--no-report"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def steps(run_dir: Path) -> int:
    return sum((d / "events.jsonl").read_text().count("\n")
               for d in (run_dir / "cells").iterdir() if (d / "events.jsonl").exists())


def sigkill(root: Path, url: str, clean: dict, kills: int) -> dict:
    run_dir = new_run(root, "sigkill", GRID.format(url=url))
    rng, done = random.Random(0), 0
    while done < kills:
        proc, start = cli(run_dir), steps(run_dir)
        target, deadline = start + rng.randint(1, 12), time.time() + 300
        while proc.poll() is None and steps(run_dir) < target and time.time() < deadline:
            time.sleep(0.01)
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        done += 1
    finished = cli(run_dir).wait(timeout=1800) == 0
    return compare(clean, run_dir, done, finished)


def injected_at_call(root: Path, name: str, url: str, clean: dict, calls: int, fault) -> dict:
    run_dir = new_run(root, name, GRID.format(url=url))
    SolverEndpoint.arm(calls // 2, fault if isinstance(fault, str) else (lambda: fault(run_dir)))
    finished = finishes(run_dir)
    SolverEndpoint.arm(None)
    return compare(clean, run_dir, 1, finished)


def kill_proxy(run_dir: Path) -> None:
    """SIGKILL the host mitmdump of a cell that is running now (its ready file names the pid)."""
    for ready in sorted((run_dir / "cells").glob("*/journal/proxy.ready")):
        try:
            os.kill(json.loads(ready.read_text())["pid"], signal.SIGKILL)
            return
        except ProcessLookupError:
            continue  # that cell has finished


def kill_container(run_dir: Path) -> None:
    from sandboxes.images import docker_client
    record = sorted((run_dir / "cells").glob("program-library*/sandbox.json"))[0]
    docker_client().containers.get(json.loads(record.read_text())["container"]).kill()


def disk(root: Path, url: str, clean: dict) -> dict:
    """The run folder on a tmpfs too small for the run; then the space comes back and it resumes."""
    mount = root / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], check=True)
    try:
        run_dir = new_run(mount, "disk", GRID.format(url=url))
        first = cli(run_dir).wait(timeout=1800)
        message = "stopped (exit %d)" % first if first else "finished (the tmpfs did not fill)"
        subprocess.run(["mount", "-o", "remount,size=512m", str(mount)], check=True)
        finished = cli(run_dir).wait(timeout=1800) == 0
        result = compare(clean, run_dir, 1 if first else 0, finished)
        result["note"] = message
        return result
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


class BreakStream:
    """ASGI middleware: chat call number `at` sends two body messages, then the connection breaks."""

    def __init__(self, app, at: int | None):
        self.app, self.at, self.calls = app, at, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            return await self.app(scope, receive, send)
        self.calls += 1
        if self.calls != self.at:
            return await self.app(scope, receive, send)
        bodies = 0

        async def breaking(message):
            nonlocal bodies
            if message["type"] == "http.response.body":
                bodies += 1
                if bodies > 2:
                    raise ConnectionResetError("scripted: the provider's stream breaks")
            await send(message)
        await self.app(scope, receive, breaking)


def stream_cut(root: Path, at: int = 22) -> dict:
    import uvicorn

    from proxy.host import free_port
    from sandboxes.images import docker_client
    from sandboxes.networks import host_address
    from solver_model.server import create_app
    runs = {}
    for name, armed in (("harness-stream-clean", None), ("harness-stream-cut", at)):
        app = BreakStream(create_app(effort_default="low", seed=0), armed)
        host = host_address(docker_client())
        port = free_port(host)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="critical"))
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.05)
        run_dir = new_run(root, name, HARNESS_GRID.replace("endpoint: embedded",
                                                           f"endpoint: 'http://{host}:{port}/v1'"))
        finished = finishes(run_dir)
        server.should_exit = True
        runs[name] = (run_dir, finished, app.calls)
    clean_dir, _, calls = runs["harness-stream-clean"]
    run_dir, finished, _ = runs["harness-stream-cut"]
    row = compare(verdicts(clean_dir), run_dir, int(calls >= at), finished)
    [cell] = (run_dir / "cells").iterdir()
    journal = read_journal(cell / "journal" / "journal.jsonl")
    broken = [e for e in journal if e.status == 200 and e.error]
    later = [e for e in journal if broken and e.slot == broken[0].slot and e.t_start > broken[0].t_start]
    clean_verdicts = dict((slot, (status, cost)) for v in verdicts(clean_dir).values() for slot, status, cost in v)
    changed = [f"slot {slot}: {clean_verdicts.get(slot)} -> {(status, cost)}"
               for v in verdicts(run_dir).values() for slot, status, cost in v if clean_verdicts.get(slot) != (status, cost)]
    row["note"] = ("; ".join(f"journaled: slot {e.slot}, {e.error[:60]}" for e in broken[:1])
                   + f"; {len(later)} later calls in that instance; " + ("; ".join(changed) or "no verdict changed"))
    return row


def harness_fault(root: Path, name: str, clean: dict) -> dict:
    """A hermes-agent cell faulted after the first model call of its second instance."""
    from sandboxes.docker_sandbox import SANDBOX_USER
    from sandboxes.images import docker_client
    run_dir = new_run(root, name, HARNESS_GRID)
    injected, lag = threading.Event(), [0.0]

    def inject() -> None:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and not injected.is_set():
            journal = next((run_dir / "cells").glob("*/journal/journal.jsonl"), None)
            if journal is not None and any(e.slot == 1 for e in read_journal(journal)):
                [record] = (run_dir / "cells").glob("*/sandbox.json")
                container = docker_client().containers.get(json.loads(record.read_text())["container"])
                if HARNESS_FAULTS[name] is None:
                    container.kill()
                else:
                    container.exec_run(["sh", "-c", HARNESS_FAULTS[name]], user=SANDBOX_USER, detach=True)
                injected.set()
                watch_host(lag, stop_after=60)
                return
            time.sleep(0.05)

    threading.Thread(target=inject, daemon=True).start()
    finished = finishes(run_dir)
    row = compare(clean, run_dir, int(injected.is_set()), finished)
    [cell] = (run_dir / "cells").iterdir()
    ends = [e for e in read_events(cell / "events.jsonl") if e.type == "instance_end" and e.slot == 1]
    row["note"] = ("fault verdict: " + ", ".join(f"{e.status} {e.cost} {e.failure_kind or ''} "
                                                 f"{(e.reason or '')[:60]}".strip() for e in ends)
                   + f"; host lag {lag[0]:.2f} s")
    return row


def watch_host(lag: list[float], stop_after: float, tick: float = 0.05) -> None:
    """The worst lateness of a `tick` timer on the host over `stop_after` seconds."""
    end = time.monotonic() + stop_after
    while time.monotonic() < end:
        before = time.monotonic()
        time.sleep(tick)
        lag[0] = max(lag[0], time.monotonic() - before - tick)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--scenario", action="append",
                        choices=["sigkill", "proxy", "container", "disk", *UPSTREAM, *HARNESS_FAULTS,
                                 "harness-stream-cut"])
    args = parser.parse_args()
    scenarios = args.scenario or ["sigkill", "proxy", "container", "disk", *UPSTREAM, *HARNESS_FAULTS,
                                  "harness-stream-cut"]
    ladder = [s for s in scenarios if s not in HARNESS_FAULTS and s != "harness-stream-cut"]
    harness = [s for s in scenarios if s in HARNESS_FAULTS]
    url, _ = serve()
    with tempfile.TemporaryDirectory(prefix="carc-faults-") as tmp:
        root = Path(tmp)
        clean = calls = harness_clean = None
        if ladder:
            started = time.monotonic()
            reference = new_run(root, "clean", GRID.format(url=url))
            SolverEndpoint.arm(None)
            execute(reference, show_progress=False)
            clean, calls = verdicts(reference), SolverEndpoint.calls
            console.print(f"clean run: {sum(map(len, clean.values()))} instances, {calls} model calls, "
                          f"{time.monotonic() - started:.0f} s")
        if harness:
            started = time.monotonic()
            reference = new_run(root, "harness-clean", HARNESS_GRID)
            execute(reference, show_progress=False)
            harness_clean = verdicts(reference)
            console.print(f"clean harness run: {sum(map(len, harness_clean.values()))} instances, "
                          f"{time.monotonic() - started:.0f} s, "
                          f"{compare(harness_clean, reference, 0, True)['journal errors']} journal errors "
                          "(its refused name lookups and the harness's own probes: the baseline)")
        rows = {}
        for name in scenarios:
            t0 = time.monotonic()
            if name in HARNESS_FAULTS:
                rows[name] = harness_fault(root, name, harness_clean)
            elif name == "harness-stream-cut":
                rows[name] = stream_cut(root)
            elif name == "sigkill":
                rows[name] = sigkill(root, url, clean, args.kills)
            elif name == "proxy":
                rows[name] = injected_at_call(root, "proxy", url, clean, calls, kill_proxy)
            elif name == "container":
                rows[name] = injected_at_call(root, "container", url, clean, calls, kill_container)
            elif name in UPSTREAM:
                rows[name] = injected_at_call(root, name, url, clean, calls, name.removeprefix("upstream-"))
            else:
                rows[name] = disk(root, url, clean)
            rows[name]["s"] = f"{time.monotonic() - t0:.0f}"
        table = Table(title="fault injection (against a clean run of the same grid)")
        columns = ["injected", "recovered", "lost", "double", "differ", "journaled faults", "journal errors",
                   "leaks", "s", "note"]
        table.add_column("scenario")
        for column in columns:
            table.add_column(column, justify="right" if column != "note" else "left")
        for name, row in rows.items():
            table.add_row(name, *(str(row.get(c, "")) for c in columns))
        console.print(table)


if __name__ == "__main__":
    main()
