"""Fresh ARC-AGI-1 training instances from a user's Re-ARC checkout (github michaelhodel/re-arc).

Re-ARC is never vendored: the user clones it and sets `track.rearc_path` (or, for a grid that
says `source: rearc` and names no path, the environment variable CARC_REARC_PATH). Its `generators.py` and
`verifiers.py` run in a worker process, not in ours, because:
- they import modules with generic names (`dsl`, `utils`) from the checkout, which must not shadow
  or be shadowed by ours; a separate process keeps its `sys.path` and `sys.modules` apart;
- they draw from the global `random` module; in the worker it is seeded right before every call,
  and our process's global random state is never touched (nothing to save or restore);
- a generator can hang at hard difficulty. A thread cannot be stopped, and an abandoned one would
  keep drawing from the shared `random` and break the next call's reproducibility; `signal.alarm`
  works only in the main thread. A process can be killed wherever it is stuck, from any thread.

Example k of visit v (k = 0 is the test pair, 1..8 the demos) is the first attempt a = 0, 1, ... whose
generation, seeded with `derive_seed(seed, "rearc", task, v, k, a)`, finishes within the time
limit, raises nothing, gives valid grids (at most 30 a side) with input != output that the task's
verifier reproduces, and repeats no earlier input of the instance. So an instance is the same bytes
in every order and run, except where a generation near the time limit finishes on one machine and
not on another.
"""

from __future__ import annotations

import ast
import multiprocessing
import random
import sys
import threading
import traceback
import weakref
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from orchestrator.arc import Demo, Grid, GridError, as_grid
from orchestrator.errors import MachineError
from orchestrator.tasks.base import MAX_DEMOS, ArcInstance, derive_seed

REARC_REPO = "https://github.com/michaelhodel/re-arc"
CONFIG_FIELD = "track.rearc_path"
PATH_ENV = "CARC_REARC_PATH"  # the checkout when a grid asks for source rearc and names none
WORKER_START_S = 120.0

# Why an attempt was rejected; `ReArcSource.rejected` counts them.
TIMEOUT = "timeout"
RAISED = "raised"
WORKER_DIED = "worker died"
INVALID_GRID = "invalid grid"
VERIFIER_MISMATCH = "verifier mismatch"
UNCHANGED = "input equals output"
REPEATED = "repeated input"


class ReArcError(MachineError):
    """Re-ARC cannot serve: a missing or broken checkout, or a task that yields no valid example."""


def _serve(folder: str, conn: Connection) -> None:
    """The worker: import Re-ARC from `folder`, then answer (task, seed, lb, ub) requests."""
    sys.path.insert(0, folder)
    try:
        import generators  # type: ignore[import-not-found]
        import verifiers  # type: ignore[import-not-found]
    except BaseException as e:  # noqa: BLE001 - any failure here is reported, not raised
        conn.send(("fatal", "".join(traceback.format_exception_only(type(e), e)).strip()))
        return
    conn.send(("ready",))
    while True:
        try:
            task_id, seed, diff_lb, diff_ub = conn.recv()
        except EOFError:
            return
        generate = getattr(generators, f"generate_{task_id}", None)
        verify = getattr(verifiers, f"verify_{task_id}", None)
        if generate is None or verify is None:
            missing = "generators.py has no generate_" if generate is None else "verifiers.py has no verify_"
            conn.send(("missing", f"{missing}{task_id}"))
            continue
        try:
            random.seed(seed)
            example = generate(diff_lb=diff_lb, diff_ub=diff_ub)
            reply = ("ok", example["input"], example["output"], verify(example["input"]))
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 - a generator's bug is a rejected attempt
            conn.send((RAISED, f"{type(e).__name__}: {e}"))


class _Worker:
    """One worker process with Re-ARC imported; killed and replaced after a timeout."""

    def __init__(self, folder: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(str(folder), child), daemon=True,
                                    name="carc-rearc-worker")
        self._process.start()
        child.close()
        self._finalizer = weakref.finalize(self, _kill, self._process, self._conn)
        if not self._conn.poll(WORKER_START_S):
            self.stop()
            raise ReArcError(f"Re-ARC in {folder} did not import within {WORKER_START_S:.0f} s")
        try:
            reply = self._conn.recv()
        except EOFError:
            self.stop()
            raise ReArcError(f"the Re-ARC worker for {folder} exited while importing it") from None
        if reply[0] == "fatal":
            self.stop()
            raise ReArcError(
                f"importing Re-ARC from {folder} failed: {reply[1]}\n"
                f"Re-ARC needs its own requirements (matplotlib, tqdm): "
                f"pip install -r {folder / 'requirements.txt'}")

    def generate(self, request: tuple[str, int, float, float], timeout: float) -> tuple[Any, ...]:
        """The worker's reply, or (TIMEOUT | WORKER_DIED, detail); either stops the worker."""
        try:
            self._conn.send(request)
            if self._conn.poll(timeout):
                return self._conn.recv()
        except (EOFError, OSError):
            self.stop()
            return WORKER_DIED, f"exit code {self._process.exitcode}"
        self.stop()
        return TIMEOUT, f"over {timeout} s"

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    def stop(self) -> None:
        self._finalizer()


def _kill(process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
    conn.close()
    if process.is_alive():
        process.kill()
    process.join()


def _generator_ids(generators: Path) -> list[str]:
    """The task ids of the generate_<id> functions defined in generators.py, read without importing."""
    tree = ast.parse(generators.read_text(), filename=str(generators))
    return sorted(node.name.removeprefix("generate_") for node in tree.body
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("generate_"))


class ReArcSource:
    """Instances generated by a Re-ARC checkout: 1 test pair and 8 demos per visit.

    `folder` is the checkout (the folder holding generators.py and verifiers.py). `diff_lb` and
    `diff_ub` bound Re-ARC's difficulty in [0, 1]. Each generation gets `time_limit_s`; an example
    gives up after `max_attempts` rejected attempts with a `ReArcError` naming the task.
    Call `close()` (or use it as a context manager) to stop the worker process early.
    """

    name = "rearc"

    def __init__(self, folder: str | Path, diff_lb: float = 0.0, diff_ub: float = 1.0, *,
                 time_limit_s: float = 2.0, max_attempts: int = 20) -> None:
        self.folder = Path(folder).expanduser().resolve()
        fix = (f"clone it with `git clone {REARC_REPO}` and set {CONFIG_FIELD} in the grid file to "
               f"the clone's folder (the one holding generators.py)")
        if not self.folder.is_dir():
            raise ReArcError(f"{CONFIG_FIELD}: the Re-ARC folder {self.folder} does not exist; {fix}")
        for needed in ("generators.py", "verifiers.py"):
            if not (self.folder / needed).is_file():
                raise ReArcError(f"{CONFIG_FIELD}: {self.folder} has no {needed}, so it is not a "
                                 f"Re-ARC checkout; {fix}")
        if not 0.0 <= diff_lb <= diff_ub <= 1.0:
            raise ValueError(f"difficulty bounds must satisfy 0 <= diff_lb <= diff_ub <= 1, "
                             f"got diff_lb={diff_lb}, diff_ub={diff_ub}")
        if time_limit_s <= 0 or max_attempts < 1:
            raise ValueError(f"need time_limit_s > 0 and max_attempts >= 1, "
                             f"got {time_limit_s} and {max_attempts}")
        self.diff_lb, self.diff_ub = diff_lb, diff_ub
        self.time_limit_s, self.max_attempts = time_limit_s, max_attempts
        self.rejected: Counter[str] = Counter()
        self._ids = _generator_ids(self.folder / "generators.py")
        self._worker: _Worker | None = None
        self._lock = threading.Lock()

    def task_ids(self) -> list[str]:
        return list(self._ids)

    def instance(self, task_id: str, visit: int, seed: int) -> ArcInstance:
        if visit < 0:
            raise ValueError(f"visit must be 0 or more, got {visit}")
        if task_id not in self._ids:
            raise KeyError(f"task {task_id!r} has no generate_{task_id} in {self.folder / 'generators.py'}")
        pairs: list[Demo] = []
        with self._lock:
            for k in range(1 + MAX_DEMOS):
                pairs.append(self._example(task_id, visit, k, seed, {p.input for p in pairs}))
        test, *demos = pairs
        return ArcInstance(task_id, visit, test.input, test.output, tuple(demos))

    def _example(self, task_id: str, visit: int, k: int, seed: int, seen: set[Grid]) -> Demo:
        reasons: Counter[str] = Counter()
        last = ""
        for attempt in range(self.max_attempts):
            attempt_seed = derive_seed(seed, "rearc", task_id, visit, k, attempt)
            reason, detail, demo = self._attempt(task_id, attempt_seed)
            if demo is not None and demo.input in seen:
                reason, detail, demo = REPEATED, "", None
            if demo is not None:
                return demo
            reasons[reason] += 1
            self.rejected[reason] += 1
            last = f"{reason}: {detail}" if detail else reason
        summary = ", ".join(f"{n} {r}" for r, n in reasons.most_common())
        raise ReArcError(
            f"Re-ARC task {task_id}: no valid example after {self.max_attempts} attempts "
            f"(seed {seed}, visit {visit}, example {k}; rejected: {summary}; last: {last}). "
            f"Lower diff_ub (now {self.diff_ub}) or leave {task_id} out of the track's tasks.")

    def _attempt(self, task_id: str, attempt_seed: int) -> tuple[str, str, Demo | None]:
        """One seeded generation: (rejection reason, detail, None) or ("", "", the example)."""
        if self._worker is None or not self._worker.alive:
            self._worker = _Worker(self.folder)
        reply = self._worker.generate((task_id, attempt_seed, self.diff_lb, self.diff_ub),
                                      self.time_limit_s)
        if reply[0] == "missing":
            raise ReArcError(f"Re-ARC task {task_id}: {reply[1]} in {self.folder}")
        if reply[0] != "ok":
            return reply[0], reply[1], None
        _, raw_input, raw_output, verified = reply
        try:
            demo = Demo(as_grid(raw_input), as_grid(raw_output))
        except GridError as e:
            return INVALID_GRID, str(e), None
        try:
            matches = as_grid(verified) == demo.output
        except GridError:
            matches = False
        if not matches:
            return VERIFIER_MISMATCH, "", None
        if demo.input == demo.output:
            return UNCHANGED, "", None
        return "", "", demo

    def close(self) -> None:
        """Stop the worker process; a later instance() starts a new one."""
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def __enter__(self) -> "ReArcSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
