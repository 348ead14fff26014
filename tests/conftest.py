"""Fixtures shared by several test modules, and the suite's tiers.

A fixture defined here runs once per session; one imported into several modules
(tests/docker_fixtures.py) runs once per module.

Workers: `scripts/test.sh --fast` runs on two pytest-xdist workers (`-n 2 --dist loadgroup`),
and CARC_TEST_WORKERS=N runs the whole suite on N (docs/testing.md: the slow tier leaves the two
cores idle about half the time; CI stays in one process until a fresh clone's run on two workers
has passed). Each module is one group (its module
fixtures run once, on one worker); the modules that read the scripted harness grid are one group
(it is a session fixture: it would run once per worker), and so are the modules that start Ray
(a test there ends what Ray started while it ran). Run names are unique across modules, and
every leftover check looks for its own run's label or mark, so two workers do not meet.

Tiers: `pytest --fast` (`scripts/test.sh --fast`) runs only what needs no Docker engine, no
server or subprocess of carc's, no whole grid and no browser: every test without a `docker`,
`slow` or `browser` marker. A test that uses a Docker fixture is marked `docker` here, at
collection; the others carry their marker in their module. In the fast tier Docker points at a
socket that does not exist, so a test that reaches an engine unmarked fails there and says so.
"""

from __future__ import annotations

import os
from collections import defaultdict

import pytest

TIER_MARKERS = ("docker", "slow", "browser")
FAST_EXPRESSION = "not (docker or slow or browser)"
# Fixtures that start or need a Docker engine (their users are marked `docker` at collection).
DOCKER_FIXTURES = frozenset({"client", "base_image", "proxy_image", "scripted_harness_run"})
NO_DOCKER_IN_FAST_TIER = "unix:///nonexistent/the-fast-tier-has-no-docker-engine.sock"
FAST_TIMEOUT_S = 120  # a fast test takes seconds: two minutes is a hang, on any machine
TIMEOUT_S = 1200      # the slowest (a harness grid set up on a busy machine) takes ~4 minutes


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help=f"the fast tier: only tests marked none of {', '.join(TIER_MARKERS)} "
                          "(no Docker, no server, no whole grid); README: scripts/test.sh --fast")


@pytest.hookimpl(tryfirst=True)  # before pytest-timeout reads its setting
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_retry_waits: the test checks a retry's wait, so the "
                                       "suite's zero-wait setting (fast_retry_waits) is off for it")
    if config.getoption("--fast"):
        chosen = config.option.markexpr
        config.option.markexpr = f"({chosen}) and {FAST_EXPRESSION}" if chosen else FAST_EXPRESSION
        os.environ["DOCKER_HOST"] = NO_DOCKER_IN_FAST_TIER
    if config.getvalue("timeout") is None and not os.environ.get("PYTEST_TIMEOUT") \
            and not config.getini("timeout"):
        config.option.timeout = FAST_TIMEOUT_S if config.getoption("--fast") else TIMEOUT_S


# Modules that must share a worker (`--dist loadgroup`; every other module is a group of its own).
WORKER_GROUPS = {
    "scripted-harness-grid": ("test_hermes_agent", "test_openclaw", "test_standby", "test_stores_inspector"),
    "ray": ("test_collective_harness", "test_collective_ray", "test_executors", "test_ray_executor"),
}
_GROUP_OF = {module: group for group, modules in WORKER_GROUPS.items() for module in modules}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if DOCKER_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("docker"):
            item.add_marker(pytest.mark.docker)
        if config.pluginmanager.hasplugin("xdist"):
            module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else item.nodeid
            item.add_marker(pytest.mark.xdist_group(_GROUP_OF.get(module, module)))


def tier_of(keywords) -> str:
    return "fast" if not any(marker in keywords for marker in TIER_MARKERS) else "docker/slow/browser"


_TIER_SECONDS: dict[str, float] = defaultdict(float)
_TIER_TESTS: dict[str, set[str]] = defaultdict(set)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = tier_of(report.keywords)
    _TIER_SECONDS[tier] += report.duration
    _TIER_TESTS[tier].add(report.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _TIER_SECONDS:
        return
    terminalreporter.section("time per tier (setup + call + teardown)")
    for tier in sorted(_TIER_SECONDS):
        terminalreporter.write_line(f"{tier:>20}: {len(_TIER_TESTS[tier]):5d} tests "
                                    f"{_TIER_SECONDS[tier]:8.1f} s")


@pytest.fixture(autouse=True)
def fast_retry_waits(request, monkeypatch):
    """A model call's retries happen at once (here and in every process a test starts): which
    retries happen and what they cost is what tests check, never the backoff's length. A test
    about the waits themselves is marked `real_retry_waits`."""
    if request.node.get_closest_marker("real_retry_waits") is None:
        monkeypatch.setenv("CARC_RETRY_WAIT_SCALE", "0")

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
