"""Shared by the report tests: a cell folder of a run directory, written as the runner writes it."""

from pathlib import Path

from orchestrator.records import RunPaths
from orchestrator.run.grid_config import Cell


def new_cell_folder(run: Path, learner: str) -> tuple[str, Path]:
    """`run/cells/<cell>/` with its cell.json (medium effort, workstreams, seed 0, own track)."""
    settings = Cell(learner=learner, row="memory-on", model="carc-solver", effort="medium",
                    order="workstreams", seed=0, track="own")
    paths = RunPaths(run).cell(settings.cell)
    paths.root.mkdir(parents=True)
    settings.record().write(paths.settings)
    return settings.cell, paths.root
