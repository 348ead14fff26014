"""Stream orders: which task is served at each position of a Continual-ARC stream.

Every order is one process with four settings (SPEC section 5): how many tasks are active at
once, how long a spell of activity lasts, how long a task rests before it may return, and how
often a never-seen task arrives. `sequential`, `workstreams` and `random` are three values of
`StreamSettings`, not three algorithms.

The process, one instance per step:
  1. Never-seen tasks arrive, the k-th at instance k * arrival, in a seeded order that is the
     same for every order at a given seed. They wait in one ready queue with rested tasks,
     first come first served.
  2. While fewer than `active` tasks are in a spell, the longest-waiting ready task starts one;
     its length is drawn around `spell` and capped at the visits it has left.
  3. If no task is active and none is ready, the task whose rest (or arrival) ends soonest is
     pulled forward: the stream never stalls.
  4. One active task, chosen uniformly, is served (with every task active and one spell of all
     its visits, that is: each step a uniformly random task among those with visits left).
  5. A task whose spell is over rests for a draw around `rest` instances; one with all its
     visits is retired.

`Slot.visit` is the task's own 0-based visit count, so the k-th visit of a task maps to the same
instance (a function of seed, task, visit) in every order. Pure: no I/O, no clock, no global
randomness.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from rich.table import Table

from orchestrator.errors import ConfigError

Sampling = Literal["fixed", "poisson", "geometric"]
SAMPLINGS: tuple[str, ...] = ("fixed", "poisson", "geometric")

DEFAULT_VISITS = 8
# The documented workstreams stream (25 tasks): return gaps median 5, p90 48.8, longest 139.
# Gap figures depend only on the number of tasks, never on their ids.
DEFAULT_SEED = 450

# Stream tags keep the arrival order, the process draws and the epilogue on independent streams
# of one seed, so changing the order never changes which tasks arrive first.
_ARRIVAL_TAG = 1
_PROCESS_TAG = 2
_EPILOGUE_TAG = 3


class StreamSettingsError(ConfigError):
    """Settings the stream process cannot run with; the message names the field and the fix."""


@dataclass(frozen=True)
class StreamSettings:
    """The four settings of the stream process, plus visits per task and how lengths are drawn.

    - `active`: tasks in a spell at once; `None` means every task (the interleaved control).
    - `spell`: mean instances in a spell of activity (>= 1).
    - `rest`: mean instances a task rests after a spell before it may return (>= 0).
    - `arrival`: a never-seen task arrives every `arrival` instances (0 = all at step 0).
    - `visits`: visits every task gets, exactly.
    - `sampling`: how spell and rest lengths are drawn around their means: `fixed` (rounded
      mean), `poisson` (spell 1 + Poisson(spell - 1), rest Poisson(rest)) or `geometric`
      (spell geometric on 1, 2, ...; rest geometric on 0, 1, ...).
    """

    active: int | None
    spell: float
    rest: float
    arrival: float
    visits: int = DEFAULT_VISITS
    sampling: Sampling = "geometric"

    def __post_init__(self) -> None:
        if self.active is not None:
            _require_int("active", self.active, minimum=1, hint="or None for every task at once")
        _require_number("spell", self.spell, minimum=1.0, hint="a spell is at least one visit")
        _require_number("rest", self.rest, minimum=0.0, hint="use 0 for no rest")
        _require_number("arrival", self.arrival, minimum=0.0, hint="use 0 for all tasks at step 0")
        _require_int("visits", self.visits, minimum=1, hint="the default is 8")
        if self.sampling not in SAMPLINGS:
            raise StreamSettingsError(
                f"StreamSettings.sampling is {self.sampling!r}; use one of {', '.join(SAMPLINGS)}"
            )


def _require_int(name: str, value: object, *, minimum: int, hint: str) -> None:
    # bool is an int subclass; `active=True` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise StreamSettingsError(
            f"StreamSettings.{name} must be an integer >= {minimum}, got {value!r} ({hint})"
        )
    if value < minimum:
        raise StreamSettingsError(
            f"StreamSettings.{name} must be an integer >= {minimum}, got {value} ({hint})"
        )


def _require_number(name: str, value: object, *, minimum: float, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise StreamSettingsError(
            f"StreamSettings.{name} must be a number >= {minimum:g}, got {value!r} ({hint})"
        )
    if not math.isfinite(value) or value < minimum:
        raise StreamSettingsError(
            f"StreamSettings.{name} must be a finite number >= {minimum:g}, got {value} ({hint})"
        )


PRESETS: dict[str, StreamSettings] = {
    # Blocked practice: one task at a time for all its visits; the next arrives as it finishes.
    "sequential": StreamSettings(active=1, spell=8, rest=0, arrival=8, sampling="fixed"),
    # The track: a few tasks on the go, bursts, long quiet spells, new work arriving. Tuned
    # against the source's figures (gap median 5, p90 49, longest 141): over seeds 0..49 this
    # gives median 4.2 (sd 0.6), p90 50.4 (sd 4.4), longest 122 (sd 16); DEFAULT_SEED gives
    # 5, 48.8, 139.
    "workstreams": StreamSettings(active=4, spell=3, rest=30, arrival=2, sampling="geometric"),
    # Interleaved control: every task active from step 1, one spell of all its visits.
    "random": StreamSettings(active=None, spell=8, rest=0, arrival=0, sampling="fixed"),
}


@dataclass(frozen=True)
class Slot:
    """One position of a stream: the task served and which of its visits this is.

    `visit` is 0-based and counts the task's own earlier visits, so it is also the exposure
    index (times the task was met before); `exposure` repeats it under the analysis name.
    """

    index: int
    task_id: str
    visit: int
    exposure: int


@dataclass(frozen=True)
class GapSummary:
    """The return-gap distribution of a stream: how many instances until a task comes back.

    With no returns (`count` 0) every figure is 0.
    """

    count: int
    median: float
    p90: float
    longest: int
    mean: float


@dataclass(frozen=True)
class Stream:
    """A built stream: its order name, seed and slots. `active_counts[i]` is the number of tasks
    in a spell when slot i was served (empty for a stream not built by `build_stream`)."""

    order: str
    seed: int
    slots: tuple[Slot, ...]
    active_counts: tuple[int, ...] = field(default=(), compare=False)

    def __len__(self) -> int:
        return len(self.slots)

    def task_ids(self) -> list[str]:
        """Task ids in order of first appearance."""
        return list(dict.fromkeys(slot.task_id for slot in self.slots))

    def return_gaps(self) -> list[int]:
        """For every visit after a task's first: its index minus the index of the previous visit."""
        last: dict[str, int] = {}
        gaps: list[int] = []
        for slot in self.slots:
            if slot.task_id in last:
                gaps.append(slot.index - last[slot.task_id])
            last[slot.task_id] = slot.index
        return gaps

    def gap_summary(self) -> GapSummary:
        """Median, 90th percentile (linear interpolation), longest, count and mean of the gaps,
        to two decimals."""
        gaps = np.asarray(self.return_gaps(), dtype=float)
        if gaps.size == 0:
            return GapSummary(count=0, median=0.0, p90=0.0, longest=0, mean=0.0)
        return GapSummary(
            count=int(gaps.size),
            median=round(float(np.median(gaps)), 2),
            p90=round(float(np.percentile(gaps, 90)), 2),
            longest=int(gaps.max()),
            mean=round(float(gaps.mean()), 2),
        )


def resolve_order(order: str | StreamSettings) -> tuple[str, StreamSettings]:
    """The (name, settings) of a preset name or of explicit settings (named `custom`)."""
    if isinstance(order, StreamSettings):
        return "custom", order
    if order not in PRESETS:
        raise StreamSettingsError(
            f"unknown stream order {order!r}; use one of {', '.join(PRESETS)}, "
            "or pass StreamSettings"
        )
    return order, PRESETS[order]


def build_stream(task_ids: Sequence[str], order: str | StreamSettings, seed: int) -> Stream:
    """The stream of `task_ids` under a preset name or explicit settings; deterministic in
    (settings, seed, task list). Every task gets exactly `settings.visits` visits."""
    name, settings = resolve_order(order)
    tasks = _check_tasks(task_ids)
    _check_seed(seed)
    arrival = np.random.default_rng([seed, _ARRIVAL_TAG]).permutation(len(tasks))
    arrival_order = [tasks[i] for i in arrival]
    rng = np.random.default_rng([seed, _PROCESS_TAG])
    slots, active = _run(arrival_order, settings, rng)
    return Stream(order=name, seed=seed, slots=slots, active_counts=active)


def epilogue(task_ids: Sequence[str], seed: int, start_index: int) -> tuple[Slot, ...]:
    """Held-out tasks once each in a seeded order, first visits, indices from `start_index`."""
    tasks = _check_tasks(task_ids)
    _check_seed(seed)
    if isinstance(start_index, bool) or not isinstance(start_index, int) or start_index < 0:
        raise ValueError(f"epilogue start_index must be an integer >= 0, got {start_index!r}")
    perm = np.random.default_rng([seed, _EPILOGUE_TAG]).permutation(len(tasks))
    return tuple(
        Slot(index=start_index + i, task_id=tasks[j], visit=0, exposure=0)
        for i, j in enumerate(perm)
    )


def _check_tasks(task_ids: Sequence[str]) -> list[str]:
    if isinstance(task_ids, str):
        raise ValueError("task_ids must be a sequence of task id strings, not one string")
    tasks = list(task_ids)
    seen: set[str] = set()
    for position, task in enumerate(tasks):
        if not isinstance(task, str) or not task:
            raise ValueError(f"task_ids[{position}] is {task!r}; task ids are non-empty strings")
        if task in seen:
            raise ValueError(f"task_ids[{position}] repeats {task!r}; each task may appear once")
        seen.add(task)
    return tasks


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"stream seed must be an integer >= 0, got {seed!r}")


def _draw(mean: float, sampling: str, rng: np.random.Generator, *, floor: int) -> int:
    """One length around `mean`, never below `floor` (1 for spells, 0 for rests)."""
    if sampling == "fixed" or mean <= floor:
        # Half rounds up (round() would send 2.5 to 2).
        return max(floor, int(math.floor(mean + 0.5)))
    excess = mean - floor
    if sampling == "poisson":
        return floor + int(rng.poisson(excess))
    # Geometric on floor, floor+1, ... with the requested mean.
    return floor - 1 + int(rng.geometric(1.0 / (excess + 1.0)))


def _run(
    arrival_order: list[str], settings: StreamSettings, rng: np.random.Generator
) -> tuple[tuple[Slot, ...], tuple[int, ...]]:
    n = len(arrival_order)
    cap = n if settings.active is None else settings.active
    visits_done = dict.fromkeys(arrival_order, 0)
    # Ready queue, a heap of (ready_at, ticket, task); tickets keep first-come order on ties.
    waiting: list[tuple[float, int, str]] = [
        (k * settings.arrival, k, task) for k, task in enumerate(arrival_order)
    ]
    heapq.heapify(waiting)
    ticket = n
    spell_left: dict[str, int] = {}  # the active set, in activation order
    slots: list[Slot] = []
    active_counts: list[int] = []

    for index in range(n * settings.visits):
        while len(spell_left) < cap and waiting and waiting[0][0] <= index:
            _, _, task = heapq.heappop(waiting)
            spell_left[task] = _spell(task, settings, visits_done, rng)
        if not spell_left:
            # Everyone left is resting or not yet arrived: pull the soonest forward.
            _, _, task = heapq.heappop(waiting)
            spell_left[task] = _spell(task, settings, visits_done, rng)

        tasks = list(spell_left)
        task = tasks[int(rng.integers(len(tasks)))] if len(tasks) > 1 else tasks[0]

        visit = visits_done[task]
        slots.append(Slot(index=index, task_id=task, visit=visit, exposure=visit))
        active_counts.append(len(tasks))
        visits_done[task] = visit + 1
        spell_left[task] -= 1
        if visits_done[task] == settings.visits:
            del spell_left[task]
        elif spell_left[task] == 0:
            del spell_left[task]
            rest = _draw(settings.rest, settings.sampling, rng, floor=0)
            heapq.heappush(waiting, (index + 1 + rest, ticket, task))
            ticket += 1
    return tuple(slots), tuple(active_counts)


def _spell(
    task: str, settings: StreamSettings, visits_done: dict[str, int], rng: np.random.Generator
) -> int:
    left = settings.visits - visits_done[task]
    return min(left, _draw(settings.spell, settings.sampling, rng, floor=1))


_LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
PREVIEW_SLOTS = 40


def task_labels(stream: Stream) -> dict[str, str]:
    """A short label per task, in order of first appearance: A, B, ... then #62, #63, ..."""
    return {
        task: _LABELS[i] if i < len(_LABELS) else f"#{i}"
        for i, task in enumerate(stream.task_ids())
    }


def _compact(labels: Iterable[str]) -> str:
    # One character per slot while every label is one character; spaced otherwise.
    labels = list(labels)
    return "".join(labels) if all(len(label) == 1 for label in labels) else " ".join(labels)


def summary_rows(stream: Stream) -> list[tuple[str, str]]:
    """(field, value) rows describing a stream: its size, activity and return-gap distribution."""
    labels = task_labels(stream)
    per_task: dict[str, int] = {}
    for slot in stream.slots:
        per_task[slot.task_id] = per_task.get(slot.task_id, 0) + 1
    counts = sorted(set(per_task.values()))
    gaps = stream.gap_summary()
    active = np.asarray(stream.active_counts, dtype=float)
    preview = stream.slots[:PREVIEW_SLOTS]
    shown = list(dict.fromkeys(slot.task_id for slot in preview))
    return [
        ("order", stream.order),
        ("seed", str(stream.seed)),
        ("length", str(len(stream.slots))),
        ("tasks", str(len(per_task))),
        ("visits per task", ", ".join(str(c) for c in counts) if counts else "-"),
        (
            "active tasks (mean / max)",
            f"{active.mean():.2f} / {int(active.max())}" if active.size else "-",
        ),
        ("return gaps", str(gaps.count)),
        ("gap median", f"{gaps.median:g}"),
        ("gap 90th percentile", f"{gaps.p90:g}"),
        ("gap longest", str(gaps.longest)),
        ("gap mean", f"{gaps.mean:.1f}"),
        (f"first {len(preview)} slots", _compact(labels[slot.task_id] for slot in preview)),
        ("labels", ", ".join(f"{labels[t]}={t}" for t in shown)),
    ]


def summary_table(stream: Stream) -> Table:
    """A rich table of `summary_rows`, for `carc stream show`."""
    table = Table(title=f"stream {stream.order} (seed {stream.seed})", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in summary_rows(stream):
        table.add_row(name, value)
    return table
