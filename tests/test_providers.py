"""The ladder on each model API, end to end: a real grid run through the real host proxy
(mitmdump with the journaling addon) to the scripted model, which speaks OpenAI chat
completions, OpenAI Responses and Anthropic messages and records what it was sent and counted.

From the journal alone: the cell's effort reached the wire in that API's own field, and every
call's tokens and dollars are the upstream's usage (Anthropic's cache tokens included) priced by
proxy/prices.json; the instance records agree. And on every API the client retries 429 and 5xx
after the Retry-After asked for, each attempt a journal line.
"""

from __future__ import annotations

import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from harness_adapters.chat_model import (ANTHROPIC_ANSWER_TOKENS, ANTHROPIC_THINKING_BUDGET,
                                         EFFORT_FIELDS, ChatModel, ModelEndpoint)
from harness_adapters.scripted_model import (Served, _anthropic, _chat, _responses,
                                             scripted_model_server)
from orchestrator.records import read_events
from orchestrator.run.grid_config import GridFileError, load_grid
from orchestrator.run.local_pool import execute
from proxy.host import HostProxy, free_port
from proxy.journal import read_journal
from proxy.prices import PriceTable

pytestmark = pytest.mark.slow

# a model of each API whose price proxy/prices.json lists, so the journal prices every call
MODELS = {"openai-chat": "gpt-4.1-mini", "openai-responses": "gpt-5-mini",
          "anthropic-messages": "claude-sonnet-4-5"}
PATHS = {"openai-chat": "/v1/chat/completions", "openai-responses": "/v1/responses",
         "anthropic-messages": "/v1/messages"}

GRID = """\
name: ladder-{api}
seed: 3
track: {{name: own, tasks: 1, visits: 1, epilogue: 0, fresh_reference: false}}
orders: [sequential]
model: {{endpoint: "{endpoint}", name: {model}, api: {api},
         input_usd_per_mtok: {input}, output_usd_per_mtok: {output}}}
efforts: [high]
learners: [stateless-floor]
sandbox: {{engine: process}}
workers: 1
"""


def run_ladder(root, api: str) -> tuple[list[Served], object]:
    price = PriceTable.load().lookup(MODELS[api])
    served: list[Served] = []
    run = root / "runs" / api
    (run / "cells").mkdir(parents=True)
    with scripted_model_server("127.0.0.1", served) as endpoint:
        (run / "grid.yaml").write_text(GRID.format(api=api, endpoint=endpoint, model=MODELS[api],
                                                   input=price.input_per_m, output=price.output_per_m))
        execute(run, show_progress=False)
    return served, run / "cells" / "stateless-floor.high.sequential.s3"


@pytest.mark.parametrize("api", list(MODELS))
def test_the_ladder_puts_the_effort_in_the_apis_field_and_the_journal_counts_what_the_upstream_did(
        tmp_path, api):
    served, cell = run_ladder(tmp_path, api)
    journal = [e for e in read_journal(cell / "journal" / "journal.jsonl") if not e.refused]
    assert served and len(journal) == len(served)
    by_id = {s.response_id: s for s in served}
    prices = PriceTable.load()
    for entry in journal:
        assert entry.api == api and entry.url.endswith(PATHS[api]) and entry.status == 200
        for field, value in EFFORT_FIELDS[api]["high"].items():
            assert entry.request[field] == value, (api, field, entry.request)
        if api == "anthropic-messages":
            assert entry.request["max_tokens"] == ANTHROPIC_THINKING_BUDGET["high"] + ANTHROPIC_ANSWER_TOKENS
        upstream = by_id[entry.response["id"]]
        assert upstream.body == entry.request  # the journal shows what the upstream got
        assert (entry.prompt_tokens, entry.completion_tokens) == (upstream.prompt_tokens,
                                                                  upstream.completion_tokens)
        assert entry.cost_usd == pytest.approx(prices.cost(MODELS[api], upstream.prompt_tokens,
                                                           upstream.completion_tokens))
        assert entry.cost_usd > 0
    # the instance record (the client's own count) says the same as the upstream and the journal
    end = next(e for e in read_events(cell / "events.jsonl") if e.type == "instance_end")
    assert end.model_calls == len(served)
    assert end.prompt_tokens == sum(s.prompt_tokens for s in served)
    assert end.completion_tokens == sum(s.completion_tokens for s in served)
    assert end.cost_usd == pytest.approx(sum(e.cost_usd for e in journal))


# --- retries, the same code path on every API ---------------------------------------------------

def flaky_app(served: list[Served], arrivals: list[float]) -> FastAPI:
    """Each API's path answers 429 (Retry-After: 1), then 503 (retry-after-ms: 300), then as the
    scripted model does."""
    app = FastAPI()
    answers = {"/v1/chat/completions": _chat, "/v1/responses": _responses, "/v1/messages": _anthropic}

    @app.post("/v1/{path:path}")
    async def handle(request: Request, path: str):
        arrivals.append(time.monotonic())
        body = await request.json()
        if len(arrivals) == 1:
            return JSONResponse({"error": {"message": "slow down"}}, 429, headers={"retry-after": "1"})
        if len(arrivals) == 2:
            return JSONResponse({"error": {"message": "busy"}}, 503, headers={"retry-after-ms": "300"})
        return answers[request.url.path](body, served)
    return app


@pytest.mark.real_retry_waits  # it checks that each retry waited as long as it was asked
@pytest.mark.parametrize("api", list(MODELS))
def test_429_and_503_are_retried_after_the_wait_asked_for_and_every_attempt_is_journaled(tmp_path, api):
    served: list[Served] = []
    arrivals: list[float] = []
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(flaky_app(served, arrivals), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.01)
    try:
        upstream = f"http://127.0.0.1:{port}" + ("" if api == "anthropic-messages" else "/v1")
        with HostProxy(tmp_path / "journal", "retry-cell", upstream) as proxy:
            model = ChatModel(ModelEndpoint(base_url=proxy.base_url, model=MODELS[api], api=api,
                                            effort="low"))
            reply = model.complete([{"role": "system", "content": "Answer."},
                                    {"role": "user", "content": "Task id: t1\nhello"}])
            journal = proxy.entries()
    finally:
        server.should_exit = True
        thread.join(5)
    assert reply.usage.calls == 1 and reply.text and len(arrivals) == 3
    assert arrivals[1] - arrivals[0] >= 1.0 and arrivals[2] - arrivals[1] >= 0.3  # as asked, never sooner
    assert [e.status for e in journal] == [429, 503, 200] and {e.api for e in journal} == {api}
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (served[0].prompt_tokens,
                                                                          served[0].completion_tokens)


# --- what grid check refuses ------------------------------------------------------------------

def check(tmp_path, model: str, learners: str = "[stateless-floor]", efforts: str = "[medium]") -> str:
    path = tmp_path / "grid.yaml"
    path.write_text(f"name: g\nmodel: {model}\nefforts: {efforts}\nlearners: {learners}\n")
    with pytest.raises(GridFileError) as caught:
        load_grid(path)
    return str(caught.value)


def test_an_anthropic_max_tokens_below_the_thinking_budget_is_refused_at_its_line(tmp_path):
    message = check(tmp_path, "{endpoint: 'https://api.anthropic.com', name: claude-sonnet-4-5, "
                              "api: anthropic-messages, max_tokens: 4000}", efforts="[low, medium]")
    assert message.startswith(f"{tmp_path / 'grid.yaml'}:2: model.max_tokens: 4000 does not exceed "
                              "the thinking budget of effort medium (8192 tokens")


def test_a_harness_on_the_embedded_models_responses_is_refused(tmp_path):
    message = check(tmp_path, "{api: openai-responses}", learners="[stateless-floor, openclaw]")
    assert message == (f"{tmp_path / 'grid.yaml'}:4: learners[1]: openclaw streams its Responses calls, "
                       "and the embedded model serves Responses unstreamed only; use model.api openai-chat")


def test_an_anthropic_endpoint_is_the_sdks_base_url_with_or_without_v1(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("name: g\nmodel: {endpoint: 'https://api.anthropic.com/v1/', api: anthropic-messages, "
                    "name: claude-sonnet-4-5}\nlearners: [stateless-floor]\n")
    assert load_grid(path).model.endpoint == "https://api.anthropic.com"


def test_a_harness_whose_adapter_lacks_the_api_is_refused_at_its_learner_line(tmp_path, monkeypatch):
    """hermes' real adapter, declared chat-only (as a new adapter's scaffold starts out)."""
    import dataclasses

    from harness_adapters import registry
    from harness_adapters.hermes_agent import HERMES
    monkeypatch.setattr(registry, "adapter", lambda name: dataclasses.replace(HERMES, apis=("openai-chat",)))
    message = check(tmp_path, "{endpoint: 'https://api.openai.com/v1', name: gpt-5-mini, api: openai-responses}",
                    learners="\n  - stateless-floor\n  - hermes-agent")
    assert message == (f"{tmp_path / 'grid.yaml'}:6: learners[1]: hermes-agent cannot use model.api "
                       "openai-responses: its adapter speaks openai-chat; remove this learner or change "
                       "model.api (docs/providers.md)")


@pytest.mark.parametrize("api", list(MODELS))
def test_each_harness_renders_its_own_config_for_each_api(api):
    import json

    import yaml

    from harness_adapters import hermes_agent, openclaw, prime_agent
    hermes = yaml.safe_load(hermes_agent.render_config("http://proxy:8081/v1", "m", "high", api=api))
    assert hermes["model"]["api_mode"] == hermes_agent.API_MODES[api]
    claw = json.loads(openclaw.render_config("http://proxy:8081/v1", "m", "high", api=api))
    provider = claw["models"]["providers"]["carc"]
    assert provider["api"] == {"openai-chat": "openai-completions"}.get(api, api)
    assert ("compat" in provider["models"][0]) == (api == "openai-chat")
    prime = json.loads(prime_agent.render_models("http://proxy:8081/v1", "m", "high", api=api))
    assert prime["providers"]["carc"]["api"] == {"openai-chat": "openai-completions"}.get(api, api)
    for adapter in (hermes_agent.HERMES, openclaw.OPENCLAW, prime_agent.PRIME):
        assert api in adapter.apis
