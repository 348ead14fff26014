"""Sandbox engines: what a grid's `sandbox.engine` names, found by one lookup.

An engine opens sandboxes (`open(spec)`: started, with its state volume and its proxy) and says
whether a learner's programs are checked inside one (`isolates_programs`). Two are built in:

    docker    harnesses, their proxies and program checks in containers (sandboxes/docker_sandbox.py)
    process   program checks in host subprocesses (harness_adapters/program_check.py); it opens
              no sandbox, so a grid with a harness needs docker

Another engine registers itself with `@register_engine("name")` on a `SandboxEngine` subclass in
a module that is imported before the grid is loaded (the Inspect AI `@sandboxenv` pattern).
`sandbox_engine(name)` returns it, or says which engines exist and, for a built-in whose import
failed, what to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

from orchestrator.errors import ConfigError, MachineError

if TYPE_CHECKING:
    from sandboxes.environment import SandboxEnvironment, SandboxSpec


class SandboxEngine:
    """One way of running learners' code. Subclasses set `name` (by `register_engine`),
    `isolates_programs` and `needs_docker`, and implement `open`."""

    name: str = ""
    opens_sandboxes: bool = True  # `open` makes sandboxes (harnesses need them)
    isolates_programs: bool = True  # program checks run in a sandbox of this engine
    needs_docker: bool = False  # the run prepares Docker images and prunes containers

    def model_host(self) -> str:
        """The host address the machine's model servers listen on so that this engine's
        sandboxes' proxies reach them (loopback when the proxies run on the host)."""
        return "127.0.0.1"

    def open(self, spec: SandboxSpec) -> SandboxEnvironment:
        """A started sandbox for `spec` (its teardown removes all it made)."""
        raise ConfigError(f"sandbox.engine {self.name!r} runs no sandbox: a grid with a harness (or "
                          "sandboxed program checks) needs sandbox.engine: docker")


_ENGINES: dict[str, type[SandboxEngine]] = {}
# built-ins, imported on first lookup (their modules need their own packages: docker's needs the SDK)
_BUILT_IN = {"docker": ("sandboxes.docker_sandbox", "pip install docker (and a running engine: "
                                                    "scripts/docker-up.sh)"),
             "process": ("sandboxes.engines", "")}


def register_engine(name: str) -> Callable[[type[SandboxEngine]], type[SandboxEngine]]:
    def register(cls: type[SandboxEngine]) -> type[SandboxEngine]:
        if name in _ENGINES and _ENGINES[name] is not cls:
            raise ConfigError(f"sandbox engine {name!r} is registered twice: {_ENGINES[name]} and {cls}")
        cls.name = name
        _ENGINES[name] = cls
        return cls
    return register


def known_engines() -> list[str]:
    """Every engine name a grid may give (the built-ins whether or not imported yet)."""
    return sorted(set(_ENGINES) | set(_BUILT_IN))


def harness_engine(name: str) -> SandboxEngine:
    """The engine a harness's sandbox opens on: the grid's, or docker when the grid's opens none
    (`sandbox.engine: process` checks programs on the host; a harness still needs a container)."""
    engine = sandbox_engine(name)
    return engine if engine.opens_sandboxes else sandbox_engine("docker")


def sandbox_engine(name: str) -> SandboxEngine:
    """The engine registered as `name`."""
    if name not in _ENGINES and name in _BUILT_IN:
        module, install = _BUILT_IN[name]
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise MachineError(f"sandbox.engine {name}: {exc}; {install}") from None
    if name not in _ENGINES:
        raise ConfigError(f"sandbox.engine {name!r}: not a registered engine (registered: "
                          f"{', '.join(known_engines())}); another engine registers itself with "
                          "sandboxes.engines.register_engine")
    return _ENGINES[name]()


@register_engine("process")
class ProcessEngine(SandboxEngine):
    """Program checks in host subprocesses, with rlimits and (as root) the uid of nobody."""

    opens_sandboxes = False
    isolates_programs = False
