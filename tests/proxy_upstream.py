"""A scripted model upstream for the proxy tests: real HTTP (uvicorn in a thread), fixed answers.

What it serves, chosen by path and by the request's `model`:
- POST /v1/chat/completions: models "echo-<framing>" quote the caller's authorization header back
  in that framing (`tests.key_echo.FRAMINGS`); otherwise JSON, or a stream (role, text and tool-call deltas, the usage chunk
  when `stream_options.include_usage`); model "boom" answers 500; model "hang" streams two chunks
  and then waits until the client goes away (recorded in `disconnects`); model "cut-sse" streams two
  chunks and then breaks the connection mid-body.
- POST /v1/responses: a Responses API stream ending in `response.completed`.
- POST /v1/messages: an Anthropic message stream with a text and a tool_use block.
Every request is recorded (path, headers, body) in `seen`.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from proxy.host import free_port
from tests.key_echo import echo_reply

CHAT_USAGE = {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
STREAM_USAGE = {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}
RESPONSES_USAGE = {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37}
ANTHROPIC_START_USAGE = {"input_tokens": 40, "cache_creation_input_tokens": 5,
                         "cache_read_input_tokens": 100, "output_tokens": 1}
ANTHROPIC_FINAL_OUTPUT = 15


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict


@dataclass
class ScriptedUpstream:
    port: int
    seen: list[Seen] = field(default_factory=list)
    disconnects: list[str] = field(default_factory=list)  # markers of streams the client left

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def seen_with(self, marker: str) -> Seen:
        found = [s for s in self.seen if marker in json.dumps(s.body)]
        assert found, f"the upstream got no request with {marker!r}"
        return found[-1]


def sse(obj) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def typed_sse(obj: dict) -> bytes:
    return f"event: {obj['type']}\ndata: {json.dumps(obj)}\n\n".encode()


def chat_chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "gpt-4o-mini", "choices": [{"index": 0, "delta": delta,
                                                 "finish_reason": finish}]}


def chat_stream(include_usage: bool):
    yield sse(chat_chunk({"role": "assistant", "content": ""}))
    yield sse(chat_chunk({"content": "Hel"}))
    yield sse(chat_chunk({"content": "lo"}))
    yield sse(chat_chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                          "function": {"name": "submit", "arguments": ""}}]}))
    yield sse(chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"grid": '}}]}))
    yield sse(chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "[[1, 2]]}"}}]}))
    yield sse(chat_chunk({}, finish="tool_calls"))
    if include_usage:
        yield sse({**chat_chunk({}), "choices": [], "usage": STREAM_USAGE})
    yield sse("[DONE]")


def responses_stream():
    base = {"id": "resp_1", "object": "response", "model": "gpt-4.1", "status": "in_progress",
            "output": []}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Hello there", "annotations": []}]}
    yield typed_sse({"type": "response.created", "response": base})
    yield typed_sse({"type": "response.output_text.delta", "output_index": 0, "delta": "Hello"})
    yield typed_sse({"type": "response.output_text.delta", "output_index": 0, "delta": " there"})
    yield typed_sse({"type": "response.output_item.done", "output_index": 0, "item": item})
    yield typed_sse({"type": "response.completed",
                     "response": {**base, "status": "completed", "output": [item],
                                  "usage": RESPONSES_USAGE}})


def anthropic_stream():
    yield typed_sse({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [], "stop_reason": None, "usage": ANTHROPIC_START_USAGE}})
    yield typed_sse({"type": "content_block_start", "index": 0,
                     "content_block": {"type": "text", "text": ""}})
    yield typed_sse({"type": "ping"})
    yield typed_sse({"type": "content_block_delta", "index": 0,
                     "delta": {"type": "text_delta", "text": "Let me "}})
    yield typed_sse({"type": "content_block_delta", "index": 0,
                     "delta": {"type": "text_delta", "text": "submit."}})
    yield typed_sse({"type": "content_block_stop", "index": 0})
    yield typed_sse({"type": "content_block_start", "index": 1, "content_block": {
        "type": "tool_use", "id": "toolu_1", "name": "submit", "input": {}}})
    yield typed_sse({"type": "content_block_delta", "index": 1,
                     "delta": {"type": "input_json_delta", "partial_json": '{"grid": [[3'}})
    yield typed_sse({"type": "content_block_delta", "index": 1,
                     "delta": {"type": "input_json_delta", "partial_json": "]]}"}})
    yield typed_sse({"type": "content_block_stop", "index": 1})
    yield typed_sse({"type": "message_delta", "delta": {"stop_reason": "tool_use",
                                                        "stop_sequence": None},
                     "usage": {"output_tokens": ANTHROPIC_FINAL_OUTPUT}})
    yield typed_sse({"type": "message_stop"})


def create_app(upstream: ScriptedUpstream) -> FastAPI:
    app = FastAPI()

    async def record(request: Request) -> dict:
        body = await request.json()
        upstream.seen.append(Seen(request.url.path, dict(request.headers), body))
        return body

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await record(request)
        if body.get("model") == "boom":
            return JSONResponse({"error": {"message": "upstream exploded", "type": "server"}},
                                status_code=500)
        if str(body.get("model", "")).startswith("echo-"):
            return echo_reply(body["model"][len("echo-"):], request.headers.get("authorization", ""))
        if body.get("model") == "hang":
            return StreamingResponse(hang(json.dumps(body)), media_type="text/event-stream")
        if body.get("model") == "cut-sse":
            return StreamingResponse(cut_short(), media_type="text/event-stream")
        if body.get("stream"):
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(chat_stream(include), media_type="text/event-stream")
        return {"id": "chatcmpl-2", "object": "chat.completion", "created": 1,
                "model": body.get("model"), "usage": CHAT_USAGE,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "Hello"}}]}

    async def hang(marker: str):
        try:
            yield sse(chat_chunk({"role": "assistant", "content": "Hel"}))
            yield sse(chat_chunk({"content": "lo"}))
            await asyncio.sleep(600)
        finally:
            upstream.disconnects.append(marker)

    async def cut_short():
        """A provider's stream that breaks: two chunks, then the connection ends without the
        last chunk of the chunked body (no finish_reason, no [DONE])."""
        yield sse(chat_chunk({"role": "assistant", "content": "Hel"}))
        await asyncio.sleep(0.05)
        yield sse(chat_chunk({"content": "lo"}))
        await asyncio.sleep(0.05)
        raise ConnectionResetError("scripted: the provider's stream breaks")

    @app.post("/v1/responses")
    async def responses(request: Request):
        await record(request)
        return StreamingResponse(responses_stream(), media_type="text/event-stream")

    @app.post("/v1/messages")
    async def messages(request: Request):
        await record(request)
        return StreamingResponse(anthropic_stream(), media_type="text/event-stream")

    return app


class UpstreamServer:
    """The scripted upstream running in a daemon thread for the duration of a `with`."""

    def __init__(self) -> None:
        self.upstream = ScriptedUpstream(free_port())
        config = uvicorn.Config(create_app(self.upstream), host="127.0.0.1",
                                port=self.upstream.port, log_level="warning",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ScriptedUpstream:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the scripted upstream did not start")
            time.sleep(0.01)
        return self.upstream

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
