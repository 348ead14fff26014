"""Scores of a run from its instance records (SPEC section 8): per cell budget share, solved share,
failures, first-answer accuracy, pairs before the first submission and cost-0 returning instances;
budget against exposure index and against the gap since a task was last seen; the same measures
pooled over stream orders; paired slot-by-slot differences from the stateless floor, from each
row's memory-off twin and from the demo-cache floor; and forward transfer (epilogue minus fresh
reference). `run_measures` returns every table, CL-Bench's and PATH-Bench's included
(`orchestrator.analysis.tables`).

Every interval is a bootstrap over tasks, not instances: the instances of one task rise and fall
together, and resampling instances would understate the noise (seed, "What we measure"). A
resample draws the task ids with replacement and takes the mean over all instances of the drawn
tasks, so a task counts with its instance count (a cluster bootstrap). All resamples are one
resamples x tasks count matrix times a tasks x sums matrix (`task_bootstrap`); one matrix per
distinct task list serves every cell and every table of a run (`TaskResamples`).

Every paired difference also states its sensitivity from the same resamples (`sensitivity`): the
saving beyond which the data exclude at 95% one-sided, and the minimum detectable effect at 80%
power, so a null shows how small an effect the run could have seen.

Pure: frames in, frames out; no files, no clock; the only randomness is the numpy Generator the
caller passes, so a seed fixes every number.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from orchestrator.records import Event, last_stop
from orchestrator.rows import label, row_name, twins_of

BUDGET = 16
FLOOR = "stateless-floor"
DEMO_CACHE = "demo-cache-floor"
RESAMPLES = 10_000
LEVEL = 0.95  # every interval and test: alpha = 1 - LEVEL
POWER = 0.8  # the power at which a paired difference's minimum detectable effect is stated
EXPOSURES = tuple(range(8))

SETTINGS = ("cell", "label", "learner", "row", "model", "effort", "order", "seed", "track")
INSTANCE = ("user", "round", "slot", "phase", "task", "visit", "exposure", "status", "failure_kind",
            "reason", "cost", "demos_used", "attempts_used", "malformed", "first_submit_demos",
            "first_answer_correct", "wall_s", "model_calls", "prompt_tokens", "completion_tokens",
            "model_s", "cost_usd", "level", "budget")
# Cells that share these settings (and the seed's stream) are served the identical schedule.
SCHEDULE_KEYS = ("track", "model", "effort", "order", "seed")
# Lower edges of the gap bins (instances since the task was last served); the last bin is open.
GAP_EDGES = (1, 2, 4, 8, 16, 32, 64)
_COUNTS = ("cost", "demos_used", "attempts_used", "malformed", "model_calls", "prompt_tokens",
           "completion_tokens")
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


class Sensitivity(NamedTuple):
    """How small an effect a paired difference a - b (negative: a saves) could have shown, in its
    own units, both >= 0: savings beyond `bound` are excluded, one-sided, at the level; `mde` is
    the effect a two-sided test at 1 - level would detect with the power."""

    bound: float | np.ndarray
    mde: float | np.ndarray


_EMPTY = Estimate(float("nan"), float("nan"), float("nan"))


def cell_label(settings: Mapping[str, Any]) -> str:
    """The learner as the report names it: the learner, with its row unless that is memory-on."""
    if settings.get("label"):
        return str(settings["label"])
    return label(str(settings.get("learner")), settings.get("row"))


# --- the instance frame -------------------------------------------------------------------------

def instances_frame(events_by_cell: Mapping[str, Sequence[Event]],
                    cells: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per finished instance (one with an `instance_end`): the cell's settings, the
    instance's record, `share` (= cost / 16) and `solved`. Unfinished instances are left out.
    `user` and `round` are a collective cell's (null in a grid cell, whose one stream is the
    cell's)."""
    rows = []
    for cell_id, events in events_by_cell.items():
        settings = dict(cells.get(cell_id, {}))
        base = {key: settings.get(key) for key in SETTINGS}
        base["cell"], base["label"] = cell_id, cell_label(settings)
        # a user's slot has one instance_end; should a log hold two, the later one is the record
        ends = {(e.user, e.slot): e for e in events if e.type == "instance_end"}
        rows += [{**base, **{key: getattr(e, key) for key in INSTANCE}} for e in ends.values()]
    df = pd.DataFrame(rows, columns=[*SETTINGS, *INSTANCE])
    for key in ("slot", "visit", "exposure", *_COUNTS):
        df[key] = pd.to_numeric(df[key]).fillna(0).astype("int64")
    for key in _FLOATS:
        df[key] = pd.to_numeric(df[key]).astype("float64")
    df["first_answer_correct"] = df["first_answer_correct"].astype("boolean")
    # an instance's own full charge (arc3: 5 x the level's baseline), else the grid tracks' 16
    df["budget"] = pd.to_numeric(df["budget"]).fillna(BUDGET).astype("int64")
    for key in ("level", "user", "round"):
        df[key] = pd.to_numeric(df[key]).astype("Int64")
    df["share"] = df["cost"] / df["budget"]
    df["solved"] = (df["status"] == "solved").astype(bool)
    return df


def failure_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell, its failed instances of every phase (stream, epilogue, fresh reference) by kind:
    counts of the `failure_kind` of their records (`unrecorded` for records older than kinds)."""
    failed = df[~df["solved"]]
    kinds = (failed["failure_kind"] if "failure_kind" in failed else pd.Series(None, index=failed.index,
                                                                               dtype=object)).fillna("unrecorded")
    table = pd.crosstab(failed["cell"], kinds).reindex(_cells_in_order(df), fill_value=0)
    table.insert(0, "instances failed", table.sum(axis=1))
    return table.rename_axis(index="cell", columns=None).reset_index()


def unfinished_instances(events_by_cell: Mapping[str, Sequence[Event]]) -> pd.Series:
    """Per cell, the instances that were started but have no `instance_end` yet (in progress)."""
    counts = {}
    for cell_id, events in events_by_cell.items():
        started = {e.slot for e in events if e.type not in ("instance_end", "stopped")}
        ended = {e.slot for e in events if e.type == "instance_end"}
        counts[cell_id] = len(started - ended)
    return pd.Series(counts, name="unfinished", dtype="int64")


def stopped_cells(events_by_cell: Mapping[str, Sequence[Event]]) -> pd.DataFrame:
    """Cells whose latest record is a stop at a limit (limits.usd_per_cell): cell, the slot not
    begun, dollars spent and the reason. A cell that ran on after a raised limit is not listed."""
    rows = [{"cell": cell_id, "slot": stop.slot, "usd_spent": stop.cost_usd, "reason": stop.reason or ""}
            for cell_id, events in events_by_cell.items() if (stop := last_stop(list(events))) is not None]
    return pd.DataFrame(rows, columns=["cell", "slot", "usd_spent", "reason"])


def infrastructure_faults(events_by_cell: Mapping[str, Sequence[Event]]) -> pd.DataFrame:
    """Every infrastructure fault journaled (a proxy or container that died under an instance):
    cell, slot, task and what broke. None of them was charged; each instance ran again."""
    rows = [{"cell": cell_id, "slot": e.slot, "task": e.task, "fault": e.error or ""}
            for cell_id, events in events_by_cell.items() for e in events if e.type == "infrastructure_fault"]
    return pd.DataFrame(rows, columns=["cell", "slot", "task", "fault"])


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


class TaskResamples:
    """Resamples of task lists from one generator: for each distinct list of task ids, one
    `task_resample_counts` matrix, drawn the first time the list is asked for and reused after.

    Every cell on one schedule has the same tasks, so a 100-cell run draws once per task list,
    not once per cell and table; each cell's interval is still the bootstrap of its own tasks.
    The draws depend on the order of the requests, so a fixed order of tables fixes every number.
    """

    def __init__(self, rng: np.random.Generator, n: int = RESAMPLES):
        self.rng = rng
        self.n = n
        self._counts: dict[tuple, np.ndarray] = {}

    def counts(self, tasks: Sequence[Any]) -> np.ndarray:
        """The (n, len(tasks)) float matrix of draw counts of `tasks`, in the order given."""
        key = tuple(tasks)
        if key not in self._counts:
            self._counts[key] = task_resample_counts(len(key), self.rng, self.n).astype(float)
        return self._counts[key]


Resampling = np.random.Generator | TaskResamples
# Named per-task totals (arrays over resamples, or 0-d for the point estimate) -> named statistics.
Statistic = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def resamples_of(rng: Resampling, n: int = RESAMPLES) -> TaskResamples:
    """`rng` itself when it already holds resamples (then `n` is its own), else fresh ones."""
    return rng if isinstance(rng, TaskResamples) else TaskResamples(rng, n)


def task_bootstrap(frame: pd.DataFrame, by: str, statistic: Statistic, rng: Resampling,
                   n: int = RESAMPLES, level: float = LEVEL,
                   differences: Sequence[str] = ()) -> pd.DataFrame:
    """A cluster bootstrap over tasks of any statistic of sums, for every value of `by` at once.

    `frame` holds `by`, `task` and the numeric columns to sum (NaN counts as 0). Per key, each
    column is summed per task; a resample draws the key's tasks with replacement and weights the
    task totals by the draw counts (one matrix product); `statistic` turns the named totals into
    named statistics. Returns one row per key (index, in frame order) with, per statistic `s`,
    `s` (from all tasks once) and `s_lo`, `s_hi` (percentile interval at `level`). A resample
    where a statistic is undefined (say 0/0: no drawn task has such an instance) is left out of
    that statistic's quantiles. Each statistic named in `differences` (a paired difference a - b)
    also gets `s_bound` and `s_mde`, its `sensitivity`, from the same resamples."""
    sums = [c for c in frame.columns if c not in (by, "task")]
    with np.errstate(divide="ignore", invalid="ignore"):
        names = list(statistic({s: np.zeros(1) for s in sums}))
    unknown = [d for d in differences if d not in names]
    if unknown:
        raise ValueError(f"task_bootstrap: differences {unknown} are not statistics of "
                         f"`statistic` (it gives {names}); name one of those")
    columns = [f"{s}{suffix}" for s in names for suffix in ("", "_lo", "_hi")]
    columns += [f"{d}{suffix}" for d in differences for suffix in ("_bound", "_mde")]
    if frame.empty:
        return pd.DataFrame(columns=columns, index=pd.Index([], name=by), dtype=float)
    draws = resamples_of(rng, n)
    key_codes, keys = pd.factorize(frame[by], sort=False)
    task_codes, tasks = pd.factorize(frame["task"], sort=True)
    n_keys, n_tasks = len(keys), len(tasks)
    flat = key_codes * n_tasks + task_codes
    values = np.nan_to_num(frame[sums].to_numpy(dtype=float))
    totals = np.stack([np.bincount(flat, weights=values[:, j], minlength=n_keys * n_tasks)
                       for j in range(len(sums))], axis=-1).reshape(n_keys, n_tasks, len(sums))
    present = (np.bincount(flat, minlength=n_keys * n_tasks) > 0).reshape(n_keys, n_tasks)
    out = np.empty((n_keys, len(names), 3))
    sensitive = np.empty((n_keys, len(differences), 2))
    chosen = [names.index(d) for d in differences]
    # keys with the same tasks (every cell of a schedule) share one resample matrix: one product
    alike: dict[bytes, list[int]] = {}
    for k in range(n_keys):
        alike.setdefault(np.packbits(present[k]).tobytes(), []).append(k)
    for members in alike.values():
        held = np.flatnonzero(present[members[0]])
        block = totals[members][:, held]  # keys x tasks x sums
        weights = draws.counts(tasks[held])
        resampled = (weights @ block.transpose(1, 0, 2).reshape(len(held), -1)).reshape(
            len(weights), len(members), len(sums))
        with np.errstate(divide="ignore", invalid="ignore"):
            point = statistic({s: block[:, :, j].sum(axis=1) for j, s in enumerate(sums)})
            stats = statistic({s: resampled[:, :, j] for j, s in enumerate(sums)})
        matrix = np.stack([np.broadcast_to(stats[s], resampled.shape[:2]) for s in names], axis=-1)
        out[members, :, 0] = np.stack([np.broadcast_to(point[s], (len(members),))
                                       for s in names], axis=-1)
        out[members, :, 1:] = percentiles(matrix.reshape(len(weights), -1), level).T.reshape(
            len(members), len(names), 2)
        if chosen:
            found = sensitivity(matrix[:, :, chosen].reshape(len(weights), -1), level)
            sensitive[members] = np.stack(found, axis=-1).reshape(len(members), len(chosen), 2)
    data = np.concatenate([out.reshape(n_keys, -1), sensitive.reshape(n_keys, -1)], axis=1)
    data[~np.isfinite(data)] = np.nan
    return pd.DataFrame(data, columns=columns, index=pd.Index(keys, name=by))


def percentiles(stats: np.ndarray, level: float) -> np.ndarray:
    """The (2, columns) percentile interval of each column of resampled statistics; values that
    are not finite (an undefined resample) are left out, and a column with none left is NaN."""
    tail = (1.0 - level) / 2.0
    return _quantiles(stats, [tail, 1.0 - tail])


def _quantiles(stats: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """The (len(qs), columns) quantiles of each column, non-finite values left out (NaN if none
    is left); the fast `np.quantile` serves every column that has no such value."""
    stats = np.where(np.isfinite(stats), stats, np.nan)
    undefined = np.isnan(stats).any(axis=0)
    bounds = np.full((len(qs), stats.shape[1]), np.nan)
    if (~undefined).any():
        bounds[:, ~undefined] = np.quantile(stats[:, ~undefined], qs, axis=0)
    if undefined.any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column stays NaN
            bounds[:, undefined] = np.nanquantile(stats[:, undefined], qs, axis=0)
    return bounds


def mde_factor(level: float = LEVEL, power: float = POWER) -> float:
    """z_{1-alpha/2} + z_power, alpha = 1 - level: the minimum detectable effect in standard
    errors (2.80 at 95% and 80%)."""
    z = NormalDist().inv_cdf
    return z(1.0 - (1.0 - level) / 2.0) + z(power)


def sensitivity(resampled: np.ndarray, level: float = LEVEL, power: float = POWER) -> Sensitivity:
    """The sensitivity of a paired difference a - b (negative: a saves) from its bootstrap
    resamples (axis 0; one column per difference, or a 1-D array for one): `bound` =
    max(0, -(the 1 - level quantile)), the saving beyond which the data exclude, one-sided at
    `level`; `mde` = `mde_factor` * SE, the minimum detectable effect of a
    two-sided test at alpha = 1 - level with `power` (2.80 * SE at 95% and 80%), SE the
    standard deviation of the resamples. Non-finite resamples are left out; NaN if none is left."""
    stats = np.asarray(resampled, dtype=float)
    one = stats.ndim == 1
    stats = stats.reshape(len(stats), -1)
    low = _quantiles(stats, [1.0 - level])[0]
    finite = np.isfinite(stats)
    if finite.all():
        se = stats.std(axis=0, ddof=1)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # fewer than two finite resamples: NaN
            se = np.nanstd(np.where(finite, stats, np.nan), axis=0, ddof=1)
    bound = np.maximum(-low, 0.0) + 0.0  # + 0.0: a bound of -0.0 reads 0
    mde = mde_factor(level, power) * se
    return Sensitivity(float(bound[0]), float(mde[0])) if one else Sensitivity(bound, mde)


def mean_sums(keys: pd.DataFrame, values: Mapping[str, Any]) -> pd.DataFrame:
    """`keys` (the `by` and `task` columns) with, per named value, its sum column (NaN where
    unknown) and `<name>#n` (1 where known): the input of `task_bootstrap` with `means`."""
    out = keys.copy()
    for name, value in values.items():
        column = np.asarray(value, dtype=float)
        out[name] = column
        out[f"{name}#n"] = (~np.isnan(column)).astype(float)
    return out


def means(names: Sequence[str]) -> Statistic:
    """The statistic of `mean_sums`: each value's mean over its known instances."""
    return lambda t: {name: t[name] / t[f"{name}#n"] for name in names}


def _mean_columns(value: str) -> list[str]:
    return [value, f"{value}_lo", f"{value}_hi"]


# --- cells, groups and twins --------------------------------------------------------------------

def _stream(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["phase"] == "stream"]


def _cells_in_order(df: pd.DataFrame) -> list[str]:
    return list(pd.unique(df["cell"]))


def group_label(settings: Mapping[str, Any]) -> str:
    """The name of a cell group pooled over stream orders: the cell id without its order
    (`label.effort.sSEED`). A run has one track and one model, as its cell ids assume."""
    return f"{cell_label(settings)}.{settings.get('effort')}.s{settings.get('seed')}"


def with_groups(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with `group`: the cell group its cell pools into over stream orders (`group_label`)."""
    names = {c: group_label(s) for c, s in _cell_settings(df).items()}
    return df.assign(group=df["cell"].map(names))


def key_of_cells(df: pd.DataFrame, key: str) -> dict[str, Any]:
    """Each cell's value of `key` (its own id for `cell`, its group for `group`)."""
    first = df.drop_duplicates("cell")
    return dict(zip(first["cell"], first[key]))


def _cell_settings(df: pd.DataFrame) -> dict[str, dict[str, Any]]:
    return df.drop_duplicates("cell").set_index("cell", drop=False)[list(SETTINGS)].to_dict("index")


def _schedule(settings: Mapping[str, Any]) -> tuple:
    return tuple(settings.get(k) for k in SCHEDULE_KEYS)


def twin_cells(df: pd.DataFrame) -> dict[str, str]:
    """Each cell's memory-off twin: the cell of the same learner on the same schedule (track,
    model, effort, order, seed) in the first of its row's twins (orchestrator/rows.py) that the frame has. Cells
    without one (floors, memory-off rows, the wiped program library) are left out."""
    settings = _cell_settings(df)
    index = {(_schedule(s), s["learner"], row_name(s["row"])): c for c, s in settings.items()}
    twins = {}
    for cell_id, s in settings.items():
        for row in twins_of(s["row"]):
            twin = index.get((_schedule(s), s["learner"], row))
            if twin is not None:
                twins[cell_id] = twin
                break
    return twins


def demo_cache_cells(df: pd.DataFrame) -> dict[str, str]:
    """Each cell's demo-cache floor on the same schedule (the floor itself left out)."""
    settings = _cell_settings(df)
    floors = {_schedule(s): c for c, s in settings.items()
              if s["learner"] == DEMO_CACHE and row_name(s["row"]) == "memory-on"}
    return {c: floors[_schedule(s)] for c, s in settings.items()
            if _schedule(s) in floors and floors[_schedule(s)] != c}


def _clash(cell_a: str, cell_b: str, slot: Any, task_a: Any, visit_a: Any, task_b: Any,
           visit_b: Any) -> ValueError:
    return ValueError(
        f"cells {cell_a} and {cell_b} are not on the same schedule: slot {slot} serves "
        f"{task_a} visit {visit_a} in one and {task_b} visit {visit_b} in the other; pair "
        "only cells with the same track, order and seed")


def paired_instances(df: pd.DataFrame, pairs: Iterable[tuple[Any, str, str]],
                     phases: Sequence[str] = ("stream",)) -> pd.DataFrame:
    """For each (key, cell a, cell b): the instances of `phases` both cells finished, matched by
    phase and slot, under `key`: key, phase, slot, task, visit, exposure, share_a, share_b; all
    pairs in one frame, each pair's rows in cell a's frame order. Pairing within each schedule
    and stacking the pairs under a group key is how a comparison pools over orders. Raises
    ValueError when a slot serves different instances (the cells are not on one schedule).

    All pairs are matched at once: every instance gets one integer (cell, phase, slot) key, and
    cell b's row of each of cell a's rows is found by a binary search over the sorted keys."""
    pairs = list(pairs)
    columns = ["key", "phase", "slot", "task", "visit", "exposure", "share_a", "share_b"]
    data = df[df["phase"].isin(phases)]
    if not pairs or data.empty:
        return pd.DataFrame({c: pd.Series(dtype=float if c.startswith("share") else object)
                             for c in columns})
    cell_codes, cell_names = pd.factorize(data["cell"], sort=False)
    phase_codes = pd.Index(list(phases)).get_indexer(data["phase"])
    slot = data["slot"].to_numpy(dtype="int64")
    span = int(slot.max()) + 1 if len(slot) else 1
    per_cell = len(phases) * span
    keys = (cell_codes.astype("int64") * len(phases) + phase_codes) * span + slot
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    twice = np.flatnonzero(np.diff(sorted_keys) == 0)
    if len(twice):
        row = order[twice[0]]
        raise ValueError(f"cell {data['cell'].iloc[row]} has two {data['phase'].iloc[row]} "
                         f"instances at slot {slot[row]}; build the frame with instances_frame, "
                         "which keeps one record per slot")
    by_cell = np.argsort(cell_codes, kind="stable")
    bounds = np.searchsorted(cell_codes[by_cell], np.arange(len(cell_names) + 1))
    code_of = {name: k for k, name in enumerate(cell_names)}
    rows_a, wanted, which = [], [], []
    for p, (_, a, b) in enumerate(pairs):
        if a not in code_of or b not in code_of:
            continue
        ka, kb = code_of[a], code_of[b]
        rows = by_cell[bounds[ka]:bounds[ka + 1]]
        rows_a.append(rows)
        wanted.append(keys[rows] + (kb - ka) * per_cell)
        which.append(np.full(len(rows), p))
    if not rows_a:
        return paired_instances(df, [], phases)
    rows_a, wanted, which = np.concatenate(rows_a), np.concatenate(wanted), np.concatenate(which)
    at = np.minimum(np.searchsorted(sorted_keys, wanted), len(sorted_keys) - 1)
    found = sorted_keys[at] == wanted
    a_rows, b_rows, which = rows_a[found], order[at[found]], which[found]
    task, visit = data["task"].to_numpy(), data["visit"].to_numpy()
    clash = np.flatnonzero((task[a_rows] != task[b_rows]) | (visit[a_rows] != visit[b_rows]))
    if len(clash):
        i = clash[0]
        _, a, b = pairs[which[i]]
        raise _clash(a, b, slot[a_rows[i]], task[a_rows[i]], visit[a_rows[i]], task[b_rows[i]],
                     visit[b_rows[i]])
    share = data["share"].to_numpy(dtype=float)
    key_values = np.empty(len(pairs), dtype=object)
    key_values[:] = [key for key, _, _ in pairs]
    return pd.DataFrame({
        "key": key_values[which], "phase": data["phase"].to_numpy()[a_rows],
        "slot": slot[a_rows], "task": task[a_rows], "visit": visit[a_rows],
        "exposure": data["exposure"].to_numpy()[a_rows], "share_a": share[a_rows],
        "share_b": share[b_rows]}, columns=columns)


# --- the tables ----------------------------------------------------------------------------------

_MEASURES = ("budget", "solved", "failed", "first_answer_correct", "first_submit_demos",
             "cost0_returning")


def _measures(df: pd.DataFrame, by: str, rng: Resampling, n: int, level: float) -> pd.DataFrame:
    """Per value of `by`, over the stream: instances, tasks, returning instances, every mean of
    `_MEASURES` with its interval, and the compute totals."""
    stream = _stream(df)
    returning = stream["exposure"] >= 1
    values = {
        "budget": stream["share"],
        "solved": stream["solved"].astype(float),
        "failed": (stream["status"] == "failed").astype(float),
        "first_answer_correct": stream["first_answer_correct"].astype("Float64")
        .to_numpy(dtype=float, na_value=np.nan),
        "first_submit_demos": stream["first_submit_demos"],
        # cost 0: no pair bought and the first answer right, only on a returning task
        "cost0_returning": np.where(returning, (stream["cost"] == 0).astype(float), np.nan),
    }
    table = task_bootstrap(mean_sums(stream[[by, "task"]], values), by, means(_MEASURES),
                           rng, n, level)
    g = stream.assign(returning=returning, tokens=stream["prompt_tokens"]
                      + stream["completion_tokens"]).groupby(by, sort=False)
    counts = pd.DataFrame({"n": g.size(), "tasks": g["task"].nunique(),
                           "returning": g["returning"].sum()})
    compute = g[["model_calls", "prompt_tokens", "completion_tokens", "tokens", "model_s",
                 "cost_usd"]].sum()
    return counts.join(table).join(compute)


_CELL_COLUMNS = [
    "cell", "label", "n", "budget", "budget_lo", "budget_hi", "solved", "solved_lo", "solved_hi",
    "first_submit_demos", "first_answer_correct", "model_calls", "prompt_tokens",
    "completion_tokens", "tokens", "model_s", "cost_usd", "tasks", "returning",
    "first_submit_demos_lo", "first_submit_demos_hi", "first_answer_correct_lo",
    "first_answer_correct_hi", *_mean_columns("failed"), *_mean_columns("cost0_returning")]


def _finish_measures(table: pd.DataFrame) -> pd.DataFrame:
    for column in ("n", "tasks", "returning", "model_calls", "prompt_tokens", "completion_tokens",
                   "tokens"):
        table[column] = table[column].fillna(0).astype("int64")
    for column in ("model_s", "cost_usd"):
        table[column] = table[column].fillna(0.0).astype(float)
    return table


def cell_table(df: pd.DataFrame, rng: Resampling, n: int = RESAMPLES,
               level: float = LEVEL) -> pd.DataFrame:
    """Per cell, over the stream phase: instances (`n`), tasks and returning instances (exposure
    1 and up); with bootstrap intervals, budget share, solved share, `failed` (share of instances
    failed), `first_answer_correct` (first-answer accuracy), `first_submit_demos` (pairs bought
    before the first submission) and `cost0_returning` (share of returning instances at cost 0:
    no pair bought and the first answer right); and the compute totals (model calls, tokens,
    model seconds, dollars: logged, not scored). A cell with no stream instance has n 0, NaNs."""
    table = _measures(df, "cell", rng, n, level).reindex(_cells_in_order(df))
    table.insert(0, "label", df.drop_duplicates("cell").set_index("cell")["label"])
    table = _finish_measures(table.rename_axis("cell").reset_index())
    return table[_CELL_COLUMNS]


_POOLED_COLUMNS = ["group", "label", "learner", "row", "track", "model", "effort", "seed",
                   "orders", "cells", "n", "tasks", "returning",
                   *(c for m in _MEASURES for c in _mean_columns(m)),
                   "model_calls", "prompt_tokens", "completion_tokens", "tokens", "model_s",
                   "cost_usd"]


def group_settings(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell group (`with_groups`), in frame order: label, learner, row, track, model, effort,
    seed, the orders pooled (comma-separated, sorted) and how many cells."""
    grouped = with_groups(df)
    first = grouped.drop_duplicates("group").set_index("group")[
        ["label", "learner", "row", "track", "model", "effort", "seed"]]
    g = grouped.groupby("group", sort=False)
    first["orders"] = g["order"].agg(lambda s: ", ".join(sorted({str(o) for o in s})))
    first["cells"] = g["cell"].nunique()
    return first


def pooled_table(df: pd.DataFrame, rng: Resampling, n: int = RESAMPLES,
                 level: float = LEVEL) -> pd.DataFrame:
    """`cell_table`'s measures per cell group pooled over stream orders (`with_groups`): every
    stream instance of every order of the group, with the bootstrap over tasks (a task's
    instances in all orders are resampled together)."""
    grouped = with_groups(df)
    table = group_settings(df).join(_measures(grouped, "group", rng, n, level))
    return _finish_measures(table.rename_axis("group").reset_index())[_POOLED_COLUMNS]


def exposure_table(df: pd.DataFrame, exposures: Iterable[int] = EXPOSURES) -> pd.DataFrame:
    """Mean budget share of stream instances by exposure index (times the task was met before),
    rows cells, columns the exposure indices; NaN where a cell has no such instance yet."""
    stream = _stream(df)
    table = stream.groupby(["cell", "exposure"], sort=False)["share"].mean().unstack("exposure")
    return table.reindex(index=_cells_in_order(df), columns=list(exposures)).rename_axis(
        index="cell", columns="exposure")


def returning_gaps(df: pd.DataFrame) -> pd.DataFrame:
    """The returning stream instances (visit 1 and up) whose previous visit of the task in the
    same cell is in the frame, with `gap` = slot minus that visit's slot. An instance whose
    previous visit is unfinished has no known gap and is left out."""
    stream = _stream(df).sort_values(["cell", "task", "visit"], kind="stable")
    before = stream.groupby(["cell", "task"], sort=False)[["slot", "visit"]].shift()
    known = (stream["visit"] > 0) & (before["visit"] == stream["visit"] - 1)
    returning = stream[known].copy()
    returning["gap"] = (returning["slot"] - before.loc[known, "slot"]).astype("int64")
    return returning.sort_index()


def gap_bin_labels(edges: Sequence[int] = GAP_EDGES) -> list[str]:
    """`1`, `2–3`, `4–7`, ..., `64+`: the gaps each bin of `edges` covers."""
    labels = [str(lo) if hi - lo == 1 else f"{lo}–{hi - 1}" for lo, hi in zip(edges, edges[1:])]
    return labels + [f"{edges[-1]}+"]


def gap_table(df: pd.DataFrame, edges: Sequence[int] = GAP_EDGES) -> pd.DataFrame:
    """Budget on returning stream instances against the gap since the task was last seen in the
    cell (`returning_gaps`), in bins from `edges` (1, 2–3, 4–7, ..., 64+): per cell and bin, in
    cell then bin order, `gap` (the bin's label), `gap_min`, `gap_max` (<NA> for the open last
    bin), `n` instances and mean `budget` share (NaN where n is 0). Forgetting shows as a rise."""
    gaps = returning_gaps(df)
    labels = gap_bin_labels(edges)
    bins = np.searchsorted(np.asarray(edges), gaps["gap"].to_numpy(), side="right") - 1
    g = gaps.assign(bin=bins).groupby(["cell", "bin"], sort=False)["share"].agg(["count", "mean"])
    cells = _cells_in_order(df)
    full = pd.MultiIndex.from_product([cells, range(len(labels))], names=["cell", "bin"])
    g = g.reindex(full)
    maxima = pd.array([*(hi - 1 for hi in edges[1:]), pd.NA], dtype="Int64")
    label_of = df.drop_duplicates("cell").set_index("cell")["label"]
    return pd.DataFrame({
        "cell": full.get_level_values("cell"),
        "label": label_of.reindex(full.get_level_values("cell")).to_numpy(),
        "gap": [labels[b] for b in full.get_level_values("bin")],
        "gap_min": np.asarray(edges)[full.get_level_values("bin")],
        "gap_max": maxima[full.get_level_values("bin")],
        "n": g["count"].fillna(0).astype("int64").to_numpy(),
        "budget": g["mean"].to_numpy(dtype=float)})


def paired_slots(df: pd.DataFrame, cell_a: str, cell_b: str, phase: str = "stream") -> pd.DataFrame:
    """The slots both cells finished in `phase`, with task, visit and `diff` = share a - share b.
    Raises ValueError when a slot serves different instances (the cells are not on one schedule)."""
    pairs = paired_instances(df, [(None, cell_a, cell_b)], phases=(phase,))
    return pd.DataFrame({"slot": pairs["slot"], "task": pairs["task"], "visit": pairs["visit"],
                         "diff": pairs["share_a"] - pairs["share_b"]})


def paired_difference(df: pd.DataFrame, cell_a: str, cell_b: str, rng: np.random.Generator,
                      n: int = RESAMPLES, level: float = LEVEL,
                      phase: str = "stream") -> PairedDifference:
    """Budget share of `cell_a` minus `cell_b`, slot by slot on their identical schedule, with a
    bootstrap-over-tasks interval. Only slots both cells finished are paired."""
    pairs = paired_slots(df, cell_a, cell_b, phase)
    estimate = bootstrap_mean_ci(pairs, "diff", rng, n, level)
    return PairedDifference(*estimate, pairs=len(pairs))


def paired_means(pairs: pd.DataFrame, rng: Resampling, n: int, level: float) -> pd.DataFrame:
    """Per key of a `paired_instances` frame: mean, lo, hi, bound and mde (`sensitivity`) of
    share a - share b, and pairs."""
    sums = mean_sums(pairs[["key", "task"]], {"mean": pairs["share_a"] - pairs["share_b"]})
    table = task_bootstrap(sums, "key", means(["mean"]), rng, n, level, differences=["mean"])
    return table.assign(pairs=pairs.groupby("key", sort=False).size())


def differences_from_floor(df: pd.DataFrame, cells: Mapping[str, Mapping[str, Any]],
                           rng: Resampling, n: int = RESAMPLES,
                           level: float = LEVEL) -> pd.DataFrame:
    """For every cell but the floors, its paired difference from the stateless-floor cell with the
    same track, model, effort, order and seed, with its interval and `sensitivity` (`bound`,
    `mde`); cells without such a floor are skipped."""
    floors = {_schedule(s): cell_id for cell_id, s in cells.items() if s.get("learner") == FLOOR}
    compared = [(cell_id, floors[_schedule(s)]) for cell_id, s in cells.items()
                if s.get("learner") != FLOOR and _schedule(s) in floors]
    pairs = paired_instances(df, [(c, c, floor) for c, floor in compared])
    table = paired_means(pairs, rng, n, level).reindex([c for c, _ in compared])
    rows = [{"cell": c, "label": cell_label(cells[c]), "floor": floor,
             "mean": table.at[c, "mean"], "lo": table.at[c, "mean_lo"],
             "hi": table.at[c, "mean_hi"], "bound": table.at[c, "mean_bound"],
             "mde": table.at[c, "mean_mde"], "pairs": table.at[c, "pairs"]} for c, floor in compared]
    out = pd.DataFrame(rows, columns=["cell", "label", "floor", "mean", "lo", "hi", "bound", "mde",
                                      "pairs"])
    out["pairs"] = out["pairs"].fillna(0).astype("int64")
    return out


def floor_pooled_table(df: pd.DataFrame, cells: Mapping[str, Mapping[str, Any]],
                       rng: Resampling, n: int = RESAMPLES, level: float = LEVEL) -> pd.DataFrame:
    """`differences_from_floor` pooled over stream orders: per cell group (`with_groups`), the
    slot pairs of every order's schedule with its own stateless floor, in one bootstrap over
    tasks (the seed's paired-savings figure pools its 600 instances over the three orders)."""
    columns = ["group", "label", "learner", "row", "effort", "floor", "orders", "mean", "lo",
               "hi", "bound", "mde", "pairs"]
    floors = {_schedule(s): c for c, s in cells.items() if s.get("learner") == FLOOR}
    compared = {c: floors[_schedule(s)] for c, s in cells.items()
                if s.get("learner") != FLOOR and _schedule(s) in floors}
    data = with_groups(df)
    name = key_of_cells(data, "group")
    compared = {c: f for c, f in compared.items() if c in name and f in name}
    if not compared:
        return pd.DataFrame(columns=columns)
    pairs = paired_instances(df, [(name[c], c, f) for c, f in compared.items()])
    table = paired_means(pairs, rng, n, level)
    keys = [k for k in pd.unique(data["group"]) if k in table.index]
    settings = data.drop_duplicates("group").set_index("group")
    floor_of = {name[c]: name[f] for c, f in compared.items()}
    table = table.reindex(keys)
    return pd.DataFrame({
        "group": keys, "label": settings.loc[keys, "label"].to_numpy(),
        "learner": settings.loc[keys, "learner"].to_numpy(),
        "row": [row_name(r) for r in settings.loc[keys, "row"]],
        "effort": settings.loc[keys, "effort"].to_numpy(),
        "floor": [floor_of[k] for k in keys],
        "orders": group_settings(df)["orders"].reindex(keys).to_numpy(),
        "mean": table["mean"].to_numpy(), "lo": table["mean_lo"].to_numpy(),
        "hi": table["mean_hi"].to_numpy(), "bound": table["mean_bound"].to_numpy(),
        "mde": table["mean_mde"].to_numpy(),
        "pairs": table["pairs"].fillna(0).astype("int64").to_numpy()}, columns=columns)


def twin_table(df: pd.DataFrame, rng: Resampling, n: int = RESAMPLES, level: float = LEVEL,
               pool_orders: bool = False) -> pd.DataFrame:
    """Budget share of each cell minus its memory-off twin's (`twin_cells`: memory-off; the wiped
    row for the program library; program-procedure-wiped for program-procedure) and minus the
    demo-cache floor's on the same schedule, slot by slot over the stream, with bootstrap
    intervals over tasks and their `sensitivity` (`twin_bound`, `twin_mde`, `demo_cache_bound`,
    `demo_cache_mde`); negative is a saving. One row per cell with at least one of the two.

    With `pool_orders`, one row per cell group (`with_groups`): the slot pairs of each order's
    schedule, pooled, so `twin` and `demo_cache` name groups and `orders` the orders pooled."""
    key = "group" if pool_orders else "cell"
    data = with_groups(df) if pool_orders else df
    name = key_of_cells(data, key)
    twins, demo = twin_cells(df), demo_cache_cells(df)
    twin_pairs = paired_instances(df, [(name[c], c, t) for c, t in twins.items()])
    demo_pairs = paired_instances(df, [(name[c], c, d) for c, d in demo.items()])
    twin = paired_means(twin_pairs, rng, n, level)
    floor = paired_means(demo_pairs, rng, n, level)
    keys = [k for k in pd.unique(data[key]) if k in twin.index or k in floor.index]
    settings = data.drop_duplicates(key).set_index(key)
    table = pd.DataFrame({
        key: keys, "label": settings.loc[keys, "label"].to_numpy(),
        "learner": settings.loc[keys, "learner"].to_numpy(),
        "row": [row_name(r) for r in settings.loc[keys, "row"]]})
    if pool_orders:
        table["orders"] = group_settings(df)["orders"].reindex(keys).to_numpy()
    twin_of = {name[c]: name[t] for c, t in twins.items()}
    demo_of = {name[c]: name[d] for c, d in demo.items()}
    table["twin"] = [twin_of.get(k) for k in keys]
    twin = twin.reindex(keys)
    table["twin_mean"], table["twin_lo"], table["twin_hi"] = (
        twin["mean"].to_numpy(), twin["mean_lo"].to_numpy(), twin["mean_hi"].to_numpy())
    table["twin_bound"], table["twin_mde"] = twin["mean_bound"].to_numpy(), twin["mean_mde"].to_numpy()
    table["twin_pairs"] = twin["pairs"].fillna(0).astype("int64").to_numpy()
    table["demo_cache"] = [demo_of.get(k) for k in keys]
    floor = floor.reindex(keys)
    table["demo_cache_mean"], table["demo_cache_lo"], table["demo_cache_hi"] = (
        floor["mean"].to_numpy(), floor["mean_lo"].to_numpy(), floor["mean_hi"].to_numpy())
    table["demo_cache_bound"], table["demo_cache_mde"] = (floor["mean_bound"].to_numpy(),
                                                          floor["mean_mde"].to_numpy())
    table["demo_cache_pairs"] = floor["pairs"].fillna(0).astype("int64").to_numpy()
    return table


def forward_transfer(df: pd.DataFrame, rng: Resampling, n: int = RESAMPLES,
                     level: float = LEVEL) -> pd.DataFrame:
    """Per cell with both phases finished on some task: epilogue budget share minus the fresh
    reference's, paired by task, with a bootstrap-over-tasks interval and its `sensitivity`
    (`bound`, `mde`). Negative means the lifetime helped on held-out tasks."""
    columns = ["cell", "label", "epilogue", "fresh", "mean", "lo", "hi", "bound", "mde", "tasks"]
    held_out = df[df["phase"].isin(("epilogue", "fresh"))]
    both = (held_out.groupby(["cell", "task", "phase"], sort=False)["share"].mean()
            .unstack("phase").reindex(columns=["epilogue", "fresh"]).dropna())
    if both.empty:
        return pd.DataFrame(columns=columns)
    both = both.reset_index()
    sums = mean_sums(both[["cell", "task"]], {"mean": both["epilogue"] - both["fresh"]})
    estimate = task_bootstrap(sums, "cell", means(["mean"]), rng, n, level, differences=["mean"])
    g = both.groupby("cell", sort=False)
    cells = [c for c in _cells_in_order(df) if c in estimate.index]
    label_of = df.drop_duplicates("cell").set_index("cell")["label"]
    return pd.DataFrame({
        "cell": cells, "label": label_of.reindex(cells).to_numpy(),
        "epilogue": g["epilogue"].mean().reindex(cells).to_numpy(),
        "fresh": g["fresh"].mean().reindex(cells).to_numpy(),
        "mean": estimate.loc[cells, "mean"].to_numpy(),
        "lo": estimate.loc[cells, "mean_lo"].to_numpy(),
        "hi": estimate.loc[cells, "mean_hi"].to_numpy(),
        "bound": estimate.loc[cells, "mean_bound"].to_numpy(),
        "mde": estimate.loc[cells, "mean_mde"].to_numpy(),
        "tasks": g.size().reindex(cells).to_numpy()}, columns=columns)


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
    draws = resamples_of(rng, n)
    return RunAnalysis(cells=cell_table(df, draws, level=level), exposure=exposure_table(df),
                       floor_differences=differences_from_floor(df, cells, draws, level=level),
                       forward_transfer=forward_transfer(df, draws, level=level))
