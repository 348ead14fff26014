"""Fixtures shared by several test modules. A fixture defined here runs once per session; one
imported into several modules (tests/docker_fixtures.py) runs once per module."""

from __future__ import annotations

import pytest

# One real grid of hermes-agent's and openclaw's rows on the scripted tool-using model (which
# writes `carc-note: task <id> was seen` when a harness offers a memory tool): what
# tests/test_hermes_agent.py, tests/test_openclaw.py and tests/test_stores_inspector.py read. Run
# once for the three (it was a grid per module: ten cells, three of them alike, ~6 of CI's minutes).
SCRIPTED_HARNESS_GRID = """\
name: harnesses-it
seed: 5
track: {{name: own, tasks: 2, visits: 2, epilogue: 0, fresh_reference: false}}
orders: [sequential]
model: {{endpoint: "{endpoint}", name: carc-scripted}}
efforts: [low]
learners:
  - hermes-agent
  - {{learner: hermes-agent, row: memory-off}}
  - {{learner: hermes-agent, row: asked-to-store}}
  - {{learner: hermes-agent, row: program-procedure}}
  - openclaw
  - {{learner: openclaw, row: memory-off}}
  - {{learner: openclaw, row: asked-to-store}}
workers: 2
"""
SCRIPTED_HARNESS_CELLS = 7


@pytest.fixture(scope="session")
def scripted_harness_run(tmp_path_factory):
    """The run folder of SCRIPTED_HARNESS_GRID (2 tasks x 2 visits, seed 5; its cells are
    `<harness>[-<row>].low.sequential.s5`). Needs a Docker engine and builds the images if need be."""
    from sandboxes.images import docker_client
    from tests.docker_fixtures import run_scripted_grid

    docker_client()  # no engine: fail here with the command that starts one
    return run_scripted_grid(tmp_path_factory.mktemp("harnesses"), "harnesses-it", SCRIPTED_HARNESS_GRID)
