"""Shared fixtures of the Docker tests: a real engine, the real images (built offline if need be).

No mock anywhere: with no engine these tests fail with the command that makes one
(scripts/docker-up.sh, which scripts/test.sh runs first), they are never skipped.
"""

from __future__ import annotations

import os
import uuid

import pytest

from sandboxes.images import docker_client, ensure_image

BASE = os.environ.get("CARC_IMAGE_BASE", "auto")


@pytest.fixture(scope="session")
def client():
    return docker_client()


@pytest.fixture(scope="session")
def base_image(client) -> str:
    return ensure_image("base", BASE, client)


@pytest.fixture(scope="session")
def proxy_image(client) -> str:
    return ensure_image("proxy", BASE, client)


@pytest.fixture(scope="session")
def run_id() -> str:
    """Every object the tests make carries this run label, so the session can prune them all."""
    return f"pytest-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session", autouse=True)
def _prune_at_end(run_id):
    yield
    from sandboxes.docker_sandbox import prune
    prune(run=run_id)


def run_scripted_grid(root, name: str, grid_template: str):
    """Run a grid on the scripted tool-using model (its `{endpoint}` filled in); the run folder."""
    from harness_adapters.scripted_model import scripted_model_server
    from orchestrator.run.grid_run import execute

    run = root / "runs" / name
    (run / "cells").mkdir(parents=True)
    with scripted_model_server() as endpoint:
        (run / "grid.yaml").write_text(grid_template.format(endpoint=endpoint))
        execute(run, show_progress=False)
    return run
