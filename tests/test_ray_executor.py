"""The Ray executor on a real three-node Ray cluster on this machine (loopback only): a node lost
mid-instance is Ray's to retry, the retried cell resumes exactly from the run folder, and the run
ends as a local-pool run of the same grid ends.

The cluster is Ray's own `ray.cluster_utils.Cluster`: a head with no `docker` resource (no cell
runs there) and two worker nodes with one `docker` slot each, so each cell has a node of its own.
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` is Ray's switch that keeps every node on 127.0.0.1.
The grid: a ladder cell whose program checks run in a Docker container (program-library) and
the stateless floor, on the embedded model (a harness cell's lost node has its own test below;
harness users on Ray end as on the local executor in test_collective_harness.py). The node
running the program library is
frozen after the first step of its third instance (the attempt stops itself at that named point:
orchestrator/fault_points.py) and removed from the cluster (its raylet killed); its worker, if Ray has not ended it with the node, is let go only after Ray retried the
cell elsewhere (a partitioned node coming back: the fence refuses its every further record;
tests/test_cell_fence.py proves that part on its own).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator import fault_points
from orchestrator.records import CellFence, CellPaths, read_events
from orchestrator.run.local_pool import execute
from orchestrator.run.status import run_status
from tests.test_runner import _run_labelled, assert_records_consistent

ray = pytest.importorskip("ray", reason="the Ray executor's test needs the ray extra")

pytestmark = [pytest.mark.slow, pytest.mark.docker]

GRID = """\
name: ray-it
seed: 4
track: {name: own, tasks: 2, visits: 2, epilogue: 0, fresh_reference: false}
orders: [sequential]
model: {endpoint: embedded, name: carc-solver}
efforts: [low]
learners: [program-library, stateless-floor]
workers: 2
"""
KILLED = "program-library.low.sequential.s4"
SLOTS = 4
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def make_run(root: Path, name: str, grid: str = GRID) -> Path:
    run = root / "runs" / name
    (run / "cells").mkdir(parents=True)
    (run / "grid.yaml").write_text(textwrap.dedent(grid))
    return run


def instances(run: Path) -> dict[str, list[tuple]]:
    """Per cell, every instance's verdict and charges as its instance_end recorded them."""
    out = {}
    for cell in sorted((run / "cells").iterdir()):
        out[cell.name] = [(e.slot, e.task, e.visit, e.status, e.cost, e.demos_used, e.attempts_used,
                           e.first_answer_correct, e.failure_kind)
                          for e in read_events(cell / "events.jsonl") if e.type == "instance_end"]
    return out


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    for key, value in LOOPBACK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CARC_RAY_WORKDIR", str(tmp_path / "work"))  # --durability head's working copies
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 80 << 20, "include_dashboard": False}
    made = Cluster(initialize_head=True, connect=False,
                   head_node_args={"num_cpus": 1, "resources": {"docker": 0}, **small})
    try:
        workers = [made.add_node(num_cpus=2, memory=4 << 30, resources={"docker": 1}, **small)
                   for _ in range(2)]
        yield made, workers
    finally:
        made.shutdown()


def holder(cell: CellPaths) -> tuple[str, int]:
    """The node id and pid of the cell's current attempt."""
    attempt = CellFence.read(cell.root)["attempts"][-1]["holder"]
    found = re.match(r"node (\w+) .*pid (\d+)", attempt)
    assert found, attempt
    return found.group(1), int(found.group(2))


def stopped(pid: int, within_s: float = 5.0) -> bool:
    """Whether every thread of `pid` is stopped (state T) within `within_s`. SIGSTOP takes effect
    when each thread next leaves the kernel, not when kill(2) returns: a CI run once saw a user's
    task end its instance, its round and return after the signal was sent and the records read."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except FileNotFoundError:
            return False  # it ended
        states = []
        for task in tasks:
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass  # a thread that ended meanwhile
        if states and all(state in ("T", "t") for state in states):
            return True
        time.sleep(0.005)
    return False


def run_losing_a_node(cluster, run: Path, durability: str, lost: str = KILLED,
                      seen_running: list | None = None, slot: int = 2) -> CellPaths:
    """Run `run` on the cluster, losing the node of the cell `lost` (or of the collective user
    `lost`: `<row>/users/uNNNN`) inside its instance of `slot`, after one step (the instances
    before it ended). With `seen_running`, `carc status` is read while the node is frozen and
    appended.

    The attempt freezes itself at that named point (CARC_TEST_FAULT, orchestrator/fault_points.py):
    right after the step's record, outside its fence lock (a process stopped inside a record's
    write would hold the lock, and the retried attempt would wait on it for good: an artefact of
    freezing a process on the same machine; a lost NFS client's lock ends with its lease). Its
    mark file names the frozen process once; the retried attempt passes the same point."""
    head, workers = cluster
    log = run.parent / f"{run.name}.driver.log"
    mark = run.parent / f"{run.name}.fault-mark"
    fault = {fault_points.FAULT_ENV: f"freeze after 1 step of slot {slot} in {lost}/",
             fault_points.MARK_ENV: str(mark)}
    with open(log, "wb") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume", str(run), "--executor",
             "ray", "--address", head.address, "--durability", durability, "--no-report"],
            env={**os.environ, **LOOPBACK, **fault}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def driver_ran(why: str) -> str:
        return f"{why}; the driver's output (last 3000 characters):\n{log.read_text(errors='replace')[-3000:]}"

    killed = CellPaths(run / "cells" / lost)
    stale_pid = None
    try:
        deadline = time.monotonic() + 600
        while not mark.exists() or not mark.read_text().endswith("\n"):
            assert driver.poll() is None, driver_ran("the driver ended before the attempt reached its fault point")
            assert time.monotonic() < deadline, driver_ran("the attempt never reached its fault point")
            time.sleep(0.05)
        stale_pid = int(mark.read_text().split()[0])
        assert stopped(stale_pid, within_s=30), f"pid {stale_pid} did not stop itself at its fault point"
        node_id, pid = holder(killed)
        assert pid == stale_pid, (pid, stale_pid)  # the cell's current attempt is the frozen one
        last = read_events(killed.events)[-1]
        assert (last.type, last.slot, last.step) == ("step", slot, 1), last
        if seen_running is not None:
            seen_running.append({c.cell: c.state for c in run_status(run).cells})
        frozen = CellFence.read(killed.root)["token"]
        node = next(n for n in workers if n.node_id == node_id)
        head.remove_node(node, allow_graceful=False)
        # Ray notices the lost node and retries the cell on the other one (once its slot is free);
        # once (a collective user's round, in a fresh clone's CI run) Ray took 418 s for it
        deadline = time.monotonic() + 900
        while CellFence.read(killed.root)["token"] <= frozen:
            assert driver.poll() is None, driver_ran("the driver ended before Ray retried the cell")
            assert time.monotonic() < deadline, driver_ran("Ray never retried the cell of the lost node")
            time.sleep(0.2)
        try:  # the partitioned node is back: its attempt is stale (unless Ray ended it with its node)
            os.kill(stale_pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        driver.wait(timeout=600)
        assert driver.returncode == 0, driver_ran(f"the driver exited {driver.returncode}")
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        if stale_pid is not None:
            try:
                os.kill(stale_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if driver.returncode:  # what a failed run left; a passing one is checked below, not pruned
            from sandboxes.docker_sandbox import prune
            prune(run=run.name)
    return killed


def assert_resumed_elsewhere_once(run: Path, killed: CellPaths, slots: int = SLOTS) -> None:
    attempts = CellFence.read(killed.root)["attempts"]
    assert len(attempts) >= 2 and holder(killed)[0] != attempts[0]["holder"].split()[1]
    assert any(e.type == "resumed" for e in read_events(killed.events)), "the kill was not mid-instance"
    # every slot ended exactly once, step numbers without a gap or a repeat, nothing charged twice
    assert_records_consistent(run, slots)
    assert _run_labelled(run.name) == []


def assert_ended_as_a_local_run(run: Path, reference: Path, killed: CellPaths) -> None:
    assert_resumed_elsewhere_once(run, killed)
    assert instances(run) == instances(reference)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """GRID run by the local pool: how a run that lost a node must end."""
    run = make_run(tmp_path_factory.mktemp("reference"), "ray-executor-local")
    execute(run, show_progress=False)
    return run


def test_a_node_lost_mid_instance_is_retried_and_the_run_ends_as_a_local_run(tmp_path, cluster, reference):
    run = make_run(tmp_path, "ray-executor-ray")
    killed = run_losing_a_node(cluster, run, "shared")
    assert_ended_as_a_local_run(run, reference, killed)


def test_with_records_sent_to_the_head_a_lost_node_resumes_from_the_heads_copy(tmp_path, cluster, reference):
    """--durability head: each attempt works in a copy of its own (CARC_RAY_WORKDIR) laid down
    from the head's; every record, and every file that changed before it, reaches the head's
    folder through the head's actor as it is written; the retried cell resumes from the head's
    copy alone."""
    run = make_run(tmp_path, "ray-executor-head")
    seen: list[dict] = []
    killed = run_losing_a_node(cluster, run, "head", seen_running=seen)
    assert_ended_as_a_local_run(run, reference, killed)
    # `carc status` on the head saw the cell running (the head's actor holds its lock for the
    # attempt), and sees every cell done once the run has ended
    assert seen and seen[-1][KILLED] == "running", seen
    assert {c.state for c in run_status(run).cells} == {"done"}
    # the head's copy is whole: a snapshot and a transcript per slot, and the journal of the cell
    # that was not lost has every model call (the lost node's last journal lines may die with it)
    for cell in run.glob("cells/*"):
        assert len(list((cell / "snapshots").glob("*.tar.gz"))) == SLOTS, cell.name
        assert sorted(CellPaths(cell).read_transcripts()) == list(range(SLOTS)), cell.name
        if cell.name != KILLED:
            calls = sum(e.model_calls or 0 for e in read_events(cell / "events.jsonl") if e.type == "step")
            journal = (cell / "journal" / "journal.jsonl").read_text().splitlines()
            assert len(journal) == calls > 0, cell.name
    # the finished attempts' working copies are gone (the lost node's may stay where it died)
    left = sorted(p.name for p in (tmp_path / "work").iterdir())
    assert set(left) <= {f"{KILLED}.1"}, left


JOIN_MARK = "CARC_TEST_JOIN_MARK"  # in the environment of what `carc node join` started
JOIN_GRID = """\
name: ray-join-it
seed: 1
track: {name: own, tasks: 1, visits: 1, epilogue: 0, fresh_reference: false}
orders: [sequential]
model: {endpoint: embedded, name: carc-solver}
efforts: [low]
learners: [stateless-floor]
workers: 1
"""


def test_a_joined_node_hosts_cells_and_a_node_that_comes_back_loses_what_its_lost_attempts_left(
        tmp_path, monkeypatch):
    """`carc node join HEAD` for real: Ray's `ray start` joins this machine as a node with its
    `docker` slots (the head has none, so the grid's cell can only run there); before, the engine
    holds objects an attempt of a node no longer in the cluster left (a node lost mid-run that
    comes back) and objects of a live node's attempt: the join removes the first and keeps the
    second."""
    import uuid

    import docker
    import psutil
    from ray.cluster_utils import Cluster

    from sandboxes.docker_sandbox import LABEL_NODE, LABEL_RUN

    for key, value in LOOPBACK.items():
        monkeypatch.setenv(key, value)
    client = docker.from_env()
    before = {proc.pid for proc in psutil.process_iter()}
    made = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 1, "resources": {"docker": 0}, "object_store_memory": 80 << 20, "include_dashboard": False})
    head_id = made.head_node.node_id
    tag = uuid.uuid4().hex[:8]
    lost = client.volumes.create(f"carc-join-it-lost-{tag}", labels={LABEL_RUN: "join-it", LABEL_NODE: "f" * 56})
    live = client.volumes.create(f"carc-join-it-live-{tag}", labels={LABEL_RUN: "join-it", LABEL_NODE: head_id})
    ours = set()
    try:
        ours = {proc.pid for proc in psutil.process_iter()} - before
        joined = subprocess.run([sys.executable, "-m", "orchestrator.cli", "node", "join", made.address,
                                 "--cells", "1", "--node-ip", "127.0.0.1"], capture_output=True, text=True,
                                # `ray start` joins a node only where multi-node clusters are on
                                timeout=600, env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
                                                  "COLUMNS": "200", JOIN_MARK: tag})
        assert joined.returncode == 0, joined.stdout + joined.stderr
        assert re.search(r"removed \d+ Docker objects", joined.stdout) and lost.name in joined.stdout, joined.stdout
        names = {v.name for v in client.volumes.list(filters={"label": "org.carc.run=join-it"})}
        assert lost.name not in names and live.name in names, names
        run = make_run(tmp_path, "ray-join-it", JOIN_GRID)
        ran = subprocess.run([sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume", str(run),
                              "--executor", "ray", "--address", made.address, "--no-report"],
                             capture_output=True, text=True, timeout=600, env={**os.environ, **LOOPBACK})
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
        cell = CellPaths(run / "cells" / "stateless-floor.low.sequential.s1")
        node_id, _ = holder(cell)
        assert node_id != head_id  # the joined node, the only one with a `docker` slot
        assert [e.slot for e in read_events(cell.events) if e.type == "instance_end"] == [0]
    finally:
        started = {proc.pid for proc in psutil.process_iter()} - before - ours
        made.shutdown()
        for pid in started:  # the joined node's processes (Ray's `ray stop` would stop every node
            try:             # here), known by the mark they inherit (not another test's processes)
                proc = psutil.Process(pid)
                if proc.environ().get(JOIN_MARK) == tag:
                    proc.kill()
            except psutil.Error:
                pass
        for volume in (lost, live):
            try:
                volume.remove(force=True)
            except docker.errors.NotFound:
                pass


def test_node_join_checks_the_machine_and_joins_with_its_docker_slots():
    """`carc node join --dry-run`: doctor's checks on this machine, then Ray's own `ray start`
    with the node's cell slots, nothing started (the test above joins for real)."""
    result = subprocess.run([sys.executable, "-m", "orchestrator.cli", "node", "join", "10.9.8.7:6379",
                             "--cells", "3", "--dry-run"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stdout + result.stderr
    for check in ("docker engine", "host address", "image base", "image proxy"):
        assert re.search(rf"{check}\s+│ ok", result.stdout), (check, result.stdout)
    assert 'ray.scripts.scripts start --address 10.9.8.7:6379 --resources {"docker": 3}' in result.stdout


def test_a_node_hosts_one_cell_per_core_at_most_one_per_2_gib():
    from orchestrator.run.ray_executor import cell_options, default_slots, memory_bytes
    from orchestrator.run.grid_config import GridConfig
    assert default_slots(cpus=8, memory=64 << 30) == 8
    assert default_slots(cpus=8, memory=6 << 30) == 3
    assert default_slots(cpus=2, memory=1 << 30) == 1
    assert memory_bytes("2g") == 2 << 30 and memory_bytes("512m") == 512 << 20 and memory_bytes("1000") == 1000
    with pytest.raises(ValueError, match="sandbox.memory"):
        memory_bytes("two gigs")
    grid = GridConfig.model_validate({"name": "g", "learners": ["stateless-floor"],
                                   "sandbox": {"cpus": 1.5, "memory": "3g"}})
    assert cell_options(grid)["resources"] == {"docker": 1}
    assert cell_options(grid)["num_cpus"] == 1.5 and cell_options(grid)["memory"] == 3 << 30
    # a cell waiting on its model reserves what its kind was measured to hold, within the limits
    from orchestrator.run.plan import load_scale_priors
    timed = GridConfig.model_validate({"name": "g", "learners": ["stateless-floor", "hermes-agent"],
                                       "model": {"endpoint": "embedded", "name": "m", "timing": "hosted"},
                                       "sandbox": {"cpus": 1.5, "memory": "3g"}})
    floor, hermes = timed.cells()
    ladder_cost = load_scale_priors().cost("stateless-floor")[1]
    assert cell_options(timed, floor)["num_cpus"] == pytest.approx(ladder_cost.cpu_cores, abs=1e-3)
    assert cell_options(timed, floor)["num_cpus"] < 0.5
    assert cell_options(timed, floor)["memory"] == int(ladder_cost.rss_mb * 2**20) < 3 << 30
    assert cell_options(timed, hermes)["num_cpus"] > cell_options(timed, floor)["num_cpus"]
    tight = timed.model_copy(update={"sandbox": timed.sandbox.model_copy(update={"cpus": 0.05, "memory": "100m"})})
    assert cell_options(tight, hermes)["num_cpus"] == 0.05 and cell_options(tight, hermes)["memory"] == 100 << 20
    assert cell_options(grid, grid.cells()[0]) == cell_options(grid)  # untimed embedded: the limits


HARNESS = "hermes-agent.low.sequential.s4"
HARNESS_GRID = GRID.replace("learners: [program-library, stateless-floor]", "learners: [hermes-agent]").replace(
    "tasks: 2, visits: 2", "tasks: 2, visits: 1")  # 2 slots: lost inside the second


def test_a_harness_cell_whose_node_is_lost_mid_instance_resumes_once_in_a_new_sandbox(tmp_path, cluster):
    """The harness cell's node is lost mid-instance: the retried attempt removes the lost
    attempt's sandbox, proxy, network and volume by name, starts the harness afresh from the last
    snapshot, and the interrupted instance goes on from its records (the demos and attempts it
    bought stay bought); every slot ends once, nothing is charged twice, nothing is left. Its
    replies cannot equal an uninterrupted run's (the resumed instance is a new conversation), so
    unlike the ladder cell's its verdicts are not compared with a local run."""
    run = make_run(tmp_path, "ray-executor-harness", HARNESS_GRID)
    killed = run_losing_a_node(cluster, run, "shared", lost=HARNESS, slot=1)
    assert_resumed_elsewhere_once(run, killed, slots=2)
    resumed = next(e for e in read_events(killed.events) if e.type == "resumed")
    ended = {e.slot: e for e in read_events(killed.events) if e.type == "instance_end"}
    # the lost node is not the learner's doing: the resumed instance is not charged as a crash
    assert ended[resumed.slot].failure_kind not in ("crash", "learner-error", "other"), ended[resumed.slot]
    assert not [e for e in read_events(killed.events) if e.type == "learner_error"]


ARC3_GRID = """\
name: ray-arc3-it
seed: 1
track: {{name: arc3, environments_dir: {games}, visits: 2}}
orders: [sequential]
efforts: [low]
learners: [arc3-explorer, arc3-library]
workers: 2
"""


def test_an_arc3_grid_runs_on_ray_through_the_executor_of_every_grid_and_ends_as_the_local_run(
        tmp_path, cluster):
    """The ARC-AGI-3 track's cells are Ray tasks like any cell (orchestrator/run/executors.py):
    each attempt takes its fence on a worker node, plays its levels through an engine container
    of its own there, and the run ends as the local pool's run of the same grid."""
    from tests.test_arc3_engine import games_dir

    head, workers = cluster
    grid = ARC3_GRID.format(games=games_dir("toolkit_test_environment_files"))
    reference = make_run(tmp_path, "arc3-local", grid)
    execute(reference, show_progress=False)
    run = make_run(tmp_path, "arc3-ray", grid)
    ran = subprocess.run([sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume", str(run),
                          "--executor", "ray", "--address", head.address, "--no-report"],
                         capture_output=True, text=True, timeout=900, env={**os.environ, **LOOPBACK})
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    worker_ids = {n.node_id for n in workers}
    for cell in ("arc3-explorer.low.sequential.s1", "arc3-library.low.sequential.s1"):
        attempts = CellFence.read(run / "cells" / cell)["attempts"]
        assert len(attempts) == 1 and attempts[0]["holder"].split()[1] in worker_ids, attempts
    assert instances(run) == instances(reference)
    assert sum(len(ends) for ends in instances(run).values()) == 2 * 2 * 2  # 2 cells x 2 games x 2 visits
    assert _run_labelled(run.name) == []
