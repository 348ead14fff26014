"""The conformance checks of a harness adapter.

The check functions are specified on hand-made cell folders (events.jsonl, journal/journal.jsonl,
snapshots/*.tar.gz written as the runner and the proxy write them), healthy and broken. The last
test runs the whole conformance of hermes-agent for real: its image, sandbox, proxy container and
the scripted model on the Docker bridge, and every check must pass.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from harness_adapters.scripted_model import NOTE
from orchestrator.records import Event
from orchestrator.run.conformance import (ConformanceCell, DockerObject, check_instances, check_journaling,
                                          check_no_leak_in_requests, check_no_leak_in_snapshots,
                                          check_note_kept, check_note_returns, check_teardown,
                                          check_verdict_in_conversation, docker_objects, report_table,
                                          run_conformance)
from proxy.journal import JournalEntry

A, B = "own-task-a", "own-task-b"
STREAM = [(A, 0), (A, 1), (B, 0), (B, 1)]  # slot -> (task, visit), as the sequential order runs


def entry(slot: int | None, phase: str, text: str, number: int, *, url: str = "/v1/chat/completions",
          status: int | None = 200, error: str | None = None, refused: bool = False) -> JournalEntry:
    api = "openai-chat" if url.endswith("/chat/completions") else "other"
    return JournalEntry(
        id=f"flow-{number}", cell="c", slot=slot, phase=phase, mode="reverse", method="POST",
        url=f"http://proxy:8081{url}", host="proxy", api=api, model="carc-scripted", stream=False,
        status=status, refused=refused, request={"messages": [{"role": "user", "content": text}]},
        response=None, t_start=float(number), t_first_byte=None, t_end=float(number) + 0.5,
        latency_s=0.5, error=error)


def snapshot(path: Path, files: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(f"./{name}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


def write_cell(folder: Path, remembers: bool, ends: list[int] | None = None,
               extra_lines: list[JournalEntry] = (), model_calls: int = 3) -> Path:
    """A cell as a well-behaved harness leaves it: per instance, an opening request (with the
    notes it remembers), a request after the model wrote this task's note, and the verdict in the
    same conversation. `remembers=False` is a memory-off harness."""
    events, lines, seen = [], [], []
    for slot, (task, visit) in enumerate(STREAM):
        memory = "\n".join(NOTE.format(task=t) for t in seen) if remembers else ""
        note = NOTE.format(task=task)
        base = 10 * slot
        lines += [entry(slot, "before", f"{memory}\nTask id: {task}\nTest input: [[1]]", base),
                  entry(slot, "before", f"Task id: {task}\ntool call: memory add {note!r}", base + 1),
                  entry(slot, "after", f"Task id: {task}\n{note}\nVerdict: correct.", base + 2)]
        seen = (seen + [task]) if task not in seen else seen
        kept = "\n".join(NOTE.format(task=t) for t in (seen if remembers else [task]))
        snapshot(folder / "snapshots" / f"{slot:05d}.tar.gz",
                 {"agent/MEMORY.md": kept, "agent/config.yaml": "x: 1"})
        common = dict(cell="c", slot=slot, phase="stream", task=task, visit=visit, exposure=visit, t=0.0)
        events.append(Event(type="instance_start", **common))
        events.append(Event(type="step", step=1, outcome="correct", over=True, **common))
        if ends is None or slot in ends:
            events.append(Event(type="instance_end", status="solved", model_calls=model_calls, **common))
    (folder / "journal").mkdir(parents=True, exist_ok=True)
    (folder / "journal" / "journal.jsonl").write_text(
        "".join(e.to_json() + "\n" for e in [*lines, *extra_lines]))
    (folder / "events.jsonl").write_text("".join(e.line() + "\n" for e in events))
    return folder


@pytest.fixture
def on(tmp_path) -> ConformanceCell:
    return ConformanceCell.load(write_cell(tmp_path / "on", remembers=True))


@pytest.fixture
def off(tmp_path) -> ConformanceCell:
    return ConformanceCell.load(write_cell(tmp_path / "off", remembers=False))


# --- persistence ----------------------------------------------------------------------------------

def test_memory_on_passes_when_the_first_note_is_kept_and_comes_back_on_the_return(on):
    kept, back = check_note_kept(on), check_note_returns(on)
    assert kept.ok and NOTE.format(task=A) in kept.reason
    assert back.ok and "slot 1" in back.reason


def test_a_harness_that_forgets_fails_both_persistence_checks_separately(tmp_path):
    forgetful = ConformanceCell.load(write_cell(tmp_path / "on", remembers=False))
    kept, back = check_note_kept(forgetful), check_note_returns(forgetful)
    assert not kept.ok and "has no" in kept.reason
    assert not back.ok and "opening request has no note" in back.reason


def test_the_model_writing_the_note_again_on_the_return_is_not_persistence(tmp_path):
    """Only the request that opens the instance counts: later ones carry the model's own tool call."""
    cell = ConformanceCell.load(write_cell(tmp_path / "on", remembers=False))
    assert NOTE.format(task=A) in cell.journal[4].request["messages"][0]["content"]  # slot 1, call 2
    assert not check_note_returns(cell).ok


# --- wipe -----------------------------------------------------------------------------------------

def test_memory_off_passes_when_no_earlier_note_is_seen(off):
    assert check_no_leak_in_requests(off).ok
    assert check_no_leak_in_snapshots(off).ok


def test_a_note_leaked_into_memory_off_fails_the_wipe_checks(tmp_path):
    leaky = ConformanceCell.load(write_cell(tmp_path / "off", remembers=True))
    requests, snapshots = check_no_leak_in_requests(leaky), check_no_leak_in_snapshots(leaky)
    assert not requests.ok and "slot 1 call 1" in requests.reason and A in requests.reason
    assert not snapshots.ok and f"slot 2 (task {B}) holds notes of ['{A}']" in snapshots.reason


# --- journaling -----------------------------------------------------------------------------------

def test_journaling_passes_with_404_probes_and_a_dropped_but_answered_call(on, off, tmp_path):
    extra = [entry(0, "before", "", 90, url="/api/tags", status=404, error="upstream answered HTTP 404"),
             entry(2, "after", "review", 91, error="Client disconnected.")]
    probed = ConformanceCell.load(write_cell(tmp_path / "probed", True, extra_lines=extra))
    check = check_journaling({"memory-on": probed, "memory-off": off})
    assert check.ok, check.reason
    assert "1 answered calls the harness hung up on" in check.reason


def test_a_refused_host_or_a_failed_call_fails_journaling(tmp_path, off):
    extra = [entry(1, "before", "", 90, url="/", status=403, refused=True,
                   error="host pypi.org:443 is not on the proxy's allowlist"),
             entry(2, "before", "x", 91, status=None, error="Connection refused")]
    bad = ConformanceCell.load(write_cell(tmp_path / "bad", True, extra_lines=extra))
    check = check_journaling({"memory-on": bad, "memory-off": off})
    assert not check.ok
    assert "pypi.org" in check.reason and "Connection refused" in check.reason


def test_more_calls_counted_by_the_learner_than_journaled_fails_journaling(tmp_path):
    counted = ConformanceCell.load(write_cell(tmp_path / "c", True, model_calls=5))
    check = check_journaling({"memory-on": counted})
    assert not check.ok and "counted 5 model calls, the journal has 3" in check.reason


def test_a_missing_journal_fails_journaling_with_the_path(on, tmp_path):
    (on.folder / "journal" / "journal.jsonl").unlink()
    check = check_journaling({"memory-on": ConformanceCell.load(on.folder)})
    assert not check.ok and "journal.jsonl: missing" in check.reason


def test_a_torn_journal_line_in_the_middle_is_a_failed_check_not_a_crash(on):
    path = on.folder / "journal" / "journal.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    records = ConformanceCell.load(on.folder)
    for check in (check_journaling({"memory-on": records}), check_note_returns(records),
                  check_verdict_in_conversation({"memory-on": records})):
        assert not check.ok and "journal.jsonl:2" in check.reason


# --- instances --------------------------------------------------------------------------------------

def test_every_instance_ending_once_passes(on, off):
    check = check_instances({"memory-on": on, "memory-off": off}, expected=4)
    assert check.ok and "0 malformed replies answered" in check.reason


def test_a_missing_instance_end_fails(tmp_path, off):
    short = ConformanceCell.load(write_cell(tmp_path / "short", True, ends=[0, 1, 3]))
    check = check_instances({"memory-on": short, "memory-off": off}, expected=4)
    assert not check.ok and "memory-on: instance_end missing for slots [2]" in check.reason


def test_a_learner_error_or_a_repeated_end_fails(on):
    path = on.folder / "events.jsonl"
    ends = [line for line in path.read_text().splitlines() if '"instance_end"' in line]
    error = Event(type="learner_error", cell="c", slot=3, phase="stream", task=B, visit=1,
                  exposure=1, t=0.0, error="learner error: KeyError: 'final'")
    path.write_text(path.read_text() + ends[0] + "\n" + error.line() + "\n")
    check = check_instances({"memory-on": ConformanceCell.load(on.folder)}, expected=4)
    assert not check.ok
    assert "repeated for [0]" in check.reason and "KeyError: 'final'" in check.reason


def test_an_empty_cell_folder_fails_every_check_with_a_reason(tmp_path):
    empty = ConformanceCell.load(tmp_path / "never-ran")
    checks = [check_note_kept(empty), check_note_returns(empty), check_no_leak_in_requests(empty),
              check_no_leak_in_snapshots(empty), check_journaling({"memory-on": empty}),
              check_instances({"memory-on": empty}, 4), check_verdict_in_conversation({"memory-on": empty})]
    assert all(not c.ok and "no cell folder" in c.reason for c in checks)


def test_a_corrupt_snapshot_fails_the_state_check_with_its_reason(on):
    on.snapshot(3).write_bytes(b"not a tarball")
    check = check_note_kept(on)
    assert not check.ok and "slot 3" in check.reason


# --- verdict and teardown -------------------------------------------------------------------------

def test_the_verdict_in_the_same_conversation_passes(on, off):
    check = check_verdict_in_conversation({"memory-on": on, "memory-off": off})
    assert check.ok and "memory-on: 4 of 4 instances" in check.reason


def test_a_verdict_sent_to_a_new_conversation_fails(tmp_path):
    folder = write_cell(tmp_path / "c", True)
    path = folder / "journal" / "journal.jsonl"
    path.write_text(path.read_text().replace("Task id: own-task-a\\ncarc-note", "carc-note")
                    .replace("Task id: own-task-b\\ncarc-note", "carc-note"))
    check = check_verdict_in_conversation({"memory-on": ConformanceCell.load(folder)})
    assert not check.ok and "no call after a verdict" in check.reason


def test_a_leftover_container_of_the_run_fails_teardown_and_other_runs_do_not_count():
    objects = [DockerObject("container", "carc-1-sandbox", {"org.carc.run": "conformance-x"}),
               DockerObject("volume", "carc-2-state", {"org.carc.run": "another-run"})]
    check = check_teardown("conformance-x", objects)
    assert not check.ok and "container carc-1-sandbox" in check.reason and "carc-2" not in check.reason
    assert check_teardown("conformance-y", objects).ok


def test_the_report_table_prints_a_harness_error_literally():
    from rich.console import Console

    from orchestrator.run.conformance import Check, ConformanceReport

    report = ConformanceReport("x", "run-1", Path("."), [
        Check("instances end once, replies parsed", False, "HarnessError: [timeout] [bold] no answer")])
    console = Console(width=200, record=True)
    console.print(report_table(report))
    text = console.export_text()
    assert "FAIL" in text and "[timeout] [bold] no answer" in text
    assert not report.ok and report.failures() == report.checks


# --- the real thing -------------------------------------------------------------------------------

@pytest.mark.docker
def test_docker_objects_finds_a_volume_left_with_the_run_label():
    """The teardown check's reader on a real engine: a labelled volume is seen, then removed."""
    import uuid

    from sandboxes.images import docker_client

    client, run = docker_client(), f"pytest-leftover-{uuid.uuid4().hex[:6]}"
    volume = client.volumes.create(f"carc-{run}-state", labels={"org.carc.run": run})
    try:
        check = check_teardown(run, docker_objects(client))
        assert not check.ok and f"volume carc-{run}-state" in check.reason
    finally:
        volume.remove(force=True)
    assert check_teardown(run, docker_objects(client)).ok


@pytest.mark.docker
@pytest.mark.slow
def test_hermes_agent_passes_every_conformance_check_for_real(tmp_path):
    from rich.console import Console

    report = run_conformance("hermes-agent", tmp_path)
    console = Console(width=160, record=True)
    console.print(report_table(report))
    assert report.ok, console.export_text()
    assert [c.name for c in report.checks] == [
        "stream ran", "persistence: note kept in state", "persistence: note back in a request",
        "wipe: no earlier note in requests", "wipe: snapshots hold only the current note",
        "journaling", "instances end once, replies parsed", "verdict in the same conversation",
        "clean teardown"]
    assert (report.run_dir / "conformance.json").exists()

