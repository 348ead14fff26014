"""The cell's long-lived program checker in a real no-network container (harness_adapters/program_check).

Every check is compared with what a fresh `docker exec` per check (the executor it replaced,
kept here as the reference) gives for the same program, and the checker's failure modes are run
for real: a program that loops, crashes, prints without end, writes over the checker's replies,
kills or stops the checker, or leaves a process behind. Each must cost only its own check.
"""

from __future__ import annotations

import pytest

from harness_adapters.program_check import DRIVER, ProgramLimits, SandboxExecutor, run_program
from sandboxes.docker_sandbox import SANDBOX_USER, DockerSandbox, SandboxSpec
from sandboxes.environment import SandboxError
from tests.docker_fixtures import base_image, client, run_id, _prune_at_end  # noqa: F401

pytestmark = pytest.mark.docker

FLIP = "def transform(grid):\n    return [row[::-1] for row in grid]\n"
GRID = ((5, 6, 7),)
FAST = ProgramLimits(wall_s=2, cpu_s=1)


@pytest.fixture(scope="module")
def sandbox(base_image, run_id):  # noqa: F811
    box = DockerSandbox(SandboxSpec(base_image, run=run_id, cell="program-checker", proxy=None,
                                    volume=False)).start()
    yield box
    box.teardown()


@pytest.fixture
def checker(sandbox):
    executor = SandboxExecutor(sandbox)
    yield executor
    executor.close()
    sandbox.end_processes()


def exec_per_check(sandbox):
    """The reference: the driver in a fresh `python3 -I -S` by its own `docker exec`, limits by ulimit."""
    def run(payload: str, limits: ProgramLimits):
        script = (f"ulimit -t {limits.cpu_s} && ulimit -v {limits.memory_bytes // 1024} && "
                  f'ulimit -p 64 && exec python3 -I -S -c "$0"')
        return sandbox.exec(["sh", "-c", script, DRIVER], input=payload, timeout=limits.wall_s, cwd="/tmp")
    return run


def still_works(checker) -> None:
    assert run_program(FLIP, [GRID], executor=checker)[0].output == ((7, 6, 5),)


LIST_PROCESSES = """
import os
for pid in os.listdir("/proc"):
    try:
        uid = [l for l in open(f"/proc/{pid}/status") if l.startswith("Uid:")][0].split()[1]
        args = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").replace(b"\\n", b" ").decode()
    except (OSError, IndexError, ValueError):
        continue
    if pid.isdigit() and int(pid) not in (os.getpid(), os.getppid()) and uid == "1000" and args:
        print(args[:80])
"""


def processes_of_the_sandbox_user(sandbox) -> list[str]:
    """The command lines of the uid-1000 processes in the container, besides the one asking (and
    the `timeout` that runs it)."""
    return sandbox.exec(["python3", "-I", "-S", "-c", LIST_PROCESSES], timeout=30).text().splitlines()


SAME_AS_EXEC = {  # name: (source, wall clock in s)
    "right": (FLIP, 20),
    "wrong shape": ("def transform(grid):\n    return [[1, 2], [3]]\n", 20),
    "no transform": ("x = 1\n", 20),
    "syntax error": ("def transform(grid) return grid\n", 20),
    "raises": ("def transform(grid):\n    raise ValueError('no')\n", 20),
    "exit at load": ("import sys\nsys.exit(4)\n", 20),
    "hard exit": ("import os\ndef transform(grid):\n    os._exit(3)\n", 20),
    "segfault": ("import ctypes\ndef transform(grid):\n    return ctypes.string_at(0)\n", 20),
    "memory": ("def transform(grid):\n    x = bytearray(4 << 30)\n    return grid\n", 20),
    "cpu": ("def transform(grid):\n    while True:\n        pass\n", 60),
    "sleeps": ("import time\ndef transform(grid):\n    time.sleep(60)\n", 2),
    "huge output": ("import sys\ndef transform(grid):\n    sys.stdout.write('x' * (5 << 20))\n    return grid\n", 20),
    "prints then answers": ("def transform(grid):\n    print('thinking', [1, 2])\n    return grid\n", 20),
    "stderr then crash": ("import sys, os\ndef transform(grid):\n    print('boom: ' + 'y' * 50, file=sys.stderr)\n"
                          "    sys.stderr.flush()\n    os._exit(2)\n", 20),
    "reads stdin": ("import sys\ndef transform(grid):\n    return [[len(sys.stdin.read())]]\n", 20),
    "late thread": ("import threading, time\ndef transform(grid):\n"
                    "    threading.Thread(target=lambda: (time.sleep(0.2), print('late'))).start()\n"
                    "    return grid\n", 20),
    "atexit": ("import atexit\natexit.register(lambda: print('bye'))\ndef transform(grid):\n    return grid\n", 20),
    "many grids": (FLIP, 20),
}


@pytest.mark.parametrize("name", sorted(SAME_AS_EXEC))
def test_the_checker_gives_what_a_docker_exec_per_check_gives(sandbox, checker, name):
    source, wall_s = SAME_AS_EXEC[name]
    inputs = [GRID, ((1, 2), (3, 4))] if name == "many grids" else [GRID]
    limits = ProgramLimits(wall_s=wall_s, cpu_s=1, memory_bytes=256 << 20, output_bytes=1 << 20)
    expected = run_program(source, inputs, limits, exec_per_check(sandbox))
    assert run_program(source, inputs, limits, checker) == expected
    still_works(checker)
    assert checker.starts == 1  # no program needed a new checker


def test_a_program_that_loops_is_cut_at_the_wall_clock_and_the_checker_goes_on(checker):
    [result] = run_program("import time\ndef transform(grid):\n    time.sleep(60)\n", [GRID], FAST, checker)
    assert result.error == "the program ran longer than 2 s"
    still_works(checker)
    assert checker.starts == 1


def test_huge_output_is_capped_in_the_sandbox_and_the_checker_goes_on(checker):
    source = "import sys\ndef transform(grid):\n    while True:\n        sys.stdout.write('z' * 65536)\n"
    [result] = run_program(source, [GRID], ProgramLimits(wall_s=2, cpu_s=2, output_bytes=1 << 20), checker)
    assert result.error == "the program ran longer than 2 s"  # as before: the clock is judged first
    source = "import sys\ndef transform(grid):\n    sys.stdout.write('z' * (40 << 20))\n    return grid\n"
    [result] = run_program(source, [GRID], ProgramLimits(output_bytes=1 << 20), checker)
    assert result.error == "the program printed too much output"
    still_works(checker)
    assert checker.starts == 1


def test_a_program_that_kills_the_checker_crashes_alone_and_a_new_checker_takes_the_next(checker):
    for source in ("import os\ndef transform(grid):\n    os.kill(os.getppid(), 9)\n    return grid\n",
                   "import os\ndef transform(grid):\n    os.kill(-1, 9)\n    return grid\n"):
        [result] = run_program(source, [GRID], FAST, checker)
        assert result.output is None and result.error.startswith("the program crashed"), result
        still_works(checker)
    assert checker.starts == 3


def test_a_program_that_stops_the_checker_times_out_and_the_checker_is_replaced(checker):
    source = "import os, signal\ndef transform(grid):\n    os.kill(os.getppid(), signal.SIGSTOP)\n    return grid\n"
    [result] = run_program(source, [GRID], FAST, checker)
    assert result.error == "the program ran longer than 2 s"
    still_works(checker)
    assert checker.starts == 2


def test_garbage_and_forged_replies_on_the_checkers_channel_are_skipped(checker):
    """A program can reach the checker's own stdout (/proc/<checker>/fd/1): text there, and a
    line made to look like a reply to another check, are told from the real reply."""
    source = ("import os\ndef transform(grid):\n"
              "    with open(f'/proc/{os.getppid()}/fd/1', 'w') as out:\n"
              "        out.write('garbage\\nCARC-CHECK 0000 {\"returncode\": 0}\\nno newline')\n"
              "    return [[1]]\n")
    [result] = run_program(source, [GRID], FAST, checker)
    assert result.output == ((1,),) and result.error is None
    still_works(checker)
    assert checker.starts == 1


def test_a_malformed_reply_of_endless_size_ends_the_check_not_the_host(checker):
    source = ("import os\ndef transform(grid):\n"
              "    with open(f'/proc/{os.getppid()}/fd/1', 'wb') as out:\n"
              "        while True:\n            out.write(b'g' * 65536)\n")
    limits = ProgramLimits(wall_s=3, cpu_s=3, output_bytes=1 << 16)
    [result] = run_program(source, [GRID], limits, checker)
    # read up to its cap (then the checker is replaced), or its end cut by the clock
    assert result.output is None and ("wrote over the checker's replies" in result.error
                                      or result.error == "the program ran longer than 3 s"), result
    still_works(checker)


def test_nothing_of_the_sandbox_user_outlives_a_check(sandbox, checker):
    """After each check the checker kills every other process of its uid: what a program left
    running (here a stray process of that uid, started beside it) is gone before the next."""
    assert sandbox.exec(["sh", "-c", "sleep 300 >/dev/null 2>&1 &"], timeout=30).ok
    assert any(p.startswith("sleep 300") for p in processes_of_the_sandbox_user(sandbox))
    still_works(checker)
    left = processes_of_the_sandbox_user(sandbox)
    assert len(left) == 1 and left[0].startswith("python3 -I -S -c"), left  # the checker alone


def test_a_stopped_sandbox_is_the_infrastructure_s_fault(base_image, run_id):  # noqa: F811
    box = DockerSandbox(SandboxSpec(base_image, run=run_id, cell="program-checker-killed", proxy=None,
                                    volume=False)).start()
    try:
        executor = SandboxExecutor(box)
        still_works(executor)
        box.container.kill()
        with pytest.raises(SandboxError):
            run_program(FLIP, [GRID], FAST, executor)
    finally:
        box.teardown()
