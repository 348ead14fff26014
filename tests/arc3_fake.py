"""A tiny deterministic game behind the `Arc3Env` interface, for the arc3 track's pure parts.

The player (colour 3) starts at (0, 0) on a 64x64 board of 0s; level k's goal (colour 4) is k + 2
cells to the right, with a trap (colour 2) one cell below the start; ACTION1-4 move up, down, left,
right; stepping on the trap is GAME_OVER until a RESET; reaching the goal completes the level
(levels_completed counts up; WIN after the last). ACTION6 on the goal's cell also completes it:
a click, so the click path is exercised. The human baseline of level k is k + 2.
"""

from __future__ import annotations

from orchestrator.arc3 import ACTIONS, Arc3Action, GameInfo, Observation

LEVELS = 3
MOVES = {"ACTION1": (0, -1), "ACTION2": (0, 1), "ACTION3": (-1, 0), "ACTION4": (1, 0)}


class FakeGame:
    def __init__(self, clickable: bool = True):
        self.clickable = clickable
        self.played: list[Arc3Action] = []
        self.level = 0
        self.completed = 0
        self.pos = (0, 0)
        self.dead = False

    def games(self) -> dict[str, GameInfo]:
        return {"fake-0001": GameInfo("fake-0001", "fake", tuple(k + 2 for k in range(LEVELS)))}

    def start(self, game_id: str, level: int) -> Observation:
        self.level, self.completed, self.pos, self.dead = level, level, (0, 0), False
        return self._observe()

    def goal(self) -> tuple[int, int]:
        return (self.level + 2, 0)

    def act(self, action: Arc3Action) -> Observation:
        self.played.append(action)
        if action.name == "RESET":
            self.pos, self.dead = (0, 0), False
        elif self.dead:
            pass
        elif action.name in MOVES:
            dx, dy = MOVES[action.name]
            self.pos = (min(63, max(0, self.pos[0] + dx)), min(63, max(0, self.pos[1] + dy)))
        elif action.name == "ACTION6" and (action.x, action.y) == self.goal():
            self.pos = self.goal()
        if self.pos == (0, 1):
            self.dead = True
        if self.pos == self.goal() and not self.dead:
            self.completed = self.level + 1
            self.level = min(self.level + 1, LEVELS - 1)
            self.pos = (0, 0)
        return self._observe()

    def _observe(self) -> Observation:
        board = [[0] * 64 for _ in range(64)]
        gx, gy = self.goal()
        board[gy][gx] = 4
        board[1][0] = 2
        board[self.pos[1]][self.pos[0]] = 3
        state = ("WIN" if self.completed >= LEVELS else "GAME_OVER" if self.dead else "NOT_FINISHED")
        available = (1, 2, 3, 4, 6) if self.clickable else (1, 2, 3, 4)
        return Observation("fake-0001", (tuple(map(tuple, board)),), state, self.completed, LEVELS,
                           available)

    def close(self) -> None:
        pass
