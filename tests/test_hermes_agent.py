"""hermes-agent, the real package in its real sandbox, through the real proxy, on the scripted model.

The scripted model writes a note naming the task with hermes' memory tool on every instance's
first message; hermes injects MEMORY.md into its system prompt, so on a returning instance the
note is back in the first request (memory-on) or not (memory-off: the volume is emptied).
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from harness_adapters.scripted_model import NOTE
from orchestrator.records import read_events
from proxy.journal import read_journal
from tests.docker_fixtures import check_journal_against_upstream, client, run_on_apis  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.slow]

@pytest.fixture(scope="module")
def run_dir(scripted_harness_run):
    """hermes-agent's rows of the scripted harness grid (tests/conftest.py)."""
    return scripted_harness_run


def cell(run: Path, row: str) -> Path:
    name = "hermes-agent" if row == "memory-on" else f"hermes-agent-{row}"
    return run / "cells" / f"{name}.low.sequential.s5"


def first_requests(cell_dir: Path) -> dict[int, str]:
    """The system prompt of each instance's first model call, by slot."""
    firsts: dict[int, str] = {}
    for entry in read_journal(cell_dir / "journal" / "journal.jsonl"):
        if entry.api == "openai-chat" and entry.slot is not None and entry.slot not in firsts:
            firsts[entry.slot] = entry.request["messages"][0]["content"]
    return firsts


def slot_tasks(cell_dir: Path) -> dict[int, tuple[str, int]]:
    return {e.slot: (e.task, e.visit) for e in read_events(cell_dir / "events.jsonl")
            if e.type == "instance_end"}


def test_every_instance_ends_once_in_both_rows(run_dir):
    for row in ("memory-on", "memory-off"):
        assert sorted(slot_tasks(cell(run_dir, row))) == [0, 1, 2, 3]


def test_memory_on_brings_the_note_back_on_a_returning_instance(run_dir):
    folder = cell(run_dir, "memory-on")
    firsts, tasks = first_requests(folder), slot_tasks(folder)
    for slot, (task, visit) in tasks.items():
        assert (NOTE.format(task=task) in firsts[slot]) == (visit > 0), (slot, task, visit)


def test_memory_off_never_sees_a_note_written_before(run_dir):
    folder = cell(run_dir, "memory-off")
    firsts = first_requests(folder)
    assert all("carc-note" not in prompt for prompt in firsts.values())


def test_the_state_volume_keeps_the_memory_file_only_in_the_memory_on_row(run_dir):
    def memory_file(cell_dir: Path, slot: int) -> str:
        with tarfile.open(cell_dir / "snapshots" / f"{slot:05d}.tar.gz") as tar:
            member = tar.extractfile("./hermes/memories/MEMORY.md")
            return member.read().decode()

    on, off = cell(run_dir, "memory-on"), cell(run_dir, "memory-off")
    tasks = {task for task, _ in slot_tasks(on).values()}
    # hermes keeps one entry per distinct text: one note per task in memory-on, the current one in memory-off
    assert sorted(memory_file(on, 3).split("\n§\n")) == sorted(NOTE.format(task=t) for t in tasks)
    assert memory_file(off, 3).count("carc-note") == 1


def test_the_verdict_reaches_hermes_in_the_same_conversation(run_dir):
    journal = read_journal(cell(run_dir, "memory-on") / "journal" / "journal.jsonl")
    after = [e for e in journal if e.api == "openai-chat" and e.phase == "after"]
    assert after, "no call after a verdict"
    for entry in after:
        texts = [str(m.get("content")) for m in entry.request["messages"]]
        assert any("Verdict:" in t for t in texts) and any("Task id:" in t for t in texts)


def user_messages(cell_dir: Path, phase: str) -> list[str]:
    """The last user message of each chat call in `phase` (journal request bodies)."""
    out = []
    for entry in read_journal(cell_dir / "journal" / "journal.jsonl"):
        if entry.api == "openai-chat" and entry.phase == phase:
            users = [m for m in entry.request["messages"] if m.get("role") == "user"]
            out.append(str(users[-1]["content"]) if users else "")
    return out


def test_the_ablation_messages_arrive_where_they_should(run_dir):
    from orchestrator.prompts import PromptSet
    prompts = PromptSet.load()
    invitation = prompts.render("store_invitation").strip()
    rules = prompts.render("program_procedure", programs_dir="/state/programs").strip()
    asked, procedure = cell(run_dir, "asked-to-store"), cell(run_dir, "program-procedure")
    assert any(invitation in m for m in user_messages(asked, "after"))
    assert not any(invitation in m for m in user_messages(asked, "before"))
    assert not any(invitation in m for m in user_messages(cell(run_dir, "memory-on"), "after"))
    firsts = first_user_messages(procedure)
    assert firsts and all(rules in m for m in firsts.values())
    assert any("/state/programs/" in m and "Now save the program" in m
               for m in user_messages(procedure, "after"))


def first_user_messages(cell_dir: Path) -> dict[int, str]:
    firsts: dict[int, str] = {}
    for entry in read_journal(cell_dir / "journal" / "journal.jsonl"):
        if entry.api == "openai-chat" and entry.slot is not None and entry.slot not in firsts:
            users = [m for m in entry.request["messages"] if m.get("role") == "user"]
            firsts[entry.slot] = str(users[0]["content"])
    return firsts


# hermes' own mapping of effort high on each API (docs/harnesses/hermes-agent.md, "Model APIs")
HERMES_EFFORT = {
    "openai-chat": {"reasoning_effort": "high"},
    "openai-responses": {"reasoning": {"effort": "high", "summary": "auto"}},
    "anthropic-messages": {"thinking": {"type": "enabled", "budget_tokens": 16000}},
}


@pytest.fixture(scope="module")
def on_each_api(client, tmp_path_factory):
    """One hermes-agent instance on each model API, the three runs side by side."""
    return run_on_apis(tmp_path_factory.mktemp("apis"), "hermes-agent", list(HERMES_EFFORT))


@pytest.mark.parametrize("api", list(HERMES_EFFORT))
def test_on_each_api_the_effort_reaches_the_wire_and_the_journal_counts_what_the_upstream_did(
        on_each_api, api):
    served, folder = on_each_api[api].result()
    calls = check_journal_against_upstream(folder, served, api)
    for entry in calls:
        for field, value in HERMES_EFFORT[api].items():
            assert entry.request.get(field) == value, (api, field, entry.request.get(field))
