"""Shared by the report tests: a cell folder of a run directory, written as the runner writes it."""

import json
from pathlib import Path

from orchestrator.run.grid_config import Cell


def new_cell_folder(run: Path, learner: str) -> tuple[str, Path]:
    """`run/cells/<cell>/` with its cell.json (medium effort, workstreams, seed 0, own track)."""
    settings = Cell(learner=learner, row="memory-on", model="carc-solver", effort="medium",
                    order="workstreams", seed=0, track="own")
    folder = run / "cells" / settings.cell
    folder.mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps(settings.record()))
    return settings.cell, folder
