"""The embedded model's arc3 mode: a conversation of observations in, one JSON action out.

The conversation is the arc3 stateless floor's (`harness_adapters/arc3_floor.py`): user turns
rendered by `orchestrator.arc3.render_observation`, the model's earlier replies between them. The
model rebuilds an explorer (`solver_model/arc3_explorer.py`) from what the conversation shows -
the first observation it holds, then each of its own actions that was played and the observation
that followed - and answers with the explorer's next action. It sees only the window the learner
sends, so it forgets what fell out of it: the bare model, weaker than the embedded player that
keeps its whole level in memory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.arc3 import COMPLEX, OBSERVATION_HEAD, Arc3Action, extract_arc3_action, read_observation
from orchestrator.tasks.base import derive_seed
from solver_model.arc3_explorer import Explorer
from solver_model.conversation import message_text

NOT_PLAYED = "Last action: not played"


def is_arc3(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(m.get("role") == "user" and OBSERVATION_HEAD in message_text(m.get("content"))
               for m in messages)


def arc3_reply(messages: Sequence[Mapping[str, Any]], effort: str, seed: int = 0) -> str:
    """The reply text: one JSON action (RESET when nothing in the conversation can be read)."""
    explorer: Explorer | None = None
    pending: Arc3Action | None = None
    current = None
    for message in messages:
        role, text = message.get("role"), message_text(message.get("content"))
        if role == "assistant":
            action = extract_arc3_action(text)
            pending = action if isinstance(action, Arc3Action) else None
            continue
        if role != "user":
            continue
        read = read_observation(text)
        if read is None:
            continue
        game_id, level, observation = read
        if explorer is None:
            explorer = Explorer(None, effort if effort in ("low", "medium", "high") else "medium",
                                seed=derive_seed(seed, "arc3", game_id, level))
            explorer.begin(game_id, level, observation)
        elif pending is not None and NOT_PLAYED not in text:
            explorer.observe(pending, observation)
        pending, current = None, observation
    if explorer is None or current is None:
        return json.dumps({"action": "RESET"})
    action = explorer.choose(current)
    payload = {"action": action.name}
    if action.name == COMPLEX:
        payload.update(x=action.x, y=action.y)
    return json.dumps(payload)
