"""What counts as naming a task: its id, or a grid (JSON text) of one of its instances."""

from __future__ import annotations

import re
from dataclasses import dataclass

from stores_inspector.cell import GRID, MIN_GRID_CHARS, InspectedCell, compact_grid


@dataclass
class TaskMaterial:
    tasks: list[str]  # longest first, so "t-10" is found before "t-1"
    grid_task: dict[str, str]  # compact grid -> the one task it belongs to

    @classmethod
    def of(cls, records: InspectedCell) -> "TaskMaterial":
        tasks = sorted({i.task for i in records.instances.values()}, key=len, reverse=True)
        owners: dict[str, set[str]] = {}
        for task, grids in records.task_grids().items():
            for grid in grids:
                owners.setdefault(grid, set()).add(task)
        # a grid shared by two tasks names neither
        return cls(tasks, {g: next(iter(t)) for g, t in owners.items() if len(t) == 1})

    def named(self, text: str | None, by_grid: bool = True) -> dict[str, str]:
        """task -> how it is named ("id" or "grid") in the text."""
        if not text:
            return {}
        found: dict[str, str] = {}
        remaining = text
        for task in self.tasks:
            if task in remaining:
                found[task] = "id"
                remaining = remaining.replace(task, " ")
        if by_grid and self.grid_task:
            for match in GRID.findall(text):
                grid = compact_grid(match)
                task = self.grid_task.get(grid) if len(grid) >= MIN_GRID_CHARS else None
                if task and task not in found:
                    found[task] = "grid"
        return found

    def excerpt(self, text: str, task: str, width: int = 60) -> str:
        """A one-line excerpt around the first mention of the task id (or the text's start)."""
        at = text.find(task)
        start = max(0, at - width) if at >= 0 else 0
        excerpt = re.sub(r"([^\w\s])\1{3,}", r"\1\1\1", text[start:start + 2 * width + len(task)])  # rulers
        return re.sub(r"\s+", " ", excerpt).strip()
