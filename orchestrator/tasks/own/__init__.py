"""The project's own ARC-style task generators: rules written here, instances drawn fresh per visit.

`OWN_TASKS` maps every task id to its `OwnTask`, grouped by kind in a fixed order; `OwnSource`
(in `orchestrator.tasks.own_source`) serves them as instances.
"""

from __future__ import annotations

from orchestrator.tasks.own import (
    colour,
    counting,
    denoising,
    filling,
    geometry,
    gravity,
    logic,
    objects,
    pattern,
    symmetry,
    tiling,
)
from orchestrator.tasks.own.registry import SPLITS, OwnTask, Redraw

_MODULES = (geometry, colour, objects, counting, filling, gravity, tiling, symmetry, denoising, pattern, logic)


def _collect() -> dict[str, OwnTask]:
    tasks: dict[str, OwnTask] = {}
    for module in _MODULES:
        for task in module.TASKS:
            if task.task_id in tasks:
                raise ValueError(f"own task id {task.task_id!r} is defined twice (again in {module.__name__})")
            tasks[task.task_id] = task
    return tasks


OWN_TASKS: dict[str, OwnTask] = _collect()

__all__ = ["OWN_TASKS", "SPLITS", "OwnTask", "Redraw"]
