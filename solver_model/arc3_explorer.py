"""The embedded model's skill on ARC-AGI-3: systematic exploration of what it observes.

`Explorer` plays a level by exploring what it is shown, never the game's internals: a state is
the last frame it was shown; at each state it tries the actions it has not tried there yet (the
simple actions the engine says are available, and clicks on one cell of each object it sees: a
connected patch of one colour other than the frame's commonest), in an order drawn from its seed;
when every action at a state has been tried it walks, over the transitions it has seen, to the
nearest state with an untried action, and RESETs (one action, like any other) when none is
reachable or the game is over. Effort bounds the clicks it considers per state. It is honest
about being weak: it has no notion of goals, only of novelty.

Two users: the embedded arc3 player (`harness_adapters/arc3_player.py`, driven directly) and the
embedded model's arc3 mode (`solver_model/arc3_play.py`, which rebuilds an explorer from the
conversation it is sent, so the stateless floor on arc3 plays offline).
"""

from __future__ import annotations

import random
from collections import deque
from pathlib import Path

from orchestrator.arc3 import ACTIONS, COMPLEX, Arc3Action, Observation

CLICKS = {"low": 16, "medium": 48, "high": 128}  # click targets considered per state

Frame = tuple[tuple[int, ...], ...]


def frame_of(observation: Observation) -> Frame:
    return observation.frames[-1] if observation.frames else ()


def objects(frame: Frame) -> list[tuple[int, int, int]]:
    """(size, x, y) of one cell of each 4-connected patch of one colour that is not the frame's
    commonest colour, smallest first (small patches are likelier to be buttons than walls)."""
    if not frame:
        return []
    counts: dict[int, int] = {}
    for row in frame:
        for c in row:
            counts[c] = counts.get(c, 0) + 1
    background = max(counts, key=lambda c: counts[c])
    h, w = len(frame), len(frame[0])
    seen = [[False] * w for _ in range(h)]
    found = []
    for y in range(h):
        for x in range(w):
            if seen[y][x] or frame[y][x] == background:
                continue
            colour, size, queue = frame[y][x], 0, deque([(x, y)])
            seen[y][x] = True
            while queue:
                cx, cy = queue.popleft()
                size += 1
                for nx, ny in ((cx + 1, cy), (cx - 1, cy), (cx, cy + 1), (cx, cy - 1)):
                    if 0 <= nx < w and 0 <= ny < h and not seen[ny][nx] and frame[ny][nx] == colour:
                        seen[ny][nx] = True
                        queue.append((nx, ny))
            found.append((size, x, y))
    return sorted(found)


class Explorer:
    """See the module docstring. One instance per cell; `begin` starts each level."""

    name = "arc3-explorer"

    def __init__(self, state_dir: Path | None = None, effort: str = "low", seed: int = 0):
        if effort not in CLICKS:
            raise ValueError(f"effort {effort!r}: give one of {', '.join(CLICKS)}")
        self.effort = effort
        self.seed = seed
        self.path: list[Arc3Action] = []  # actions since the level's start or last RESET

    def begin(self, game_id: str, level: int, observation: Observation, baseline: int | None = None,
              cap: int | None = None) -> None:
        self.rng = random.Random(f"{self.seed}|{game_id}|{level}")
        self.tried: dict[Frame, set[Arc3Action]] = {}
        self.edges: dict[Frame, dict[Arc3Action, Frame]] = {}
        self.order: dict[Frame, list[Arc3Action]] = {}
        self.state = frame_of(observation)
        self.origin = self.state  # the level's start, where a replay begins
        self.last = observation
        self.path = []
        self.pending: Arc3Action | None = None
        self.winning: tuple[Frame, Arc3Action] | None = None  # (state before, action) of the last move

    def candidates(self, state: Frame, observation: Observation) -> list[Arc3Action]:
        if state not in self.order:
            available = [a for a in observation.available_actions if 0 < a < len(ACTIONS)]
            simple = [Arc3Action(ACTIONS[a]) for a in available if ACTIONS[a] != COMPLEX]
            clicks = []
            if ACTIONS.index(COMPLEX) in available:
                clicks = [Arc3Action(COMPLEX, x, y) for _, x, y in objects(state)[:CLICKS[self.effort]]]
            self.rng.shuffle(simple)
            self.order[state] = simple + clicks
        return self.order[state]

    def choose(self, observation: Observation) -> Arc3Action:
        if observation.state == "GAME_OVER":
            return Arc3Action("RESET")
        state = frame_of(observation)
        untried = [a for a in self.candidates(state, observation)
                   if a not in self.tried.get(state, set())]
        if untried:
            return untried[0]
        step = self._toward_untried(state)
        return step if step is not None else Arc3Action("RESET")

    def _toward_untried(self, start: Frame) -> Arc3Action | None:
        """The first action of a shortest seen path to a state with an untried action."""
        queue, first = deque([start]), {start: None}
        while queue:
            state = queue.popleft()
            if state != start and any(a not in self.tried.get(state, set())
                                      for a in self.order.get(state, [])):
                return first[state]
            for action, after in self.edges.get(state, {}).items():
                if after not in first:
                    first[after] = first[state] if first[state] is not None else action
                    queue.append(after)
        return None

    def observe(self, action: Arc3Action, observation: Observation) -> None:
        """What the engine answered to `action` (played from the previous state)."""
        before, after = self.state, frame_of(observation)
        self.tried.setdefault(before, set()).add(action)
        if action.name == "RESET":
            self.path = []
        else:
            self.edges.setdefault(before, {})[action] = after
            self.path.append(action)
        self.winning = (before, action)
        self.state, self.last = after, observation

    def shortest_win(self) -> list[Arc3Action]:
        """The fewest actions from the level's start to the move that completed it, over the
        transitions it saw (the path it walked when none is shorter). A frame stands for a state:
        where the game hides state the frame does not show, the replay may not reproduce it."""
        if self.winning is None:
            return list(self.path)
        goal, last = self.winning
        queue, via = deque([self.origin]), {self.origin: None}
        while queue:
            state = queue.popleft()
            if state == goal:
                steps: list[Arc3Action] = []
                while via[state] is not None:
                    state, action = via[state]
                    steps.append(action)
                found = steps[::-1] + [last]
                return found if len(found) <= len(self.path) else list(self.path)
            for action, after in self.edges.get(state, {}).items():
                if after not in via:
                    via[after] = (state, action)
                    queue.append(after)
        return list(self.path)

    def completed(self, game_id: str, level: int) -> None:
        """The level was completed by the last action (the twin keeps the path)."""

    def told(self, message: str, observation: Observation) -> None:
        """An action of its was not played (refused, malformed): nothing changed."""


