"""A harness in the collective regime, live: hermes-agent (the real package, each user's round in
its own Docker sandbox behind its own journaling proxy) on the embedded model, with the row whose
library a curator session of hermes-agent rewrites between rounds.

The run proves from its records: every user's instances ran once, each user's calls were
journaled by its own proxy and counted by its own instances; the curator ran in a sandbox of its
own, fed the round's digest (the pairs users bought, what they kept), and what it wrote to its
library came back to the host as task files only; a user of the next round ran the library's file
of its task and solved without buying a pair; the independent row never heard of the library; no
container, network or volume is left. The library's reading is tested without Docker below.
"""

from __future__ import annotations

import io
import json
import tarfile
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.records import RunPaths, read_events
from orchestrator.run.collective import harness_rows
from orchestrator.run.collective.harness_rows import LIBRARY_FILE_BYTES, kept_passages, read_library
from proxy.journal import read_journal
from tests.docker_fixtures import client  # noqa: F401

GRID = """\
name: collective-harness
seed: 3
track: {name: own, tasks: 2, visits: 2, epilogue: 0}
collective: {users: 2, round_slots: 2}
efforts: [low]
learners:
  - {learner: hermes-agent, row: memory-on}
  - {learner: hermes-agent, row: collective}
limits: {max_malformed: 20, wall_clock_s: 600}
workers: 4
"""
USERS, SLOTS = 2, 4
INDEPENDENT, COLLECTIVE = "hermes-agent.low.workstreams.s3", "hermes-agent-collective.low.workstreams.s3"


@pytest.fixture(scope="module")
def run_dir(client, tmp_path_factory) -> Path:
    from orchestrator.run.collective.rounds import execute_collective
    run = tmp_path_factory.mktemp("collective-harness") / "runs" / "collective-harness"
    (run / "cells").mkdir(parents=True)
    (run / "grid.yaml").write_text(GRID)
    start = time.monotonic()
    assert execute_collective(run, show_progress=False) == []
    print(f"\ncollective harness grid: {time.monotonic() - start:.0f} s wall")
    return run


def _ends(user) -> dict[int, object]:
    return {e.slot: e for e in read_events(user.events) if e.type == "instance_end"}


def _ran_the_file(entries, slot: int) -> bool:
    """Some call of `slot` sent the model the printout of a program file run on its test input."""
    return any(e.slot == slot and e.request and any(
        m.get("role") == "tool" and "carc-output task" in str(m.get("content"))
        for m in e.request.get("messages", [])) for e in entries)


@pytest.mark.docker
@pytest.mark.slow
def test_every_user_ran_once_in_its_own_sandbox_and_its_own_proxy_counted_its_calls(run_dir, client):
    containers = set()
    for cell in RunPaths(run_dir).cell_folders():
        users = cell.user_folders()
        assert [u.number for u in users] == list(range(USERS)), cell.name
        for user in users:
            ends = Counter(e.slot for e in read_events(user.events) if e.type == "instance_end")
            assert sorted(ends) == list(range(SLOTS)) and set(ends.values()) == {1}, user.root
            containers.add(json.loads(user.sandbox.read_text())["container"])
            entries = [e for e in read_journal(user.journal) if not e.refused and e.api != "other"]
            # a harness does not count its calls: its proxy does, into the instance's end
            counted = Counter({slot: end.model_calls for slot, end in _ends(user).items()})
            assert entries and Counter(e.slot for e in entries) == +counted, user.root
            assert {e.cell for e in entries} == {f"{cell.name}-u{user.number:04d}"}
    assert len(containers) == 2 * USERS  # a sandbox of its own for every user of every row
    from sandboxes.docker_sandbox import LABEL_RUN
    left = [*client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_dir.name}"}),
            *client.networks.list(filters={"label": f"{LABEL_RUN}={run_dir.name}"}),
            *client.volumes.list(filters={"label": f"{LABEL_RUN}={run_dir.name}"})]
    assert left == []


@pytest.mark.docker
@pytest.mark.slow
def test_the_curator_writes_the_library_from_the_rounds_digest_in_its_own_sandbox(run_dir):
    cell = RunPaths(run_dir).cell(COLLECTIVE)
    first, second = cell.shared_round(0), cell.shared_round(1)
    assert not (first / "library").exists()  # round 0 reads an empty library
    update = json.loads((second / "update.json").read_text())
    met = {e.task for u in cell.user_folders() for e in _ends(u).values() if e.round == 0}
    files = sorted(p.name for p in (second / "library").iterdir())
    assert update["tasks_curated"] == len(met) and update["curator_errors"] == 0, update
    assert update["library_files"] == len(files) >= 1 and set(files) <= {f"{t}.py" for t in met}, (update, files)
    transcript = json.loads((second / "curator" / "transcript.json").read_text())
    assert [t["task"] for t in transcript] == sorted(met, key=[t["task"] for t in transcript].index)
    for turn in transcript:  # the digest: the pairs bought, from the users' transcripts
        assert f"Curate task {turn['task']}" in turn["user"] and "[[[" in turn["user"], turn["user"][:500]
    # every curator call went through its own proxy, between instances
    calls = [e for e in read_journal(second / "curator" / "journal") if not e.refused and e.api != "other"]
    assert calls and all(e.slot is None for e in calls)
    assert update["curator_calls"] == len(calls) and update["curator_aborted"] == 0
    assert (second / "curator-state.tar.gz").exists()


@pytest.mark.docker
@pytest.mark.slow
def test_next_rounds_users_run_the_library_file_and_the_independent_row_never_sees_it(run_dir):
    paths = RunPaths(run_dir)
    library = {p.stem for p in (paths.cell(COLLECTIVE).shared_round(1) / "library").iterdir()}
    used = 0
    for user in paths.cell(COLLECTIVE).user_folders():
        entries = read_journal(user.journal)
        for slot, end in _ends(user).items():
            if end.round == 1 and end.task in library:
                assert _ran_the_file(entries, slot), f"{user.root} slot {slot}"
                assert end.status == "solved" and end.demos_used == 0, (user.root, slot, end.cost)
                used += 1
    assert used >= 1
    for user in paths.cell(INDEPENDENT).user_folders():
        assert "/tmp/carc/shared" not in json.dumps(user.read_transcripts())
        assert not (paths.cell(INDEPENDENT).root / "shared").exists()


@pytest.mark.docker
@pytest.mark.slow
def test_the_inspector_reads_every_harness_user_as_a_cell_of_its_own(run_dir):
    from stores_inspector import inspect_run
    result = inspect_run(run_dir)
    users = {f"{c}/u{u:04d}" for c in (INDEPENDENT, COLLECTIVE) for u in range(USERS)}
    assert {s["cell"] for s in result.summaries} == users
    assert not [s for s in result.summaries if "problem" in s]
    instances = result.tables["instances"]
    assert len(instances) == len(users) * SLOTS and instances["status"].notna().all()
    for user in RunPaths(run_dir).cell(COLLECTIVE).user_folders():  # every snapshot kept, for this
        assert len(list(user.snapshots.glob("*.tar.gz"))) == SLOTS
    assert inspect_run(run_dir, cell=f"{COLLECTIVE}/u0001").summaries[0]["cell"] == f"{COLLECTIVE}/u0001"


# --- reading what the curator and the users kept (no Docker) -----------------------------------

def _archive(path: Path, members: list[tuple[str, bytes | None, str | None]]) -> Path:
    """A state snapshot: (name, data) files, or (name, None, target) symlinks."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data, target in members:
            info = tarfile.TarInfo(name)
            if target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.docker
@pytest.mark.slow
def test_planned_from_itself_the_grid_counts_the_curators_conversations_and_every_journal_line(run_dir):
    """`carc grid plan GRID --pilot RUN` on this run: the collective row's curator conversations
    are the tasks its updates curated, and its calls (every journal line: the users' proxies' and
    the curator's) are the run's."""
    from orchestrator.run.grid_config import load_grid
    from orchestrator.run.plan import plan_grid

    plan = {c.cell: c for c in plan_grid(load_grid(run_dir / "grid.yaml"), pilot_dir=run_dir, images=False).cells}
    cell = RunPaths(run_dir).cell(COLLECTIVE)
    updates = [json.loads(p.read_text()) for p in sorted((cell.root / "shared").glob("round-*/update.json"))]
    assert plan[COLLECTIVE].curated_tasks == sum(u.get("tasks_curated", 0) for u in updates) > 0
    assert (plan[COLLECTIVE].source, plan[COLLECTIVE].curator_source) == ("pilot", "pilot")
    assert plan[INDEPENDENT].curated_tasks == 0
    for name in (INDEPENDENT, COLLECTIVE):
        folder = RunPaths(run_dir).cell(name)
        lines = sum(1 for user in folder.user_folders() for e in read_journal(user.journal) if not e.refused)
        lines += sum(1 for journal in folder.root.glob("shared/round-*/curator/journal")
                     for e in read_journal(journal) if not e.refused)
        assert plan[name].calls == pytest.approx(lines), name


@pytest.mark.docker
@pytest.mark.slow
def test_on_ray_each_users_round_is_a_task_and_the_run_ends_as_on_the_local_executor(run_dir, tmp_path):
    """`carc grid run --executor ray` (Ray started on this machine): each user's round a Ray
    task with its own sandbox, the curator on the head between rounds; every user's instances end
    as they ended on the local executor, and the curator writes the same library."""
    import subprocess
    import sys

    pytest.importorskip("ray", reason="the Ray executor needs the ray extra")
    from tests.test_collective import outcomes
    from tests.test_runner import _run_labelled

    run = tmp_path / "runs" / "collective-harness-ray"
    (run / "cells").mkdir(parents=True)
    (run / "grid.yaml").write_text(GRID)
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume", str(run),
                           "--executor", "ray", "--workers", "2", "--no-report"],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert outcomes(run) == outcomes(run_dir) and len(outcomes(run)) == 2 * USERS * SLOTS

    def library(root: Path) -> dict[str, str]:
        shared = RunPaths(root).cell(COLLECTIVE).root / "shared"
        return {str(p.relative_to(shared)): p.read_text() for p in sorted(shared.glob("round-*/library/*.py"))}
    assert library(run) == library(run_dir) != {}
    for cell in RunPaths(run).cell_folders():  # each user's calls in its own journal, as on the local executor
        for user in cell.user_folders():
            entries = [e for e in read_journal(user.journal) if not e.refused and e.api != "other"]
            counted = Counter({slot: end.model_calls for slot, end in _ends(user).items()})
            assert entries and Counter(e.slot for e in entries) == +counted, user.root
    assert _run_labelled(run.name) == []


def test_the_library_read_back_holds_only_small_regular_task_files(tmp_path):
    snapshot = _archive(tmp_path / "state.tar.gz", [
        ("./library/own-a.py", b"def transform(g):\n    return g\n", None),
        ("./library/own-b.py", None, "/etc/passwd"),                        # a symlink
        ("./library/own-c.py", b"x" * (LIBRARY_FILE_BYTES + 1), None),     # too large
        ("./library/not-a-task.py", b"pass\n", None),                      # no such task
        ("./library/own-a.txt", b"notes\n", None),                         # not a program
        ("./library/sub/own-a.py", b"pass\n", None),                       # not at the top
        ("./own-a.py", b"pass\n", None),                                   # not in the library
        ("../library/own-d.py", b"pass\n", None),                          # outside the volume
    ])
    dest = tmp_path / "out"
    assert read_library(snapshot, dest, {"own-a", "own-b", "own-c", "own-d"}) == 1
    assert sorted(p.name for p in dest.iterdir()) == ["own-a.py"]
    assert not (tmp_path / "library").exists()


def test_kept_passages_are_the_lines_that_mention_a_task_up_to_a_blank_line(tmp_path):
    note = textwrap.dedent("""\
        carc-note task own-a
        steps: (('flip', ()),)

        unrelated line
        own-b is like own-a
        """).encode()
    snapshot = _archive(tmp_path / "state.tar.gz", [
        ("./memories/MEMORY.md", note, None),
        ("./bin/blob", b"own-a\0binary", None),
        ("./link", None, "/etc/passwd"),
    ])
    found = kept_passages(snapshot, {"own-a", "own-b"})
    assert found["own-a"] == [("memories/MEMORY.md", "carc-note task own-a\nsteps: (('flip', ()),)"),
                              ("memories/MEMORY.md", "own-b is like own-a")]
    assert found["own-b"] == [("memories/MEMORY.md", "own-b is like own-a")]
    assert harness_rows.transcript_messages([{"user": "u", "assistant": "a"}]) == [
        {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]


def test_a_killed_curators_journal_is_kept_beside_the_round_and_the_update_done_again(tmp_path):
    """What a curator killed mid-update called is on record; the update is built again whole."""
    from orchestrator.records import CellPaths
    from orchestrator.run.collective.rounds import update_shared
    from orchestrator.run.grid_config import GridConfig

    grid = GridConfig.model_validate({"name": "x", "collective": {"users": 1, "round_slots": 1},
                                      "track": {"name": "own", "tasks": 1, "visits": 2, "epilogue": 0},
                                      "learners": [{"learner": "demo-cache-floor", "row": "collective"}],
                                      "sandbox": {"engine": "process"}})
    cell = next(c for c in grid.cells())
    paths = CellPaths(tmp_path / "runs" / "x" / "cells" / cell.cell)
    killed = paths.shared_round(1).with_name("round-001.tmp") / "curator" / "journal"
    killed.mkdir(parents=True)
    (killed / "journal.jsonl").write_text('{"id": "a call the killed curator made"}\n')
    written = update_shared(grid, cell, paths, 1)
    assert json.loads((written / "update.json").read_text())["round"] == 1
    kept = paths.shared_round(1).with_name("round-001.aborted") / "attempt-1" / "journal" / "journal.jsonl"
    assert "the killed curator" in kept.read_text()
    assert not paths.shared_round(1).with_name("round-001.tmp").exists()
