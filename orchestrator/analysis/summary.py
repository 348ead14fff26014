"""The report's opening summary: a few plain sentences written from the measures (as read back
from `results/measures.parquet`), so a reader knows in a minute what saved what.

Only what the intervals support is stated as a difference: a saving is named when its whole 95%
interval is below zero, a cost when above; everything else is "no measurable difference", with
the size of effect the run could have seen (the median minimum detectable effect). Pure: tables
in, sentences out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from orchestrator.analysis.measures import POWER


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _points(mean: float, lo: float, hi: float) -> str:
    """A paired difference as its size, with the interval of that size: a saving (negative
    difference) of 17.2 points with the difference's interval [-36.2, -3.9] reads "17.2 points
    [3.9, 36.2]", the words around it saying which way it went."""
    if mean < 0:
        mean, lo, hi = -mean, -hi, -lo
    return f"{100 * mean:.1f} points [{100 * lo:.1f}, {100 * hi:.1f}]"


def _name(row, many_seeds: bool) -> str:
    seed = f", seed {row.seed}" if many_seeds and hasattr(row, "seed") else ""
    return f"{row.label} at {row.effort} effort{seed}"


def _efforts_of(groups: pd.Series) -> pd.Series:
    """The effort in a group name (`label.effort.sSEED`)."""
    return groups.astype(str).str.split(".").str[-2]


def _differences(table: pd.DataFrame, mean: str, lo: str, hi: str, mde: str, what: str,
                 many_seeds: bool) -> list[str]:
    rows = table.dropna(subset=[mean])
    if rows.empty:
        return []
    saved = rows[rows[hi] < 0]
    cost = rows[rows[lo] > 0]
    parts = []
    if len(saved):
        parts.append(f"saved against {what}: " + "; ".join(
            f"{_name(r, many_seeds)}, {_points(getattr(r, mean), getattr(r, lo), getattr(r, hi))}"
            for r in saved.sort_values(mean).itertuples()))
    if len(cost):
        parts.append(f"used more than {what}: " + "; ".join(
            f"{_name(r, many_seeds)}, {_points(getattr(r, mean), getattr(r, lo), getattr(r, hi))}"
            for r in cost.sort_values(mean, ascending=False).itertuples()))
    rest = len(rows) - len(saved) - len(cost)
    if rest:
        sensitivity = float(np.nanmedian(rows[mde].to_numpy(float))) if mde in rows else float("nan")
        could = (f" (at {POWER:.0%} power the run could see differences of about "
                 f"{100 * sensitivity:.1f} points)") if np.isfinite(sensitivity) else ""
        parts.append(f"{'none' if rest == len(rows) else rest} of the {len(rows)} learner-effort "
                     f"pairs compared differed measurably from {what}{could}"
                     if rest == len(rows) else
                     f"the other {rest} of {len(rows)} showed no measurable difference from {what}{could}")
    return parts


def summary_lines(data: Mapping[str, pd.DataFrame], embedded: bool,
                  learners: Sequence[str] = ()) -> list[str]:
    """The summary as markdown bullet texts (without the bullet)."""
    lines = []
    cells, pooled = data.get("cells", pd.DataFrame()), data.get("pooled", pd.DataFrame())
    if cells.empty:
        return ["No finished instance yet."]
    many_seeds = "seed" in pooled and pooled["seed"].nunique() > 1
    if embedded:
        lines.append("This run used carc's embedded offline model: a harness row measures the "
                     "harness's delivery path (does what gets kept come back?), not what a real "
                     "model would choose to keep.")
    orders = sorted({o.strip() for value in pooled.get("orders", pd.Series(dtype=str)) for o in str(value).split(",")})
    lines.append(f"{len(cells)} cell{'s' if len(cells) != 1 else ''}, {int(cells['n'].sum()):,} finished stream instances over "
                 f"{int(cells['tasks'].max())} tasks; orders: {', '.join(orders)}; figures pooled "
                 "over orders, intervals 95% bootstrap over tasks.")
    if len(pooled):
        for effort, rows in pooled.groupby("effort", sort=False):
            best = rows.sort_values("budget").iloc[0]
            floor = rows[rows["learner"] == "stateless-floor"]
            floor_text = (f"; the stateless floor {_pct(floor['budget'].iloc[0])}" if len(floor)
                          and floor.index[0] != best.name else "")
            lines.append(f"At {effort} effort the cheapest was {best['label']}: "
                         f"{_pct(best['budget'])} of the budget [{_pct(best['budget_lo'])}, "
                         f"{_pct(best['budget_hi'])}], solving {_pct(best['solved'])}{floor_text}.")
    floor = data.get("floor_pooled", pd.DataFrame())
    if len(floor):
        lines += [p[0].upper() + p[1:] + "." for p in
                  _differences(floor, "mean", "lo", "hi", "mde", "the stateless floor", many_seeds)]
    twins = data.get("twins_pooled", pd.DataFrame())
    if len(twins):
        twins = twins.assign(effort=_efforts_of(twins["group"]))
        memory = _differences(twins, "twin_mean", "twin_lo", "twin_hi", "twin_mde",
                              "its memory-off twin", many_seeds)
        lines += ["Memory on against memory off: " + p + "." for p in memory]
        beyond = twins[~twins["learner"].isin(["demo-cache-floor", "stateless-floor"])]  # the floor: its mirror is above
        lines += [p[0].upper() + p[1:] + "." for p in
                  _differences(beyond, "demo_cache_mean", "demo_cache_lo", "demo_cache_hi",
                               "demo_cache_mde", "the demo-cache floor", many_seeds)]
    transfer = data.get("transfer", pd.DataFrame())
    if len(transfer):
        helped = transfer[transfer["hi"] < 0]
        hurt = transfer[transfer["lo"] > 0]
        text = "Forward transfer (held-out epilogue minus the fresh reference): "
        if len(helped) or len(hurt):
            text += "; ".join([f"{r.cell} saved {_points(r.mean, r.lo, r.hi)}" for r in helped.itertuples()]
                              + [f"{r.cell} used {_points(r.mean, r.lo, r.hi)} more" for r in hurt.itertuples()])
        else:
            text += f"no cell measurably helped or hurt ({len(transfer)} cells)"
        lines.append(text + ".")
    failures = data.get("failures", pd.DataFrame())
    kinds = [c for c in failures.columns if c not in ("cell", "instances failed", "wrong-answers")]
    other = {k: int(failures[k].sum()) for k in kinds if failures[k].sum() > 0}
    if other:
        lines.append("Failed for other reasons than wrong answers (each charged the full budget): "
                     + ", ".join(f"{k} {n:,}" for k, n in sorted(other.items(), key=lambda kv: -kv[1]))
                     + ".")
    compute = data.get("compute", pd.DataFrame())
    if len(compute):
        usd = float(compute["usd"].sum())
        lines.append(f"Model calls: {int(compute['calls'].sum()):,} ({int(compute['retries'].sum()):,} "
                     f"retries, {int(compute['errors'].sum()):,} errors), "
                     f"{int(compute['prompt_tokens'].sum() + compute['completion_tokens'].sum()):,} "
                     f"tokens, ${usd:,.2f}"
                     + (f" ({int(compute['unpriced'].sum()):,} calls of an unpriced model)"
                        if compute["unpriced"].sum() else "") + ".")
    stopped = data.get("stopped", pd.DataFrame())
    if len(stopped):
        lines.append(f"{len(stopped)} cell(s) stopped at limits.usd_per_cell; see the last sections.")
    return lines
