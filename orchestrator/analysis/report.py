"""The report of a run: `carc report RUN` reads the run directory, hands the finished instances
to `orchestrator.analysis.measures`, and writes `RUN/report.md` (markdown tables, percent) and
`RUN/report.html` (the same tables, sortable, plus the figures of `orchestrator.analysis.plots`).

The file edge of the analysis: reading cells and event logs happens here, every number is
computed there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from orchestrator.errors import ConfigError
from orchestrator.analysis import (journal_summary, labels_served, measures, plots, report_html,
                                   results, tables)
from orchestrator.analysis.summary import summary_lines
from orchestrator.records import Event, EventType, RunPaths, read_events, write_text

# Report order: the ladder first, cheapest memory first; harnesses after it, by name.
LADDER_ORDER = ("stateless-floor", "demo-cache-floor", "program-library", "program-library-wiped")
EFFORT_ORDER = ("minimal", "low", "medium", "high", "xhigh", "max")
DASH = "–"
INFRASTRUCTURE = "Infrastructure faults (not charged)"


def load_run(run_dir: Path, kind: EventType | None = None
             ) -> tuple[dict[str, dict[str, Any]], dict[str, list[Event]]]:
    """Every cell's settings (`cell.json`) and events, keyed by cell id, in report order: a
    grid cell's `events.jsonl`, a collective cell's every user's (`users/<user>/events.jsonl`;
    its events carry the user and round). Only the events of type `kind` when given."""
    cells: dict[str, dict[str, Any]] = {}
    events: dict[str, list[Event]] = {}
    for folder in RunPaths(run_dir).cell_folders():
        meta = folder.settings
        if not meta.exists():
            raise FileNotFoundError(f"{meta}: missing; every cell folder needs the cell.json the "
                                    "runner writes (remove the folder or rerun the cell)")
        try:
            settings = json.loads(meta.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{meta}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
        cell_id = str(settings.get("cell") or folder.name)
        cells[cell_id] = settings
        events[cell_id] = [*read_events(folder.events, kind),
                           *(e for user in folder.user_folders() for e in read_events(user.events, kind))]
    order = sorted(cells, key=lambda c: _cell_sort_key(cells[c]))
    return {c: cells[c] for c in order}, {c: events[c] for c in order}


def _rank(value: Any, known: Sequence[str]) -> tuple[int, str]:
    return (known.index(value), "") if value in known else (len(known), str(value))


def _cell_sort_key(settings: Mapping[str, Any]) -> tuple:
    return (str(settings.get("track")), str(settings.get("model")), str(settings.get("seed")),
            str(settings.get("order")), _rank(settings.get("effort"), EFFORT_ORDER),
            _rank(measures.cell_label(settings), LADDER_ORDER))


def _grid_name(run_dir: Path) -> str | None:
    path = RunPaths(run_dir).grid
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


def _table(frame: pd.DataFrame) -> str:
    """A markdown table of a display frame: text columns left-aligned, numbers right-aligned."""
    headers = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(" ---: " if _numeric(frame.iloc[:, k]) else " --- "
                            for k in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _numeric(column: pd.Series) -> bool:
    """Whether a column holds numbers (a dash standing in for the unknown ones)."""
    return all(v == DASH or report_html.sort_key(v) is not None for v in column)


def _number(x: float, digits: int = 0) -> str:
    return DASH if _missing(x) else f"{x:,.{digits}f}"


# --- sections -----------------------------------------------------------------------------------
# Each section is (intro, display frame): the same cells, already formatted, make the markdown
# table and the HTML one, so the two files cannot disagree on a number.

CELLS = "Per cell (stream)"
EXPOSURE = "Budget against exposure index"
FLOOR_DIFFERENCE = "Paired difference from the stateless floor"
TRANSFER = "Forward transfer"
PROGRESS = "In progress"
# The sensitivity of a paired difference (`measures.sensitivity`), beside its interval.
BOUND = "savings excluded beyond (points)"
MDE = f"MDE {measures.POWER:.0%} (points)"


def how_to_read(resamples: int, seed: int) -> str:
    """The report's reading guide: budget, shares, intervals over tasks, paired differences."""
    return (
        "**How to read.** Every instance has a budget of 16. Its *budget share* is cost / 16: the "
        "pairs it bought plus its wrong answers, all 16 when it failed. Lower is better. *Solved "
        "share* is the share of instances answered correctly. Numbers are percent; brackets are "
        f"95% bootstrap intervals over tasks ({resamples:,} resamples of the task ids, seed "
        f"{seed}), because the instances of one task rise and fall together. Paired differences "
        "are taken slot by slot on the same schedule, in points of budget (percentage points); "
        "negative means less budget used. Beside each paired difference, from the same "
        f"resamples: *{BOUND}* is the X for which a saving larger than X points is excluded at "
        f"{measures.LEVEL:.0%}, one-sided (minus the {1 - measures.LEVEL:.0%} percentile of the "
        f"resampled difference; 0 when even that is no saving). *{MDE}* is the minimum "
        f"detectable effect: the true difference a two-sided test at {1 - measures.LEVEL:.0%} "
        f"finds with {measures.POWER:.0%} power, {measures.mde_factor():.2f} times the "
        "bootstrap standard deviation of the difference; a difference near zero rules out "
        "effects only down to about these sizes. Model calls, tokens and model seconds are "
        "logged compute, not part of the score.")


def _frame(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> pd.DataFrame:
    return pd.DataFrame([[str(v) for v in row] for row in rows], columns=list(headers),
                        dtype=object)


def _cells_section(table: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    headers = ["cell", "budget share %", "solved share %", "instances",
               "pairs before 1st submit", "1st answer correct %", "model calls", "tokens",
               "model s"]
    rows = [[r.cell, pct_ci(r.budget, r.budget_lo, r.budget_hi),
             pct_ci(r.solved, r.solved_lo, r.solved_hi), r.n, _number(r.first_submit_demos, 2),
             pct(r.first_answer_correct), _number(r.model_calls), _number(r.tokens),
             _number(r.model_s, 1)] for r in table.itertuples()]
    return ("Stream instances only; the epilogue and the fresh reference are under forward "
            "transfer.", _frame(headers, rows))


def _exposure_section(table: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    headers = ["cell", *(str(k) for k in table.columns)]
    rows = [[cell, *(pct(v) for v in values)] for cell, values in zip(table.index, table.to_numpy())]
    return ("Mean budget share (%) of stream instances by the number of times the task was met "
            "before (0 = first meeting). A stateless learner is flat; a cache of examples steps "
            "down once at exposure 1; learning shows as falling below that step.",
            _frame(headers, rows))


def _floor_section(table: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    head = ("Budget share of the cell minus that of the stateless floor with the same track, "
            "model, effort, order and seed, slot by slot, in points of budget; negative is a "
            "saving.")
    headers = ["cell", "stateless floor", "difference (points)", BOUND, MDE, "pairs"]
    if table.empty:
        return head + "\n\nNo cell has a stateless-floor cell on its schedule.", _frame(headers, [])
    rows = [[r.cell, r.floor, pct_ci(r.mean, r.lo, r.hi, signed=True), pct(r.bound), pct(r.mde),
             r.pairs] for r in table.itertuples()]
    return head, _frame(headers, rows)


def _transfer_section(table: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    head = ("Budget share on the held-out epilogue after the stream minus the fresh reference "
            "(the same instances, state wiped before each), paired by task, in points; negative "
            "means the lifetime helped.")
    headers = ["cell", "epilogue %", "fresh reference %", "epilogue − fresh (points)", BOUND, MDE,
               "tasks"]
    if table.empty:
        return (head + "\n\nNo cell has finished both the epilogue and the fresh reference on a "
                "task.", _frame(headers, []))
    rows = [[r.cell, pct(r.epilogue), pct(r.fresh), pct_ci(r.mean, r.lo, r.hi, signed=True),
             pct(r.bound), pct(r.mde), r.tasks] for r in table.itertuples()]
    return head, _frame(headers, rows)


def _progress_section(unfinished: pd.Series) -> tuple[str, pd.DataFrame]:
    rows = [[cell, count] for cell, count in unfinished.items() if count > 0]
    return ("Instances started but not finished; they are left out of every number above.",
            _frame(["cell", "unfinished instances"], rows))


def display_frame(table: pd.DataFrame, shares: Collection[str] = (),
                  signed: Collection[str] = ()) -> pd.DataFrame:
    """A raw analysis table as report cells: a number column `x` with `x_lo` and `x_hi` beside
    it (or `mean` with `lo` and `hi`, or `x_mean` with `x_lo` and `x_hi`) becomes one
    `x [lo, hi]` column; the columns named in `shares` are percent (`signed` ones as +/-
    points); other integers get thousands separators, other numbers two decimals, booleans
    yes/no, text stays; a meaningful index becomes the first column."""
    table = report_html.flat(table).rename(columns=str)
    columns = list(table.columns)

    def bounds(name: str) -> tuple[str, str] | None:
        if not pd.api.types.is_numeric_dtype(table[name]):
            return None  # `twin` names a cell; `twin_mean` is the number `twin_lo` bounds
        for pair in ((f"{name}_lo", f"{name}_hi"), ("lo", "hi") if name == "mean" else (),
                     (f"{name[:-5]}_lo", f"{name[:-5]}_hi") if name.endswith("_mean") else ()):
            if pair and all(p in columns for p in pair):
                return pair
        return None

    hidden = {p for c in columns if bounds(c) for p in bounds(c)}
    out = {}
    for name in columns:
        if name in hidden:
            continue
        values, pair = table[name], bounds(name)
        if pair and name in shares:
            out[name] = [pct_ci(v, lo, hi, signed=name in signed)
                         for v, lo, hi in zip(values, table[pair[0]], table[pair[1]])]
        elif pair:
            out[name] = [DASH if _missing(v) else
                         f"{_number(v, 2)} [{_number(lo, 2)}, {_number(hi, 2)}]"
                         for v, lo, hi in zip(values, table[pair[0]], table[pair[1]])]
        elif name in shares:
            out[name] = [pct(v, signed=name in signed) for v in values]
        elif pd.api.types.is_integer_dtype(values) and not pd.api.types.is_bool_dtype(values):
            out[name] = [_number(v) for v in values]
        elif pd.api.types.is_float_dtype(values):
            out[name] = [_number(v, 2) for v in values]
        else:
            out[name] = [report_html.format_value(v) for v in values]
    return pd.DataFrame(out, columns=list(out), dtype=object)


# The tables of `measures.run_measures` beyond the first report's four: key -> (title, intro).
# A key not listed here is still shown, titled by its key, so a new table is never dropped.
MEASURES = {
    "gap": ("Budget against the gap since last seen",
            "Mean budget share (%) of returning stream instances by how many instances ago the "
            "cell last served the task; forgetting shows as a rise with the gap."),
    "pooled": ("Per cell group, pooled over stream orders",
               "Every stream instance of every order of a cell group (the cell without its "
               "order), with the bootstrap over tasks across orders."),
    "twins": ("Paired difference from the memory-off twin and the demo-cache floor",
              "Budget share of the cell minus its memory-off twin's (the wiped row for the "
              "program library) and minus the demo-cache floor's on the same schedule, slot by "
              "slot, in points; negative is a saving."),
    "twins_pooled": ("Paired differences, pooled over stream orders",
                     "The twin and demo-cache differences with the slot pairs of every order "
                     "pooled, per cell group, in points."),
    "clbench": ("CL-Bench", "CL-Bench's measures on these records (`orchestrator.analysis.clbench`): "
                "memory-on as the stateful system, its memory-off twin as the stateless one."),
    "clbench_pooled": ("CL-Bench, pooled over stream orders", "As above, per cell group."),
    "pathbench": ("PATH-Bench", "PATH-Bench's AP, FWT, BWT and FGT on these records "
                  "(`orchestrator.analysis.pathbench`), each task's visits as a probe trajectory."),
    "pathbench_pooled": ("PATH-Bench, pooled over stream orders", "As above, per cell group."),
    "floor_pooled": ("Paired difference from the stateless floor, pooled over stream orders",
                     "The floor differences with the slot pairs of every order pooled, per cell "
                     "group, in points; the paired-savings figure under the summary draws these."),
    "frames": (labels_served.TITLE, labels_served.INTRO),
    "arc3": ("ARC-AGI-3 levels",
             "Per cell: levels played, the share completed, the budget share (actions against "
             "5 x the level's human baseline; a level not completed is charged in full), seconds "
             "per level, and the seed's retention view: the mean budget share at the first and "
             "the second meeting of the same (game, level), and their slot-paired difference in "
             "points (negative: the level came back cheaper), with the bootstrap over games."),
    "failures": ("Failed instances by kind",
                 "The failed instances of the cell in every phase (stream, epilogue, fresh reference; "
                 "each charged the full budget), counted by why they failed: "
                 "wrong-answers (the 8th incorrect submission), malformed (the malformed-action cap), "
                 "wall-clock, no-verdict (the conversation ended without one), model-unavailable, "
                 "learner-error, or the harness's own kind (rate-limit, timeout, crash, bad-output, other)."),
}
SHOWN_FIRST = ("cells", "exposure", "floor", "transfer")  # the first report's own sections
SHARES = {"budget", "solved", "failed", "first_answer_correct", "cost0_returning", "first_meeting",
          "second_meeting"}
POINTS = {"mean", "twin_mean", "demo_cache_mean", "second_minus_first"}  # differences of shares, signed
SENSITIVITY = {"bound", "mde", "twin_bound", "twin_mde", "demo_cache_bound", "demo_cache_mde"}
_POOLED_SHOWN = ["group", "orders", "cells", "n", "tasks", "budget", "solved", "failed",
                 "first_answer_correct", "first_submit_demos", "cost0_returning", "model_calls",
                 "tokens", "model_s"]
# column -> header, in the first report's words
HEADERS = {"n": "instances", "budget": "budget share %", "solved": "solved share %",
           "failed": "failed %", "first_answer_correct": "1st answer correct %",
           "first_submit_demos": "pairs before 1st submit",
           "cost0_returning": "cost-0 returning %", "model_calls": "model calls",
           "model_s": "model s", "twin_mean": "minus twin (points)", "twin_pairs": "twin pairs",
           "demo_cache": "demo-cache floor", "demo_cache_mean": "minus demo cache (points)",
           "demo_cache_pairs": "demo-cache pairs", "bound": BOUND, "mde": MDE,
           "twin_bound": f"vs twin: {BOUND}", "twin_mde": f"vs twin: {MDE}",
           "demo_cache_bound": f"vs demo cache: {BOUND}", "demo_cache_mde": f"vs demo cache: {MDE}",
           "s_per_level": "s per level", "pairs": "levels met twice",
           "first_meeting": "1st meeting budget %", "second_meeting": "2nd meeting budget %",
           "second_minus_first": "2nd minus 1st (points)"}


def _gap_wide(table: pd.DataFrame) -> pd.DataFrame:
    """`measures.gap_table` (a row per cell and bin) as the exposure table is: a row per cell,
    a column per gap bin, budget share in percent."""
    wide = table.pivot(index="cell", columns="gap", values="budget")
    wide = wide.reindex(index=list(dict.fromkeys(table["cell"])),
                        columns=list(dict.fromkeys(table["gap"])))
    return display_frame(wide.rename_axis(columns=None), shares=set(wide.columns))


def measure_tables_sections(tables: Mapping[str, pd.DataFrame]
                            ) -> dict[str, tuple[str, pd.DataFrame]]:
    """The sections of `measures.run_measures` tables that the first report does not show
    (`MEASURES`, then any other key), as title -> (intro, display frame): shares in percent,
    differences in signed points with their intervals, like the sections above."""
    sections = {}
    for key, table in tables.items():
        if key in SHOWN_FIRST:
            continue
        title, intro = MEASURES.get(key, (key.replace("_", " ").capitalize(), ""))
        if table.empty:
            sections[title] = ((intro + "\n\n" if intro else "") + "No rows on these records.",
                               pd.DataFrame())
        elif key == "gap":
            sections[title] = (intro, _gap_wide(table))
        else:
            if key == "pooled":
                table = table[[c for c in table.columns if c in _POOLED_SHOWN
                               or c.endswith(("_lo", "_hi"))]]
            elif key.startswith("twins"):
                table = table.drop(columns=["label", "learner", "row"], errors="ignore")
            shown = display_frame(table, shares=SHARES | POINTS | SENSITIVITY, signed=POINTS)
            sections[title] = (intro, shown.rename(columns=HEADERS))
    return sections


def report_sections(result: measures.RunAnalysis, unfinished: pd.Series,
                    measures: Mapping[str, tuple[str, pd.DataFrame]] | None = None
                    ) -> dict[str, tuple[str, pd.DataFrame]]:
    """The sections of a report in order, title -> (intro, display frame); a run with no
    finished instance has only the in-progress section."""
    sections: dict[str, tuple[str, pd.DataFrame]] = {}
    if not result.cells.empty:
        sections[CELLS] = _cells_section(result.cells)
        sections[EXPOSURE] = _exposure_section(result.exposure)
        sections[FLOOR_DIFFERENCE] = _floor_section(result.floor_differences)
        sections[TRANSFER] = _transfer_section(result.forward_transfer)
        sections.update(measures or {})
    if (unfinished > 0).any():
        sections[PROGRESS] = _progress_section(unfinished)
    return sections


def report_title(run_id: str, grid_name: str | None) -> str:
    return f"carc report: run {run_id}" + (f", grid {grid_name}" if grid_name else "")


def _intro(result: measures.RunAnalysis, resamples: int, seed: int) -> str:
    text = how_to_read(resamples, seed)
    return text + ("\n\nNo finished instance yet." if result.cells.empty else "")


def render_markdown(title: str, summary: str, intro: str,
                    sections: Mapping[str, tuple[str, pd.DataFrame]]) -> str:
    """The markdown text of a report: the title, the summary (when there is one), how to read
    it, the sections (each its intro, when it has one, and its table)."""
    parts = ["# " + title]
    if summary:
        parts.append(f"## {SUMMARY}\n\n{summary}")
    parts.append(intro)
    for name, (text, frame) in sections.items():
        parts.append("\n\n".join([f"## {name}", *([text] if text else []),
                                    *([] if frame.empty else [_table(frame)])]))
    return "\n\n".join(parts) + "\n"


def write_documents(run_dir: Path, title: str, summary: str, intro: str,
                    sections: Mapping[str, tuple[str, pd.DataFrame]],
                    figures: Sequence[report_html.Figure] = (),
                    images: Sequence[tuple[str, str]] = ()) -> Path:
    """Write `report.md` (the key figures' `images` shown under its summary) and `report.html`
    (every figure) of a run, the same sections in both; returns the markdown path."""
    paths = RunPaths(run_dir)
    shown = summary + "".join(f"\n\n![{name}]({image})" for name, image in images)
    write_text(paths.report_md, render_markdown(title, shown, intro, sections))
    write_text(paths.report_html, report_html.render_html(
        title, "", {SUMMARY: (summary, pd.DataFrame()), HOW_TO_READ: (intro, pd.DataFrame()),
                    **sections}, figures))
    return paths.report_md


# --- figures -------------------------------------------------------------------------------------

_FIGURE_STREAM = 1  # the figures draw from their own generator, so tables never shift with them
_DESCRIBED = 12  # alt text names each cell's numbers up to this many cells


def _curve_alt(kind: str, curves: pd.DataFrame, axis: str, ticks: Mapping[int, str]) -> str:
    cells = list(dict.fromkeys(curves["cell"]))
    alt = (f"{kind}: mean budget share (%) against {axis}, one line per cell ({len(cells)} "
           + ("cells), with 95% bootstrap intervals over tasks as error bars."
              if len(cells) <= plots.LEGEND_MAX else "cells, thin lines without intervals)."))
    if len(cells) <= _DESCRIBED:
        for cell_id in cells:
            c = curves[curves["cell"] == cell_id]
            first, last = c.iloc[0], c.iloc[-1]
            alt += (f" {first['name']}: {pct(first['budget'])} at {ticks[int(first['x'])]}, "
                    f"{pct(last['budget'])} at {ticks[int(last['x'])]}.")
    return alt


SUMMARY = "Summary"
HOW_TO_READ = "How to read"
FIGURES_DIR = "figures"
_KEY_FIGURES = {"Budget against exposure index, by effort": "exposure-by-effort.png",
                "Slot-paired savings": "paired-savings.png"}


def key_figures(data: Mapping[str, pd.DataFrame]) -> list[report_html.Figure]:
    """The seed's two key figures, shown under the summary: budget against exposure index as
    small multiples per effort, and the paired-savings dot plot (both pooled over orders)."""
    figures = []
    groups = data.get("exposure_groups", pd.DataFrame())
    if not groups.empty:
        alt = (f"Small multiples, one panel per effort ({', '.join(dict.fromkeys(groups['effort']))}): "
               "mean budget share (%) against exposure index, one line per learner pooled over "
               "stream orders, with 95% bootstrap intervals over tasks.")
        if groups["cell"].nunique() <= _DESCRIBED:
            for cell_id in dict.fromkeys(groups["cell"]):
                c = groups[groups["cell"] == cell_id]
                alt += (f" {c['label'].iloc[0]} at {c['effort'].iloc[0]}: {pct(c['budget'].iloc[0])} "
                        f"at exposure {int(c['x'].iloc[0])}, {pct(c['budget'].iloc[-1])} at "
                        f"{int(c['x'].iloc[-1])}.")
        figures.append(report_html.Figure(
            "Budget against exposure index, by effort",
            plots.exposure_panels(groups, LADDER_ORDER), alt,
            "A flat line relearns the task every time; a cache of the examples steps down once, "
            "at exposure 1; learning falls below that step.", section=SUMMARY))
    floor = data.get("floor_pooled", pd.DataFrame())
    twins = data.get("twins_pooled", pd.DataFrame())
    if not floor.empty or not twins.empty:
        alt = ("Dot plot in two panels: per learner and effort, the slot-paired difference in "
               "budget share from the stateless floor (left) and from the demo-cache floor "
               "(right), pooled over stream orders, in points with 95% intervals; negative is a saving.")
        if len(floor) <= _DESCRIBED:
            alt += "".join(f" {r.label} at {r.effort} against the floor: "
                           f"{pct_ci(r.mean, r.lo, r.hi, signed=True)}." for r in floor.itertuples())
        figures.append(report_html.Figure(
            "Slot-paired savings", plots.savings_panels(floor, twins, LADDER_ORDER), alt,
            "Left of the dashed line is a saving.", section=SUMMARY))
    return figures


def report_figures(result: measures.RunAnalysis, curves: Mapping[str, pd.DataFrame]
                   ) -> list[report_html.Figure]:
    """The report's figures, drawn from the measures as read back from `measures.parquet`:
    budget against exposure and against the gap since last seen (after the exposure table),
    savings against the stateless floor (after its table), and compute against budget share
    (after the per-cell table). None without a finished stream instance."""
    exposure = curves.get("exposure_curves", pd.DataFrame())
    if result.cells.empty or exposure.empty:
        return []
    figures = key_figures(curves)
    exposure_ticks = {int(x): str(int(x)) for x in exposure["x"]}
    figures.append(report_html.Figure(
        "Budget against exposure index, per cell", plots.budget_by_exposure(exposure),
        _curve_alt("Line chart", exposure, "exposure index", exposure_ticks),
        "Stream instances of each cell; error bars are 95% bootstrap intervals over tasks, drawn "
        "per exposure.", section=EXPOSURE))
    gaps = curves.get("gap_curves", pd.DataFrame())
    if not gaps.empty:
        gap_ticks = {int(x): plots.gap_label(int(x)) for x in gaps["x"]}
        figures.append(report_html.Figure(
            "Budget against the gap since last seen", plots.budget_by_gap(gaps),
            _curve_alt("Line chart", gaps, "the number of instances since the task was last "
                       "seen, in bins 1, 2–3, 4–7, ...", gap_ticks),
            "Returning stream instances (exposure 1 and up) by how many instances ago the task "
            "was last served, in doubling bins.", section=EXPOSURE))
    cells = result.cells[result.cells["n"] > 0]
    unit = "tokens" if cells["tokens"].sum() > 0 else "model seconds"
    alt = (f"Scatter: {unit} per stream instance against budget share (%) for {len(cells)} "
           "cells, with 95% intervals on budget share.")
    if len(cells) <= _DESCRIBED:
        alt += "".join(
            f" {r.cell}: {_number((r.tokens if unit == 'tokens' else r.model_s) / r.n, 1)} "
            f"{unit} per instance at {pct(r.budget)}%." for r in cells.itertuples())
    figures.append(report_html.Figure(
        "Compute against budget share", plots.compute_against_budget(result.cells), alt,
        "Compute is logged, not scored: a cell can buy a lower budget share with more model "
        "work.", section=CELLS))
    return figures


# Tables of the run beyond `tables.run_measures`, rendered by their own sections.
COMPUTE, FAULTS, UNFINISHED, STOPPED = "compute", "faults", "unfinished", "stopped"
CURVES = ("exposure_curves", "gap_curves", "exposure_groups")
OWN_SECTIONS = (COMPUTE, FAULTS, UNFINISHED, STOPPED, *CURVES)
STOPPED_TITLE = "Cells stopped at their dollar cap"
_CURVE_INTERVALS = {name: {"budget": ("lo", "hi")} for name in CURVES}


def run_tables(run_dir: Path, seed: int = 0, resamples: int = measures.RESAMPLES
               ) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """Every table of a run's report, unrounded, by name (`tables.run_measures`, the journal's
    compute per cell, infrastructure faults, unfinished instances, the figures' curves), and
    the instance table of `results/instances.parquet`."""
    cells, events = load_run(run_dir)
    frame = measures.instances_frame(events, cells)
    # One set of task resamples for every table, so a quantity shown twice has one interval.
    draws = measures.TaskResamples(np.random.default_rng(seed), resamples)
    out = dict(tables.run_measures(frame, cells, draws, resamples))
    compute, per_instance = journal_summary.run_compute(run_dir)
    out[COMPUTE] = compute
    out[FAULTS] = measures.infrastructure_faults(events)
    out[UNFINISHED] = measures.unfinished_instances(events).rename_axis("cell").reset_index()
    out[STOPPED] = measures.stopped_cells(events)
    served = labels_served.frames_table(Path(run_dir), frame)
    if served is not None:  # a frames track: how many tasks get how many symmetries
        out["frames"] = served
    # the figures draw from their own generator, so the tables never shift with them
    figure_rng = np.random.default_rng([seed, _FIGURE_STREAM])
    stream = frame["phase"] == "stream"
    out["exposure_curves"] = (plots.exposure_curves(frame, figure_rng, resamples) if stream.any()
                              else pd.DataFrame(columns=plots.CURVE_COLUMNS))
    out["gap_curves"] = (plots.gap_curves(frame, figure_rng, resamples) if stream.any()
                         else pd.DataFrame(columns=plots.CURVE_COLUMNS))
    out["exposure_groups"] = plots.group_exposure_curves(frame, figure_rng, resamples)
    return out, results.instances_table(frame, per_instance)


def results_current(run_dir: Path) -> bool:
    """Whether `results/` exists and is newer than every events log and journal of the run."""
    paths = RunPaths(run_dir)
    written = [paths.results / results.INSTANCES, paths.results / results.MEASURES]
    if not all(p.exists() for p in written):
        return False
    oldest = min(p.stat().st_mtime for p in written)
    sources = [f for cell in paths.cell_folders()
               for f in (cell.events, cell.journal / journal_summary.JOURNAL_FILE,
                         *(user.events for user in cell.user_folders())) if f.exists()]
    return all(f.stat().st_mtime <= oldest for f in sources)


def write_results(run_dir: Path, seed: int = 0, resamples: int = measures.RESAMPLES
                  ) -> dict[str, pd.DataFrame]:
    """Write `results/instances.parquet` and `results/measures.parquet`, and return the tables as
    read back from the latter: what the report renders."""
    run_dir = Path(run_dir)
    computed, instances = run_tables(run_dir, seed, resamples)
    long, layout = results.to_long(computed, _CURVE_INTERVALS)
    layout["run"] = {"run": run_dir.resolve().name, "grid": _grid_name(run_dir), "seed": seed,
                     "resamples": resamples, "level": measures.LEVEL}
    paths = RunPaths(run_dir)
    results.write_instances(paths.results / results.INSTANCES, instances)
    results.write_measures(paths.results / results.MEASURES, long, layout)
    return results.read_tables(paths.results / results.MEASURES)


def _compute_section(table: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    headers = ["cell", "calls", "retries", "errors", "refused", "404 probes", "after verdict",
               "prompt tokens", "completion tokens", "USD", "unpriced calls", "latency p50 s",
               "latency p99 s", "USD/instance", "wall s/instance", "model s/instance",
               "overhead s/instance"]
    rows = [[r.cell, _number(r.calls), _number(r.retries), _number(r.errors), _number(r.refused),
             _number(r.probes), _number(r.after_verdict), _number(r.prompt_tokens),
             _number(r.completion_tokens), _usd(r.usd), _number(r.unpriced),
             _number(r.latency_p50_s, 3), _number(r.latency_p99_s, 3), _usd(r.usd_per_instance),
             _number(r.wall_s_per_instance, 2), _number(r.model_s_per_instance, 2),
             _number(r.overhead_s_per_instance, 2)] for r in table.itertuples()]
    return journal_summary.INTRO, _frame(headers, rows)


def _usd(x: float) -> str:
    return DASH if _missing(x) else f"{x:,.4f}"


def write_report(run_dir: Path, seed: int = 0, resamples: int = measures.RESAMPLES) -> Path:
    """Analyse the run in `run_dir`, write `results/*.parquet`, and render `report.md` and
    `report.html` (the same tables plus the figures, one self-contained file) from
    `results/measures.parquet` as read back; returns the markdown path."""
    run_dir = Path(run_dir)
    data = write_results(run_dir, seed, resamples)
    result = measures.RunAnalysis(cells=data["cells"], exposure=data["exposure"],
                                  floor_differences=data["floor"],
                                  forward_transfer=data["transfer"])
    sections = measure_tables_sections({k: v for k, v in data.items() if k not in OWN_SECTIONS})
    if not data[COMPUTE].empty:
        sections[journal_summary.TITLE] = _compute_section(data[COMPUTE])
    if not data[FAULTS].empty:
        sections[INFRASTRUCTURE] = (
            "A proxy or container of the cell died under these instances. Nothing was charged for "
            "them: each was run again from its start after the cell's services restarted, and its "
            "steps before the fault are not counted as the learner's.",
            display_frame(data[FAULTS]))
    if not data[STOPPED].empty:
        stopped = data[STOPPED]
        sections[STOPPED_TITLE] = (
            "These cells reached limits.usd_per_cell before the slot named: nothing of that slot "
            "ran, every instance before it stands and is scored above. Raise the cap and resume "
            "(`carc grid run --resume RUN --usd-per-cell X`) to continue them exactly there.",
            _frame(["cell", "next slot", "USD spent", "reason"],
                   [[r.cell, r.slot, _usd(r.usd_spent), r.reason] for r in stopped.itertuples()]))
    unfinished = data[UNFINISHED].set_index("cell")["unfinished"]
    run_id, grid_name = run_dir.resolve().name, _grid_name(run_dir)
    figures = report_figures(result, data)
    images = _write_key_figures(run_dir, figures)
    summary = "\n".join(f"- {line}" for line in summary_lines(data, _embedded(run_dir), LADDER_ORDER))
    return write_documents(run_dir, report_title(run_id, grid_name), summary,
                           _intro(result, resamples, seed),
                           report_sections(result, unfinished, sections), figures, images)


def _embedded(run_dir: Path) -> bool:
    path = RunPaths(run_dir).grid
    if not path.exists():
        return False
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return (data.get("model") or {}).get("endpoint", "embedded") == "embedded"


def _write_key_figures(run_dir: Path, figures: Sequence[report_html.Figure]) -> list[tuple[str, str]]:
    """The key figures as PNG files beside the report (`figures/`), for report.md to show."""
    folder = Path(run_dir) / FIGURES_DIR
    out = []
    for figure in figures:
        if figure.title in _KEY_FIGURES:
            folder.mkdir(exist_ok=True)
            (folder / _KEY_FIGURES[figure.title]).write_bytes(figure.png)
            out.append((figure.title, f"{FIGURES_DIR}/{_KEY_FIGURES[figure.title]}"))
    return out
