"""The ladder's model client: one class over three model APIs, configured by base URL, key
variable, model, API, effort and prices.

The ladder learners talk to their model only through this, over HTTP, so the embedded solver
model and any real endpoint are interchangeable. Each API is spoken with its provider's official
SDK (`openai` for chat completions and Responses, `anthropic` for messages); retries, backoff and
the instance's deadline are this module's, the same for every API. Compute is measured per call
(tokens, seconds, dollars from the price table) for the records; it is never part of the score.

`EFFORT_FIELDS` is the one table of how a carc effort reaches each API's wire (docs/providers.md).
"""

from __future__ import annotations

import email.utils
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal, get_args

import structlog
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import CarcError, ConfigError
from proxy.host import PLACEHOLDER_KEY
from proxy.journal import TAG_HEADER

log = structlog.get_logger("carc.model")

Api = Literal["openai-chat", "openai-responses", "anthropic-messages"]
APIS: tuple[str, ...] = get_args(Api)
EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max")

# Anthropic has no effort on budget thinking: each effort is a thinking budget (tokens). The four
# common ones are pi-ai's defaults (prime-agent's and openclaw's model layer), the two above them
# double on. The budget must be at least 1024 and below max_tokens.
ANTHROPIC_THINKING_BUDGET = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384,
                             "xhigh": 32768, "max": 65536}
ANTHROPIC_ANSWER_TOKENS = 8192  # max_tokens = budget + this when the grid gives no max_tokens

# carc effort -> the request fields that carry it, per API (documented in docs/providers.md).
EFFORT_FIELDS: dict[str, dict[str, dict[str, Any]]] = {
    "openai-chat": {e: {"reasoning_effort": e} for e in EFFORTS},
    "openai-responses": {e: {"reasoning": {"effort": e}} for e in EFFORTS},
    "anthropic-messages": {e: {"thinking": {"type": "enabled", "budget_tokens": b}}
                           for e, b in ANTHROPIC_THINKING_BUDGET.items()},
}

RETRY_STATUSES = frozenset({408, 409, 429})  # and every 5xx: what OpenAI's own clients retry
BACKOFF_S = 0.5        # first wait without a Retry-After; doubled per attempt
BACKOFF_CAP_S = 8.0
RETRY_AFTER_CAP_S = 60.0  # a longer Retry-After is waited this long (then the attempt says again)
# Multiplies every wait before a retry (default 1). The test suite sets 0: which retries happen
# and what each costs is what tests check, never how long the backoff was.
RETRY_WAIT_SCALE_ENV = "CARC_RETRY_WAIT_SCALE"
# The SDKs are imported by the ChatModel that uses one (a worker process of a harness cell, which
# never calls the model itself, saves their ~70 MB and their import time); an SDK's exception
# can only come from a loaded SDK.
SDKS = ("openai", "anthropic")


def _sdk_classes(name: str) -> tuple[type, ...]:
    """`name` (APIError, APIConnectionError) of every SDK loaded in this process."""
    return tuple(getattr(sys.modules[sdk], name) for sdk in SDKS if sdk in sys.modules)


def effort_fields(api: str, effort: str | None) -> dict[str, Any]:
    """The request fields that carry `effort` on `api` (none without an effort)."""
    return dict(EFFORT_FIELDS[api][effort]) if effort else {}


def anthropic_max_tokens(effort: str | None, max_tokens: int | None) -> int:
    """Anthropic's required max_tokens: the grid's, else room for the thinking budget and an answer."""
    if max_tokens:
        return max_tokens
    return ANTHROPIC_THINKING_BUDGET.get(effort or "", 0) + ANTHROPIC_ANSWER_TOKENS


class ModelEndpoint(BaseModel):
    """Where a learner's model lives and what it costs. `api_key_env` names a variable, never a key."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    model: str
    api: Api = "openai-chat"
    api_key_env: str = "OPENAI_API_KEY"
    effort: str | None = None
    input_usd_per_mtok: float = Field(0.0, ge=0)
    output_usd_per_mtok: float = Field(0.0, ge=0)
    timeout_s: float = Field(600.0, gt=0)
    max_retries: int = Field(4, ge=0)
    max_tokens: int | None = None


@dataclass(frozen=True)
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    usd: float = 0.0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.calls + other.calls, self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens,
                     self.seconds + other.seconds, self.usd + other.usd)


@dataclass(frozen=True)
class ChatReply:
    text: str
    usage: Usage


class ModelUnavailable(CarcError, RuntimeError):
    """The endpoint failed after all retries; the runner fails the instance with this reason."""


def _wire_safe(value: Any) -> Any:
    """The conversation as UTF-8 can carry it: a lone surrogate a reply ended with (cut
    mid-emoji) is sent back as U+FFFD. Only the copy on the wire changes; the records keep the
    reply exactly as received."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_wire_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire_safe(v) for k, v in value.items()}
    return value


class ChatModel:
    """One conversation turn at a time, over the endpoint's API (`ModelEndpoint.api`)."""

    def __init__(self, endpoint: ModelEndpoint):
        self.endpoint = endpoint
        # Behind the journaling proxy the key variable is empty: the proxy holds the real key.
        key = (os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None) or PLACEHOLDER_KEY
        # Retries are this class's (`complete`): the SDK's own would give every attempt the
        # whole timeout again, so one call could outlast the instance's wall clock many times.
        if endpoint.api == "anthropic-messages":
            import anthropic
            self.client: Any = anthropic.Anthropic(base_url=endpoint.base_url, api_key=key,
                                                   timeout=endpoint.timeout_s, max_retries=0)
        else:
            import openai
            self.client = openai.OpenAI(base_url=endpoint.base_url, api_key=key,
                                        timeout=endpoint.timeout_s, max_retries=0)
        self._wire = _WIRES[endpoint.api]
        self._untagged = self.client

    def set_tag(self, tag: str | None) -> None:
        """Send `tag` with every call from now on (proxy.journal.TAG_HEADER: the collective
        regime's user, slot and phase, read and removed by its row's proxy); None: no tag."""
        self.client = (self._untagged if tag is None
                       else self._untagged.with_options(default_headers={TAG_HEADER: tag}))

    def complete(self, messages: list[dict[str, Any]], deadline: float | None = None) -> ChatReply:
        """One model turn on the conversation `messages` (chat-style roles system, user,
        assistant, whatever the API). A 408/409/429/5xx answer or a lost connection is retried up
        to `max_retries` times, after the wait the server asked for (Retry-After, retry-after-ms)
        or else an exponential backoff; every attempt passes the proxy, so each is journaled.
        Past `deadline` (time.monotonic(): the instance's wall clock) nothing more is attempted
        or waited for, and an attempt is cut there, never later than the endpoint's timeout."""
        where = f"{self.endpoint.base_url} ({self.endpoint.model}, {self.endpoint.api})"
        start = time.perf_counter()
        failures: list[str] = []
        while True:
            timeout = self.endpoint.timeout_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ModelUnavailable(f"{where}: the instance's wall clock ran out after "
                                           f"{len(failures)} failed attempt(s): {'; '.join(failures)[-500:]}")
                timeout = min(timeout, max(left, 0.5))
            try:
                response = self._wire.create(self.client, self.endpoint, _wire_safe(messages), timeout)
                break
            except _sdk_classes("APIError") as exc:
                if not _retryable(exc) or len(failures) >= self.endpoint.max_retries:
                    raise ModelUnavailable(f"{where}: {exc}"
                                           + (f" (after {len(failures)} retries: {'; '.join(failures)[-300:]})"
                                              if failures else "")) from exc
                failures.append(_describe(exc))
                wait = retry_wait(exc, len(failures)) * retry_wait_scale()
                if deadline is not None and time.monotonic() + wait >= deadline:
                    raise ModelUnavailable(f"{where}: {failures[-1]}; the retry in {wait:.1f} s would "
                                           f"pass the instance's wall clock") from exc
                log.info("model_retry", endpoint=where, attempt=len(failures), wait_s=round(wait, 2),
                         error=failures[-1])
                time.sleep(wait)
        seconds = time.perf_counter() - start
        if not isinstance(response, self._wire.reply_type()):  # a 200 whose body is not JSON (a wrong base URL)
            raise ModelUnavailable(f"{where}: the reply is not a {self._wire.reply_name}: "
                                   f"{str(response)[:200]!r}; check model.endpoint and model.api")
        text, prompt, completion = self._wire.read(response)
        usd = (prompt * self.endpoint.input_usd_per_mtok
               + completion * self.endpoint.output_usd_per_mtok) / 1e6
        return ChatReply(text, Usage(1, prompt, completion, seconds, usd))


def _system_and_turns(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The system messages joined, and the other turns with consecutive same-role turns merged
    (the APIs without a system role take it as a separate field)."""
    system = "\n\n".join(str(m["content"]) for m in messages if m["role"] in ("system", "developer"))
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] in ("system", "developer"):
            continue
        if turns and turns[-1]["role"] == message["role"]:
            turns[-1] = {"role": message["role"], "content": f"{turns[-1]['content']}\n\n{message['content']}"}
        else:
            turns.append({"role": message["role"], "content": message["content"]})
    return system, turns


def _count(usage: Any, name: str) -> int:
    return getattr(usage, name, None) or 0


class _ChatWire:
    """OpenAI chat completions (also OpenRouter, vLLM, Ollama, llama.cpp and other compatible servers)."""

    reply_name = "chat completion"

    @staticmethod
    def reply_type() -> type:
        from openai.types.chat import ChatCompletion
        return ChatCompletion

    @staticmethod
    def create(client: openai.OpenAI, endpoint: ModelEndpoint, messages: list[dict[str, Any]],
               timeout: float) -> Any:
        from openai.types.chat import ChatCompletion

        extra = effort_fields("openai-chat", endpoint.effort)
        if endpoint.max_tokens:
            extra["max_tokens"] = endpoint.max_tokens
        # The SDK's own request path with the body as given: `chat.completions.create` first
        # walks every message through its TypedDict transform, which does nothing to plain
        # role/content messages and cost ~3 ms a call on a 20-turn conversation of grids.
        return client.post("/chat/completions", cast_to=ChatCompletion, options={"timeout": timeout},
                           body={"model": endpoint.model, "messages": messages, **extra})

    @staticmethod
    def read(response: ChatCompletion) -> tuple[str, int, int]:
        # Compatible servers omit what OpenAI always sends: no choices, no message, no usage counts.
        choice = response.choices[0] if response.choices else None
        message = getattr(choice, "message", None)
        return (getattr(message, "content", None) or "", _count(response.usage, "prompt_tokens"),
                _count(response.usage, "completion_tokens"))


class _ResponsesWire:
    """OpenAI Responses: system text as `instructions`, nothing stored server-side."""

    reply_name = "Responses API response"

    @staticmethod
    def reply_type() -> type:
        from openai.types.responses import Response
        return Response

    @staticmethod
    def create(client: openai.OpenAI, endpoint: ModelEndpoint, messages: list[dict[str, Any]],
               timeout: float) -> Any:
        system, turns = _system_and_turns(messages)
        extra = effort_fields("openai-responses", endpoint.effort)
        if endpoint.max_tokens:
            extra["max_output_tokens"] = endpoint.max_tokens
        if system:
            extra["instructions"] = system
        return client.responses.create(model=endpoint.model, input=turns, store=False,
                                       timeout=timeout, **extra)

    @staticmethod
    def read(response: Response) -> tuple[str, int, int]:
        return (response.output_text, _count(response.usage, "input_tokens"),
                _count(response.usage, "output_tokens"))


class _AnthropicWire:
    """Anthropic messages: system text as `system`, max_tokens always sent (the API requires it)."""

    reply_name = "Anthropic message"

    @staticmethod
    def reply_type() -> type:
        from anthropic.types import Message
        return Message

    @staticmethod
    def create(client: anthropic.Anthropic, endpoint: ModelEndpoint, messages: list[dict[str, Any]],
               timeout: float) -> Any:
        system, turns = _system_and_turns(messages)
        extra = effort_fields("anthropic-messages", endpoint.effort)
        if system:
            extra["system"] = system
        return client.messages.create(model=endpoint.model, messages=turns, timeout=timeout,
                                      max_tokens=anthropic_max_tokens(endpoint.effort, endpoint.max_tokens),
                                      **extra)

    @staticmethod
    def read(response: Message) -> tuple[str, int, int]:
        text = "".join(block.text for block in response.content or [] if block.type == "text")
        usage = response.usage
        # Anthropic counts cache writes and reads apart from input_tokens; all are prompt tokens.
        prompt = sum(_count(usage, k) for k in
                     ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
        return text, prompt, _count(usage, "output_tokens")


_WIRES: dict[str, Any] = {"openai-chat": _ChatWire, "openai-responses": _ResponsesWire,
                          "anthropic-messages": _AnthropicWire}


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, _sdk_classes("APIConnectionError")):  # refused, reset, timed out
        return True
    status = getattr(exc, "status_code", None)
    return status is not None and (status in RETRY_STATUSES or status >= 500)


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    return f"HTTP {status}" if status is not None else type(exc).__name__


def retry_wait_scale() -> float:
    """The factor on every retry's wait, from CARC_RETRY_WAIT_SCALE (1 when unset)."""
    value = os.environ.get(RETRY_WAIT_SCALE_ENV, "").strip()
    if not value:
        return 1.0
    try:
        scale = float(value)
    except ValueError:
        scale = -1.0
    if not scale >= 0:
        raise ConfigError(f"{RETRY_WAIT_SCALE_ENV}={value!r} is not a factor >= 0; unset it, or set "
                         f"e.g. 1 (the waits as computed) or 0 (retry at once)")
    return scale


def retry_wait(exc: Exception, attempt: int) -> float:
    """Seconds to wait before attempt `attempt + 1`: the server's Retry-After (seconds or an HTTP
    date) or retry-after-ms, capped at RETRY_AFTER_CAP_S; else BACKOFF_S doubled per attempt,
    capped, with up to 25% jitter so that cells do not retry in step."""
    response = getattr(exc, "response", None)
    headers = response.headers if response is not None else {}
    asked = None
    if headers.get("retry-after-ms"):
        try:
            asked = float(headers["retry-after-ms"]) / 1000
        except ValueError:
            pass
    if asked is None and headers.get("retry-after"):
        value = headers["retry-after"].strip()
        try:
            asked = float(value)
        except ValueError:
            when = email.utils.parsedate_tz(value)
            if when is not None:
                asked = email.utils.mktime_tz(when) - time.time()
    if asked is not None and asked >= 0:
        return min(asked, RETRY_AFTER_CAP_S)
    backoff = min(BACKOFF_S * 2 ** (attempt - 1), BACKOFF_CAP_S)
    return backoff * (1 - 0.25 * random.random())
