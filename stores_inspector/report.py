"""The markdown account per cell: counts in the spirit of the seed's "What each harness kept",
then the timeline of what was kept and the instances that came back."""

from __future__ import annotations

from typing import Any

import pandas as pd

from orchestrator.rows import STATELESS_ROWS
from stores_inspector.parser import HarnessParser

TABLE_ROWS = 40  # rows shown per table in the markdown; the CSV/parquet tables have them all


def _share(part: int, whole: int) -> str:
    return f"{part} of {whole} ({100 * part / whole:.0f}%)" if whole else "none"


def summarize(cell: str, harness: str | None, row: str, tables: dict[str, pd.DataFrame],
              parser: HarnessParser) -> dict[str, Any]:
    """The counts of one cell, in the order the report prints them."""
    timeline, runs, returns, problems = (tables[k] for k in ("timeline", "runs", "returns", "problems"))
    out: dict[str, Any] = {"cell": cell, "harness": harness or "unknown", "row": row,
                           "instances": len(returns), "returning instances": int(returns["returning"].sum())}
    if row in STATELESS_ROWS:
        out["state"] = "emptied by carc before every instance"
    written = timeline[(timeline["change"] != "deleted") & (timeline["mechanism"] != "setup")]
    created = written[written["change"] == "created"]
    out["entries written"] = len(created)
    out["entries written that name a task"] = int((created["names_task"] != "").sum())
    out["entries written that name their own instance's task"] = int(created["names_own_task"].sum())
    out["entries changed"] = int((written["change"] == "changed").sum())
    out["entries deleted"] = int(((timeline["change"] == "deleted") & (timeline["mechanism"] != "wipe")).sum())
    for mechanism, group in written.groupby("mechanism"):
        before = int((group["when"] == "before").sum())
        out[f"written by {mechanism}"] = f"{len(group)} ({before} before the verdict)"
    for mechanism, group in runs.groupby("mechanism"):
        out[f"{mechanism} runs"] = f"{len(group)}, {_share(int(group['before_verdict'].sum()), len(group))} " \
                                   "started before the verdict"
    seen = returns.dropna(subset=["digest"])
    if len(seen):
        distinct = seen["digest"].nunique()
        empty = int(seen["digest_empty"].astype(bool).sum())
        out["session digest"] = (f"identical in all {len(seen)} sessions" if distinct == 1
                                 else f"{distinct} distinct in {len(seen)} sessions") + \
                                (f"; empty in {empty}" if empty else "")
    back = returns[returns["returning"]]
    if len(back):
        out["returning: task material reached the model before the first action"] = \
            _share(int(back["reached"].fillna(False).sum()), len(back))
        out["returning: looked for it before the first action"] = _share(int(back["looked"].fillna(False).sum()),
                                                                          len(back))
        out["returning: a lookup found it"] = _share(int(back["found"].fillna(False).sum()), len(back))
        out["returning: answered at cost 0"] = _share(int(back["cost0"].fillna(False).sum()), len(back))
    first = returns[~returns["returning"]]
    if len(first) and first["reached"].notna().any():
        out["first meetings: task material reached the model (a check: should be none)"] = \
            _share(int(first["reached"].fillna(False).sum()), len(first))
    for label, group in (("returning", back), ("first", first)):
        if len(group) and group["pairs_bought"].notna().any():
            out[f"pairs bought per {label} instance"] = round(float(group["pairs_bought"].mean()), 2)
    out.update(parser.summary(tables))
    out["could not read"] = len(problems)
    return out


def _table(frame: pd.DataFrame, columns: list[str]) -> str:
    if frame.empty:
        return "(none)\n"
    shown = frame[columns].head(TABLE_ROWS).fillna("")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, row in shown.iterrows():
        cells = [str(v).replace("|", "\\|").replace("\n", " ")[:90] for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    if len(frame) > TABLE_ROWS:
        lines.append(f"\n{len(frame) - TABLE_ROWS} more rows in the table files.")
    return "\n".join(lines) + "\n"


def cell_section(summary: dict[str, Any], tables: dict[str, pd.DataFrame]) -> str:
    counts = "\n".join(f"- {k}: {v}" for k, v in summary.items() if k not in ("cell", "harness", "row"))
    timeline = tables["timeline"]
    kept = timeline[~timeline["mechanism"].isin(["setup", "wipe"])]
    back = tables["returns"][tables["returns"]["returning"]]
    problems = tables["problems"]
    parts = [f"## {summary['cell']}\n", f"{summary['harness']}, row {summary['row'] or '?'}.\n", counts + "\n",
             "### What was kept, when, by which mechanism\n",
             _table(kept, ["slot", "task", "visit", "change", "kind", "mechanism", "when", "names_task",
                           "evidence", "excerpt"]),
             "\n### Did it come back (returning instances)\n",
             _table(back, ["slot", "task", "visit", "reached", "reached_via", "looked", "lookups", "found",
                           "cost", "pairs_bought", "reached_excerpt"])]
    if len(problems):
        parts += ["\n### Could not read\n", "\n".join(f"- `{r.where}`: {r.what}" for r in problems.itertuples()) + "\n"]
    return "\n".join(parts)


def _points(value: Any) -> str:
    return "" if value is None or pd.isna(value) else f"{100 * value:+.1f}"


def overview(summaries: list[dict[str, Any]], tables: dict[str, pd.DataFrame],
             twins: pd.DataFrame | None) -> str:
    """One line per cell: what was kept and by which mechanism, whether it came back before the
    first action on returning instances, and the paired budget difference against the cell's
    memory-off twin (`measures.twin_table`, indexed by cell) with its equivalence bound."""
    timeline, returns = tables.get("timeline"), tables.get("returns")
    columns = ["cell", "harness", "row", "kept (by mechanism)", "returning", "reached", "found",
               "cost 0", "twin", "minus twin (points) [95%]", "savings excluded beyond (points)"]
    lines = ["## Per harness and row\n",
             "Kept: entries created, by the mechanism that wrote them (setup and wipes left out). "
             "Reached / found: returning instances whose first model call carried the task's "
             "material, or whose lookup before the first action found it. The budget difference is "
             "paired slot by slot against the memory-off twin, with a bootstrap over tasks as in "
             "the grid report (negative is a saving).\n",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for summary in summaries:
        cell = summary["cell"]
        kept = "" if timeline is None or timeline.empty else ", ".join(
            f"{n} {m}" for m, n in timeline[(timeline["cell"] == cell) & (timeline["change"] == "created")
                                             & ~timeline["mechanism"].isin(["setup", "wipe"])]
            .groupby("mechanism").size().items())
        back = pd.DataFrame() if returns is None or returns.empty else \
            returns[(returns["cell"] == cell) & returns["returning"].astype(bool)]
        count = (lambda col: str(int(back[col].fillna(False).astype(bool).sum())) if len(back) else "")
        twin = twins.loc[cell] if twins is not None and cell in twins.index else None
        interval = "" if twin is None or pd.isna(twin["twin_mean"]) else \
            f"{_points(twin['twin_mean'])} [{_points(twin['twin_lo'])}, {_points(twin['twin_hi'])}]"
        bound = "" if twin is None or pd.isna(twin["twin_bound"]) else f"{100 * twin['twin_bound']:.1f}"
        cells = [cell, summary.get("harness", ""), summary.get("row", ""), kept or "nothing",
                 str(len(back)), count("reached"), count("found"), count("cost0"),
                 "" if twin is None or twin["twin"] is None else str(twin["twin"]), interval, bound]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(run_name: str, summaries: list[dict[str, Any]], sections: list[str], notes: list[str],
             overview_table: str = "") -> str:
    head = [f"# What each harness kept: {run_name}\n",
            "Read from the state snapshots after every instance, the harness stores in the last "
            "snapshot, and the proxy journal (docs/inspector.md says how each column is found).\n"]
    head += [f"_{n}_\n" for n in notes]
    return "\n".join(head + ([overview_table] if overview_table else []) + sections)
