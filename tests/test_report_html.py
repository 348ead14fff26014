"""`write_report` writes report.html next to report.md: one self-contained page with the same tables
(sortable) and the figures as embedded PNGs. The run directory is written with the real `EventLog`
on a real workstreams schedule; the browser test opens the page in the real headless Chromium
(Debian's `/usr/bin/chromium`) over the Chrome DevTools Protocol."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis import measures, plots
from orchestrator.analysis.report import display_frame, load_run, measure_tables_sections, write_report
from orchestrator.analysis.report_html import Figure, render_html, sort_key
from orchestrator.records import Event, EventLog
from orchestrator.streams import build_stream, epilogue
from tests.run_dirs import new_cell_folder

PNG = b"\x89PNG\r\n\x1a\n"
CHROMIUM = Path("/usr/bin/chromium")
LEARNERS = ("stateless-floor", "demo-cache-floor", "program-library")
SECTIONS = ("Per cell (stream)", "Budget against exposure index",
            "Paired difference from the stateless floor", "Forward transfer", "In progress")


def cost_of(learner: str, difficulty: float, exposure: int, rng: np.random.Generator) -> int:
    """A plausible cost: the floor pays the same on every visit, the demo cache buys fewer pairs
    from the second meeting on, the program library often answers with no pair at all."""
    if rng.random() < difficulty * (0.6 if learner == "program-library" and exposure else 1.0):
        return 16
    pairs = int(rng.integers(2, 6))
    if learner == "demo-cache-floor" and exposure:
        pairs = max(pairs - 2, 0)
    if learner == "program-library" and exposure:
        pairs = 0 if rng.random() < 0.5 + 0.05 * exposure else max(pairs - 3, 0)
    return pairs + int(rng.random() < 0.2)


def write_cell(run: Path, learner: str, seed: int, unfinished: bool) -> None:
    """One cell on the 6-task workstreams schedule (48 stream instances), a 3-task epilogue and its
    fresh reference, each instance a start, one step per pair bought and an end; `unfinished`
    leaves the last fresh instance without its end."""
    cell, folder = new_cell_folder(run, learner)
    stream = build_stream([f"own-{k}" for k in range(6)], "workstreams", seed=0)
    held_out = epilogue([f"held-{k}" for k in range(3)], seed=0, start_index=len(stream))
    fresh = epilogue([f"held-{k}" for k in range(3)], seed=0, start_index=len(stream) + 3)
    slots = ([("stream", s) for s in stream.slots] + [("epilogue", s) for s in held_out]
             + [("fresh", s) for s in fresh])
    difficulty = {task: 0.15 + 0.1 * k for k, task in enumerate(sorted(
        {s.task_id for _, s in slots}))}
    rng = np.random.default_rng([seed, 17])
    with EventLog(folder / "events.jsonl") as log:
        for number, (phase, slot) in enumerate(slots):
            where = dict(cell=cell, slot=slot.index, phase=phase, task=slot.task_id,
                         visit=slot.visit, exposure=slot.exposure, t=1_700_000_000.0 + number)
            cost = cost_of(learner if phase != "fresh" else "stateless-floor",
                           difficulty[slot.task_id], slot.exposure, rng)
            pairs = min(cost, 8)
            log.append(Event(type="instance_start", **where))
            for step in range(1, pairs + 1):
                log.append(Event(type="step", step=step, action={"action": "request_demos"},
                                 outcome="demo", cost=step, model_calls=1,
                                 prompt_tokens=400 + 90 * step, completion_tokens=60,
                                 model_s=0.4, **where))
            if unfinished and number == len(slots) - 1:
                continue
            log.append(Event(type="instance_end", status="failed" if cost == 16 else "solved",
                             cost=cost, first_submit_demos=pairs,
                             first_answer_correct=cost < 16, wall_s=1.5 + pairs,
                             model_calls=pairs + 1, prompt_tokens=900 + 400 * pairs,
                             completion_tokens=80 * (pairs + 1), model_s=0.5 + 0.4 * pairs,
                             cost_usd=0.0, **where))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A three-cell ladder run (floor, demo cache, program library) with its report written."""
    run = tmp_path_factory.mktemp("html") / "ladder-run"
    for seed, learner in enumerate(LEARNERS):
        write_cell(run, learner, seed, unfinished=learner == "program-library")
    (run / "grid.yaml").write_text("name: ladder-grid\nlearners: [stateless-floor]\n")
    write_report(run, seed=0, resamples=2_000)
    return run


def images(page: str) -> list[tuple[str, bytes]]:
    """(alt, PNG bytes) of every <img> of a page."""
    return [(html.unescape(alt), base64.b64decode(data)) for data, alt in re.findall(
        r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="([^"]*)">', page)]


# --- the file ------------------------------------------------------------------------------------

def test_report_html_is_written_next_to_report_md_with_every_section_and_five_figures(run: Path):
    page = (run / "report.html").read_text(encoding="utf-8")
    markdown = (run / "report.md").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "<h1>carc report: run ladder-run, grid ladder-grid</h1>" in page
    for title in SECTIONS:
        assert f"## {title}\n" in markdown and f"<h2>{html.escape(title)}</h2>" in page
    assert page.count("<img ") == 5
    figures = images(page)
    assert len(figures) == 5
    for alt, png in figures:
        assert png.startswith(PNG) and len(png) > 5_000
        assert len(alt) > 40
    assert "<strong>How to read.</strong>" in page and "<em>budget share</em>" in page


def test_every_number_of_the_markdown_tables_is_in_the_html_tables(run: Path):
    page = (run / "report.html").read_text(encoding="utf-8")
    lines = (run / "report.md").read_text().splitlines()
    # body rows only: a header row is the one right above its "| ---" rule
    rows = [line for line, after in zip(lines, lines[1:] + [""])
            if line.startswith("| ") and not line.startswith("| ---") and not after.startswith("| ---")]
    assert len(rows) > 10
    for row in rows:
        for value in row.strip("| ").split(" | "):
            assert re.search(f">{re.escape(html.escape(value))}</td>", page), (value, row)


def test_report_html_fetches_nothing(run: Path):
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page
    links = re.findall(r'\b(?:src|href)="([^"]*)"', page)
    assert len(links) > 4 and all(link.startswith(("data:", "#")) for link in links)
    assert "default-src 'none'" in page  # and the browser is told to fetch nothing else


def test_the_same_seed_gives_the_same_page_byte_for_byte(run: Path, tmp_path: Path):
    page = (run / "report.html").read_text(encoding="utf-8")
    again = tmp_path / "ladder-run"
    for folder in (run / "cells").iterdir():
        (again / "cells" / folder.name).mkdir(parents=True)
        for name in ("cell.json", "events.jsonl"):
            (again / "cells" / folder.name / name).write_bytes((folder / name).read_bytes())
    (again / "grid.yaml").write_bytes((run / "grid.yaml").read_bytes())
    write_report(again, seed=0, resamples=2_000)
    assert (again / "report.html").read_text(encoding="utf-8") == page


def test_a_run_with_no_finished_instance_gets_a_page_without_figures(tmp_path: Path):
    run = tmp_path / "empty"
    cell = "stateless-floor.medium.workstreams.s0"
    (run / "cells" / cell).mkdir(parents=True)
    (run / "cells" / cell / "cell.json").write_text(json.dumps({"cell": cell,
                                                                "learner": "stateless-floor"}))
    with EventLog(run / "cells" / cell / "events.jsonl") as log:
        log.append(Event(type="instance_start", cell=cell, slot=0, phase="stream", task="t1",
                         visit=0, exposure=0, t=1.0))
    write_report(run, resamples=100)
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "No finished instance yet." in page and "<h2>In progress</h2>" in page
    assert "<img" not in page


# --- the renderer --------------------------------------------------------------------------------

def test_a_new_table_drops_in_as_one_more_section_with_numbers_formatted_and_text_escaped():
    frame = pd.DataFrame({"cell": ["a<b>", "c"], "instances": [1200, 7],
                          "gain": [0.125, float("nan")], "kept": [True, False]})
    page = render_html("t", "intro *here*", {"New measure": ("What it is.", frame)}, [
        Figure("Loose", PNG + b"x", alt="a loose figure"),
        Figure("Placed", PNG + b"y", alt="a placed figure", section="New measure")])
    assert '<section id="new-measure"><h2>New measure</h2><p>What it is.</p>' in page
    assert "<td>a&lt;b&gt;</td>" in page and "<b>" not in page
    assert '<td class="num" data-sort="1200.0">1,200</td>' in page
    assert '<td class="num" data-sort="0.125">0.12</td>' in page
    assert '<td class="num" data-sort="">–</td>' in page
    assert "<td>yes</td>" in page
    assert page.index('alt="a placed figure"') < page.index("<h2>Figures</h2>") \
        < page.index('alt="a loose figure"')
    assert "<p>intro <em>here</em></p>" in page


def test_a_formatted_cell_sorts_by_its_leading_number():
    assert sort_key("-12.5 [-20.1, -4.0]") == -12.5
    assert sort_key("2,200") == 2200.0
    assert sort_key("37.5 %") == 37.5
    assert sort_key("–") is None and sort_key("stateless-floor.low") is None
    assert sort_key(float("nan")) is None and sort_key(3) == 3.0


def test_a_raw_measure_table_is_shown_with_the_markdown_reports_formats():
    raw = pd.DataFrame({"cell": ["a", "b"], "gain": [0.375, float("nan")],
                        "gain_lo": [0.3125, float("nan")], "gain_hi": [0.44, float("nan")],
                        "mean": [-0.125, 0.05], "lo": [-0.2, 0.0], "hi": [-0.05, 0.1],
                        "pairs": [1200, 3], "ratio": [1.234, float("nan")]})
    shown = display_frame(raw, shares={"gain", "mean"}, signed={"mean"})
    assert list(shown.columns) == ["cell", "gain", "mean", "pairs", "ratio"]
    assert shown.iloc[0].tolist() == ["a", "37.5 [31.2, 44.0]", "-12.5 [-20.0, -5.0]", "1,200",
                                      "1.23"]
    assert shown.iloc[1].tolist() == ["b", "–", "+5.0 [+0.0, +10.0]", "3", "–"]


def test_the_tables_of_run_measures_become_sections_after_the_first_reports_four():
    nan = float("nan")
    tables = {
        "cells": pd.DataFrame({"cell": ["x"]}),  # shown by the first report already
        "gap": pd.DataFrame({"cell": ["a", "a", "b", "b"], "label": "l", "gap": ["1", "2–3"] * 2,
                             "gap_min": [1, 2] * 2, "n": [4, 0, 2, 2],
                             "budget": [0.5, nan, 0.25, 0.125]}),
        "twins": pd.DataFrame({"cell": ["a"], "label": ["l"], "learner": ["l"], "row": ["on"],
                               "twin": ["a-off"], "twin_mean": [-0.05], "twin_lo": [-0.1],
                               "twin_hi": [0.0], "twin_bound": [0.1], "twin_mde": [0.0842],
                               "twin_pairs": [48]}),
        "brand_new": pd.DataFrame({"cell": ["a"], "score": [0.5]}),
        "clbench": pd.DataFrame()}
    sections = measure_tables_sections(tables)
    assert list(sections) == ["Budget against the gap since last seen",
                              "Paired difference from the memory-off twin and the demo-cache "
                              "floor", "Brand new", "CL-Bench"]
    gap = sections["Budget against the gap since last seen"][1]
    assert gap.to_numpy().tolist() == [["a", "50.0", "–"], ["b", "25.0", "12.5"]]
    twins = sections["Paired difference from the memory-off twin and the demo-cache floor"][1]
    assert twins.to_dict("records") == [{"cell": "a", "twin": "a-off",
                                         "minus twin (points)": "-5.0 [-10.0, +0.0]",
                                         "vs twin: savings excluded beyond (points)": "10.0",
                                         "vs twin: MDE 80% (points)": "8.4",
                                         "twin pairs": "48"}]
    assert sections["CL-Bench"][1].empty and "No rows" in sections["CL-Bench"][0]


# --- the figures' data ---------------------------------------------------------------------------

def test_a_curve_point_has_the_interval_bootstrap_mean_ci_gives_on_its_rows(run: Path):
    cells, events = load_run(run)
    frame = measures.instances_frame(events, cells)
    curves = plots.exposure_curves(frame, np.random.default_rng(5), n=3_000)
    floor = curves[curves["cell"] == "stateless-floor.medium.workstreams.s0"]
    assert list(floor["x"]) == list(range(8)) and set(floor["tasks"]) == {6}
    stream = frame[(frame["phase"] == "stream") & (frame["cell"] == floor["cell"].iloc[0])]
    # on a full schedule every task has every exposure, so the first point draws what
    # bootstrap_mean_ci draws on its rows alone
    alone = measures.bootstrap_mean_ci(stream[stream["exposure"] == 0], "share",
                                       np.random.default_rng(5), n=3_000)
    assert tuple(floor.iloc[0][["budget", "lo", "hi"]]) == pytest.approx(tuple(alone))


def test_the_gap_of_a_returning_instance_counts_slots_since_its_previous_visit():
    frame = pd.DataFrame({"cell": "c", "phase": "stream", "slot": [0, 1, 2, 3, 7],
                          "task": ["t1", "t2", "t1", "t1", "t2"], "visit": [0, 0, 1, 2, 1],
                          "share": [1.0, 0.5, 0.25, 0.0, 0.5]})
    gaps = plots.returning_gaps(frame)
    assert list(gaps["slot"]) == [2, 3, 7]
    assert list(gaps["gap"]) == [2, 1, 6] and list(gaps["gap_bin"]) == [1, 0, 2]
    assert [plots.gap_label(b) for b in (0, 1, 2)] == ["1", "2–3", "4–7"]


def test_a_figure_is_a_png_and_the_same_data_draws_the_same_bytes(run: Path):
    cells, events = load_run(run)
    frame = measures.instances_frame(events, cells)
    curves = plots.gap_curves(frame, np.random.default_rng(1), n=500)
    first = plots.budget_by_gap(curves)
    assert first.startswith(PNG) and plots.budget_by_gap(curves) == first


# --- in the browser ------------------------------------------------------------------------------

class DevTools:
    """One Chrome DevTools Protocol websocket: commands answered by id, events kept in arrival
    order so a test can read every console message of the page afterwards."""

    def __init__(self, url: str):
        try:
            import websocket
        except ImportError:
            pytest.fail("the browser test needs websocket-client: pip install -e '.[test]'")
        # Chromium refuses a websocket with an Origin it was not told to allow
        self.ws = websocket.create_connection(url, timeout=15, suppress_origin=True)
        self.events: list[dict[str, Any]] = []
        self._id = 0

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {method} within {timeout} s")
            self.ws.settimeout(remaining)
            self.events.append(json.loads(self.ws.recv()))
        return next(e for e in self.events if e.get("method") == method)

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (CSP, failed loads)."""
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description")))
                                      for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]  # text is just "Uncaught"; the error is here
                found.append(details.get("exception", {}).get("description", details["text"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(params["entry"]["text"])
        return found

    def close(self) -> None:
        self.ws.close()


@contextmanager
def chromium(profile: Path) -> Iterator[str]:
    """Headless Chromium on a fresh profile and a free DevTools port; yields the browser's
    websocket URL and stops the browser (its own process group) afterwards."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing; the report's browser test needs Debian's Chromium: "
                    "apt-get install -y chromium")
    profile.mkdir(parents=True, exist_ok=True)
    log = open(profile.parent / "chromium.log", "wb")
    process = subprocess.Popen(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
         "--remote-debugging-port=0", "--window-size=1280,900", "about:blank"],
        stdout=log, stderr=log, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"  # port 0: Chromium picks one and writes it here
        deadline = time.monotonic() + 20
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Chromium did not start; see {profile.parent}/chromium.log")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        yield f"ws://127.0.0.1:{port}{path}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        try:  # renderer and zygote children left behind in the browser's own session
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()


def open_page(browser: DevTools, page: Path, width: int = 1280, height: int = 900) -> str:
    """A new tab showing `page`, loaded; returns its session id."""
    target = browser.call("Target.createTarget", url="about:blank")["targetId"]
    session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Runtime", "Log", "Page", "Network"):
        browser.call(f"{domain}.enable", session)
    browser.call("Emulation.setDeviceMetricsOverride", session, width=width, height=height,
                 deviceScaleFactor=1, mobile=False)
    navigation = browser.call("Page.navigate", session, url=page.resolve().as_uri())
    assert "errorText" not in navigation, navigation
    browser.wait_for("Page.loadEventFired")
    return session


def evaluate(browser: DevTools, session: str, expression: str) -> Any:
    result = browser.call("Runtime.evaluate", session, expression=expression,
                          returnByValue=True, awaitPromise=True)
    assert "exceptionDetails" not in result, result["exceptionDetails"]
    return result["result"].get("value")


def click(browser: DevTools, session: str, selector: str) -> None:
    """A real mouse click (pressed, released) at the middle of the element."""
    box = evaluate(browser, session, f"""(() => {{
        const e = document.querySelector({json.dumps(selector)});
        e.scrollIntoView({{block: "center"}});
        const r = e.getBoundingClientRect();
        return [r.left + r.width / 2, r.top + r.height / 2]; }})()""")
    for kind in ("mousePressed", "mouseReleased"):
        browser.call("Input.dispatchMouseEvent", session, type=kind, x=box[0], y=box[1],
                     button="left", clickCount=1)


def screenshot(browser: DevTools, session: str, path: Path, max_height: int = 6_000) -> bytes:
    """The whole page (up to `max_height` CSS pixels) as a PNG written to `path`."""
    size = browser.call("Page.getLayoutMetrics", session)["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], max_height),
            "scale": 1}
    shot = browser.call("Page.captureScreenshot", session, format="png", clip=clip,
                        captureBeyondViewport=True)
    path.write_bytes(base64.b64decode(shot["data"]))
    return path.read_bytes()


BUDGET_COLUMN = """(() => {
    const table = document.querySelector("#per-cell-stream table");
    const column = [...table.tHead.rows[0].cells].findIndex(
        c => c.textContent === "budget share %");
    return {sort: table.tHead.rows[0].cells[column].getAttribute("aria-sort"),
            rows: [...table.tBodies[0].rows].map(r => [r.cells[0].textContent,
                                                        Number(r.cells[column].dataset.sort)])};
})()"""


@pytest.mark.browser
def test_report_opens_in_headless_chromium_without_errors_and_a_header_click_sorts(
        run: Path, tmp_path: Path):
    """Integration: the real Chromium loads report.html from disk, logs no error, fetches nothing
    but the file, decodes every figure, and sorts the per-cell table on a mouse click."""
    with chromium(tmp_path / "profile") as url:
        browser = DevTools(url)
        try:
            session = open_page(browser, run / "report.html")
            decoded = evaluate(browser, session, """Promise.all([...document.images].map(
                i => i.decode().then(() => [i.naturalWidth, i.naturalHeight, i.alt.length])))""")
            assert len(decoded) == 5 and all(w > 0 and h > 0 and alt > 0 for w, h, alt in decoded)

            before = evaluate(browser, session, BUDGET_COLUMN)
            values = [v for _, v in before["rows"]]
            assert before["sort"] is None and values != sorted(values)  # the floor comes first
            click(browser, session, "#per-cell-stream th:nth-child(2) button")
            ascending = evaluate(browser, session, BUDGET_COLUMN)
            assert ascending["sort"] == "ascending"
            assert ascending["rows"] == sorted(before["rows"], key=lambda row: row[1])
            click(browser, session, "#per-cell-stream th:nth-child(2) button")
            descending = evaluate(browser, session, BUDGET_COLUMN)
            assert descending["sort"] == "descending"
            assert descending["rows"] == sorted(before["rows"], key=lambda row: -row[1])

            shot = screenshot(browser, session, tmp_path / "report.png")
            assert shot.startswith(PNG) and len(shot) > 50_000
            requested = [e["params"]["request"]["url"] for e in browser.events
                         if e.get("method") == "Network.requestWillBeSent"]
            assert all(u.startswith(("file:", "data:")) for u in requested), requested
            assert browser.errors() == []
        finally:
            browser.close()


@pytest.mark.browser
def test_the_browser_check_sees_console_errors_exceptions_and_failed_loads(tmp_path: Path):
    """Integration, the control of the test above: a page that logs an error, throws, and names
    a missing image is caught three times, so an empty error list means a clean page."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
                    '<img src="missing.png" alt="missing"><script>console.error("logged");'
                    'throw new Error("thrown");</script></body></html>')
    with chromium(tmp_path / "profile") as url:
        browser = DevTools(url)
        try:
            session = open_page(browser, page)
            assert evaluate(browser, session, "document.images[0].naturalWidth") == 0
            errors = browser.errors()
        finally:
            browser.close()
    assert any("logged" in e for e in errors) and any("thrown" in e for e in errors), errors
    assert any("ERR_FILE_NOT_FOUND" in e or "Failed to load" in e for e in errors), errors
