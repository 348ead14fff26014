"""The ladder's chat client against compatible servers that send less than OpenAI does (a scripted
endpoint on an in-process transport: no network)."""

from __future__ import annotations

import json

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
