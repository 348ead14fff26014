"""Run a model-written `transform(grid)` on some grids, never in the orchestrator's process.

Each run is a process of its own with CPU-time, memory and output limits and a wall-clock
timeout that kills it. Where it runs is the executor's business: `SandboxExecutor` runs it in
the cell's Docker container that has no network (the default in grids), as a child of the
cell's one long-lived checker there, and `local_executor` in a fresh host `python3 -I -S`
subprocess (grids with `sandbox.engine: process`, and unit tests).
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.arc import Demo, Grid, GridError, as_grid, grid_json, grid_list
from sandboxes.environment import ExecResult, SandboxError

# What runs a program: `payload` ({"source", "inputs"}) in, one JSON line out (the last line of
# stdout): {"results": [{"output": grid} | {"error": why}, ...]} or {"load_error": why}.
DRIVER_BODY = r"""
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
# A fresh interpreter per program (the host process engine): the payload on stdin.
DRIVER = "import json, sys\npayload = json.loads(sys.stdin.read())\n" + DRIVER_BODY


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
    orchestrator's programs share its uid, so a grid with a real key is refused there
    (`orchestrator.run.cell_services.host_programs_refusal`)."""
    try:
        proc = subprocess.run([program_python(), "-I", "-S", "-c", DRIVER], input=payload.encode(),
                              capture_output=True, timeout=limits.wall_s, env=PROGRAM_ENV, cwd="/",
                              preexec_fn=_apply_limits(limits), start_new_session=True)  # Ctrl-C is the run's
    except subprocess.TimeoutExpired:
        return ExecResult(-9, b"", b"", timed_out=True)
    return ExecResult(proc.returncode, proc.stdout, proc.stderr)


# The checker: one `python3 -I -S` per cell in its no-network sandbox, fed over its stdin. It
# never runs a program itself: each check is a child forked from it (its memory a copy of the
# idle checker's) that takes its limits (CPU time, address space, 64 processes), runs the
# driver and exits as the interpreter would; the checker kills it at the wall clock, collects
# its output through pipes of its own (capped), and after every check kills every other process
# of its uid in the container (kill(-1) spares the caller), so nothing a program started
# outlives its check. A request is a header line and a payload line; the one reply line is
# `REPLY_MARK <id> {json}`, so anything else on the channel (a program writing to the checker's
# own stdout through /proc) is told apart and skipped.
REPLY_MARK = "CARC-CHECK"
STDERR_KEPT = 1 << 20  # bytes of a program's stderr kept (its tail: the host reads its last line)
CHECKER = r"""
import codecs, json, os, resource, select, signal, sys, time

CHILD = "import json, sys\npayload = json.loads(_payload)\ndel _payload\n" + sys.argv[1]
STDERR_KEPT = int(sys.argv[2])
MARK = sys.argv[3]
os.chdir("/tmp")
pending = bytearray()


def read_line():
    while True:
        end = pending.find(b"\n")
        if end >= 0:
            line = bytes(pending[:end])
            del pending[:end + 1]
            return line
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return None
        pending.extend(chunk)


def child(payload, out_w, err_w, header):
    code = 125
    try:
        os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 16)
        resource.setrlimit(resource.RLIMIT_CPU, (header["cpu_s"], header["cpu_s"]))
        resource.setrlimit(resource.RLIMIT_AS, (header["memory_bytes"], header["memory_bytes"]))
        resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))
        text = payload.decode("utf-8")
        code = 0
        try:  # the driver as a `python3 -c` main module: SystemExit and tracebacks as it has them
            exec(compile(CHILD, "<string>", "exec"), {"__name__": "__main__", "_payload": text,
                                                      "__builtins__": __builtins__})
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code & 0xFF
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        # and then the interpreter's exit: non-daemon threads, atexit, the streams flushed
        try:
            threading = sys.modules.get("threading")
            if threading is not None:
                threading._shutdown()
        except BaseException:
            pass
        try:
            import atexit
            atexit._run_exitfuncs()
        except BaseException:
            pass
        try:
            sys.stdout.flush()
        except BaseException:
            code = code or 120
        try:
            sys.stderr.flush()
        except BaseException:
            pass
    finally:
        os._exit(code)


def kill_others():
    try:
        os.kill(-1, signal.SIGKILL)  # every other process of this uid; never the caller
    except OSError:
        pass


def run(header, payload):
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(payload, out_w, err_w, header)
    os.close(out_w)
    os.close(err_w)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    deadline = started + header["wall_s"]
    cap = header["output_bytes"] + 1
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    out, out_len, err = [], 0, bytearray()
    fds = [out_r, err_r]
    status = None
    timed_out = False
    while status is None or fds:
        if status is None:
            done, status_now = os.waitpid(pid, os.WNOHANG)
            if done:
                status = status_now
                kill_others()  # what it left behind dies, so the pipes end
                deadline = time.monotonic() + 5
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
                kill_others()
                _, status = os.waitpid(pid, 0)
                deadline = time.monotonic() + 5
                continue
            wait = [pidfd] if pidfd is not None else []
            ready = select.select(fds + wait, [], [], left if pidfd is not None else min(left, 0.002))[0]
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = select.select(fds, [], [], left)[0]
        for fd in ready:
            if fd == pidfd:
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                fds.remove(fd)
                os.close(fd)
            elif fd == out_r:
                if out_len < cap:
                    text = decoder.decode(data)
                    out.append(text[:cap - out_len])
                    out_len += len(out[-1])
            else:
                err += data
                if len(err) > 2 * STDERR_KEPT:
                    del err[:-STDERR_KEPT]
    for fd in fds:
        os.close(fd)
    if pidfd is not None:
        os.close(pidfd)
    if out_len < cap:
        out.append(decoder.decode(b"", final=True)[:cap - out_len])
    if os.WIFSIGNALED(status):
        code = 128 + os.WTERMSIG(status)  # as `timeout` and a shell report it
    else:
        code = os.WEXITSTATUS(status)
    return {"returncode": code, "timed_out": timed_out, "stdout": "".join(out),
            "stderr": bytes(err[-STDERR_KEPT:]).decode("utf-8", "replace")}


while True:
    line = read_line()
    if line is None:
        break
    header = json.loads(line)
    payload = read_line()
    if payload is None or len(payload) != header["size"]:
        sys.exit(f"checker: a payload of {header['size']} bytes was announced, not sent")
    reply = run(header, payload)
    data = (MARK + " " + header["id"] + " " + json.dumps(reply, ensure_ascii=False) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]
"""
CHECKER_GRACE_S = 5.0  # past a check's wall clock, the host's wait for the checker's reply


class SandboxExecutor:
    """Programs run in a sandbox (a container with no network) by the cell's one long-lived
    checker process (`CHECKER`), started on the first check. A checker that does not answer in
    time, dies, or answers with something that is not its reply is ended with every process of
    the sandbox's user and started again for the next check; the check it failed gets the
    verdict its program earned (over the time limit, or crashed), unless the sandbox itself
    stopped, which is the infrastructure's fault (SandboxError)."""

    def __init__(self, sandbox):
        self.sandbox = sandbox
        self.checker = None
        self.starts = 0  # checkers started (1 + restarts), for tests and benches

    def __call__(self, payload: str, limits: ProgramLimits) -> ExecResult:
        from sandboxes.docker_sandbox import LineTooLong  # docker is imported only with a sandbox

        request = secrets.token_hex(8)
        header = json.dumps({"id": request, "wall_s": limits.wall_s, "cpu_s": limits.cpu_s,
                             "memory_bytes": limits.memory_bytes, "output_bytes": limits.output_bytes,
                             "size": len(payload.encode())})
        deadline = time.monotonic() + limits.wall_s + CHECKER_GRACE_S
        for attempt in range(2):
            checker = self._checker()
            try:
                checker.send_line(header, timeout=CHECKER_GRACE_S)
                checker.send_line(payload, timeout=CHECKER_GRACE_S)
                break
            except OSError:  # the checker was gone before the check began: a new one takes it
                self._end_checker()
                if attempt == 1:
                    return self._failed("the program checker did not take the program")
        mark = f"{REPLY_MARK} {request} "
        # a reply holds the output (<= output_bytes + 1 characters) and the stderr tail, as JSON
        cap = 6 * (limits.output_bytes + 1 + STDERR_KEPT) + 4096
        skipped = 0
        while True:
            try:
                line = checker.read_line(max(deadline - time.monotonic(), 0.001), limit=cap)
            except TimeoutError:
                return self._failed(None)
            except LineTooLong:
                return self._failed("the program wrote over the checker's replies")
            if line is None:
                return self._failed("the program ended the checker process that ran it")
            at = line.find(mark)
            if at < 0:  # not the reply (another program's late words on the checker's stdout)
                skipped += len(line) + 1
                if skipped > cap:
                    return self._failed("the program wrote over the checker's replies")
                continue
            try:
                reply = json.loads(line[at + len(mark):])
                return ExecResult(int(reply["returncode"]), str(reply["stdout"]).encode(),
                                  str(reply["stderr"]).encode(), bool(reply["timed_out"]))
            except (ValueError, KeyError, TypeError):
                skipped += len(line) + 1  # a line only made to look like the reply
                continue

    def _checker(self):
        if self.checker is None:
            self.checker = self.sandbox.open_process(
                ["python3", "-I", "-S", "-c", CHECKER, DRIVER_BODY, str(STDERR_KEPT), REPLY_MARK])
            self.starts += 1
        return self.checker

    def _failed(self, why: str | None) -> ExecResult:
        """The check's verdict when its checker failed: the sandbox's fault if it stopped
        (raised), else the program's: over the time limit (`why` None) or crashed (`why`)."""
        self._end_checker()
        if why is None:
            return ExecResult(-9, b"", b"", timed_out=True)
        return ExecResult(1, b"", why.encode())

    def _end_checker(self) -> None:
        """End the checker and whatever it ran (every process of the sandbox's user); a sandbox
        that stopped is not brought back here: SandboxError, the infrastructure's fault."""
        self.close()
        fault = self.sandbox.fault()
        if fault:
            raise SandboxError(f"program check: {fault}")
        self.sandbox.end_processes()

    def close(self) -> None:
        """Let the checker go (its stdin closed, it exits); the sandbox's teardown ends the rest."""
        checker, self.checker = self.checker, None
        if checker is not None:
            try:
                checker.close(timeout=0)
            except Exception:  # noqa: BLE001
                pass


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


# Failing pairs shown in full (what the program returned) in a failed check's message; the rest
# are named by number. A program that misses a task's rule tends to miss every pair, and a learner
# holding many pairs (a demo cache) would otherwise be sent every returned grid again on every
# retry: up to ~11 KB a message, resent with the whole conversation on each later call.
SHOWN_FAILURES = 3


def _failure_details(failures: list[tuple[int, str]], held: int) -> str:
    lines = [text for _, text in failures[:SHOWN_FAILURES]]
    rest = [number for number, _ in failures[SHOWN_FAILURES:]]
    if rest:
        lines.append(f"{len(failures)} of the {held} pairs failed; also pair"
                     f"{'s' if len(rest) > 1 else ''} {', '.join(map(str, rest))}.")
    return "\n".join(lines)


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
    failures: list[tuple[int, str]] = []
    for number, (pair, result) in enumerate(zip(pairs, results), start=1):
        if result.error:
            failures.append((number, f"Pair {number}: {result.error}"))
        elif result.output != pair.output:
            failures.append((number, f"Pair {number}: the output differs from the expected output; "
                                     f"the program returned {grid_json(result.output)[:2000]}"))
    test = results[-1]
    if failures:
        return CheckResult(False, None, _failure_details(failures, len(pairs)))
    if test.error:
        return CheckResult(False, None, f"On the test input: {test.error}")
    return CheckResult(True, test.output, "")
