"""The first report of a run: `carc report RUN` reads the run directory, hands the finished
instances to `orchestrator.analysis`, and writes `RUN/report.md` (markdown tables, percent).

The file edge of the analysis: reading cells and event logs happens here, every number is
computed there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from orchestrator import analysis
from orchestrator.records import Event, read_events

# Report order: the ladder first, cheapest memory first; harnesses after it, by name.
LADDER_ORDER = ("stateless-floor", "demo-cache-floor", "program-library", "program-library-wiped")
EFFORT_ORDER = ("minimal", "low", "medium", "high", "xhigh", "max")
DASH = "–"


def load_run(run_dir: Path) -> tuple[dict[str, dict[str, Any]], dict[str, list[Event]]]:
    """Every cell's settings (`cell.json`) and events (`events.jsonl`), keyed by cell id, in
    report order."""
    cells: dict[str, dict[str, Any]] = {}
    events: dict[str, list[Event]] = {}
    cells_dir = run_dir / "cells"
    folders = sorted(p for p in cells_dir.iterdir() if p.is_dir()) if cells_dir.is_dir() else []
    for folder in folders:
        meta = folder / "cell.json"
        if not meta.exists():
            raise FileNotFoundError(f"{meta}: missing; every cell folder needs the cell.json the "
                                    "runner writes (remove the folder or rerun the cell)")
        try:
            settings = json.loads(meta.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{meta}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
        cell_id = str(settings.get("cell") or folder.name)
        cells[cell_id] = settings
        events[cell_id] = read_events(folder / "events.jsonl")
    order = sorted(cells, key=lambda c: _cell_sort_key(cells[c]))
    return {c: cells[c] for c in order}, {c: events[c] for c in order}


def _rank(value: Any, known: Sequence[str]) -> tuple[int, str]:
    return (known.index(value), "") if value in known else (len(known), str(value))


def _cell_sort_key(settings: Mapping[str, Any]) -> tuple:
    return (str(settings.get("track")), str(settings.get("model")), str(settings.get("seed")),
            str(settings.get("order")), _rank(settings.get("effort"), EFFORT_ORDER),
            _rank(analysis.cell_label(settings), LADDER_ORDER))


def _grid_name(run_dir: Path) -> str | None:
    path = run_dir / "grid.yaml"
    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return str(data["name"]) if isinstance(data, dict) and data.get("name") else None


# --- formatting ---------------------------------------------------------------------------------

def _missing(x: Any) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x))


def pct(x: float, signed: bool = False) -> str:
    """A share as percent (or a difference of shares as points), one decimal."""
    if _missing(x):
        return DASH
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def pct_ci(mean: float, lo: float, hi: float, signed: bool = False) -> str:
    """`37.5 [31.2, 44.0]`: a share and its interval, in percent (points when signed)."""
    if _missing(mean):
        return DASH
    return f"{pct(mean, signed)} [{pct(lo, signed)}, {pct(hi, signed)}]"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], text_columns: int = 1) -> str:
    """A markdown table: the first `text_columns` left-aligned, the numbers right-aligned."""
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(" --- " if k < text_columns else " ---: " for k in range(len(headers)))
             + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _number(x: float, digits: int = 0) -> str:
    return DASH if _missing(x) else f"{x:,.{digits}f}"


# --- sections -----------------------------------------------------------------------------------

def _how_to_read(resamples: int, seed: int) -> str:
    return (
        "**How to read.** Every instance has a budget of 16. Its *budget share* is cost / 16: the "
        "pairs it bought plus its wrong answers, all 16 when it failed. Lower is better. *Solved "
        "share* is the share of instances answered correctly. Numbers are percent; brackets are "
        f"95% bootstrap intervals over tasks ({resamples:,} resamples of the task ids, seed "
        f"{seed}), because the instances of one task rise and fall together. Paired differences "
        "are taken slot by slot on the same schedule, in points of budget (percentage points); "
        "negative means less budget used. Model calls, tokens and model seconds are logged "
        "compute, not part of the score.")


def _cells_section(table: pd.DataFrame) -> str:
    headers = ["cell", "budget share %", "solved share %", "instances",
               "pairs before 1st submit", "1st answer correct %", "model calls", "tokens",
               "model s"]
    rows = [[r.cell, pct_ci(r.budget, r.budget_lo, r.budget_hi),
             pct_ci(r.solved, r.solved_lo, r.solved_hi), r.n, _number(r.first_submit_demos, 2),
             pct(r.first_answer_correct), _number(r.model_calls), _number(r.tokens),
             _number(r.model_s, 1)] for r in table.itertuples()]
    return ("## Per cell (stream)\n\nStream instances only; the epilogue and the fresh reference "
            "are under forward transfer.\n\n" + _table(headers, rows))


def _exposure_section(table: pd.DataFrame) -> str:
    headers = ["cell", *(str(k) for k in table.columns)]
    rows = [[cell, *(pct(v) for v in values)] for cell, values in zip(table.index, table.to_numpy())]
    return ("## Budget against exposure index\n\nMean budget share (%) of stream instances by the "
            "number of times the task was met before (0 = first meeting). A stateless learner is "
            "flat; a cache of examples steps down once at exposure 1; learning shows as falling "
            "below that step.\n\n" + _table(headers, rows))


def _floor_section(table: pd.DataFrame) -> str:
    head = ("## Paired difference from the stateless floor\n\nBudget share of the cell minus that "
            "of the stateless floor with the same track, model, effort, order and seed, slot by "
            "slot, in points of budget; negative is a saving.\n\n")
    if table.empty:
        return head + "No cell has a stateless-floor cell on its schedule."
    rows = [[r.cell, r.floor, pct_ci(r.mean, r.lo, r.hi, signed=True), r.pairs]
            for r in table.itertuples()]
    return head + _table(["cell", "stateless floor", "difference (points)", "pairs"], rows,
                         text_columns=2)


def _transfer_section(table: pd.DataFrame) -> str:
    head = ("## Forward transfer\n\nBudget share on the held-out epilogue after the stream minus "
            "the fresh reference (the same instances, state wiped before each), paired by task, "
            "in points; negative means the lifetime helped.\n\n")
    if table.empty:
        return head + "No cell has finished both the epilogue and the fresh reference on a task."
    rows = [[r.cell, pct(r.epilogue), pct(r.fresh), pct_ci(r.mean, r.lo, r.hi, signed=True),
             r.tasks] for r in table.itertuples()]
    return head + _table(["cell", "epilogue %", "fresh reference %",
                          "epilogue − fresh (points)", "tasks"], rows)


def _progress_section(unfinished: pd.Series) -> str:
    rows = [[cell, count] for cell, count in unfinished.items() if count > 0]
    return ("## In progress\n\nInstances started but not finished; they are left out of every "
            "number above.\n\n" + _table(["cell", "unfinished instances"], rows))


def render_report(run_id: str, grid_name: str | None, result: analysis.RunAnalysis,
                  unfinished: pd.Series, resamples: int, seed: int) -> str:
    """The markdown text of a report."""
    title = f"# carc report: run {run_id}" + (f", grid {grid_name}" if grid_name else "")
    parts = [title, _how_to_read(resamples, seed)]
    if result.cells.empty:
        parts.append("No finished instance yet.")
    else:
        parts += [_cells_section(result.cells), _exposure_section(result.exposure),
                  _floor_section(result.floor_differences),
                  _transfer_section(result.forward_transfer)]
    if (unfinished > 0).any():
        parts.append(_progress_section(unfinished))
    return "\n\n".join(parts) + "\n"


def write_report(run_dir: Path, seed: int = 0, resamples: int = analysis.RESAMPLES) -> Path:
    """Read the run in `run_dir`, analyse it and write `run_dir/report.md`; returns that path."""
    run_dir = Path(run_dir)
    cells, events = load_run(run_dir)
    frame = analysis.instances_frame(events, cells)
    result = analysis.analyse(frame, cells, np.random.default_rng(seed), resamples)
    text = render_report(run_dir.resolve().name, _grid_name(run_dir), result,
                         analysis.unfinished_instances(events), resamples, seed)
    path = run_dir / "report.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
