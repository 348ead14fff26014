"""PATH-Bench's lifelong-learning metrics on carc's records (SPEC section 8; seed 001, PATH-Bench,
section 3.3 "Evaluation Protocol"): average performance (AP), forward transfer (FWT), backward
transfer (BWT) and forgetting (FGT), with each task's stream visits as a probe trajectory.

The seed's definitions, and how each is read here:

- Probe trajectory. Seed 3.1: "the i-th occurrence of the probe sees a history prefix H_i,
  yielding the trajectory p_i = P_q(H_i)". Here every stream task is a probe: its visits, in
  visit order (visit 0, 1, ...), are its occurrences, and the history between two visits is the
  stream in between. Unlike the seed, where "repeated occurrences of T_probe serve exclusively
  as evaluation probes" and only intervening tasks update the learner, every visit here is also
  experience (the learner buys pairs and hears verdicts on it), so the transfer measured includes
  what a learner keeps from the probe's own earlier visits: that is the learning Continual-ARC
  is about.
- Score. Seed 3.2 scores a task by completion (BigCodeBench) or by the share of subtasks
  completed (WildToolBench), higher is better. Here the default score of a visit is its reward
  1 - budget share (graded, like the seed's WildToolBench score, and the benchmark's own scale);
  `score="solved"` uses 1 for a solved instance and 0 for a failed one (the completion score).
- Cold start and warm reference. Seed 3.3: "p_cold = p_1", the probe before any
  sequence-specific experience; a warm-up block then gives "the post-warm-up reference
  p_warm = p_2"; occurrences i = 3..n are the measurement probes. Here p_cold is the score of
  visit 0 (the first meeting), p_warm of visit 1 (after the first meeting, the most related
  warm-up there is), and visits 2 and up are the measurement probes.
- AP = (1/L) sum_l p_l over all L task executions, probes and intervening tasks alike. Here:
  the mean score over all stream instances of the cell (the epilogue is not a trajectory and is
  under forward transfer in `orchestrator.analysis.measures`).
- FWT = 1/(n-2) sum_{i=3..n} (p_i - p_cold); BWT = 1/(n-2) sum_{i=3..n} max(0, p_i - p_warm);
  FGT = 1/(n-2) sum_{i=3..n} max(0, p_warm - p_i) (lower is better). The seed averages these
  per sequence and then over its sampled sequences; here each task is one sequence and the
  cell's value is the mean of the terms over all measurement probes of all its tasks, so a task
  counts with its number of measurement probes; with every task visited equally often (8 visits:
  6 measurement probes each) that is exactly the mean over tasks of the seed's per-sequence
  value. A visit whose task has no finished visit 0 is left out of FWT, one without a finished
  visit 1 out of BWT and FGT.

Intervals are the cluster bootstrap over tasks of `measures.task_bootstrap` (a task's whole
trajectory is resampled together).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from orchestrator.errors import ConfigError
from orchestrator.analysis import measures
from orchestrator.analysis.measures import LEVEL, RESAMPLES, Resampling
from orchestrator.rows import row_name

SCORES = ("reward", "solved")
_METRICS = ("ap", "fwt", "bwt", "fgt", "cold", "warm")


def visit_scores(df: pd.DataFrame, score: str = "reward") -> pd.Series:
    """The PATH-Bench score of each instance: 1 - budget share (`reward`) or solved (1 or 0)."""
    if score not in SCORES:
        raise ConfigError(f"unknown PATH-Bench score {score!r}; use one of {', '.join(SCORES)}")
    return 1.0 - df["share"].astype(float) if score == "reward" else df["solved"].astype(float)


def probe_trajectories(df: pd.DataFrame, score: str = "reward") -> pd.DataFrame:
    """The stream instances as probe trajectories: cell, task, visit, slot, `p` (the score),
    `p_cold` (the score of the task's visit 0 in the cell) and `p_warm` (of its visit 1), NaN
    where that visit is unfinished; `measured` is True for the measurement probes (visit 2 up)."""
    stream = df[df["phase"] == "stream"]
    out = pd.DataFrame({"cell": stream["cell"], "task": stream["task"], "visit": stream["visit"],
                        "slot": stream["slot"], "p": visit_scores(stream, score)})
    for column, visit in (("p_cold", 0), ("p_warm", 1)):
        reference = out[out["visit"] == visit].set_index(["cell", "task"])["p"]
        at = pd.MultiIndex.from_frame(out[["cell", "task"]])
        out[column] = reference.reindex(at).to_numpy(dtype=float)
    out["measured"] = out["visit"] >= 2
    return out.sort_values(["cell", "task", "visit"], kind="stable")


def pathbench_table(df: pd.DataFrame, rng: Resampling, n: int = RESAMPLES, level: float = LEVEL,
                    score: str = "reward", pool_orders: bool = False) -> pd.DataFrame:
    """Per cell (or per cell group pooled over orders: every order's trajectories together):
    `n` stream instances, `tasks`, `probes` (measurement probes, visit 2 and up), and with
    bootstrap intervals over tasks `ap`, `fwt`, `bwt`, `fgt` (see the module docstring), `cold`
    (mean p_cold, first meetings) and `warm` (mean p_warm, second meetings). Scores are in
    [0, 1], higher is better, except FGT where lower is better."""
    key = "group" if pool_orders else "cell"
    data = measures.with_groups(df) if pool_orders else df
    probes = probe_trajectories(data, score)
    probes[key] = probes["cell"].map(measures.key_of_cells(data, key))
    p, measured = probes["p"].to_numpy(float), probes["measured"].to_numpy(bool)
    cold, warm = probes["p_cold"].to_numpy(float), probes["p_warm"].to_numpy(float)
    values = {
        "ap": p,
        "fwt": np.where(measured, p - cold, np.nan),
        "bwt": np.where(measured, np.maximum(0.0, p - warm), np.nan),
        "fgt": np.where(measured, np.maximum(0.0, warm - p), np.nan),
        "cold": np.where(probes["visit"] == 0, p, np.nan),
        "warm": np.where(probes["visit"] == 1, p, np.nan),
    }
    sums = measures.mean_sums(probes[[key, "task"]], values)
    estimate = measures.task_bootstrap(sums, key, measures.means(_METRICS), rng, n, level)
    keys = [k for k in pd.unique(data[key]) if k in estimate.index]
    g = probes.groupby(key, sort=False)
    settings = data.drop_duplicates(key).set_index(key)
    table = pd.DataFrame({
        key: keys, "label": settings["label"].reindex(keys).to_numpy(),
        "learner": settings["learner"].reindex(keys).to_numpy(),
        "row": [row_name(r) for r in settings["row"].reindex(keys)]})
    if pool_orders:
        table["orders"] = measures.group_settings(df)["orders"].reindex(keys).to_numpy()
    table["score"] = score
    table["n"] = g.size().reindex(keys).to_numpy(dtype="int64")
    table["tasks"] = g["task"].nunique().reindex(keys).to_numpy(dtype="int64")
    table["probes"] = g["measured"].sum().reindex(keys).to_numpy(dtype="int64")
    for column in _METRICS:
        for suffix in ("", "_lo", "_hi"):
            table[column + suffix] = estimate.loc[keys, column + suffix].to_numpy()
    return table
