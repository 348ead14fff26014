"""The ARC-AGI-3 engine in its container (the official packages, the vendored games), and an arc3
grid run through it end to end: the embedded player and its library twin, the report."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.arc3 import Arc3Action, Arc3Env, LevelProtocol
from orchestrator.records import CellPaths, read_events
from orchestrator.run.arc3_engine import EngineContainer, EngineEnv, EngineError
from tests.docker_fixtures import client  # noqa: F401  (the Docker engine fixture)

pytestmark = [pytest.mark.docker]

VENDOR = Path(__file__).resolve().parents[2] / "shared" / "vendor" / "arc-agi-3"


def games_dir(name: str = "environment_files") -> Path:
    root = Path(os.environ["CARC_ARC3_GAMES"]).parent if os.environ.get("CARC_ARC3_GAMES") else VENDOR
    path = root / name
    if not (path.is_dir() and any(path.rglob("metadata.json"))):
        pytest.skip(f"no ARC-AGI-3 games at {path}: set CARC_ARC3_GAMES (source scripts/vendor-env.sh)")
    return path


@pytest.fixture(scope="module")
def image(client):
    from sandboxes.images import ensure_image
    return ensure_image("arc3-engine", "auto")


@pytest.fixture(scope="module")
def engine(image):
    games = games_dir()
    with EngineContainer(games, "arc3-engine-it", "engine-test", image) as container:
        env = EngineEnv(container.url, games)
        yield env, container
        env.http.close()


def test_the_engine_lists_the_vendored_games_with_their_baselines(engine):
    env, _ = engine
    assert isinstance(env, Arc3Env)
    games = env.games()
    assert games["ls20-cb3b57cc"].baselines == (29, 41, 172, 49, 53, 62, 82)
    assert games["ft09-9ab2447a"].levels == 6


@pytest.mark.parametrize("level", [0, 3])
def test_a_level_starts_fresh_with_64x64_frames_and_nothing_completed(engine, level):
    env, _ = engine
    start = env.start("ls20-cb3b57cc", level)
    frame = start.frames[-1]
    assert len(frame) == 64 and all(len(row) == 64 for row in frame)
    assert all(0 <= c <= 15 for row in frame for c in row)
    assert start.levels_completed == 0 and start.win_levels == 7 and start.state == "NOT_FINISHED"
    assert start.available_actions


def test_levels_differ_and_a_reset_restarts_the_level_the_game_is_on(engine):
    env, _ = engine
    first = env.start("ls20-cb3b57cc", 0).frames[-1]
    start = env.start("ls20-cb3b57cc", 1)
    assert start.frames[-1] != first
    moved = None
    for name in ("ACTION1", "ACTION2", "ACTION3", "ACTION4"):
        if int(name[-1]) in start.available_actions:
            moved = env.act(Arc3Action(name))
            if moved.frames[-1] != start.frames[-1]:
                break
    assert moved is not None and moved.frames[-1] != start.frames[-1], "no move changed the board"
    reset = env.act(Arc3Action("RESET"))
    assert reset.frames[-1] == start.frames[-1]  # level 1 again, not level 0
    assert reset.frames[-1] != first


def test_clicks_are_played_and_a_bad_game_or_level_is_named(engine):
    env, _ = engine
    start = env.start("ft09-9ab2447a", 0)
    assert 6 in start.available_actions
    after = env.act(Arc3Action("ACTION6", 10, 10))
    assert after.state in ("NOT_FINISHED", "GAME_OVER", "WIN") and after.frames
    with pytest.raises(EngineError, match="no game 'zz99'"):
        env.start("zz99", 0)
    with pytest.raises(EngineError, match="levels 0..5, not 9"):
        env.start("ft09-9ab2447a", 9)


def test_the_engine_has_no_way_out_and_only_its_own_network(engine, client):
    _, container = engine
    found = client.containers.get(container.name)
    networks = found.attrs["NetworkSettings"]["Networks"]
    assert list(networks) == [container.name]
    assert client.networks.get(container.name).attrs["Internal"] is True
    assert found.attrs["HostConfig"]["ReadonlyRootfs"] is True
    assert found.attrs["Config"]["Labels"]["org.carc.role"] == "arc3-engine"
    code, out = found.exec_run(["/opt/engine/bin/python", "-c",
                                "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)"])
    assert code != 0


def test_a_closed_engine_leaves_no_container_or_network(image, client):
    container = EngineContainer(games_dir(), "arc3-engine-close", "c", image).start()
    name = container.name
    container.close()
    assert not client.containers.list(all=True, filters={"name": name})
    assert not client.networks.list(names=[name])


def test_an_arc3_grid_runs_through_the_engine_with_the_player_and_its_library_twin(tmp_path, image, client):
    """The acceptance run: the toolkit's test games (small levels), every level met twice."""
    from orchestrator.analysis.report import write_report
    from orchestrator.run.local_pool import start_run
    games = games_dir("toolkit_test_environment_files")
    grid = tmp_path / "arc3.yaml"
    grid.write_text(f"""\
name: arc3-it
seed: 1
track: {{name: arc3, environments_dir: {games}, visits: 6}}
orders: [sequential]
efforts: [low]
learners: [arc3-explorer, arc3-library]
workers: 2
""")
    run = start_run(grid, tmp_path / "runs", "arc3-it", workers=2)
    for cell in ("arc3-explorer.low.sequential.s1", "arc3-library.low.sequential.s1"):
        events = read_events(run / "cells" / cell / "events.jsonl")
        ends = [e for e in events if e.type == "instance_end"]
        assert len(ends) == 12  # 2 games x 6 visits
        for end in ends:
            steps = [e for e in events if e.slot == end.slot and e.type == "step" and e.outcome == "played"]
            cap = end.budget
            assert end.cost == (len(steps) if end.status == "solved" else cap)
            assert len(steps) <= cap
    text = (run / "report.md").read_text() if (run / "report.md").exists() else write_report(run).read_text()
    section = text.split("## ARC-AGI-3 levels", 1)[1].split("\n## ", 1)[0]
    assert "arc3-library.low.sequential.s1" in section and "levels met twice" in section
    assert not client.containers.list(all=True, filters={"label": "org.carc.run=arc3-it"})


FAKE_API = """\
import json, pathlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
GAME = pathlib.Path("/game")
META = json.loads((GAME / "metadata.json").read_text())
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        base, full = META["game_id"].split("-")[0], META["game_id"]
        routes = {"/api/games/anonkey": json.dumps({"api_key": "anonymous-test-key"}),
                  "/api/games": json.dumps([{"game_id": full, "title": META["title"]}]),
                  f"/api/games/{base}": json.dumps(META),
                  f"/api/games/{full}/source": (GAME / "ls20.py").read_text()}
        body = routes.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write((body or "{}").encode())
ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
"""


def test_carc_arc3_fetch_runs_the_toolkit_against_an_api_and_checks_what_it_wrote(tmp_path, image, client):
    """The toolkit's own download code against a stand-in of the ARC API on a network made here
    (no test reaches the internet); the folder it writes is one a grid can play."""
    import time

    import docker.types

    from orchestrator.run.arc3_fetch import FetchError, fetch_games
    import uuid
    game = games_dir() / "ls20" / "cb3b57cc"
    (tmp_path / "api.py").write_text(FAKE_API)
    tag = uuid.uuid4().hex[:8]
    network = client.networks.create(f"carc-fetch-it-{tag}", internal=True,
                                      labels={"org.carc.run": "arc3-fetch-it"})
    api = client.containers.run(
        image, ["/srv/api.py"], entrypoint=["/opt/engine/bin/python"], user="0", detach=True, name=f"fakeapi-{tag}",
        network=network.name, labels={"org.carc.run": "arc3-fetch-it"},
        mounts=[docker.types.Mount("/srv", str(tmp_path), type="bind", read_only=True),
                docker.types.Mount("/game", str(game), type="bind", read_only=True)])
    try:
        time.sleep(1.0)
        url = f"http://{api.name}:8000"
        found = fetch_games(tmp_path / "games", games=("ls20",), base_url=url, network=network.name)
        assert found["ls20-cb3b57cc"].baselines == (29, 41, 172, 49, 53, 62, 82)
        assert (tmp_path / "games" / "ls20" / "cb3b57cc" / "ls20.py").read_text() == (game / "ls20.py").read_text()
        with pytest.raises(FetchError, match="no game downloaded"):
            fetch_games(tmp_path / "none", base_url="http://nowhere.invalid:8000", network=network.name)
    finally:
        api.remove(force=True)
        network.remove()


def test_a_harness_plays_arc3_through_the_same_conversation_one_action_per_reply(tmp_path, image, client):
    """hermes-agent in its sandbox behind its proxy, on bt11's first level (cap 20): every reply
    an action, every action charged, the calls journaled, the asked-to-store row invited."""
    from orchestrator.run.local_pool import start_run
    from proxy.journal import read_journal
    games = games_dir("toolkit_test_environment_files") / "game1"
    grid = tmp_path / "hermes-arc3.yaml"
    grid.write_text(f"""\
name: hermes-arc3
seed: 1
track: {{name: arc3, environments_dir: {games}, visits: 1}}
orders: [sequential]
efforts: [low]
learners: [hermes-agent, {{learner: hermes-agent, row: asked-to-store}}]
workers: 2
""")
    run = start_run(grid, tmp_path / "runs", "hermes-arc3", workers=2)
    for row in ("hermes-agent", "hermes-agent-asked-to-store"):
        folder = run / "cells" / f"{row}.low.sequential.s1"
        events = read_events(folder / "events.jsonl")
        end = next(e for e in events if e.type == "instance_end")
        steps = [e for e in events if e.type == "step"]
        assert end.budget == 20 and steps and all(s.reply for s in steps)
        played = sum(s.outcome == "played" for s in steps)
        assert end.cost == (played if end.status == "solved" else 20)
        calls = [j for j in read_journal(folder / "journal") if j.slot == 0 and not j.refused]
        assert end.model_calls == len([j for j in calls if j.api != "other"]) >= played
        [level] = CellPaths(folder).read_transcripts().values()
        conversation = level["conversation"]
        assert "ARC-AGI-3 game bt11" in conversation[0]["user"]
        invited = "save anything that might help you when this game's levels come back" in conversation[-1]["user"]
        assert invited == row.endswith("asked-to-store")
    assert not client.containers.list(all=True, filters={"label": "org.carc.run=hermes-arc3"})
