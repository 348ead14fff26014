"""The one wait on a sandbox process's output (`docker_sandbox._frames`), on a socket pair: frames
arrive, a silent process times out, and a wait whose proxy container died ends at the next check
instead of at the harness's own retries (no Docker here: the check is a function)."""

from __future__ import annotations

import socket
import struct
import time

import pytest

import sandboxes.docker_sandbox as docker_sandbox
from sandboxes.docker_sandbox import ProxyDown, _frames


def frame(stream: int, data: bytes) -> bytes:
    """One frame of docker's multiplexed exec stream."""
    return struct.pack(">BxxxL", stream, len(data)) + data


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def test_frames_are_yielded_while_the_proxy_is_up(pair, monkeypatch):
    monkeypatch.setattr(docker_sandbox, "PROXY_CHECK_S", 0.05)
    ours, theirs = pair
    checks: list[float] = []
    theirs.sendall(frame(1, b"hello\n") + frame(2, b"warn"))
    frames = _frames(ours, time.monotonic() + 5, proxy_fault=lambda: checks.append(1))
    assert next(frames) == (1, b"hello\n")
    assert next(frames) == (2, b"warn")
    theirs.close()
    assert list(frames) == []  # the process ended
    assert not checks  # data was waiting: the proxy was never asked


def test_a_silent_wait_asks_the_proxy_and_ends_when_it_is_down(pair, monkeypatch):
    monkeypatch.setattr(docker_sandbox, "PROXY_CHECK_S", 0.05)
    ours, _ = pair
    answers = iter([None, None, "the proxy container carc-x-proxy is exited (exit code 137)"])
    started = time.monotonic()
    with pytest.raises(ProxyDown, match="carc-x-proxy is exited"):
        next(_frames(ours, time.monotonic() + 60, proxy_fault=lambda: next(answers)))
    assert time.monotonic() - started < 5  # three checks, not the 60 s deadline


def test_a_silent_wait_with_the_proxy_up_times_out_at_its_deadline(pair, monkeypatch):
    monkeypatch.setattr(docker_sandbox, "PROXY_CHECK_S", 0.05)
    ours, _ = pair
    checks: list[int] = []
    with pytest.raises(TimeoutError):
        next(_frames(ours, time.monotonic() + 0.3, proxy_fault=lambda: checks.append(1)))
    assert len(checks) >= 3


def test_a_wait_without_a_proxy_check_only_times_out(pair):
    ours, _ = pair
    with pytest.raises(TimeoutError):
        next(_frames(ours, time.monotonic() + 0.2))


class Container:
    """A container as the engine answers for it (docker-py's `reload` then `status`)."""

    def __init__(self, status: str = "running", error: Exception | None = None):
        self.name, self.status, self.error, self.attrs = "carc-x-proxy", status, error, {}

    def reload(self) -> None:
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize("container, down", [
    (Container(), False),
    (Container("exited"), True),
    (Container(error=docker_sandbox.docker.errors.NotFound("gone")), True),
    # an engine hiccup is no fault to end a turn on (the slot driver would then find none and
    # charge the turn), though the slot driver's own check after a failure names it
    (Container(error=docker_sandbox.docker.errors.APIError("engine busy")), False),
    (Container(error=docker_sandbox.requests.exceptions.ConnectionError("socket")), False),
])
def test_a_wait_ends_only_on_a_proxy_that_stopped_or_is_gone(container, down):
    sandbox = docker_sandbox.DockerSandbox.__new__(docker_sandbox.DockerSandbox)
    sandbox.container, sandbox.proxy_container = None, container
    assert bool(sandbox.proxy_fault()) is down
