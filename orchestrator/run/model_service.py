"""The model a run's learners call: the grid's endpoint, or embedded solver-model servers started
for the run (one per core), listening where the cells' proxies reach them (`model_host`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import httpx

from orchestrator.run.grid_config import EMBEDDED, HARNESSES, Cell, GridConfig
from proxy.host import die_with_parent, free_port
from sandboxes.engines import harness_engine


@contextmanager
def model_service(grid: GridConfig, log_dir: Path, servers: int = 1,
                  host: str = "127.0.0.1", tag: str = "", processes: int = 1,
                  prior: Path | None = None) -> Iterator[list[str]]:
    """Base URLs learners use: the grid's endpoint, or fresh embedded solver-model servers.

    The embedded model is CPU-bound, so one single-process server per core is started (each dies
    with this process, and only with it: a signal to the process group does not reach it); cells
    are spread over them. `tag` names their logs apart
    (`model-server-<tag>N.log`: the Ray executor starts one per cell attempt, on its node).
    `prior`: serve the embedded model as trained to this primitive prior (a collective grid's
    trained row, orchestrator/run/collective/training.py).
    """
    if grid.model.endpoint != EMBEDDED:
        yield [grid.model.endpoint.rstrip("/")]
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    procs, urls = [], []
    try:
        for number in range(servers):
            port = free_port()
            out = open(log_dir / f"model-server-{tag}{number}.log", "ab")
            cmd = [sys.executable, "-m", "orchestrator.cli", "model", "serve", "--host",
                   host, "--port", str(port),
                   "--usage-log", str(log_dir / f"model-usage-{tag}{number}.jsonl"),
                   "--seed", str(grid.model.seed), "--workers", str(processes)]
            if grid.model.timing is not None:
                cmd += ["--timing", grid.model.timing.model_dump_json()]
            if prior is not None:
                cmd += ["--prior", str(prior)]
            # a session of its own: Ctrl-C (SIGINT to the terminal's process group) stops the
            # run, which ends its instances before it stops the model, not the model under them
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=lambda: die_with_parent(signal.SIGKILL)))
            out.close()
            urls.append(f"http://{host}:{port}/v1")
        for proc, base_url in zip(procs, urls):
            _wait_ready(proc, base_url, log_dir)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()



def _wait_ready(proc: subprocess.Popen, base_url: str, log_dir: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the embedded model server exited with code {proc.returncode}; "
                               f"see the logs in {log_dir}")
        try:
            if httpx.get(f"{base_url}/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the embedded model server did not answer on {base_url} in 60 s")
        time.sleep(0.2)



def model_host(grid: GridConfig, cells: Iterable[Cell] | None = None) -> str:
    """Where this machine's model servers listen for `cells` (default: the grid's): where the
    harness engine's proxies reach the host (docker's: the host's bridge address, which no
    sandbox reaches), or loopback when no harness is among them."""
    if not any(cell.learner in HARNESSES for cell in (grid.cells() if cells is None else cells)):
        return "127.0.0.1"
    return harness_engine(grid.sandbox.engine).model_host()
