"""The figures of a run's report, drawn with matplotlib (Agg, no pyplot state) as PNG bytes: budget
against exposure index, budget on returning instances against the gap since last seen, slot-paired
savings against the stateless floor, and compute against budget share.

Two halves. The curve adapters turn the instance frame of `orchestrator.analysis.measures` into the points
a figure shows, with the same cluster bootstrap over tasks as every table (one tasks x resamples
count matrix per task list, shared by every point of every cell on that schedule). The drawing
functions take those frames, or the analysis tables, and return PNG bytes; the same frames give
the same bytes.
"""

from __future__ import annotations

import io

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from orchestrator.analysis import measures

WIDTH = 8.0  # inches; at DPI 110 a figure fits the report column without scaling
DPI = 110
LEGEND_MAX = 12  # above this many cells a legend hides the plot; the tables name them instead
CURVE_COLUMNS = ["cell", "label", "name", "x", "budget", "lo", "hi", "instances", "tasks"]


# --- the points of the curves -------------------------------------------------------------------

def cell_names(cells: pd.Series, labels: pd.Series) -> dict[str, str]:
    """Short names for a legend: the labels when they are unique, else the cell ids without the
    dot-separated parts every cell shares (`stateless-floor.low.workstreams.s0` -> `...low`)."""
    pairs = dict(zip(cells, labels))
    if len(set(pairs.values())) == len(pairs):
        return {c: str(label) for c, label in pairs.items()}
    parts = [str(c).split(".") for c in pairs]
    if len({len(p) for p in parts}) != 1:
        return {c: str(c) for c in pairs}
    varying = [k for k in range(len(parts[0])) if len({p[k] for p in parts}) > 1]
    return {c: ".".join(p[k] for k in varying) for c, p in zip(pairs, parts)}


def budget_curves(df: pd.DataFrame, by: str, rng: np.random.Generator,
                  n: int = measures.RESAMPLES, level: float = measures.LEVEL) -> pd.DataFrame:
    """Per cell and integer value `x` of column `by`: mean budget share of the rows, with a
    percentile interval from a bootstrap over the cell's tasks. One resample of a cell's tasks
    serves every point of its curve (and every cell with the same tasks), so on a full schedule
    a point's interval is what `bootstrap_mean_ci` gives on that point's rows alone. Rows with
    `by` missing are left out; cells in frame order."""
    data = df.dropna(subset=[by])
    names = cell_names(data["cell"].drop_duplicates(), data.drop_duplicates("cell")["label"])
    tail = (1.0 - level) / 2.0
    # per task list, the cells with it: (cell, label, xs, per-task sums, per-task counts)
    schedules: dict[tuple, list[tuple]] = {}
    for cell_id, g in data.groupby("cell", sort=False):
        task_codes, tasks = pd.factorize(g["task"], sort=True)
        x_codes, xs = pd.factorize(g[by].astype("int64"), sort=True)
        where, size = task_codes * len(xs) + x_codes, len(tasks) * len(xs)
        shape = (len(tasks), len(xs))
        sums = np.bincount(where, weights=g["share"].to_numpy(float), minlength=size)
        counts = np.bincount(where, minlength=size).astype(float)
        schedules.setdefault(tuple(tasks), []).append(
            (cell_id, g["label"].iloc[0], np.asarray(xs, "int64"), sums.reshape(shape),
             counts.reshape(shape)))
    parts = {}
    for tasks, group in schedules.items():
        # cells on one schedule share a task list and so one resample of it: each cell's
        # interval is still its own task bootstrap, and all its points are one matrix product
        weights = measures.task_resample_counts(len(tasks), rng, n).astype(float)
        sums = np.hstack([g[3] for g in group])
        counts = np.hstack([g[4] for g in group])
        with np.errstate(invalid="ignore", divide="ignore"):
            stats = (weights @ sums) / (weights @ counts)
        lo, hi = np.quantile(stats, [tail, 1.0 - tail], axis=0)
        gaps = np.isnan(stats).any(axis=0)
        if gaps.any():  # a resample that drew no task with some x has no mean there: left out
            lo[gaps], hi[gaps] = np.nanquantile(stats[:, gaps], [tail, 1.0 - tail], axis=0)
        start = 0
        for cell_id, label, xs, cell_sums, cell_counts in group:
            points = slice(start, start + len(xs))
            start += len(xs)
            parts[cell_id] = pd.DataFrame({
                "cell": cell_id, "label": label, "name": names[cell_id], "x": xs,
                "budget": cell_sums.sum(0) / cell_counts.sum(0), "lo": lo[points],
                "hi": hi[points], "instances": cell_counts.sum(0).astype("int64"),
                "tasks": (cell_counts > 0).sum(0)})
    if not parts:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    return pd.concat([parts[c] for c in names], ignore_index=True)


def exposure_curves(df: pd.DataFrame, rng: np.random.Generator, n: int = measures.RESAMPLES,
                    level: float = measures.LEVEL) -> pd.DataFrame:
    """Budget share of stream instances by exposure index (`x`), per cell, with intervals."""
    return budget_curves(df[df["phase"] == "stream"], "exposure", rng, n, level)


def group_exposure_curves(df: pd.DataFrame, rng: np.random.Generator, n: int = measures.RESAMPLES,
                          level: float = measures.LEVEL) -> pd.DataFrame:
    """`exposure_curves` per cell group pooled over stream orders (`measures.with_groups`), with
    the group's `effort`: the points of the small multiples, one panel per effort."""
    stream = measures.with_groups(df[df["phase"] == "stream"])
    if stream.empty:
        return pd.DataFrame(columns=[*CURVE_COLUMNS, "effort"])
    curves = budget_curves(stream.assign(cell=stream["group"]), "exposure", rng, n, level)
    effort = stream.drop_duplicates("group").set_index("group")["effort"]
    return curves.assign(effort=curves["cell"].map(effort).to_numpy())


def returning_gaps(df: pd.DataFrame) -> pd.DataFrame:
    """`measures.returning_gaps` with `gap_bin`, the index of its bin in `measures.GAP_EDGES`
    (1, 2-3, 4-7, ..., 64+), so the figure and the gap table bin alike."""
    gaps = measures.returning_gaps(df)
    edges = np.asarray(measures.GAP_EDGES)
    return gaps.assign(gap_bin=np.searchsorted(edges, gaps["gap"].to_numpy(), side="right") - 1)


def gap_label(gap_bin: int) -> str:
    """The slots a gap bin covers: `1`, `2–3`, `4–7`, ..., `64+`."""
    return measures.gap_bin_labels()[gap_bin]


def gap_curves(df: pd.DataFrame, rng: np.random.Generator, n: int = measures.RESAMPLES,
               level: float = measures.LEVEL) -> pd.DataFrame:
    """Budget share of returning stream instances by gap bin (`x`, see `returning_gaps`), per cell,
    with intervals."""
    return budget_curves(returning_gaps(df), "gap_bin", rng, n, level)


# --- drawing -------------------------------------------------------------------------------------

def _figure(height: float) -> Figure:
    figure = Figure(figsize=(WIDTH, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)  # Agg, and no pyplot: no display, no global figure state
    figure.set_facecolor("white")
    return figure


def _png(figure: Figure) -> bytes:
    out = io.BytesIO()
    # no Software/date metadata: the same data must give the same bytes
    figure.savefig(out, format="png", dpi=DPI, metadata={"Software": None})
    return out.getvalue()


def _colours(count: int) -> list:
    if count <= 10:
        return [matplotlib.colormaps["tab10"](k) for k in range(count)]
    if count <= 20:
        return [matplotlib.colormaps["tab20"](k) for k in range(count)]
    return [matplotlib.colormaps["viridis"](k / (count - 1)) for k in range(count)]


def _legend(axes, count: int, mark: str = "line") -> None:
    if count <= LEGEND_MAX:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    else:
        note = f"{count} cells,\none {mark} each;\nnames and intervals\nin the tables"
        axes.text(1.01, 1.0, note, transform=axes.transAxes, va="top", fontsize=8)


def _message(text: str) -> bytes:
    figure = _figure(1.2)
    figure.text(0.5, 0.5, text, ha="center", va="center", fontsize=10)
    return _png(figure)


def _curves(curves: pd.DataFrame, xlabel: str, ticks: dict[int, str], title: str) -> bytes:
    """Budget share (%) against a discrete x, one dodged error-bar line per cell."""
    if curves.empty:
        return _message(f"{title}: no finished instance yet")
    figure = _figure(4.2)
    axes = figure.add_subplot()
    cells = list(dict.fromkeys(curves["cell"]))
    colours = _colours(len(cells))
    step = min(0.08, 0.6 / len(cells))  # dodge so the intervals of cells do not overlap
    positions = {x: k for k, x in enumerate(sorted(ticks))}
    many = len(cells) > LEGEND_MAX  # then thin lines without bars; the tables carry intervals
    for k, cell_id in enumerate(cells):
        c = curves[curves["cell"] == cell_id]
        xs = c["x"].map(positions).to_numpy(float)
        mean = 100 * c["budget"].to_numpy(float)
        if many:
            axes.plot(xs, mean, color=colours[k], linewidth=0.8, alpha=0.45)
            continue
        bars = np.vstack([mean - 100 * c["lo"].to_numpy(float),
                          100 * c["hi"].to_numpy(float) - mean])
        axes.errorbar(xs + (k - (len(cells) - 1) / 2) * step, mean, yerr=bars,
                      color=colours[k], marker="o", markersize=3.5, linewidth=1.2,
                      elinewidth=0.9, capsize=2, label=c["name"].iloc[0])
    axes.set_xticks(range(len(positions)), [ticks[x] for x in sorted(ticks)],
                    rotation=30 if sum(len(t) for t in ticks.values()) > 40 else 0)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("budget share (%)")
    axes.set_ylim(bottom=0)
    axes.grid(axis="y", alpha=0.3)
    axes.set_title(title, fontsize=11)
    _legend(axes, len(cells))
    return _png(figure)


def budget_by_exposure(curves: pd.DataFrame) -> bytes:
    """Line chart of `exposure_curves`: budget share (%) against exposure index, per cell, with
    95% bootstrap-over-tasks intervals as error bars (above `LEGEND_MAX` cells, thin lines)."""
    ticks = {int(x): str(int(x)) for x in curves["x"].unique()}
    return _curves(curves, "exposure index (times the task was met before)", ticks,
                   "Budget against exposure index (stream)")


def _ordered(values, order: tuple[str, ...]) -> list:
    present = list(dict.fromkeys(values))
    return sorted(present, key=lambda v: (order.index(v) if v in order else len(order), str(v)))


EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max")


def exposure_panels(curves: pd.DataFrame, learners: tuple[str, ...] = ()) -> bytes:
    """Small multiples of `group_exposure_curves`: one panel per effort (shared y), one line per
    learner (the same colour in every panel) with 95% bootstrap-over-tasks intervals; the seed's
    key figure. A flat line relearns every time; a step at exposure 1 is a cache of the
    examples; learning falls below that step."""
    if curves.empty:
        return _message("Budget against exposure index: no finished stream instance yet")
    efforts = _ordered(curves["effort"], EFFORTS)
    labels = _ordered(curves["label"], learners)
    colours = dict(zip(labels, _colours(len(labels))))
    per_row = min(len(efforts), 3)
    rows = -(-len(efforts) // per_row)
    figure = _figure(0.6 + 3.2 * rows)
    grid = figure.subplots(rows, per_row, sharey=True, squeeze=False)
    step = min(0.08, 0.6 / max(len(labels), 1))
    top = 100 * float(np.nanmax(curves["hi"].to_numpy(float))) if len(curves) else 100
    for k, axes in enumerate(grid.flat):
        if k >= len(efforts):
            axes.set_visible(False)
            continue
        panel = curves[curves["effort"] == efforts[k]]
        for j, label in enumerate(labels):
            for cell_id in dict.fromkeys(panel.loc[panel["label"] == label, "cell"]):
                c = panel[panel["cell"] == cell_id]
                mean = 100 * c["budget"].to_numpy(float)
                bars = np.vstack([mean - 100 * c["lo"].to_numpy(float),
                                  100 * c["hi"].to_numpy(float) - mean])
                axes.errorbar(c["x"].to_numpy(float) + (j - (len(labels) - 1) / 2) * step, mean,
                              yerr=bars, color=colours[label], marker="o", markersize=3,
                              linewidth=1.1, elinewidth=0.8, capsize=1.5,
                              label=label if k == 0 else None)
        axes.set_title(f"effort: {efforts[k]}", fontsize=10)
        axes.set_xticks(sorted({int(x) for x in curves["x"]}))
        axes.set_xlabel("exposure index", fontsize=9)
        axes.set_ylim(0, max(5.0, min(100.0, top * 1.05)))
        axes.grid(axis="y", alpha=0.3)
        if k % per_row == 0:
            axes.set_ylabel("budget share (%)")
    figure.suptitle("Budget against exposure index, pooled over stream orders", fontsize=11)
    figure.legend(loc="outside lower center", ncol=min(len(labels), 4), fontsize=8, frameon=False)
    return _png(figure)


def savings_panels(floor: pd.DataFrame, twins: pd.DataFrame, learners: tuple[str, ...] = ()) -> bytes:
    """The seed's paired-savings dot plot, pooled over stream orders: per learner (rows) and
    effort (colour), the slot-paired difference from the stateless floor (left) and from the
    demo-cache floor (right) in points of budget with 95% intervals; left of zero is a saving."""
    demo = twins.dropna(subset=["demo_cache_mean"]) if len(twins) else twins
    if floor.empty and (demo is None or demo.empty):
        return _message("No cell has a stateless floor or a demo-cache floor on its schedule.")
    panels = [("against the stateless floor", floor, "mean", "lo", "hi"),
              ("against the demo-cache floor", demo, "demo_cache_mean", "demo_cache_lo", "demo_cache_hi")]
    panels = [p for p in panels if p[1] is not None and not p[1].empty]
    effort_of = {}
    for frame in (floor, twins):
        if len(frame) and "effort" in frame:
            effort_of.update(zip(frame["group"], frame["effort"]))
    labels = _ordered([l for _, f, *_ in panels for l in f["label"]], learners)
    efforts = _ordered([effort_of.get(g, str(g).split(".")[-2]) for _, f, *_ in panels
                        for g in f["group"]], EFFORTS)
    colours = dict(zip(efforts, _colours(len(efforts))))
    figure = _figure(1.4 + 0.42 * len(labels))
    grid = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    offsets = {e: (k - (len(efforts) - 1) / 2) * min(0.22, 0.7 / len(efforts)) for k, e in enumerate(efforts)}
    ys = {label: len(labels) - 1 - k for k, label in enumerate(labels)}  # first learner on top
    for axes, (title, frame, mean_c, lo_c, hi_c) in zip(grid, panels):
        for effort in efforts:
            rows = frame[[effort_of.get(g, str(g).split(".")[-2]) == effort for g in frame["group"]]]
            if rows.empty:
                continue
            mean = 100 * rows[mean_c].to_numpy(float)
            bars = np.vstack([mean - 100 * rows[lo_c].to_numpy(float), 100 * rows[hi_c].to_numpy(float) - mean])
            axes.errorbar(mean, [ys[l] + offsets[effort] for l in rows["label"]], xerr=bars, fmt="o",
                          color=colours[effort], markersize=4, capsize=2, elinewidth=1,
                          label=effort if axes is grid[0] else None)
        axes.axvline(0, color="#555555", linewidth=0.9, linestyle="--")
        axes.set_title(title, fontsize=10)
        axes.set_xlabel("difference in budget share (points)", fontsize=9)
        axes.grid(axis="x", alpha=0.3)
    grid[0].set_yticks(list(ys.values()), list(ys), fontsize=8)
    grid[0].set_ylim(-0.7, len(labels) - 0.3)
    figure.suptitle("Slot-paired savings, pooled over stream orders (negative is a saving)", fontsize=11)
    figure.legend(title="effort", loc="outside lower center", ncol=len(efforts), fontsize=8,
                  title_fontsize=8, frameon=False)
    return _png(figure)


def budget_by_gap(curves: pd.DataFrame) -> bytes:
    """Line chart of `gap_curves`: budget share (%) of returning instances against the binned gap
    since the task was last seen, per cell, with 95% bootstrap-over-tasks intervals (above
    `LEGEND_MAX` cells, thin lines)."""
    ticks = {int(x): gap_label(int(x)) for x in curves["x"].unique()}
    return _curves(curves, "instances since the task was last seen (binned)", ticks,
                   "Budget on returning instances against the gap since last seen")


def savings_against_floor(differences: pd.DataFrame) -> bytes:
    """Dot plot of `measures.differences_from_floor`: per cell, the slot-paired difference from
    its stateless floor in points of budget with its interval; left of zero is a saving."""
    if differences.empty:
        return _message("No cell has a stateless-floor cell on its schedule.")
    names = cell_names(differences["cell"], differences["label"])
    rows = differences.iloc[::-1]  # first cell on top
    figure = _figure(1.2 + 0.28 * len(rows))
    axes = figure.add_subplot()
    mean = 100 * rows["mean"].to_numpy(float)
    bars = np.vstack([mean - 100 * rows["lo"].to_numpy(float),
                      100 * rows["hi"].to_numpy(float) - mean])
    ys = np.arange(len(rows))
    axes.errorbar(mean, ys, xerr=bars, fmt="o", color="#1f5fa8", markersize=4, capsize=2.5,
                  elinewidth=1)
    axes.axvline(0, color="#555555", linewidth=0.9, linestyle="--")
    axes.set_yticks(ys, [names[c] for c in rows["cell"]], fontsize=8)
    axes.set_ylim(-0.7, len(rows) - 0.3)
    axes.set_xlabel("budget share minus the stateless floor's (points); negative is a saving")
    axes.grid(axis="x", alpha=0.3)
    axes.set_title("Slot-paired difference from the stateless floor", fontsize=11)
    return _png(figure)


def compute_against_budget(cells: pd.DataFrame) -> bytes:
    """Scatter of `measures.cell_table`: per cell, tokens per stream instance (model seconds when
    no tokens were logged) against budget share (%) with its interval; log scale when the compute
    spans more than 30x."""
    data = cells[cells["n"] > 0]
    if data.empty:
        return _message("No finished stream instance yet.")
    use_tokens = bool(data["tokens"].sum() > 0)
    compute = ((data["tokens"] if use_tokens else data["model_s"]).to_numpy(float)
               / data["n"].to_numpy(float))
    budget = 100 * data["budget"].to_numpy(float)
    bars = np.vstack([budget - 100 * data["budget_lo"].to_numpy(float),
                      100 * data["budget_hi"].to_numpy(float) - budget])
    names = cell_names(data["cell"], data["label"])
    figure = _figure(4.2)
    axes = figure.add_subplot()
    colours = _colours(len(data))
    for k, cell_id in enumerate(data["cell"]):
        axes.errorbar(budget[k], compute[k], xerr=bars[:, k:k + 1], fmt="o", markersize=5,
                      capsize=2.5, elinewidth=1, color=colours[k], label=names[cell_id])
    positive = compute[compute > 0]
    if len(positive) == len(compute) and positive.max() > 30 * positive.min():
        axes.set_yscale("log")
    elif use_tokens:
        axes.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    axes.set_xlabel("budget share (%), stream")
    axes.set_ylabel("tokens per instance" if use_tokens else "model seconds per instance")
    axes.grid(alpha=0.3)
    axes.set_title("Compute against budget share, per cell", fontsize=11)
    _legend(axes, len(data), mark="dot")
    return _png(figure)
