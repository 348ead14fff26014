"""Two runs side by side (`carc compare RUN_A RUN_B`): every cell of A paired with the cell of B
that has the same learner, row, track, effort, order and grid seed, so the two are served the
same schedule (the same instance at every slot) while the model, the model's seed or anything
else of the runs may differ. Each pair is compared slot by slot with the same bootstrap over
tasks as every paired difference of a report (`measures.paired_instances`, the floor's
`paired_means`), with its sensitivity.

A collective run's cells pair the same way, each user's stream with the same user's stream of
B: the pairs are (user, slot), pooled over the users of the cell.

A pair whose slots serve different instances (the grids' tracks differ, e.g. another task count)
is not compared: it is listed with the slot that differs. A run with nothing to compare (no
finished instance of the phase, no cell on a schedule of the other run, no slot finished in
both) raises `NothingToCompare`, which names the run and what is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.analysis import measures
from orchestrator.analysis.report import load_run
from orchestrator.errors import ConfigError

MATCH = ("learner", "row", "track", "effort", "order", "seed")
COLUMNS = ["learner", "row", "track", "effort", "order", "seed", "cell_a", "cell_b", "model_a",
           "model_b", "budget_a", "budget_b", "mean", "lo", "hi", "bound", "mde", "pairs", "problem"]


class NothingToCompare(ConfigError):
    """Two runs with no pair of finished instances to compare; the message says which run lacks
    what."""


def _key(settings: Mapping[str, Any]) -> tuple:
    return tuple(str(settings.get(k)) for k in MATCH)


def _streams(run: Path, side: str, phase: str
             ) -> tuple[dict[str, dict[str, Any]], pd.DataFrame, dict[str, list[Any]]]:
    """A run's cells; its finished instances, `cell` renamed to the stream the instance is on
    (`A:<cell>` for a grid cell, `A:<cell>/u<user>` for a user of a collective cell); and each
    cell's users (one null user for a grid cell)."""
    cells, events = load_run(run, "instance_end")
    frame = measures.instances_frame(events, cells)
    if not (frame["phase"] == phase).any():
        raise NothingToCompare(
            f"{run}: no finished {phase} instance in any of its {len(cells)} cells (read from "
            "cells/<cell>/events.jsonl and, in a collective run, cells/<cell>/users/<user>/"
            "events.jsonl); run or resume it, or compare another --phase")
    users = {cell: list(dict.fromkeys(part)) for cell, part in frame.groupby("cell", sort=False)["user"]}
    frame["cell"] = [_stream(side, cell, user) for cell, user in zip(frame["cell"], frame["user"])]
    return cells, frame, users


def _stream(side: str, cell: str, user: Any) -> str:
    return f"{side}:{cell}" if pd.isna(user) else f"{side}:{cell}/u{user}"


def compare_runs(run_a: Path, run_b: Path, rng: np.random.Generator,
                 n: int = measures.RESAMPLES, level: float = measures.LEVEL,
                 phase: str = "stream") -> pd.DataFrame:
    """One row per cell of A with a partner in B: both budget shares over the paired slots, the
    slot-paired difference A - B with its interval, bound and MDE, and the number of pairs; or
    the problem that kept the pair from being compared. Raises `NothingToCompare` when no pair
    of slots is compared and no problem explains why."""
    cells_a, frame_a, users = _streams(run_a, "A", phase)
    cells_b, frame_b, _ = _streams(run_b, "B", phase)
    frame = pd.concat([frame_a, frame_b], ignore_index=True)
    partners = {_key(s): c for c, s in cells_b.items()}
    rows, compared = [], {}
    for cell_a, settings in cells_a.items():
        cell_b = partners.get(_key(settings))
        if cell_b is None:
            continue
        row = {**{k: settings.get(k) for k in MATCH}, "cell_a": cell_a, "cell_b": cell_b,
               "model_a": settings.get("model"), "model_b": cells_b[cell_b].get("model"),
               "problem": None}
        streams = [(cell_a, _stream("A", cell_a, u), _stream("B", cell_b, u)) for u in users.get(cell_a, [])]
        try:
            measures.paired_instances(frame, streams, (phase,))
            compared[cell_a] = streams
        except ValueError as exc:
            row["problem"] = str(exc)
        rows.append(row)
    if not rows:
        raise NothingToCompare(f"no cell of {run_a} has a cell of {run_b} with the same learner, "
                               "row, track, effort, order and seed; compare runs of one grid")
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in
                                        ("budget_a", "budget_b", "mean", "lo", "hi", "bound",
                                         "mde", "pairs")])
    pairs = measures.paired_instances(frame, [s for streams in compared.values() for s in streams],
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
    unpaired = (table["pairs"] == 0) & table["problem"].isna()
    table.loc[unpaired, "problem"] = f"no {phase} slot finished in both runs"
    if unpaired.all():
        raise NothingToCompare(f"no {phase} slot of {run_a} is finished in {run_b} too: the cells "
                               f"pair ({', '.join(table['cell_a'])}) but their finished slots do "
                               "not overlap; resume the runs, or compare another --phase")
    return table[COLUMNS]
