"""A ladder grid end to end through the real proxy: every model call is in the journal.

Real components only: the embedded solver model server, a host mitmdump per cell, and (for the
program library) a Docker container with no network for the program checks.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.records import read_events
from orchestrator.run.local_pool import execute
from proxy.journal import read_journal
from tests.test_runner import make_run

pytestmark = [pytest.mark.slow, pytest.mark.docker]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = make_run(tmp_path_factory.mktemp("journaled"), "journaled")
    execute(run, show_progress=False)
    return run


def server_ledger(run: Path) -> list[dict]:
    lines = []
    for path in sorted((run / "logs").glob("model-usage-*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def test_journal_token_totals_equal_the_model_servers_own_count(run_dir):
    entries = [e for cell in (run_dir / "cells").iterdir()
               for e in read_journal(cell / "journal" / "journal.jsonl")]
    ledger = server_ledger(run_dir)
    assert len(entries) == len(ledger) > 0
    assert sum(e.prompt_tokens or 0 for e in entries) == sum(x["prompt_tokens"] for x in ledger)
    assert sum(e.completion_tokens or 0 for e in entries) == sum(x["completion_tokens"] for x in ledger)
    assert all(e.status == 200 and not e.refused and e.error is None for e in entries)


def test_every_model_call_a_learner_made_is_a_journal_line_of_its_slot(run_dir):
    for cell in sorted((run_dir / "cells").iterdir()):
        events = read_events(cell / "events.jsonl")
        calls_per_slot = Counter()
        for event in events:
            if event.type == "step" and event.model_calls:
                calls_per_slot[event.slot] += event.model_calls
        journal = read_journal(cell / "journal" / "journal.jsonl")
        assert Counter(e.slot for e in journal) == calls_per_slot, cell.name
        assert {e.cell for e in journal} == {cell.name}
        assert {e.phase for e in journal} <= {"before", "after"}


def test_the_learner_never_held_a_key_and_raw_bytes_are_kept(run_dir):
    cell = next(d for d in (run_dir / "cells").iterdir() if d.name.startswith("program-library."))
    entry = read_journal(cell / "journal" / "journal.jsonl")[0]
    assert (cell / "journal" / entry.raw_request).exists()
    assert (cell / "journal" / entry.raw_response).exists()
    assert entry.request["model"] == "carc-solver" and entry.api == "openai-chat"


def test_program_checks_ran_in_a_docker_sandbox(run_dir):
    for cell in (run_dir / "cells").iterdir():
        record = json.loads((cell / "sandbox.json").read_text())
        assert record["proxy"] == "host-mitmdump"
        expected = "docker" if cell.name.startswith("program-library") else "host-process"
        assert record["program_checks"] == expected, cell.name


def test_no_container_of_the_run_is_left_behind(run_dir):
    import docker
    client = docker.from_env()
    assert client.containers.list(all=True, filters={"label": f"org.carc.run={run_dir.name}"}) == []


def test_the_report_has_the_journal_section_with_every_call(run_dir):
    from orchestrator.analysis.report import write_report
    text = write_report(run_dir, resamples=200).read_text()
    assert "## Model calls and dollars (proxy journal)" in text
    calls = len(server_ledger(run_dir))
    section = text.split("## Model calls and dollars (proxy journal)")[1].split("\n## ")[0]
    counted = [int(line.split("|")[2]) for line in section.splitlines()
               if line.startswith("|") and "." in line.split("|")[1]]
    assert sum(counted) == calls


def test_a_grid_without_docker_or_proxy_runs_with_host_program_checks(tmp_path):
    """sandbox.engine: process and proxy.journal: false are honoured (and recorded per cell)."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("name: nodocker\nseed: 1\ntrack: {name: own, tasks: 2, visits: 2, epilogue: 0,"
                    " fresh_reference: false}\nefforts: [low]\nlearners: [program-library]\n"
                    "sandbox: {engine: process}\nproxy: {journal: false}\nworkers: 1\n")
    run = tmp_path / "runs" / "nodocker"
    (run / "cells").mkdir(parents=True)
    (run / "grid.yaml").write_text(grid.read_text())
    execute(run, show_progress=False)
    cell = next((run / "cells").iterdir())
    record = json.loads((cell / "sandbox.json").read_text())
    assert (record["proxy"], record["program_checks"]) == (None, "host-process")
    assert record["model_base_url"] == record["upstream"]
    assert not (cell / "journal").exists()
    assert sum(e.type == "instance_end" for e in read_events(cell / "events.jsonl")) == 4
