"""CL-Bench's gain on carc's records (SPEC section 8; seed 000, Continual Learning Bench): the
matched stateful-against-stateless gain, normalized by the headroom, split into a stability and a
plasticity part that add up to it.

The seed's definitions, and how each is read here:

- Reward. Seed [13]-[15]: every task has a reward scale with a maximum r_max. Here the reward of
  an instance is 1 - budget share (1 - cost / 16), so r_max = 1 and higher is better.
- Stateful and stateless. Seed [13]: "Stateless (sl) systems condition only on the current
  instance ... independent of history"; the stateful (sf) run is "the same end-to-end system"
  with its state kept. Here the stateful run is a cell whose row keeps state (memory-on,
  asked-to-store, program-procedure) and the stateless run is its memory-off twin on the same
  schedule (`measures.twin_cells`: memory-off; the wiped row for the program library;
  program-procedure-wiped for program-procedure).
- Gain. Seed [14]: "g_t = r^sf_t - r^sl_t" for each instance t. Here t is a slot both cells
  finished, matched slot by slot on their identical schedule (the same instance in both runs).
- Normalized gain. Seed, "Cross-task normalization": first average the matched differences
  over the task schedule, then divide by the headroom r_max - mean stateless reward:
  g_hat = mean_t g_t / (r_max - mean_t r^sl_t). A CL-Bench task (one environment with one
  schedule) is a cell's schedule here: its stream and the held-out epilogue that follows it with
  nothing reset. The fresh reference is left out: both runs are wiped there by construction.
- Stability and plasticity. Seed [21]-[22]: each variant's first instance is a boundary
  instance, where "the system ... has only its prior accumulated state to draw on"; the others
  are within-variant instances that "follow at least one round of in-variant feedback".
  g_stab = f_bound (mean_bound r^sf - mean_bound r^sl) / (r_max - mean r^sl), g_plast the same
  over the within-variant instances with f_within, where f is the fraction of the schedule's
  instances in the part; "because every instance belongs to exactly one partition, the stability
  and plasticity components add to total normalized gain". Here a variant is an ARC task: the
  stability part covers the instances where the learner has had no feedback from the task yet,
  its first meetings (exposure 0) and the epilogue; the plasticity part the returning instances
  (exposure 1 and up). Since f_part * mean_part g = sum_part g / N, each part is
  sum over its instances of g / (N * headroom), and `normalized_gain` is computed as
  stability + plasticity, so the two parts add up to it exactly, bit for bit.

Intervals are the cluster bootstrap over tasks of `measures.task_bootstrap`: a resample draws
the tasks (stream and epilogue tasks alike) with replacement and recomputes every statistic,
headroom included, from the drawn tasks' instances.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from orchestrator.analysis import measures
from orchestrator.analysis.measures import LEVEL, RESAMPLES, Resampling
from orchestrator.rows import STATELESS_ROWS, row_name

REWARD_MAX = 1.0
PHASES = ("stream", "epilogue")  # the fresh reference is wiped in both runs: no state to match
_STATISTICS = ("mean_gain", "normalized_gain", "stability", "plasticity")
_SUMS = ("n", "stateful", "stateless", "gain_stability", "gain_plasticity", "n_stability")


def matched_pairs(df: pd.DataFrame, pool_orders: bool = False) -> pd.DataFrame:
    """Every instance both a stateful cell and its stateless twin finished, slot by slot over
    the stream and the epilogue: `key` (the stateful cell, or its group with `pool_orders`),
    `task`, `phase`, `slot`, `exposure`, `stateful` and `stateless` reward (1 - budget share),
    `gain` = stateful - stateless, and `stability` (True for a first meeting or the epilogue,
    False for a returning instance)."""
    data = measures.with_groups(df) if pool_orders else df
    name = measures.key_of_cells(data, "group" if pool_orders else "cell")
    rows = {c: row_name(r) for c, r in measures.key_of_cells(df, "row").items()}
    twins = {c: t for c, t in measures.twin_cells(df).items()
             if rows[c] not in STATELESS_ROWS}
    pairs = measures.paired_instances(df, [(name[c], c, t) for c, t in twins.items()], PHASES)
    stateful = REWARD_MAX - pairs["share_a"].astype(float)
    stateless = REWARD_MAX - pairs["share_b"].astype(float)
    return pd.DataFrame({
        "key": pairs["key"], "task": pairs["task"], "phase": pairs["phase"],
        "slot": pairs["slot"], "exposure": pairs["exposure"], "stateful": stateful,
        "stateless": stateless, "gain": stateful - stateless,
        "stability": (pairs["phase"] == "epilogue") | (pairs["exposure"] == 0)})


def _statistic(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    n = t["n"]
    headroom = REWARD_MAX - t["stateless"] / n
    stability = t["gain_stability"] / n / headroom
    plasticity = t["gain_plasticity"] / n / headroom
    return {"stateful_reward": t["stateful"] / n, "stateless_reward": t["stateless"] / n,
            "headroom": headroom,
            "mean_gain": (t["gain_stability"] + t["gain_plasticity"]) / n,
            # the total is the sum of its parts, so they add up exactly in every resample too
            "normalized_gain": stability + plasticity,
            "stability": stability, "plasticity": plasticity,
            "f_stability": t["n_stability"] / n}


def clbench_table(df: pd.DataFrame, rng: Resampling, n: int = RESAMPLES, level: float = LEVEL,
                  pool_orders: bool = False) -> pd.DataFrame:
    """Per stateful cell with a stateless twin (or per cell group pooled over orders: the slot
    pairs of every order's schedule together, one headroom from all of them): `stateless` (the
    twin), `n` matched instances, `n_stability` and `n_plasticity`, `f_stability` (their share
    at boundaries), mean `stateful_reward` and `stateless_reward`, `headroom`, and with bootstrap
    intervals over tasks `mean_gain`, `normalized_gain`, `stability` and `plasticity`
    (normalized_gain = stability + plasticity exactly). Positive is a gain from the state; NaN
    where the twin used no budget at all (no headroom)."""
    key = "group" if pool_orders else "cell"
    pairs = matched_pairs(df, pool_orders)
    gain = pairs["gain"].to_numpy(dtype=float)
    boundary = pairs["stability"].to_numpy(dtype=bool)
    sums = pd.DataFrame({
        "key": pairs["key"], "task": pairs["task"], "n": 1.0, "stateful": pairs["stateful"],
        "stateless": pairs["stateless"], "gain_stability": np.where(boundary, gain, 0.0),
        "gain_plasticity": np.where(boundary, 0.0, gain), "n_stability": boundary.astype(float)})
    estimate = measures.task_bootstrap(sums, "key", _statistic, rng, n, level)
    data = measures.with_groups(df) if pool_orders else df
    keys = list(estimate.index)
    settings = data.drop_duplicates(key).set_index(key)
    twin_of = measures.key_of_cells(data, key)
    stateless = {twin_of[c]: twin_of[t] for c, t in measures.twin_cells(df).items()}
    counts = pairs.groupby("key", sort=False)["stability"].agg(["size", "sum"]).reindex(keys)
    table = pd.DataFrame({
        key: keys, "label": settings["label"].reindex(keys).to_numpy(),
        "learner": settings["learner"].reindex(keys).to_numpy(),
        "row": [row_name(r) for r in settings["row"].reindex(keys)],
        "stateless": [stateless.get(k) for k in keys]})
    if pool_orders:
        table["orders"] = measures.group_settings(df)["orders"].reindex(keys).to_numpy()
    table["n"] = counts["size"].to_numpy(dtype="int64")
    table["n_stability"] = counts["sum"].to_numpy(dtype="int64")
    table["n_plasticity"] = table["n"] - table["n_stability"]
    for column in ("f_stability", "stateful_reward", "stateless_reward", "headroom"):
        table[column] = estimate[column].to_numpy()
    for column in _STATISTICS:
        for suffix in ("", "_lo", "_hi"):
            table[column + suffix] = estimate[column + suffix].to_numpy()
    return table
