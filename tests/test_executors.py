"""One choice of executor for every kind of grid (orchestrator/run/executors.py): the CLI hands
any run folder to `executors.run`, which picks the regime's entry; a cell's slot driver is chosen
in one place for the local pool and the Ray executor alike."""

from __future__ import annotations

import importlib
import importlib.util
import textwrap
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, MachineError
from orchestrator.run import executors
from orchestrator.run.arc3_runner import Arc3CellRunner
from orchestrator.run.grid_config import load_grid
from orchestrator.run.run_folder import RunInterrupted
from orchestrator.run.cell_runner import CellRunner, cell_runner

GRIDS = {
    "own": "name: g\nseed: 1\ntrack: {name: own, tasks: 1, visits: 1, epilogue: 0}\nlearners: [stateless-floor]\n",
    "arc3": "name: g\nseed: 1\ntrack: {name: arc3, environments_dir: games, visits: 1}\nlearners: [arc3-explorer]\n",
    "collective": ("name: g\nseed: 1\ntrack: {name: own, tasks: 3, visits: 2, epilogue: 2}\n"
                   "collective: {users: 2, round_slots: 3}\n"
                   "learners: [{learner: program-library, row: collective}]\n"),
}


def run_folder(tmp_path: Path, kind: str) -> Path:
    run = tmp_path / kind
    (run / "cells").mkdir(parents=True)
    if kind == "arc3":
        meta = run / "games" / "fake" / "0001"
        meta.mkdir(parents=True)
        (meta / "metadata.json").write_text('{"game_id": "fake-0001", "baseline_actions": [2]}')
    (run / "grid.yaml").write_text(textwrap.dedent(GRIDS[kind]).replace("games", str(run / "games")))
    return run


@pytest.mark.parametrize("kind, driver", [("own", CellRunner), ("arc3", Arc3CellRunner)])
def test_a_cells_slot_driver_is_chosen_by_its_track_in_one_place(tmp_path, kind, driver):
    run = run_folder(tmp_path, kind)
    grid = load_grid(run / "grid.yaml")
    cell = grid.cells()[0]
    made = cell_runner(grid, cell, run / "cells" / cell.cell, "http://127.0.0.1:9/v1")
    assert type(made) is driver
    made.progress(1, 2)  # the Ray executor's attempts give no progress: a no-op, never None


@pytest.mark.parametrize("kind, executor, entry", [
    ("own", "local", "orchestrator.run.local_pool.execute"),
    ("arc3", "local", "orchestrator.run.local_pool.execute"),
    ("collective", "local", "orchestrator.run.collective.rounds.execute_collective"),
    ("own", "ray", "orchestrator.run.ray_executor.execute_ray_run"),
    ("arc3", "ray", "orchestrator.run.ray_executor.execute_ray_run"),
    ("collective", "ray", "orchestrator.run.collective.on_ray.execute_collective_ray"),
])
def test_every_grid_reaches_its_regimes_entry_and_a_ctrl_c_in_any_is_an_interrupted_run(
        tmp_path, monkeypatch, kind, executor, entry):
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        pytest.skip("the ray extra is not installed")
    module, name = entry.rsplit(".", 1)
    called = []

    def interrupted(run_dir, *args, **kwargs):
        called.append(run_dir)
        raise KeyboardInterrupt
    monkeypatch.setattr(importlib.import_module(module), name, interrupted)
    run = run_folder(tmp_path, kind)
    with pytest.raises(RunInterrupted, match=f"carc grid run --resume {run}"):
        executors.run(run, executor, show_progress=False)
    assert called == [run]


def test_an_executor_and_its_options_are_checked_before_anything_runs(monkeypatch):
    with pytest.raises(ConfigError, match="--executor dask: give one of local, ray"):
        executors.check("dask")
    with pytest.raises(ConfigError, match="--address and --durability are for --executor ray"):
        executors.check("local", address="10.0.0.1:6379")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MachineError, match=r"pip install 'carc\[ray\]'"):
        executors.check("ray")
