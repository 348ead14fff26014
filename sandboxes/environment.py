"""The narrow interface every sandbox offers, whatever runs it.

A cell's learner lives in one sandbox for the whole stream. The runner only needs: run a command
(with input, a working directory, environment and a timeout that really kills), read and write a
file, and the state-volume operations: wipe (stop every learner process and empty the volume),
snapshot after each instance, restore one on resume, and a teardown that always runs.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from orchestrator.errors import InfrastructureError


# Snapshots are gzip at level 1: a snapshot is written after every instance, on the instance's
# path; level 1 takes about a fifth of the CPU of the default 9 for a larger file (restore reads
# any level). Measured: the demo-cache floor's snapshot compressing 12 ms of ~40 ms per instance.
SNAPSHOT_GZIP_LEVEL = 1


def durable_replace(tmp: Path, dest: Path) -> None:
    """Put a finished file in place so that it survives a power loss: its bytes are fsynced
    before the rename, and the folder after it. A snapshot is written before the instance_end
    that names it is fsynced; without this, a machine that lost power could leave a durable
    instance_end whose snapshot, the state resume restores, never reached the disk."""
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, dest)
    folder = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


@dataclass(frozen=True)
class LeftOut:
    """A file of the state that a snapshot did not keep, and why (the cap, a path the engine
    cannot read); the runner records these with the instance, so nothing is lost silently."""

    path: str  # as in the archive, `./...`
    size: int | None  # its data in bytes (a sparse file's holes not counted), when known
    why: str

    def line(self) -> str:
        return f"{self.path}\t{'' if self.size is None else self.size}\t{self.why}"


class StateVolume(Protocol):
    """What the runner needs of a learner's state: a host folder (ladder) or a sandbox volume.

    `collect_logs` copies what the learner's logs gained since the last call into `dest` (logs
    outside the snapshots); a state with no logs returns [] (the ladder's host folder)."""

    def wipe(self) -> None: ...

    def recover(self) -> None: ...

    def snapshot(self, dest: Path) -> list[LeftOut]: ...

    def restore(self, source: Path | None) -> None: ...

    def collect_logs(self, dest: Path) -> list[Path]: ...


# --- what a sandbox engine opens ----------------------------------------------------------------

@dataclass(frozen=True)
class Limits:
    cpus: float = 1.0
    memory: str = "2g"
    pids: int = 512
    tmp_size: str = "512m"
    snapshot_bytes: int = 1 << 30  # file data one state snapshot keeps (holes not counted); beyond it files are left out
    snapshot_s: float = 600.0      # time one snapshot may take
    state_bytes: int | None = 4 << 30  # the state volume's quota (None: none, the engine's disk)


@dataclass
class ProxySpec:
    """The cell's proxy: which upstream it reverse-proxies to and which hosts it allows."""

    image: str
    journal_dir: Path            # host folder: journal.jsonl, raw/, slot.json (the control file)
    upstream: str                # e.g. http://host.docker.internal:8000/v1 (as the proxy sees it)
    allow: tuple[str, ...] = ()  # more hosts reachable through the regular (HTTPS_PROXY) mode
    key_env: str = ""            # host variable holding the real key; copied into the proxy only
    ca_dir: Path | None = None   # host folder holding mitmproxy's CA (default: the machine's)
    prices: Path | None = None   # the price table the proxy journals dollars by (default: proxy/prices.json)
    upstream_ca: Path | None = None  # a private CA the model host's certificate is signed by


@dataclass
class SandboxSpec:
    """One sandbox to open: its image, the run and cell it belongs to (its names and labels), its
    proxy, limits, environment and whether it has a state volume."""

    image: str
    run: str
    cell: str
    proxy: ProxySpec | None = None   # None: no network at all
    limits: Limits = field(default_factory=Limits)
    env: dict[str, str] = field(default_factory=dict)
    volume: bool = True


class LineProcess(Protocol):
    """A long-lived process inside a sandbox with a line protocol on stdin/stdout (a harness
    driver); `stderr` keeps its recent error output for messages."""

    stderr: bytes

    def send_line(self, text: str) -> None: ...

    def read_line(self, timeout: float) -> str | None:
        """The next stdout line, None when the process ended; TimeoutError past `timeout`."""

    def close(self, timeout: float = 900) -> int | None:
        """Close stdin, drain until the process exits; its exit code."""


class SandboxError(InfrastructureError):
    """A sandbox operation failed; the message names the container and the command."""


class Sandbox(abc.ABC):
    """What a learner's code runs in: commands, long-lived processes, files, and the model URL
    as seen from inside. An adapter needs no more than this."""

    state_path: str = "/state"

    @abc.abstractmethod
    def exec(self, cmd: list[str], input: bytes | str | None = None, cwd: str | None = None,
             env: dict[str, str] | None = None, timeout: float | None = None,
             user: str | None = None) -> ExecResult:
        """Run `cmd` (as `user`, default the sandbox's own unprivileged user); past `timeout`
        seconds the process and its children are killed."""

    @abc.abstractmethod
    def open_process(self, cmd: list[str], env: dict[str, str] | None = None,
                     user: str | None = None) -> LineProcess:
        """Start a long-lived process with a line protocol on stdin/stdout (a harness driver)."""

    @abc.abstractmethod
    def reverse_base_url(self) -> str:
        """The model base URL as the sandbox reaches it: its proxy's, never the endpoint itself."""

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes:
        """The file's bytes; FileNotFoundError if it is not there."""

    @abc.abstractmethod
    def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace the file (parent folders are made)."""

    @abc.abstractmethod
    def teardown(self) -> None:
        """Remove everything this sandbox made; safe to call twice and after a failed start."""

    def fault(self) -> str | None:
        """What failed under the sandbox (its container, its proxy), or None: an infrastructure
        fault, never charged to the learner. An engine that cannot tell says None."""
        return None

    def standby(self, generation: int) -> "SandboxEnvironment":
        """Another sandbox of this cell, started, with its own empty state volume, behind the same
        proxy (a wiped row's next instance, prepared ahead: orchestrator/run/standby.py). Its
        `retire` removes it alone; this sandbox's teardown removes every standby still standing.
        An engine without standbys raises SandboxError (grids then set `sandbox.standby: false`)."""
        raise SandboxError(f"{type(self).__name__} makes no standby sandboxes: set sandbox.standby: false")

    def retire(self) -> None:
        """Remove this sandbox alone (a standby's, or a retired one's end), from any thread: the
        cell's proxy and network stay for its other sandbox."""
        self.teardown()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()


class SandboxState(abc.ABC):
    """The state volume's operations, apart from exec and files: what the runner does between
    instances (wipe, snapshot, restore) and after a harness failed (end its processes)."""

    @abc.abstractmethod
    def wipe(self) -> None:
        """Stop every learner process and empty the state volume (memory-off rows)."""

    @abc.abstractmethod
    def end_processes(self) -> None:
        """End every learner process and keep the state volume (after a harness failed)."""

    @abc.abstractmethod
    def snapshot(self, dest: Path) -> list[LeftOut]:
        """Write the state volume as a .tar.gz (members relative to the volume root); return
        what it had to leave out."""

    @abc.abstractmethod
    def restore(self, source: Path | None) -> None:
        """Wipe, then unpack a snapshot into the volume (None: leave it empty)."""


class SandboxEnvironment(Sandbox, SandboxState):
    """One learner's isolated environment with a private, writable state volume: what a
    sandbox engine's `open` returns (sandboxes/engines.py)."""
