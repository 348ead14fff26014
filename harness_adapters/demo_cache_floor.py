"""The demo-cache floor: the stateless floor plus the pairs it bought for a task, shown free later.

Whatever it saves over the stateless floor is the price of not paying for the same pairs twice;
by construction it can save nothing more. The cache is one JSON file per task in `state_dir`.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.arc import Demo
from orchestrator.records import write_json

from harness_adapters.base import ChatLearner


class DemoCache:
    """Pairs bought per task, in the order bought, without duplicates."""

    def __init__(self, state_dir: Path):
        self.folder = state_dir / "demos"

    def _path(self, task_id: str) -> Path:
        return self.folder / f"{task_id}.json"

    def get(self, task_id: str) -> list[Demo]:
        path = self._path(task_id)
        if not path.exists():
            return []
        return [Demo.from_json(d) for d in json.loads(path.read_text())]

    def add(self, task_id: str, demos: list[Demo]) -> None:
        held = self.get(task_id)
        new = [d for d in demos if d not in held]
        if not new:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self._path(task_id), [d.to_json() for d in held + new])


class DemoCacheFloor(ChatLearner):
    name = "demo-cache-floor"

    def cached_pairs(self, task_id: str) -> list[Demo]:
        return DemoCache(self.state_dir).get(task_id)

    def end(self, solved: bool) -> None:
        DemoCache(self.state_dir).add(self.task_id, self.bought)
