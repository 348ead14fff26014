"""A provider's 429/500 storm: a ladder grid against an endpoint that answers every fourth call
429 (Retry-After) and every seventh 500 finishes with the verdicts of a calm run; every failed
attempt is a journal line, counted as an error and its next attempt as a retry, per cell in
the report and per instance in the results. Real host proxy; the endpoint is the embedded solver
behind a scripted failure schedule (tests/solver_endpoint.py)."""

from __future__ import annotations

import textwrap
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.analysis.report import write_report
from orchestrator.records import RunPaths, read_events
from orchestrator.run.local_pool import execute
from proxy.journal import read_journal
from tests.solver_endpoint import SolverEndpoint

GRID = """\
name: storm
seed: 4
track: {{name: own, tasks: 2, visits: 2, epilogue: 0, fresh_reference: false}}
orders: [sequential]
efforts: [low]
learners: [demo-cache-floor]
sandbox: {{engine: process}}
model: {{endpoint: '{url}', name: carc-solver, timeout_s: 20}}
workers: 1
"""


class Storm(SolverEndpoint):
    """Every 4th call 429 with Retry-After, every 7th a 500; the rest answered."""
    seen = 0
    storm = True

    def do_POST(self):  # noqa: N802
        with self.lock:
            type(self).seen += 1
            n = self.seen
        if self.storm and n % 4 == 0:
            self.rfile.read(int(self.headers["Content-Length"]))
            return self._misbehave("429-retry-after")
        if self.storm and n % 7 == 0:
            self.rfile.read(int(self.headers["Content-Length"]))
            return self._misbehave("500")
        return super().do_POST()


def _run(tmp_path: Path, name: str, storm: bool) -> Path:
    Storm.storm, Storm.seen = storm, 0
    Storm.arm(None)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Storm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = tmp_path / name
        (run / "cells").mkdir(parents=True)
        url = f"http://127.0.0.1:{server.server_port}/v1"
        (run / "grid.yaml").write_text(textwrap.dedent(GRID.format(url=url)))
        execute(run, show_progress=False)
    finally:
        server.shutdown()
    return run


def _verdicts(run: Path) -> dict[str, list[tuple]]:
    return {c.name: [(e.slot, e.status, e.cost) for e in read_events(c.events) if e.type == "instance_end"]
            for c in RunPaths(run).cell_folders()}


@pytest.mark.slow
def test_a_429_500_storm_is_survived_with_every_retry_journaled_and_counted(tmp_path):
    calm = _run(tmp_path, "calm", storm=False)
    stormy = _run(tmp_path, "stormy", storm=True)
    assert _verdicts(stormy) == _verdicts(calm)
    assert all(len(v) == 4 for v in _verdicts(stormy).values())
    write_report(stormy, resamples=200)
    compute = pd.read_parquet(stormy / "results" / "measures.parquet")
    compute = compute[compute["table"] == "compute"].pivot(index="cell", columns="measure", values="value")
    instances = pd.read_parquet(stormy / "results" / "instances.parquet")
    for cell in RunPaths(stormy).cell_folders():
        journal = read_journal(cell.journal / "journal.jsonl")
        failed = [e for e in journal if e.status in (429, 500)]
        statuses = {e.status for e in failed}
        assert statuses == {429, 500}, cell.name
        assert all(e.error for e in failed)
        # the ladder retries every failed attempt: each is an error, and the call after it a retry
        assert compute.at[cell.name, "errors"] == len(failed)
        assert compute.at[cell.name, "retries"] == len(failed)
        assert compute.at[cell.name, "calls"] == len(journal)
        mine = instances[instances["cell"] == cell.name]
        assert mine["retries"].sum() == len(failed) and mine["errors"].sum() == len(failed)
    text = (stormy / "report.md").read_text()
    section = text.split("## Model calls and dollars (proxy journal)")[1].split("\n## ")[0]
    header = next([c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
                  if line.startswith("| cell"))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and "." in line.split("|")[1]]
    assert header[:4] == ["cell", "calls", "retries", "errors"]
    assert all(int(row[2]) > 0 for row in rows)
