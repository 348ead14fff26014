"""Serves the project's own generated tasks as instances: 1 test pair plus 8 demos, each self-checked.

Every pair k of a visit draws from its own generator, seeded by (seed, "own", task id, visit, k,
attempt); a pair that fails a check is drawn again with the next attempt, so an instance is the
same bytes in every run and every call order.
"""

from __future__ import annotations

import random

from orchestrator.arc import Demo, Grid, GridError, as_grid
from orchestrator.errors import CarcError
from orchestrator.tasks.base import MAX_DEMOS, ArcInstance, derive_seed
from orchestrator.tasks.own import OWN_TASKS, SPLITS, OwnTask, Redraw

MAX_ATTEMPTS = 50


class OwnTaskError(CarcError, RuntimeError):
    """An own task's generator kept producing pairs that fail their checks: a bug in that generator."""


class OwnSource:
    """The own generators behind the `TaskSource` interface, optionally one split only."""

    name = "own"

    def __init__(self, split: str | None = None) -> None:
        if split is not None and split not in SPLITS:
            raise ValueError(f"unknown own split {split!r}; use one of {', '.join(SPLITS)} or None for all tasks")
        self.split = split
        self._tasks = {tid: t for tid, t in OWN_TASKS.items() if split is None or t.split == split}

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def task(self, task_id: str) -> OwnTask:
        try:
            return self._tasks[task_id]
        except KeyError:
            where = "" if self.split is None else f" in split {self.split!r}"
            raise KeyError(
                f"unknown own task id {task_id!r}{where}; "
                "list the valid ids with OwnSource(split).task_ids() or orchestrator.tasks.own.OWN_TASKS"
            ) from None

    def instance(self, task_id: str, visit: int, seed: int) -> ArcInstance:
        task = self.task(task_id)
        pairs: list[Demo] = []
        for k in range(MAX_DEMOS + 1):
            pairs.append(self._pair(task, visit, seed, k, [p.input for p in pairs]))
        test, demos = pairs[0], tuple(pairs[1:])
        return ArcInstance(task_id, visit, test.input, test.output, demos)

    def _pair(self, task: OwnTask, visit: int, seed: int, k: int, taken: list[Grid]) -> Demo:
        problem = "no attempt made"
        for attempt in range(MAX_ATTEMPTS):
            rng = random.Random(derive_seed(seed, "own", task.task_id, visit, k, attempt))
            try:
                pair = task.generate(rng)
            except Redraw:
                problem = "the generator could not complete its draw"
                continue
            problem = _problem(task, pair, taken)
            if problem is None:
                return pair
        module = getattr(task.generate, "__module__", "orchestrator.tasks.own")
        raise OwnTaskError(
            f"own task {task.task_id!r} gave no valid pair {k} for visit {visit}, seed {seed} in {MAX_ATTEMPTS} "
            f"attempts; last problem: {problem}. Fix its generator or rule in {module.replace('.', '/')}.py"
        )


def _problem(task: OwnTask, pair: Demo, taken: list[Grid]) -> str | None:
    """What is wrong with a generated pair, or None if it passes every check."""
    for side in ("input", "output"):
        try:
            as_grid(getattr(pair, side))
        except GridError as error:
            return f"{side} is not a valid grid: {error}"
    if pair.input == pair.output:
        return "input equals output"
    if pair.input in taken:
        return "input repeats an earlier pair of this instance"
    expected = task.verify(pair.input)
    if expected != pair.output:
        return "output differs from the reference rule's output"
    return None
