"""Fault injection: what carc's records look like after each kind of fault, against a clean run.

    python bench/faults.py [--kills 20] [--scenario sigkill --scenario proxy ...] [--keep DIR]

Every scenario runs a short grid on the embedded solver (served on loopback by this script, so a
fault can be injected at a chosen model call) once clean and once with the fault, then prints per
scenario: faults injected, recovered (the run finished with every instance recorded), records lost
(instances of the clean run missing), double charges (a slot ended twice), verdicts that differ
from the clean run, infrastructure faults recorded and (harness rows) charged, journal errors, and
carc containers, volumes and networks left for the run id (and state volume files that no volume
owns any more).

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
  harness-disk-full
             the same cell (whose grid gives the state volume a 64 MiB quota, `limits.state_mb`),
             after the same first call: the sandbox user writes zeros to a file in its state
             volume until the quota's ENOSPC stops it (the row is skipped, not run, when this
             machine cannot give volumes a quota: it would fill the host). The learner's own fault;
             what the fill command said and the volume's use after it are in the note.
  harness-stream-cut
             the hermes-agent cell on the embedded model served by this script, whose 22nd chat
             call (in slot 2, the third instance) streams two chunks and then breaks the connection
             mid-body, as a provider's stream does; compared with the same endpoint unbroken.
             What the harness makes of it is its own (hermes retries or fails the turn); the
             journal must hold the broken call.
  harness-proxy-killed
             the cell on the endpoint served by this script, whose 22nd chat call is held there
             (in flight through the proxy) while the cell's proxy container is `docker kill`ed a
             second later. Infrastructure: never charged, the instance reruns, and the verdicts
             must equal those of the same endpoint's clean run.
For the two infrastructure rows (harness-killed, harness-proxy-killed), "infra charged" counts the
instances that ended failed while the killed container was down (from the kill until the cell has
a container of that name running again): each one is an infrastructure fault charged to the learner.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from orchestrator.records import read_events  # noqa: E402
from orchestrator.run.local_pool import execute  # noqa: E402
from proxy.journal import read_journal  # noqa: E402
from tests.solver_endpoint import UPSTREAM_FAULTS, SolverEndpoint, serve  # noqa: E402

console = Console(width=200)

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
limits: {wall_clock_s: 120, state_mb: 64}
model: {endpoint: embedded, name: carc-solver}
"""
# A harness row's fault: what is done and when (the sandbox is the cell's hermes-agent sandbox).


@dataclass(frozen=True)
class HarnessFault:
    kill: str | None = None     # the cell's container `docker kill`ed from the host: "sandbox" or "proxy"
    command: str | None = None  # else run in the sandbox as its own user (uid 1000), as a tool call would
    wait: bool = False          # the command runs to its end and its output goes into the note
    mid_call: bool = False      # on this script's endpoint, while call STREAM_AT is held there
    # (else after the first journaled model call of the second instance, on the embedded model)


HARNESS_FAULTS = {
    "harness-killed": HarnessFault(kill="sandbox"),
    "harness-hangs": HarnessFault(command="kill -STOP -1"),
    "harness-exits": HarnessFault(command="kill -KILL -1"),
    "harness-fork-bomb": HarnessFault(command="bomb() { bomb | bomb & }; bomb"),
    "harness-memory-hog": HarnessFault(command="python3 -c 'x = bytearray(b\"\\1\") * (8 << 30)'"),
    "harness-disk-full": HarnessFault(command='cat /dev/zero > "$HOME/disk-fill"; df -m "$HOME" | tail -1',
                                      wait=True),
    "harness-proxy-killed": HarnessFault(kill="proxy", mid_call=True),
}
RUN_TAG = secrets.token_hex(3)  # this bench's runs
STREAM_AT = 22  # a chat call in mid-run of the hermes cell (in its slot 2 on this machine)


def new_run(root: Path, name: str, grid: str) -> Path:
    # The run id names and labels its Docker objects, and a run prunes its id's leftovers as it
    # starts: a second bench on the same engine must not share it.
    run_dir = root / f"{name}-{RUN_TAG}"
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


class Scripted:
    """ASGI middleware: chat call number `at` goes through `fault(app, scope, receive, send)`."""

    def __init__(self, app, at: int | None, fault):
        self.app, self.at, self.fault, self.calls = app, at, fault, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            return await self.app(scope, receive, send)
        self.calls += 1
        if self.calls != self.at:
            return await self.app(scope, receive, send)
        return await self.fault(self.app, scope, receive, send)


async def break_stream(app, scope, receive, send) -> None:
    """Two body messages, then the connection breaks, as a provider's stream does."""
    bodies = 0

    async def breaking(message):
        nonlocal bodies
        if message["type"] == "http.response.body":
            bodies += 1
            if bodies > 2:
                raise ConnectionResetError("scripted: the provider's stream breaks")
        await send(message)
    await app(scope, receive, breaking)


class HeldCall:
    """A chat call that waits, in flight through the proxy, until `released` (at most 60 s)."""

    def __init__(self):
        self.arrived, self.released = threading.Event(), threading.Event()

    async def __call__(self, app, scope, receive, send) -> None:
        self.arrived.set()
        for _ in range(1200):
            if self.released.is_set():
                break
            await asyncio.sleep(0.05)
        await app(scope, receive, send)


@contextmanager
def served(at: int | None = None, fault=None):
    """The embedded solver served by this script where containers reach the host, its chat call
    number `at` through `fault`; yields the harness grid on it and the counting middleware."""
    import uvicorn

    from proxy.host import free_port
    from sandboxes.images import docker_client
    from sandboxes.networks import host_address
    from solver_model.server import create_app
    app = Scripted(create_app(effort_default="low", seed=0), at, fault)
    host = host_address(docker_client())
    port = free_port(host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="critical"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield HARNESS_GRID.replace("endpoint: embedded", f"endpoint: 'http://{host}:{port}/v1'"), app
    finally:
        server.should_exit = True


@functools.cache
def served_clean(root: Path) -> dict:
    """The verdicts of the harness grid on this script's endpoint, unfaulted (run once per bench)."""
    with served() as (grid, _):
        run_dir = new_run(root, "harness-served-clean", grid)
        finishes(run_dir)
    return verdicts(run_dir)


def changed_verdicts(clean: dict, run_dir: Path) -> str:
    before = {slot: (status, cost) for v in clean.values() for slot, status, cost in v}
    return "; ".join(f"slot {slot}: {before.get(slot)} -> {(status, cost)}"
                     for v in verdicts(run_dir).values() for slot, status, cost in v
                     if before.get(slot) != (status, cost)) or "no verdict changed"


def stream_cut(root: Path) -> dict:
    clean = served_clean(root)
    with served(STREAM_AT, break_stream) as (grid, app):
        run_dir = new_run(root, "harness-stream-cut", grid)
        finished = finishes(run_dir)
    row = compare(clean, run_dir, int(app.calls >= STREAM_AT), finished)
    [cell] = (run_dir / "cells").iterdir()
    journal = read_journal(cell / "journal" / "journal.jsonl")
    broken = [e for e in journal if e.status == 200 and e.error]
    later = [e for e in journal if broken and e.slot == broken[0].slot and e.t_start > broken[0].t_start]
    row["note"] = ("; ".join(f"journaled: slot {e.slot}, {e.error[:60]}" for e in broken[:1])
                   + f"; {len(later)} later calls in that instance; " + changed_verdicts(clean, run_dir))
    return row


class Injector(threading.Thread):
    """Waits until `due()` and `delay` seconds more, then injects `fault` into the cell of
    `run_dir` once, and calls `after()`: it records when, what a waited-for command said, the
    host's worst timer lag for a minute after, and, for a killed container, when the cell has a
    container of that name running again."""

    def __init__(self, run_dir: Path, fault: HarnessFault, due, delay: float = 0.0, after=lambda: None):
        super().__init__(daemon=True)
        self.run_dir, self.fault, self.due, self.delay, self.after = run_dir, fault, due, delay, after
        self.injected_at: float | None = None
        self.restored_at: float | None = None
        self.output, self.lag, self.done = "", [0.0], threading.Event()

    def run(self) -> None:
        from sandboxes.images import docker_client
        deadline = time.monotonic() + 1800
        while not self.due():
            if time.monotonic() > deadline or self.done.is_set():
                return
            time.sleep(0.05)
        time.sleep(self.delay)
        client = docker_client()
        try:
            container = self.container(client)
            if self.fault.kill:
                container.kill()
            else:
                self.output = self.exec_fault(container)
            self.injected_at = time.time()
        finally:
            self.after()
        if self.fault.kill:
            threading.Thread(target=self.watch_restart, args=(client, container), daemon=True).start()
        watch_host(self.lag, stop_after=60)

    def container(self, client):
        if self.fault.kill == "proxy":
            from sandboxes.docker_sandbox import LABEL_ROLE, LABEL_RUN
            [proxy] = client.containers.list(filters={"label": [f"{LABEL_RUN}={self.run_dir.name}",
                                                                 f"{LABEL_ROLE}=proxy"]})
            return proxy
        [record] = (self.run_dir / "cells").glob("*/sandbox.json")
        return client.containers.get(json.loads(record.read_text())["container"])

    def exec_fault(self, container) -> str:
        from sandboxes.docker_sandbox import SANDBOX_USER
        if not self.fault.wait:
            container.exec_run(["sh", "-c", self.fault.command], user=SANDBOX_USER, detach=True)
            return ""
        return container.exec_run(["sh", "-c", self.fault.command], user=SANDBOX_USER).output.decode(
            "utf-8", "replace").strip()

    def watch_restart(self, client, killed) -> None:
        import docker.errors
        while not self.done.is_set():
            try:
                now = client.containers.get(killed.name)
                if now.id != killed.id and now.status == "running":
                    self.restored_at = time.time()
                    return
            except docker.errors.NotFound:
                pass
            time.sleep(0.2)

    def charged_while_down(self) -> list:
        """The instances that ended failed while the killed container was down."""
        until = self.restored_at or float("inf")
        [cell] = (self.run_dir / "cells").iterdir()
        return [e for e in read_events(cell / "events.jsonl") if e.type == "instance_end"
                and e.status != "solved" and self.injected_at <= e.t <= until]


def harness_fault(root: Path, name: str, clean: dict) -> dict:
    """A hermes-agent cell faulted in its second instance (see HarnessFault)."""
    from sandboxes.state_volumes import quota_unavailable
    fault = HARNESS_FAULTS[name]
    if name == "harness-disk-full" and quota_unavailable():  # the fill would fill this machine's disk
        return {"injected": 0, "note": f"not run: state volumes have no quota here ({quota_unavailable()})"}
    held = HeldCall() if fault.mid_call else None
    with served(STREAM_AT, held) if held else nullcontext((HARNESS_GRID, None)) as (grid, _):
        run_dir = new_run(root, name, grid)
        if held:  # a second into the held call, as a proxy dies under a slow reply
            injector = Injector(run_dir, fault, held.arrived.is_set, delay=1.0, after=held.released.set)
        else:
            injector = Injector(run_dir, fault, lambda: slot_called(run_dir, 1))
        injector.start()
        finished = finishes(run_dir)
        injector.done.set()
    row = compare(clean, run_dir, int(injector.injected_at is not None), finished)
    [cell] = (run_dir / "cells").iterdir()
    events = read_events(cell / "events.jsonl")
    at = injector.injected_at or float("inf")
    slot = ([None] + [e.slot for e in events if e.type == "instance_start" and e.t <= at])[-1]
    ends = [e for e in events if e.type == "instance_end" and e.slot == slot]
    notes = [f"fault in slot {slot}, its verdicts: " + ", ".join(
        f"{e.status} {e.cost} {e.failure_kind or ''} {(e.reason or '')[:60]}".strip() for e in ends)]
    if fault.kill:
        down = injector.charged_while_down()
        row["infra charged"] = len(down)
        malformed = [e for e in events if e.outcome == "malformed" and e.t >= at
                     and e.t <= (injector.restored_at or float("inf"))]
        restored = (f"{injector.restored_at - at:.0f} s" if injector.restored_at else "never")
        notes.append(f"{fault.kill} back after {restored}; malformed steps while down: {len(malformed)}")
        notes.append(changed_verdicts(clean, run_dir))
    if injector.output:
        notes.append("said: " + " | ".join(injector.output.splitlines())[-160:])
    notes.append(f"host lag {injector.lag[0]:.2f} s")
    row["note"] = "; ".join(notes)
    return row


def slot_called(run_dir: Path, slot: int) -> bool:
    """The cell's proxy journal has a model call of `slot`."""
    journal = next((run_dir / "cells").glob("*/journal/journal.jsonl"), None)
    return journal is not None and any(e.slot == slot for e in read_journal(journal))


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
    parser.add_argument("--keep", type=Path, help="run the grids in this folder and keep them "
                        "(default: a temporary one)")
    parser.add_argument("--scenario", action="append",
                        choices=["sigkill", "proxy", "container", "disk", *UPSTREAM, *HARNESS_FAULTS,
                                 "harness-stream-cut"])
    args = parser.parse_args()
    scenarios = args.scenario or ["sigkill", "proxy", "container", "disk", *UPSTREAM, *HARNESS_FAULTS,
                                  "harness-stream-cut"]
    ladder = [s for s in scenarios if s not in HARNESS_FAULTS and s != "harness-stream-cut"]
    harness_all = [s for s in scenarios if s in HARNESS_FAULTS]
    harness = [s for s in harness_all if not HARNESS_FAULTS[s].mid_call]  # on the embedded model
    url, _ = serve()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory(prefix="carc-faults-") as tmp:
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
        if "harness-stream-cut" in scenarios or any(HARNESS_FAULTS[s].mid_call for s in harness_all):
            started = time.monotonic()
            instances = sum(map(len, served_clean(root).values()))
            console.print(f"clean harness run on this script's endpoint: {instances} instances, "
                          f"{time.monotonic() - started:.0f} s")
        rows = {}
        for name in scenarios:
            t0 = time.monotonic()
            if name in HARNESS_FAULTS:
                rows[name] = harness_fault(root, name, served_clean(root) if HARNESS_FAULTS[name].mid_call
                                           else harness_clean)
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
        columns = ["injected", "recovered", "lost", "double", "differ", "journaled faults", "infra charged",
                   "journal errors", "leaks", "s", "note"]
        table.add_column("scenario")
        for column in columns:
            table.add_column(column, justify="right" if column != "note" else "left")
        for name, row in rows.items():
            table.add_row(name, *(str(row.get(c, "")) for c in columns))
        console.print(table)


if __name__ == "__main__":
    main()
