"""Scores of a run from its instance records (SPEC section 8): budget share and solved share per
cell, budget against exposure index, paired slot-by-slot differences from the stateless floor, and
forward transfer (epilogue minus fresh reference).

Every interval is a bootstrap over tasks, not instances: the instances of one task rise and fall
together, and resampling instances would understate the noise (seed, "What we measure"). A
resample draws the task ids with replacement and takes the mean over all instances of the drawn
tasks, so a task counts with its instance count (a cluster bootstrap). All resamples are one
tasks x resamples count matrix and two matrix products.

Pure: frames in, frames out; no files, no clock; the only randomness is the numpy Generator the
caller passes, so a seed fixes every number.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from orchestrator.records import Event

BUDGET = 16
FLOOR = "stateless-floor"
RESAMPLES = 10_000
LEVEL = 0.95
EXPOSURES = tuple(range(8))

SETTINGS = ("cell", "label", "learner", "row", "model", "effort", "order", "seed", "track")
INSTANCE = ("slot", "phase", "task", "visit", "exposure", "status", "cost", "first_submit_demos",
            "first_answer_correct", "wall_s", "model_calls", "prompt_tokens", "completion_tokens",
            "model_s", "cost_usd")
# Cells that share these settings (and the seed's stream) are served the identical schedule.
SCHEDULE_KEYS = ("track", "model", "effort", "order", "seed")
_COUNTS = ("cost", "model_calls", "prompt_tokens", "completion_tokens")
_FLOATS = ("first_submit_demos", "wall_s", "model_s", "cost_usd")


class Estimate(NamedTuple):
    """A mean with the bounds of its bootstrap interval."""

    mean: float
    lo: float
    hi: float


class PairedDifference(NamedTuple):
    """Mean of a minus b over the slots both cells finished, its interval, and how many slots."""

    mean: float
    lo: float
    hi: float
    pairs: int


_EMPTY = Estimate(float("nan"), float("nan"), float("nan"))


def cell_label(settings: Mapping[str, Any]) -> str:
    """The learner as the report names it: the learner, with its row unless that is memory-on."""
    if settings.get("label"):
        return str(settings["label"])
    learner, row = settings.get("learner"), settings.get("row", "memory-on")
    return str(learner) if row in (None, "memory-on") else f"{learner}-{row}"


# --- the instance frame -------------------------------------------------------------------------

def instances_frame(events_by_cell: Mapping[str, Sequence[Event]],
                    cells: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per finished instance (one with an `instance_end`): the cell's settings, the
    instance's record, `share` (= cost / 16) and `solved`. Unfinished instances are left out."""
    rows = []
    for cell_id, events in events_by_cell.items():
        settings = dict(cells.get(cell_id, {}))
        base = {key: settings.get(key) for key in SETTINGS}
        base["cell"], base["label"] = cell_id, cell_label(settings)
        # a slot has one instance_end; should a log hold two, the later one is the record
        ends = {e.slot: e for e in events if e.type == "instance_end"}
        rows += [{**base, **{key: getattr(e, key) for key in INSTANCE}} for e in ends.values()]
    df = pd.DataFrame(rows, columns=[*SETTINGS, *INSTANCE])
    for key in ("slot", "visit", "exposure", *_COUNTS):
        df[key] = pd.to_numeric(df[key]).fillna(0).astype("int64")
    for key in _FLOATS:
        df[key] = pd.to_numeric(df[key]).astype("float64")
    df["first_answer_correct"] = df["first_answer_correct"].astype("boolean")
    df["share"] = df["cost"] / BUDGET
    df["solved"] = (df["status"] == "solved").astype(bool)
    return df


def unfinished_instances(events_by_cell: Mapping[str, Sequence[Event]]) -> pd.Series:
    """Per cell, the instances that were started but have no `instance_end` yet (in progress)."""
    counts = {}
    for cell_id, events in events_by_cell.items():
        started = {e.slot for e in events if e.type != "instance_end"}
        ended = {e.slot for e in events if e.type == "instance_end"}
        counts[cell_id] = len(started - ended)
    return pd.Series(counts, name="unfinished", dtype="int64")


# --- the bootstrap over tasks -------------------------------------------------------------------

def task_resample_counts(tasks: int, rng: np.random.Generator, n: int = RESAMPLES) -> np.ndarray:
    """An (n, tasks) matrix: how often each task is drawn in each of n resamples of the task ids."""
    draws = rng.integers(0, tasks, size=(n, tasks))
    offsets = np.arange(n)[:, None] * tasks
    return np.bincount((draws + offsets).ravel(), minlength=n * tasks).reshape(n, tasks)


def bootstrap_mean_ci(df: pd.DataFrame, value: str, rng: np.random.Generator,
                      n: int = RESAMPLES, level: float = LEVEL) -> Estimate:
    """The mean of `value` over all rows, with a percentile interval from a cluster bootstrap over
    `df["task"]`: each resample draws the tasks with replacement and takes the mean over every
    instance of the drawn tasks. An empty frame gives NaNs."""
    data = df[["task", value]].dropna()
    if data.empty:
        return _EMPTY
    per_task = data.groupby("task", sort=True)[value].agg(["sum", "count"])
    sums = per_task["sum"].to_numpy(dtype=float)
    counts = per_task["count"].to_numpy(dtype=float)
    weights = task_resample_counts(len(sums), rng, n)
    stats = (weights @ sums) / (weights @ counts)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(stats, [tail, 1.0 - tail])
    return Estimate(float(sums.sum() / counts.sum()), float(lo), float(hi))


# --- the tables ----------------------------------------------------------------------------------

def _stream(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["phase"] == "stream"]


def _mean(values: pd.Series) -> float:
    """Mean of the known values (a nullable column), NaN when none is known."""
    known = values.dropna().astype(float)
    return float(known.mean()) if len(known) else float("nan")


def _cells_in_order(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["cell"]))


def cell_table(df: pd.DataFrame, rng: np.random.Generator, n: int = RESAMPLES,
               level: float = LEVEL) -> pd.DataFrame:
    """Per cell, over the stream phase: instances, budget share and solved share with their
    intervals, pairs bought before the first submission, first-answer accuracy, and the compute
    totals (model calls, tokens, model seconds, dollars: logged, not scored)."""
    stream = _stream(df)
    rows = []
    for cell_id in _cells_in_order(df):
        g = stream[stream["cell"] == cell_id]
        budget = bootstrap_mean_ci(g, "share", rng, n, level)
        solved = bootstrap_mean_ci(g, "solved", rng, n, level)
        label = df.loc[df["cell"] == cell_id, "label"].iloc[0]
        rows.append({
            "cell": cell_id, "label": label, "n": len(g),
            "budget": budget.mean, "budget_lo": budget.lo, "budget_hi": budget.hi,
            "solved": solved.mean, "solved_lo": solved.lo, "solved_hi": solved.hi,
            "first_submit_demos": g["first_submit_demos"].mean(),
            "first_answer_correct": _mean(g["first_answer_correct"]),
            "model_calls": int(g["model_calls"].sum()),
            "prompt_tokens": int(g["prompt_tokens"].sum()),
            "completion_tokens": int(g["completion_tokens"].sum()),
            "tokens": int(g["prompt_tokens"].sum() + g["completion_tokens"].sum()),
            "model_s": float(g["model_s"].sum()),
            "cost_usd": float(g["cost_usd"].sum()),
        })
    return pd.DataFrame(rows, columns=[
        "cell", "label", "n", "budget", "budget_lo", "budget_hi", "solved", "solved_lo",
        "solved_hi", "first_submit_demos", "first_answer_correct", "model_calls",
        "prompt_tokens", "completion_tokens", "tokens", "model_s", "cost_usd"])


def exposure_table(df: pd.DataFrame, exposures: Iterable[int] = EXPOSURES) -> pd.DataFrame:
    """Mean budget share of stream instances by exposure index (times the task was met before),
    rows cells, columns the exposure indices; NaN where a cell has no such instance yet."""
    stream = _stream(df)
    table = stream.groupby(["cell", "exposure"], sort=False)["share"].mean().unstack("exposure")
    return table.reindex(index=_cells_in_order(df), columns=list(exposures)).rename_axis(
        index="cell", columns="exposure")


def paired_slots(df: pd.DataFrame, cell_a: str, cell_b: str, phase: str = "stream") -> pd.DataFrame:
    """The slots both cells finished in `phase`, with task, visit and `diff` = share a - share b.
    Raises ValueError when a slot serves different instances (the cells are not on one schedule)."""
    cols = ["slot", "task", "visit", "share"]
    a = df.loc[(df["cell"] == cell_a) & (df["phase"] == phase), cols]
    b = df.loc[(df["cell"] == cell_b) & (df["phase"] == phase), cols]
    joined = a.merge(b, on="slot", suffixes=("_a", "_b"), validate="one_to_one")
    clash = joined[(joined["task_a"] != joined["task_b"]) | (joined["visit_a"] != joined["visit_b"])]
    if not clash.empty:
        first = clash.iloc[0]
        raise ValueError(
            f"cells {cell_a} and {cell_b} are not on the same schedule: slot {first['slot']} serves "
            f"{first['task_a']} visit {first['visit_a']} in one and {first['task_b']} visit "
            f"{first['visit_b']} in the other; pair only cells with the same track, order and seed")
    return pd.DataFrame({"slot": joined["slot"], "task": joined["task_a"],
                         "visit": joined["visit_a"], "diff": joined["share_a"] - joined["share_b"]})


def paired_difference(df: pd.DataFrame, cell_a: str, cell_b: str, rng: np.random.Generator,
                      n: int = RESAMPLES, level: float = LEVEL,
                      phase: str = "stream") -> PairedDifference:
    """Budget share of `cell_a` minus `cell_b`, slot by slot on their identical schedule, with a
    bootstrap-over-tasks interval. Only slots both cells finished are paired."""
    pairs = paired_slots(df, cell_a, cell_b, phase)
    estimate = bootstrap_mean_ci(pairs, "diff", rng, n, level)
    return PairedDifference(*estimate, pairs=len(pairs))


def differences_from_floor(df: pd.DataFrame, cells: Mapping[str, Mapping[str, Any]],
                           rng: np.random.Generator, n: int = RESAMPLES,
                           level: float = LEVEL) -> pd.DataFrame:
    """For every cell but the floors, its paired difference from the stateless-floor cell with the
    same track, model, effort, order and seed; cells without such a floor are skipped."""
    floors = {tuple(s.get(k) for k in SCHEDULE_KEYS): cell_id
              for cell_id, s in cells.items() if s.get("learner") == FLOOR}
    rows = []
    for cell_id, settings in cells.items():
        floor = floors.get(tuple(settings.get(k) for k in SCHEDULE_KEYS))
        if settings.get("learner") == FLOOR or floor is None:
            continue
        diff = paired_difference(df, cell_id, floor, rng, n, level)
        rows.append({"cell": cell_id, "label": cell_label(settings), "floor": floor,
                     **diff._asdict()})
    return pd.DataFrame(rows, columns=["cell", "label", "floor", "mean", "lo", "hi", "pairs"])


def forward_transfer(df: pd.DataFrame, rng: np.random.Generator, n: int = RESAMPLES,
                     level: float = LEVEL) -> pd.DataFrame:
    """Per cell with both phases finished on some task: epilogue budget share minus the fresh
    reference's, paired by task, with a bootstrap-over-tasks interval. Negative means the
    lifetime helped on held-out tasks."""
    rows = []
    for cell_id in _cells_in_order(df):
        g = df[df["cell"] == cell_id]
        epilogue = g[g["phase"] == "epilogue"].groupby("task")["share"].mean()
        fresh = g[g["phase"] == "fresh"].groupby("task")["share"].mean()
        both = pd.concat({"epilogue": epilogue, "fresh": fresh}, axis=1, join="inner")
        if both.empty:
            continue
        diffs = pd.DataFrame({"task": both.index.to_numpy(),
                              "diff": (both["epilogue"] - both["fresh"]).to_numpy()})
        estimate = bootstrap_mean_ci(diffs, "diff", rng, n, level)
        rows.append({"cell": cell_id, "label": g["label"].iloc[0],
                     "epilogue": both["epilogue"].mean(), "fresh": both["fresh"].mean(),
                     **estimate._asdict(), "tasks": len(both)})
    return pd.DataFrame(rows, columns=["cell", "label", "epilogue", "fresh", "mean", "lo", "hi",
                                       "tasks"])


@dataclass(frozen=True)
class RunAnalysis:
    """Everything the first report shows, computed from one instance frame."""

    cells: pd.DataFrame
    exposure: pd.DataFrame
    floor_differences: pd.DataFrame
    forward_transfer: pd.DataFrame


def analyse(df: pd.DataFrame, cells: Mapping[str, Mapping[str, Any]], rng: np.random.Generator,
            n: int = RESAMPLES, level: float = LEVEL) -> RunAnalysis:
    """The full analysis of a run, in a fixed order of draws from `rng` (so one seed, one report)."""
    return RunAnalysis(cells=cell_table(df, rng, n, level), exposure=exposure_table(df),
                       floor_differences=differences_from_floor(df, cells, rng, n, level),
                       forward_transfer=forward_transfer(df, rng, n, level))
