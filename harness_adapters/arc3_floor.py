"""The stateless floor on arc3: the bare model choosing one action per reply from frames as text.

Each level is a new conversation: the rules (`orchestrator.arc3.RULES`) as the system message,
then one user turn per observation (`render_observation`: where it is, its counts, what the last
action did, the frame as 64 rows of hex digits) and the model's replies. A level can take hundreds
of actions and a frame is about 4,200 characters, so the model is sent the level's first turn and
its last `WINDOW` exchanges only; it keeps nothing between levels (nothing is written to its
state folder).
"""

from __future__ import annotations

from pathlib import Path

from harness_adapters.chat_model import ChatModel, Usage
from orchestrator.arc3 import (RULES, Arc3Action, Observation, extract_arc3_action,
                               render_change, render_observation)
from orchestrator.protocol import Malformed

WINDOW = 4  # exchanges (reply + observation) sent besides the level's first turn


class Arc3Floor:
    """See the module docstring. The runner drives it: begin, choose, observe or told."""

    name = "arc3-stateless-floor"
    uses_model = True

    def __init__(self, state_dir: Path | None, effort: str, seed: int, model: ChatModel | None = None,
                 baselines: dict[tuple[str, int], int] | None = None):
        if model is None:
            raise ValueError("the arc3 stateless floor needs a model (the runner gives the cell's)")
        self.model = model
        self.messages: list[dict] = []
        self.usage = Usage()  # of the last choose()
        self.last_text = ""

    def begin(self, game_id: str, level: int, observation: Observation, baseline: int = 1,
              cap: int = 5) -> None:
        self.game_id, self.level, self.baseline, self.cap = game_id, level, baseline, cap
        self.actions = 0
        self.previous = observation
        self.messages = [{"role": "system", "content": RULES},
                         {"role": "user", "content": render_observation(
                             game_id, level, observation, 0, cap, baseline)}]

    def window(self) -> list[dict]:
        head, rest = self.messages[:2], self.messages[2:]
        return head + rest[-2 * WINDOW:]

    def choose(self, observation: Observation) -> Arc3Action | Malformed:
        reply = self.model.complete(self.window(), deadline=getattr(self, "deadline", None))
        self.usage, self.last_text = reply.usage, reply.text
        self.messages.append({"role": "assistant", "content": reply.text})
        return extract_arc3_action(reply.text)

    def replay_reply(self, text: str) -> None:
        """A resumed level: the reply it gave, from the records (no new call)."""
        self.messages.append({"role": "assistant", "content": text})

    def observe(self, action: Arc3Action, observation: Observation) -> None:
        self.actions += 1
        before = self.previous.frames[-1] if self.previous.frames else ()
        after = observation.frames[-1] if observation.frames else ()
        last = f"{action.name}{f' at ({action.x}, {action.y})' if action.x is not None else ''} -> " \
               f"{render_change(before, after)}"
        self.messages.append({"role": "user", "content": render_observation(
            self.game_id, self.level, observation, self.actions, self.cap, self.baseline, last)})
        self.previous = observation

    def told(self, message: str, observation: Observation) -> None:
        """A reply without a valid action, or a refused one: nothing was played or charged."""
        self.messages.append({"role": "user", "content": render_observation(
            self.game_id, self.level, observation, self.actions, self.cap, self.baseline,
            f"not played ({message}); nothing was charged")})

    def completed(self, game_id: str, level: int) -> None:
        pass  # it keeps nothing

    def transcript(self) -> list[dict]:
        return list(self.messages)
