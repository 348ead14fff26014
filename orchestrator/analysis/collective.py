"""Scores of a collective run (the seed's second regime; docs/collective.md).

Every verdict is charged as in a single-user run (share = cost / 16). Per row, over all users:
the budget share and the share solved, the spread between users, the budget by round, against
the user's own exposure index, against the collective exposure (how often anyone had met the task
before the round began, plus the user's own meetings of it in the round: what the row could have
learnt from), and against the gap since the user last saw the task; paired differences on
(user, slot) from the row's independent twin (memory-on) and from the stateless floor; and the
epilogue served to the first half of the users one round and to the second half the next.

Every interval is the bootstrap over tasks of `measures.task_bootstrap` (one resample matrix per
task list, `TaskResamples`), so 160,000 verdicts cost a few matrix products.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.errors import ConfigError
from orchestrator.analysis import measures
from orchestrator.analysis.report import load_run
from orchestrator.analysis.measures import FLOOR, LEVEL, RESAMPLES, TaskResamples, mean_sums, means
from orchestrator.records import RunPaths
from orchestrator.rows import MEMORY_ON, row, row_name

# Lower edges of the collective-exposure bins (meetings of the task by anyone before); last open.
REACH_EDGES = (0, 1, 4, 16, 64, 256)


def reach_labels(edges: tuple[int, ...] = REACH_EDGES) -> list[str]:
    return [f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])] + [f"{edges[-1]}+"]


def collective_frame(run_dir: Path) -> pd.DataFrame:
    """One row per finished instance of every user of every row (`measures.instances_frame`:
    the later record of a slot ended twice), with `reach` and `gap` (`with_reach`)."""
    cells, events = load_run(run_dir, "instance_end")
    df = measures.instances_frame(events, cells)
    df["row"] = df["row"].map(row_name)
    df[["user", "round"]] = df[["user", "round"]].astype("int64")  # every collective instance has both
    return with_reach(df)


def with_reach(df: pd.DataFrame) -> pd.DataFrame:
    """`reach`: meetings of the instance's task by any user of its row in the rounds before its
    own, plus the user's own earlier meetings of it in its round; `gap`: slots since the user
    last met the task (0 on a first meeting)."""
    if df.empty:
        return df.assign(reach=pd.Series(dtype="int64"), gap=pd.Series(dtype="int64"))
    df = df.sort_values(["cell", "user", "slot"], kind="stable").reset_index(drop=True)
    per_round = df.groupby(["cell", "task", "round"]).size().rename("met").reset_index()
    per_round = per_round.sort_values(["cell", "task", "round"])
    per_round["before"] = per_round.groupby(["cell", "task"])["met"].cumsum() - per_round["met"]
    df = df.merge(per_round[["cell", "task", "round", "before"]], on=["cell", "task", "round"], how="left")
    own = df.groupby(["cell", "user", "task", "round"]).cumcount()
    df["reach"] = (df["before"] + own).astype("int64")
    previous = df.groupby(["cell", "user", "task"])["slot"].shift()
    df["gap"] = (df["slot"] - previous).fillna(0).astype("int64")
    return df.drop(columns="before")


def _bootstrap(df: pd.DataFrame, by: list[str], draws: TaskResamples, n: int, level: float,
               values: Mapping[str, Any]) -> pd.DataFrame:
    """Means of `values` per group of `by`, each with its interval over tasks."""
    key = df.groupby(by, sort=False, observed=True).ngroup().to_numpy()  # one code per group
    sums = mean_sums(pd.DataFrame({"key": key, "task": df["task"].to_numpy()}),
                     {name: np.asarray(value, dtype=float) for name, value in values.items()})
    table = measures.task_bootstrap(sums, "key", means(list(values)), draws, n, level)
    groups = df[by].assign(key=key).drop_duplicates("key").set_index("key")
    return groups.join(table, how="inner").reset_index(drop=True)


def rows_table(df: pd.DataFrame, draws: TaskResamples, n: int = RESAMPLES, level: float = LEVEL) -> pd.DataFrame:
    """Per row: instances, users, budget share and share solved (intervals over tasks), and the
    spread between users of their own budget share (sd, lowest, highest)."""
    stream = df[df["phase"] == "stream"]
    table = _bootstrap(stream, ["cell"], draws, n, level,
                       {"budget": stream["share"], "solved": stream["solved"].astype(float)})
    per_user = stream.groupby(["cell", "user"])["share"].mean().groupby("cell")
    spread = pd.DataFrame({"user_sd": per_user.std(ddof=1), "user_min": per_user.min(),
                           "user_max": per_user.max()})
    sizes = stream.groupby("cell").agg(instances=("share", "size"), users=("user", "nunique"))
    labels = stream.drop_duplicates("cell").set_index("cell")[["label", "learner", "row", "effort"]]
    return (labels.join(sizes).join(table.set_index("cell")).join(spread)
            .reset_index()[["cell", "label", "learner", "row", "effort", "instances", "users", "budget",
                            "budget_lo", "budget_hi", "solved", "solved_lo", "solved_hi", "user_sd",
                            "user_min", "user_max"]])


def by_table(df: pd.DataFrame, column: str, draws: TaskResamples, n: int = RESAMPLES,
             level: float = LEVEL) -> pd.DataFrame:
    """The stream's budget share per row and value of `column` (round, exposure, reach bin, gap
    bin), with intervals over tasks and instance counts."""
    stream = df[df["phase"] == "stream"]
    table = _bootstrap(stream, ["label", column], draws, n, level, {"budget": stream["share"]})
    counts = stream.groupby(["label", column], observed=True).size().rename("instances").reset_index()
    return table.merge(counts, on=["label", column]).sort_values(["label", column], kind="stable") \
        .reset_index(drop=True)[["label", column, "instances", "budget", "budget_lo", "budget_hi"]]


def binned(df: pd.DataFrame) -> pd.DataFrame:
    """`reach_bin` and `gap_bin` (returning instances only), labelled."""
    reach_names = reach_labels()
    out = df.assign(reach_bin=pd.Categorical(
        [reach_names[i] for i in np.searchsorted(REACH_EDGES, df["reach"], side="right") - 1],
        categories=reach_names, ordered=True))
    gap_names = measures.gap_bin_labels()
    edges = measures.GAP_EDGES
    returning = out["gap"] > 0
    index = np.clip(np.searchsorted(edges, out["gap"], side="right") - 1, 0, len(edges) - 1)
    out["gap_bin"] = pd.Categorical(np.where(returning, np.array(gap_names, dtype=object)[index], None),
                                    categories=gap_names, ordered=True)
    return out


def paired_table(df: pd.DataFrame, draws: TaskResamples, n: int = RESAMPLES, level: float = LEVEL) -> pd.DataFrame:
    """Paired on (user, slot) over the stream: each collective row (collective, trained) minus its
    independent twin (the same learner and effort on memory-on), and every row of another learner
    minus the floor of its effort. Negative: the first row spends less."""
    stream = df[df["phase"] == "stream"]
    cells = stream.drop_duplicates("cell").set_index("cell")
    comparisons = []
    for cell, settings in cells.iterrows():
        if row(settings["row"]).shared:  # collective, trained: against the same learner alone
            twin = cells[(cells["learner"] == settings["learner"]) & (cells["row"] == MEMORY_ON)
                         & (cells["effort"] == settings["effort"])]
            comparisons += [("independent twin", cell, t) for t in twin.index]
        if settings["learner"] != FLOOR:
            floor = cells[(cells["learner"] == FLOOR) & (cells["row"] == MEMORY_ON)
                          & (cells["effort"] == settings["effort"])]
            comparisons += [("stateless floor", cell, f) for f in floor.index]
    if not comparisons:
        return pd.DataFrame(columns=["against", "cell", "other", "pairs", "mean", "lo", "hi", "mean_bound",
                                     "mean_mde"])
    keyed = stream.set_index(["cell", "user", "slot"])[["task", "visit", "share"]]
    parts = []
    for against, cell, other in comparisons:
        a, b = keyed.loc[cell], keyed.loc[other]
        joined = a.merge(b, how="inner", left_index=True, right_index=True, suffixes=("", "_b"))
        if (joined["task"] != joined["task_b"]).any() or (joined["visit"] != joined["visit_b"]).any():
            raise ConfigError(f"{cell} and {other} serve different instances at some (user, slot): "
                             "they are not on one schedule")
        parts.append(pd.DataFrame({"key": f"{against}|{cell}|{other}", "task": joined["task"].to_numpy(),
                                   "diff": (joined["share"] - joined["share_b"]).to_numpy()}))
    pairs = pd.concat(parts, ignore_index=True)
    sums = mean_sums(pairs[["key", "task"]], {"mean": pairs["diff"]})
    table = measures.task_bootstrap(sums, "key", means(["mean"]), draws, n, level, differences=["mean"])
    table["pairs"] = pairs.groupby("key", sort=False).size()
    table = table.reset_index()
    table[["against", "cell", "other"]] = table["key"].str.split("|", expand=True)
    return table[["against", "cell", "other", "pairs", "mean", "mean_lo", "mean_hi", "mean_bound", "mean_mde"]] \
        .rename(columns={"mean_lo": "lo", "mean_hi": "hi"})


def epilogue_table(df: pd.DataFrame, draws: TaskResamples, n: int = RESAMPLES, level: float = LEVEL) -> pd.DataFrame:
    """The held-out epilogue per row: budget share of the first half of the users (who met the
    tasks first) and of the second half (a round later, after an update), and second minus first
    with its interval over the epilogue's tasks. Not paired: the halves are different users."""
    tail = df[df["phase"] == "epilogue"]
    if tail.empty:
        return pd.DataFrame(columns=["label", "first", "second", "second_minus_first", "lo", "hi", "instances"])
    first_round = tail.groupby("cell")["round"].transform("min")
    half = np.where(tail["round"] == first_round, "first", "second")
    shares = tail.assign(half=half)
    table = _bootstrap(shares, ["label", "half"], draws, n, level, {"budget": shares["share"]})
    wide = table.pivot(index="label", columns="half", values="budget")
    # the difference's interval: per task, first and second means resampled together
    rows = []
    for label, part in shares.groupby("label", sort=False):
        tasks = sorted(part["task"].unique())
        per = part.groupby(["task", "half"])["share"].agg(["sum", "count"]).unstack("half").reindex(tasks)
        weights = draws.counts(tasks)
        with np.errstate(divide="ignore", invalid="ignore"):
            means_ = {h: (weights @ np.nan_to_num(per[("sum", h)].to_numpy(float)))
                      / (weights @ np.nan_to_num(per[("count", h)].to_numpy(float)))
                      for h in ("first", "second") if ("sum", h) in per.columns}
        if len(means_) == 2:
            diff = means_["second"] - means_["first"]
            lo, hi = measures.percentiles(diff[:, None], level)[:, 0]
        else:
            lo = hi = np.nan
        rows.append({"label": label, "first": wide.loc[label].get("first", np.nan),
                     "second": wide.loc[label].get("second", np.nan), "lo": lo, "hi": hi,
                     "instances": len(part)})
    out = pd.DataFrame(rows)
    out.insert(3, "second_minus_first", out["second"] - out["first"])
    return out


def updates_table(run_dir: Path, top: int = 5) -> pd.DataFrame:
    """Every update step of every row that has them (collective, trained): the round whose state
    it wrote, what it merged or trained on (its update.json), and, for a model trained to a
    primitive prior, that prior's most counted primitives."""
    records: list[dict[str, Any]] = []
    for cell in RunPaths(run_dir).cell_folders():
        shared = cell.root / "shared"
        if not cell.settings.exists() or not shared.is_dir():
            continue
        label = json.loads(cell.settings.read_text()).get("label")
        for folder in sorted(shared.glob("round-[0-9][0-9][0-9]")):
            try:
                update = json.loads((folder / "update.json").read_text())
            except (OSError, ValueError):
                continue  # an update step not yet written whole
            record = {"cell": cell.name, "label": label, **update}
            prior = folder / "prior.json"
            if prior.is_file():
                counts = json.loads(prior.read_text()).get("counts", {})
                best = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
                record["top_primitives"] = ", ".join(f"{name} {n}" for name, n in best)
            records.append(record)
    table = pd.DataFrame(records)
    if table.empty:
        return table
    first = ["cell", "label", "round", "users"]
    counts = [c for c in table.columns if c not in ("cell", "label", "seconds", "top_primitives")]
    table[counts] = table[counts].astype("Int64")  # a row's round 0 has no counts
    return table[first + [c for c in table.columns if c not in first]]


def collective_tables(df: pd.DataFrame, seed: int = 0, n: int = RESAMPLES,
                      level: float = LEVEL) -> dict[str, pd.DataFrame]:
    """Every table of the collective section, from one set of task resamples."""
    draws = TaskResamples(np.random.default_rng(seed), n)
    data = binned(df)
    return {
        "collective_rows": rows_table(data, draws, n, level),
        "collective_rounds": by_table(data, "round", draws, n, level),
        "collective_exposure": by_table(data, "exposure", draws, n, level),
        "collective_reach": by_table(data, "reach_bin", draws, n, level),
        "collective_gaps": by_table(data[data["gap"] > 0], "gap_bin", draws, n, level),
        "collective_paired": paired_table(data, draws, n, level),
        "collective_epilogue": epilogue_table(data, draws, n, level),
    }
