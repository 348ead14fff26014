"""Streamed model responses (server-sent events) reassembled into the non-streamed object.

Pure and stdlib only. Nothing here raises on bad input: a reassembler returns what it could
build plus an error string, so a call cut off mid-stream is journaled with its partial content.

Three wire formats:
- OpenAI chat completions: `chat.completion.chunk` objects, `data: [DONE]` at the end, the usage
  in a last chunk with empty choices when `stream_options.include_usage` was asked for.
- OpenAI Responses: typed events; `response.completed` (or `.failed` / `.incomplete`) carries
  the whole final response.
- Anthropic messages: `message_start`, `content_block_start/delta/stop`, `message_delta`,
  `message_stop`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.journal import Api


@dataclass(frozen=True)
class SseEvent:
    event: str  # the `event:` field, "" when absent
    data: str  # the `data:` lines joined with "\n"


def api_of(path: str) -> Api:
    """Which model API a request path belongs to (query string and trailing slash ignored)."""
    path = path.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return "openai-chat"
    if path.endswith("/responses") or path == "responses":
        return "openai-responses"
    if path.endswith("/messages"):
        return "anthropic-messages"
    return "other"


def parse_events(body: bytes | str) -> list[SseEvent]:
    """Split an event stream into events (WHATWG rules; a final event without its blank line is
    kept, since a stream cut off mid-way is exactly what the journal must show)."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, (bytes, bytearray)) else body
    events: list[SseEvent] = []
    name, data = "", []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line:
            if data:
                events.append(SseEvent(name, "\n".join(data)))
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    if data:
        events.append(SseEvent(name, "\n".join(data)))
    return events


def reassemble(api: Api, body: bytes | str) -> tuple[dict | None, str | None]:
    """The non-streamed response equivalent to a streamed body, and an error string if the stream
    was malformed, reported an error, or ended early. Never raises."""
    try:
        events = parse_events(body)
        if api == "openai-chat":
            return _ChatStream().run(events)
        if api == "openai-responses":
            return _ResponsesStream().run(events)
        if api == "anthropic-messages":
            return _AnthropicStream().run(events)
        return None, f"no reassembly for api {api!r}"
    except Exception as e:  # noqa: BLE001 - the journal must get a line whatever arrived
        return None, f"reassembly failed: {type(e).__name__}: {e}"


def usage_of(api: Api, response: Any) -> tuple[int | None, int | None]:
    """(prompt tokens, completion tokens) of a non-streamed (or reassembled) response body.

    Anthropic's input count includes cache writes and reads, since they are all prompt tokens.
    Unknown shapes give (None, None); never raises.
    """
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None, None
    if api == "openai-chat":
        return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    if api == "openai-responses":
        return _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
    if api == "anthropic-messages":
        return _anthropic_input(usage), _int(usage.get("output_tokens"))
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    return _anthropic_input(usage), _int(usage.get("output_tokens"))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _anthropic_input(usage: dict) -> int | None:
    parts = [_int(usage.get(k)) for k in
             ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
    if parts[0] is None:
        return None
    return sum(p for p in parts if p is not None)


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _json_objects(events: list[SseEvent], errors: list[str]) -> list[tuple[str, dict]]:
    """(event name, JSON object) of every event whose data is a JSON object; notes the rest."""
    out = []
    for event in events:
        if event.data.strip() == "[DONE]":
            out.append((event.event, {"__done__": True}))
            continue
        try:
            obj = json.loads(event.data)
        except ValueError:
            errors.append(f"event data is not JSON: {event.data[:80]!r}")
            continue
        if isinstance(obj, dict):
            out.append((event.event, obj))
        else:
            errors.append(f"event data is not a JSON object: {event.data[:80]!r}")
    return out


def _error_text(obj: Any) -> str:
    if isinstance(obj, dict):
        inner = obj.get("error", obj)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner.get("type") or inner)[:500]
        return str(inner)[:500]
    return str(obj)[:500]


def _joined(errors: list[str]) -> str | None:
    return "; ".join(dict.fromkeys(errors)) if errors else None


class _ChatStream:
    """OpenAI chat completion chunks -> one `chat.completion` object."""

    def run(self, events: list[SseEvent]) -> tuple[dict | None, str | None]:
        errors: list[str] = []
        result: dict[str, Any] = {}
        choices: dict[int, dict[str, Any]] = {}
        done = False
        for _, chunk in _json_objects(events, errors):
            if chunk.get("__done__"):
                done = True
                continue
            if "error" in chunk:
                errors.append(f"stream error: {_error_text(chunk)}")
            for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
                if key in chunk and key not in result:
                    result[key] = chunk[key]
            if isinstance(chunk.get("usage"), dict):
                result["usage"] = chunk["usage"]
            for choice in _list(chunk.get("choices")):
                if isinstance(choice, dict):
                    self._add(choices, choice)
        if not result and not choices:
            return None, _joined(errors + ["no chat completion chunk in the stream"])
        if not done:
            errors.append("stream ended without [DONE]")
        result["object"] = "chat.completion"
        result["choices"] = [self._finish(choices[i]) for i in sorted(choices)]
        return result, _joined(errors)

    @staticmethod
    def _add(choices: dict[int, dict[str, Any]], choice: dict) -> None:
        index = _int(choice.get("index")) or 0
        state = choices.setdefault(index, {"index": index, "message": {"role": "assistant"},
                                           "finish_reason": None, "tool_calls": {}})
        message = state["message"]
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        if isinstance(delta.get("role"), str):
            message["role"] = delta["role"]
        for key in ("content", "refusal", "reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str):
                message[key] = message.get(key, "") + delta[key]
        for call in _list(delta.get("tool_calls")):
            if not isinstance(call, dict):
                continue
            slot = state["tool_calls"].setdefault(
                _int(call.get("index")) or 0,
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            if isinstance(call.get("id"), str):
                slot["id"] = call["id"]
            if isinstance(call.get("type"), str):
                slot["type"] = call["type"]
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            slot["function"]["name"] += _text(function.get("name"))
            slot["function"]["arguments"] += _text(function.get("arguments"))
        if choice.get("finish_reason") is not None:
            state["finish_reason"] = choice["finish_reason"]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            state.setdefault("logprobs", {"content": []})["content"].extend(logprobs["content"])

    @staticmethod
    def _finish(state: dict[str, Any]) -> dict[str, Any]:
        message = state["message"]
        message.setdefault("content", None)
        if state["tool_calls"]:
            message["tool_calls"] = [state["tool_calls"][i] for i in sorted(state["tool_calls"])]
        choice = {"index": state["index"], "message": message,
                  "finish_reason": state["finish_reason"]}
        if "logprobs" in state:
            choice["logprobs"] = state["logprobs"]
        return choice


class _ResponsesStream:
    """OpenAI Responses API events -> the final `response` object."""

    FINAL = ("response.completed", "response.failed", "response.incomplete")

    def run(self, events: list[SseEvent]) -> tuple[dict | None, str | None]:
        errors: list[str] = []
        base: dict[str, Any] | None = None
        items: dict[int, Any] = {}
        texts: dict[int, str] = {}
        for name, obj in _json_objects(events, errors):
            kind = obj.get("type") if isinstance(obj.get("type"), str) else name
            if kind in self.FINAL and isinstance(obj.get("response"), dict):
                final = obj["response"]
                if kind != "response.completed":
                    why = final.get("error") or final.get("incomplete_details")
                    errors.append(f"{kind}: {_error_text(why)}")
                return final, _joined(errors)
            started = kind in ("response.created", "response.in_progress")
            if started and isinstance(obj.get("response"), dict):
                base = dict(obj["response"])
            elif kind == "response.output_item.done":
                items[_int(obj.get("output_index")) or 0] = obj.get("item")
            elif kind == "response.output_text.delta":
                index = _int(obj.get("output_index")) or 0
                texts[index] = texts.get(index, "") + _text(obj.get("delta"))
            elif kind == "error":
                errors.append(f"stream error: {_error_text(obj)}")
        if base is None and not items and not texts:
            return None, _joined(errors + ["no Responses event in the stream"])
        result = base or {"object": "response"}
        output = [items[i] for i in sorted(items)]
        for index in sorted(set(texts) - set(items)):
            output.append({"type": "message", "role": "assistant", "status": "incomplete",
                           "content": [{"type": "output_text", "text": texts[index],
                                        "annotations": []}]})
        result["output"] = output
        result["status"] = "incomplete"
        errors.append("stream ended without response.completed")
        return result, _joined(errors)


class _AnthropicStream:
    """Anthropic message stream events -> one `message` object."""

    def run(self, events: list[SseEvent]) -> tuple[dict | None, str | None]:
        errors: list[str] = []
        message: dict[str, Any] | None = None
        blocks: dict[int, dict[str, Any]] = {}
        partial_json: dict[int, str] = {}
        stopped = False
        for name, obj in _json_objects(events, errors):
            kind = obj.get("type") if isinstance(obj.get("type"), str) else name
            if kind == "message_start" and isinstance(obj.get("message"), dict):
                message = dict(obj["message"])
                for i, block in enumerate(_list(message.get("content"))):
                    if isinstance(block, dict):
                        blocks[i] = dict(block)
            elif kind == "content_block_start" and isinstance(obj.get("content_block"), dict):
                blocks[_int(obj.get("index")) or 0] = dict(obj["content_block"])
            elif kind == "content_block_delta" and isinstance(obj.get("delta"), dict):
                index = _int(obj.get("index")) or 0
                self._delta(blocks.setdefault(index, {"type": "text", "text": ""}),
                            obj["delta"], partial_json, index)
            elif kind == "content_block_stop":
                index = _int(obj.get("index")) or 0
                self._close_json(blocks, partial_json, index, errors)
            elif kind == "message_delta":
                message = message if message is not None else {"type": "message"}
                delta = obj.get("delta") if isinstance(obj.get("delta"), dict) else {}
                for key in ("stop_reason", "stop_sequence"):
                    if key in delta:
                        message[key] = delta[key]
                if isinstance(obj.get("usage"), dict):
                    usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
                    message["usage"] = {**usage, **{k: v for k, v in obj["usage"].items()
                                                    if v is not None}}
            elif kind == "message_stop":
                stopped = True
            elif kind == "error":
                errors.append(f"stream error: {_error_text(obj)}")
        if message is None and not blocks:
            return None, _joined(errors + ["no Anthropic message event in the stream"])
        for index in list(partial_json):
            self._close_json(blocks, partial_json, index, errors)
        message = message if message is not None else {"type": "message"}
        message["content"] = [blocks[i] for i in sorted(blocks)]
        if not stopped:
            errors.append("stream ended without message_stop")
        return message, _joined(errors)

    @staticmethod
    def _delta(block: dict[str, Any], delta: dict, partial_json: dict[int, str],
               index: int) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = _text(block.get("text")) + _text(delta.get("text"))
        elif kind == "input_json_delta":
            partial_json[index] = partial_json.get(index, "") + _text(delta.get("partial_json"))
        elif kind == "thinking_delta":
            block["thinking"] = _text(block.get("thinking")) + _text(delta.get("thinking"))
        elif kind == "signature_delta":
            block["signature"] = _text(block.get("signature")) + _text(delta.get("signature"))
        elif kind == "citations_delta" and "citation" in delta:
            block.setdefault("citations", []).append(delta["citation"])

    @staticmethod
    def _close_json(blocks: dict[int, dict[str, Any]], partial_json: dict[int, str], index: int,
                    errors: list[str]) -> None:
        if index not in partial_json:
            return
        text = partial_json.pop(index)
        block = blocks.setdefault(index, {"type": "tool_use"})
        try:
            block["input"] = json.loads(text) if text.strip() else {}
        except ValueError:
            block["partial_json"] = text  # kept as it came: the stream was cut or malformed
            errors.append(f"tool input of content block {index} is not complete JSON")
