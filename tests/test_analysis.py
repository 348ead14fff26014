"""The analysis (SPEC section 8) on hand-computed toys: cluster bootstrap over tasks, paired
slot-by-slot differences, budget against exposure, forward transfer, and its speed."""

import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import analysis
from orchestrator.analysis import (analyse, bootstrap_mean_ci, cell_table, differences_from_floor,
                                   exposure_table, forward_transfer, instances_frame,
                                   paired_difference, unfinished_instances)
from orchestrator.records import Event


def settings_of(learner: str, effort: str = "medium", row: str = "memory-on", seed: int = 0) -> dict:
    label = learner if row == "memory-on" else f"{learner}-{row}"
    return {"cell": f"{label}.{effort}.workstreams.s{seed}", "label": label, "learner": learner,
            "row": row, "model": "carc-solver", "effort": effort, "order": "workstreams",
            "seed": seed, "track": "own"}


def event(kind: str, cell: str, slot: int, task: str, *, phase: str = "stream", visit: int = 0,
          exposure: int | None = None, **fields) -> Event:
    return Event(type=kind, cell=cell, slot=slot, phase=phase, task=task, visit=visit,
                 exposure=visit if exposure is None else exposure, t=0.0, **fields)


def end(cell: str, slot: int, task: str, cost: int, **kw) -> Event:
    return event("instance_end", cell, slot, task, status="failed" if cost == 16 else "solved",
                 cost=cost, model_calls=1, prompt_tokens=100, completion_tokens=10, model_s=0.5,
                 cost_usd=0.0, wall_s=1.0, first_submit_demos=0, first_answer_correct=cost == 0,
                 **kw)


def frame_of(runs: dict[str, list[tuple[str, int]]], phase: str = "stream") -> tuple[pd.DataFrame, dict]:
    """Cells from {learner: [(task, cost) per slot]}, visits counted per task."""
    cells, events = {}, {}
    for learner, slots in runs.items():
        s = settings_of(learner)
        cells[s["cell"]] = s
        seen: dict[str, int] = {}
        events[s["cell"]] = []
        for slot, (task, cost) in enumerate(slots):
            visit = seen[task] = seen.get(task, -1) + 1
            events[s["cell"]].append(end(s["cell"], slot, task, cost, visit=visit, phase=phase))
    return instances_frame(events, cells), cells


def rng() -> np.random.Generator:
    return np.random.default_rng(7)


# --- the instance frame -------------------------------------------------------------------------

def test_instances_frame_has_one_row_per_finished_instance_with_share_and_solved():
    s = settings_of("stateless-floor")
    c = s["cell"]
    events = [event("instance_start", c, 0, "t1"), event("step", c, 0, "t1", step=1, cost=1),
              end(c, 0, "t1", 4),
              event("instance_start", c, 1, "t2"), end(c, 1, "t2", 16),
              event("instance_start", c, 2, "t1", visit=1), event("step", c, 2, "t1", visit=1)]
    df = instances_frame({c: events}, {c: s})
    assert list(df["slot"]) == [0, 1]
    assert list(df["share"]) == [0.25, 1.0]
    assert list(df["solved"]) == [True, False]
    assert set(df["learner"]) == {"stateless-floor"} and set(df["effort"]) == {"medium"}
    assert set(analysis.SETTINGS) <= set(df.columns)


def test_unfinished_instances_are_counted_per_cell_and_left_out_of_every_number():
    s = settings_of("demo-cache-floor")
    c = s["cell"]
    events = [event("instance_start", c, 0, "t1"), end(c, 0, "t1", 0),
              event("instance_start", c, 1, "t2"), event("step", c, 1, "t2", step=1, cost=1)]
    assert unfinished_instances({c: events}).to_dict() == {c: 1}
    table = cell_table(instances_frame({c: events}, {c: s}), rng(), n=200)
    assert table.loc[0, "n"] == 1 and table.loc[0, "budget"] == 0.0


def test_label_names_the_row_when_it_is_not_memory_on():
    s = settings_of("program-library", row="wiped")
    del s["label"]
    assert analysis.cell_label(s) == "program-library-wiped"


# --- the cluster bootstrap over tasks -----------------------------------------------------------

def test_bootstrap_interval_collapses_when_every_task_has_the_same_value():
    df = pd.DataFrame({"task": ["a", "a", "a", "b"], "share": [0.5, 0.25, 0.75, 0.5]})
    assert bootstrap_mean_ci(df, "share", rng(), n=1000) == (0.5, 0.5, 0.5)


def test_cluster_bootstrap_mean_is_the_plain_mean_over_instances_not_over_tasks():
    # task a: shares 0, .25, .5 (mean .25); task b: 1.0. Instance mean 1.75 / 4; task mean .625.
    df = pd.DataFrame({"task": ["a", "a", "a", "b"], "share": [0.0, 0.25, 0.5, 1.0]})
    mean, lo, hi = bootstrap_mean_ci(df, "share", rng(), n=10_000)
    assert mean == 0.4375
    # two tasks: a resample is {a,a} (.25), {b,b} (1.0) or {a,b} (the plain mean), 1/4, 1/4, 1/2
    assert (lo, hi) == (0.25, 1.0)


def test_bootstrap_resamples_tasks_so_each_resample_weights_a_task_by_its_instance_count():
    weights = analysis.task_resample_counts(5, rng(), n=1000)
    assert weights.shape == (1000, 5)
    assert (weights.sum(axis=1) == 5).all()
    assert abs(weights.mean() - 1.0) < 0.05


def test_bootstrap_of_nothing_is_nan():
    mean, lo, hi = bootstrap_mean_ci(pd.DataFrame({"task": [], "share": []}), "share", rng())
    assert np.isnan(mean) and np.isnan(lo) and np.isnan(hi)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 16)), min_size=1, max_size=40),
       st.integers(0, 2**32 - 1))
def test_bootstrap_mean_is_the_instance_mean_and_the_interval_lies_between_task_means(rows, seed):
    df = pd.DataFrame(rows, columns=["task", "cost"]).assign(share=lambda d: d["cost"] / 16)
    mean, lo, hi = bootstrap_mean_ci(df, "share", np.random.default_rng(seed), n=500)
    task_means = df.groupby("task")["share"].mean()
    assert mean == pytest.approx(df["share"].mean())
    assert task_means.min() - 1e-12 <= lo <= hi <= task_means.max() + 1e-12
    assert bootstrap_mean_ci(df, "share", np.random.default_rng(seed), n=500) == (mean, lo, hi)


# --- paired differences -------------------------------------------------------------------------

def test_paired_difference_of_a_cell_with_itself_is_exactly_zero_with_zero_width():
    df, _ = frame_of({"stateless-floor": [("t1", 3), ("t2", 16), ("t1", 0), ("t3", 7)]})
    cell = df["cell"].iloc[0]
    assert paired_difference(df, cell, cell, rng()) == (0.0, 0.0, 0.0, 4)


def test_paired_difference_on_three_slots_is_the_hand_computed_mean_and_interval():
    df, cells = frame_of({"demo-cache-floor": [("t1", 2), ("t2", 16), ("t1", 0)],
                          "stateless-floor": [("t1", 4), ("t2", 8), ("t1", 0)]})
    demo, floor = cells
    # slot diffs -2/16, +8/16, 0 -> mean 6/48 = .125; task t1 sums -.125 over 2, t2 .5 over 1:
    # resamples give -.0625 ({t1,t1}), .5 ({t2,t2}) or .125 ({t1,t2})
    assert paired_difference(df, demo, floor, rng()) == (0.125, -0.0625, 0.5, 3)


def test_paired_difference_uses_only_slots_both_cells_finished():
    df, cells = frame_of({"demo-cache-floor": [("t1", 2), ("t2", 16), ("t1", 0)],
                          "stateless-floor": [("t1", 4), ("t2", 8), ("t1", 0)]})
    demo, floor = cells
    df = df[~((df["cell"] == floor) & (df["slot"] == 1))]
    assert paired_difference(df, demo, floor, rng()) == (-0.0625, -0.0625, -0.0625, 2)


def test_paired_difference_refuses_cells_on_different_schedules_and_names_the_slot():
    df, cells = frame_of({"demo-cache-floor": [("t1", 2), ("t2", 16)],
                          "stateless-floor": [("t1", 4), ("t3", 8)]})
    demo, floor = cells
    with pytest.raises(ValueError, match="slot 1 serves t2 visit 0 in one and t3"):
        paired_difference(df, demo, floor, rng())


def test_differences_from_floor_pair_each_cell_with_the_floor_of_its_own_schedule():
    cells = {s["cell"]: s for s in (settings_of("stateless-floor"), settings_of("demo-cache-floor"),
                                    settings_of("demo-cache-floor", effort="high"))}
    floor, demo, demo_high = cells
    events = {floor: [end(floor, 0, "t1", 8), end(floor, 1, "t2", 4)],
              demo: [end(demo, 0, "t1", 4), end(demo, 1, "t2", 4)],
              demo_high: [end(demo_high, 0, "t1", 0)]}
    table = differences_from_floor(instances_frame(events, cells), cells, rng(), n=1000)
    assert list(table["cell"]) == [demo]  # no high-effort floor: skipped; the floor itself: skipped
    row = table.iloc[0]
    assert (row["floor"], row["mean"], row["pairs"]) == (floor, -0.125, 2)
    assert (row["lo"], row["hi"]) == (-0.25, 0.0)


# --- tables -------------------------------------------------------------------------------------

def test_exposure_table_is_the_mean_share_per_exposure_index_by_hand():
    df, cells = frame_of({"demo-cache-floor": [("t1", 8), ("t2", 4), ("t1", 2), ("t2", 0),
                                               ("t1", 16)]})
    table = exposure_table(df)
    row = table.loc[next(iter(cells))]
    assert list(table.columns) == list(range(8))
    assert row[0] == (8 + 4) / 2 / 16
    assert row[1] == (2 + 0) / 2 / 16
    assert row[2] == 1.0
    assert row[3:].isna().all()


def test_cell_table_counts_stream_instances_only_and_totals_compute():
    s = settings_of("stateless-floor")
    c = s["cell"]
    events = [end(c, 0, "t1", 16), end(c, 1, "t2", 0), end(c, 2, "t1", 4, visit=1),
              end(c, 3, "e1", 8, phase="epilogue")]
    row = cell_table(instances_frame({c: events}, {c: s}), rng(), n=1000).iloc[0]
    assert row["n"] == 3
    assert row["budget"] == pytest.approx(20 / 48)
    assert row["solved"] == pytest.approx(2 / 3)
    assert row["first_answer_correct"] == pytest.approx(1 / 3)
    assert (row["model_calls"], row["tokens"], row["model_s"]) == (3, 330, 1.5)


def test_forward_transfer_is_epilogue_minus_fresh_paired_by_task_by_hand():
    cells = {s["cell"]: s for s in (settings_of("demo-cache-floor"), settings_of("stateless-floor"))}
    demo, floor = cells
    events = {
        demo: [end(demo, 0, "t1", 2),
               end(demo, 1, "e1", 4, phase="epilogue"), end(demo, 2, "e2", 16, phase="epilogue"),
               end(demo, 3, "e1", 8, phase="fresh"), end(demo, 4, "e2", 16, phase="fresh")],
        floor: [end(floor, 0, "t1", 2), end(floor, 1, "e1", 4, phase="epilogue")],  # no fresh
    }
    table = forward_transfer(instances_frame(events, cells), rng(), n=1000)
    assert list(table["cell"]) == [demo]
    row = table.iloc[0]
    assert (row["epilogue"], row["fresh"], row["tasks"]) == (0.625, 0.75, 2)
    # task diffs -4/16 and 0: mean -.125, resamples -.25, 0 or -.125
    assert (row["mean"], row["lo"], row["hi"]) == (-0.125, -0.25, 0.0)


# --- determinism and speed ----------------------------------------------------------------------

def synthetic_run(cells_n: int = 8, seed: int = 3) -> tuple[pd.DataFrame, dict]:
    """8 cells x 250 instances: 25 tasks x 8 visits, 25 epilogue and 25 fresh instances."""
    gen = np.random.default_rng(seed)
    learners = ["stateless-floor", "demo-cache-floor", "program-library", "harness-a",
                "harness-b", "harness-c", "harness-d", "harness-e"][:cells_n]
    order = gen.permutation(np.repeat(np.arange(25), 8))
    cells, events = {}, {}
    for learner in learners:
        s = settings_of(learner)
        c = s["cell"]
        cells[c] = s
        seen = np.zeros(25, int)
        evs = []
        for slot, task in enumerate(order):
            evs.append(end(c, slot, f"t{task:02d}", int(gen.integers(0, 17)), visit=int(seen[task])))
            seen[task] += 1
        for k in range(25):
            evs.append(end(c, 200 + k, f"e{k:02d}", int(gen.integers(0, 17)), phase="epilogue"))
            evs.append(end(c, 225 + k, f"e{k:02d}", int(gen.integers(0, 17)), phase="fresh"))
        events[c] = evs
    return instances_frame(events, cells), cells


def test_the_analysis_is_deterministic_for_a_seed():
    df, cells = synthetic_run(cells_n=3)
    one = analyse(df, cells, np.random.default_rng(11), n=500)
    two = analyse(df, cells, np.random.default_rng(11), n=500)
    for a, b in zip((one.cells, one.floor_differences, one.forward_transfer),
                    (two.cells, two.floor_differences, two.forward_transfer)):
        pd.testing.assert_frame_equal(a, b)


def test_full_analysis_of_8_cells_x_250_instances_with_10000_resamples_is_fast():
    df, cells = synthetic_run()
    assert len(df) == 8 * 250
    start = time.perf_counter()
    result = analyse(df, cells, np.random.default_rng(0), n=10_000)
    elapsed = time.perf_counter() - start
    print(f"\nfull analysis, 8 cells x 250 instances, 10,000 resamples: {elapsed:.2f} s")
    assert len(result.cells) == 8 and len(result.floor_differences) == 7
    assert len(result.forward_transfer) == 8
    assert elapsed < 10.0
