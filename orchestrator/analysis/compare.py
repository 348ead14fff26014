"""Two runs side by side (`carc compare RUN_A RUN_B`): every cell of A paired with the cell of B
that has the same learner, row, track, effort, order and grid seed, so the two are served the
same schedule (the same instance at every slot) while the model, the model's seed or anything
else of the runs may differ. Each pair is compared slot by slot with the same bootstrap over
tasks as every paired difference of a report (`measures.paired_instances`, the floor's
`paired_means`), with its sensitivity.

A pair whose slots serve different instances (the grids' tracks differ, e.g. another task count)
is not compared: it is listed with the slot that differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.analysis import measures
from orchestrator.analysis.report import load_run

MATCH = ("learner", "row", "track", "effort", "order", "seed")
COLUMNS = ["learner", "row", "track", "effort", "order", "seed", "cell_a", "cell_b", "model_a",
           "model_b", "budget_a", "budget_b", "mean", "lo", "hi", "bound", "mde", "pairs", "problem"]


def _key(settings: Mapping[str, Any]) -> tuple:
    return tuple(str(settings.get(k)) for k in MATCH)


def compare_runs(run_a: Path, run_b: Path, rng: np.random.Generator,
                 n: int = measures.RESAMPLES, level: float = measures.LEVEL,
                 phase: str = "stream") -> pd.DataFrame:
    """One row per cell of A with a partner in B: both budget shares over the paired slots, the
    slot-paired difference A - B with its interval, bound and MDE, and the number of pairs; or
    the problem that kept the pair from being compared."""
    cells_a, events_a = load_run(run_a)
    cells_b, events_b = load_run(run_b)
    frame = pd.concat([
        measures.instances_frame({f"A:{c}": e for c, e in events_a.items()},
                                 {f"A:{c}": s for c, s in cells_a.items()}),
        measures.instances_frame({f"B:{c}": e for c, e in events_b.items()},
                                 {f"B:{c}": s for c, s in cells_b.items()})], ignore_index=True)
    partners = {_key(s): c for c, s in cells_b.items()}
    rows, compared = [], []
    for cell_a, settings in cells_a.items():
        cell_b = partners.get(_key(settings))
        if cell_b is None:
            continue
        row = {**{k: settings.get(k) for k in MATCH}, "cell_a": cell_a, "cell_b": cell_b,
               "model_a": settings.get("model"), "model_b": cells_b[cell_b].get("model"),
               "problem": None}
        try:
            measures.paired_instances(frame, [(cell_a, f"A:{cell_a}", f"B:{cell_b}")], (phase,))
            compared.append(cell_a)
        except ValueError as exc:
            row["problem"] = str(exc)
        rows.append(row)
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in
                                        ("budget_a", "budget_b", "mean", "lo", "hi", "bound",
                                         "mde", "pairs")])
    partner_of = dict(zip(table["cell_a"], table["cell_b"]))
    pairs = measures.paired_instances(frame, [(c, f"A:{c}", f"B:{partner_of[c]}") for c in compared],
                                      (phase,))
    draws = measures.resamples_of(rng, n)
    paired = measures.paired_means(pairs, draws, n, level) if len(pairs) else pd.DataFrame()
    shares = pairs.groupby("key", sort=False)[["share_a", "share_b"]].mean() if len(pairs) else None
    for column, source in (("budget_a", "share_a"), ("budget_b", "share_b")):
        table[column] = [shares.at[c, source] if shares is not None and c in shares.index else np.nan
                         for c in table["cell_a"]]
    for column, source in (("mean", "mean"), ("lo", "mean_lo"), ("hi", "mean_hi"),
                           ("bound", "mean_bound"), ("mde", "mean_mde"), ("pairs", "pairs")):
        table[column] = [paired.at[c, source] if c in paired.index else np.nan
                         for c in table["cell_a"]]
    table["pairs"] = table["pairs"].fillna(0).astype("int64")
    return table[COLUMNS]
