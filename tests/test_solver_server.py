"""The embedded solver model's OpenAI-compatible server.

In-process tests use `fastapi.testclient.TestClient`; the live tests run a real uvicorn server
(in a thread with an injected search, and through `serve()` in a subprocess with the real search
and two workers) and talk to it with the real `openai` client.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from fastapi.testclient import TestClient

from orchestrator.arc import Demo, as_grid
from orchestrator.prompts import PromptSet
from orchestrator.protocol import extract_action
from proxy.host import free_port
from solver_model.server import MODEL_IDS, count_tokens, create_app
from tests.test_solver_policy import fake_search

PROMPTS = PromptSet.load()
TEST_INPUT = as_grid([[1, 2], [3, 4]])
FLIP = Demo(as_grid([[5, 6], [7, 8]]), as_grid([[6, 5], [8, 7]]))
FLIPPED = [[2, 1], [4, 3]]
REPO = Path(__file__).resolve().parents[1]


def instance_messages(with_pair: bool = True) -> list[dict]:
    """An opening with one flip pair shown free: the model can answer at once."""
    text = PROMPTS.instance_message("t1", TEST_INPUT, 0, 0, cached=[FLIP] if with_pair else [])
    return [{"role": "system", "content": PROMPTS.texts["system"]},
            {"role": "user", "content": text}]


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app("medium", search=fake_search))


def chat(client: TestClient, **body):
    body.setdefault("model", "carc-solver")
    body.setdefault("messages", instance_messages())
    return client.post("/v1/chat/completions", json=body)


def sse_events(text: str) -> list:
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


# --- in-process ------------------------------------------------------------------------------

def test_models_lists_the_solver_and_one_id_per_effort(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["carc-solver", "carc-solver-low",
                                               "carc-solver-medium", "carc-solver-high"]
    assert list(MODEL_IDS) == [m["id"] for m in body["data"]]


def test_chat_completion_answers_with_the_policys_action_and_usage(client):
    response = chat(client)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert extract_action(message["content"]).grid == as_grid(FLIPPED)
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["completion_tokens"] == count_tokens(message["content"])
    assert usage["prompt_tokens"] == sum(count_tokens(m["content"]) for m in instance_messages())
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert float(response.headers["x-carc-search-ms"]) >= 0
    assert body["carc"]["program"] == "flip left-right"


def test_completion_ids_are_distinct_per_request(client):
    assert chat(client).json()["id"] != chat(client).json()["id"]


def test_streaming_sends_role_content_pieces_stop_usage_then_done(client):
    plain = chat(client).json()["choices"][0]["message"]["content"]
    response = chat(client, stream=True, stream_options={"include_usage": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == plain
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 1
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


def test_streaming_without_include_usage_sends_no_usage_chunk(client):
    events = sse_events(chat(client, stream=True).text)
    assert all(e == "[DONE]" or e["choices"] for e in events)
    assert all(e == "[DONE]" or "usage" not in e for e in events)


@pytest.mark.parametrize(("model", "reasoning_effort", "expected"), [
    ("carc-solver", None, "medium"),
    ("carc-solver-high", None, "high"),
    ("carc-solver-high", "low", "low"),
    ("carc-solver", "minimal", "low"),
])
def test_effort_comes_from_reasoning_effort_then_model_suffix_then_server_default(
        client, model, reasoning_effort, expected):
    body = {"model": model}
    if reasoning_effort:
        body["reasoning_effort"] = reasoning_effort
    response = chat(client, **body)
    assert response.json()["carc"]["effort"] == expected
    assert response.headers["x-carc-effort"] == expected


def test_an_offered_tool_is_not_called_when_no_message_asks_for_it(client):
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}}}}]
    body = chat(client, tools=tools, tool_choice="auto").json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert "tool_calls" not in body["choices"][0]["message"]
    without = chat(client).json()["usage"]["prompt_tokens"]
    assert body["usage"]["prompt_tokens"] == without + count_tokens(json.dumps(tools))


def test_content_parts_and_unknown_optional_fields_are_accepted(client):
    messages = instance_messages()
    messages[1]["content"] = [{"type": "text", "text": messages[1]["content"]}]
    response = chat(client, messages=messages, temperature=0, max_tokens=5, user="x")
    assert extract_action(response.json()["choices"][0]["message"]["content"]).kind == "submit"


def test_conversation_that_is_not_an_instance_gets_a_short_reply(client):
    response = chat(client, messages=[{"role": "user", "content": "Give this chat a title."}])
    assert response.json()["choices"][0]["message"]["content"] == "Nothing to add."
    assert response.json()["carc"]["mode"] == "other"


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "carc-solver"}, "messages"),
    ({"model": "carc-solver", "messages": []}, "messages"),
    ({"model": "carc-solver", "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ({"model": "carc-solver", "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": "carc-solver", "messages": [{"role": "user", "content": "hi"}],
      "reasoning_effort": "maximum"}, "reasoning_effort"),
    ({"model": "carc-solver", "messages": [{"role": "user", "content": "hi"}], "n": 3}, "n"),
])
def test_malformed_request_is_a_400_naming_the_field(client, body, param):
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert param.split(".")[0] in error["message"]


def test_body_that_is_not_json_is_a_400(client):
    response = client.post("/v1/chat/completions", content=b"{nope",
                           headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]


def test_unknown_route_has_an_openai_style_error(client):
    response = client.get("/v1/nowhere")
    assert response.status_code == 404
    assert "error" in response.json()


def test_routes_also_answer_without_the_v1_prefix(client):
    response = client.post("/chat/completions",
                           json={"model": "carc-solver", "messages": instance_messages()})
    assert response.status_code == 200


def test_responses_endpoint_takes_a_string_or_message_list(client):
    text = "\n".join(m["content"] for m in instance_messages())
    as_string = client.post("/v1/responses", json={"model": "carc-solver", "input": text}).json()
    listed = client.post("/v1/responses", json={
        "model": "carc-solver", "instructions": PROMPTS.texts["system"],
        "input": [{"role": "user", "content": [{"type": "input_text",
                                                "text": instance_messages()[1]["content"]}]}],
    }).json()
    for body in (as_string, listed):
        assert body["object"] == "response" and body["status"] == "completed"
        output_text = body["output"][0]["content"][0]["text"]
        assert extract_action(output_text).grid == as_grid(FLIPPED)
        assert body["usage"]["total_tokens"] == (body["usage"]["input_tokens"]
                                                 + body["usage"]["output_tokens"])


def test_streaming_responses_request_is_refused_naming_stream(client):
    response = client.post("/v1/responses",
                           json={"model": "carc-solver", "input": "hi", "stream": True})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stream"


def test_token_count_splits_words_and_punctuation():
    assert count_tokens("[[0,1]]") == 7
    assert count_tokens("Task id: abc") == 4
    assert count_tokens("") == 0


def test_unknown_default_effort_is_rejected_at_startup():
    with pytest.raises(ValueError, match="effort_default"):
        create_app("extreme")


# --- live servers with the openai client ----------------------------------------------------

@pytest.fixture(scope="module")
def live_url():
    """A real uvicorn server in a thread, serving the app with the injected search."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app("medium", search=fake_search),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=5)


def openai_client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)


def test_openai_client_lists_models(live_url):
    ids = [m.id for m in openai_client(live_url).models.list()]
    assert ids == list(MODEL_IDS)


def test_openai_client_gets_a_completion_with_usage(live_url):
    raw = openai_client(live_url).chat.completions.with_raw_response.create(
        model="carc-solver-low", messages=instance_messages())
    completion = raw.parse()
    assert extract_action(completion.choices[0].message.content).grid == as_grid(FLIPPED)
    assert completion.usage.total_tokens == (completion.usage.prompt_tokens
                                             + completion.usage.completion_tokens)
    assert float(raw.headers["x-carc-search-ms"]) >= 0


def test_openai_client_streams_a_completion_with_usage(live_url):
    stream = openai_client(live_url).chat.completions.create(
        model="carc-solver", messages=instance_messages(with_pair=False), stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(content) == {"action": "request_demos"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_openai_client_reads_responses_output_text(live_url):
    response = openai_client(live_url).responses.create(
        model="carc-solver", input=instance_messages()[1]["content"])
    assert extract_action(response.output_text).grid == as_grid(FLIPPED)


def test_the_anthropic_client_reads_a_message_and_its_thinking_budget_sets_the_effort(live_url):
    import anthropic
    client = anthropic.Anthropic(base_url=live_url.removesuffix("/v1"), api_key="unused", max_retries=0)
    raw = client.messages.with_raw_response.create(
        model="carc-solver", max_tokens=4000, system=instance_messages()[0]["content"],
        messages=[instance_messages()[1]], thinking={"type": "enabled", "budget_tokens": 2048})
    message = raw.parse()
    assert extract_action(message.content[0].text).grid == as_grid(FLIPPED)
    assert message.stop_reason == "end_turn" and raw.headers["x-carc-effort"] == "low"
    assert message.usage.output_tokens == count_tokens(message.content[0].text)


def test_the_anthropic_client_streams_a_message_with_its_usage(live_url):
    import anthropic
    client = anthropic.Anthropic(base_url=live_url.removesuffix("/v1"), api_key="unused", max_retries=0)
    with client.messages.stream(model="carc-solver", max_tokens=1000,
                                messages=[instance_messages(with_pair=False)[1]]) as stream:
        final = stream.get_final_message()
    assert json.loads(final.content[0].text) == {"action": "request_demos"}
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == count_tokens(final.content[0].text)
    assert final.usage.input_tokens > 0


def test_openai_client_sees_a_bad_request_as_an_error_naming_the_field(live_url):
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        openai_client(live_url).chat.completions.create(
            model="carc-solver", messages=instance_messages(), reasoning_effort="maximum")


@pytest.mark.slow
def test_serve_runs_two_workers_with_the_real_search_in_a_subprocess():
    """Integration: `serve()` under uvicorn with workers=2, the real search, the openai client."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", "from solver_model.server import serve; "
                               f"serve('127.0.0.1', {port}, 'high', 2, log_level='warning')"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            assert time.monotonic() < deadline, "serve() did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        client = openai_client(f"http://127.0.0.1:{port}/v1")
        completion = client.chat.completions.create(model="carc-solver",
                                                    messages=instance_messages())
        assert completion.model_extra["carc"]["effort"] == "high"
        assert extract_action(completion.choices[0].message.content).grid == as_grid(FLIPPED)
        health = httpx.get(f"http://127.0.0.1:{port}/health").json()
        assert health["effort_default"] == "high"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_server_started_with_a_prior_searches_in_its_order(tmp_path, monkeypatch):
    """`carc model serve --prior` (a trained row's model): every worker reads the prior from the
    environment, and its replies rest on what the prior counts."""
    from solver_model import server
    from solver_model.prior import PrimitivePrior

    PrimitivePrior().add([["flip_h"]] * 500).save(tmp_path / "prior.json")
    monkeypatch.setenv(server.PRIOR_ENV, str(tmp_path / "prior.json"))
    monkeypatch.setenv(server.EFFORT_ENV, "low")
    programs = []
    for seed in range(8):
        monkeypatch.setenv(server.SEED_ENV, str(seed))
        body = chat(TestClient(server.app_from_environment())).json()
        programs.append(body["carc"]["program"])
    assert programs == ["flip_h"] * 8
    monkeypatch.delenv(server.PRIOR_ENV)
    untrained = []
    for seed in range(8):
        monkeypatch.setenv(server.SEED_ENV, str(seed))
        untrained.append(chat(TestClient(server.app_from_environment())).json()["carc"]["program"])
    assert untrained != programs  # the uniform order often reaches another program first
    (tmp_path / "bad.json").write_text("[]")
    monkeypatch.setenv(server.PRIOR_ENV, str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="bad.json: not a primitive prior"):
        server.app_from_environment()
