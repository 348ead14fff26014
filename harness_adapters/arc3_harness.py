"""A harness on arc3: the same conversation protocol, one action per reply, one conversation per level.

The harness's cell (sandbox, state volume, proxy) is the one it has on the grid tracks
(`orchestrator/run/cell_services.py`); only what is said differs. A level opens a new
conversation with the rules and the first observation (`orchestrator.arc3.render_observation`);
each reply must carry one JSON action; the engine's answer is the next user message. When the
level ends the harness is told how it went in the same conversation, with the row's request
added: asked-to-store rows are invited to keep whatever would help when the game's levels come
back. The program-procedure rows have no meaning on arc3 (nothing there is a grid program).

A level killed mid-way resumes in a new conversation that starts at the level's current frame
and counts: what the harness said before is in its own records only.
"""

from __future__ import annotations

import uuid

from harness_adapters.harness import ConversationHarness
from orchestrator.arc3 import (RULES, Arc3Action, Observation, extract_arc3_action,
                               render_change, render_observation)
from orchestrator.protocol import Malformed
from orchestrator.rows import row as row_of

STORE_INVITATION = """\
Before this conversation ends, save anything that might help you when this game's levels come back
(its rules as you found them, what each action does, the winning sequence of this level), as
generously as you like, using your own tools. Only actions are scored; nothing you save costs
anything. When you are done, reply with {"action": "RESET"}: it is not played."""


class Arc3Harness:
    """Drives a `ConversationHarness` through arc3 levels (the runner's player interface)."""

    uses_model = False  # the harness calls its model itself; its proxy journals every call
    resumes_fresh = True

    def __init__(self, harness: ConversationHarness, row: str):
        self.harness = harness
        self.row = row_of(row)
        if self.row.program_procedure:
            raise ValueError(f"row {row} asks for grid programs, which arc3 does not have; use "
                             "memory-on, memory-off or asked-to-store")
        self.pending = ""
        self.last_text = ""
        self.deadline: float | None = None

    def begin(self, game_id: str, level: int, observation: Observation, baseline: int = 1,
              cap: int = 5, actions: int = 0) -> None:
        h = self.harness
        h._close()
        h.session = f"carc-{uuid.uuid4().hex[:12]}"
        h.turns, h.task_id, h.broken = [], game_id, False
        h.deadline = self.deadline
        h.open_conversation(h.session)
        h.open = True
        self.game_id, self.level, self.baseline, self.cap = game_id, level, baseline, cap
        self.actions, self.previous = actions, observation
        self.pending = RULES + "\n\n" + render_observation(game_id, level, observation, actions, cap,
                                                           baseline)

    def choose(self, observation: Observation) -> Arc3Action | Malformed:
        self.harness.deadline = self.deadline
        turn = self.harness._send(self.pending)
        self.last_text = turn.text
        return extract_arc3_action(turn.text)

    def observe(self, action: Arc3Action, observation: Observation) -> None:
        self.actions += 1
        before = self.previous.frames[-1] if self.previous.frames else ()
        after = observation.frames[-1] if observation.frames else ()
        where = f" at ({action.x}, {action.y})" if action.x is not None else ""
        self.pending = render_observation(self.game_id, self.level, observation, self.actions, self.cap,
                                          self.baseline, f"{action.name}{where} -> {render_change(before, after)}")
        self.previous = observation

    def told(self, message: str, observation: Observation) -> None:
        self.pending = render_observation(self.game_id, self.level, observation, self.actions, self.cap,
                                          self.baseline, f"not played ({message}); nothing was charged")

    def completed(self, game_id: str, level: int) -> None:
        pass  # what it keeps is its own doing

    def end_level(self, solved: bool, actions: int) -> None:
        """The level's end reaches the harness in the same conversation (the asked-to-store row's
        invitation with it); a harness that failed a turn is left, not waited on."""
        h = self.harness
        if h.broken and h.open:
            h.open = False
            h.abandon_conversation()
            return
        if h.open:
            outcome = (f"The level is completed, in {actions} actions." if solved else
                       f"The level is over: not completed (it is charged in full).")
            if self.row.asks_to_store:
                outcome += "\n" + STORE_INVITATION
            h._send(outcome)
        h._close()

    def transcript(self) -> list[dict]:
        return list(self.harness.turns)

    def close(self) -> None:
        self.harness.close()
