"""The embedded solver model behind an OpenAI-compatible HTTP endpoint (FastAPI + uvicorn).

Routes (also served without the /v1 prefix, for clients configured with a bare base URL):
- `GET /v1/models`: `carc-solver` and `carc-solver-low|medium|high`.
- `POST /v1/chat/completions`: non-streaming and streaming (server-sent chunks). A request that
  offers `tools` is answered by the tool-using agent (`solver_model/agent.py`): its reply is either
  `tool_calls` (finish_reason "tool_calls"; streamed as tool-call deltas) or text; without tools
  the reply is the policy's text, exactly as before.
- `POST /v1/responses`: non-streaming only; with `tools`, calls come as `function_call` items.
- `POST /v1/messages`: Anthropic's messages API, streamed or not; with `tools`, calls come as
  `tool_use` blocks (stop_reason "tool_use"), tool results as `tool_result` blocks.

Effort: the request's `reasoning_effort` (or `reasoning.effort`; on messages `output_config.effort`,
or the thinking budget: up to 2048 tokens low, up to 8192 medium, more high), else a
`-low|-medium|-high` suffix of the model id, else the server default. Every completion reports the time spent reading
the conversation and searching in `carc.search_ms` and the `x-carc-search-ms` header, so the
orchestrator can tell model time from harness time.

Timing (`timing`, off by default): every reply waits a time to first token and streams at a
decode rate drawn per call, seeded by the model seed and the request (`solver_model/timing.py`);
streamed replies pace their chunks, others wait the total. The wait is an `asyncio.sleep` on the
event loop, so one server holds any number of waiting calls; `app.state.calls` keeps each call's
start, the start of its wait, its end (monotonic seconds) and drawn delay.

Token counts are deterministic: a token is a run of word characters or one other non-blank
character (`count_tokens`), so `[[0,1]]` is 7 tokens. Prompt tokens count the text of every
message, the JSON of any tool calls in them, and the JSON of the request's `tools`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import math
import os
import re
import time
from pathlib import Path
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from solver_model.arc3_play import arc3_reply, is_arc3
from solver_model.agent import ToolCall, act
from solver_model.conversation import message_text, read_conversation
from solver_model.policy import SearchFn, prior_search, reply
from solver_model.prior import PrimitivePrior
from solver_model.search import EFFORTS
from solver_model.timing import TIMING_ENV, Delay, Timing, from_env, request_key, to_env

MODEL = "carc-solver"
MODEL_IDS = (MODEL,) + tuple(f"{MODEL}-{effort}" for effort in EFFORTS)
EFFORT_ENV = "CARC_SOLVER_EFFORT"
USAGE_LOG_ENV = "CARC_SOLVER_USAGE_LOG"
SEED_ENV = "CARC_SOLVER_SEED"
PRIOR_ENV = "CARC_SOLVER_PRIOR"  # a prior.json (solver_model/prior.py): a model trained between rounds
# Reasoning-effort values other OpenAI models accept, mapped onto the search's three levels.
EFFORT_ALIASES = {"none": "low", "minimal": "low", "xhigh": "high"}
STREAM_PIECES = 4

_TOKEN = re.compile(r"\w+|[^\w\s]")


@functools.lru_cache(maxsize=8192)  # a conversation comes back whole on every turn
def count_tokens(text: str) -> int:
    """Deterministic token count: runs of word characters plus single other non-blank characters."""
    return len(_TOKEN.findall(text))


class RequestError(Exception):
    """A request the server cannot serve; becomes an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def response(self) -> JSONResponse:
        return _error(self.status, self.message, self.param, self.kind)


def _error(status: int, message: str, param: str | None = None,
           kind: str = "invalid_request_error") -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def choose_effort(requested: str | None, model: str, default: str) -> str:
    """The request's effort if given, else the model id's suffix, else the server default."""
    if requested is not None:
        effort = EFFORT_ALIASES.get(requested, requested)
        if effort not in EFFORTS:
            known = ", ".join(list(EFFORTS) + list(EFFORT_ALIASES))
            raise RequestError(f"reasoning_effort {requested!r} is not supported; "
                               f"use one of {known}", "reasoning_effort")
        return effort
    for effort in EFFORTS:
        if model.endswith(f"-{effort}"):
            return effort
    return default


# --- request bodies ---------------------------------------------------------------------------

class _Open(BaseModel):
    # Clients send many optional OpenAI fields (temperature, top_p, user, ...); they are ignored.
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: str = "text"
    text: str | None = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart | str] | None = None
    tool_calls: list[dict[str, Any]] | None = None


class StreamOptions(_Open):
    include_usage: bool | None = False


class Reasoning(_Open):
    effort: str | None = None


class ChatRequest(_Open):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    reasoning_effort: str | None = None
    reasoning: Reasoning | None = None
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None  # accepted; a reply is never cut (a cut action is malformed)
    max_completion_tokens: int | None = None
    n: int | None = None


class ThinkingConfig(_Open):
    type: str
    budget_tokens: int | None = None


class MessagesRequest(_Open):
    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int  # required by Anthropic's API; accepted (a reply is never cut)
    system: str | list[dict[str, Any]] | None = None
    stream: bool | None = False
    thinking: ThinkingConfig | None = None
    output_config: Reasoning | None = None
    tools: list[dict[str, Any]] | None = None


class ResponsesRequest(_Open):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    reasoning: Reasoning | None = None
    stream: bool | None = False
    tools: list[dict[str, Any]] | None = None


def _validate(model: type[BaseModel], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(_field_path(first["loc"])) or None
        raise RequestError(f"{param or 'body'}: {first['msg']}", param) from None


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _field_path(loc: Sequence[Any]) -> list[str]:
    """The field path of a validation error, without pydantic's union member tags ("str", ...)."""
    path = []
    for part in loc:
        tag = isinstance(part, str) and (part in _TYPE_TAGS
                                         or not re.fullmatch(r"[a-z_][a-z0-9_]*", part))
        if tag:
            break
        path.append(str(part))
    return path


async def _json_body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None


# --- the model's answer -----------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    """One reply of the model and what it cost to make."""

    text: str
    effort: str
    mode: str
    program: str | None
    search_ms: float
    prompt_tokens: int
    calls: tuple[ToolCall, ...] = ()

    @property
    def completion_tokens(self) -> int:
        return count_tokens(self.text) + sum(count_tokens(json.dumps(c.to_openai())) for c in self.calls)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.calls else "stop"

    def message(self) -> dict[str, Any]:
        if self.calls:
            return {"role": "assistant", "content": None, "refusal": None,
                    "tool_calls": [c.to_openai() for c in self.calls]}
        return {"role": "assistant", "content": self.text, "refusal": None}

    def usage(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": total}

    def carc(self) -> dict[str, Any]:
        return {"effort": self.effort, "mode": self.mode, "program": self.program,
                "search_ms": round(self.search_ms, 3)}

    def headers(self) -> dict[str, str]:
        return {"x-carc-search-ms": f"{self.search_ms:.3f}", "x-carc-effort": self.effort}


def answer_conversation(messages: Sequence[Mapping[str, Any]], effort: str, extra_prompt: Any = None,
                        search: SearchFn | None = None, seed: int = 0,
                        tools: Sequence[Mapping[str, Any]] | None = None) -> Answer:
    """Read the conversation and run the policy, or the agent when `tools` are offered
    (CPU-bound: called in a worker thread)."""
    start = time.perf_counter()
    calls: tuple[ToolCall, ...] = ()
    if is_arc3(messages):  # a game level: one action per reply, tools or not (solver_model/arc3_play.py)
        text = arc3_reply(messages, effort, seed)
        prompt = [message_text(m.get("content")) for m in messages]
        return Answer(text, effort, "arc3", None, (time.perf_counter() - start) * 1000,
                      sum(count_tokens(p) for p in prompt))
    state = read_conversation(messages)
    if tools:
        acted = act(messages, tools, effort, search, seed, state)
        text, program, calls = acted.text or "", acted.program_description, acted.calls
    else:
        result = reply(state, effort, search, seed)
        text, program = result.text, result.program_description
    elapsed = (time.perf_counter() - start) * 1000
    prompt = [message_text(m.get("content")) for m in messages]
    prompt += [json.dumps(m["tool_calls"]) for m in messages if m.get("tool_calls")]
    if extra_prompt:
        prompt.append(json.dumps(extra_prompt))
    return Answer(text, effort, state.mode.value, program, elapsed,
                  sum(count_tokens(p) for p in prompt), calls)


def _pieces(text: str, count: int) -> list[str]:
    size = max(1, math.ceil(len(text) / count))
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


# --- the app ----------------------------------------------------------------------------------

def create_app(effort_default: str = "medium", search: SearchFn | None = None,
               threads: int = 4, usage_log: str | None = None, seed: int = 0,
               timing: Timing | None = None, prior: PrimitivePrior | None = None) -> FastAPI:
    """The FastAPI app. `search` replaces the real program search (tests inject one).

    `usage_log`: a file that gets one JSON line per answered request with the tokens counted
    (the server's own count, which a run's proxy journal is checked against) and, with
    `timing`, the call's drawn delays.
    `timing`: real-model timing (solver_model/timing.py); None answers as fast as it can.
    `prior`: the primitive prior of a model trained between rounds (solver_model/prior.py); its
    search draws the primitives' order by it. None: the untrained model.
    """
    if effort_default not in EFFORTS:
        raise ValueError(f"effort_default {effort_default!r} is not one of {', '.join(EFFORTS)}")
    if prior is not None and search is None:
        search = prior_search(prior)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="carc-solver")
    ids = itertools.count(1)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="carc embedded solver model", lifespan=lifespan)
    # per call: when it came, when its answer was ready and the wait began, when it ended
    app.state.calls = deque(maxlen=100_000)  # {"start", "waiting", "end", "delay_s"}
    router = APIRouter()

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    async def run(messages: list[dict[str, Any]], effort: str, extra_prompt: Any,
                  tools: list[dict[str, Any]] | None = None,
                  key: str = "") -> tuple[Answer, Delay | None]:
        loop = asyncio.get_running_loop()
        try:
            answer = await loop.run_in_executor(pool, answer_conversation, messages, effort,
                                                extra_prompt, search, seed, tools)
        except Exception as exc:  # noqa: BLE001 - a solver bug must reach the client as a 500
            raise RequestError(f"the solver failed: {type(exc).__name__}: {exc}", None, 500,
                               "server_error") from exc
        delay = timing.draw(seed, key) if timing is not None else None
        if usage_log:
            drawn = delay.record(answer.completion_tokens) if delay else {}
            with open(usage_log, "a") as ledger:
                ledger.write(json.dumps({"t": time.time(), **answer.usage(), **drawn}) + "\n")
        return answer, delay

    async def wait(delay: Delay | None, answer: Answer, start: float) -> None:
        """A non-streamed reply: wait the whole call's time, then note the call."""
        waiting = time.monotonic()
        if delay is not None:
            await asyncio.sleep(delay.total_s(answer.completion_tokens))
        app.state.calls.append({"start": start, "waiting": waiting, "end": time.monotonic(),
                                "delay_s": delay.total_s(answer.completion_tokens) if delay else 0.0})

    async def paced(events: AsyncIterator[str], delay: Delay | None, answer: Answer,
                    start: float, trailing: int) -> AsyncIterator[str]:
        """A streamed reply: the first event after the TTFT, the content events spread over the
        decode time, and the `trailing` closing events (finish, usage, done) right after the
        last content, as a provider sends them (a client may hang up once it has the finish
        reason); the call is noted when its last event is sent."""
        chunks = [e async for e in events]
        waiting = time.monotonic()
        if delay is not None:
            await asyncio.sleep(delay.ttft_s)
        paced_events = max(1, len(chunks) - 1 - trailing)
        gap = delay.decode_s(answer.completion_tokens) / paced_events if delay else 0.0
        for i, chunk in enumerate(chunks):
            if gap and 0 < i <= paced_events:
                await asyncio.sleep(gap)
            yield chunk
        app.state.calls.append({"start": start, "waiting": waiting, "end": time.monotonic(),
                                "delay_s": delay.total_s(answer.completion_tokens) if delay else 0.0})

    def timing_headers(delay: Delay | None, answer: Answer) -> dict[str, str]:
        return {"x-carc-delay-s": f"{delay.total_s(answer.completion_tokens):.3f}"} if delay else {}

    @router.get("/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(m) for m in MODEL_IDS]}

    @router.get("/models/{model_id}")
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id not in MODEL_IDS:
            raise RequestError(f"model {model_id!r} does not exist; models: {', '.join(MODEL_IDS)}",
                               "model", 404)
        return _model_card(model_id)

    @router.post("/chat/completions")
    async def chat_completions(request: Request):
        start = time.monotonic()
        raw = await _json_body(request)
        chat: ChatRequest = _validate(ChatRequest, raw)
        if chat.n not in (None, 1):
            raise RequestError("n: only one choice per request is supported", "n")
        requested = chat.reasoning_effort or (chat.reasoning.effort if chat.reasoning else None)
        effort = choose_effort(requested, chat.model, effort_default)
        messages = [m.model_dump(exclude_none=True) for m in chat.messages]
        answer, delay = await run(messages, effort, chat.tools, chat.tools,
                                  request_key("chat", raw))
        number, created = next(ids), int(time.time())
        completion_id = f"chatcmpl-carc-{number:06d}"
        headers = {**answer.headers(), **timing_headers(delay, answer)}
        if not chat.stream:
            await wait(delay, answer, start)
            return JSONResponse({
                "id": completion_id, "object": "chat.completion", "created": created,
                "model": chat.model, "system_fingerprint": None,
                "choices": [{"index": 0, "finish_reason": answer.finish_reason, "logprobs": None,
                             "message": answer.message()}],
                "usage": answer.usage(), "carc": answer.carc(),
            }, headers=headers)
        include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
        return StreamingResponse(
            paced(_stream(answer, completion_id, created, chat.model, include_usage), delay, answer, start,
                  trailing=2 + include_usage),  # the finish chunk, the usage chunk, [DONE]
            media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"})

    @router.post("/responses")
    async def responses(request: Request):
        start = time.monotonic()
        raw = await _json_body(request)
        body: ResponsesRequest = _validate(ResponsesRequest, raw)
        if body.stream:
            raise RequestError("stream: streaming is not supported on /v1/responses; use "
                               "/v1/chat/completions", "stream")
        requested = body.reasoning.effort if body.reasoning else None
        effort = choose_effort(requested, body.model, effort_default)
        answer, delay = await run(responses_messages(body), effort, body.tools, body.tools,
                                  request_key("responses", raw))
        await wait(delay, answer, start)
        number, created = next(ids), int(time.time())
        usage = answer.usage()
        return JSONResponse({
            "id": f"resp-carc-{number:06d}", "object": "response", "created_at": created,
            "model": body.model, "status": "completed", "error": None, "incomplete_details": None,
            "instructions": body.instructions, "metadata": {}, "parallel_tool_calls": False,
            "tool_choice": "auto", "tools": [], "temperature": None, "top_p": None,
            "reasoning": {"effort": effort, "summary": None},
            "output": _responses_output(answer, number),
            "usage": {"input_tokens": usage["prompt_tokens"],
                      "output_tokens": usage["completion_tokens"],
                      "total_tokens": usage["total_tokens"],
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}},
            "carc": answer.carc(),
        }, headers={**answer.headers(), **timing_headers(delay, answer)})

    @router.post("/messages")
    async def messages(request: Request):
        start = time.monotonic()
        raw = await _json_body(request)
        body: MessagesRequest = _validate(MessagesRequest, raw)
        requested = (body.output_config.effort if body.output_config and body.output_config.effort
                     else _budget_effort(body.thinking))
        effort = choose_effort(requested, body.model, effort_default)
        tools = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                                   "parameters": t.get("input_schema") or {}}}
                 for t in body.tools or []]
        answer, delay = await run(anthropic_messages(body.model_dump()), effort, body.tools, tools or None,
                                  request_key("messages", raw))
        number = next(ids)
        headers = {**answer.headers(), **timing_headers(delay, answer)}
        message = {"id": f"msg_carc_{number:06d}", "type": "message", "role": "assistant",
                   "model": body.model, "content": _anthropic_content(answer, number),
                   "stop_reason": "tool_use" if answer.calls else "end_turn", "stop_sequence": None,
                   "usage": {"input_tokens": answer.prompt_tokens,
                             "output_tokens": answer.completion_tokens},
                   "carc": answer.carc()}
        if not body.stream:
            await wait(delay, answer, start)
            return JSONResponse(message, headers=headers)
        # the last block's stop, message_delta, message_stop
        return StreamingResponse(paced(_anthropic_stream(message), delay, answer, start, trailing=3),
                                 media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"})

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "effort_default": effort_default}

    app.include_router(router, prefix="/v1")
    app.include_router(router)
    return app


def _model_card(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "carc"}


async def _stream(answer: Answer, completion_id: str, created: int, model: str,
                  include_usage: bool) -> AsyncIterator[str]:
    """chat.completion.chunk events: role, content in a few pieces, stop, usage, [DONE]."""
    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        chunk = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                 "model": model, "system_fingerprint": None, "choices": choices, **extra}
        if include_usage and "usage" not in extra:
            chunk["usage"] = None
        return f"data: {json.dumps(chunk)}\n\n"

    def choice(delta: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

    if answer.calls:
        yield event(choice({"role": "assistant", "content": None}))
        for index, call in enumerate(answer.calls):
            yield event(choice({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                                "function": {"name": call.name, "arguments": ""}}]}))
            for piece in _pieces(json.dumps(call.arguments), STREAM_PIECES):
                yield event(choice({"tool_calls": [{"index": index,
                                                    "function": {"arguments": piece}}]}))
    else:
        yield event(choice({"role": "assistant", "content": ""}))
        for piece in _pieces(answer.text, STREAM_PIECES):
            yield event(choice({"content": piece}))
    yield event(choice({}, answer.finish_reason), carc=answer.carc())
    if include_usage:
        yield event([], usage=answer.usage())
    yield "data: [DONE]\n\n"


def _budget_effort(thinking: ThinkingConfig | None) -> str | None:
    """A thinking budget as the nearest effort (docs/providers.md: low 2048, medium 8192, high 16384)."""
    if thinking is None or thinking.type != "enabled" or thinking.budget_tokens is None:
        return None
    return "low" if thinking.budget_tokens <= 2048 else "medium" if thinking.budget_tokens <= 8192 else "high"


def anthropic_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Anthropic's system and messages as chat messages: text blocks as text, tool_use blocks as
    tool calls, tool_result blocks as tool messages."""
    system = body.get("system")
    out: list[dict[str, Any]] = [{"role": "system", "content": message_text(system)}] if system else []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message.get("role"), "content": content})
            continue
        blocks = [b for b in content or [] if isinstance(b, Mapping)]
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        calls = [{"id": b.get("id"), "type": "function", "function": {
                  "name": b.get("name"), "arguments": json.dumps(b.get("input") or {})}}
                 for b in blocks if b.get("type") == "tool_use"]
        out += [{"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": message_text(b.get("content"))}
                for b in blocks if b.get("type") == "tool_result"]
        if texts or calls:
            out.append({"role": message.get("role"), "content": "\n".join(texts) or None,
                        **({"tool_calls": calls} if calls else {})})
    return out


def _anthropic_content(answer: Answer, number: int) -> list[dict[str, Any]]:
    if answer.calls:
        return [{"type": "tool_use", "id": f"toolu_carc_{number:06d}_{i}", "name": call.name,
                 "input": call.arguments} for i, call in enumerate(answer.calls)]
    return [{"type": "text", "text": answer.text}]


async def _anthropic_stream(message: dict[str, Any]) -> AsyncIterator[str]:
    """Anthropic's message events: start (input tokens), each block, the delta with the output
    tokens, stop."""
    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    usage = message["usage"]
    yield event("message_start", message={**message, "content": [], "stop_reason": None,
                                          "usage": {**usage, "output_tokens": 1}})
    for index, block in enumerate(message["content"]):
        if block["type"] == "tool_use":
            yield event("content_block_start", index=index, content_block={**block, "input": {}})
            for piece in _pieces(json.dumps(block["input"]), STREAM_PIECES):
                yield event("content_block_delta", index=index,
                            delta={"type": "input_json_delta", "partial_json": piece})
        else:
            yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
            for piece in _pieces(block["text"], STREAM_PIECES):
                yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
        yield event("content_block_stop", index=index)
    yield event("message_delta", delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
                usage={"output_tokens": usage["output_tokens"]})
    yield event("message_stop")


def _responses_output(answer: Answer, number: int) -> list[dict[str, Any]]:
    if answer.calls:
        return [{"type": "function_call", "id": f"fc-carc-{number:06d}-{i}", "call_id": call.id,
                 "name": call.name, "arguments": json.dumps(call.arguments), "status": "completed"}
                for i, call in enumerate(answer.calls)]
    return [{"type": "message", "id": f"msg-carc-{number:06d}", "status": "completed",
             "role": "assistant",
             "content": [{"type": "output_text", "text": answer.text, "annotations": []}]}]


def responses_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """Responses-API input items as chat messages; items without text for the model are skipped."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
        return messages
    for index, item in enumerate(body.input):
        kind = item.get("type", "message")
        if kind == "message" or "role" in item:
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise RequestError(f"input.{index}.role: {role!r} is not a message role",
                                   f"input.{index}.role")
            messages.append({"role": role, "content": item.get("content")})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": item.get("output"),
                             "tool_call_id": item.get("call_id")})
    return messages


def app_from_environment() -> FastAPI:
    """App factory for uvicorn workers: the default effort comes from $CARC_SOLVER_EFFORT."""
    return create_app(os.environ.get(EFFORT_ENV, "medium"),
                      usage_log=os.environ.get(USAGE_LOG_ENV) or None,
                      seed=int(os.environ.get(SEED_ENV, "0")),
                      timing=from_env(os.environ.get(TIMING_ENV)),
                      prior=PrimitivePrior.load(Path(os.environ[PRIOR_ENV])) if os.environ.get(PRIOR_ENV) else None)


def serve(host: str = "127.0.0.1", port: int = 8000, effort_default: str = "medium",
          workers: int = 1, log_level: str = "info", usage_log: str | None = None,
          seed: int = 0, timing: Timing | None = None, prior: Path | None = None) -> None:
    """Run the server until interrupted; `workers` processes share the port (search is CPU-bound).

    Blocks; stop it with SIGINT or SIGTERM.
    """
    if effort_default not in EFFORTS:
        raise ValueError(f"effort_default {effort_default!r} is not one of {', '.join(EFFORTS)}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    os.environ[EFFORT_ENV] = effort_default  # read by app_from_environment in every worker
    os.environ[SEED_ENV] = str(seed)
    os.environ[TIMING_ENV] = to_env(timing)
    if prior is not None:
        PrimitivePrior.load(prior)  # refused here, with its path, rather than in every worker
        os.environ[PRIOR_ENV] = str(Path(prior).resolve())
    else:
        os.environ.pop(PRIOR_ENV, None)
    if usage_log:
        os.environ[USAGE_LOG_ENV] = usage_log
    # a timed server holds many waiting calls: uvicorn's default backlog (2048) and no
    # concurrency limit; the event loop sleeps, the search's threads stay for the CPU work
    uvicorn.run("solver_model.server:app_from_environment", factory=True, host=host, port=port,
                workers=workers, log_level=log_level)
