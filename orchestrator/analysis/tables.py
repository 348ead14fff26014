"""Every table of a run: the measures, CL-Bench's and PATH-Bench's, from one set of resamples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from orchestrator.analysis import arc3_tables, clbench, measures, pathbench


def run_measures(df: pd.DataFrame, cells: Mapping[str, Mapping[str, Any]],
                 rng: measures.Resampling, n: int = measures.RESAMPLES,
                 level: float = measures.LEVEL) -> dict[str, pd.DataFrame]:
    """Every table of a run by name, in a fixed order of draws (one seed, the same tables):
    `cells` (`measures.cell_table`), `exposure`, `gap`, `pooled` (over orders), `floor`
    (differences from the stateless floor), `twins` and `twins_pooled` (`measures.twin_table`),
    `clbench` and `clbench_pooled`, `pathbench` and `pathbench_pooled`, `transfer` (forward
    transfer), `failures` (failed instances by kind), `floor_pooled` (the floor differences
    pooled over orders). One set of task resamples
    (`measures.TaskResamples`) serves them all; pass the report's own to share its draws."""
    draws = measures.resamples_of(rng, n)
    return {
        "cells": measures.cell_table(df, draws, level=level),
        "exposure": measures.exposure_table(df),
        "gap": measures.gap_table(df),
        "pooled": measures.pooled_table(df, draws, level=level),
        "floor": measures.differences_from_floor(df, cells, draws, level=level),
        "twins": measures.twin_table(df, draws, level=level),
        "twins_pooled": measures.twin_table(df, draws, level=level, pool_orders=True),
        "clbench": clbench.clbench_table(df, draws, level=level),
        "clbench_pooled": clbench.clbench_table(df, draws, level=level, pool_orders=True),
        "pathbench": pathbench.pathbench_table(df, draws, level=level),
        "pathbench_pooled": pathbench.pathbench_table(df, draws, level=level, pool_orders=True),
        "transfer": measures.forward_transfer(df, draws, level=level),
        "failures": measures.failure_table(df),
        "floor_pooled": measures.floor_pooled_table(df, cells, draws, level=level),
        # last, so the draws of every table above are those of a run without arc3 levels
        **({"arc3": arc3_tables.arc3_table(df, draws, level=level)}
           if "level" in df and df["level"].notna().any() else {}),
    }
