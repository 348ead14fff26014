"""An upstream that quotes the API key back, in every framing a client could decode.

`echo_reply(framing, secret)` is the chat-completions answer of a hostile or careless provider that
echoes the caller's key; `EchoingModel` serves such answers to a whole grid; `seen_by_client(...)` is everything a client could read out of the bytes
it got; `key_runs(...)` finds the key (or any RUN-character run of it) there, independently of
the proxy's own code (proxy/redact.py), so a test of the proxy is not the proxy testing itself.
"""

from __future__ import annotations

import asyncio
import gzip
import html
import json
import re
from urllib.parse import unquote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

# The nine framings the proxy must mask the key in (plain, SSE split mid-key, gzip, gzip SSE, a
# header, a chunked body; split across content deltas, across a tool call's argument deltas,
# JSON-escaped).
FRAMINGS = ("plain", "sse", "gzip", "gzip-sse", "header", "chunked", "split-content",
            "split-tools", "escaped")
RUN = 12


STREAMED = ("sse", "gzip-sse", "split-content", "split-tools")  # the framings of a stream


def chunk(delta: dict, finish: str | None = None, base: dict | None = None) -> dict:
    return {**(base or BASE), "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


BASE = {"id": "chatcmpl-echo", "created": 1, "model": "echo"}
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def event(obj) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def completion(message: dict, base: dict | None = None, usage: dict | None = None) -> dict:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {**(base or BASE), "object": "chat.completion", "usage": usage or USAGE,
            "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}]}


def escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


def with_secret(message: dict, secret: str) -> dict:
    """An assistant message that quotes `secret`: after its text, or (a tool call) in the first
    string argument of its first call, where a harness that runs the call would store it."""
    message = json.loads(json.dumps(message))
    for call in message.get("tool_calls") or []:
        arguments = json.loads(call["function"]["arguments"] or "{}")
        field = next((k for k, v in arguments.items() if isinstance(v, str)), None)
        if field is not None:
            arguments[field] += f" you sent {secret}"
            call["function"]["arguments"] = json.dumps(arguments)
            return message
    message["content"] = f"{message.get('content') or ''} you sent {secret}".strip()
    return message


def echo_reply(framing: str, secret: str, message: dict | None = None, base: dict | None = None,
               usage: dict | None = None) -> Response:
    """`message` (an assistant message; default: none but the echo) quoting the caller's `secret`
    (`with_secret`), in `framing`. Streams are cut mid-key between two network writes; the split
    framings put the two halves of the key in two events of the text or of the tool call's
    arguments (a tool call is added to a plain message for split-tools)."""
    message = message or {"content": ""}
    if framing == "split-tools" and not message.get("tool_calls"):
        message = {**message, "tool_calls": [{"id": "call_echo", "type": "function",
                                              "function": {"name": "echo", "arguments": "{\"note\": \"\"}"}}]}
    if framing == "header":
        return JSONResponse(completion(message, base, usage), headers={"x-echo-authorization": secret})
    message = with_secret(message, secret)
    whole = completion(message, base, usage)
    if framing == "plain":
        return JSONResponse(whole)
    if framing == "escaped":  # every quote of the secret as \uXXXX escapes in the JSON text
        return Response(json.dumps(whole).replace(secret, escaped(secret)).encode(),
                        media_type="application/json")
    if framing == "gzip":
        return Response(gzip.compress(json.dumps(whole).encode()), media_type="application/json",
                        headers={"content-encoding": "gzip"})
    if framing == "chunked":
        text = json.dumps(whole).encode()
        cut = text.index(secret.encode()) + len(secret) // 2

        async def pieces():
            yield text[:cut]
            await asyncio.sleep(0.05)
            yield text[cut:]
        return StreamingResponse(pieces(), media_type="application/json")
    if framing not in STREAMED:
        raise ValueError(f"unknown framing {framing!r}; one of {', '.join(FRAMINGS)}")
    finish = whole["choices"][0]["finish_reason"]
    calls = [{"index": i, **call} for i, call in enumerate(message.get("tool_calls") or [])]
    first = {"role": "assistant", "content": message.get("content")}
    ending = event(chunk({}, finish, base)) + event({**(base or BASE), "object": "chat.completion.chunk",
                                                     "choices": [], "usage": usage or USAGE}) + event("[DONE]")
    if framing in ("sse", "gzip-sse"):
        text = event(chunk({**first, **({"tool_calls": calls} if calls else {})}, None, base))
        if framing == "gzip-sse":
            return Response(gzip.compress(text + ending), media_type="text/event-stream",
                            headers={"content-encoding": "gzip"})
        cut = text.index(secret.encode()) + len(secret) // 2
        writes = [text[:cut], text[cut:] + ending]
    elif framing == "split-content" or not calls:
        before, _, after = (first["content"] or "").partition(secret)
        half = secret[:len(secret) // 2], secret[len(secret) // 2:]
        writes = [event(chunk({**first, "content": before + half[0]}, None, base)),
                  event(chunk({"content": half[1] + after}, None, base))]
        writes += [event(chunk({"tool_calls": calls}, None, base))] if calls else []
        writes += [ending]
    else:  # split-tools: the first call's arguments in two deltas, cut mid-key
        arguments = calls[0]["function"]["arguments"]
        cut = arguments.index(secret) + len(secret) // 2
        opening = {**calls[0], "function": {**calls[0]["function"], "arguments": ""}}
        writes = [event(chunk({**first, "tool_calls": [opening]}, None, base)),
                  event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[:cut]}}]}, None, base)),
                  event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[cut:]}}]}, None, base))]
        writes += [event(chunk({"tool_calls": calls[1:]}, None, base))] if calls[1:] else []
        writes += [ending]

    async def stream():
        for write in writes:
            yield write
            await asyncio.sleep(0.05)
    return StreamingResponse(stream(), media_type="text/event-stream")


def seen_by_client(wire: bytes, headers: str = "", content_encoding: str = "") -> list[str]:
    """Every text a client could read from an answer: the bytes (decompressed), each JSON string
    decoded (also JSON held in a string), and each stream's deltas joined per choice and tool call."""
    body = gzip.decompress(wire) if content_encoding == "gzip" else wire
    text = body.decode("utf-8", errors="replace")
    texts = [headers, text, unquote(text), html.unescape(text)]
    documents = []
    try:
        documents.append(json.loads(text))
    except ValueError:
        for line in re.findall(r"^data: ?(.*)$", text, flags=re.M):
            try:
                documents.append(json.loads(line))
            except ValueError:
                texts.append(line)
    joined: dict[tuple, str] = {}
    for document in documents:
        texts += strings(document)
        for choice in (document.get("choices") or []) if isinstance(document, dict) else []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                key = ("content", choice.get("index"))
                joined[key] = joined.get(key, "") + delta["content"]
            for call in delta.get("tool_calls") or []:
                piece = (call.get("function") or {}).get("arguments")
                if isinstance(piece, str):
                    key = ("arguments", choice.get("index"), call.get("index"))
                    joined[key] = joined.get(key, "") + piece
    for value in joined.values():
        texts.append(value)
        try:
            texts += strings(json.loads(value))
        except ValueError:
            pass
    return texts


def strings(value) -> list[str]:
    if isinstance(value, str):
        out = [value]
        try:
            inner = json.loads(value)
        except ValueError:
            return out
        return out + (strings(inner) if isinstance(inner, (dict, list)) else [])
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def key_runs(secret: str, texts) -> list[str]:
    """The RUN-character runs of `secret` found in `texts` (str or bytes), as written or through
    \\u escapes."""
    runs = {secret[i:i + RUN] for i in range(len(secret) - RUN + 1)}
    found = []
    for text in texts:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        views = [text, re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)]
        found += sorted({run for run in runs for view in views if run in view})
    return found


class EchoingModel:
    """The scripted tool-using model (harness_adapters/scripted_model.py), each answer quoting the
    caller's key in the next framing of its kind: a streamed request gets the stream framings in
    turn, any other the body framings, so every framing reaches a learner in a real grid."""

    def __init__(self) -> None:
        self.served: list[str] = []  # the framing of each answer
        self._turn = {True: 0, False: 0}

    def app(self):
        from harness_adapters.scripted_model import decide

        app = FastAPI(title="carc key-echoing model")

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            streamed = bool(body.get("stream"))
            kinds = STREAMED if streamed else tuple(f for f in FRAMINGS if f not in STREAMED)
            framing = kinds[self._turn[streamed] % len(kinds)]
            self._turn[streamed] += 1
            self.served.append(framing)
            message = decide(body.get("messages") or [], tools=body.get("tools") or [])
            message = {k: v for k, v in message.items() if v is not None} or {"content": ""}
            if framing == "split-tools" and not message.get("tool_calls"):
                framing = "split-content"  # a tool the harness does not have would derail it
                self.served[-1] = framing
            base = {"id": f"chatcmpl-echo{len(self.served)}", "created": 1,
                    "model": body.get("model", "echo")}
            return echo_reply(framing, request.headers.get("authorization", ""), message, base)

        return app
