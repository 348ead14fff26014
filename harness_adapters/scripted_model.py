"""A scripted tool-using model for harness tests (OpenAI-compatible, streaming like real ones).

It plays one script in the harness's own tool format: on the message that opens an instance it
first calls the harness's memory tool to write a note naming the task; every other answer is the
embedded solver's reply to the conversation (so instances end as they would on the solver). It
marks in each answer whether the note for this task was already in the prompt, which is what
the integration tests read: a memory-on harness shows it on a returning instance, memory-off not.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from solver_model.conversation import message_text
from solver_model.server import _answer

NOTE = "carc-note: task {task} was seen"
_TASK = re.compile(r"Task id: (\S+)")


def _text(message: dict[str, Any]) -> str:
    return message_text(message.get("content")) or ""


def decide(messages: list[dict[str, Any]], effort: str = "low") -> dict[str, Any]:
    """The next assistant message: a memory tool call, or text."""
    last = messages[-1] if messages else {}
    if last.get("role") == "user" and "Review the conversation" in _text(last):
        return {"content": "Nothing to save."}
    if last.get("role") == "user" and _TASK.search(_text(last)):
        task = _TASK.search(_text(last)).group(1)
        args = {"action": "add", "target": "memory", "content": NOTE.format(task=task)}
        return {"content": None, "tool_calls": [{
            "id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
            "function": {"name": "memory", "arguments": json.dumps(args)}}]}
    plain = [{"role": m["role"], "content": _text(m)} for m in messages
             if m.get("role") in ("system", "user", "assistant") and _text(m)]
    return {"content": _answer(plain, effort, None, None).text}


def create_app() -> FastAPI:
    app = FastAPI(title="carc scripted tool model")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        message = decide(body.get("messages") or [])
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
