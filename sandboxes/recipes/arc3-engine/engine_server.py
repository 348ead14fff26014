"""carc's server over the official ARC-AGI-3 engine, inside the arc3-engine container.

The toolkit in OFFLINE mode loads the games of /games (`<game>/<version>/metadata.json` and the
game's source) and makes no network call. Its REST app (`arc_agi.server.create_app`: /api/games,
scorecards, /api/cmd/RESET, ACTION1-7) is served as it is, plus the two routes carc needs that
the REST API lacks:

  POST /carc/start {"game_id": ..., "level": k}  a fresh game, put on level k (0-based): the
                                                  start of an instance, which no learner pays for
  POST /carc/act   {"action": "ACTION6", "x": .., "y": ..}  one action on the current game

Each answer is the engine's FrameData as JSON (frame: the frames an action rendered, state,
levels_completed, win_levels, available_actions). The engine runs with ONLY_RESET_LEVELS=true
(set in the image): a learner's RESET restarts the level it is on, never level 0.
One game at a time: the orchestrator drives one cell's levels in order.
"""

import json
import os
import threading

import arc_agi
from arc_agi.server import create_app
from arcengine import GameAction
from flask import jsonify, request

GAMES = os.environ.get("CARC_GAMES_DIR", "/games")
arcade = arc_agi.Arcade(operation_mode=arc_agi.OperationMode.OFFLINE, environments_dir=GAMES)
app, api = create_app(arcade)
lock = threading.Lock()
current = {"env": None}


def frame_json(frame) -> dict:
    """A FrameDataRaw as JSON: its frames are numpy arrays the model dump leaves out."""
    data = json.loads(frame.model_dump_json())
    out = {key: data.get(key) for key in ("game_id", "state", "levels_completed", "win_levels",
                                          "available_actions", "full_reset")}
    out["frame"] = [f.tolist() if hasattr(f, "tolist") else f for f in frame.frame]
    return out


def error(status: int, message: str):
    return jsonify({"error": message}), status


@app.post("/carc/start")
def carc_start():
    body = request.get_json(force=True, silent=True) or {}
    game_id, level = body.get("game_id"), body.get("level")
    if not isinstance(game_id, str) or not isinstance(level, int):
        return error(400, 'give {"game_id": "...", "level": k}')
    known = {e.game_id for e in arcade.get_environments()}
    if game_id not in known:
        return error(404, f"no game {game_id!r} in {GAMES}; known: {', '.join(sorted(known))}")
    with lock:
        env = arcade.make(game_id)
        if env is None:
            return error(500, f"the toolkit could not load {game_id}")
        game = env._game
        levels = len(game._levels)
        if not 0 <= level < levels:
            return error(400, f"{game_id} has levels 0..{levels - 1}, not {level}")
        env.reset()
        if level:
            game.set_level(level)
        current["env"] = env
        # the level as it stands, without an action: RESET on a fresh level restarts it
        frame = env.step(GameAction.RESET)
        return jsonify(frame_json(frame))


@app.post("/carc/act")
def carc_act():
    body = request.get_json(force=True, silent=True) or {}
    name = body.get("action")
    env = current["env"]
    if env is None:
        return error(409, "no game started: POST /carc/start first")
    try:
        action = GameAction[name]
    except (KeyError, TypeError):
        return error(400, f"unknown action {name!r}")
    data = {}
    if action == GameAction.ACTION6:
        data = {"x": body.get("x"), "y": body.get("y")}
    with lock:
        frame = env.step(action, data=data)
        if frame is None:
            return error(500, f"the engine gave no frame for {name}")
        return jsonify(frame_json(frame))


if __name__ == "__main__":
    app.run(host="0.0.0.0", port=int(os.environ.get("CARC_ENGINE_PORT", "8001")), threaded=True)
