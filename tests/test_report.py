"""`write_report`: a tiny run directory written with the real `EventLog` -> report.md with the
expected sections and hand-computed numbers."""

from pathlib import Path

import pytest

from orchestrator.analysis.report import load_run, pct_ci, write_report
from orchestrator.records import Event, EventLog
from tests.run_dirs import new_cell_folder

FLOOR = "stateless-floor.medium.workstreams.s0"
DEMO = "demo-cache-floor.medium.workstreams.s0"


def write_cell(run: Path, learner: str, slots: list[tuple[str, str, int, int, int | None]]) -> None:
    """A cell folder: cell.json plus events for (phase, task, visit, exposure, cost) slots; a cost
    of None leaves the instance unfinished."""
    cell, folder = new_cell_folder(run, learner)
    with EventLog(folder / "events.jsonl") as log:
        for slot, (phase, task, visit, exposure, cost) in enumerate(slots):
            where = dict(cell=cell, slot=slot, phase=phase, task=task, visit=visit,
                         exposure=exposure, t=1.0)
            log.append(Event(type="instance_start", **where))
            log.append(Event(type="step", step=1, action={"action": "request_demos"},
                             outcome="demo", cost=1, model_calls=2, prompt_tokens=500,
                             completion_tokens=50, model_s=1.25, **where))
            if cost is None:
                continue
            log.append(Event(type="instance_end", status="failed" if cost == 16 else "solved",
                             cost=cost, first_submit_demos=1, first_answer_correct=cost == 1,
                             wall_s=2.0, model_calls=2, prompt_tokens=500, completion_tokens=50,
                             model_s=1.25, cost_usd=0.0, **where))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "toy-run"
    stream = [("t1", 0, 0), ("t2", 0, 0), ("t1", 1, 1), ("t2", 1, 1)]
    # floor shares 1, .25, .5, .25; demo-cache 1, .25, .25, 0: one slot-by-slot saving of 4 per task
    write_cell(run, "stateless-floor",
               [("stream", t, v, e, c) for (t, v, e), c in zip(stream, [16, 4, 8, 4])]
               + [("epilogue", "e1", 0, 0, None)])
    write_cell(run, "demo-cache-floor",
               [("stream", t, v, e, c) for (t, v, e), c in zip(stream, [16, 4, 4, 0])]
               + [("epilogue", "e1", 0, 0, 2), ("fresh", "e1", 0, 0, 6)])
    (run / "grid.yaml").write_text("name: toy-grid\nlearners: [stateless-floor, demo-cache-floor]\n")
    return run


def test_report_is_written_with_title_sections_and_hand_computed_numbers(run: Path):
    path = write_report(run, seed=0, resamples=10_000)
    assert path == run / "report.md"
    text = path.read_text()
    assert text.startswith("# carc report: run toy-run, grid toy-grid\n")
    for heading in ("## Per cell (stream)", "## Budget against exposure index",
                    "## Paired difference from the stateless floor", "## Forward transfer",
                    "## In progress"):
        assert heading in text
    lines = text.splitlines()
    floor_row = next(l for l in lines if l.startswith(f"| {FLOOR} | 50.0"))
    # budget: task t1 (1 + .5) / 2, t2 .25 -> 50.0, resamples .75, .25 or .5; solved 3 of 4
    assert "| 50.0 [25.0, 75.0] | 75.0 [50.0, 100.0] | 4 |" in floor_row
    assert "| 8 | 2,200 | 5.0 |" in floor_row  # model calls, tokens, model seconds
    assert f"| {DEMO} | 37.5 [12.5, 62.5] | 75.0 [50.0, 100.0] | 4 |" in text
    assert f"| {FLOOR} | 62.5 | 37.5 | – | – | – | – | – | – |" in text
    assert f"| {DEMO} | 62.5 | 12.5 | – |" in text
    # a saving of exactly 12.5 points in every resample: savings beyond 12.5 excluded, MDE 0
    assert f"| {DEMO} | {FLOOR} | -12.5 [-12.5, -12.5] | 12.5 | 0.0 | 4 |" in text
    assert f"| {DEMO} | 12.5 | 37.5 | -25.0 [-25.0, -25.0] | 25.0 | 0.0 | 1 |" in text
    assert f"| {FLOOR} | 1 |" in text.split("## In progress")[1]


def test_report_says_how_to_read_it(run: Path):
    text = write_report(run, resamples=200).read_text()
    assert "cost / 16" in text and "Lower is better" in text
    assert "bootstrap intervals over tasks" in text and "slot by slot" in text
    assert "*savings excluded beyond (points)* is the X for which a saving larger than X points " \
           "is excluded at 95%, one-sided" in text
    assert "*MDE 80% (points)* is the minimum detectable effect" in text and "2.80 times" in text
    floor_header = text.split("## Paired difference from the stateless floor")[1].splitlines()
    assert "| cell | stateless floor | difference (points) | savings excluded beyond (points) | " \
           "MDE 80% (points) | pairs |" in floor_header


def test_report_is_the_same_for_the_same_seed(run: Path):
    first = write_report(run, seed=3, resamples=500).read_text()
    assert write_report(run, seed=3, resamples=500).read_text() == first


def test_cells_are_listed_floor_first_whatever_the_folder_names(run: Path):
    cells, events = load_run(run)
    assert list(cells) == [FLOOR, DEMO]
    assert len(events[DEMO]) == 6 * 3


def test_a_cell_folder_without_cell_json_is_an_error_naming_the_file(run: Path):
    (run / "cells" / "stray").mkdir()
    with pytest.raises(FileNotFoundError, match="stray/cell.json: missing"):
        write_report(run, resamples=100)


def test_a_run_with_no_finished_instance_still_gets_a_report(tmp_path: Path):
    run = tmp_path / "empty"
    write_cell(run, "stateless-floor", [("stream", "t1", 0, 0, None)])
    text = write_report(run, resamples=100).read_text()
    assert "No finished instance yet." in text and f"| {FLOOR} | 1 |" in text


def test_interval_format_is_percent_with_one_decimal():
    assert pct_ci(0.375, 0.3125, 0.44) == "37.5 [31.2, 44.0]"


def test_a_cells_budget_has_one_interval_in_the_per_cell_and_the_pooled_tables(tmp_path: Path):
    # one order: the pooled group of a cell is that cell, so one set of resamples gives one interval
    run = tmp_path / "varied"
    stream = [(f"t{k}", v, v) for v in range(2) for k in range(7)]
    for learner, costs in (("stateless-floor", [16, 3, 9, 1, 12, 5, 2, 16, 4, 7, 2, 11, 6, 1]),
                           ("demo-cache-floor", [16, 2, 8, 1, 10, 4, 1, 3, 1, 5, 0, 9, 2, 0])):
        write_cell(run, learner, [("stream", t, v, e, c) for (t, v, e), c in zip(stream, costs)])
    (run / "grid.yaml").write_text("name: varied\nlearners: [stateless-floor, demo-cache-floor]\n")
    text = write_report(run, seed=0, resamples=2_000).read_text()

    def budget_cells(heading: str) -> list[str]:
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
        header = [c.strip() for c in rows[0].strip("|").split("|")]
        column = next(i for i, name in enumerate(header) if name.lower().startswith("budget"))
        return [[c.strip() for c in row.strip("|").split("|")][column] for row in rows[1:]]

    per_cell, pooled = budget_cells("## Per cell (stream)"), budget_cells("## Per cell group, pooled over stream orders")
    assert per_cell and sorted(per_cell) == sorted(pooled)


def test_the_summary_names_a_saving_its_intervals_support_and_only_that(tmp_path: Path):
    """12 tasks met twice: the demo-cache floor pays 8 on the first meeting and 2 on the return,
    the floor 8 both times; the summary names the saving, and no cost."""
    run = tmp_path / "clear"
    stream = [(f"t{k:02d}", v, v) for v in (0, 1) for k in range(12)]
    write_cell(run, "stateless-floor", [("stream", t, v, e, 8) for t, v, e in stream])
    write_cell(run, "demo-cache-floor", [("stream", t, v, e, 8 if v == 0 else 2) for t, v, e in stream])
    (run / "grid.yaml").write_text("name: clear\nlearners: [stateless-floor, demo-cache-floor]\n")
    text = write_report(run, seed=0, resamples=2_000).read_text()
    summary = text.split("## Summary")[1].split("**How to read.**")[0]
    assert ("Saved against the stateless floor: demo-cache-floor at medium effort, 18.8 points "
            "[18.8, 18.8]") in summary
    assert "used more than" not in summary.lower()
    assert "embedded offline model" in summary  # the grid names no endpoint: the embedded model
    assert "![Budget against exposure index, by effort](figures/exposure-by-effort.png)" in summary
    assert (run / "figures" / "exposure-by-effort.png").read_bytes().startswith(b"\x89PNG")
    html = (run / "report.html").read_text()
    assert html.index("<h2>Summary</h2>") < html.index("<h2>How to read</h2>") < html.index("<h2>Per cell")
