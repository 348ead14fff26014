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

import re
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from orchestrator.arc import json_type, spell
from orchestrator.protocol import FailureKind, Malformed, MalformedReply, Status, extract_action

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


# ----- the learner's actions -----

def parse_arc3_action(value: Any) -> Arc3Action | Malformed:
    """One action from a decoded JSON object: {"action": "ACTION1"}, {"action": "RESET"} or
    {"action": "ACTION6", "x": 12, "y": 40}. Never raises; anything else is Malformed (free)."""
    if not isinstance(value, dict):
        return Malformed(f"an action must be a JSON object, got {json_type(value)}")
    if "action" not in value:
        return Malformed('the object has no "action" key')
    name = value["action"]
    if not isinstance(name, str) or name.upper() not in ACTIONS:
        return Malformed(f"unknown action {spell(name)}; known actions: {', '.join(ACTIONS)}")
    name = name.upper()
    allowed = {"action", "x", "y"} if name == COMPLEX else {"action"}
    extra = sorted(set(value) - allowed)
    if extra:
        return Malformed(f"unexpected key(s) {spell(extra)[1:-1]} for {name}; allowed: "
                         + ", ".join(f'"{k}"' for k in sorted(allowed)))
    if name != COMPLEX:
        return Arc3Action(name)
    x, y = value.get("x"), value.get("y")
    for key, v in (("x", x), ("y", y)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < SIDE:
            return Malformed(f'{COMPLEX} needs "{key}": an integer 0 to {SIDE - 1}, got {spell(v)}')
    return Arc3Action(name, x, y)


def extract_arc3_action(text: str) -> Arc3Action | Malformed:
    """The one JSON action in a reply (prose and code fences allowed), as on the grid tracks."""
    return extract_action(text, parse_arc3_action)


# ----- one level under the protocol -----

@dataclass(frozen=True)
class Acted:
    """The engine's answer to a charged action."""

    observation: Observation
    actions: int  # actions charged so far on this level
    completed: bool
    over: bool


@dataclass(frozen=True)
class Arc3Refused:
    """An action refused without charge (not available now, or the level is over)."""

    reason: str


@dataclass
class LevelProtocol:
    """The state of one level (an instance) under the protocol; pure: the runner calls the
    engine and feeds back what it returned. `start` is the observation the level began with."""

    game_id: str
    level: int
    baseline: int
    start: Observation
    max_malformed: int = 20
    actions: int = 0
    malformed: int = 0
    status: Status = Status.OPEN
    failure_reason: str | None = None
    failure_kind: FailureKind | None = None
    last: Observation | None = None

    @property
    def cap(self) -> int:
        return CAP_FACTOR * self.baseline

    @property
    def over(self) -> bool:
        return self.status is not Status.OPEN

    @property
    def charge(self) -> LevelCharge:
        return charge_level(self.actions, self.baseline, self.status is Status.SOLVED)

    @property
    def current(self) -> Observation:
        return self.last or self.start

    def check(self, action: Arc3Action | Malformed) -> Arc3Refused | MalformedReply | None:
        """Before the engine is asked: a malformed action (free, counted, capped) or one refused
        without charge; None when the action is to be played (and charged)."""
        if isinstance(action, Malformed):
            if self.over:
                return MalformedReply(action.reason, over=True)
            self.malformed += 1
            left = self.max_malformed - self.malformed
            if left <= 0:
                self._fail(f"{self.max_malformed} malformed actions", "malformed")
                return MalformedReply(action.reason, over=True, left=0)
            return MalformedReply(action.reason, over=False, left=left)
        if self.over:
            return Arc3Refused(f"the level is over ({self.status.value}); no more actions are taken")
        number = ACTIONS.index(action.name)
        available = self.current.available_actions
        if number != 0 and available and number not in available:
            names = ", ".join(["RESET"] + [ACTIONS[a] for a in available if 0 < a < len(ACTIONS)])
            return Arc3Refused(f"{action.name} is not available now; available: {names}")
        return None

    def played(self, observation: Observation) -> Acted:
        """Record a charged action's result: the level is completed when the engine counts one
        more level completed than at the start (or reports WIN); failed at the cap."""
        self.actions += 1
        self.last = observation
        completed = (observation.levels_completed > self.start.levels_completed
                     or observation.state == "WIN")
        if completed:
            self.status = Status.SOLVED
        elif self.actions >= self.cap:
            self._fail(f"{self.cap} actions (5 x the human baseline {self.baseline}) without "
                       "completing the level", "action-cap")
        return Acted(observation, self.actions, completed, self.over)

    def expire(self, reason: str, kind: FailureKind = "other") -> None:
        if not self.over:
            self._fail(reason, kind)

    def _fail(self, reason: str, kind: FailureKind) -> None:
        self.status = Status.FAILED
        self.failure_reason = reason
        self.failure_kind = kind


# ----- what a model reads -----

HEX = "0123456789abcdef"


def render_frame(frame: tuple[tuple[int, ...], ...]) -> str:
    """A frame as text: one line per row (row 0 first), one hex digit per cell (colours 0-15).
    64 lines of 64 characters: every cell is there, in its place, at one token per few cells,
    and x (column) and y (row) read off directly."""
    return "\n".join("".join(HEX[c] for c in row) for row in frame)


def render_change(before: tuple[tuple[int, ...], ...], after: tuple[tuple[int, ...], ...],
                  most: int = 24) -> str:
    """What an action changed: the cells (x, y: old -> new) when few, else how many."""
    changed = [(x, y, a, b) for y, (ra, rb) in enumerate(zip(before, after))
               for x, (a, b) in enumerate(zip(ra, rb)) if a != b]
    if not changed:
        return "nothing changed"
    if len(changed) > most:
        return f"{len(changed)} cells changed"
    return "changed: " + ", ".join(f"({x},{y}) {HEX[a]}->{HEX[b]}" for x, y, a, b in changed)


# ----- the conversation: what a model-driven learner is told, and how a model reads it back -----

RULES = """\
You are playing an ARC-AGI-3 game: a turn-based game on a 64x64 grid of colours 0-15 whose rules
you discover by playing. Each level is won by reaching its goal; the game says when a level is
completed. Reply with exactly one JSON action per reply, and nothing else is needed:
  {"action": "ACTION1"} ... {"action": "ACTION5"}, {"action": "ACTION7"}   (what each does is the game's)
  {"action": "ACTION6", "x": X, "y": Y}   (a click on column X, row Y, both 0-63)
  {"action": "RESET"}   (restart the current level)
Every action costs one, RESET included. A level is charged its actions against 5 times the human
baseline; a level not completed within that is failed and charged in full. Only the actions listed
as available may be taken; a reply without a valid action costs nothing and is answered with why."""

OBSERVATION_HEAD = "ARC-AGI-3 game"
FRAME_HEAD = "Frame (64 rows of 64 hex digits, row 0 first; x is the column, y the row):"


def render_observation(game_id: str, level: int, observation: Observation, actions: int, cap: int,
                       baseline: int, last: str | None = None) -> str:
    """One user turn: where the learner is, its counts, what the last action did, the frame."""
    available = ["RESET"] + [ACTIONS[a] + (" (x, y)" if ACTIONS[a] == COMPLEX else "")
                             for a in observation.available_actions if 0 < a < len(ACTIONS)]
    lines = [f"{OBSERVATION_HEAD} {game_id}, level {level} (0-based) of {observation.win_levels}.",
             f"Actions used: {actions} of {cap} (5 x the human baseline {baseline}).",
             f"State: {observation.state}. Levels completed: {observation.levels_completed} of "
             f"{observation.win_levels}.",
             f"Available: {', '.join(available)}."]
    if last:
        lines.append(f"Last action: {last}.")
    frame = observation.frames[-1] if observation.frames else ()
    return "\n".join(lines + [FRAME_HEAD, render_frame(frame)])


_GAME = re.compile(rf"^{OBSERVATION_HEAD} (\S+), level (\d+) \(0-based\) of (\d+)\.$", re.M)
_STATE = re.compile(r"^State: (\w+)\. Levels completed: (\d+) of (\d+)\.$", re.M)
_AVAILABLE = re.compile(r"^Available: (.*)\.$", re.M)


def read_observation(text: str) -> tuple[str, int, Observation] | None:
    """(game id, level, observation) from a user turn `render_observation` wrote; None if it is
    not one (forgiving: a model reads what it can)."""
    game, state, available = _GAME.search(text), _STATE.search(text), _AVAILABLE.search(text)
    if not (game and state and available) or FRAME_HEAD not in text:
        return None
    rows = text.split(FRAME_HEAD, 1)[1].strip().splitlines()[:SIDE]
    try:
        frame = tuple(tuple(HEX.index(c) for c in row.strip()) for row in rows)
    except ValueError:
        return None
    if not frame or any(len(r) != len(frame[0]) for r in frame):
        return None
    numbers = []
    for name in available.group(1).split(","):
        name = name.strip().split(" ")[0]
        if name in ACTIONS:
            numbers.append(ACTIONS.index(name))
    observation = Observation(game.group(1), (frame,), state.group(1), int(state.group(2)),
                              int(state.group(3)), tuple(n for n in numbers if n))
    return game.group(1), int(game.group(2)), observation
