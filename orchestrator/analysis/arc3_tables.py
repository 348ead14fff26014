"""The arc3 track's own measures: per cell, levels played and completed, the budget share, time
per level, and the seed's retention view: the budget at the first and at the second meeting of
the same level, paired by (game, level), with the bootstrap over games (the track's tasks).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from orchestrator.analysis import measures

COLUMNS = ["cell", "levels", "solved", "budget", "budget_lo", "budget_hi", "s_per_level",
           "pairs", "first_meeting", "second_meeting", "second_minus_first",
           "second_minus_first_lo", "second_minus_first_hi"]


def arc3_levels(df: pd.DataFrame) -> pd.DataFrame:
    """The stream instances that are arc3 levels, each with `meeting`: how many times the cell
    met this (game, level) before."""
    levels = df[df["level"].notna() & (df["phase"] == "stream")].sort_values(["cell", "slot"], kind="stable")
    levels = levels.assign(level=levels["level"].astype("int64"))
    return levels.assign(meeting=levels.groupby(["cell", "task", "level"]).cumcount())


def arc3_table(df: pd.DataFrame, rng: measures.Resampling, n: int = measures.RESAMPLES,
               level: float = measures.LEVEL) -> pd.DataFrame:
    levels = arc3_levels(df)
    if levels.empty:
        return pd.DataFrame(columns=COLUMNS)
    draws = measures.resamples_of(rng, n)
    overall = measures.task_bootstrap(
        levels.assign(one=1.0)[["cell", "task", "share", "one"]], "cell",
        lambda t: {"budget": t["share"] / t["one"]}, draws, level=level)
    first = levels[levels["meeting"] == 0].set_index(["cell", "task", "level"])["share"]
    second = levels[levels["meeting"] == 1].set_index(["cell", "task", "level"])["share"]
    both = pd.concat({"first": first, "second": second}, axis=1).dropna().reset_index()
    if both.empty:
        paired = pd.DataFrame(columns=["second_minus_first", "second_minus_first_lo",
                                       "second_minus_first_hi", "first", "second"])
    else:
        paired = measures.task_bootstrap(
            both.assign(pairs=1.0, diff=both["second"] - both["first"])[
                ["cell", "task", "first", "second", "diff", "pairs"]], "cell",
            lambda t: {"second_minus_first": t["diff"] / t["pairs"], "first": t["first"] / t["pairs"],
                       "second": t["second"] / t["pairs"]}, draws, level=level)
    rows = []
    for cell, group in levels.groupby("cell", sort=False):
        if cell in paired.index:
            p = paired.loc[cell]
            retention = [p["first"], p["second"], p["second_minus_first"], p["second_minus_first_lo"],
                         p["second_minus_first_hi"]]
        else:
            retention = [np.nan] * 5
        rows.append([cell, len(group), float(group["solved"].mean()),
                     *overall.loc[cell, ["budget", "budget_lo", "budget_hi"]],
                     float(group["wall_s"].mean()), int((both["cell"] == cell).sum()), *retention])
    return pd.DataFrame(rows, columns=COLUMNS)
