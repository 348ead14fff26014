"""The cell runner end to end on the real embedded solver model (a real server over HTTP).

The resume test kills the whole `carc grid run` process tree with SIGKILL mid-instance, several
times, and proves from the records that no verdict was lost or charged twice.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from orchestrator.records import CellPaths, read_events
from orchestrator.run.local_pool import execute

GRID = """\
name: tiny
seed: 3
track: {name: own, tasks: 3, visits: 3, epilogue: 2, fresh_reference: true}
orders: [workstreams]
efforts: [low]
learners:
  - stateless-floor
  - demo-cache-floor
  - program-library
  - {learner: program-library, row: wiped}
workers: 2
"""

pytestmark = pytest.mark.slow


def make_run(tmp_path: Path, name: str) -> Path:
    grid = tmp_path / "grid.yaml"
    grid.write_text(textwrap.dedent(GRID))
    run_dir = tmp_path / "runs" / name
    (run_dir / "cells").mkdir(parents=True)
    (run_dir / "grid.yaml").write_text(grid.read_text())
    return run_dir


def cell_events(run_dir: Path) -> dict[str, list]:
    return {d.name: read_events(d / "events.jsonl") for d in sorted((run_dir / "cells").iterdir())}


def results(run_dir: Path) -> dict[str, list[tuple]]:
    return {cell: [(e.slot, e.phase, e.task, e.visit, e.status, e.cost) for e in evs
                   if e.type == "instance_end"] for cell, evs in cell_events(run_dir).items()}


def assert_records_consistent(run_dir: Path, slots_per_cell: int) -> None:
    for cell, events in cell_events(run_dir).items():
        ends = Counter(e.slot for e in events if e.type == "instance_end")
        assert sorted(ends) == list(range(slots_per_cell)), cell
        assert set(ends.values()) == {1}, f"{cell}: a slot ended twice"
        steps = defaultdict(list)
        for e in events:
            if e.type == "step":
                steps[e.slot].append(e)
        for end in (e for e in events if e.type == "instance_end"):
            numbers = [s.step for s in steps[end.slot]]
            assert numbers == list(range(1, len(numbers) + 1)), f"{cell} slot {end.slot}: {numbers}"
            charged = sum(s.outcome in ("demo", "incorrect") for s in steps[end.slot])
            if end.status == "solved":
                assert end.cost == charged, f"{cell} slot {end.slot}"
            else:
                assert end.cost == 16


def test_a_run_records_every_instance_once_with_costs_that_match_its_steps(tmp_path):
    run_dir = make_run(tmp_path, "whole")
    execute(run_dir, show_progress=False)
    # 3 tasks x 3 visits + 2 epilogue + 2 fresh reference
    assert_records_consistent(run_dir, 13)
    cells = results(run_dir)
    assert len(cells) == 4
    for cell, rows in cells.items():
        phases = Counter(r[1] for r in rows)
        assert phases == {"stream": 9, "epilogue": 2, "fresh": 2}
        assert (run_dir / "cells" / cell / "snapshots" / "00012.tar.gz").exists()
        assert sorted(CellPaths(run_dir / "cells" / cell).read_transcripts()) == list(range(13))
    # the same epilogue instance is served in the fresh reference
    rows = cells["stateless-floor.low.workstreams.s3"]
    assert sorted(r[2] for r in rows if r[1] == "epilogue") == sorted(r[2] for r in rows if r[1] == "fresh")


def _run_cli(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume",
                             str(run_dir), "--no-report", "--workers", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _lines(run_dir: Path) -> int:
    return sum((d / "events.jsonl").read_text().count("\n")
               for d in (run_dir / "cells").iterdir() if (d / "events.jsonl").exists())


def test_sigkill_mid_instance_then_resume_loses_and_double_charges_nothing(tmp_path):
    reference = make_run(tmp_path, "reference")
    execute(reference, show_progress=False)

    run_dir = make_run(tmp_path, "killed")
    kills = 0
    for _ in range(4):
        proc = _run_cli(run_dir)
        start_lines, deadline = _lines(run_dir) if (run_dir / "cells").exists() else 0, time.time() + 120
        # wait until new steps were written, then kill the whole process tree at once
        while proc.poll() is None and time.time() < deadline:
            if _lines(run_dir) >= start_lines + 25:
                break
            time.sleep(0.02)
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    assert kills >= 2, "the run finished before it could be killed twice"
    proc = _run_cli(run_dir)
    assert proc.wait(timeout=600) == 0

    assert_records_consistent(run_dir, 13)
    events = [e for evs in cell_events(run_dir).values() for e in evs]
    assert any(e.type == "resumed" for e in events), "no kill landed mid-instance"
    assert results(run_dir) == results(reference)


def _run_labelled(run_id: str) -> list[str]:
    import docker
    client = docker.from_env()
    label = {"label": f"org.carc.run={run_id}"}
    return ([c.name for c in client.containers.list(all=True, filters=label)]
            + [n.name for n in client.networks.list(filters=label)]
            + [v.name for v in client.volumes.list(filters=label)])


def test_sigterm_stops_the_run_leaves_nothing_and_resume_finishes_it(tmp_path):
    """`kill <carc grid run>` (SIGTERM to the main process only, as a scheduler sends it) stops
    the workers instead of waiting for their cells, prunes the run's containers, volumes and
    networks, exits 130 naming the resume command, and the run resumes to the full record."""
    run_dir = make_run(tmp_path, "terminated")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "grid", "run", "--resume",
                             str(run_dir), "--no-report", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:  # a program-checking container is up
        if (run_dir / "cells").exists() and _lines(run_dir) >= 10 and _run_labelled(run_dir.name):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 130, output
    assert f"carc grid run --resume {run_dir}" in output.replace("\n", "")
    assert _run_labelled(run_dir.name) == []
    assert _run_cli(run_dir).wait(timeout=600) == 0
    assert_records_consistent(run_dir, 13)
