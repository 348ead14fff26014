"""`carc arc3 fetch DIR`: download the public ARC-AGI-3 games with the official toolkit.

The toolkit (`arc-agi`, Python >= 3.12) runs in the engine's image, in a container that may reach
the ARC Prize API (the default bridge network; a machine with internet), with DIR mounted as its
`environment_files/` folder: NORMAL mode lists the games, takes an anonymous key when none is
given (`ARC_API_KEY`), and writes each game as `<game>/<version>/{metadata.json, <game>.py}` -
the folder a grid's `track.environments_dir` names. Nothing is kept in carc: the folder is the
user's. The download is the toolkit's own code; carc only runs it and checks what it wrote.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from orchestrator.arc3 import GameInfo
from orchestrator.errors import MachineError
from orchestrator.tasks.arc3_games import GamesError, load_games

ARC_API = "https://three.arcprize.org"
FETCH_TIMEOUT_S = 900  # 25 games, a few requests each, 10 s timeouts
FETCH = """\
import json, logging, sys
import arc_agi
logging.disable(logging.CRITICAL)
arcade = arc_agi.Arcade(operation_mode=arc_agi.OperationMode.NORMAL, environments_dir="/out")
listed = sorted({e.game_id for e in arcade.get_environments()})
wanted = [g for g in listed if not sys.argv[1:] or g.split("-")[0] in sys.argv[1:] or g in sys.argv[1:]]
got = [g for g in wanted if arcade.make(g) is not None]
print("CARC-FETCH " + json.dumps({"listed": listed, "downloaded": got}))
"""


class FetchError(MachineError):
    """The toolkit downloaded nothing usable; the message says why and what to do."""


def fetch_games(dest: Path, base: str = "auto", games: tuple[str, ...] = (),
                base_url: str | None = None, network: str = "bridge",
                api_key: str | None = None) -> dict[str, GameInfo]:
    """Download the games (all, or those named: `ls20` or `ls20-cb3b57cc`) into `dest`; returns
    every game `dest` then holds. `base_url` and `network` point the toolkit elsewhere (a mirror;
    the tests' own server on a network they made)."""
    from sandboxes.images import docker_client, ensure_image

    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    client = docker_client()
    image = ensure_image("arc3-engine", base)
    # the image runs the engine OFFLINE; the toolkit takes the variable over its constructor
    env = {"ARC_BASE_URL": base_url or os.environ.get("ARC_BASE_URL", ARC_API), "OPERATION_MODE": "normal"}
    key = api_key or os.environ.get("ARC_API_KEY")
    if key:
        env["ARC_API_KEY"] = key
    container = client.containers.run(
        image, [*games], entrypoint=["/opt/engine/bin/python", "-c", FETCH], detach=True,
        network=network, user=f"{os.getuid()}:{os.getgid()}", environment=env, working_dir="/tmp",
        volumes={str(dest): {"bind": "/out", "mode": "rw"}}, read_only=True,
        tmpfs={"/tmp": "size=64m"}, cap_drop=["ALL"], security_opt=["no-new-privileges"],
        labels={"org.carc.run": "arc3-fetch", "org.carc.role": "arc3-fetch"})
    try:
        try:
            container.wait(timeout=FETCH_TIMEOUT_S)
        except Exception:  # the toolkit hangs on a network that neither answers nor refuses
            raise FetchError(f"the toolkit did not finish within {FETCH_TIMEOUT_S} s; check the "
                             "machine's internet access (or ARC_BASE_URL)") from None
        output = container.logs(stdout=True, stderr=True)
    finally:
        container.remove(force=True)
    lines = [line for line in output.decode(errors="replace").splitlines() if line.startswith("CARC-FETCH ")]
    report = json.loads(lines[-1].split(" ", 1)[1]) if lines else {"listed": [], "downloaded": []}
    if not report["downloaded"]:
        where = env["ARC_BASE_URL"]
        raise FetchError(
            f"no game downloaded (listed: {len(report['listed'])}): the toolkit could not reach "
            f"{where} from the container, or it refused. Run this on a machine with direct internet "
            "(a TLS-intercepting proxy's CA is not trusted inside the container), or give ARC_API_KEY")
    try:
        return load_games(dest)
    except GamesError as exc:
        raise FetchError(f"the download left a folder carc cannot read: {exc}") from None
