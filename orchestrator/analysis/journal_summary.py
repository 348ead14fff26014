"""Compute as the proxy saw it: one row per cell from its journal (every model call, refusals too).

The events carry the learner's own per-call measurements; the journal is the independent record
(it also holds calls a harness makes on its own, e.g. background reviews after the verdict).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from orchestrator.records import RunPaths, read_events
from proxy.journal import JOURNAL_FILE, read_journal

TITLE = "Model calls (proxy journal)"
INTRO = ("Every model call as the journaling proxy recorded it: calls, refused requests (hosts "
         "not on the allowlist), GET requests answered 404 (a harness probing the endpoint for "
         "optional APIs), calls that ended in an error, calls made after an instance's "
         "verdict or between instances, tokens, cost from the price table, and latency. Per "
         "instance: wall time, time spent in model calls (journal latencies of the instance's "
         "slot), and the rest: what the learner or harness itself costs (overhead).")
COLUMNS = ["cell", "calls", "refused", "404 probes", "errors", "after verdict", "prompt tokens",
           "completion tokens", "cost USD", "latency p50 s", "latency p99 s",
           "wall s/instance", "model s/instance", "overhead s/instance"]


def journal_frame(run_dir: Path) -> pd.DataFrame:
    """One row per journal line of every cell of the run."""
    rows = []
    for cell_dir in RunPaths(run_dir).cell_folders():
        path = cell_dir.journal / JOURNAL_FILE
        if not path.exists():
            continue
        for entry in read_journal(path):
            probe = entry.method == "GET" and entry.status == 404  # a harness probing for endpoints
            rows.append({"cell": cell_dir.name, "slot": entry.slot, "phase": entry.phase,
                         "refused": entry.refused, "probe": probe,
                         "error": entry.error is not None and not probe,
                         "prompt_tokens": entry.prompt_tokens or 0,
                         "completion_tokens": entry.completion_tokens or 0,
                         "cost_usd": entry.cost_usd or 0.0, "latency_s": entry.latency_s})
    return pd.DataFrame(rows, columns=["cell", "slot", "phase", "refused", "probe", "error", "prompt_tokens",
                                       "completion_tokens", "cost_usd", "latency_s"])


def instance_walls(run_dir: Path, cell: str) -> dict[int, float]:
    """Wall seconds of each finished instance of a cell, by slot (its events)."""
    path = RunPaths(run_dir).cell(cell).events
    if not path.exists():
        return {}
    return {e.slot: e.wall_s for e in read_events(path) if e.type == "instance_end" and e.wall_s is not None}


def journal_section(run_dir: Path) -> tuple[str, pd.DataFrame] | None:
    frame = journal_frame(run_dir)
    if frame.empty:
        return None
    rows = []
    for cell, calls in frame.groupby("cell", sort=True):
        latency = calls["latency_s"].dropna()
        walls = instance_walls(run_dir, cell)
        model = calls[calls["slot"].isin(list(walls))].groupby("slot")["latency_s"].sum()
        per_slot = [(walls[slot], float(model.get(slot, 0.0))) for slot in walls]
        wall = sum(w for w, _ in per_slot) / len(per_slot) if per_slot else None
        spent = sum(m for _, m in per_slot) / len(per_slot) if per_slot else None
        rows.append([cell, len(calls), int(calls["refused"].sum()), int(calls["probe"].sum()),
                     int(calls["error"].sum()),
                     int(calls["phase"].isin(["after", "between"]).sum()),
                     int(calls["prompt_tokens"].sum()), int(calls["completion_tokens"].sum()),
                     f"{calls['cost_usd'].sum():.4f}",
                     f"{latency.quantile(0.5):.3f}" if len(latency) else "",
                     f"{latency.quantile(0.99):.3f}" if len(latency) else "",
                     "" if wall is None else f"{wall:.2f}", "" if spent is None else f"{spent:.2f}",
                     "" if wall is None else f"{wall - spent:.2f}"])
    return INTRO, pd.DataFrame(rows, columns=COLUMNS)
