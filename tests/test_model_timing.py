"""Real-model timing of the embedded model (solver_model/timing.py): the drawn delays, the server
that waits them without blocking, and the grid field that turns it on.

No assertion here is on the wall clock: the delays are tested as drawn values, and the server's
concurrency by the call intervals it records (every call started before any ended).
"""

from __future__ import annotations

import asyncio
import json
import math
import textwrap

import httpx
import numpy as np
import pytest

from orchestrator.run.grid_config import GridFileError, load_grid
from solver_model.server import create_app
from solver_model.timing import PROFILES, Lognormal, Timing, request_key, resolve
from tests.test_solver_policy import fake_search
from tests.test_solver_server import instance_messages

SHORT = Timing(ttft_s=Lognormal(median=0.3, sigma=0.0), tokens_per_s=Lognormal(median=5000, sigma=0.0))


def test_the_same_seed_and_request_draw_the_same_delays_and_others_differ():
    hosted = PROFILES["hosted"]
    key = request_key("chat", {"messages": instance_messages()})
    assert hosted.draw(0, key) == hosted.draw(0, key)
    others = {hosted.draw(seed, key) for seed in range(1, 20)}
    others |= {hosted.draw(0, request_key("chat", {"n": n})) for n in range(20)}
    assert len(others) == 39  # every other seed or request draws its own


def test_the_drawn_delays_follow_the_stated_lognormals():
    timing = Timing(ttft_s=Lognormal(median=0.8, sigma=0.5), tokens_per_s=Lognormal(median=60, sigma=0.3))
    draws = [timing.draw(7, f"request {i}") for i in range(4000)]
    log_ttft = np.log([d.ttft_s for d in draws])
    log_rate = np.log([d.tokens_per_s for d in draws])
    # the log of a lognormal is normal(log median, sigma): 4000 draws pin both to a few percent
    assert abs(np.median(log_ttft) - math.log(0.8)) < 0.05
    assert abs(np.std(log_ttft) - 0.5) < 0.03
    assert abs(np.median(log_rate) - math.log(60)) < 0.03
    assert abs(np.std(log_rate) - 0.3) < 0.02
    assert min(d.ttft_s for d in draws) > 0


def test_a_delay_is_the_ttft_plus_the_tokens_after_the_first_at_the_drawn_rate():
    delay = SHORT.draw(0, "x")
    assert delay.ttft_s == 0.3 and delay.tokens_per_s == 5000
    assert delay.total_s(1) == 0.3
    assert delay.total_s(5001) == pytest.approx(1.3)


def test_a_profile_name_resolves_and_an_unknown_one_names_the_profiles():
    assert resolve("hosted") is PROFILES["hosted"]
    assert resolve(None) is None
    with pytest.raises(ValueError, match="hosted, hosted-fast"):
        resolve("fastest")


async def _concurrent_calls(app, count: int, stream: bool) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://model", timeout=60) as client:
        async def one(i: int) -> httpx.Response:
            messages = instance_messages() + [{"role": "user", "content": f"call {i}"}]
            return await client.post("/v1/chat/completions",
                                     json={"model": "carc-solver", "messages": messages, "stream": stream})
        return await asyncio.gather(*(one(i) for i in range(count)))


@pytest.mark.parametrize("stream", [False, True])
def test_the_server_holds_many_waiting_calls_at_once(stream):
    app = create_app("medium", search=fake_search, threads=1, timing=SHORT)
    responses = asyncio.run(_concurrent_calls(app, 24, stream))
    assert all(r.status_code == 200 for r in responses)
    calls = list(app.state.calls)
    assert len(calls) == 24 and all(c["delay_s"] >= 0.3 for c in calls)
    # every call's wait had begun before the first wait ended: they waited together, not in
    # turn (a wait that blocked the server would end before the next one could begin)
    assert max(c["waiting"] for c in calls) < min(c["end"] for c in calls)
    assert all(float(r.headers["x-carc-delay-s"]) >= 0.3 for r in responses)


def test_a_streamed_reply_comes_whole_and_a_call_without_timing_has_no_delay_header():
    app = create_app("medium", search=fake_search, timing=SHORT)
    (response,) = asyncio.run(_concurrent_calls(app, 1, True))
    events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "stop"
    untimed = create_app("medium", search=fake_search)
    (plain,) = asyncio.run(_concurrent_calls(untimed, 1, False))
    assert "x-carc-delay-s" not in plain.headers
    assert list(untimed.state.calls)[0]["delay_s"] == 0.0


def test_the_usage_log_notes_each_calls_drawn_delay(tmp_path):
    log = tmp_path / "usage.jsonl"
    app = create_app("medium", search=fake_search, timing=SHORT, usage_log=str(log), seed=3)
    asyncio.run(_concurrent_calls(app, 2, False))
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["ttft_s"] for line in lines] == [0.3, 0.3]
    assert all(line["delay_s"] == pytest.approx(0.3 + (line["completion_tokens"] - 1) / 5000, abs=1e-3)
               for line in lines)


GRID = """\
name: timed
model:
  timing: {timing}
learners: [stateless-floor]
"""


def test_the_grid_takes_a_profile_or_distributions(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(GRID.format(timing="hosted"))
    assert load_grid(path).model.timing == PROFILES["hosted"]
    path.write_text(GRID.format(timing="{ttft_s: {median: 2, sigma: 0.1}, tokens_per_s: {median: 40}}"))
    timing = load_grid(path).model.timing
    assert timing.ttft_s.median == 2 and timing.tokens_per_s.sigma == 0
    path.write_text("name: t\nlearners: [stateless-floor]\n")
    assert load_grid(path).model.timing is None  # off by default


@pytest.mark.parametrize("timing, message", [
    ("fastest", r"g.yaml:3: model.timing: no timing profile 'fastest'; profiles: hosted"),
    ("{ttft_s: {median: 0}, tokens_per_s: {median: 50}}",
     r"g.yaml:3: model.timing.ttft_s.median: Input should be greater than 0"),
    ("{ttft_s: {median: 1}}", r"g.yaml:3: model.timing.tokens_per_s: Field required"),
    ("{ttft_s: {median: 1}, tokens_per_s: {median: 9}, jitter: 2}", r"model.timing.jitter: Extra inputs"),
])
def test_a_bad_timing_is_refused_naming_the_line_and_field(tmp_path, timing, message):
    path = tmp_path / "g.yaml"
    path.write_text(GRID.format(timing=timing))
    with pytest.raises(GridFileError, match=message):
        load_grid(path)


def test_timing_with_a_real_endpoint_is_refused(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(textwrap.dedent("""\
        name: t
        model: {endpoint: "https://api.openai.com/v1", name: gpt-4o, timing: hosted}
        learners: [stateless-floor]
        """))
    with pytest.raises(GridFileError, match="timing is the embedded model's"):
        load_grid(path)


@pytest.mark.slow
def test_a_timed_grid_runs_its_model_servers_with_the_grids_timing(tmp_path):
    """End to end: the grid's timing reaches the embedded servers `carc grid run` starts (their
    usage logs note every call's drawn delay), and the run ends with every instance."""
    from orchestrator.records import RunPaths, read_events
    from orchestrator.run.local_pool import start_run

    path = tmp_path / "g.yaml"
    path.write_text(textwrap.dedent("""\
        name: timed
        seeds: [0, 1]
        track: {name: own, tasks: 1, visits: 1, epilogue: 0, fresh_reference: false}
        model: {timing: {ttft_s: {median: 0.05, sigma: 0.2}, tokens_per_s: {median: 2000, sigma: 0.2}}}
        efforts: [low]
        learners: [stateless-floor]
        sandbox: {engine: process}
        workers: 2
        """))
    run = RunPaths(start_run(path, tmp_path / "runs", run_id="timed"))
    ends = [e for cell in run.cell_folders() for e in read_events(cell.events) if e.type == "instance_end"]
    assert len(ends) == 2
    logged = [json.loads(line) for log in run.logs.glob("model-usage-*.jsonl")
              for line in log.read_text().splitlines()]
    assert logged and all(entry["ttft_s"] > 0 and entry["delay_s"] >= entry["ttft_s"] for entry in logged)
