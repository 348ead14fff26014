"""A cell's schedule: the stream slots, then the held-out epilogue, then the fresh reference.

The epilogue follows the stream with nothing reset; the fresh reference serves the same epilogue
instances again, the learner's state wiped before each. A wiped row wipes before every slot.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from orchestrator.rows import row
from orchestrator.run.grid_config import Cell, GridConfig, TrackConfig
from orchestrator.streams import PRESETS, build_stream, epilogue
from orchestrator.tasks.base import ArcInstance, TaskSource
from orchestrator.tasks.catalog import TrackSources, track_sources


@dataclass(frozen=True)
class ScheduledSlot:
    index: int
    phase: str  # stream | epilogue | fresh
    task_id: str
    visit: int
    exposure: int
    wipe_before: bool
    source: TaskSource
    seed: int

    def instance(self) -> ArcInstance:
        return self.source.instance(self.task_id, self.visit, self.seed)


def grid_sources(grid: GridConfig, seed: int) -> TrackSources:
    """The grid's task sources for `seed`, built once per track and seed: every cell (and every
    collective user) of one seed serves the same tasks."""
    return _track_sources(grid.track.model_dump_json(), seed)


@lru_cache(maxsize=8)
def _track_sources(track_json: str, seed: int) -> TrackSources:
    return track_sources(TrackConfig.model_validate_json(track_json), seed)


def build_schedule(grid: GridConfig, cell: Cell) -> list[ScheduledSlot]:
    sources = grid_sources(grid, cell.seed)
    wiped = row(cell.row).wiped_before_each
    settings = dataclasses.replace(PRESETS[cell.order], visits=grid.track.visits)
    stream = build_stream(sources.stream_tasks, settings, cell.seed)
    slots = [ScheduledSlot(s.index, "stream", s.task_id, s.visit, s.exposure, wiped,
                           sources.stream, cell.seed) for s in stream.slots]
    if sources.epilogue_tasks:
        tail = epilogue(sources.epilogue_tasks, cell.seed, len(slots))
        slots += [ScheduledSlot(s.index, "epilogue", s.task_id, 0, 0, wiped, sources.epilogue,
                                cell.seed) for s in tail]
        if grid.track.fresh_reference:
            start = len(slots)
            slots += [ScheduledSlot(start + i, "fresh", s.task_id, 0, 0, True, sources.epilogue,
                                    cell.seed) for i, s in enumerate(tail)]
    return slots
