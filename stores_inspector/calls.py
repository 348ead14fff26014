"""Model calls from the proxy journal, in one shape whatever the API: messages in, tool calls out.

OpenAI chat completions, OpenAI responses and Anthropic messages are read into `Message`s
(role, text, tool calls, the id a tool result answers) and the response's `ToolCall`s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proxy.journal import JournalEntry


@dataclass
class ToolCall:
    name: str
    args: Any  # parsed arguments (dict), or the raw string when they are not JSON
    id: str | None = None

    def arg_text(self) -> str:
        return self.args if isinstance(self.args, str) else json.dumps(self.args, ensure_ascii=False)


@dataclass
class Message:
    role: str  # system | user | assistant | tool
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    answers: str | None = None  # for a tool result: the id of the call it answers


@dataclass
class Call:
    """One model call: where it happened, which mechanism made it, what went in and came out."""

    entry: JournalEntry
    slot: int | None
    phase: str | None
    messages: list[Message]
    tool_calls: list[ToolCall]
    reply: str
    mechanism: str = "agent"  # or the background mechanism the harness parser recognised

    @property
    def t(self) -> float:
        return self.entry.t_start

    def system(self) -> str:
        return "\n".join(m.text for m in self.messages if m.role == "system")

    def trigger(self) -> str:
        """The user messages at the end: what the call was asked (a review prompt, a flush...);
        a harness may append its own context block after the request, so all of them."""
        tail = []
        for message in reversed(self.messages):
            if message.role != "user":
                break
            tail.append(message.text)
        return "\n".join(reversed(tail))

    def continues(self) -> bool:
        """The call carries on a tool loop (it ends with a tool result) rather than a new request."""
        return bool(self.messages) and self.messages[-1].role == "tool"


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    parts.append(block["text"])
                elif block.get("type") == "tool_result":
                    parts.append(_text(block.get("content")))
                elif isinstance(block.get("content"), (str, list)):
                    parts.append(_text(block["content"]))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def _args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw if raw is not None else {}


def _openai_tool_calls(calls: Any) -> list[ToolCall]:
    out = []
    for call in calls or []:
        if isinstance(call, dict):
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            out.append(ToolCall(function.get("name") or "", _args(function.get("arguments")), call.get("id")))
    return out


def _anthropic_blocks(content: Any) -> tuple[str, list[ToolCall], list[tuple[str, str]]]:
    """(text, tool_use calls, [(tool_use_id, result text)]) of a content block list."""
    if not isinstance(content, list):
        return _text(content), [], []
    texts, uses, results = [], [], []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "tool_use":
            uses.append(ToolCall(block.get("name") or "", block.get("input") or {}, block.get("id")))
        elif kind == "tool_result":
            results.append((block.get("tool_use_id"), _text(block.get("content"))))
        elif isinstance(block.get("text"), str):
            texts.append(block["text"])
    return "\n".join(texts), uses, results


def request_messages(entry: JournalEntry) -> list[Message]:
    body = entry.request_body()
    body = body if isinstance(body, dict) else {}
    out: list[Message] = []
    if entry.api == "anthropic-messages":
        if body.get("system"):
            out.append(Message("system", _text(body["system"])))
        for message in body.get("messages") or []:
            if not isinstance(message, dict):
                continue
            text, uses, results = _anthropic_blocks(message.get("content"))
            for call_id, result in results:
                out.append(Message("tool", result, answers=call_id))
            if text or uses:
                out.append(Message(message.get("role", "user"), text, uses))
        return out
    if entry.api == "openai-responses":
        if body.get("instructions"):
            out.append(Message("system", _text(body["instructions"])))
        items = body.get("input")
        for item in [items] if isinstance(items, str) else items or []:
            if isinstance(item, str):
                out.append(Message("user", item))
            elif not isinstance(item, dict):
                continue
            elif item.get("type") == "function_call":
                out.append(Message("assistant", "", [ToolCall(item.get("name") or "", _args(item.get("arguments")),
                                                              item.get("call_id"))]))
            elif item.get("type") == "function_call_output":
                out.append(Message("tool", _text(item.get("output")), answers=item.get("call_id")))
            else:
                role = item.get("role", "user")
                out.append(Message("system" if role == "developer" else role, _text(item.get("content"))))
        return out
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        role = message.get("role", "user")
        role = "system" if role == "developer" else role
        out.append(Message(role, _text(message.get("content")), _openai_tool_calls(message.get("tool_calls")),
                           message.get("tool_call_id")))
    return out


def response_output(entry: JournalEntry) -> tuple[str, list[ToolCall]]:
    """(reply text, tool calls) of the response."""
    body = entry.response if isinstance(entry.response, dict) else {}
    if entry.api == "anthropic-messages":
        text, uses, _ = _anthropic_blocks(body.get("content"))
        return text, uses
    if entry.api == "openai-responses":
        texts, calls = [], []
        for item in body.get("output") or []:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "function_call":
                calls.append(ToolCall(item.get("name") or "", _args(item.get("arguments")), item.get("call_id")))
            elif item.get("type") == "message":
                texts.append(_text(item.get("content")))
        return "\n".join(texts), calls
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = first.get("message") if isinstance(first.get("message"), dict) else {}
    return _text(message.get("content")), _openai_tool_calls(message.get("tool_calls"))


def is_model_call(entry: JournalEntry) -> bool:
    return entry.api != "other" and (entry.request_kept == "raw" or isinstance(entry.request, dict))


def read_call(entry: JournalEntry, slot: int | None) -> Call:
    reply, tool_calls = response_output(entry)
    return Call(entry, slot, entry.phase, request_messages(entry), tool_calls, reply)
