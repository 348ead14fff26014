"""ARC-AGI-3 as a track: a game is a task, a level is an instance (the seed's rules).

The pure part: what a learner sees and sends, and how a level is charged. Every action the
learner takes, RESET included, costs one; a level of human baseline b is charged its actions with
a cap of 5b: budget share = min(actions, 5b) / 5b, and a level not completed within 5b actions is
failed and charged in full. Putting the learner on the level at the instance's start is the
environment's doing and costs nothing. A malformed action costs nothing and is answered with a
message, as on the grid tracks.

The engine (the official `arc-agi`/`arcengine` packages, Python >= 3.12) runs in its own
container; `Arc3Env` is what the orchestrator needs of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

ACTIONS = ("RESET", "ACTION1", "ACTION2", "ACTION3", "ACTION4", "ACTION5", "ACTION6", "ACTION7")
COMPLEX = "ACTION6"  # the one action with coordinates: x, y in 0..63
SIDE = 64
CAP_FACTOR = 5


@dataclass(frozen=True)
class GameInfo:
    game_id: str  # as the engine names it (e.g. "ls20-cb3b57cc")
    title: str
    baselines: tuple[int, ...]  # human baseline actions per level (metadata.json baseline_actions)

    @property
    def levels(self) -> int:
        return len(self.baselines)


@dataclass(frozen=True)
class Observation:
    """What the engine returned after an action (or the level's start): the frames it produced
    (each 64x64, values 0-15; an action may animate over several), the game state
    (NOT_PLAYED, NOT_FINISHED, WIN, GAME_OVER), levels completed of win_levels, and the action
    numbers available now (0 = RESET, 1-7 = ACTION1-7)."""

    game_id: str
    frames: tuple[tuple[tuple[int, ...], ...], ...]
    state: str
    levels_completed: int
    win_levels: int
    available_actions: tuple[int, ...]


@dataclass(frozen=True)
class Arc3Action:
    name: str  # one of ACTIONS
    x: int | None = None  # ACTION6 only
    y: int | None = None

    def __post_init__(self) -> None:
        if self.name not in ACTIONS:
            raise ValueError(f"unknown action {self.name!r}; known: {', '.join(ACTIONS)}")
        if (self.name == COMPLEX) != (self.x is not None and self.y is not None):
            raise ValueError(f"{COMPLEX} needs x and y (0..{SIDE - 1}); the other actions take none")
        for v in (self.x, self.y):
            if v is not None and not 0 <= v < SIDE:
                raise ValueError(f"x and y are 0..{SIDE - 1}, got {v}")


@runtime_checkable
class Arc3Env(Protocol):
    """One game session at a time, driven by the orchestrator."""

    def games(self) -> dict[str, GameInfo]: ...

    def start(self, game_id: str, level: int) -> Observation:
        """Put the game on `level` (0-based), fresh: the instance's start, not charged."""
        ...

    def act(self, action: Arc3Action) -> Observation:
        """One learner action on the current level. RESET restarts the current level."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class LevelCharge:
    actions: int
    baseline: int
    cap: int
    cost: int  # min(actions, cap), or cap when failed
    share: float  # cost / cap: the budget share, the one scale of every track
    completed: bool


def charge_level(actions: int, baseline: int, completed: bool) -> LevelCharge:
    """The charge of a level of human baseline `baseline` that took `actions` actions. A level
    not completed is charged the full cap, however few actions it took."""
    if baseline < 1:
        raise ValueError(f"a level's human baseline must be at least 1 action, got {baseline}")
    if actions < 0:
        raise ValueError(f"actions must be 0 or more, got {actions}")
    cap = CAP_FACTOR * baseline
    completed = completed and actions <= cap
    cost = min(actions, cap) if completed else cap
    return LevelCharge(actions, baseline, cap, cost, cost / cap, completed)
