"""Every user's schedule in a collective grid, and the rounds it is cut into.

All users work on the same tasks (picked with the grid's seed); user u's stream is the grid's
order built with the user's own seed (`user_seed(grid seed, u)`), and its instances are drawn
with that seed too, so no two users see the same grids (on a frames track: each user's visits
come in frames of their own, `user_source`). Round r holds stream slots
[r * S, (r + 1) * S) of every user (S = `collective.round_slots`). The held-out epilogue is one
round for the first half of the users and the next round for the second half, so the second
half meets tasks new to everyone after the collective has learnt from the first.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from orchestrator.rows import row
from orchestrator.run.grid_config import Cell, GridConfig
from orchestrator.run.schedule import ScheduledSlot, grid_sources
from orchestrator.streams import PRESETS, build_stream, epilogue
from orchestrator.tasks.base import TaskSource
from orchestrator.tasks.frames import FramedSource, UserFrames
from orchestrator.tasks.public import PublicPairsSource

_USER_TAG = 7  # keeps users' seeds apart from every other use of the grid seed


def user_seed(seed: int, user: int) -> int:
    """User `user`'s stream and instance seed: a function of (grid seed, user) only."""
    return int(np.random.SeedSequence([seed, _USER_TAG, user]).generate_state(1, dtype=np.uint32)[0])


@dataclass(frozen=True)
class UserSlot:
    round: int
    slot: ScheduledSlot


@dataclass(frozen=True)
class Rounds:
    """How a collective grid's slots fall into rounds."""

    stream: int  # rounds of the stream
    epilogue: bool  # two more rounds: the epilogue's first half of the users, then the second

    @property
    def total(self) -> int:
        return self.stream + (2 if self.epilogue else 0)

    def kind(self, number: int) -> str:
        return "stream" if number < self.stream else "epilogue"


def rounds(grid: GridConfig) -> Rounds:
    length = grid.track.tasks * grid.track.visits
    return Rounds(math.ceil(length / grid.collective_settings.round_slots), grid.track.epilogue > 0)


def first_half(grid: GridConfig, user: int) -> bool:
    """Whether `user` meets the epilogue in its first round (the first half of the users)."""
    return user < math.ceil(grid.collective_settings.users / 2)


def user_schedule(grid: GridConfig, cell: Cell, user: int) -> list[UserSlot]:
    """User `user`'s slots with their rounds: the stream, then (in its half's round) the epilogue."""
    sources = grid_sources(grid, cell.seed)  # the same tasks for every user
    seed = user_seed(cell.seed, user)
    wiped = row(cell.row).wiped_before_each
    settings = dataclasses.replace(PRESETS[cell.order], visits=grid.track.visits)
    stream = build_stream(sources.stream_tasks, settings, seed)
    size = grid.collective_settings.round_slots
    served = user_source(sources.stream, user, grid.track.visits, cell.seed)
    slots = [UserSlot(s.index // size, ScheduledSlot(s.index, "stream", s.task_id, s.visit, s.exposure,
                                                     wiped, served, seed))
             for s in stream.slots]
    if sources.epilogue_tasks:
        number = rounds(grid).stream + (0 if first_half(grid, user) else 1)
        held_out = user_source(sources.epilogue, user, 1, cell.seed)
        slots += [UserSlot(number, ScheduledSlot(s.index, "epilogue", s.task_id, 0, 0, wiped, held_out, seed))
                  for s in epilogue(sources.epilogue_tasks, seed, len(slots))]
    return slots


def user_source(source: TaskSource, user: int, visits: int, grid_seed: int) -> TaskSource:
    """What serves `user` its instances: a generated source as is (the user's seed draws its own
    instances); on a frames track each user's own frames of a task (`UserFrames`: no two users get
    the same frame), and an arc track's public epilogue in a recolouring of the user's own."""
    if isinstance(source, (FramedSource, PublicPairsSource)):
        return UserFrames.over(source, user, visits, grid_seed)
    return source
