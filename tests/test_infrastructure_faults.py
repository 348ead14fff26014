"""An infrastructure fault is never a score: when the cell's proxy or its program sandbox dies
under an instance, the instance is journaled as interrupted, the cell's services restart, and the
instance runs again — the records equal those of a run without the fault.

Real components: the host mitmdump proxy, the Docker program sandbox, the CellRunner; the model is
the embedded solver behind a loopback endpoint that, at one chosen call, kills the component
first (SIGKILL of mitmdump from its ready file; `docker kill` of the program container).
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.analysis.report import write_report
from orchestrator.records import read_events, standing
from orchestrator.run.local_pool import execute
from proxy.journal import read_journal
from tests.solver_endpoint import SolverEndpoint, serve

pytestmark = pytest.mark.slow

GRID = """\
name: faults
seed: 1
track: {{name: own, tasks: 3, visits: 2, epilogue: 0, fresh_reference: false}}
orders: [sequential]
efforts: [low]
learners: [{learner}]
workers: 1
sandbox: {{engine: {engine}}}
model: {{endpoint: '{url}', name: carc-solver, timeout_s: {timeout}}}
"""


@pytest.fixture
def endpoint():
    SolverEndpoint.arm(None)
    url, server = serve()
    yield url
    server.shutdown()


def run(tmp_path: Path, name: str, url: str, learner: str, engine: str, timeout: float = 600) -> Path:
    run_dir = tmp_path / "runs" / name
    (run_dir / "cells").mkdir(parents=True)
    (run_dir / "grid.yaml").write_text(GRID.format(learner=learner, engine=engine, url=url, timeout=timeout))
    execute(run_dir, show_progress=False)
    return run_dir


@pytest.fixture(scope="module")
def clean_floor(tmp_path_factory) -> tuple[Path, int]:
    """The stateless floor's run without a fault (host proxy, 5 s model timeout) and the calls it
    made: what every faulted floor run here must equal, run once for them all."""
    SolverEndpoint.arm(None)
    url, server = serve()
    try:
        run_dir = run(tmp_path_factory.mktemp("clean"), "clean", url, "stateless-floor", "process", timeout=5)
        return run_dir, SolverEndpoint.calls
    finally:
        server.shutdown()


def events(run_dir: Path) -> list:
    [cell] = (run_dir / "cells").iterdir()
    return read_events(cell / "events.jsonl")


def verdicts(run_dir: Path) -> list[tuple]:
    return [(e.slot, e.status, e.cost, e.failure_kind) for e in events(run_dir) if e.type == "instance_end"]


def kill_host_proxy(run_dir: Path):
    def kill() -> None:
        [ready] = (run_dir / "cells").glob("*/journal/proxy.ready")
        os.kill(json.loads(ready.read_text())["pid"], signal.SIGKILL)
    return kill


def kill_program_sandbox(run_dir: Path):
    def kill() -> None:
        from sandboxes.images import docker_client
        [record] = (run_dir / "cells").glob("*/sandbox.json")
        docker_client().containers.get(json.loads(record.read_text())["container"]).kill()
    return kill


@pytest.mark.parametrize("learner, engine, killer", [
    ("stateless-floor", "process", kill_host_proxy),
    pytest.param("program-library", "docker", kill_program_sandbox, marks=pytest.mark.docker),
])
def test_a_component_killed_mid_instance_charges_nothing_and_the_run_equals_an_uninterrupted_one(
        tmp_path, endpoint, learner, engine, killer, request):
    if learner == "stateless-floor":
        clean_dir, calls = request.getfixturevalue("clean_floor")
    else:
        clean_dir = run(tmp_path, "clean", endpoint, learner, engine)
        calls = SolverEndpoint.calls
    clean = verdicts(clean_dir)
    SolverEndpoint.arm(calls // 2, killer(tmp_path / "runs" / "faulted"))  # mid-run
    run_dir = run(tmp_path, "faulted", endpoint, learner, engine)
    faulted = events(run_dir)
    assert Counter(e.type for e in faulted)["infrastructure_fault"] == 1
    assert not [e for e in faulted if e.type == "learner_error"]
    assert verdicts(run_dir) == clean  # nothing charged for the fault, nothing lost or doubled
    report = write_report(run_dir).read_text()
    assert "## Infrastructure faults (not charged)" in report
    assert "model-unavailable" not in {v[3] for v in clean}


@pytest.mark.parametrize("fault", ["429-retry-after", "500", "reset", "truncated", "hang"])
def test_a_provider_failing_one_call_is_retried_journaled_and_changes_no_verdict(
        tmp_path, endpoint, clean_floor, fault):
    """Through the real host proxy: the failed attempt is a journal line of its own (an error
    status, or the error that ended it), the ladder client's retry gets the answer, and the run's
    verdicts equal a run without the fault (a hang outlasts the grid's 5 s model timeout)."""
    clean_dir, calls = clean_floor
    clean = verdicts(clean_dir)
    SolverEndpoint.arm(calls // 2, fault)
    run_dir = run(tmp_path, "faulted", endpoint, "stateless-floor", "process", timeout=5)
    assert verdicts(run_dir) == clean
    [journal] = (run_dir / "cells").glob("*/journal/journal.jsonl")
    failed = [e for e in read_journal(journal) if e.error or e.status is None or e.status >= 400]
    assert len(failed) == 1, [(e.status, e.error) for e in failed]
    assert len(read_journal(journal)) == len(read_journal(next((clean_dir / "cells").glob("*/journal")))) + 1


@pytest.mark.docker
def test_a_harness_sandbox_killed_mid_instance_is_an_uncharged_fault_and_the_cell_goes_on(tmp_path):
    """`docker kill` of a harness cell's sandbox container in the middle of an instance (hermes-agent
    on the embedded model, which streams and offers tools as a provider does): the instance is
    journaled as an infrastructure fault (nothing charged), the sandbox is started again from the
    last snapshot, the instance reruns, every slot ends exactly once, and nothing is left behind."""
    import threading
    import time

    from sandboxes.images import docker_client

    run_dir = tmp_path / "runs" / "harness-killed"
    (run_dir / "cells").mkdir(parents=True)
    (run_dir / "grid.yaml").write_text(GRID.format(learner="hermes-agent", engine="docker", url="embedded",
                                                   timeout=600).replace("visits: 2", "visits: 1"))
    killed = threading.Event()

    def kill_mid_second_instance() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            found = list((run_dir / "cells").glob("*/events.jsonl"))
            if found and any(e.type == "step" and e.slot == 1 for e in read_events(found[0])):
                [record] = (run_dir / "cells").glob("*/sandbox.json")
                docker_client().containers.get(json.loads(record.read_text())["container"]).kill()
                killed.set()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_mid_second_instance, daemon=True)
    watcher.start()
    execute(run_dir, show_progress=False)
    assert killed.is_set(), "the fault was never injected"
    faulted = events(run_dir)
    assert Counter(e.type for e in faulted)["infrastructure_fault"] == 1
    assert not [e for e in faulted if e.type == "learner_error"]
    assert sorted(e.slot for e in faulted if e.type == "instance_end") == [0, 1, 2]
    assert any(e.type == "step" and e.outcome in ("demo", "correct", "incorrect") for e in faulted)
    label = {"label": f"org.carc.run={run_dir.name}"}
    client = docker_client()
    assert not client.containers.list(all=True, filters=label) and not client.volumes.list(filters=label)


def test_a_harness_that_stops_itself_fails_at_the_wall_clock_and_the_next_instance_runs(tmp_path):
    """Every process of the harness SIGSTOPped mid-instance (as a tool call of its own could do):
    the instance fails at the wall clock with its reason (the harness's own fault, charged), the
    stopped processes are ended and the harness started again on the same volume, and the next
    instance runs to its verdict. Once, the cell waited on the stopped driver forever."""
    import threading
    import time

    from sandboxes.docker_sandbox import SANDBOX_USER
    from sandboxes.images import docker_client

    run_dir = tmp_path / "runs" / "harness-stopped"
    (run_dir / "cells").mkdir(parents=True)
    (run_dir / "grid.yaml").write_text(
        GRID.format(learner="hermes-agent", engine="docker", url="embedded", timeout=600)
        .replace("tasks: 3, visits: 2", "tasks: 2, visits: 1") + "limits: {wall_clock_s: 45}\n")
    stopped = threading.Event()

    def stop_everything_in_the_first_instance() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            journal = next((run_dir / "cells").glob("*/journal/journal.jsonl"), None)
            if journal is not None and any(e.slot == 0 for e in read_journal(journal)):
                [record] = (run_dir / "cells").glob("*/sandbox.json")
                docker_client().containers.get(json.loads(record.read_text())["container"]).exec_run(
                    ["sh", "-c", "kill -STOP -1"], user=SANDBOX_USER, detach=True)
                stopped.set()
                return
            time.sleep(0.05)

    threading.Thread(target=stop_everything_in_the_first_instance, daemon=True).start()
    execute(run_dir, show_progress=False)  # once: it never returned
    assert stopped.is_set(), "the fault was never injected"
    seen = events(run_dir)
    [first] = [e for e in seen if e.type == "instance_end" and e.slot == 0]
    assert (first.status, first.cost, first.failure_kind) == ("failed", 16, "wall-clock")
    [second] = [e for e in seen if e.type == "instance_end" and e.slot == 1]
    assert any(e.type == "step" and e.slot == 1 for e in seen) and second.reason != first.reason
    assert not [e for e in seen if e.type == "infrastructure_fault"]


class HangAt:
    """ASGI middleware over the embedded model: chat call number `at` never answers (until the
    server stops); `hung` is set when it arrives."""

    def __init__(self, app, at: int | None):
        import threading

        self.app, self.at, self.calls = app, at, 0
        self.hung, self.release = threading.Event(), threading.Event()

    async def __call__(self, scope, receive, send):
        import asyncio

        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            self.calls += 1
            if self.calls == self.at:
                self.hung.set()
                while not self.release.is_set():
                    await asyncio.sleep(0.1)
                return
        await self.app(scope, receive, send)


def run_hermes_on(tmp_path: Path, name: str, hang_at: int | None, on_hang=None) -> tuple[Path, int]:
    """A hermes-agent cell (limits.max_malformed: 2) on the embedded model served here, its chat
    call `hang_at` hung; `on_hang(run_dir)` runs in a thread once that call arrives. Returns the
    run folder and the chat calls the model got."""
    import threading
    import time

    import uvicorn

    from proxy.host import free_port
    from sandboxes.images import docker_client
    from sandboxes.networks import host_address
    from solver_model.server import create_app

    app = HangAt(create_app(effort_default="low", seed=0), hang_at)
    host = host_address(docker_client())  # where the cell's proxy container reaches the host
    port = free_port(host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="critical"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    run_dir = tmp_path / "runs" / name
    (run_dir / "cells").mkdir(parents=True)
    (run_dir / "grid.yaml").write_text(
        GRID.format(learner="hermes-agent", engine="docker", url=f"http://{host}:{port}/v1", timeout=600)
        .replace("tasks: 3, visits: 2", "tasks: 2, visits: 1") + "limits: {max_malformed: 2}\n")
    if on_hang is not None:
        threading.Thread(target=lambda: app.hung.wait(1800) and on_hang(run_dir), daemon=True).start()
    try:
        execute(run_dir, show_progress=False)
    finally:
        app.release.set()
        server.should_exit = True
    return run_dir, app.calls


@pytest.mark.docker
def test_a_harness_cells_proxy_killed_under_a_hung_call_is_an_uncharged_fault_and_changes_no_verdict(tmp_path):
    """Issue 34's repro: a hermes-agent cell with limits.max_malformed 2, an upstream that hangs
    on its 5th call, and `docker kill` of the cell's proxy container a second later. hermes
    answers "API call failed after 3 retries: Connection error." instead of failing its turn;
    those replies were malformed steps and the instance ended failed at 16 with no fault. Now the
    wait on hermes' turn asks every PROXY_CHECK_S whether the proxy runs and finds it dead (before
    hermes' own retries end, about 70 s later): an infrastructure_fault, nothing charged, the
    instance runs again on fresh services, and the run ends with the clean run's verdicts."""
    import time

    from sandboxes.docker_sandbox import LABEL_ROLE, LABEL_RUN
    from sandboxes.images import docker_client

    clean = verdicts(run_hermes_on(tmp_path, "clean", None)[0])
    killed: list[float] = []

    def kill_the_proxy(run_dir: Path) -> None:
        time.sleep(1.0)
        [proxy] = docker_client().containers.list(
            filters={"label": [f"{LABEL_RUN}={run_dir.name}", f"{LABEL_ROLE}=proxy"]})
        proxy.kill()
        killed.append(time.time())

    run_dir, upstream_calls = run_hermes_on(tmp_path, "proxy-killed", 5, kill_the_proxy)
    assert killed, "the proxy was never killed"
    # the call hung when the proxy died is journaled too (at the services' teardown): the journal
    # counts every call the upstream got
    [cell] = (run_dir / "cells").iterdir()
    journal = [e for e in read_journal(cell / "journal" / "journal.jsonl")
               if e.api == "openai-chat" and not e.refused]
    assert len(journal) == upstream_calls
    assert len([e for e in journal if "in flight" in (e.error or "")]) == 1
    faulted = events(run_dir)
    [fault] = [e for e in faulted if e.type == "infrastructure_fault"]
    assert "proxy container" in fault.error
    assert "ProxyDown" in fault.error  # found by the wait, not by hermes' reply after its retries
    print(f"\nthe fault was noticed {fault.t - killed[0]:.1f} s after the proxy was killed: {fault.error[:300]}")
    assert verdicts(run_dir) == clean  # nothing charged for the fault, nothing lost or doubled
    standing_events = standing(faulted)
    assert not [e for e in standing_events if e.type == "learner_error"]
    assert not [e for e in standing_events if e.type == "step" and e.outcome == "malformed"
                and "Connection error" in (e.reply or "")]
    label = {"label": f"org.carc.run={run_dir.name}"}
    client = docker_client()
    assert not client.containers.list(all=True, filters=label) and not client.volumes.list(filters=label)
