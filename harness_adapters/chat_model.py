"""An OpenAI-compatible chat client configured by base URL, key variable, model, effort and prices.

The ladder learners talk to their model only through this, over HTTP, so the embedded solver
model and any real endpoint are interchangeable. Compute is measured per call (tokens, seconds,
dollars from the price table) for the records; it is never part of the score.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import openai
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ConfigDict, Field

from proxy.host import PLACEHOLDER_KEY



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
        self.client = openai.OpenAI(base_url=endpoint.base_url, api_key=key,
                                    timeout=endpoint.timeout_s, max_retries=endpoint.max_retries)

    def complete(self, messages: list[dict[str, Any]], deadline: float | None = None) -> ChatReply:
        """One chat completion; past `deadline` (time.monotonic(): the instance's wall clock) the
        call is cut, never later than the endpoint's own timeout."""
        extra: dict[str, Any] = {}
        if deadline is not None:
            extra["timeout"] = max(1.0, min(self.endpoint.timeout_s, deadline - time.monotonic()))
        if self.endpoint.effort:
            extra["reasoning_effort"] = self.endpoint.effort
        if self.endpoint.max_tokens:
            extra["max_tokens"] = self.endpoint.max_tokens
        start = time.perf_counter()
        try:
            response = self.client.chat.completions.create(
                model=self.endpoint.model, messages=_wire_safe(messages), **extra)
        except openai.APIError as exc:
            raise ModelUnavailable(f"{self.endpoint.base_url} ({self.endpoint.model}): {exc}") from exc
        seconds = time.perf_counter() - start
        if not isinstance(response, ChatCompletion):  # a 200 with a body that is not JSON (a wrong base URL)
            raise ModelUnavailable(f"{self.endpoint.base_url} ({self.endpoint.model}): the reply is not a "
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
