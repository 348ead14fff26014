"""The embedded offline players of the arc3 track: the explorer, and its library twin.

`Explorer` (solver_model/arc3_explorer.py) explores what it observes, bounded by effort; honest
about being weak. `LibraryPlayer` is its twin with a memory: it keeps the winning action sequence
of each (game, level) in its state folder (`arc3-library.json`): the fewest actions from the
level's start to its winning move over the transitions it saw, and replays it first when the level
comes back; where the replay does not
complete the level (a game that is not deterministic) it explores as the explorer does.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.arc3 import COMPLEX, Arc3Action, Observation
from solver_model.arc3_explorer import CLICKS, Explorer, frame_of, objects  # noqa: F401  (the registry's arc3-explorer)

LIBRARY_FILE = "arc3-library.json"


def _key(game_id: str, level: int) -> str:
    return f"{game_id}#{level}"


def _to_json(action: Arc3Action) -> dict:
    return {"action": action.name, **({"x": action.x, "y": action.y} if action.name == COMPLEX else {})}


class LibraryPlayer(Explorer):
    """The explorer with a library of winning sequences per (game, level) in `state_dir`."""

    name = "arc3-library"

    def __init__(self, state_dir: Path, effort: str = "low", seed: int = 0):
        super().__init__(state_dir, effort, seed)
        self.state_dir = Path(state_dir)
        self.replay: list[Arc3Action] = []

    @property
    def library_path(self) -> Path:
        return self.state_dir / LIBRARY_FILE

    def library(self) -> dict[str, list[dict]]:
        try:
            data = json.loads(self.library_path.read_text())
        except (OSError, ValueError):
            return {}  # no library yet (or a wiped one)
        return data if isinstance(data, dict) else {}

    def begin(self, game_id: str, level: int, observation: Observation, baseline: int | None = None,
              cap: int | None = None) -> None:
        super().begin(game_id, level, observation)
        self.replay = []
        for item in self.library().get(_key(game_id, level), []):
            try:
                self.replay.append(Arc3Action(item["action"], item.get("x"), item.get("y")))
            except (KeyError, TypeError, ValueError):
                self.replay = []  # a damaged entry: explore instead
                break

    def choose(self, observation: Observation) -> Arc3Action:
        if self.replay and observation.state != "GAME_OVER":
            return self.replay.pop(0)
        self.replay = []
        return super().choose(observation)

    def completed(self, game_id: str, level: int) -> None:
        library = self.library()
        library[_key(game_id, level)] = [_to_json(a) for a in self.shortest_win()]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.library_path.with_name(LIBRARY_FILE + ".tmp")
        tmp.write_text(json.dumps(library, indent=1, sort_keys=True))
        tmp.replace(self.library_path)
