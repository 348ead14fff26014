"""The demo-cache floor: the stateless floor plus the pairs it bought for a task, shown free later.

Whatever it saves over the stateless floor is the price of not paying for the same pairs twice;
by construction it can save nothing more. The cache is one JSON file per task in `state_dir`.

In the collective regime the shared state is a cache of the same layout: the pool of every pair
any user bought, task by task; an instance shows the user's own pairs and up to `SHARED_SHOWN`
of the pool's (its first ones, so a returning task shows the same ones).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from orchestrator.arc import Demo
from orchestrator.records import write_json

from harness_adapters.base import ChatLearner


class DemoCache:
    """Pairs bought per task, in the order bought, without duplicates."""

    def __init__(self, state_dir: Path):
        self.folder = state_dir / "demos"

    def _path(self, task_id: str) -> Path:
        return self.folder / f"{task_id}.json"

    def raw(self, task_id: str) -> list[dict]:
        path = self._path(task_id)
        return json.loads(path.read_text()) if path.exists() else []

    def get(self, task_id: str) -> list[Demo]:
        return [Demo.from_json(d) for d in self.raw(task_id)]

    def add(self, task_id: str, demos: list[Demo]) -> None:
        held = self.get(task_id)
        new = [d for d in demos if d not in held]
        if not new:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self._path(task_id), [d.to_json() for d in held + new])


SHARED_SHOWN = 8  # pool pairs shown free per instance, beside the user's own


class DemoCacheFloor(ChatLearner):
    name = "demo-cache-floor"

    def cached_pairs(self, task_id: str) -> list[Demo]:
        own = DemoCache(self.state_dir).get(task_id)
        if self.shared_dir is None:
            return own
        shown: list[Demo] = []
        for raw in DemoCache(self.shared_dir).raw(task_id):  # the pool can hold thousands
            demo = Demo.from_json(raw)
            if demo not in own:
                shown.append(demo)
                if len(shown) == SHARED_SHOWN:
                    break
        return own + shown

    def end(self, solved: bool) -> None:
        DemoCache(self.state_dir).add(self.task_id, self.bought)

    @classmethod
    def merge_shared(cls, previous: Path | None, kept: Sequence[Path], out: Path) -> dict[str, int]:
        """The pool: the previous round's pairs, then each user's cached pairs in user order."""
        pools: dict[str, dict[Demo, None]] = {}  # insertion-ordered sets
        for folder in ([previous] if previous is not None else []) + list(kept):
            cache = DemoCache(folder)
            for path in sorted(cache.folder.glob("*.json")) if cache.folder.is_dir() else []:
                pools.setdefault(path.stem, {}).update(dict.fromkeys(cache.get(path.stem)))
        target = DemoCache(out)
        for task_id, pool in pools.items():
            target.add(task_id, list(pool))
        return {"tasks": len(pools), "pairs": sum(len(p) for p in pools.values())}
