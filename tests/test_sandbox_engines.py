"""Sandbox engines found by one lookup (sandboxes/engines.py): the two built in, one a user
registers, and errors that say what exists and what to install."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError, MachineError
from orchestrator.run.grid_config import GridConfig
from sandboxes import engines
from sandboxes.environment import Sandbox, SandboxEnvironment, SandboxState

GRID = {"name": "x", "track": {"name": "own", "tasks": 1, "visits": 1}, "learners": ["stateless-floor"]}


def test_docker_opens_sandboxes_and_isolates_programs_and_process_checks_them_on_the_host():
    docker, process = engines.sandbox_engine("docker"), engines.sandbox_engine("process")
    assert (docker.name, docker.opens_sandboxes, docker.isolates_programs, docker.needs_docker) == \
        ("docker", True, True, True)
    assert (process.name, process.opens_sandboxes, process.isolates_programs, process.needs_docker) == \
        ("process", False, False, False)
    with pytest.raises(ConfigError, match="'process' runs no sandbox: .* needs sandbox.engine: docker"):
        process.open(None)
    # a harness on a process-engine grid still gets a container, as before the registry
    assert engines.harness_engine("process").name == "docker"


def test_an_unknown_engine_names_those_registered_in_the_lookup_and_in_the_grid():
    with pytest.raises(ConfigError, match=r"'podman': not a registered engine \(registered: docker, process\)"):
        engines.sandbox_engine("podman")
    with pytest.raises(ValueError, match=r"sandbox.engine\n.*'podman' is not a sandbox engine; give one of docker, process"):
        GridConfig.model_validate({**GRID, "sandbox": {"engine": "podman"}})


def test_an_engine_a_user_registers_is_found_by_the_same_lookup_and_a_grid_may_name_it(monkeypatch):
    monkeypatch.setattr(engines, "_ENGINES", dict(engines._ENGINES))

    @engines.register_engine("podman")
    class Podman(engines.SandboxEngine):
        needs_docker = False

    assert isinstance(engines.sandbox_engine("podman"), Podman)
    assert GridConfig.model_validate({**GRID, "sandbox": {"engine": "podman"}}).sandbox.engine == "podman"
    with pytest.raises(ConfigError, match="registered twice"):
        engines.register_engine("podman")(type("Other", (engines.SandboxEngine,), {}))


def test_a_built_in_engine_whose_package_is_missing_says_what_to_install(monkeypatch):
    monkeypatch.setattr(engines, "_ENGINES", {k: v for k, v in engines._ENGINES.items() if k != "docker"})
    monkeypatch.setitem(engines._BUILT_IN, "docker", ("carc_no_such_module", "pip install docker"))
    with pytest.raises(MachineError, match="sandbox.engine docker: No module named 'carc_no_such_module'; pip install docker"):
        engines.sandbox_engine("docker")


def test_what_an_adapter_needs_is_smaller_than_a_sandbox_with_its_state():
    """Adapters take a `Sandbox` (exec, processes, files); the state volume's operations are a
    separate interface that a sandbox engine's sandbox also has."""
    state_ops = {"wipe", "end_processes", "snapshot", "restore"}
    assert Sandbox.__abstractmethods__.isdisjoint(state_ops)
    assert SandboxState.__abstractmethods__ == state_ops
    assert SandboxEnvironment.__abstractmethods__ == Sandbox.__abstractmethods__ | state_ops
    import inspect

    from harness_adapters.openclaw import Gateway
    from harness_adapters.prime_agent import PrimeAgentProcess
    for adapter_class in (Gateway, PrimeAgentProcess):
        assert inspect.signature(adapter_class.__init__).parameters["sandbox"].annotation == "Sandbox"
