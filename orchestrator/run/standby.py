"""A wiped harness row's next fresh sandbox, prepared while the current instance runs.

A memory-off row's wipe costs a harness restart (openclaw's gateway takes 7-13 s to answer): on
the instance's critical path, every instance. Here the cell keeps one *standby* beside its
sandbox: a second sandbox container on the cell's network, behind the cell's proxy, with its own
new state volume, wiped and prepared exactly as the cell's first sandbox is at the cell's start
(`HarnessState.restore(None)`: empty volume, the harness's config, its processes started). The
wipe before an instance is then a swap: the instance meets the standby, which nothing has served;
the sandbox it replaces is torn down (on a thread of its own) while the next standby is prepared,
both off the critical path.

A standby serves exactly one instance, the one after the wipe that takes it, and one is made only
for a wipe still to come (`wipes`: how many the cell's pass will ask for; the cell's own fresh
sandbox serves the first): a harness start is CPU a 2-core machine does not have to spare (an
openclaw gateway, ~25 s of it). It is torn down with the cell (`close`), and its container and volume carry the run's and cell's labels, so the cell's
teardown and `carc sandboxes prune` remove whatever a killed run left. When a standby cannot be
made, the wipe happens in place, as without one.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import structlog

from harness_adapters.base import InstanceView, Learner, Turn
from orchestrator.protocol import Outcome
from sandboxes.environment import LeftOut, Sandbox

log = structlog.get_logger("carc.standby")


@dataclass
class Prepared:
    """One sandbox with the harness's state and learner built on it."""

    sandbox: Sandbox
    state: Any    # HarnessState (harness_adapters/harness.py)
    learner: Learner


class StandbyCell:
    """The cell's current sandbox and its standby; `.state` and `.learner` stand for the current
    one's, so the runner drives it as it drives a single sandbox."""

    def __init__(self, first: Prepared, make: Callable[[int], Prepared], wipes: int | None = None):
        self.current = first
        self.make = make
        self.wipes_left = wipes  # None: not known, so a standby is always kept ready
        self.generation = 0
        self.pristine = True  # the current sandbox has served no instance since it was prepared
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="carc-standby")
        # retired sandboxes are torn down on a thread of their own: behind the next standby's
        # build on one thread, a teardown (stopping the harness, removing a container and a
        # volume: 2-20 s under load) delayed the standby past the short instance it overlaps
        self.retirer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="carc-retire")
        self.standby: Future | None = None
        self.closed = False
        self.swaps = 0
        self.learner = CurrentLearner(self)
        self.state = CurrentState(self)
        self._prepare_next()

    def _needed(self, serving: bool) -> bool:
        """Whether a wipe still to come will find the current sandbox served (it then takes a
        standby); `serving`: an instance is about to be served by the current sandbox."""
        if self.wipes_left is None:
            return True
        return self.wipes_left - (1 if self.pristine and not serving else 0) > 0

    def _prepare_next(self, serving: bool = False) -> None:
        if self.standby is not None or self.closed or not self._needed(serving):
            return
        self.generation += 1
        generation = self.generation
        self.standby = self.pool.submit(self._build, generation)

    def _build(self, generation: int) -> Prepared | None:
        """The standby, tried twice: a harness's start can fail under load (openclaw's gateway
        gives up when its state lease is not ready in 5 s), and the wipe in place that a failed
        standby falls back to is that same start, on the instance's path."""
        for attempt in (1, 2):
            if self.closed:
                return None
            try:
                return self.make(generation)
            except Exception as exc:
                if attempt == 2:
                    raise
                log.warning("standby_retry", error=f"{type(exc).__name__}: {exc}"[:500])
        return None

    def _retire(self, old: Prepared) -> None:
        try:
            old.learner.close()
        except Exception as exc:
            log.warning("standby_retire_learner", error=str(exc))
        old.sandbox.retire()  # the cell's proxy and network stay: they serve the new one

    def wipe(self) -> None:
        """The next instance's fresh state: the current sandbox when it is fresh already (nothing
        served since it was prepared), else the standby; in place when no standby could be made."""
        if self.wipes_left is not None:
            self.wipes_left = max(0, self.wipes_left - 1)
        if self.pristine:
            self._prepare_next(serving=True)  # for the wipe after this instance
            return
        future, self.standby = self.standby, None
        fresh = None
        if future is not None:
            try:
                fresh = future.result()
            except Exception as exc:  # the wipe in place below; the next standby is tried again
                log.warning("standby_failed", error=f"{type(exc).__name__}: {exc}"[:500])
        if fresh is None:
            self.current.state.wipe()
        else:
            old, self.current = self.current, fresh
            self.swaps += 1
            self.retirer.submit(self._retire, old)
        self.pristine = True
        self._prepare_next(serving=True)

    def restore(self, source: Path | None) -> None:
        self.current.state.restore(source)
        self.pristine = source is None
        self._prepare_next()  # a restored state is a served one: the next wipe takes a standby

    def fault(self) -> str | None:
        return self.current.sandbox.fault()

    def close(self) -> None:
        """Tear down the standby (waiting for one being made) and the retired sandboxes; the
        current one is the cell's (its teardown is the caller's)."""
        self.closed = True
        future, self.standby = self.standby, None
        self.pool.shutdown(wait=True)  # a standby being made is finished, then removed below
        if future is not None:
            try:
                fresh = future.result()
            except Exception:
                fresh = None
            if fresh is not None:
                self.retirer.submit(self._retire, fresh)
        self.retirer.shutdown(wait=True)


class CurrentState:
    """The current sandbox's state volume (a wipe takes the standby)."""

    def __init__(self, cell: StandbyCell):
        self.cell = cell

    def wipe(self) -> None:
        self.cell.wipe()

    def recover(self) -> None:
        self.cell.current.state.recover()

    def snapshot(self, dest: Path) -> list[LeftOut]:
        return self.cell.current.state.snapshot(dest)

    def restore(self, source: Path | None) -> None:
        self.cell.restore(source)

    def collect_logs(self, dest: Path) -> list[Path]:
        return self.cell.current.state.collect_logs(dest)


class CurrentLearner(Learner):
    """The current sandbox's learner."""

    def __init__(self, cell: StandbyCell):  # no state_dir: the harness's state is its volume
        self.cell = cell
        self.name = cell.current.learner.name

    @property
    def talks_after_verdict(self) -> bool:  # type: ignore[override]
        return self.cell.current.learner.talks_after_verdict

    def begin(self, view: InstanceView) -> None:
        self.cell.pristine = False
        self.cell.current.learner.begin(view)

    def act(self) -> Turn:
        return self.cell.current.learner.act()

    def observe(self, outcome: Outcome, attempts_used: int, demos_used: int) -> None:
        self.cell.current.learner.observe(outcome, attempts_used, demos_used)

    def end(self, solved: bool) -> None:
        self.cell.current.learner.end(solved)

    def transcript(self) -> list[dict[str, Any]]:
        return self.cell.current.learner.transcript()

    def prestart(self) -> None:
        self.cell.current.learner.prestart()

    def close(self) -> None:
        self.cell.current.learner.close()
