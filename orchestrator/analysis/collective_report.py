"""The report of a collective run: `results/instances.parquet` (every user's instances),
`results/measures.parquet` (every number, long), and `report.md` / `report.html` rendered from the
latter as read back, like a single-user run's (orchestrator/analysis/report.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import yaml

from orchestrator.analysis import collective, journal_summary, report_html, results
from orchestrator.analysis.measures import LEVEL, RESAMPLES
from orchestrator.analysis.report import (display_frame, how_to_read, pct, pct_ci, report_title,
                                          write_documents)
from orchestrator.records import RunPaths

TITLE = "Collective regime"

INTROS = {
    "collective_rows": (
        "Rows", "Every verdict of every user, charged as in a single-user run; budget share and share "
        "solved over the stream with intervals over tasks; the spread is between users' own budget "
        "shares (standard deviation, lowest, highest). memory-on rows are each user's independent "
        "learner (the control for sharing); collective rows also read the round's shared state."),
    "collective_rounds": (
        "Budget by round", "Round r is slots [r S, (r+1) S) of every user; a collective row's shared "
        "state is rewritten between rounds."),
    "collective_exposure": (
        "Budget by the user's own exposure", "The exposure index: how often this user had met the "
        "task before."),
    "collective_reach": (
        "Budget by collective exposure", "Meetings of the task by any user of the row in the rounds "
        "before this one, plus this user's own earlier meetings in the round: what the row could have "
        "learnt from when the instance began."),
    "collective_gaps": (
        "Budget by gap since last seen", "Returning instances only: slots since this user last met "
        "the task."),
    "collective_paired": (
        "Paired on (user, slot)", "Budget share of the row minus the other's, instance by instance on "
        "the same user's same slot (the same grids); negative: the row spends less. bound and mde: "
        "the saving the data exclude at 95% one-sided, and the smallest effect detectable at 80% "
        "power."),
    "collective_epilogue": (
        "New tasks: the epilogue halves", "The held-out tasks, new to everyone, served to the first "
        "half of the users in one round and to the second half in the next, after an update: second "
        "minus first is how fast the row learns a task from the first half. The halves are different "
        "users: compare a collective row's difference with its independent twin's."),
    "collective_updates": (
        "Update steps", "Between rounds, every row that shares rewrites what its users read next: "
        "a collective row's shared state (merged from every user's state; what was kept), a "
        "harness's library (rewritten by a curator session of the harness: tasks_curated, one "
        "conversation per task met; curator_errors, those that failed; library_files, the task "
        "files read back; library_changed, those that differ from the round before), a trained "
        "row's model (trained on every user's records; programs: the round's solved instances whose "
        "verified program it counted, unexplained: solved instances it found no program for, "
        "trained_on: programs counted so far; top_primitives: the prior's most counted). Round r's "
        "line is the state that round read; round 0's is empty."),
}
SHARES = {"budget", "solved", "user_sd", "user_min", "user_max", "mean", "first", "second",
          "second_minus_first", "mean_bound", "mean_mde"}
SIGNED = {"mean", "second_minus_first", "mean_bound", "mean_mde"}


def write_collective_results(run_dir: Path, seed: int = 0, resamples: int = RESAMPLES
                             ) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Write results/instances.parquet (the schema of every run, `results.instances_table`) and
    results/measures.parquet; return the instances and the tables as read back from the
    latter."""
    paths = RunPaths(run_dir)
    frame = collective.collective_frame(run_dir)
    tables = collective.collective_tables(frame, seed, resamples)
    tables["collective_updates"] = collective.updates_table(run_dir)
    long, layout = results.to_long({k: report_html.flat(v) for k, v in tables.items()},
                                   {"collective_epilogue": {"second_minus_first": ("lo", "hi")},
                                    "collective_paired": {"mean": ("lo", "hi")}})
    layout["run"] = {"run": Path(run_dir).resolve().name, "grid": stored_grid(run_dir).get("name"), "seed": seed,
                     "resamples": resamples, "level": LEVEL}
    results.write_instances(paths.results / results.INSTANCES,
                            results.instances_table(frame, journal_summary.run_compute(run_dir)[1]))
    results.write_measures(paths.results / results.MEASURES, long, layout)
    return frame, results.read_tables(paths.results / results.MEASURES)


def stored_grid(run_dir: Path) -> dict:
    """The run's grid.yaml as data (the analysis reads records, never the run layer)."""
    data = yaml.safe_load(RunPaths(run_dir).grid.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def is_collective(run_dir: Path) -> bool:
    return RunPaths(run_dir).grid.exists() and bool(stored_grid(run_dir).get("collective"))


def summary_lines(frame: pd.DataFrame, data: dict[str, pd.DataFrame], users: int) -> list[str]:
    rows = data["collective_rows"]
    lines = [f"{len(frame):,} instances: {users} users x {frame['slot'].max() + 1 if len(frame) else 0} "
             f"slots x {len(rows)} rows; every verdict charged and scored."]
    for r in rows.itertuples():
        lines.append(f"{r.label}: budget share {pct_ci(r.budget, r.budget_lo, r.budget_hi)}, solved "
                     f"{pct(r.solved)}; between users {pct(r.user_min)} to {pct(r.user_max)}.")
    for r in data["collective_paired"].itertuples():
        if r.against == "independent twin":
            lines.append(f"{r.cell.split('.')[0]} minus its independent twin, paired on (user, slot): "
                         f"{pct_ci(r.mean, r.lo, r.hi, signed=True)} of the budget ({r.pairs:,} pairs).")
    return lines


def write_collective_report(run_dir: Path, seed: int = 0, resamples: int = RESAMPLES) -> Path:
    run_dir = Path(run_dir)
    grid = stored_grid(run_dir)
    setting, track = grid["collective"], grid.get("track", {})
    frame, data = write_collective_results(run_dir, seed, resamples)
    sections: dict[str, tuple[str, pd.DataFrame]] = {}
    for name, (title, intro) in INTROS.items():
        table = data.get(name, pd.DataFrame())
        if name == "collective_epilogue":  # its interval is the difference's
            table = table.rename(columns={"lo": "second_minus_first_lo", "hi": "second_minus_first_hi"})
        sections[f"{TITLE}: {title}"] = (intro, display_frame(table, SHARES & set(table.columns),
                                                              SIGNED & set(table.columns)))
    summary = "\n".join(f"- {line}" for line in summary_lines(frame, data, setting.get("users", 100)))
    settings = (f"{setting.get('users', 100)} users, rounds of {setting.get('round_slots', 25)} slots, sharing "
                f"{'on' if setting.get('share', True) else 'off'}; track {track.get('name')}, "
                f"{track.get('tasks')} tasks x {track.get('visits')} visits, epilogue {track.get('epilogue')}.")
    intro = how_to_read(resamples, seed) + f"\n\nThe collective regime: {settings}"
    return write_documents(run_dir, report_title(run_dir.resolve().name, grid.get("name")), summary,
                           intro, sections)
