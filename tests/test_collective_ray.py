"""A collective grid on a real three-node Ray cluster on this machine (loopback only): each user's
round is a Ray task; a node lost while a user is inside an instance is Ray's to retry, the retry
resumes the user exactly from its records, and the run ends as the local executor's run of the
same grid ends: the same verdicts and charges for every (row, user, slot), the same shared state
after every update step.

The cluster is tests/test_ray_executor.py's (a head with no `docker` slot, two worker nodes with
one each), and so is the way a node is lost: the user's attempt freezes itself after the first step of
its third instance (a named fault point), and its node is removed from the cluster. The grid: the program library's collective row (program checks in Docker containers on
the nodes) and the stateless floor on a model trained between rounds (each round's task serves
the embedded model with that round's prior on its node).
"""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import pytest

from orchestrator import fault_points
from orchestrator.records import CellFence, RunPaths, read_events
from orchestrator.run.collective.rounds import execute_collective
from proxy.journal import read_journal
from tests.test_collective import outcomes, shared_digests
from tests.test_ray_executor import cluster, run_losing_a_node  # noqa: F401 - the fixture
from tests.test_runner import _run_labelled

ray = pytest.importorskip("ray", reason="the Ray executor's test needs the ray extra")

pytestmark = [pytest.mark.slow, pytest.mark.docker]

GRID = """\
name: ray-collective-it
seed: 4
track: {name: own, tasks: 2, visits: 2, epilogue: 0, fresh_reference: false}
collective: {users: 2, round_slots: 2}
orders: [sequential]
model: {endpoint: embedded, name: carc-solver}
efforts: [low]
learners:
  - {learner: program-library, row: collective}
  - {learner: stateless-floor, row: trained}
workers: 2
"""
USERS, SLOTS, ROUNDS = 2, 4, 2
RUN_MARK = "CARC_TEST_RUN_MARK"  # in the environment of what one test's run started
LOST = "program-library-collective.low.sequential.s4/users/u0001"


def make_run(root: Path, name: str) -> Path:
    run = root / "runs" / name
    (run / "cells").mkdir(parents=True)
    (run / "grid.yaml").write_text(textwrap.dedent(GRID))
    return run


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The grid run uninterrupted on the local executor: what every Ray run here must end as."""
    run = make_run(tmp_path_factory.mktemp("collective-ray"), "collective-local")
    execute_collective(run, show_progress=False)
    return run


def test_a_user_whose_node_is_lost_mid_round_resumes_once_and_the_run_ends_as_the_local_run(
        tmp_path, cluster, reference):
    run = make_run(tmp_path, "collective-ray")
    # inside the first instance of round 1, with one more to go in the task
    lost = run_losing_a_node(cluster, run, "shared", lost=LOST, slot=2)

    # the lost user's round was taken over on the other node, and the instance it was inside resumed
    attempts = CellFence.read(lost.root)["attempts"]
    assert len(attempts) > ROUNDS, attempts  # one attempt per round, and the retry
    assert any(e.type == "resumed" for e in read_events(lost.events)), "the node was not lost mid-instance"

    # every slot of every user ended once, as it ended on the local executor; every update wrote
    # what the local executor's wrote
    ends = outcomes(run)
    assert len(ends) == 2 * USERS * SLOTS
    assert ends == outcomes(reference)
    assert shared_digests(run) == shared_digests(reference)
    for cell in RunPaths(run).cell_folders():
        for user in cell.user_folders():
            events = read_events(user.events)
            assert Counter(e.slot for e in events if e.type == "instance_end") == Counter(range(SLOTS))
            # each user's calls are in its own journal (its task's proxy), tagged with the user
            journal = read_journal(user.journal / "journal.jsonl")
            calls = sum(e.model_calls or 0 for e in events if e.type == "step")
            assert {e.user for e in journal} == {user.number}, user.root
            if user.root != lost.root:  # the lost node's last lines may have died with it
                assert len(journal) == calls > 0, user.root
            else:
                assert len(journal) >= calls > 0, user.root
        # one task per user and round: each took the user's fence once (the lost one twice)
        tokens = {u.number: CellFence.read(u.root)["token"] for u in cell.user_folders()}
        assert all(t >= ROUNDS for t in tokens.values()), tokens
    assert _run_labelled(run.name) == []  # no container, network or volume of the run is left


def test_records_through_the_heads_actor_are_refused_for_a_collective_grid(tmp_path):
    from orchestrator.run.collective.on_ray import execute_collective_ray

    with pytest.raises(ValueError, match="--durability head: a collective grid on Ray"):
        execute_collective_ray(make_run(tmp_path, "head"), durability="head", show_progress=False)


def test_a_users_attempt_that_a_newer_attempt_replaced_writes_no_record(tmp_path):
    """The fence a user's task takes is the one its records go through: once a newer attempt
    took the user (Ray's retry after a lost node), the older one, were it still running behind a
    partition, has its first record refused and ends its round there. (In the cluster test Ray
    ends a lost node's worker with its node, so this is proven here, on the runner itself.)"""
    import threading

    from orchestrator.records import StaleAttempt
    from orchestrator.run.collective.rounds import Checkers, UserRunner, row_services
    from orchestrator.run.collective.schedule import user_schedule
    from orchestrator.run.grid_config import load_grid
    from orchestrator.run.model_service import model_service

    run = make_run(tmp_path, "fenced")
    grid = load_grid(run / "grid.yaml")
    cell = next(c for c in grid.cells() if c.learner == "stateless-floor")
    user = RunPaths(run).cell(cell.cell).user(0)
    stale = CellFence.take(user.root, "the attempt on the lost node")
    CellFence.take(user.root, "Ray's retry")
    runner = UserRunner(grid, cell, user.root, "", fence=stale, schedule=user_schedule(grid, cell, 0), user=0)
    checkers = Checkers(grid, run.name)
    with model_service(grid, RunPaths(run).logs) as urls, \
            row_services(grid, cell, user, urls[0], checkers) as services:
        with pytest.raises(StaleAttempt, match="took the cell over"):
            runner.run_round(0, services, None, threading.Event(), lambda: None)
    checkers.close()
    assert not user.events.exists() or read_events(user.events) == []


def started(mark: str) -> list[str]:
    """Ray's raylets and GCS servers and carc's model servers that a test's run started (they
    carry its mark in their environment), whatever else runs on the machine."""
    import psutil

    found = []
    for proc in psutil.process_iter(["name", "cmdline", "environ"]):  # read at once: it may end
        command = " ".join(proc.info["cmdline"] or ())
        if (proc.info["environ"] or {}).get(RUN_MARK) == mark:
            if proc.info["name"] in ("raylet", "gcs_server"):
                found.append(proc.info["name"])
            elif "model serve" in command:
                found.append("model serve")
    return found


def test_ctrl_c_on_ray_leaves_nothing_and_the_local_executor_resumes_the_run_to_the_same_end(
        tmp_path, reference):
    """SIGINT to the driver's process group mid-round (Ray started by the driver on this
    machine): the run stops at once, Ray's tasks are cancelled and no container, network or
    volume of the run, no raylet and no model server is left; the records are the executor's
    no more than the folder is, so `carc grid run --resume` on the local executor finishes the
    run, and it ends as the uninterrupted local run with nothing charged for the interruption."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run = make_run(tmp_path, "collective-ray-interrupted")
    # What this run starts inherits this mark: another carc run on the machine is not a leftover
    mark = f"{run}-{os.getpid()}"
    # the named point: a user's first step of its third instance (a third of the run done)
    point = run.parent / "fault-mark"
    fault = {fault_points.FAULT_ENV: "mark after 1 step of slot 2", fault_points.MARK_ENV: str(point)}
    log = run.parent / "driver.log"
    with open(log, "wb") as out:
        driver = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume", str(run),
                                   "--executor", "ray", "--workers", "2", "--no-report"],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, RUN_MARK: mark, **fault})
    try:
        deadline = time.monotonic() + 300
        while not point.exists():
            assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        # the mark reaches what the run started (else no leftover could be seen below)
        assert {"raylet", "gcs_server", "model serve"} <= set(started(mark))
        os.killpg(driver.pid, signal.SIGINT)
        assert driver.wait(timeout=120) == 130, log.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    stopped = outcomes(run)
    assert 0 < len(stopped) < 2 * USERS * SLOTS
    assert _run_labelled(run.name) == []
    time.sleep(2)  # the model servers' and Ray's processes end with their parents
    assert started(mark) == []
    resumed = subprocess.run([sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume", str(run),
                              "--no-report"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert outcomes(run) == outcomes(reference)
    assert shared_digests(run) == shared_digests(reference)
