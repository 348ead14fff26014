"""A wiped harness row's standby sandbox (orchestrator/run/standby.py), on the real engine.

The standby is the next instance's fresh sandbox, prepared while the current instance runs. What
must hold: every instance after a wipe meets an empty state (nothing the one before wrote, on the
volume or in /tmp), a standby serves one instance only, a run killed with a standby standing
leaves nothing once the cell's sandbox is made again (a resume) or the run is pruned, and the
results of a grid are the same with and without standbys.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness_adapters.scripted_model import NOTE
from orchestrator.records import CellPaths, RunPaths, read_events
from orchestrator.run.cell_services import harness_services
from orchestrator.run.grid_config import GridConfig
from proxy.journal import read_journal
from sandboxes.docker_sandbox import LABEL_RUN, prune
from tests.docker_fixtures import client, run_id, run_scripted_grid  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.slow]

UPSTREAM = "http://host.docker.internal:9/v1"  # never called: no instance talks to a model here
ROOT = Path(__file__).resolve().parent.parent


def memory_off_cell(root: Path, run: str, standby: bool = True):
    """A hermes-agent memory-off cell in the run folder `root/run` (its name is the run label)."""
    data = {"name": "standby", "seed": 3, "orders": ["sequential"], "efforts": ["low"],
            "track": {"name": "own", "tasks": 1, "visits": 1, "epilogue": 0, "fresh_reference": False},
            "model": {"endpoint": UPSTREAM, "name": "carc-scripted"},
            "learners": [{"learner": "hermes-agent", "row": "memory-off"}],
            "sandbox": {"standby": standby}}
    grid = GridConfig.model_validate(data)
    RunPaths(root / run).root.mkdir(parents=True, exist_ok=True)
    RunPaths(root / run).grid.write_text(yaml.safe_dump(data))
    cell = grid.cells()[0]
    cell_dir = root / run / "cells" / cell.cell
    cell_dir.mkdir(parents=True, exist_ok=True)
    return grid, cell, cell_dir


def leftovers(client, run: str) -> list[str]:
    label = {"label": f"{LABEL_RUN}={run}"}
    return ([c.name for c in client.containers.list(all=True, filters=label)]
            + [n.name for n in client.networks.list(filters=label)]
            + [v.name for v in client.volumes.list(filters=label)])


def listing(sandbox) -> str:
    """Every path of the state volume and of /tmp but the keeper's CA folder."""
    return sandbox.exec(["sh", "-c", "find /state /tmp -mindepth 1 ! -path '/tmp/carc*' | sort"]).text()


def test_each_instance_after_a_wipe_meets_a_fresh_standby(tmp_path, client, run_id):
    grid, cell, cell_dir = memory_off_cell(tmp_path, run_id)
    containers = []
    with harness_services(grid, cell, cell_dir, UPSTREAM) as services:
        standbys = services.state.cell
        for k in range(3):
            services.state.wipe()
            sandbox = standbys.current.sandbox
            containers.append(sandbox.container.name)
            # fresh: hermes' config, and what its driver (loading ahead) makes in HERMES_HOME
            paths = listing(sandbox).split()
            assert "/state/hermes/config.yaml" in paths and "marker" not in " ".join(paths), (k, paths)
            assert all(p == "/state/hermes" or p.startswith("/state/hermes/") for p in paths), (k, paths)
            driver = standbys.current.learner.prestarted  # hermes, loaded ahead on the fresh state
            assert driver is not None and driver.exit_code() is None
            # instance k: it is served, and writes a marker on the volume and in /tmp
            standbys.pristine = False
            assert sandbox.exec(["sh", "-c", f"echo {k} > /state/marker-{k}; echo {k} > /tmp/marker-{k}"]).ok
            assert f"marker-{k}" in listing(sandbox)
        assert standbys.swaps == 2  # the first instance met the cell's own (fresh) sandbox
        assert containers[0].endswith("-sandbox") and containers[1].endswith("-sandbox-1") \
            and containers[2].endswith("-sandbox-2")
        services.state.restore(None)  # as a resume before the first slot: fresh, no swap needed
        services.state.wipe()
        assert standbys.swaps == 2
    assert leftovers(client, run_id) == []


HOLD = """
import sys, time
from pathlib import Path
from orchestrator.run.cell_services import harness_services
from tests.test_standby import memory_off_cell
grid, cell, cell_dir = memory_off_cell(Path(sys.argv[1]), sys.argv[2])
with harness_services(grid, cell, cell_dir, "http://host.docker.internal:9/v1") as services:
    services.state.cell.standby.result()  # the standby is up, its harness prepared
    print("ready", flush=True)
    time.sleep(600)
"""


def test_a_run_killed_with_a_standby_standing_leaves_nothing_after_resume_or_prune(tmp_path, client):
    run = f"pytest-killed-{os.getpid()}"
    for then in ("resume", "prune"):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), run], cwd=ROOT,
                                stdout=subprocess.PIPE, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            assert proc.stdout.readline().strip() == b"ready"
            standing = leftovers(client, run)
            assert any(name.endswith("-sandbox-1") for name in standing), standing
            assert any(name.endswith("-state-1") for name in standing), standing
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        assert leftovers(client, run)  # killed: its objects stand
        if then == "resume":  # the cell's sandbox made again removes the killed one's, standby too
            grid, cell, cell_dir = memory_off_cell(tmp_path, run, standby=False)
            with harness_services(grid, cell, cell_dir, UPSTREAM):
                assert not any(name.endswith("-1") for name in leftovers(client, run))
        else:
            prune(run=run)
        assert leftovers(client, run) == []


GRID = """\
name: standby-STANDBY
seed: 5
track: {{name: own, tasks: 2, visits: 2, epilogue: 0, fresh_reference: false}}
orders: [sequential]
model: {{endpoint: "{endpoint}", name: carc-scripted}}
efforts: [low]
learners:
  - {{learner: hermes-agent, row: memory-off}}
  - hermes-agent
sandbox: {{standby: STANDBY}}
workers: 2
"""


def test_a_grid_ends_the_same_with_and_without_drivers_started_ahead_and_no_note_survives_a_wipe(
        tmp_path, client, scripted_harness_run):
    """With standby (the default): the two hermes-agent cells of the scripted harness grid
    (tests/conftest.py, the same seed, stream and model as GRID); without: GRID run here."""
    verdicts, bodies = {}, {}
    runs = {"true": scripted_harness_run,
            "false": run_scripted_grid(tmp_path / "false", "standby-false", GRID.replace("STANDBY", "false"))}
    if started_on(runs["true"]) != started_on(runs["false"]):  # midnight fell between the runs:
        # hermes dates its system prompt, so the model saw other conversations; run both now
        runs["true"] = run_scripted_grid(tmp_path / "true", "standby-true", GRID.replace("STANDBY", "true"))
    for standby, run in runs.items():
        folder = run / "cells" / "hermes-agent-memory-off.low.sequential.s5"
        ends = {e.slot: e for e in read_events(folder / "events.jsonl") if e.type == "instance_end"}
        verdicts[standby] = {slot: (e.task, e.visit, e.status, e.cost, e.attempts_used, e.demos_used)
                             for slot, e in ends.items()}
        assert sorted(ends) == [0, 1, 2, 3]
        firsts: dict[int, str] = {}
        for entry in read_journal(folder / "journal" / "journal.jsonl"):
            if entry.api == "openai-chat" and entry.slot is not None and entry.slot not in firsts:
                firsts[entry.slot] = yaml.safe_dump(entry.request["messages"])
        assert sorted(firsts) == [0, 1, 2, 3]
        for slot, prompt in firsts.items():  # the scripted model writes a note every instance
            assert "carc-note" not in prompt, (standby, slot)
        for slot, end in ends.items():  # each snapshot keeps its own instance's note, no other
            notes = [NOTE.format(task=ends[other].task) for other in ends if ends[other].task != end.task]
            snapshot = CellPaths(folder).snapshot(slot)
            assert snapshot.exists(), snapshot
            text = subprocess.run(["tar", "-xzOf", str(snapshot)], capture_output=True).stdout.decode(errors="replace")
            assert NOTE.format(task=end.task) in text, (standby, slot)
            assert not any(note in text for note in notes), (standby, slot)
        bodies[standby] = model_requests(folder)
        # memory-on: its driver started after the snapshot, ahead of the conversation
        kept = run / "cells" / "hermes-agent.low.sequential.s5"
        ends = {e.slot: e for e in read_events(kept / "events.jsonl") if e.type == "instance_end"}
        verdicts[standby, "memory-on"] = {slot: (e.task, e.visit, e.status, e.cost, e.attempts_used,
                                                 e.demos_used) for slot, e in ends.items()}
        bodies[standby, "memory-on"] = model_requests(kept)
        systems: dict[int, str] = {}
        for entry in read_journal(kept / "journal" / "journal.jsonl"):
            if entry.api == "openai-chat" and entry.slot is not None and entry.slot not in systems:
                systems[entry.slot] = entry.request["messages"][0]["content"]
        for slot, end in ends.items():  # the note comes back on a returning instance
            assert (NOTE.format(task=end.task) in systems[slot]) == (end.visit > 0), (standby, slot)
    assert verdicts["true"] == verdicts["false"]
    assert verdicts["true", "memory-on"] == verdicts["false", "memory-on"]
    # what the model was shown, call by call: the same with the drivers started ahead (on a
    # standby; after the snapshot) as with drivers started at the conversation's start
    assert bodies["true"] == bodies["false"]
    assert bodies["true", "memory-on"] == bodies["false", "memory-on"]


def started_on(run: Path) -> set[str]:
    """The dates hermes wrote into its system prompts ("Conversation started: <date>")."""
    found = set()
    for journal in sorted(run.glob("cells/hermes-agent*/journal/journal.jsonl")):
        for entry in read_journal(journal):
            if entry.api == "openai-chat" and entry.request.get("messages"):
                found.update(re.findall(r"Conversation started: ([^\n]+)",
                                        str(entry.request["messages"][0].get("content"))))
    return found


VARYING = re.compile(r"carc-[0-9a-f]{12}|call_[0-9a-f]{8}|\b[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\b|"
                     r"\b\d{8}_\d{6}(_[0-9a-f]+)?\b|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?|"
                     r"\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun)\w*,? \w+ \d{1,2},? \d{4}( \d{1,2}:\d{2} ?(AM|PM)?)?")


def model_requests(folder: Path) -> dict[int, list[str]]:
    """Each slot's model requests as the proxy journaled them, what differs between two runs of
    the same calls (session ids, the clock, the scripted model's random tool call ids) blanked;
    sorted, as hermes' background review runs in a thread beside the conversation's turns."""
    out: dict[int, list[str]] = {}
    for entry in read_journal(folder / "journal" / "journal.jsonl"):
        if entry.api == "openai-chat" and entry.slot is not None:
            text = json.dumps(entry.request, sort_keys=True)
            out.setdefault(entry.slot, []).append(VARYING.sub("<varies>", text))
    return {slot: sorted(texts) for slot, texts in out.items()}


def test_a_standby_is_isolated_as_the_cells_own_sandbox(tmp_path, client, run_id):
    """The same container settings (user, read-only root, capabilities, limits, DNS, the cell's
    internal network only), its own state volume, and no key in its environment."""
    grid, cell, cell_dir = memory_off_cell(tmp_path, run_id)
    with harness_services(grid, cell, cell_dir, UPSTREAM) as services:
        standbys = services.state.cell
        own = client.containers.get(standbys.current.sandbox.container.id).attrs
        spare = client.containers.get(standbys.standby.result().sandbox.container.id).attrs
        kept = ("Binds", "Mounts")  # the state volume differs by design
        assert {k: v for k, v in own["HostConfig"].items() if k not in kept} == \
            {k: v for k, v in spare["HostConfig"].items() if k not in kept}
        assert own["Config"]["User"] == spare["Config"]["User"] == "1001:1001"
        assert sorted(own["Config"]["Env"]) == sorted(spare["Config"]["Env"])
        assert list(spare["NetworkSettings"]["Networks"]) == list(own["NetworkSettings"]["Networks"])
        assert [m["Name"] for m in spare["Mounts"] if m["Type"] == "volume"] == \
            [standbys.standby.result().sandbox.volume.name]
        assert standbys.standby.result().sandbox.volume.name != standbys.current.sandbox.volume.name
    assert leftovers(client, run_id) == []
