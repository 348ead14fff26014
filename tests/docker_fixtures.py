"""Shared fixtures of the Docker tests: a real engine, the real images (built offline if need be).

No mock anywhere: with no engine these tests fail with the command that makes one
(scripts/docker-up.sh, which scripts/test.sh runs first), they are never skipped.
"""

from __future__ import annotations

import os
import uuid

import pytest

from sandboxes.images import docker_client, ensure_image
from tests.conftest import NO_DOCKER_IN_FAST_TIER

BASE = os.environ.get("CARC_IMAGE_BASE", "auto")


@pytest.fixture(scope="session")
def client():
    return docker_client()


@pytest.fixture(scope="session")
def base_image(client) -> str:
    return ensure_image("base", BASE, client)


@pytest.fixture(scope="session")
def proxy_image(client) -> str:
    return ensure_image("proxy", BASE, client)


@pytest.fixture(scope="session")
def run_id() -> str:
    """Every object the tests make carries this run label, so the session can prune them all."""
    return f"pytest-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session", autouse=True)
def _prune_at_end(run_id):
    yield
    if os.environ.get("DOCKER_HOST") == NO_DOCKER_IN_FAST_TIER:
        return  # the fast tier: no engine, so nothing of this run is on one
    from sandboxes.docker_sandbox import prune
    prune(run=run_id)


def run_scripted_grid(root, name: str, grid_template: str, served: list | None = None):
    """Run a grid on the scripted tool-using model (its `{endpoint}` filled in); the run folder.
    What the model answered is appended to `served`."""
    from harness_adapters.scripted_model import scripted_model_server
    from orchestrator.run.local_pool import execute

    run = root / "runs" / name
    (run / "cells").mkdir(parents=True)
    with scripted_model_server(served=served) as endpoint:
        (run / "grid.yaml").write_text(grid_template.format(endpoint=endpoint))
        execute(run, show_progress=False)
    return run


# --- a harness on each model API (tests/test_<harness>.py) ---------------------------------------

# a model of each API whose price proxy/prices.json lists, so the journal prices every call
PRICED_MODELS = {"openai-chat": "gpt-4.1-mini", "openai-responses": "gpt-5-mini",
                 "anthropic-messages": "claude-sonnet-4-5"}

API_GRID = """\
name: LEARNER-API
seed: 2
track: {{name: own, tasks: 1, visits: 1, epilogue: 0, fresh_reference: false}}
orders: [sequential]
model: {{endpoint: "{endpoint}", name: MODEL, api: API}}
efforts: [high]
learners: [LEARNER]
workers: 1
"""


def run_on_api(root, learner: str, api: str):
    """One instance of `learner` (memory-on, effort high) on the scripted model speaking `api`:
    (what the upstream served, the cell folder)."""
    served: list = []
    grid = API_GRID.replace("LEARNER", learner).replace("API", api).replace("MODEL", PRICED_MODELS[api])
    run = run_scripted_grid(root, f"{learner}-{api}", grid, served)
    return served, run / "cells" / f"{learner}.high.sequential.s2"


def run_on_apis(root, learner: str, apis) -> dict:
    """`run_on_api` for each of `apis` at once (each its own run, model server, sandbox and
    proxy): api -> a future of (served, cell folder). A harness's start is mostly CPU, one after
    another, and three one-instance runs side by side take the time of about one and a half."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(len(apis), thread_name_prefix="on-api")
    futures = {api: pool.submit(run_on_api, root / api, learner, api) for api in apis}
    pool.shutdown(wait=True)
    return futures


def check_journal_against_upstream(cell_dir, served, api: str) -> list:
    """Every model call of the cell is journaled under `api` with the upstream's own token
    counts, priced from proxy/prices.json, and the instance record sums them; the journal
    entries (for the caller's effort checks)."""
    import pytest

    from orchestrator.records import read_events
    from proxy.journal import read_journal
    from proxy.prices import PriceTable

    calls = [e for e in read_journal(cell_dir / "journal" / "journal.jsonl")
             if not e.refused and e.api != "other"]
    assert calls and len(calls) == len(served), ([e.url for e in calls], [s.path for s in served])
    by_id = {s.response_id: s for s in served}
    prices = PriceTable.load()
    for entry in calls:
        # (a harness may drop a stream it no longer needs: "Client disconnected", counted all the same)
        assert entry.api == api and entry.status == 200, (entry.url, entry.error)
        upstream = by_id[entry.response["id"]]
        assert (entry.prompt_tokens, entry.completion_tokens) == (upstream.prompt_tokens,
                                                                  upstream.completion_tokens)
        assert entry.cost_usd == pytest.approx(prices.cost(PRICED_MODELS[api], upstream.prompt_tokens,
                                                           upstream.completion_tokens))
        assert entry.cost_usd > 0
    ends = [e for e in read_events(cell_dir / "events.jsonl") if e.type == "instance_end"]
    assert [e.status for e in ends] and sum(e.prompt_tokens for e in ends) == sum(
        e.prompt_tokens for e in calls if e.slot is not None)
    return calls
