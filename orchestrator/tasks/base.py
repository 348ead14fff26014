"""The interface every instance source implements, and the seeding that makes instances reproducible.

An instance is a pure function of (seed, task id, visit index): the same bytes in every run and in
every stream order. Sources derive all randomness from `derive_seed`, never from global state.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from orchestrator.arc import Demo, Grid

MAX_DEMOS = 8


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from any tuple of parts, stable across processes and Python hash seeds."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


@dataclass(frozen=True)
class ArcInstance:
    """One visit of one task: the test pair and the demonstrations a learner may buy, in order.

    `test_output` stays with the environment; it is never rendered into a prompt or a sandbox.
    `demos` holds at most 8 pairs; a source with fewer (public pairs) offers fewer.
    """

    task_id: str
    visit: int
    test_input: Grid
    test_output: Grid
    demos: tuple[Demo, ...]


@runtime_checkable
class TaskSource(Protocol):
    """A named supply of instances for a set of task ids."""

    name: str

    def task_ids(self) -> list[str]:
        """Every task id this source can serve, in a stable order."""
        ...

    def instance(self, task_id: str, visit: int, seed: int) -> ArcInstance:
        """The `visit`-th instance (0-based) of `task_id` under `seed`; deterministic."""
        ...
