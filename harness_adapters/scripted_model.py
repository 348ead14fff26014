"""A scripted tool-using model for harness tests, speaking the three model APIs carc knows
(OpenAI chat completions, OpenAI Responses, Anthropic messages), streamed or not, like real ones.

It plays one script in the harness's own tool format: on the message that opens an instance it
first writes a note naming the task with a tool the harness offers; every other answer is the
embedded solver's reply to the conversation (so instances end as they would on the solver).
The integration tests read the journal: a memory-on harness brings the note back on a returning
instance, a memory-off one never does.

Which tool writes the note depends on what the request offers (`NOTE_WRITERS`, first match):
hermes' `memory` tool, openclaw's `exec` (append to the workspace's MEMORY.md, which openclaw
injects into every session), prime-agent's `ipython` (`rlm.harness.create_memory`), or a generic
shell tool. A new adapter whose harness offers none of these adds its own entry.

Every request is kept (`Served`: path, body, the usage reported, the response id) so a test can
hold the journal against what the upstream really received and counted. The usage is a fixed
function of the request; on Anthropic it is split into input, cache-write and cache-read tokens
(their sum is the prompt) and the output count arrives in `message_delta`, as Anthropic sends it.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from solver_model.conversation import message_text
from solver_model.server import (ResponsesRequest, answer_conversation, anthropic_messages,
                                 responses_messages)

NOTE = "carc-note: task {task} was seen"
_TASK = re.compile(r"Task id: (\S+)")


def _text(message: dict[str, Any]) -> str:
    return message_text(message.get("content")) or ""


def _shell_append(note: str) -> str:
    return f"printf '%s\\n' '{note}' >> MEMORY.md"


# tool name offered by the harness -> the arguments that write `note` with it
NOTE_WRITERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "memory": lambda note: {"action": "add", "target": "memory", "content": note},  # hermes-agent
    "exec": lambda note: {"command": _shell_append(note), "title": "save a note"},  # openclaw
    "ipython": lambda note: {"code": f"rlm.harness.create_memory({note!r}, {note!r}, global_=True)"},  # prime-agent
    "bash": lambda note: {"command": _shell_append(note)},
    "shell": lambda note: {"command": _shell_append(note)},
}


def _offered(body_tools: list[dict[str, Any]] | None) -> list[str]:
    """Tool names in any API's shape: chat's {function: {name}}, Responses' and Anthropic's {name}."""
    return [(t.get("function") or {}).get("name") or t.get("name") or "" for t in body_tools or []]


def _trailing_user_text(messages: list[dict[str, Any]]) -> str | None:
    """The user messages at the end of the conversation (a harness may add its own context
    block after ours), or None when the conversation does not end with the user."""
    tail = []
    for message in reversed(messages):
        if message.get("role") != "user":
            break
        tail.append(_text(message))
    return "\n".join(reversed(tail)) if tail else None


def decide(messages: list[dict[str, Any]], effort: str = "low",
           tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The next assistant message: a note-writing tool call, or text."""
    last = _trailing_user_text(messages)
    offered = _offered(tools)
    if last is not None and "Review the conversation" in last:
        return {"content": "Nothing to save."}
    writer = next((name for name in NOTE_WRITERS if name in offered), None)
    if last is not None and writer and _TASK.search(last):
        task = _TASK.search(last).group(1)
        args = NOTE_WRITERS[writer](NOTE.format(task=task))
        return {"content": None, "tool_calls": [{
            "id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
            "function": {"name": writer, "arguments": json.dumps(args)}}]}
    plain = [{"role": "system" if m["role"] == "developer" else m["role"], "content": _text(m)}
             for m in messages if m.get("role") in ("system", "developer", "user", "assistant") and _text(m)]
    return {"content": answer_conversation(plain, effort).text}


@dataclass
class Served:
    """One request the scripted model answered: where, what it was sent, what it counted."""

    path: str
    body: dict[str, Any]
    response_id: str
    prompt_tokens: int
    completion_tokens: int


def _usage(messages: list[dict[str, Any]], message: dict[str, Any]) -> tuple[int, int]:
    return (max(1, sum(len(json.dumps(m)) // 4 for m in messages)),
            max(1, len(json.dumps(message)) // 4))


def _sse(obj: Any, event: str | None = None) -> str:
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return (f"event: {event}\n" if event else "") + f"data: {data}\n\n"


def _chat(body: dict[str, Any], served: list[Served]):
    messages = body.get("messages") or []
    message = decide(messages, tools=body.get("tools") or [])
    prompt, completion = _usage(messages, message)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "created": int(time.time()),
            "model": body.get("model", "carc-scripted")}
    served.append(Served("/v1/chat/completions", body, base["id"], prompt, completion))
    if not body.get("stream"):
        return JSONResponse({**base, "object": "chat.completion", "usage": usage, "choices": [
            {"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}]})

    def events():
        delta: dict[str, Any] = {"role": "assistant"}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": 0, **call} for call in message["tool_calls"]]
        else:
            delta["content"] = message["content"]
        chunk = {**base, "object": "chat.completion.chunk"}
        yield _sse({**chunk, "choices": [{"index": 0, "delta": delta}]})
        yield _sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        yield _sse({**chunk, "choices": [], "usage": usage})
        yield _sse("[DONE]")
    return StreamingResponse(events(), media_type="text/event-stream")


def _responses(body: dict[str, Any], served: list[Served]):
    request = ResponsesRequest.model_validate(body)
    messages = responses_messages(request)
    message = decide(messages, tools=body.get("tools") or [])
    prompt, completion = _usage(messages, message)
    rid = f"resp_{uuid.uuid4().hex[:12]}"
    served.append(Served("/v1/responses", body, rid, prompt, completion))
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:8]}", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                "status": "completed"}
    else:
        item = {"type": "message", "id": f"msg_{uuid.uuid4().hex[:8]}", "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}]}
    base = {"id": rid, "object": "response", "created_at": int(time.time()),
            "model": body.get("model", "carc-scripted"), "status": "in_progress", "output": [],
            "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
            "reasoning": body.get("reasoning")}
    final = {**base, "status": "completed", "output": [item], "usage": {
        "input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion,
        "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}
    if not body.get("stream"):
        return JSONResponse(final)

    def events():
        numbers = iter(range(1_000_000))

        def event(kind: str, **fields: Any) -> str:
            return _sse({"type": kind, "sequence_number": next(numbers), **fields}, kind)
        yield event("response.created", response=base)
        yield event("response.in_progress", response=base)
        if item["type"] == "function_call":
            yield event("response.output_item.added", output_index=0,
                        item={**item, "arguments": "", "status": "in_progress"})
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=0,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=0,
                        arguments=item["arguments"])
        else:
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.output_item.added", output_index=0,
                        item={**item, "status": "in_progress", "content": []})
            yield event("response.content_part.added", item_id=item["id"], output_index=0,
                        content_index=0, part=part)
            yield event("response.output_text.delta", item_id=item["id"], output_index=0,
                        content_index=0, delta=text, logprobs=[])
            yield event("response.output_text.done", item_id=item["id"], output_index=0,
                        content_index=0, text=text, logprobs=[])
            yield event("response.content_part.done", item_id=item["id"], output_index=0,
                        content_index=0, part={**part, "text": text})
        yield event("response.output_item.done", output_index=0, item=item)
        yield event("response.completed", response=final)
    return StreamingResponse(events(), media_type="text/event-stream")


def _anthropic(body: dict[str, Any], served: list[Served]):
    messages = anthropic_messages(body)
    message = decide(messages, tools=body.get("tools") or [])
    prompt, completion = _usage(messages, message)
    mid = f"msg_{uuid.uuid4().hex[:12]}"
    served.append(Served("/v1/messages", body, mid, prompt, completion))
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:8]}", "name": call["function"]["name"],
                 "input": json.loads(call["function"]["arguments"])}
        stop = "tool_use"
    else:
        block = {"type": "text", "text": message["content"]}
        stop = "end_turn"
    cache_write, cache_read = prompt // 4, prompt // 5
    start_usage = {"input_tokens": prompt - cache_write - cache_read,
                   "cache_creation_input_tokens": cache_write, "cache_read_input_tokens": cache_read}
    base = {"id": mid, "type": "message", "role": "assistant", "model": body.get("model", "carc-scripted"),
            "stop_sequence": None}
    if not body.get("stream"):
        return JSONResponse({**base, "content": [block], "stop_reason": stop,
                             "usage": {**start_usage, "output_tokens": completion}})

    def events():
        def event(kind: str, **fields: Any) -> str:
            return _sse({"type": kind, **fields}, kind)
        yield event("message_start", message={**base, "content": [], "stop_reason": None,
                                              "usage": {**start_usage, "output_tokens": 1}})
        if block["type"] == "tool_use":
            yield event("content_block_start", index=0, content_block={**block, "input": {}})
            yield event("content_block_delta", index=0, delta={
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])})
        else:
            yield event("content_block_start", index=0, content_block={"type": "text", "text": ""})
            yield event("content_block_delta", index=0, delta={"type": "text_delta", "text": block["text"]})
        yield event("content_block_stop", index=0)
        yield event("message_delta", delta={"stop_reason": stop, "stop_sequence": None},
                    usage={"output_tokens": completion})
        yield event("message_stop")
    return StreamingResponse(events(), media_type="text/event-stream")


def create_app(served: list[Served] | None = None) -> FastAPI:
    """The scripted model's app; every answered request is appended to `served`."""
    app = FastAPI(title="carc scripted tool model")
    served = served if served is not None else []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return _chat(await request.json(), served)

    @app.post("/v1/responses")
    async def responses(request: Request):
        return _responses(await request.json(), served)

    @app.post("/v1/messages")
    async def messages(request: Request):
        return _anthropic(await request.json(), served)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "carc-scripted", "object": "model"}]}

    return app


@contextmanager
def scripted_model_server(host: str | None = None, served: list[Served] | None = None,
                          app: FastAPI | None = None) -> Iterator[str]:
    """The scripted model on the Docker bridge gateway (where proxy containers reach the host);
    yields its base URL (…/v1). What it answers is appended to `served`; `app` serves another
    model there instead (a test's variant of this one)."""
    import uvicorn

    from sandboxes.images import docker_client
    from sandboxes.networks import host_address
    host = host or host_address(docker_client())
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app or create_app(served), host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True, name="scripted-model")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the scripted model did not start on {host}:{port}")
        time.sleep(0.05)
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
