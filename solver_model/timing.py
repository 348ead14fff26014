"""Real-model timing for the embedded model: how long a hosted model would take to answer.

With timing on, every reply waits a time to first token (TTFT) and then streams its completion
tokens at a decode rate (tokens per second), both drawn per call from lognormal distributions and
seeded by (the model seed, the request): the same conversation at the same seed always gets the
same delays, so a timed run is as reproducible as an untimed one. The wait is an `asyncio.sleep`
on the server's event loop, never a thread: one server holds any number of waiting calls.

The distributions and the public figures they come from are in solver_model/CALIBRATION.md
("Real-model timing"). A lognormal is given by its median and sigma (the standard deviation of
the log): the 5th and 95th percentiles are median * exp(-/+ 1.645 sigma).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

TIMING_ENV = "CARC_SOLVER_TIMING"


class Lognormal(BaseModel):
    """A positive quantity drawn as median * exp(sigma * N(0, 1))."""

    model_config = ConfigDict(extra="forbid")

    median: float = Field(gt=0, description="the distribution's median")
    sigma: float = Field(0.0, ge=0, le=3, description="the standard deviation of its log (0: always the median)")

    def draw(self, rng: np.random.Generator) -> float:
        return float(self.median * math.exp(self.sigma * rng.standard_normal()))


class Timing(BaseModel):
    """Per call: a TTFT in seconds and a decode rate in tokens per second, each a lognormal."""

    model_config = ConfigDict(extra="forbid")

    ttft_s: Lognormal = Field(description="seconds until the first token")
    tokens_per_s: Lognormal = Field(description="completion tokens per second after the first")

    def draw(self, seed: int, key: str) -> "Delay":
        """The delays of one call: seeded by the model seed and the request's key."""
        digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:16], "big"))
        return Delay(ttft_s=self.ttft_s.draw(rng), tokens_per_s=self.tokens_per_s.draw(rng))


# Named profiles (solver_model/CALIBRATION.md gives the figures behind each).
PROFILES: dict[str, Timing] = {
    # a frontier model behind a hosted API: TTFT median 1 s (p5 0.44 s, p95 2.3 s), decode
    # median 60 tok/s (p5 37, p95 98)
    "hosted": Timing(ttft_s=Lognormal(median=1.0, sigma=0.5), tokens_per_s=Lognormal(median=60, sigma=0.3)),
    # a small fast model (mini/flash class): TTFT median 0.4 s, decode median 150 tok/s
    "hosted-fast": Timing(ttft_s=Lognormal(median=0.4, sigma=0.4), tokens_per_s=Lognormal(median=150, sigma=0.3)),
}


def resolve(value: str | dict[str, Any] | Timing | None) -> Timing | None:
    """A profile name, a {ttft_s, tokens_per_s} mapping or a Timing as a Timing (None: no timing).
    Raises ValueError naming the profiles for an unknown name."""
    if value is None or isinstance(value, Timing):
        return value
    if isinstance(value, str):
        if value not in PROFILES:
            raise ValueError(f"no timing profile {value!r}; profiles: {', '.join(PROFILES)}, or give "
                             "{ttft_s: {median, sigma}, tokens_per_s: {median, sigma}}")
        return PROFILES[value]
    return Timing.model_validate(value)


def to_env(timing: Timing | None) -> str:
    return "" if timing is None else timing.model_dump_json()


def from_env(text: str | None) -> Timing | None:
    return Timing.model_validate_json(text) if text else None


def request_key(route: str, body: Any) -> str:
    """What seeds a call's delays: the route and the request body, canonically serialised."""
    return route + "\x00" + json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Delay:
    """One call's drawn timing."""

    ttft_s: float
    tokens_per_s: float

    def decode_s(self, tokens: int) -> float:
        """Seconds to stream `tokens` completion tokens after the first."""
        return max(0, tokens - 1) / self.tokens_per_s

    def total_s(self, tokens: int) -> float:
        return self.ttft_s + self.decode_s(tokens)

    def record(self, tokens: int) -> dict[str, float]:
        return {"ttft_s": round(self.ttft_s, 4), "tokens_per_s": round(self.tokens_per_s, 3),
                "delay_s": round(self.total_s(tokens), 4)}
