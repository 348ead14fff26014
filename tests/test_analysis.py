"""The analysis (SPEC section 8) on hand-computed toys: cluster bootstrap over tasks, paired
slot-by-slot differences, budget against exposure and against the gap since last seen, the
per-cell measures, pooling over orders, memory-off twins, forward transfer, and its speed."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.analysis import measures
from orchestrator.analysis.measures import (analyse, bootstrap_mean_ci, cell_table, differences_from_floor,
                                            exposure_table, forward_transfer, gap_table, instances_frame,
                                            paired_difference, pooled_table, sensitivity, task_bootstrap,
                                            twin_cells, twin_table, unfinished_instances)
from orchestrator.analysis.tables import run_measures
from orchestrator.records import Event


def settings_of(learner: str, effort: str = "medium", row: str = "memory-on", seed: int = 0,
                order: str = "workstreams") -> dict:
    label = learner if row == "memory-on" else f"{learner}-{row}"
    return {"cell": f"{label}.{effort}.{order}.s{seed}", "label": label, "learner": learner,
            "row": row, "model": "carc-solver", "effort": effort, "order": order,
            "seed": seed, "track": "own"}


def event(kind: str, cell: str, slot: int, task: str, *, phase: str = "stream", visit: int = 0,
          exposure: int | None = None, **fields) -> Event:
    return Event(type=kind, cell=cell, slot=slot, phase=phase, task=task, visit=visit,
                 exposure=visit if exposure is None else exposure, t=0.0, **fields)


def end(cell: str, slot: int, task: str, cost: int, **kw) -> Event:
    record = dict(status="failed" if cost == 16 else "solved", cost=cost, model_calls=1,
                  prompt_tokens=100, completion_tokens=10, model_s=0.5, cost_usd=0.0, wall_s=1.0,
                  first_submit_demos=0, first_answer_correct=cost == 0)
    return event("instance_end", cell, slot, task, **{**record, **kw})


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
    assert set(measures.SETTINGS) <= set(df.columns)


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
    assert measures.cell_label(s) == "program-library-wiped"


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
    weights = measures.task_resample_counts(5, rng(), n=1000)
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
    # resamples: -.25 ({t1,t1}, 1 in 4), 0 ({t2,t2}) or -.125: savings beyond 25 points excluded;
    # the resamples' SD is sqrt(1/128) = .088, so the MDE is 2.80 x .088 = .25 up to resampling
    assert row["bound"] == 0.25
    assert row["mde"] == pytest.approx(2.8016 * (1 / 128) ** 0.5, rel=0.1)


# --- the sensitivity of a paired difference -----------------------------------------------------

def test_a_difference_that_is_always_zero_excludes_any_saving_and_has_no_detectable_effect_size():
    assert sensitivity(np.zeros(1000)) == (0.0, 0.0)
    df, cells = frame_of({"demo-cache-floor": [("t1", 2), ("t2", 16), ("t1", 0)],
                          "stateless-floor": [("t1", 2), ("t2", 16), ("t1", 0)]})
    row = differences_from_floor(df, cells, rng(), n=1000).iloc[0]
    assert (row["mean"], row["bound"], row["mde"]) == (0.0, 0.0, 0.0)


def test_the_sensitivity_of_a_normal_difference_is_its_5th_percentile_and_2_80_sds():
    saving = np.random.default_rng(1).normal(-0.10, 0.02, 200_000)  # a saving of 10 +- 2 points
    bound, mde = sensitivity(saving)
    assert bound == pytest.approx(0.10 + 1.6449 * 0.02, abs=5e-4)
    assert mde == pytest.approx((1.9600 + 0.8416) * 0.02, abs=5e-4)
    assert measures.POWER == 0.8 and sensitivity(saving, power=0.5).mde == pytest.approx(
        1.96 * 0.02, abs=5e-4)


def test_a_difference_that_is_surely_a_loss_excludes_every_saving():
    bound, mde = sensitivity(np.random.default_rng(2).normal(0.3, 0.05, 10_000))
    assert bound == 0.0 and mde == pytest.approx(2.8016 * 0.05, rel=0.05)


def test_undefined_resamples_are_left_out_of_the_sensitivity_and_none_left_is_nan():
    values = np.r_[np.linspace(-1.0, 1.0, 101), np.nan, np.inf]
    bound, mde = sensitivity(np.c_[values, np.full(103, np.nan)])
    assert bound[0] == pytest.approx(-np.quantile(np.linspace(-1.0, 1.0, 101), 0.05))
    assert mde[0] == pytest.approx(2.8016 * np.linspace(-1.0, 1.0, 101).std(ddof=1), rel=1e-4)
    assert np.isnan(bound[1]) and np.isnan(mde[1])


def test_task_bootstrap_states_a_differences_sensitivity_from_its_own_resamples():
    gen = np.random.default_rng(4)
    tasks = np.repeat([f"t{k:02d}" for k in range(30)], 5)
    diff = gen.normal(-0.08, 0.3, len(tasks)) + np.repeat(gen.normal(0, 0.1, 30), 5)
    sums = measures.mean_sums(pd.DataFrame({"key": "a", "task": tasks}), {"d": diff})
    draws = measures.TaskResamples(rng(), n=4000)
    row = task_bootstrap(sums, "key", measures.means(["d"]), draws, differences=["d"]).iloc[0]
    # the same resamples by hand: the draw counts of the sorted task ids, each resample's mean
    weights = draws.counts(sorted(set(tasks)))
    per_task = pd.Series(diff).groupby(tasks).agg(["sum", "count"])
    means_of_resamples = (weights @ per_task["sum"].to_numpy()) / (weights @ per_task["count"].to_numpy())
    assert row["d_bound"] == pytest.approx(max(0.0, -np.quantile(means_of_resamples, 0.05)), rel=1e-12)
    assert row["d_mde"] == pytest.approx(2.8016 * means_of_resamples.std(ddof=1), rel=1e-4)
    assert row["d_bound"] > 0.0  # a saving of about 8 points: the bound is above it, not 0
    assert (row["d_lo"], row["d_hi"]) == pytest.approx(tuple(np.quantile(means_of_resamples,
                                                                         [0.025, 0.975])))


def test_task_bootstrap_refuses_a_difference_its_statistic_does_not_give():
    sums = measures.mean_sums(pd.DataFrame({"key": ["a"], "task": ["t1"]}), {"d": [0.5]})
    with pytest.raises(ValueError, match=r"differences \['budget'\] are not statistics"):
        task_bootstrap(sums, "key", measures.means(["d"]), rng(), n=10, differences=["budget"])


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
    assert row["bound"] == 0.25 and row["mde"] == pytest.approx(2.8016 * (1 / 128) ** 0.5, rel=0.1)


# --- the per-cell measures ----------------------------------------------------------------------

def test_cell_table_measures_failures_first_answers_pairs_and_cost0_returning_by_hand():
    s = settings_of("harness-a")
    c = s["cell"]
    events = [end(c, 0, "t1", 16, first_submit_demos=8, first_answer_correct=False),
              end(c, 1, "t2", 3, first_submit_demos=2, first_answer_correct=False),
              end(c, 2, "t1", 0, visit=1, first_submit_demos=0, first_answer_correct=True),
              end(c, 3, "t2", 0, visit=1, first_submit_demos=0, first_answer_correct=True),
              end(c, 4, "t1", 5, visit=2, first_submit_demos=1, first_answer_correct=None),
              end(c, 5, "e1", 0, phase="epilogue")]
    row = cell_table(instances_frame({c: events}, {c: s}), rng(), n=10_000).iloc[0]
    assert (row["n"], row["tasks"], row["returning"]) == (5, 2, 3)
    assert row["failed"] == pytest.approx(1 / 5)
    assert row["first_answer_correct"] == pytest.approx(2 / 4)  # the unknown one left out
    assert row["first_submit_demos"] == pytest.approx(11 / 5)
    # returning: t1 visit 1 (cost 0), t1 visit 2 (cost 5), t2 visit 1 (cost 0)
    assert row["cost0_returning"] == pytest.approx(2 / 3)
    # t1 has 1 of 2 returning at cost 0, t2 1 of 1: resamples give 2/4, 2/2 or 2/3
    assert (row["cost0_returning_lo"], row["cost0_returning_hi"]) == (0.5, 1.0)
    # t1 fails 1 of 3, t2 0 of 2: resamples give 1/3, 0 or 1/5
    assert row["failed_lo"] == 0.0 and row["failed_hi"] == pytest.approx(1 / 3)


def test_task_bootstrap_of_a_mean_is_the_bootstrap_mean_ci_on_the_same_draws():
    df, _ = frame_of({"demo-cache-floor": [("t1", 2), ("t2", 16), ("t1", 0), ("t3", 5),
                                           ("t3", 1), ("t2", 9)]})
    sums = measures.mean_sums(df[["cell", "task"]], {"share": df["share"]})
    table = task_bootstrap(sums, "cell", measures.means(["share"]), np.random.default_rng(5), n=999)
    expected = bootstrap_mean_ci(df, "share", np.random.default_rng(5), n=999)
    row = table.iloc[0]
    assert (row["share"], row["share_lo"], row["share_hi"]) == pytest.approx(tuple(expected))


def test_cells_on_one_schedule_share_their_resamples_of_the_tasks():
    draws = measures.TaskResamples(rng(), n=100)
    first = draws.counts(["t1", "t2", "t3"])
    assert draws.counts(("t1", "t2", "t3")) is first
    assert draws.counts(["t1", "t2"]).shape == (100, 2)


# --- budget against the gap since last seen -----------------------------------------------------

def test_gap_table_bins_returning_instances_by_the_slots_since_the_last_visit_by_hand():
    s = settings_of("harness-a")
    c = s["cell"]
    slots = [("a", 4), ("b", 8), ("a", 2), ("a", 0), ("b", 4)]  # gaps: a 2, a 1, b 3
    slots += [(f"f{k:02d}", 16) for k in range(70)]  # first meetings, not returning
    slots += [("a", 16), ("b", 8)]  # gaps 72 and 72
    slots += [("c", 0), ("c", None), ("c", 0)]  # c's third visit follows an unfinished one
    seen: dict[str, int] = {}
    events = []
    for slot, (task, cost) in enumerate(slots):
        visit = seen[task] = seen.get(task, -1) + 1
        if cost is not None:
            events.append(end(c, slot, task, cost, visit=visit))
    events.append(end(c, len(slots), "a", 0, phase="epilogue"))
    table = gap_table(instances_frame({c: events}, {c: s}))
    assert list(table["gap"]) == ["1", "2–3", "4–7", "8–15", "16–31", "32–63", "64+"]
    assert list(table["gap_min"]) == [1, 2, 4, 8, 16, 32, 64]
    assert list(table["gap_max"])[:6] == [1, 3, 7, 15, 31, 63] and table["gap_max"].isna().iloc[6]
    assert list(table["n"]) == [1, 2, 0, 0, 0, 0, 2]
    budget = table.set_index("gap")["budget"]
    assert budget["1"] == 0.0
    assert budget["2–3"] == (2 + 4) / 2 / 16
    assert budget["64+"] == (16 + 8) / 2 / 16
    assert budget[["4–7", "8–15", "16–31", "32–63"]].isna().all()


# --- pooling over orders ------------------------------------------------------------------------

def two_orders(runs: dict[tuple[str, str, str], list[tuple[str, int]]]) -> tuple[pd.DataFrame, dict]:
    """Cells from {(learner, row, order): [(task, cost) per slot]}, visits counted per task."""
    cells, events = {}, {}
    for (learner, row, order), slots in runs.items():
        s = settings_of(learner, row=row, order=order)
        cells[s["cell"]] = s
        seen: dict[str, int] = {}
        events[s["cell"]] = []
        for slot, (task, cost) in enumerate(slots):
            visit = seen[task] = seen.get(task, -1) + 1
            events[s["cell"]].append(end(s["cell"], slot, task, cost, visit=visit))
    return instances_frame(events, cells), cells


def test_pooled_table_pools_the_orders_of_a_cell_group_and_resamples_tasks_across_them():
    df, _ = two_orders({("harness-a", "memory-on", "workstreams"): [("t1", 4), ("t2", 8)],
                        ("harness-a", "memory-on", "random"): [("t2", 0), ("t1", 12)]})
    row = pooled_table(df, rng(), n=10_000).iloc[0]
    assert (row["group"], row["orders"], row["cells"], row["n"]) == (
        "harness-a.medium.s0", "random, workstreams", 2, 4)
    assert row["budget"] == (4 + 8 + 0 + 12) / 64
    # t1 (4 + 12) / 32 = .5 in both orders, t2 (8 + 0) / 32 = .25: resamples .5, .25 or .375
    assert (row["budget_lo"], row["budget_hi"]) == (0.25, 0.5)


# --- memory-off twins ---------------------------------------------------------------------------

LADDER_AND_ROWS = [("stateless-floor", "memory-on"), ("demo-cache-floor", "memory-on"),
                   ("program-library", "memory-on"), ("program-library", "wiped"),
                   ("harness-a", "memory-on"), ("harness-a", "memory-off"),
                   ("harness-a", "asked-to-store"), ("harness-a", "program-procedure"),
                   ("harness-a", "program-procedure-wiped"), ("harness-b", "memory-on")]


def one_schedule(costs: dict[tuple[str, str], int], efforts: tuple[str, ...] = ("medium",)
                 ) -> tuple[pd.DataFrame, dict]:
    """Every (learner, row) at a constant cost on the stream t1, t2, t1, t2."""
    cells, events = {}, {}
    for effort in efforts:
        for (learner, row), cost in costs.items():
            s = settings_of(learner, effort=effort, row=row)
            cells[s["cell"]] = s
            events[s["cell"]] = [end(s["cell"], slot, task, cost, visit=slot // 2)
                                 for slot, task in enumerate(["t1", "t2", "t1", "t2"])]
    return instances_frame(events, cells), cells


def test_each_row_is_paired_with_its_own_memory_off_twin_on_its_own_schedule():
    costs = {key: k for k, key in enumerate(LADDER_AND_ROWS)}
    df, _ = one_schedule(costs, efforts=("medium", "high"))
    twins = twin_cells(df)
    assert twins["program-library.medium.workstreams.s0"] == \
        "program-library-wiped.medium.workstreams.s0"
    assert twins["harness-a.medium.workstreams.s0"] == "harness-a-memory-off.medium.workstreams.s0"
    assert twins["harness-a-asked-to-store.high.workstreams.s0"] == \
        "harness-a-memory-off.high.workstreams.s0"
    assert twins["harness-a-program-procedure.medium.workstreams.s0"] == \
        "harness-a-program-procedure-wiped.medium.workstreams.s0"
    assert twins["harness-a-program-procedure-wiped.medium.workstreams.s0"] == \
        "harness-a-memory-off.medium.workstreams.s0"
    # floors, memory-off rows, the wiped library and a harness with no memory-off row: no twin
    assert len(twins) == 2 * 5


def test_twin_table_is_the_slot_paired_saving_against_the_twin_and_the_demo_cache_floor():
    costs = {key: k for k, key in enumerate(LADDER_AND_ROWS)}  # cost k at every slot
    df, _ = one_schedule(costs)
    table = twin_table(df, rng(), n=1000).set_index("cell")
    library = table.loc["program-library.medium.workstreams.s0"]
    assert library["twin"] == "program-library-wiped.medium.workstreams.s0"
    assert (library["twin_mean"], library["twin_lo"], library["twin_hi"], library["twin_pairs"]) \
        == (-1 / 16, -1 / 16, -1 / 16, 4)
    # a saving of exactly one point of 16 in every resample: savings beyond it are excluded
    assert (library["twin_bound"], library["twin_mde"]) == (1 / 16, 0.0)
    assert library["demo_cache"] == "demo-cache-floor.medium.workstreams.s0"
    assert library["demo_cache_mean"] == (2 - 1) / 16 and library["demo_cache_pairs"] == 4
    stored = table.loc["harness-a-asked-to-store.medium.workstreams.s0"]
    assert (stored["twin_mean"], stored["demo_cache_mean"]) == ((6 - 5) / 16, (6 - 1) / 16)
    procedure = table.loc["harness-a-program-procedure.medium.workstreams.s0"]
    assert procedure["twin_mean"] == (7 - 8) / 16
    floor = table.loc["stateless-floor.medium.workstreams.s0"]
    assert pd.isna(floor["twin"]) and np.isnan(floor["twin_mean"]) and floor["twin_pairs"] == 0
    assert floor["demo_cache_mean"] == -1 / 16
    assert "demo-cache-floor.medium.workstreams.s0" not in table.index


def test_twin_table_pooled_over_orders_pairs_within_each_schedule_then_pools_the_pairs():
    df, _ = two_orders({
        ("harness-a", "memory-on", "workstreams"): [("t1", 0), ("t2", 8)],
        ("harness-a", "memory-off", "workstreams"): [("t1", 8), ("t2", 8)],
        ("harness-a", "memory-on", "random"): [("t2", 4), ("t1", 16)],
        ("harness-a", "memory-off", "random"): [("t2", 0), ("t1", 0)]})
    row = twin_table(df, rng(), n=10_000, pool_orders=True).iloc[0]
    assert (row["group"], row["twin"], row["orders"], row["twin_pairs"]) == (
        "harness-a.medium.s0", "harness-a-memory-off.medium.s0", "random, workstreams", 4)
    # pairs: t1 -8 and +16, t2 0 and +4 (in 16ths): mean 12 / 64
    assert row["twin_mean"] == 12 / 64
    # t1 sums 8 over 2 pairs, t2 4 over 2: resamples 8/32, 4/32 or 12/64
    assert (row["twin_lo"], row["twin_hi"]) == (4 / 32, 8 / 32)


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


def test_full_analysis_of_8_cells_x_250_instances_with_10000_resamples_has_every_table():
    # how long it takes is measured by bench/analysis.py, never asserted here
    df, cells = synthetic_run()
    assert len(df) == 8 * 250
    result = analyse(df, cells, np.random.default_rng(0), n=10_000)
    assert len(result.cells) == 8 and len(result.floor_differences) == 7
    assert len(result.forward_transfer) == 8


def collective_frame(cells_n: int = 100, instances: int = 1600, tasks: int = 25,
                     seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """The collective configuration's size, built as a frame: `cells_n` cells (a ladder, and
    harnesses with memory-off, asked-to-store and procedure rows, in two orders) x `instances`
    stream instances over `tasks` tasks, plus an epilogue and a fresh reference of 25."""
    gen = np.random.default_rng(seed)
    rows = [("stateless-floor", "memory-on"), ("demo-cache-floor", "memory-on"),
            ("program-library", "memory-on"), ("program-library", "wiped")]
    rows += [(f"harness-{h}", r) for h in range(7) for r in ("memory-on", "memory-off",
                                                              "asked-to-store")]
    rows += [(f"harness-{h}", r) for h in range(3)
             for r in ("program-procedure", "program-procedure-wiped")]
    orders = ["workstreams", "random"]
    per_order = cells_n // len(orders)
    frames, cells = [], {}
    for order in orders:
        task_of = gen.permutation(np.repeat(np.arange(tasks), instances // tasks))
        visit = pd.Series(task_of).groupby(task_of).cumcount().to_numpy()
        for k, (learner, row) in enumerate((rows * 2)[:per_order]):
            effort = "medium" if k < len(rows) else "high"
            s = settings_of(learner, effort=effort, row=row, order=order)
            cells[s["cell"]] = s
            cost = gen.integers(0, 17, instances + 50)
            frames.append(pd.DataFrame({
                **s, "slot": np.arange(instances + 50),
                "phase": ["stream"] * instances + ["epilogue"] * 25 + ["fresh"] * 25,
                "task": [f"t{t:02d}" for t in task_of] + [f"e{k:02d}" for k in range(25)] * 2,
                "visit": np.r_[visit, np.zeros(50, int)], "status": "solved", "cost": cost,
                "first_submit_demos": gen.integers(0, 8, instances + 50).astype(float),
                "first_answer_correct": pd.array(gen.random(instances + 50) < 0.4,
                                                 dtype="boolean"),
                "wall_s": 1.0, "model_calls": 1, "prompt_tokens": 100, "completion_tokens": 10,
                "model_s": 0.5, "cost_usd": 0.0}))
    df = pd.concat(frames, ignore_index=True)
    df["exposure"] = df["visit"]
    df["status"] = np.where(df["cost"] == 16, "failed", "solved")
    df["share"] = df["cost"] / 16
    df["solved"] = df["status"] == "solved"
    return df, cells


@pytest.mark.slow
def test_every_table_of_100_cells_x_1600_instances_with_10000_resamples_is_there():
    # how long it takes is measured by bench/analysis.py, never asserted here
    df, cells = collective_frame()
    assert len(df[df["phase"] == "stream"]) == 160_000 and df["cell"].nunique() == 100
    tables = run_measures(df, cells, np.random.default_rng(0), n=10_000)
    assert {"cells", "exposure", "gap", "pooled", "twins", "twins_pooled", "clbench",
            "clbench_pooled", "pathbench", "pathbench_pooled", "transfer", "floor"} <= set(tables)
    assert len(tables["cells"]) == 100 and len(tables["transfer"]) == 100
    assert len(tables["pooled"]) == 50 and not tables["twins"].empty
    assert not tables["clbench"].empty and len(tables["pathbench"]) == 100


def test_every_paired_difference_table_states_its_sensitivity_with_finite_values():
    df, cells = collective_frame(cells_n=20, instances=400, tasks=25)
    tables = run_measures(df, cells, np.random.default_rng(0), n=2_000)
    columns = {"floor": ["bound", "mde"], "transfer": ["bound", "mde"],
               "twins": ["twin_bound", "twin_mde", "demo_cache_bound", "demo_cache_mde"],
               "twins_pooled": ["twin_bound", "twin_mde", "demo_cache_bound", "demo_cache_mde"]}
    for name, wanted in columns.items():
        table = tables[name]
        assert not table.empty and set(wanted) <= set(table.columns), name
        prefixes = {c.rsplit("_", 1)[0] if "_" in c else "" for c in wanted}
        for prefix in prefixes:
            mean, bound, mde = ((f"{prefix}_{c}" if prefix else c) for c in ("mean", "bound", "mde"))
            known = table[table[mean].notna()]
            assert not known.empty, (name, prefix)
            assert np.isfinite(known[[bound, mde]].to_numpy()).all(), (name, prefix)
            # random costs 0..16: SE of a mean over 25 tasks is a few points, never 0
            assert (known[bound] >= 0).all() and (known[mde] > 0.01).all(), (name, prefix)
            assert (known[mde] < 0.5).all(), (name, prefix)


def test_run_measures_is_deterministic_for_a_seed():
    df, cells = collective_frame(cells_n=8, instances=200, tasks=25)
    one = run_measures(df, cells, np.random.default_rng(11), n=300)
    two = run_measures(df, cells, np.random.default_rng(11), n=300)
    assert list(one) == list(two)
    for name in one:
        pd.testing.assert_frame_equal(one[name], two[name])


def test_failed_instances_are_counted_by_the_kind_their_records_give():
    events = {"c": [Event(type="instance_end", cell="c", slot=i, phase="stream", task="t", visit=i,
                          exposure=i, t=0.0, status=status, cost=cost, failure_kind=kind)
                    for i, (status, cost, kind) in enumerate([("solved", 2, None), ("failed", 16, "wrong-answers"),
                                                               ("failed", 16, "timeout"), ("failed", 16, None),
                                                               ("failed", 16, "timeout")])]}
    frame = instances_frame(events, {"c": {"learner": "hermes-agent", "row": "memory-on"}})
    [row] = measures.failure_table(frame).to_dict("records")
    assert row == {"cell": "c", "instances failed": 4, "timeout": 2, "unrecorded": 1, "wrong-answers": 1}


def test_a_quantity_shown_in_two_tables_of_one_report_has_one_interval():
    # one order: each cell's pooled group holds exactly its own instances, so the two must agree
    df, cells = synthetic_run()
    draws = measures.TaskResamples(np.random.default_rng(0), 2_000)
    first = analyse(df, cells, draws, 2_000)
    every = run_measures(df, cells, draws, 2_000)
    by_cell = first.cells.set_index("cell")
    for _, pooled in every["pooled"].iterrows():
        [cell] = df.loc[measures.with_groups(df)["group"] == pooled["group"], "cell"].unique()
        assert (pooled["budget_lo"], pooled["budget_hi"]) == (by_cell.loc[cell, "budget_lo"],
                                                              by_cell.loc[cell, "budget_hi"])
