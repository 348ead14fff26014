"""A scripted tool-using model for harness tests (OpenAI-compatible, streaming like real ones).

It plays one script in the harness's own tool format: on the message that opens an instance it
first writes a note naming the task with a tool the harness offers; every other answer is the
embedded solver's reply to the conversation (so instances end as they would on the solver).
The integration tests read the journal: a memory-on harness brings the note back on a returning
instance, a memory-off one never does.

Which tool writes the note depends on what the request offers (`NOTE_WRITERS`, first match):
hermes' `memory` tool, openclaw's `exec` (append to the workspace's MEMORY.md, which openclaw
injects into every session), prime-agent's `ipython` (`rlm.harness.create_memory`), or a generic
shell tool. A new adapter whose harness offers none of these adds its own entry.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from solver_model.conversation import message_text
from solver_model.server import answer_conversation

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
    return [t.get("function", {}).get("name", "") for t in body_tools or []]


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


def create_app() -> FastAPI:
    app = FastAPI(title="carc scripted tool model")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        message = decide(body.get("messages") or [], tools=body.get("tools") or [])
        usage = {"prompt_tokens": sum(len(json.dumps(m)) // 4 for m in body.get("messages") or []),
                 "completion_tokens": len(json.dumps(message)) // 4}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "created": int(time.time()),
                "model": body.get("model", "carc-scripted")}
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
            yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': delta}]})}\n\n"
            yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': finish}]})}\n\n"
            yield f"data: {json.dumps({**chunk, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "carc-scripted", "object": "model"}]}

    return app


@contextmanager
def scripted_model_server(host: str | None = None) -> Iterator[str]:
    """The scripted model on the Docker bridge gateway (where proxy containers reach the host);
    yields its base URL."""
    import uvicorn

    from sandboxes.images import docker_client
    from sandboxes.networks import host_address
    host = host or host_address(docker_client())
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(), host=host, port=port, log_level="warning"))
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
