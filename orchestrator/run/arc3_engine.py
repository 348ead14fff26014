"""The ARC-AGI-3 engine of an arc3 cell: its own container, and the client the runner plays through.

`EngineContainer` runs the `arc3-engine` image (sandboxes/recipes/arc3-engine: the official
`arc-agi` and `arcengine` packages on Python 3.13, and carc's server over them) with the grid's
games folder mounted read-only, on an internal network of its own: no way out, and no other
container on it; the orchestrator reaches it at its address on that network. It is labelled
with the run and the cell like every carc container, so teardown and `carc sandboxes prune` find it.

`EngineEnv` is `orchestrator.arc3.Arc3Env` over HTTP. What the engine does, as read from
arcengine 0.9.3 and checked by tests/test_arc3_engine.py:
- `start(game, k)` makes a fresh game and puts it on level k (`set_level`), then restarts that
  level once so it stands clean; `levels_completed` then reads 0, whatever k is, and becomes 1 when
  the level is completed (the protocol compares with the start).
- RESET restarts the level the game is on: the engine runs with ONLY_RESET_LEVELS=true (without
  it, a RESET before any other action of a level resets the whole game to level 0).
- After GAME_OVER every action but RESET answers with no frame and the state unchanged.
- Completing the last level gives WIN.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import httpx
import structlog

from orchestrator.arc3 import COMPLEX, Arc3Action, GameInfo, Observation
from orchestrator.errors import InfrastructureError
from orchestrator.records import CellPaths
from orchestrator.tasks.arc3_games import load_games

log = structlog.get_logger("carc.arc3")

PORT = 8001
GAMES_MOUNT = "/games"
READY_S = 60.0
ROLE = "arc3-engine"


class EngineError(InfrastructureError):
    """The engine container did not start or did not answer; the message says what it logged."""


class EngineContainer:
    """One engine container (and its network) for one cell; a context manager."""

    def __init__(self, games_dir: Path, run: str, cell: str, image: str, cpus: float = 1.0,
                 memory: str = "2g"):
        from sandboxes.docker_sandbox import LABEL_CELL, LABEL_NODE, LABEL_ROLE, LABEL_RUN, NODE_ENV
        from sandboxes.images import docker_client

        self.games_dir = Path(games_dir).resolve()
        self.client = docker_client()
        self.image = image
        self.cpus, self.memory = cpus, memory
        self.labels = {LABEL_RUN: run, LABEL_CELL: cell}
        if os.environ.get(NODE_ENV):
            self.labels[LABEL_NODE] = os.environ[NODE_ENV]
        self.role_label = LABEL_ROLE
        self.name = f"carc-{uuid.uuid4().hex[:8]}-arc3-engine"
        self.container = None
        self.network = None
        self.url = ""

    def start(self) -> "EngineContainer":
        from docker.types import Mount
        try:
            self.network = self.client.networks.create(
                self.name, driver="bridge", internal=True, labels={**self.labels, self.role_label: "network"})
            self.container = self.client.containers.run(
                self.image, name=self.name, detach=True, init=True, read_only=True,
                network=self.network.name, user="1000:1000",
                mounts=[Mount(GAMES_MOUNT, str(self.games_dir), type="bind", read_only=True)],
                tmpfs={"/tmp": "rw,nosuid,nodev,size=256m,mode=1777"},
                security_opt=["no-new-privileges"], cap_drop=["ALL"],
                nano_cpus=int(self.cpus * 1e9), mem_limit=self.memory, memswap_limit=self.memory,
                pids_limit=256, environment={"CARC_GAMES_DIR": GAMES_MOUNT, "CARC_ENGINE_PORT": str(PORT)},
                labels={**self.labels, self.role_label: ROLE})
            self.container.reload()
            networks = (self.container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
            address = (networks.get(self.network.name) or {}).get("IPAddress")
            if not address:
                raise EngineError(f"{self.name}: the engine container has no address on its network")
            self.url = f"http://{address}:{PORT}"
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/healthcheck", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            self.container.reload()
            if self.container.status not in ("created", "running"):
                break
            time.sleep(0.2)
        logs = self.container.logs(tail=15).decode(errors="replace")
        raise EngineError(f"the arc3 engine ({self.name}, image {self.image}) did not answer at "
                          f"{self.url} within {READY_S:g} s; its last log lines:\n{logs}")

    def close(self) -> None:
        import docker.errors
        for obj in (self.container, self.network):
            if obj is None:
                continue
            try:
                obj.remove(force=True) if obj is self.container else obj.remove()
            except docker.errors.NotFound:
                pass
        self.container = self.network = None

    def __enter__(self) -> "EngineContainer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _observation(data: dict) -> Observation:
    frames = tuple(tuple(tuple(int(c) for c in row) for row in frame) for frame in data.get("frame") or [])
    return Observation(str(data.get("game_id") or ""), frames, str(data.get("state") or ""),
                       int(data.get("levels_completed") or 0), int(data.get("win_levels") or 0),
                       tuple(int(a) for a in data.get("available_actions") or ()))


class EngineEnv:
    """`Arc3Env` over the engine's HTTP server (carc's /carc/start and /carc/act routes)."""

    def __init__(self, url: str, games_dir: Path, container: EngineContainer | None = None,
                 timeout_s: float = 60.0):
        self.url = url.rstrip("/")
        self.games_dir = Path(games_dir)
        self.container = container
        self.http = httpx.Client(timeout=timeout_s)
        self._games = load_games(self.games_dir)
        self.last: Observation | None = None

    def games(self) -> dict[str, GameInfo]:
        return dict(self._games)

    def _post(self, path: str, body: dict) -> Observation:
        response = self.http.post(f"{self.url}{path}", json=body)
        if response.status_code != 200:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            raise EngineError(f"the arc3 engine refused {path} {body}: {response.status_code} {message}")
        return _observation(response.json())

    def start(self, game_id: str, level: int) -> Observation:
        info = self._games.get(game_id)
        if info is None:
            raise EngineError(f"no game {game_id!r} in {self.games_dir}; known: {', '.join(self._games)}")
        if not 0 <= level < info.levels:
            raise EngineError(f"{game_id} has levels 0..{info.levels - 1}, not {level}")
        self.last = self._post("/carc/start", {"game_id": game_id, "level": level})
        return self.last

    def act(self, action: Arc3Action) -> Observation:
        body = {"action": action.name}
        if action.name == COMPLEX:
            body.update(x=action.x, y=action.y)
        observation = self._post("/carc/act", body)
        if not observation.frames and self.last is not None:
            # after GAME_OVER the engine answers without a frame: the board is as it was
            observation = Observation(observation.game_id, self.last.frames, observation.state,
                                      observation.levels_completed, observation.win_levels,
                                      observation.available_actions or self.last.available_actions)
        self.last = observation
        return observation

    def close(self) -> None:
        self.http.close()
        if self.container is not None:
            self.container.close()


def open_engine_env(grid, cell, cell_dir: Path) -> EngineEnv:
    """The cell's engine: a container from the grid's base, serving the grid's games folder."""
    from sandboxes.images import ensure_image
    image = ensure_image("arc3-engine", grid.sandbox.base)
    run = CellPaths(cell_dir).run.name
    container = EngineContainer(grid.track.environments_dir, run, cell.cell, image,
                                cpus=grid.sandbox.cpus, memory=grid.sandbox.memory).start()
    try:
        return EngineEnv(container.url, grid.track.environments_dir, container)
    except BaseException:
        container.close()
        raise
