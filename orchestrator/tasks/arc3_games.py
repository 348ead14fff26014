"""The arc3 track's games: read from an ARC-AGI-3 `environment_files/` folder, served level by level.

The toolkit lays a game out as `<game>/<version>/{metadata.json, <game>.py}`; `metadata.json`
carries `game_id` and `baseline_actions` (the human baseline of each level). A game is a task;
visit v of a game serves its level v mod its number of levels, so a stream that visits a game more
often than it has levels meets the same level again (the seed's retention view).

The folder is the user's (`carc arc3 fetch DIR` downloads the 25 public games on a machine with
internet); it is never vendored into carc.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.arc3 import GameInfo
from orchestrator.errors import ConfigError
from orchestrator.tasks.base import ArcInstance


class GamesError(ConfigError):
    """An environments folder that cannot be used; the message names the file and the fix."""


def load_games(environments_dir: str | Path) -> dict[str, GameInfo]:
    """Every game under `environments_dir` by game id (from each `metadata.json`), in id order."""
    root = Path(environments_dir)
    if not root.is_dir():
        raise GamesError(f"{root}: no such folder; track.environments_dir must be an ARC-AGI-3 "
                         "environment_files/ folder (`carc arc3 fetch DIR` downloads the public games)")
    games: dict[str, GameInfo] = {}
    for meta in sorted(root.rglob("metadata.json")):
        try:
            data = json.loads(meta.read_text())
        except (OSError, ValueError) as exc:
            raise GamesError(f"{meta}: not readable JSON ({exc})") from None
        game_id, baselines = data.get("game_id"), data.get("baseline_actions")
        if not isinstance(game_id, str) or not game_id:
            raise GamesError(f"{meta}: no game_id")
        if (not isinstance(baselines, list) or not baselines
                or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in baselines)):
            raise GamesError(f"{meta}: baseline_actions must be a list of positive integers, one per "
                             f"level (the human baseline the 5x cap is counted from)")
        if game_id in games:
            raise GamesError(f"{meta}: game {game_id} is also in another folder; keep one version")
        games[game_id] = GameInfo(game_id, str(data.get("title") or game_id), tuple(baselines))
    if not games:
        raise GamesError(f"{root}: no game found (no <game>/<version>/metadata.json under it)")
    return dict(sorted(games.items()))


class Arc3Source:
    """The games as a task source: task ids are game ids; a visit is a level."""

    name = "arc3"

    def __init__(self, games: dict[str, GameInfo]):
        self.games = dict(games)

    def task_ids(self) -> list[str]:
        return list(self.games)

    def level(self, task_id: str, visit: int) -> int:
        if visit < 0:
            raise ValueError(f"visit must be 0 or more, got {visit}")
        return visit % self.games[task_id].levels

    def baseline(self, task_id: str, level: int) -> int:
        return self.games[task_id].baselines[level]

    def instance(self, task_id: str, visit: int, seed: int) -> ArcInstance:
        raise TypeError("an arc3 slot is a game level, not a grid instance: the arc3 runner plays it "
                        "through the engine (orchestrator/run/arc3_runner.py)")
