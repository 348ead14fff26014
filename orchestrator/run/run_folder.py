"""A run's folder as every executor opens it: `runs/<run-id>/` holding the validated grid
(`open_run`; the folder's layout is orchestrator/records.py), what a resumed run may change
(`set_usd_per_cell`), and what a run needs before its first cell (`prepare_sandboxes`).
"""

from __future__ import annotations

from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

import structlog
import yaml

from harness_adapters import registry
from orchestrator.errors import ConfigError
from orchestrator.records import RunPaths
from orchestrator.run.grid_config import HARNESSES, GridConfig, grid_differences, load_grid, write_run_grid
from sandboxes.engines import sandbox_engine

log = structlog.get_logger("carc.grid")


class RunInterrupted(Exception):
    """The run was stopped (Ctrl-C, SIGTERM): its workers are gone, its containers, volumes and
    networks pruned; every record written stands and `--resume` continues from them."""

    def __init__(self, run_dir: Path):
        super().__init__(f"interrupted; continue with `carc grid run --resume {run_dir}`")
        self.run_dir = run_dir



class GridMismatch(ConfigError):
    """A run folder was asked to continue with a grid other than the one it was started with."""



def stopped_cells(run_dir: Path) -> list[str]:
    """The cells of a run whose latest record is a stop at limits.usd_per_cell."""
    from orchestrator.records import last_stop, read_events
    return [cell.name for cell in RunPaths(run_dir).cell_folders()
            if cell.events.exists() and last_stop(read_events(cell.events)) is not None]



def set_usd_per_cell(run_dir: Path, usd: float) -> None:
    """Change the stored grid's limits.usd_per_cell (the one field a run may change: it decides
    when a cell stops, never what a verdict is)."""
    if not usd > 0:
        raise ConfigError(f"--usd-per-cell {usd}: give a positive number of dollars")
    path = RunPaths(run_dir).grid
    grid = load_grid(path)
    grid.limits.usd_per_cell = usd
    text = path.read_text()
    data = yaml.safe_load(text)
    data.setdefault("limits", {})["usd_per_cell"] = float(usd)
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header + yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)
    log.info("usd_per_cell_set", run=str(run_dir), usd=usd)



def open_run(grid_path: Path, runs_dir: Path, run_id: str | None = None) -> Path:
    """Create `runs/<run-id>/` holding the validated grid. A run id that exists is continued when the grid is the
    same one (limits.usd_per_cell may differ: the stored one is raised or lowered to it), and
    refused naming the differences when not."""
    grid = load_grid(grid_path)
    run = RunPaths(runs_dir / (run_id or f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{grid.name}"))
    if run.grid.exists():
        stored = load_grid(run.grid)
        if stored.limits.usd_per_cell != grid.limits.usd_per_cell and grid.limits.usd_per_cell:
            set_usd_per_cell(run.root, grid.limits.usd_per_cell)
            stored = load_grid(run.grid)
        differences = grid_differences(stored, grid)
        if differences:
            raise GridMismatch(f"{run.root} was started with another grid: {'; '.join(differences[:8])}. "
                               f"Continue it with `carc grid run --resume {run.root}`, or give another --run-id")
    else:
        run.cells.mkdir(parents=True, exist_ok=True)
        write_run_grid(grid, Path(grid_path), run.root)
    return run.root



def run_grid_path(run_dir: Path) -> Path:
    """The grid a run folder runs: its own validated copy, whatever became of the original."""
    return RunPaths(run_dir).grid



def needs_docker(grid: GridConfig) -> bool:
    if grid.track.name == "arc3":  # the engine runs in its own container
        return True
    learners = {c.learner for c in grid.cells()}
    return bool(learners & HARNESSES) or (sandbox_engine(grid.sandbox.engine).needs_docker
                                          and "program-library" in learners)



def harness_learners(grid: GridConfig) -> list[str]:
    return sorted({c.learner for c in grid.cells()} & HARNESSES)



def prepare_sandboxes(grid: GridConfig, run_dir: Path, show_progress: bool) -> None:
    """Build (or find) the images before any cell starts, and clear a crashed attempt's leftovers."""
    from rich.console import Console

    from sandboxes.docker_sandbox import prune
    from sandboxes.images import ensure_image

    with Console().status("preparing sandbox images ...") if show_progress else nullcontext():
        if grid.track.name == "arc3":
            ensure_image("arc3-engine", grid.sandbox.base)  # Python >= 3.12 and the official engine
        else:
            ensure_image("base", grid.sandbox.base)
        for name in harness_learners(grid):
            ensure_image("proxy", grid.sandbox.base)
            ensure_image(registry.adapter(name).recipe, grid.sandbox.base)
    pruned = prune(run=run_dir.name)
    if pruned.containers:
        log.info("pruned_leftovers", run=run_dir.name, containers=len(pruned.containers))
