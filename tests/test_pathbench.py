"""PATH-Bench on carc's records (seed 001, section 3.3): each task's stream visits as a probe
trajectory, scored 1 - budget share; AP, FWT (against the first visit), BWT and FGT (against the
second), on hand-computed toys."""

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis.measures import instances_frame
from orchestrator.analysis.pathbench import pathbench_table, probe_trajectories
from orchestrator.records import Event


def settings_of(learner: str, order: str = "workstreams") -> dict:
    return {"cell": f"{learner}.medium.{order}.s0", "label": learner, "learner": learner,
            "row": "memory-on", "model": "carc-solver", "effort": "medium", "order": order,
            "seed": 0, "track": "own"}


def frame_of(runs: dict[tuple[str, str], list[tuple[str, int | None]]]) -> pd.DataFrame:
    """{(learner, order): [(task, cost) per stream slot]}; visits counted per task; a cost of
    None leaves that visit unfinished (no record)."""
    cells, events = {}, {}
    for (learner, order), slots in runs.items():
        s = settings_of(learner, order)
        cells[s["cell"]] = s
        seen: dict[str, int] = {}
        events[s["cell"]] = []
        for slot, (task, cost) in enumerate(slots):
            visit = seen[task] = seen.get(task, -1) + 1
            if cost is not None:
                events[s["cell"]].append(Event(
                    type="instance_end", cell=s["cell"], slot=slot, phase="stream", task=task,
                    visit=visit, exposure=visit, t=0.0, cost=cost,
                    status="failed" if cost == 16 else "solved"))
    return instances_frame(events, cells)


def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def interleave(a: list[int | None], b: list[int | None]) -> list[tuple[str, int | None]]:
    return [pair for costs in zip(a, b) for pair in (("a", costs[0]), ("b", costs[1]))]


# task a scores .5 .75 1 .25 (cold .5, warm .75); task b 0 1 1 .5 (cold 0, warm 1)
HAND = interleave([8, 4, 0, 12], [16, 0, 0, 8])


def test_average_performance_is_the_mean_score_over_every_stream_visit():
    row = pathbench_table(frame_of({("harness-a", "workstreams"): HAND}), rng(), n=500).iloc[0]
    assert (row["n"], row["tasks"], row["probes"], row["score"]) == (8, 2, 4, "reward")
    assert row["ap"] == pytest.approx((0.5 + 0.75 + 1 + 0.25 + 0 + 1 + 1 + 0.5) / 8)
    assert (row["cold"], row["warm"]) == pytest.approx(((0.5 + 0) / 2, (0.75 + 1) / 2))


def test_forward_transfer_is_the_later_visits_against_the_first_by_hand():
    row = pathbench_table(frame_of({("harness-a", "workstreams"): HAND}), rng(), n=10_000).iloc[0]
    # a: (1 - .5) + (.25 - .5); b: (1 - 0) + (.5 - 0); per task .125 and .75, mean .4375
    assert row["fwt"] == pytest.approx(1.75 / 4)
    # resamples {a, a}, {b, b}, {a, b}
    assert (row["fwt_lo"], row["fwt_hi"]) == pytest.approx((0.125, 0.75))


def test_backward_transfer_and_forgetting_are_rises_and_falls_from_the_second_visit_by_hand():
    row = pathbench_table(frame_of({("harness-a", "workstreams"): HAND}), rng(), n=500).iloc[0]
    # a: 1 rises .25 above .75, .25 falls .5 below; b: 1 stays at 1, .5 falls .5 below
    assert row["bwt"] == pytest.approx(0.25 / 4)
    assert row["fgt"] == pytest.approx((0.5 + 0.5) / 4)


def test_a_task_without_its_first_visit_has_no_forward_transfer_but_keeps_the_rest():
    # a's visit 0 unfinished: its probes count for AP, BWT and FGT, not for FWT
    df = frame_of({("harness-a", "workstreams"): interleave([None, 4, 0, 12], [16, 0, 0, 8])})
    trajectories = probe_trajectories(df)
    assert trajectories.loc[trajectories["task"] == "a", "p_cold"].isna().all()
    row = pathbench_table(df, rng(), n=500).iloc[0]
    assert row["fwt"] == pytest.approx((1 + 0.5) / 2)  # b's two probes only
    assert row["bwt"] == pytest.approx(0.25 / 4) and row["fgt"] == pytest.approx(1.0 / 4)
    assert row["ap"] == pytest.approx((0.75 + 1 + 0.25 + 0 + 1 + 1 + 0.5) / 7)


def test_the_solved_score_scores_a_visit_one_when_solved_and_zero_when_failed():
    df = frame_of({("harness-a", "workstreams"): [("a", 16), ("a", 0), ("a", 16), ("a", 3)]})
    row = pathbench_table(df, rng(), n=200, score="solved").iloc[0]
    assert row["score"] == "solved"
    assert (row["ap"], row["fwt"], row["bwt"], row["fgt"]) == (0.5, 0.5, 0.0, 0.5)
    with pytest.raises(ValueError, match="unknown PATH-Bench score 'budget'"):
        pathbench_table(df, rng(), n=200, score="budget")


def test_pooled_over_orders_each_order_keeps_its_own_first_and_second_visit():
    df = frame_of({("harness-a", "workstreams"): [("a", 8), ("a", 4), ("a", 0)],
                   ("harness-a", "random"): [("a", 0), ("a", 0), ("a", 16)]})
    row = pathbench_table(df, rng(), n=200, pool_orders=True).iloc[0]
    assert (row["group"], row["orders"], row["n"], row["probes"]) == (
        "harness-a.medium.s0", "random, workstreams", 6, 2)
    assert row["ap"] == pytest.approx((0.5 + 0.75 + 1 + 1 + 1 + 0) / 6)
    # workstreams: 1 - .5 against its own cold start; random: 0 - 1
    assert row["fwt"] == pytest.approx((0.5 - 1) / 2)
    assert row["bwt"] == pytest.approx((0.25 + 0) / 2) and row["fgt"] == pytest.approx(0.5)


def test_every_cell_gets_a_row_in_frame_order():
    df = frame_of({("stateless-floor", "workstreams"): HAND, ("harness-a", "workstreams"): HAND})
    table = pathbench_table(df, rng(), n=200)
    assert list(table["cell"]) == ["stateless-floor.medium.workstreams.s0",
                                   "harness-a.medium.workstreams.s0"]
    pd.testing.assert_series_equal(table["fwt"], pd.Series([1.75 / 4] * 2, name="fwt"))
