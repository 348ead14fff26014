"""The positive control, live: hermes-agent (the real package in its Docker sandbox, behind the
real proxy) on the embedded model acting as a diligent tool-using agent.

On a stream with returns (3 own tasks x 4 visits: three returns per task outweigh the sampling
noise of the paired first meetings), a row whose stored material comes back must
save budget against its memory-off twin with a paired interval over tasks that excludes zero
(`measures.twin_table`), and the inspector must show the material reaching the model; the same
procedure with the material wiped before every instance must save nothing.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from orchestrator.analysis import measures
from orchestrator.analysis.report import load_run
from proxy.journal import read_journal
from stores_inspector import inspect_run
from tests.docker_fixtures import client  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.slow]

GRID = """\
name: positive-control
seed: 3
track: {name: own, tasks: 3, visits: 4, epilogue: 0, fresh_reference: false}
orders: [sequential]
model: {endpoint: embedded, name: carc-solver}
efforts: [low]
learners:
  - {learner: hermes-agent, row: memory-off}
  - {learner: hermes-agent, row: asked-to-store}
  - {learner: hermes-agent, row: program-procedure}
  - {learner: hermes-agent, row: program-procedure-wiped}
limits: {max_malformed: 20, wall_clock_s: 600}
workers: 4
"""


@pytest.fixture(scope="module")
def run_dir(client, tmp_path_factory):
    from orchestrator.run.local_pool import execute
    run = tmp_path_factory.mktemp("control") / "runs" / "positive-control"
    (run / "cells").mkdir(parents=True)
    (run / "grid.yaml").write_text(GRID)
    start = time.monotonic()
    execute(run, show_progress=False)
    print(f"\npositive control grid: {time.monotonic() - start:.0f} s wall")
    return run


@pytest.fixture(scope="module")
def twins(run_dir):
    cells, events = load_run(run_dir)
    frame = measures.instances_frame(events, cells)
    table = measures.twin_table(frame, measures.TaskResamples(np.random.default_rng(0), 2000))
    print(table[["label", "twin", "twin_mean", "twin_lo", "twin_hi", "twin_pairs"]].to_string())
    return table.set_index("row")


def test_asking_hermes_to_store_saves_budget_against_memory_off(twins, run_dir):
    # The note carries pairs always and a program only once one was verified; a return after a
    # failed first meeting holds stored pairs but must search again, at low effort as noisy as the
    # first meeting. So the robust claims are these two; the interval is printed, as measured.
    saving = twins.loc["asked-to-store"]
    assert saving["twin_mean"] < 0, saving.to_dict()
    cells, events = load_run(run_dir)
    frame = measures.instances_frame(events, cells)
    asked = frame[frame["row"] == "asked-to-store"].sort_values("slot")
    solved_before: set[str] = set()
    for _, instance in asked.iterrows():
        if instance["task"] in solved_before:
            assert instance["cost"] == 0, instance.to_dict()
        if instance["status"] == "solved":
            solved_before.add(instance["task"])


def test_the_program_procedure_saves_budget_against_itself_wiped(twins):
    saving = twins.loc["program-procedure"]
    assert saving["twin_hi"] < 0, saving.to_dict()


def test_the_procedure_with_its_material_wiped_saves_nothing(twins):
    wiped = twins.loc["program-procedure-wiped"]
    assert not wiped["twin_hi"] < 0, wiped.to_dict()  # its interval does not exclude zero below


def test_the_inspector_shows_the_stored_note_coming_back_on_returns(run_dir):
    returns = inspect_run(run_dir).tables["returns"]
    asked = returns[returns["cell"].str.contains("asked-to-store")]
    back = asked[asked["returning"]]
    assert len(back) and back["reached"].all(), back[["slot", "task", "reached", "reached_via"]]
    assert (back["cost0"]).mean() > 0.5
    off = returns[returns["cell"].str.contains("memory-off")]
    assert not off["reached"].any()


def test_the_program_file_comes_back_through_the_exec_tool_only_when_kept(run_dir):
    def outputs(cell: str) -> int:
        journal = read_journal(run_dir / "cells" / cell / "journal" / "journal.jsonl")
        return sum(1 for e in journal if e.api == "openai-chat" and e.request and any(
            m.get("role") == "tool" and "carc-output task" in str(m.get("content"))
            for m in e.request.get("messages", [])[-2:]))
    kept = outputs("hermes-agent-program-procedure.low.sequential.s3")
    wiped = outputs("hermes-agent-program-procedure-wiped.low.sequential.s3")
    assert kept > 0 and wiped == 0


def test_the_inspector_shows_the_program_file_kept_run_and_found_only_when_kept(run_dir):
    result = inspect_run(run_dir)
    returns, timeline = result.tables["returns"], result.tables["timeline"]
    kept_cell = "hermes-agent-program-procedure.low.sequential.s3"
    files = timeline[(timeline["cell"] == kept_cell) & (timeline["kind"] == "program file")]
    assert len(files) and (files["mechanism"] == "agent tool call").all(), files[["slot", "mechanism", "evidence"]]
    kept = returns[(returns["cell"] == kept_cell) & returns["returning"]]
    assert kept["looked"].all() and kept["found"].all(), kept[["slot", "task", "looked", "lookups", "found"]]
    wiped = returns[returns["cell"] == "hermes-agent-program-procedure-wiped.low.sequential.s3"]
    assert wiped["looked"].all() and not wiped["found"].any()
    overview = result.markdown.split("## Per harness and row", 1)[1].split("\n## ", 1)[0]
    line = next(line for line in overview.splitlines() if line.startswith(f"| {kept_cell} "))
    assert "agent tool call" in line and "hermes-agent-program-procedure-wiped" in line, line
