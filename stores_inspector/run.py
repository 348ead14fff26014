"""`inspect_run`: every cell of a run (or one) read into tables and a markdown account."""

from __future__ import annotations

import importlib.util
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.analysis import measures
from orchestrator.analysis.report import load_run
from orchestrator.errors import ConfigError
from orchestrator.records import CellPaths, RunPaths
from stores_inspector import report, returns, timeline
from stores_inspector.cell import InspectedCell, is_user_folder
from stores_inspector.material import TaskMaterial
from stores_inspector.parser import StoreContext, parser_for

INSTANCE_COLUMNS = ["cell", "slot", "task", "visit", "exposure", "phase", "start_t", "first_action_t",
                    "verdict_t", "end_t", "status", "cost", "demos_used", "first_submit_demos",
                    "first_answer_correct"]


@dataclass
class InspectResult:
    """Tables across the inspected cells (each has a `cell` column), counts per cell, markdown."""

    run_dir: Path
    tables: dict[str, pd.DataFrame]
    summaries: list[dict[str, Any]]
    markdown: str
    notes: list[str] = field(default_factory=list)

    def cell(self, name: str, table: str) -> pd.DataFrame:
        frame = self.tables.get(table, pd.DataFrame(columns=["cell"]))
        return frame[frame["cell"] == name]

    def write(self, out_dir: Path | None = None) -> Path:
        """Tables as CSV (and parquet when pyarrow is installed) plus inspect.md; returns the folder."""
        out_dir = Path(out_dir) if out_dir else RunPaths(self.run_dir).inspect
        out_dir.mkdir(parents=True, exist_ok=True)
        parquet = importlib.util.find_spec("pyarrow") is not None
        for name, frame in self.tables.items():
            frame.to_csv(out_dir / f"{name}.csv", index=False)
            if parquet:
                frame.astype({c: "string" for c in frame.columns if frame[c].dtype == object}) \
                     .to_parquet(out_dir / f"{name}.parquet", index=False)
        (out_dir / "inspect.md").write_text(self.markdown, encoding="utf-8")
        return out_dir


def _inspected_folders(cell: CellPaths) -> list[Path]:
    """A cell's folder; a collective grid's row: its harness users' folders (each has a sandbox
    of its own; a ladder row's users keep their state on the host, with nothing to inspect)."""
    users = cell.user_folders()
    if not users:
        return [cell.root]
    return [u.root for u in users if u.sandbox.exists()]


def _name(folder: Path) -> str:
    return f"{folder.parent.parent.name}/{folder.name}" if is_user_folder(folder) else folder.name


def inspect_cell(folder: Path) -> tuple[dict[str, pd.DataFrame], dict[str, Any], str]:
    """(tables, summary, markdown section) of one cell folder."""
    records = InspectedCell.read(folder)
    parser = parser_for(records.harness)
    material = TaskMaterial.of(records)
    problems = records.problems
    calls = timeline.read_calls(records, parser)
    tables: dict[str, pd.DataFrame] = {}
    with tempfile.TemporaryDirectory(prefix="carc-inspect-") as workdir:
        files, kept, last = timeline.build(records, parser, material, calls, problems)
        tables.update(files=files, timeline=kept, runs=timeline.mechanism_runs(records, parser, calls),
                      returns=returns.build(records, parser, material, calls))
        if last is None:
            problems.add("snapshots/", "no snapshot: nothing kept can be shown, only the journal")
        context = StoreContext(records, material, calls, problems, Path(workdir))
        with problems.guard(f"{parser.name} stores", "the harness stores could not be parsed"):
            for name, frame in parser.store_tables(last, context).items():
                frame.insert(0, "cell", records.name)
                tables[name] = frame
    tables["instances"] = pd.DataFrame([{"cell": records.name, **vars(i)} for i in records.instances.values()],
                                       columns=INSTANCE_COLUMNS)
    tables["problems"] = pd.DataFrame([vars(p) for p in problems], columns=["cell", "where", "what"])
    summary = report.summarize(records.name, records.harness, records.row, tables, parser)
    return tables, summary, report.cell_section(summary, tables)


def twins(run_dir: Path, notes: list[str]) -> pd.DataFrame | None:
    """The grid report's paired differences against each cell's memory-off twin, by cell (the
    same seed and resamples as `carc report`; None, with a note, when the run cannot be read)."""
    try:
        cells, events = load_run(run_dir)
        frame = measures.instances_frame(events, cells)
        if frame.empty or frame["user"].notna().any():  # a collective run pairs in its own report
            return None
        table = measures.twin_table(frame, measures.TaskResamples(np.random.default_rng(0), measures.RESAMPLES))
    except (OSError, ValueError, KeyError) as exc:
        notes.append(f"No budget differences: the run's events could not be analysed ({exc}).")
        return None
    return table.set_index("cell")


def inspect_run(run_dir: str | Path, cell: str | None = None) -> InspectResult:
    """Inspect every cell of RUN (or only `cell`); nothing in a cell's stores can make it fail."""
    run_dir = Path(run_dir)
    cells = RunPaths(run_dir).cell_folders()
    if not cells:
        raise ConfigError(f"{run_dir}: no cells/ folder with cells in it; is this a run directory?")
    folders = [f for c in cells for f in _inspected_folders(c)]
    if cell is not None:
        folders = [p for p in folders if cell in (p.name, p.parent.parent.name, _name(p))]
        if not folders:
            known = ", ".join(_name(f) for c in cells for f in _inspected_folders(c))
            raise ConfigError(f"{run_dir}: no cell {cell!r}; cells: {known}")
    per_table: dict[str, list[pd.DataFrame]] = {}
    summaries, sections = [], []
    for folder in folders:
        try:
            tables, summary, section = inspect_cell(folder)
        except Exception as exc:  # a reader bug on one cell's stores must not lose the other cells
            tables, summary = {}, {"cell": _name(folder), "problem": f"{type(exc).__name__}: {exc}"[:500]}
            section = (f"## {_name(folder)}\n\nThis cell could not be inspected ({summary['problem']}); "
                       f"the other cells are unaffected. Please report it with the cell folder.\n")
        for name, frame in tables.items():
            per_table.setdefault(name, []).append(frame)
        summaries.append(summary)
        sections.append(section)
    tables = {name: pd.concat([f for f in frames if not f.empty] or frames[:1], ignore_index=True)
              for name, frames in per_table.items()}
    tables["cells"] = pd.DataFrame(summaries).astype(str)
    notes = [] if importlib.util.find_spec("pyarrow") else [
        "Tables are written as CSV only: parquet needs the pyarrow package."]
    rows = [s for s in summaries if "problem" not in s]
    overview = report.overview(rows, tables, twins(run_dir, notes)) if rows else ""
    return InspectResult(run_dir, tables, summaries,
                         report.markdown(run_dir.name, summaries, sections, notes, overview), notes)
