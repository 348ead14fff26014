"""What a harness adapter declares, and the registry the cell services build harness cells from.

An adapter is mostly data (Harbor's installed-agent style): name and pinned version, the image
recipe (Dockerfile template + in-sandbox driver), the rows it supports, the patterns that
classify its failures, and two factories: the cell's state volume (which renders the harness's
config onto it after every wipe) and the learner (the conversation driver). The orchestrator
owns the protocol; the learner only turns messages into final texts.
"""

from __future__ import annotations

import enum
import importlib
import re
from dataclasses import dataclass
from typing import Callable

from harness_adapters.base import Learner
from orchestrator.prompts import PromptSet
from sandboxes.docker_sandbox import DockerSandbox
from sandboxes.environment import StateVolume
from sandboxes.images import Recipe

# learner name -> module that registers its adapter (imported on first use: Docker-free imports)
MODULES = {"hermes-agent": "harness_adapters.hermes_agent"}


class FailureKind(str, enum.Enum):
    RATE_LIMIT = "rate-limit"
    TIMEOUT = "timeout"
    CRASH = "crash"
    BAD_OUTPUT = "bad-output"
    OTHER = "other"


class HarnessError(RuntimeError):
    """A harness turn failed; `kind` says how (the runner fails the instance with this reason)."""

    def __init__(self, kind: FailureKind, message: str):
        super().__init__(f"[{kind.value}] {message}")
        self.kind = kind


COMMON_PATTERNS: tuple[tuple[str, FailureKind], ...] = (
    (r"\b429\b|rate.?limit|too many requests", FailureKind.RATE_LIMIT),
    (r"timed? ?out|timeout|deadline exceeded", FailureKind.TIMEOUT),
    (r"Traceback \(most recent call last\)|Segmentation fault|exit code -?\d+|Killed", FailureKind.CRASH),
    (r"JSONDecodeError|invalid json|unexpected token", FailureKind.BAD_OUTPUT),
)


@dataclass(frozen=True)
class HarnessCell:
    """Everything an adapter's factories get about the cell they build for."""

    sandbox: DockerSandbox
    prompts: PromptSet
    model: str
    effort: str | None
    row: str


@dataclass(frozen=True)
class HarnessAdapter:
    name: str
    version: str
    recipe: Recipe
    rows: tuple[str, ...]
    make_state: Callable[[HarnessCell], StateVolume]
    make_learner: Callable[[HarnessCell], Learner]
    error_patterns: tuple[tuple[str, FailureKind], ...] = ()

    def classify(self, text: str) -> FailureKind:
        """The first pattern (the adapter's own, then the common ones) that matches `text`."""
        for pattern, kind in (*self.error_patterns, *COMMON_PATTERNS):
            if re.search(pattern, text, re.IGNORECASE):
                return kind
        return FailureKind.OTHER


ADAPTERS: dict[str, HarnessAdapter] = {}


def register(adapter: HarnessAdapter) -> HarnessAdapter:
    ADAPTERS[adapter.name] = adapter
    return adapter


def adapter_for(name: str) -> HarnessAdapter:
    if name not in ADAPTERS:
        if name not in MODULES:
            raise KeyError(f"no harness adapter {name!r}; known: {', '.join(sorted(MODULES))}")
        importlib.import_module(MODULES[name])
    return ADAPTERS[name]
