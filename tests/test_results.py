"""Results as data: `results/instances.parquet` and `results/measures.parquet` load in pandas and
reproduce every number of report.md; `carc results` exports them; `carc compare` pairs two runs.

The real run is a small ladder grid on the embedded model through the journaling host proxy
(program checks in host processes: no Docker needed), so the compute columns come from a real
journal.
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.analysis import measures, results, tables
from orchestrator.analysis.compare import NothingToCompare, compare_runs
from orchestrator.analysis.report import load_run, write_report
from orchestrator.cli import app
from orchestrator.records import Event, EventLog, RunPaths, read_events
from orchestrator.run.collective.rounds import execute_collective
from orchestrator.run.local_pool import execute
from proxy.journal import read_journal

GRID = """\
name: results
seed: 2
track: {name: own, tasks: 3, visits: 2, epilogue: 2, fresh_reference: true}
orders: [workstreams]
efforts: [low]
learners: [stateless-floor, demo-cache-floor]
sandbox: {engine: process}
workers: 2
"""
NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?")


def _ran(folder: Path, grid: str, execute_grid) -> Path:
    """A run folder `folder`/runs/small of `grid`, run to its end by `execute_grid`."""
    run = folder / "runs" / "small"
    (run / "cells").mkdir(parents=True)
    (run / "grid.yaml").write_text(textwrap.dedent(grid))
    execute_grid(run, show_progress=False)
    return run


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = _ran(tmp_path_factory.mktemp("results"), GRID, execute)
    write_report(run, seed=0, resamples=2_000)
    return run


def _tables(text: str) -> list[list[list[str]]]:
    """The data rows of every markdown table of a report, as lists of cell strings."""
    found, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if current is None:
                current = []
            elif not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current is not None:
            found.append(current)
            current = None
    return found + ([current] if current else [])


def _spellings(value: float) -> set[str]:
    """Every way the report writes a number: percent (one decimal, signed or not), counts with
    separators, two, three or four decimals."""
    if not np.isfinite(value):
        return set()
    out = {f"{value:,.0f}", f"{value:,.1f}", f"{value:,.2f}", f"{value:,.3f}", f"{value:,.4f}"}
    out |= {f"{100 * value:.1f}", f"{100 * value:+.1f}", f"{100 * value:+.1f}".replace("+", "")}
    return out


@pytest.mark.slow
def test_every_number_of_the_report_is_in_the_parquet_files(run):
    long = pd.read_parquet(run / "results" / "measures.parquet")
    instances = pd.read_parquet(run / "results" / "instances.parquet")
    known = set()
    for column in ("value", "lo", "hi"):
        for value in long[column].dropna():
            known |= _spellings(float(value))
    keys = {str(v) for c in long.columns if c not in results.LONG for v in long[c].dropna()}
    text = (run / "report.md").read_text()
    checked = 0
    for table in _tables(text):
        for row in table:
            for cell in row:
                if cell in keys or cell == "–":
                    continue
                for number in NUMBER.findall(cell):
                    assert number in known, f"{number!r} of {cell!r} (row {row[0]}) is in no parquet value"
                    checked += 1
    assert checked > 150
    # the instance table reproduces the per-cell budget and solved shares by itself
    cells = long[long["table"] == "cells"]
    stream = instances[instances["phase"] == "stream"].groupby("cell")
    for measure, column in (("budget", "share"), ("solved", "solved")):
        stated = cells[cells["measure"] == measure].set_index("cell")["value"]
        assert np.allclose(stated.sort_index(), stream[column].mean().sort_index())
    assert (cells[cells["measure"] == "n"].set_index("cell")["value"].sort_index()
            == stream.size().sort_index()).all()


@pytest.mark.slow
def test_instances_hold_every_finished_instance_with_the_journals_compute(run):
    instances = pd.read_parquet(run / "results" / "instances.parquet")
    for folder in RunPaths(run).cell_folders():
        ends = [e for e in read_events(folder.events) if e.type == "instance_end"]
        mine = instances[instances["cell"] == folder.name].set_index("slot")
        assert sorted(mine.index) == sorted(e.slot for e in ends)
        for e in ends:
            assert (mine.at[e.slot, "task"], mine.at[e.slot, "cost"], mine.at[e.slot, "pairs"],
                    mine.at[e.slot, "wrong_answers"]) == (e.task, e.cost, e.demos_used, e.attempts_used)
        journal = read_journal(folder.journal / "journal.jsonl")
        finished = {e.slot for e in ends}
        assert mine["calls"].sum() == sum(1 for j in journal if j.slot in finished)
        assert mine["input_tokens"].sum() == sum(j.prompt_tokens or 0 for j in journal if j.slot in finished)
        assert (mine["compute_source"] == "journal").all()
    assert set(instances["phase"]) == {"stream", "epilogue", "fresh"}


@pytest.mark.slow
def test_measures_round_trip_every_table_exactly(run):
    cells, events = load_run(run)
    frame = measures.instances_frame(events, cells)
    computed = tables.run_measures(frame, cells, measures.TaskResamples(np.random.default_rng(0), 500), 500)
    long, layout = results.to_long(computed)
    path = run / "round-trip.parquet"
    results.write_measures(path, long, layout)
    back = results.read_tables(path)
    assert list(back) == list(computed)
    for name, table in computed.items():
        pd.testing.assert_frame_equal(back[name], table, obj=name)


@pytest.mark.slow
def test_carc_results_exports_csv_and_json(run, tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["results", str(run), "--format", "csv", "--out", str(tmp_path / "csv")])
    assert out.exit_code == 0, out.output
    csv = pd.read_csv(tmp_path / "csv" / "instances.csv")
    assert len(csv) == len(pd.read_parquet(run / "results" / "instances.parquet"))
    out = runner.invoke(app, ["results", str(run), "--format", "json", "--out", str(tmp_path / "json")])
    assert out.exit_code == 0, out.output
    for name in ("instances", "measures"):
        records = json.loads((tmp_path / "json" / f"{name}.json").read_text())
        parquet = pd.read_parquet(run / "results" / f"{name}.parquet")
        assert len(records) == len(parquet)
        floats = [(record[column], value) for record, row in zip(records, parquet.to_dict("records"))
                  for column, value in row.items() if isinstance(value, float) and np.isfinite(value)]
        assert len(floats) > 50
        assert [a for a, b in floats if a != b] == [], f"{name}.json rounds numbers of the parquet"
    assert runner.invoke(app, ["results", str(run), "--format", "xlsx"]).exit_code == 2


def test_json_output_reads_back_every_double_exactly_and_missing_values_as_null(tmp_path):
    doubles = [0.1 + 0.2, 1 / 3, 2 / 3 * 1e-7, 123456.78901234567, 5e-324, -0.0078125]
    frame = pd.DataFrame({"value": [*doubles, np.nan, np.inf],
                          "count": pd.array([1, 2, 3, 4, 5, 6, None, 8], dtype="Int64"),
                          "cell": ["a", "b", "c", "d", "e", "f", None, "h"]})
    results.write_frame(frame, tmp_path / "table.json")
    records = json.loads((tmp_path / "table.json").read_text())
    assert [r["value"] for r in records] == [*doubles, None, None]
    assert records[6] == {"value": None, "count": None, "cell": None}
    assert records[7] == {"value": None, "count": 8, "cell": "h"}


def _rewrite_events(path: Path, change) -> None:
    """Another run's record of the same schedule: every event of the log at `path` through
    `change` (an event, or None to leave it out)."""
    events = read_events(path)
    path.unlink()
    with EventLog(path) as log:
        for e in events:
            if (changed := change(e)) is not None:
                log.append(changed)


def _rewrite_costs(path: Path, costs: dict[int, int]) -> None:
    """The stream instances at these slots of the log cost differently (and are solved when
    cheaper than 16)."""
    _rewrite_events(path, lambda e: e.model_copy(update={
        "cost": costs[e.slot], "status": "failed" if costs[e.slot] == 16 else "solved"})
        if e.type == "instance_end" and e.phase == "stream" and e.slot in costs else e)


@pytest.mark.slow
def test_compare_pairs_the_same_schedule_across_runs(run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(run, other)
    floor = "stateless-floor.low.workstreams.s2"
    ends = {e.slot: e for e in read_events(RunPaths(run).cell(floor).events)
            if e.type == "instance_end" and e.phase == "stream"}
    changed = {slot: 0 if e.cost else 16 for slot, e in list(ends.items())[:3]}
    _rewrite_costs(RunPaths(other).cell(floor).events, changed)
    table = compare_runs(run, other, np.random.default_rng(0), 1_000).set_index("cell_a")
    expected = np.mean([(ends[s].cost - changed.get(s, ends[s].cost)) / 16 for s in ends])
    assert table.at[floor, "pairs"] == len(ends)
    assert table.at[floor, "mean"] == pytest.approx(expected)
    assert table.at[floor, "lo"] <= expected <= table.at[floor, "hi"]
    demo = "demo-cache-floor.low.workstreams.s2"
    assert (table.at[demo, "mean"], table.at[demo, "lo"], table.at[demo, "hi"]) == (0, 0, 0)
    out = CliRunner().invoke(app, ["compare", str(run), str(other), "--resamples", "500",
                                   "--out", str(tmp_path / "cmp.parquet")])
    assert out.exit_code == 0, out.output
    assert len(pd.read_parquet(tmp_path / "cmp.parquet")) == 2


@pytest.mark.slow
def test_compare_refuses_to_pair_slots_that_serve_different_instances(run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(run, other)
    floor = "stateless-floor.low.workstreams.s2"
    _rewrite_events(RunPaths(other).cell(floor).events,
                    lambda e: e.model_copy(update={"task": "another-task"}) if e.slot == 0 else e)
    table = compare_runs(run, other, np.random.default_rng(0), 200).set_index("cell_a")
    assert "not on the same schedule" in table.at[floor, "problem"]
    assert table.at[floor, "pairs"] == 0
    assert pd.isna(table.at["demo-cache-floor.low.workstreams.s2", "problem"])


@pytest.mark.slow
def test_compare_fails_when_no_finished_slot_of_one_run_is_finished_in_the_other(run, tmp_path):
    early, late = tmp_path / "early", tmp_path / "late"
    for copy, keep in ((early, lambda slot: slot < 3), (late, lambda slot: slot >= 3)):
        shutil.copytree(run, copy)
        for folder in RunPaths(copy).cell_folders():
            _rewrite_events(folder.events, lambda e: e if e.phase != "stream" or keep(e.slot) else None)
    with pytest.raises(NothingToCompare, match="no stream slot of .*early is finished in .*late too"):
        compare_runs(early, late, np.random.default_rng(0), 200)


# --- collective runs: the same files, one stream per user ---------------------------------------

COLLECTIVE = """\
name: results-collective
seed: 5
track: {name: own, tasks: 2, visits: 2, epilogue: 2}
collective: {users: 2, round_slots: 2}
efforts: [low]
learners: [stateless-floor, {learner: demo-cache-floor, row: collective}]
sandbox: {engine: process}
workers: 2
"""
COLLECTIVE_USERS, COLLECTIVE_STREAM = 2, 2 * 2


@pytest.fixture(scope="module")
def collective_run(tmp_path_factory) -> Path:
    """Two users of two rows on the embedded model, about 15 s."""
    return _ran(tmp_path_factory.mktemp("collective"), COLLECTIVE, execute_collective)


@pytest.mark.slow
def test_compare_pairs_two_collective_runs_user_by_user_on_every_slot(collective_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(collective_run, other)
    floor = "stateless-floor.low.workstreams.s5"
    users = RunPaths(collective_run).cell(floor).user_folders()
    ends = {(user.number, e.slot): e for user in users for e in read_events(user.events)
            if e.type == "instance_end" and e.phase == "stream"}
    assert len(ends) == COLLECTIVE_USERS * COLLECTIVE_STREAM
    changed = {slot: 0 if e.cost else 16 for (number, slot), e in ends.items() if number == 1 and slot < 3}
    _rewrite_costs(RunPaths(other).cell(floor).user_folders()[1].events, changed)
    table = compare_runs(collective_run, other, np.random.default_rng(0), 1_000).set_index("cell_a")
    after = {key: changed[key[1]] if key[0] == 1 and key[1] in changed else e.cost for key, e in ends.items()}
    assert table.at[floor, "pairs"] == len(ends)
    assert table.at[floor, "budget_a"] == pytest.approx(np.mean([e.cost / 16 for e in ends.values()]))
    assert table.at[floor, "budget_b"] == pytest.approx(np.mean([cost / 16 for cost in after.values()]))
    differences = [(e.cost - after[key]) / 16 for key, e in ends.items()]
    assert table.at[floor, "mean"] == pytest.approx(np.mean(differences))
    demo = "demo-cache-floor-collective.low.workstreams.s5"
    assert (table.at[demo, "pairs"], table.at[demo, "mean"]) == (len(ends), 0)
    out = CliRunner().invoke(app, ["compare", str(collective_run), str(other), "--resamples", "200",
                                   "--out", str(tmp_path / "cmp.json")])
    assert out.exit_code == 0, out.output
    assert "–" not in out.output
    assert [r["pairs"] for r in json.loads((tmp_path / "cmp.json").read_text())] == [len(ends)] * 2


@pytest.mark.slow
def test_compare_fails_naming_the_run_that_has_no_finished_instance(collective_run, tmp_path):
    empty = tmp_path / "empty"
    shutil.copytree(collective_run, empty)
    for cell in RunPaths(empty).cell_folders():
        for user in cell.user_folders():
            user.events.unlink()
    out = CliRunner().invoke(app, ["compare", str(collective_run), str(empty), "--resamples", "200"])
    assert out.exit_code != 0
    assert f"{empty}: no finished stream instance in any of its 2 cells" in " ".join(out.output.split())


@pytest.mark.slow
def test_a_collective_runs_instances_have_the_grids_columns_plus_user_and_round(run, collective_run):
    out = CliRunner().invoke(app, ["results", str(collective_run), "--resamples", "200"])
    assert out.exit_code == 0, out.output
    grid = pd.read_parquet(run / "results" / "instances.parquet")
    collective = pd.read_parquet(collective_run / "results" / "instances.parquet")
    assert list(collective.columns) == list(grid.columns) == list(results.INSTANCE_COLUMNS)
    schema = {name: pq.read_schema(path / "results" / "instances.parquet").remove_metadata()
              for name, path in (("grid", run), ("collective", collective_run))}
    assert schema["collective"] == schema["grid"]
    assert grid["user"].isna().all() and grid["round"].isna().all()
    assert len(collective) == 2 * COLLECTIVE_USERS * (COLLECTIVE_STREAM + 2)
    assert sorted(collective["user"].unique()) == list(range(COLLECTIVE_USERS))
    assert (collective["compute_source"] == "journal").all()
    for folder in RunPaths(collective_run).cell_folders():
        calls = Counter((j.user, j.slot) for j in read_journal(folder.journal / "journal.jsonl")
                        if j.slot is not None and not j.refused)
        mine = collective[collective["cell"] == folder.name]
        assert {(u, s): c for u, s, c in zip(mine["user"], mine["slot"], mine["calls"])} == \
            {key: calls[key] for key in zip(mine["user"], mine["slot"])}
        for user in folder.user_folders():
            ends = {e.slot: e for e in read_events(user.events) if e.type == "instance_end"}
            theirs = mine[mine["user"] == user.number].set_index("slot")
            assert {s: (theirs.at[s, "round"], theirs.at[s, "pairs"], theirs.at[s, "wrong_answers"])
                    for s in ends} == {s: (e.round, e.demos_used, e.attempts_used) for s, e in ends.items()}
