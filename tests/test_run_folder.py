"""The run folder: its own validated grid (resumable alone), typed records, the wall clock.

The runs here use the real embedded solver model over HTTP (`sandbox.engine: process`, no Docker);
the wall-clock test drives the real runner with a learner that takes as long as it is allowed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from harness_adapters.base import Learner, Turn
from orchestrator.records import RECORDS_FORMAT, CellPaths, CellRecord, Event, RunPaths, SandboxRecord, read_events
from orchestrator.run import local_pool, run_folder
from orchestrator.run.grid_config import GridFileError, load_grid
from orchestrator.run.cell_runner import CellRunner
from orchestrator.run.schedule import build_schedule

WORDING = "system: |\n  You solve ARC puzzles; answer with one JSON action. (our own wording)\n"
GRID = """\
name: folder
track: {name: own, tasks: 2, visits: 2, epilogue: 0, fresh_reference: false}
orders: [sequential]
efforts: [low]
learners: [stateless-floor, {learner: program-library, row: wiped}]
sandbox: {engine: process}
prompts: wording.yaml
workers: 1
"""


@pytest.fixture
def grid_file(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "wording.yaml").write_text(WORDING)
    path = tmp_path / "src" / "grid.yaml"
    path.write_text(GRID)
    return path


def started(grid_file: Path, runs: Path, monkeypatch, run_id: str = "r") -> RunPaths:
    """start_run up to the point where cells would run (the run folder as it is then)."""
    monkeypatch.setattr(local_pool, "execute", lambda run_dir, workers=None: None)
    return RunPaths(local_pool.start_run(grid_file, runs, run_id))


def test_the_run_folder_holds_the_validated_grid_and_copies_of_the_files_it_names(grid_file, tmp_path,
                                                                                   monkeypatch):
    run = started(grid_file, tmp_path / "runs", monkeypatch)
    stored = yaml.safe_load(run.grid.read_text())
    assert stored["prompts"] == "prompts.yaml" and (run.root / "prompts.yaml").read_text() == WORDING
    assert run.grid_original.read_text() == GRID
    assert stored["efforts"] == ["low"] and stored["sandbox"]["engine"] == "process"


def test_after_the_original_grid_and_its_prompts_are_edited_the_run_resumes_from_its_folder_alone(
        grid_file, tmp_path, monkeypatch):
    run = started(grid_file, tmp_path / "runs", monkeypatch)
    grid_file.write_text(GRID.replace("efforts: [low]", "efforts: [medium]"))
    (grid_file.parent / "wording.yaml").unlink()
    grid = load_grid(run.grid)
    assert grid.efforts == ["low"]
    assert grid.prompts == (run.root / "prompts.yaml").resolve() and grid.prompts.read_text() == WORDING


def test_a_run_id_that_exists_continues_the_same_grid_and_refuses_another(grid_file, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    started(grid_file, runs, monkeypatch)
    assert started(grid_file, runs, monkeypatch).grid.exists()  # the same grid: continued
    (grid_file.parent / "wording.yaml").write_text(WORDING + "store_invitation: save it\n")
    grid_file.write_text(GRID.replace("efforts: [low]", "efforts: [medium]"))
    with pytest.raises(run_folder.GridMismatch) as err:
        started(grid_file, runs, monkeypatch)
    message = str(err.value)
    assert "started with another grid" in message and "efforts: ['low'] != ['medium']" in message
    assert "prompts.yaml differs" in message and "--resume" in message


def test_a_stored_grid_that_names_a_missing_file_is_an_error_naming_it(grid_file, tmp_path):
    (grid_file.parent / "wording.yaml").unlink()
    with pytest.raises(GridFileError, match="cannot read|No such file|wording.yaml"):
        local_pool.start_run(grid_file, tmp_path / "runs", "r")


@pytest.mark.slow
def test_events_and_cell_records_are_typed_with_their_format_and_what_was_wiped(grid_file, tmp_path):
    run = RunPaths(local_pool.start_run(grid_file, tmp_path / "runs", "typed"))
    floor, wiped = run.cell("stateless-floor.low.sequential.s0"), run.cell("program-library-wiped.low.sequential.s0")
    assert CellRecord.read(floor.settings).format == 2
    assert SandboxRecord.read(floor.sandbox).program_checks == "host-process"
    for cell, expect_wiped in ((floor, False), (wiped, True)):
        starts = [e for e in read_events(cell.events) if e.type == "instance_start"]
        assert len(starts) == 4 and {e.format for e in starts} == {2}
        assert {e.wiped_before for e in starts} == {expect_wiped}
    for end in (e for e in read_events(floor.events) if e.type == "instance_end"):
        assert (end.failure_kind is None) == (end.status == "solved")


class SlowLearner(Learner):
    """Takes as long as it may for every turn: `seconds_left` of a 900 s harness-like turn."""

    name = "slow"
    waits: list[float] = []

    def begin(self, view) -> None:
        self.deadline = view.deadline

    def act(self) -> Turn:
        wait = self.seconds_left(900.0)
        self.waits.append(wait)
        time.sleep(wait)
        return Turn(text='{"action": "request_demos"}')

    def observe(self, outcome, attempts_used, demos_used) -> None:
        pass


def one_instance_grid(tmp_path: Path, name: str, extra: str = ""):
    """A grid of one stateless-floor cell with one instance, host processes, no proxy."""
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text(textwrap.dedent(f"""\
        name: {name}
        track: {{name: own, tasks: 1, visits: 1, epilogue: 0, fresh_reference: false}}
        orders: [sequential]
        efforts: [low]
        learners: [stateless-floor]
        sandbox: {{engine: process}}
        proxy: {{journal: false}}
        """) + extra)
    return load_grid(grid_path)


@pytest.mark.slow
def test_the_wall_clock_reaches_the_learner_so_a_slow_turn_ends_at_the_limit(tmp_path, monkeypatch):
    grid = one_instance_grid(tmp_path, "clock", "limits: {wall_clock_s: 2}\n")
    monkeypatch.setattr("orchestrator.run.cell_runner.ladder_learner", lambda cell, state_dir, *a: SlowLearner(state_dir, None))
    cell_dir = tmp_path / "runs" / "clock" / "cells" / grid.cells()[0].cell
    CellRunner(grid, grid.cells()[0], cell_dir, "http://127.0.0.1:9/v1").run()
    [end] = [e for e in read_events(CellPaths(cell_dir).events) if e.type == "instance_end"]
    assert end.status == "failed" and end.cost == 16 and end.failure_kind == "wall-clock"
    assert "wall-clock limit of 2 s" in end.reason
    # the learner was told the instance's limit, so its 900 s turn was cut there, not waited for
    assert SlowLearner.waits and max(SlowLearner.waits) <= 2.0


def test_a_record_that_charges_nothing_is_flushed_at_once_and_fsynced_with_the_next(tmp_path, monkeypatch):
    """instance_start is written without an fsync of its own: a killed process keeps it (it is
    flushed to the file), and the next record's fsync, or the log's close, makes it durable."""
    import os

    from orchestrator.records import Event, EventLog

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])

    def event(kind: str, **fields) -> Event:
        return Event(type=kind, cell="c", slot=0, phase="stream", task="t", visit=1, exposure=1,
                     t=time.time(), **fields)

    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.append(event("instance_start"), durable=False)
    assert [e.type for e in read_events(path)] == ["instance_start"] and synced == []
    log.append(event("step", step=1, outcome="demo"))
    assert len(synced) == 1
    log.append(event("resumed"), durable=False)
    log.close()
    assert len(synced) == 2 and [e.type for e in read_events(path)] == ["instance_start", "step", "resumed"]


def test_a_snapshot_is_fsynced_before_it_is_put_in_place_and_its_folder_after(tmp_path, monkeypatch):
    """A durable instance_end must never name a snapshot a power loss could take back."""
    import os as os_module

    from orchestrator.run.cell_services import HostStateDir
    synced, order = [], []
    real_fsync, real_replace = os_module.fsync, os_module.replace

    def fsync(fd):
        synced.append(os_module.readlink(f"/proc/self/fd/{fd}"))
        order.append("fsync")
        real_fsync(fd)

    def replace(src, dst):
        order.append("replace")
        real_replace(src, dst)

    state = HostStateDir(tmp_path / "state")
    (tmp_path / "state" / "notes.txt").write_text("kept")
    monkeypatch.setattr(os_module, "fsync", fsync)
    monkeypatch.setattr(os_module, "replace", replace)
    state.snapshot(tmp_path / "snap.tar.gz")
    assert order == ["fsync", "replace", "fsync"]
    assert synced == [str(tmp_path / "snap.tar.tmp"), str(tmp_path)]


def test_a_sparse_file_of_a_host_state_comes_back_sparse(tmp_path):
    """A 1 GiB file holding 10 KB (`truncate -s 1G`, one write) was packed as 1 GiB of zeros and
    came back as 1 GiB of real blocks; its holes are kept (`sandboxes/snapshot_archive.py`)."""
    import os

    from orchestrator.run.cell_services import HostStateDir

    state = HostStateDir(tmp_path / "state")
    sparse = state.path / "db" / "sparse.bin"
    sparse.parent.mkdir()
    with open(sparse, "wb") as out:
        out.truncate(1 << 30)
        out.seek(5 << 20)
        out.write(b"x" * 10_000)
    if os.stat(sparse).st_blocks * 512 > 1 << 20:
        pytest.skip(f"{tmp_path}'s filesystem does not keep files sparse")
    (state.path / "notes.txt").write_text("kept")
    snap = tmp_path / "snap.tar.gz"
    state.snapshot(snap)
    assert snap.stat().st_size < 64 << 10
    state.restore(snap)
    restored = os.stat(sparse)
    assert restored.st_size == 1 << 30 and restored.st_blocks * 512 <= 64 << 10
    with open(sparse, "rb") as back:
        back.seek((5 << 20) - 1)
        assert back.read(10_002) == b"\0" + b"x" * 10_000 + b"\0"
    assert (state.path / "notes.txt").read_text() == "kept"


# A resume in its own interpreter: the learner asks for demonstrations, and the outcome says why it ended.
RESUME_UNDER_O = """\
import sys
from pathlib import Path
from harness_adapters.base import Learner, Turn
from orchestrator.run import cell_runner
from orchestrator.run.grid_config import load_grid

class AsksForDemos(Learner):
    name = "asks"
    def begin(self, view):
        pass
    def act(self):
        return Turn(text='{"action": "request_demos"}')
    def observe(self, outcome, attempts_used, demos_used):
        pass

cell_runner.ladder_learner = lambda cell, state_dir, *a: AsksForDemos(state_dir, None)
grid = load_grid(sys.argv[1])
try:
    cell_runner.CellRunner(grid, grid.cells()[0], Path(sys.argv[2]), "http://127.0.0.1:9/v1").run()
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
    sys.exit(3)
print("resumed to the end")
"""


def test_a_resumed_instance_whose_logged_step_the_protocol_answers_otherwise_raises_replay_mismatch_under_python_O(
        tmp_path):
    """The records say the learner's request for demonstrations was answered "correct"; replayed,
    the protocol answers "demo". The resume stops with a ReplayMismatch that names the records,
    also under `python -O`, which strips an assert (the check must not be one)."""
    grid = one_instance_grid(tmp_path, "replay")
    [slot] = build_schedule(grid, grid.cells()[0])
    cell_dir = tmp_path / "runs" / "replay" / "cells" / grid.cells()[0].cell
    cell_dir.mkdir(parents=True)
    where = dict(cell=grid.cells()[0].cell, slot=slot.index, phase=slot.phase, task=slot.task_id,
                 visit=slot.visit, exposure=slot.exposure, t=time.time())
    CellPaths(cell_dir).events.write_text(
        Event(type="instance_start", format=RECORDS_FORMAT, wiped_before=False, **where).line() + "\n"
        + Event(type="step", step=1, action={"action": "request_demos"}, outcome="correct", cost=0,
                **where).line() + "\n")
    resumed = subprocess.run([sys.executable, "-O", "-c", RESUME_UNDER_O, str(tmp_path / "grid.yaml"), str(cell_dir)],
                             capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])
    assert resumed.returncode == 3, resumed.stdout + resumed.stderr
    assert resumed.stdout.startswith("ReplayMismatch: ")
    assert "replay of slot 0 step 1 disagrees: the records say correct, the protocol answers demo" in resumed.stdout


def test_transcripts_are_one_appended_file_whose_last_member_counts_and_a_torn_one_is_skipped(tmp_path):
    """Cells and collective users keep one `transcripts.jsonl.gz`: a slot run again counts its
    later conversation, a member torn by a kill is skipped, an older run's
    `transcripts/<slot>.json` files are still read, and a whole member that is not a record is
    reported by name and line."""
    import gzip
    import json

    paths = CellPaths(tmp_path / "cell")
    paths.root.mkdir()
    paths.transcripts_legacy.mkdir()
    (paths.transcripts_legacy / "00000.json").write_text(json.dumps([{"user": "old run"}]))
    paths.append_transcript(1, [{"user": "first try"}])
    paths.append_transcript(1, [{"user": "run again"}])
    paths.append_transcript(2, {"game": "bt11", "conversation": []})  # an arc3 level's record
    assert paths.read_transcripts() == {0: [{"user": "old run"}], 1: [{"user": "run again"}],
                                        2: {"game": "bt11", "conversation": []}}
    whole = paths.transcripts_file.read_bytes()
    paths.append_transcript(3, [{"user": "killed while written"}])
    paths.transcripts_file.write_bytes(paths.transcripts_file.read_bytes()[:len(whole) + 20])
    assert sorted(paths.read_transcripts()) == [0, 1, 2]

    paths.transcripts_file.write_bytes(whole + gzip.compress(b'{"no slot": 1}\n'))
    found: list[tuple[str, str]] = []
    assert sorted(paths.read_transcripts(lambda name, what: found.append((name, what)))) == [0, 1, 2]
    assert found and found[0][0] == "transcripts.jsonl.gz" and "line 4" in found[0][1]
    with pytest.raises(ValueError, match="transcripts.jsonl.gz: line 4"):
        paths.read_transcripts()


def test_a_failure_kind_has_one_home_and_records_hold_its_string():
    """The harness's failure kinds are the records' (one Enum in orchestrator/protocol.py; it
    was a Literal there and a second Enum in harness_adapters/harness.py), and an event keeps
    the plain string, in memory and on disk."""
    from harness_adapters.harness import FailureKind as HarnessFailureKind
    from orchestrator.protocol import FailureKind

    assert HarnessFailureKind is FailureKind
    event = Event(type="instance_end", cell="c", slot=0, phase="stream", task="t", visit=0, exposure=0,
                  t=0.0, failure_kind=FailureKind.CRASH)
    assert type(event.failure_kind) is str and event.failure_kind == "crash"
    assert Event.model_validate_json(event.model_dump_json()).failure_kind == "crash"
    with pytest.raises(ValueError):
        Event(type="instance_end", cell="c", slot=0, phase="stream", task="t", visit=0, exposure=0,
              t=0.0, failure_kind="not a kind")
