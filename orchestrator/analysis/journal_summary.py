"""Compute as the proxy saw it, from every cell's journal (every model call, refusals too): per
cell (`compute_table`) and per instance (`instance_compute`).

The events carry the learner's own per-call measurements; the journal is the independent record
(it also holds calls a harness makes on its own, e.g. background reviews after the verdict, and
every retry). A call is an *error* when it did not end in a 2xx answer (refusals and GET probes
answered 404 are counted apart); it is a *retry* when the call before it in the same cell and
slot failed in a way clients retry (408, 409, 429, 5xx, or no answer at all). That counts a
harness's own retries without knowing its code, and the ladder's alike.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.records import RunPaths, read_events
from proxy.journal import JOURNAL_FILE, read_journal  # noqa: F401  (JOURNAL_FILE: report.results_current)

TITLE = "Model calls and dollars (proxy journal)"
INTRO = ("Every model call as the journaling proxy recorded it: calls, retries (a call after a "
         "408, 409, 429, 5xx or lost answer in the same instance), calls that ended in an error, "
         "refused requests (hosts not on the allowlist), GET requests answered 404 (a harness "
         "probing the endpoint for optional APIs), calls made after an instance's verdict or "
         "between instances, tokens, dollars from the run's price table (calls of a model the "
         "table does not price are counted as unpriced and cost nothing here), and latency. Per "
         "instance: dollars, wall time, time spent in model calls (journal latencies of the "
         "instance's slot), and the rest: what the learner or harness itself costs (overhead).")
RETRIED = frozenset({408, 409, 429})  # and every 5xx, and no answer
FRAME = ["cell", "user", "slot", "phase", "t_start", "status", "refused", "probe", "error", "retryable",
         "retry", "priced", "prompt_tokens", "completion_tokens", "cost_usd", "latency_s"]
COMPUTE = ["cell", "calls", "retries", "errors", "refused", "probes", "after_verdict",
           "prompt_tokens", "completion_tokens", "usd", "unpriced", "latency_p50_s",
           "latency_p99_s", "usd_per_instance", "wall_s_per_instance", "model_s_per_instance",
           "overhead_s_per_instance"]
INSTANCE = ["cell", "user", "slot", "calls", "retries", "errors", "prompt_tokens", "completion_tokens",
            "usd", "model_s"]


def journal_frame(run_dir: Path) -> pd.DataFrame:
    """One row per journal line of every cell of the run, in each journal's order."""
    rows = []
    for cell_dir in RunPaths(run_dir).cell_folders():
        path = cell_dir.journal / JOURNAL_FILE
        if not path.exists():
            continue
        for entry in read_journal(path):
            probe = entry.method == "GET" and entry.status == 404  # a harness probing for endpoints
            failed = entry.error is not None or entry.status is None or entry.status >= 400
            rows.append({
                "cell": cell_dir.name, "user": entry.user, "slot": entry.slot, "phase": entry.phase,
                "t_start": entry.t_start, "status": entry.status, "refused": entry.refused,
                "probe": probe, "error": failed and not probe and not entry.refused,
                "retryable": not entry.refused and (entry.status is None or entry.status in RETRIED
                                                    or entry.status >= 500),
                "retry": False, "priced": entry.cost_usd is not None,
                "prompt_tokens": entry.prompt_tokens or 0,
                "completion_tokens": entry.completion_tokens or 0,
                "cost_usd": entry.cost_usd or 0.0, "latency_s": entry.latency_s})
    frame = pd.DataFrame(rows, columns=FRAME)
    if frame.empty:
        return frame
    frame[["user", "slot"]] = frame[["user", "slot"]].astype("Int64")
    frame = frame.sort_values(["cell", "t_start"], kind="stable").reset_index(drop=True)
    # one instance is one (user, slot): a collective row's proxy serves every user of the row
    previous = frame.groupby(["cell", frame["user"].fillna(-1), frame["slot"].fillna(-1)],
                             sort=False)["retryable"].shift(1)
    frame["retry"] = previous.fillna(False).astype(bool).to_numpy()
    return frame


def instance_walls(run_dir: Path, cell: str) -> dict[int, float]:
    """Wall seconds of each finished instance of a cell, by slot (its events)."""
    path = RunPaths(run_dir).cell(cell).events
    if not path.exists():
        return {}
    return {e.slot: e.wall_s for e in read_events(path) if e.type == "instance_end" and e.wall_s is not None}


def instance_compute(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (cell, user, slot) of the journal (user null in a grid cell): calls (refusals and
    probes left out), retries, errors, tokens, dollars and model seconds. Calls between
    instances have no slot and are left out."""
    calls = frame[~frame["refused"] & ~frame["probe"] & frame["slot"].notna()]
    if calls.empty:
        return pd.DataFrame(columns=INSTANCE)
    g = calls.groupby(["cell", "user", "slot"], sort=False, dropna=False)
    out = pd.DataFrame({"calls": g.size(), "retries": g["retry"].sum(), "errors": g["error"].sum(),
                        "prompt_tokens": g["prompt_tokens"].sum(),
                        "completion_tokens": g["completion_tokens"].sum(),
                        "usd": g["cost_usd"].sum(), "model_s": g["latency_s"].sum()}).reset_index()
    out["slot"] = out["slot"].astype("int64")
    return out[INSTANCE]


def compute_table(frame: pd.DataFrame, walls: dict[str, dict[int, float]]) -> pd.DataFrame:
    """One row per cell with a journal: the counts of the module's intro, unrounded; per-instance
    figures over the cell's finished instances (`walls`: cell -> slot -> wall seconds)."""
    rows = []
    for cell, lines in frame.groupby("cell", sort=False):
        calls = lines[~lines["refused"] & ~lines["probe"]]
        latency = lines["latency_s"].dropna()
        finished = walls.get(cell, {})
        in_finished = calls[calls["slot"].isin(list(finished))]
        model = in_finished.groupby("slot")["latency_s"].sum()
        usd = in_finished.groupby("slot")["cost_usd"].sum()
        n = len(finished)
        wall = sum(finished.values()) / n if n else np.nan
        spent = float(sum(model.get(slot, 0.0) for slot in finished)) / n if n else np.nan
        rows.append({
            "cell": cell, "calls": len(calls), "retries": int(calls["retry"].sum()),
            "errors": int(calls["error"].sum()), "refused": int(lines["refused"].sum()),
            "probes": int(lines["probe"].sum()),
            "after_verdict": int(calls["phase"].isin(["after", "between"]).sum()),
            "prompt_tokens": int(calls["prompt_tokens"].sum()),
            "completion_tokens": int(calls["completion_tokens"].sum()),
            "usd": float(calls["cost_usd"].sum()), "unpriced": int((~calls["priced"]).sum()),
            "latency_p50_s": latency.quantile(0.5) if len(latency) else np.nan,
            "latency_p99_s": latency.quantile(0.99) if len(latency) else np.nan,
            "usd_per_instance": float(usd.sum()) / n if n else np.nan,
            "wall_s_per_instance": wall, "model_s_per_instance": spent,
            "overhead_s_per_instance": wall - spent})
    return pd.DataFrame(rows, columns=COMPUTE)


def run_compute(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's per-cell compute table and per-instance journal figures."""
    frame = journal_frame(run_dir)
    if frame.empty:
        return pd.DataFrame(columns=COMPUTE), pd.DataFrame(columns=INSTANCE)
    walls = {cell: instance_walls(run_dir, cell) for cell in frame["cell"].unique()}
    return compute_table(frame, walls), instance_compute(frame)
