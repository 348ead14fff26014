"""An OpenAI-compatible chat client configured by base URL, key variable, model, effort and prices.

The ladder learners talk to their model only through this, over HTTP, so the embedded solver
model and any real endpoint are interchangeable. Compute is measured per call (tokens, seconds,
dollars from the price table) for the records; it is never part of the score.
"""

from __future__ import annotations

import email.utils
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import openai
import structlog
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ConfigDict, Field

from proxy.host import PLACEHOLDER_KEY

log = structlog.get_logger("carc.model")

RETRY_STATUSES = frozenset({408, 409, 429})  # and every 5xx: what OpenAI's own clients retry
BACKOFF_S = 0.5        # first wait without a Retry-After; doubled per attempt
BACKOFF_CAP_S = 8.0
RETRY_AFTER_CAP_S = 60.0  # a longer Retry-After is waited this long (then the attempt says again)


class ModelEndpoint(BaseModel):
    """Where a learner's model lives and what it costs. `api_key_env` names a variable, never a key."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    model: str
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


class ModelUnavailable(RuntimeError):
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
    def __init__(self, endpoint: ModelEndpoint):
        self.endpoint = endpoint
        # Behind the journaling proxy the key variable is empty: the proxy holds the real key.
        key = (os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None) or PLACEHOLDER_KEY
        # Retries are this class's (`complete`): the SDK's own would give every attempt the
        # whole timeout again, so one call could outlast the instance's wall clock many times.
        self.client = openai.OpenAI(base_url=endpoint.base_url, api_key=key,
                                    timeout=endpoint.timeout_s, max_retries=0)

    def complete(self, messages: list[dict[str, Any]], deadline: float | None = None) -> ChatReply:
        """One chat completion. A 408/409/429/5xx answer or a lost connection is retried up to
        `max_retries` times, after the wait the server asked for (Retry-After, retry-after-ms)
        or else an exponential backoff; every attempt passes the proxy, so each is journaled.
        Past `deadline` (time.monotonic(): the instance's wall clock) nothing more is attempted
        or waited for, and an attempt is cut there, never later than the endpoint's timeout."""
        extra: dict[str, Any] = {}
        if self.endpoint.effort:
            extra["reasoning_effort"] = self.endpoint.effort
        if self.endpoint.max_tokens:
            extra["max_tokens"] = self.endpoint.max_tokens
        where = f"{self.endpoint.base_url} ({self.endpoint.model})"
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
                response = self.client.chat.completions.create(
                    model=self.endpoint.model, messages=_wire_safe(messages), timeout=timeout, **extra)
                break
            except openai.APIError as exc:
                if not _retryable(exc) or len(failures) >= self.endpoint.max_retries:
                    raise ModelUnavailable(f"{where}: {exc}"
                                           + (f" (after {len(failures)} retries: {'; '.join(failures)[-300:]})"
                                              if failures else "")) from exc
                failures.append(_describe(exc))
                wait = retry_wait(exc, len(failures))
                if deadline is not None and time.monotonic() + wait >= deadline:
                    raise ModelUnavailable(f"{where}: {failures[-1]}; the retry in {wait:.1f} s would "
                                           f"pass the instance's wall clock") from exc
                log.info("model_retry", endpoint=where, attempt=len(failures), wait_s=round(wait, 2),
                         error=failures[-1])
                time.sleep(wait)
        seconds = time.perf_counter() - start
        if not isinstance(response, ChatCompletion):  # a 200 with a body that is not JSON (a wrong base URL)
            raise ModelUnavailable(f"{where}: the reply is not a "
                                   f"chat completion: {str(response)[:200]!r}; check model.endpoint")
        # Compatible servers omit what OpenAI always sends: no choices, no message, no usage counts.
        choice = response.choices[0] if response.choices else None
        message = getattr(choice, "message", None)
        text = getattr(message, "content", None) or ""
        prompt = getattr(response.usage, "prompt_tokens", None) or 0
        completion = getattr(response.usage, "completion_tokens", None) or 0
        usd = (prompt * self.endpoint.input_usd_per_mtok
               + completion * self.endpoint.output_usd_per_mtok) / 1e6
        return ChatReply(text, Usage(1, prompt, completion, seconds, usd))


def _retryable(exc: openai.APIError) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # refused, reset, timed out
        return True
    status = getattr(exc, "status_code", None)
    return status is not None and (status in RETRY_STATUSES or status >= 500)


def _describe(exc: openai.APIError) -> str:
    status = getattr(exc, "status_code", None)
    return f"HTTP {status}" if status is not None else type(exc).__name__


def retry_wait(exc: openai.APIError, attempt: int) -> float:
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
