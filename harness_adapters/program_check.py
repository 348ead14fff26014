"""Run a model-written `transform(grid)` on some grids, never in the orchestrator's process.

Each run is a fresh `python3 -I -S` process with CPU-time, memory and output limits and a
wall-clock timeout that kills it. Where it runs is the executor's business: `SandboxExecutor`
runs it in the cell's Docker container that has no network (the default in grids), and
`LocalExecutor` in a host subprocess (grids with `sandbox.engine: process`, and unit tests).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.arc import Demo, Grid, GridError, as_grid, grid_json, grid_list
from sandboxes.environment import ExecResult

DRIVER = r"""
import json, sys
payload = json.loads(sys.stdin.read())
namespace = {"__name__": "carc_program"}
results = []
try:
    exec(compile(payload["source"], "<program>", "exec"), namespace)
    transform = namespace.get("transform")
    if not callable(transform):
        raise NameError("the program defines no function transform(grid)")
except BaseException as exc:
    print(json.dumps({"load_error": f"{type(exc).__name__}: {exc}"[:500]}))
    sys.exit(0)
for grid in payload["inputs"]:
    try:
        out = transform([list(row) for row in grid])
        out = [[int(c) if not isinstance(c, bool) else c for c in row] for row in out]
        results.append({"output": out})
    except BaseException as exc:
        results.append({"error": f"{type(exc).__name__}: {exc}"[:500]})
print(json.dumps({"results": results}))
"""


@dataclass(frozen=True)
class RunResult:
    """The output grid, or why there is none."""

    output: Grid | None
    error: str | None = None


@dataclass(frozen=True)
class ProgramLimits:
    wall_s: float = 10.0
    cpu_s: int = 8
    memory_bytes: int = 1 << 30
    output_bytes: int = 4 << 20


class ProgramExecutor(Protocol):
    def __call__(self, payload: str, limits: ProgramLimits) -> ExecResult: ...


# What a program run on the host gets of the environment: no variable of the orchestrator's (the
# API key among them) — a locale and a path, nothing more.
PROGRAM_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
NOBODY = 65534  # a program run by root on the host runs as nobody: it cannot read
                # /proc/<orchestrator>/environ (root's, mode 0400) nor anything root keeps


def _world_executable(path: str) -> bool:
    """Whether any user can run `path` (every folder on its way searchable by others)."""
    real = Path(os.path.realpath(path))
    try:
        return all(p.stat().st_mode & 0o001 for p in real.parents) and real.stat().st_mode & 0o005 == 0o005
    except OSError:
        return False


def program_python() -> str:
    """The interpreter a host program runs in: carc's own, or (run as nobody, when carc's is in a
    folder only root can enter, such as /root/.pyenv) the system's python3, which the driver's
    stdlib needs are met by."""
    if os.geteuid() != 0 or _world_executable(sys.executable):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if _world_executable(candidate):
            return candidate
    raise RuntimeError(f"sandbox.engine process, run as root: no python3 that user nobody can run "
                       f"({sys.executable} is not); install Debian's python3 or use the docker engine")


def _apply_limits(limits: ProgramLimits):
    def set_limits() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
    return set_limits


def local_executor(payload: str, limits: ProgramLimits) -> ExecResult:
    """The driver in a host subprocess with rlimits, an empty environment, and (when carc runs as
    root) the uid of nobody. The process engine is for machines without Docker: a non-root
    orchestrator's programs share its uid, so keep real keys to the docker engine there."""
    try:
        proc = subprocess.run([program_python(), "-I", "-S", "-c", DRIVER], input=payload.encode(),
                              capture_output=True, timeout=limits.wall_s, env=PROGRAM_ENV, cwd="/",
                              preexec_fn=_apply_limits(limits))
    except subprocess.TimeoutExpired:
        return ExecResult(-9, b"", b"", timed_out=True)
    return ExecResult(proc.returncode, proc.stdout, proc.stderr)


class SandboxExecutor:
    """The driver inside a sandbox (a container with no network), limits set by `ulimit`."""

    def __init__(self, sandbox):
        self.sandbox = sandbox

    def __call__(self, payload: str, limits: ProgramLimits) -> ExecResult:
        # dash takes one limit per ulimit call; && so a failed limit never runs the program.
        script = (f"ulimit -t {limits.cpu_s} && ulimit -v {limits.memory_bytes // 1024} && "
                  f'ulimit -p 64 && exec python3 -I -S -c "$0"')
        return self.sandbox.exec(["sh", "-c", script, DRIVER], input=payload,
                                 timeout=limits.wall_s, cwd="/tmp")


def run_program(source: str, inputs: list[Grid], limits: ProgramLimits = ProgramLimits(),
                executor: ProgramExecutor = local_executor) -> list[RunResult]:
    """Run `transform` on each input in one driver process; every failure becomes a RunResult error."""
    payload = json.dumps({"source": source, "inputs": [grid_list(g) for g in inputs]})
    proc = executor(payload, limits)
    stdout, stderr = proc.text(), proc.stderr.decode("utf-8", "replace")
    if proc.timed_out:
        return [RunResult(None, f"the program ran longer than {limits.wall_s:g} s")] * len(inputs)
    if len(stdout) > limits.output_bytes:
        return [RunResult(None, "the program printed too much output")] * len(inputs)
    try:
        report = json.loads(stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        if proc.returncode in (-9, -24, 137, 152):
            return [RunResult(None, f"the program was killed after using more than "
                                    f"{limits.cpu_s} s of CPU")] * len(inputs)
        tail = stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return [RunResult(None, f"the program crashed: {tail[0][:300]}")] * len(inputs)
    if "load_error" in report:
        return [RunResult(None, report["load_error"])] * len(inputs)
    results = []
    for item in report["results"]:
        if "error" in item:
            results.append(RunResult(None, item["error"]))
            continue
        try:
            results.append(RunResult(as_grid(item["output"])))
        except GridError as exc:
            results.append(RunResult(None, f"the output is not a valid grid: {exc}"))
    return results


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    test_output: Grid | None
    details: str  # what failed, in words the model is shown


def check_program(source: str, pairs: list[Demo], test_input: Grid,
                  limits: ProgramLimits = ProgramLimits(),
                  executor: ProgramExecutor = local_executor) -> CheckResult:
    """Check a program on every pair held (free) and, when it passes all, run it on the test input."""
    results = run_program(source, [p.input for p in pairs] + [test_input], limits, executor)
    failures = []
    for number, (pair, result) in enumerate(zip(pairs, results), start=1):
        if result.error:
            failures.append(f"Pair {number}: {result.error}")
        elif result.output != pair.output:
            failures.append(f"Pair {number}: the output differs from the expected output; "
                            f"the program returned {grid_json(result.output)[:2000]}")
    test = results[-1]
    if failures:
        return CheckResult(False, None, "\n".join(failures))
    if test.error:
        return CheckResult(False, None, f"On the test input: {test.error}")
    return CheckResult(True, test.output, "")
