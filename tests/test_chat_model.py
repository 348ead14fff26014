"""The ladder's chat client against compatible servers that send less than OpenAI does (a scripted
endpoint on an in-process transport: no network)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from harness_adapters.chat_model import ChatModel, ModelEndpoint, ModelUnavailable


def model_answering(status: int, body: str, content_type: str = "application/json") -> ChatModel:
    model = ChatModel(ModelEndpoint(base_url="http://scripted.invalid/v1", model="m", max_retries=0))
    transport = httpx.MockTransport(lambda request: httpx.Response(
        status, text=body, headers={"content-type": content_type}))
    model.client = openai.OpenAI(base_url="http://scripted.invalid/v1", api_key="k", max_retries=0,
                                 http_client=httpx.Client(transport=transport))
    return model


def test_a_reply_without_usage_or_message_counts_zero_tokens_and_empty_text():
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop"}]}
    reply = model_answering(200, json.dumps(body)).complete([{"role": "user", "content": "hi"}])
    assert reply.text == "" and reply.usage.prompt_tokens == 0 and reply.usage.completion_tokens == 0


def test_a_reply_with_usage_lacking_a_count_counts_it_zero():
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"total_tokens": 5}}
    reply = model_answering(200, json.dumps(body)).complete([{"role": "user", "content": "hi"}])
    assert reply.text == "ok" and reply.usage.prompt_tokens == 0


def test_an_html_page_answered_with_200_is_a_model_unavailable_naming_the_endpoint():
    with pytest.raises(ModelUnavailable, match="not a chat completion.*check model.endpoint"):
        model_answering(200, "<html>login</html>", "text/html").complete([{"role": "user", "content": "hi"}])


OK_BODY = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}


def model_scripted(answers, max_retries: int = 4) -> tuple[ChatModel, list[float]]:
    """A model whose endpoint answers from `answers` in turn (status, headers) - the last one
    repeats - and a list of the times each attempt arrived."""
    arrivals: list[float] = []

    def handle(request):
        arrivals.append(time.monotonic())
        status, headers = answers[min(len(arrivals), len(answers)) - 1]
        if status == 200:
            return httpx.Response(200, json=OK_BODY)
        if status == "reset":
            raise httpx.ReadError("connection reset by peer")
        return httpx.Response(status, json={"error": {"message": "busy"}}, headers=headers)

    model = ChatModel(ModelEndpoint(base_url="http://scripted.invalid/v1", model="m", max_retries=max_retries))
    model.client = model.client.with_options(http_client=httpx.Client(transport=httpx.MockTransport(handle)))
    return model, arrivals


@pytest.mark.real_retry_waits
def test_429_and_5xx_and_a_reset_connection_are_retried_honouring_retry_after():
    model, arrivals = model_scripted([(429, {"retry-after": "1"}), (503, {"retry-after-ms": "300"}),
                                      ("reset", {}), (200, {})])
    reply = model.complete([{"role": "user", "content": "hi"}])
    assert reply.text == "ok" and reply.usage.calls == 1 and len(arrivals) == 4
    assert arrivals[1] - arrivals[0] >= 1.0 and arrivals[2] - arrivals[1] >= 0.3  # as asked, never sooner


def test_a_client_error_is_not_retried_and_retries_end_at_max_retries():
    model, arrivals = model_scripted([(400, {})])
    with pytest.raises(ModelUnavailable, match="400"):
        model.complete([{"role": "user", "content": "hi"}])
    assert len(arrivals) == 1
    model, arrivals = model_scripted([(500, {"retry-after": "0"})], max_retries=2)
    with pytest.raises(ModelUnavailable, match=r"after 2 retries: HTTP 500; HTTP 500"):
        model.complete([{"role": "user", "content": "hi"}])
    assert len(arrivals) == 3


def test_the_suites_zero_wait_scale_retries_at_once_and_a_bad_scale_names_its_variable(monkeypatch):
    """CARC_RETRY_WAIT_SCALE=0 (what tests/conftest.py sets): the same retries, none waited for;
    a value that is not a factor >= 0 is refused with the variable's name and what to set."""
    model, arrivals = model_scripted([(429, {"retry-after": "20"}), (503, {}), (200, {})])
    assert model.complete([{"role": "user", "content": "hi"}]).text == "ok" and len(arrivals) == 3
    assert arrivals[-1] - arrivals[0] < 5
    monkeypatch.setenv("CARC_RETRY_WAIT_SCALE", "fast")
    model, _ = model_scripted([(429, {"retry-after": "1"}), (200, {})])
    with pytest.raises(ValueError, match=r"CARC_RETRY_WAIT_SCALE='fast' is not a factor >= 0"):
        model.complete([{"role": "user", "content": "hi"}])


@pytest.mark.real_retry_waits
def test_no_retry_waits_past_the_instances_wall_clock():
    """A Retry-After longer than what is left of the instance ends the call at once: one attempt,
    not a wait of 30 s (nor the SDK's several attempts of the whole timeout each)."""
    model, arrivals = model_scripted([(429, {"retry-after": "30"})])
    with pytest.raises(ModelUnavailable, match="would pass the instance's wall clock"):
        model.complete([{"role": "user", "content": "hi"}], deadline=time.monotonic() + 5)
    assert len(arrivals) == 1
    with pytest.raises(ModelUnavailable, match="wall clock ran out after 0 failed"):
        model.complete([{"role": "user", "content": "hi"}], deadline=time.monotonic() - 1)
    assert len(arrivals) == 1


def test_retry_after_as_an_http_date_and_backoff_without_one():
    from email.utils import formatdate

    from harness_adapters.chat_model import BACKOFF_CAP_S, retry_wait
    dated = openai.RateLimitError("busy", response=httpx.Response(
        429, headers={"retry-after": formatdate(time.time() + 20, usegmt=True)},
        request=httpx.Request("POST", "http://x")), body=None)
    assert 15 <= retry_wait(dated, 1) <= 21
    bare = openai.InternalServerError("down", response=httpx.Response(
        500, request=httpx.Request("POST", "http://x")), body=None)
    waits = [retry_wait(bare, n) for n in range(1, 8)]
    assert 0.3 <= waits[0] <= 0.5 and all(w <= BACKOFF_CAP_S for w in waits) and waits[4] > waits[0]
