"""Money: the run's price table (carc's, the grid's file, the model's own prices), dollars per
call in the journal and per instance in the results, and `limits.usd_per_cell`: a cell stops
cleanly at its cap, recorded, and continues exactly after the cap is raised.

Real components: the embedded model and a host mitmdump per cell (program checks in host
processes; no Docker).
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from orchestrator.analysis.report import write_report
from orchestrator.cli import app
from orchestrator.records import RunPaths, read_events
from orchestrator.run.grid_config import EFFECTIVE_PRICES, GridFileError, load_grid, price_table
from orchestrator.run.local_pool import execute
from orchestrator.run.run_folder import stopped_cells, set_usd_per_cell
from proxy.journal import read_journal

PRICE_IN, PRICE_OUT = 10.0, 30.0  # USD per million tokens, for the embedded model in these runs


def _grid(folder: Path, cap: float | None, prices: dict | None = None) -> Path:
    (folder / "prices.json").write_text(json.dumps(
        prices or {"models": {"carc-solver": {"input": PRICE_IN, "output": PRICE_OUT}}}))
    limits = f"limits: {{usd_per_cell: {cap}}}\n" if cap else ""
    grid = folder / "grid.yaml"
    grid.write_text(textwrap.dedent("""\
        name: money
        seed: 1
        track: {name: own, tasks: 3, visits: 2, epilogue: 0, fresh_reference: false}
        efforts: [low]
        learners: [stateless-floor]
        sandbox: {engine: process}
        prices: prices.json
        workers: 1
        """) + limits)
    return grid


def _start(tmp_path: Path, cap: float | None) -> Path:
    from orchestrator.run.grid_config import write_run_grid
    grid_file = _grid(tmp_path, cap)
    run = tmp_path / "runs" / "money"
    (run / "cells").mkdir(parents=True)
    write_run_grid(load_grid(grid_file), grid_file, run)
    return run


def test_the_run_prices_by_carcs_table_then_the_grids_file_then_the_models_own(tmp_path):
    grid = load_grid(_grid(tmp_path, None, {"models": {"carc-solver": {"input": 1, "output": 2},
                                                        "gpt-4o": {"input": 99, "output": 99}}}))
    table = price_table(grid)
    assert (table.lookup("carc-solver").input_per_m, table.lookup("gpt-4o").output_per_m) == (1, 99)
    assert table.lookup("gpt-4o-mini").input_per_m == 0.15  # carc's own entry stands
    grid.model.output_usd_per_mtok = 7.0
    table = price_table(grid)
    assert (table.lookup("carc-solver").input_per_m, table.lookup("carc-solver").output_per_m) == (1, 7)


def test_a_broken_prices_file_is_refused_with_its_line(tmp_path):
    grid = _grid(tmp_path, None, {"models": {"carc-solver": {"input": "cheap"}}})
    with pytest.raises(GridFileError) as err:
        load_grid(grid)
    assert f"{grid}:7: prices:" in str(err.value) and "carc-solver" in str(err.value)


@pytest.mark.slow
def test_a_cell_stops_at_its_dollar_cap_and_continues_exactly_after_it_is_raised(tmp_path):
    run = _start(tmp_path, cap=0.3)
    assert json.loads((run / EFFECTIVE_PRICES).read_text())["models"]["carc-solver"] == \
        {"input": PRICE_IN, "output": PRICE_OUT}
    execute(run, show_progress=False)
    cell = RunPaths(run).cell_folders()[0]
    assert stopped_cells(run) == [cell.name]
    events = read_events(cell.events)
    stop = [e for e in events if e.type == "stopped"]
    ends = [e for e in events if e.type == "instance_end"]
    assert len(stop) == 1 and 0 < len(ends) < 6
    assert stop[0].slot == ends[-1].slot + 1 and "limits.usd_per_cell" in stop[0].reason
    journal = read_journal(cell.journal / "journal.jsonl")
    for entry in journal:  # the journal prices every call by the run's table
        assert entry.cost_usd == pytest.approx(
            (entry.prompt_tokens * PRICE_IN + entry.completion_tokens * PRICE_OUT) / 1e6)
    spent = sum(e.cost_usd for e in journal)
    assert stop[0].cost_usd == pytest.approx(spent) and spent >= 0.3
    before_last = sum(e.cost_usd for e in journal if e.slot != ends[-1].slot)
    assert before_last < 0.3  # it stopped at the first instance boundary past the cap
    assert sum(e.cost_usd for e in ends) == pytest.approx(spent)  # the learner counts as the proxy
    text = write_report(run, resamples=200).read_text()
    assert "## Cells stopped at their dollar cap" in text
    instances = pd.read_parquet(run / "results" / "instances.parquet")
    assert instances["usd"].sum() == pytest.approx(spent)

    set_usd_per_cell(run, 1000)
    assert load_grid(RunPaths(run).grid).limits.usd_per_cell == 1000
    execute(run, show_progress=False)
    events = read_events(cell.events)
    assert Counter(e.slot for e in events if e.type == "instance_end") == Counter(range(6))
    assert stopped_cells(run) == []
    assert "## Cells stopped" not in write_report(run, resamples=200).read_text()


@pytest.mark.slow
def test_usd_per_cell_is_set_on_resume_from_the_command_line(tmp_path):
    run = _start(tmp_path, cap=None)
    out = CliRunner().invoke(app, ["grid", "run", "--resume", str(run), "--usd-per-cell", "0.0001",
                                   "--no-report"])
    assert out.exit_code == 0, out.output
    assert "stopped at limits.usd_per_cell" in out.output
    events = read_events(RunPaths(run).cell_folders()[0].events)
    assert [e.type for e in events if e.type in ("instance_end", "stopped")] == ["instance_end", "stopped"]
    out = CliRunner().invoke(app, ["grid", "run", "--resume", str(run), "--usd-per-cell", "-1"])
    assert out.exit_code == 2 and "positive" in out.output
