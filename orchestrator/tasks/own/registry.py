"""The record every own task is, and the signal a generator gives when its random draw will not fit."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from orchestrator.arc import Demo, Grid

SPLITS = ("stream", "heldout")


class Redraw(Exception):
    """A generator's draw cannot be completed (no room for an object, a tie it must avoid).

    The source catches it and draws again with the next attempt's generator; it is not an error.
    """


@dataclass(frozen=True)
class OwnTask:
    """One ARC-style rule written for this project.

    `generate` draws a fresh (input, output) pair from the generator it is given and nothing else;
    `verify` is the reference rule, written apart from `generate` so the two check each other.
    Task-level parameters (which colour maps to which) are constants of the rule, never drawn.
    """

    task_id: str
    kind: str
    description: str
    split: str
    generate: Callable[[random.Random], Demo]
    verify: Callable[[Grid], Grid]

    def __post_init__(self) -> None:
        if not self.task_id.startswith("own-"):
            raise ValueError(f"own task id {self.task_id!r} must start with 'own-'")
        if self.split not in SPLITS:
            raise ValueError(f"own task {self.task_id!r} has split {self.split!r}; use one of {SPLITS}")
