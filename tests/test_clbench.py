"""CL-Bench on carc's records (seed 000): the matched gain of a stateful cell over its stateless
twin, normalized by the headroom, and its stability/plasticity split, on hand-computed toys; the
split adds up exactly."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.analysis.clbench import clbench_table, matched_pairs
from orchestrator.analysis.measures import instances_frame
from orchestrator.records import Event


def settings_of(learner: str, row: str = "memory-on", order: str = "workstreams") -> dict:
    label = learner if row == "memory-on" else f"{learner}-{row}"
    return {"cell": f"{label}.medium.{order}.s0", "label": label, "learner": learner, "row": row,
            "model": "carc-solver", "effort": "medium", "order": order, "seed": 0,
            "track": "own"}


def records(cell: str, stream: list[tuple[str, int]], epilogue: list[tuple[str, int]] = (),
            fresh: list[tuple[str, int]] = ()) -> list[Event]:
    """`instance_end` events: the stream slots (visits counted per task), then the epilogue and
    the fresh reference, each (task, cost)."""
    events, seen = [], {}
    phases = [("stream", stream), ("epilogue", epilogue), ("fresh", fresh)]
    slot = 0
    for phase, slots in phases:
        for task, cost in slots:
            visit = 0
            if phase == "stream":
                visit = seen[task] = seen.get(task, -1) + 1
            events.append(Event(type="instance_end", cell=cell, slot=slot, phase=phase, task=task,
                                visit=visit, exposure=visit, t=0.0, cost=cost,
                                status="failed" if cost == 16 else "solved"))
            slot += 1
    return events


def frame_of(runs: dict[tuple[str, str, str], dict]) -> pd.DataFrame:
    """{(learner, row, order): {"stream": [...], "epilogue": [...], "fresh": [...]}}."""
    cells, events = {}, {}
    for (learner, row, order), phases in runs.items():
        s = settings_of(learner, row, order)
        cells[s["cell"]] = s
        events[s["cell"]] = records(s["cell"], **phases)
    return instances_frame(events, cells)


def rng() -> np.random.Generator:
    return np.random.default_rng(7)


STREAM = ["t1", "t2", "t1", "t2"]


def hand_case() -> pd.DataFrame:
    """Rewards (1 - cost/16): stateful .5 .75 1 .75, epilogue .5; stateless .5 .5 .5 .75,
    epilogue 0. Gains 0 .25 .5 0, epilogue .5."""
    return frame_of({
        ("harness-a", "memory-on", "workstreams"): {
            "stream": list(zip(STREAM, [8, 4, 0, 4])), "epilogue": [("e1", 8)],
            "fresh": [("e1", 0)]},
        ("harness-a", "memory-off", "workstreams"): {
            "stream": list(zip(STREAM, [8, 8, 8, 4])), "epilogue": [("e1", 16)],
            "fresh": [("e1", 16)]}})


def test_normalized_gain_is_mean_matched_gain_over_the_stateless_headroom_by_hand():
    row = clbench_table(hand_case(), rng(), n=1000).iloc[0]
    assert row["cell"] == "harness-a.medium.workstreams.s0"
    assert row["stateless"] == "harness-a-memory-off.medium.workstreams.s0"
    assert row["n"] == 5  # four stream slots and the epilogue; the fresh reference left out
    assert row["stateful_reward"] == pytest.approx(3.5 / 5)
    assert row["stateless_reward"] == pytest.approx(2.25 / 5)
    assert row["headroom"] == pytest.approx(1 - 0.45)
    assert row["mean_gain"] == pytest.approx(1.25 / 5)
    assert row["normalized_gain"] == pytest.approx(0.25 / 0.55)


def test_stability_is_first_meetings_and_the_epilogue_plasticity_the_returning_instances():
    row = clbench_table(hand_case(), rng(), n=1000).iloc[0]
    assert (row["n_stability"], row["n_plasticity"], row["f_stability"]) == (3, 2, 0.6)
    # the seed's form: f_bound * (boundary stateful mean - boundary stateless mean) / headroom
    assert row["stability"] == pytest.approx(0.6 * ((0.5 + 0.75 + 0.5) / 3 - (0.5 + 0.5 + 0) / 3)
                                             / 0.55)
    assert row["plasticity"] == pytest.approx(0.4 * ((1 + 0.75) / 2 - (0.5 + 0.75) / 2) / 0.55)
    assert row["stability"] == pytest.approx(0.75 / (5 * 0.55))
    assert row["plasticity"] == pytest.approx(0.5 / (5 * 0.55))
    assert row["stability"] + row["plasticity"] == row["normalized_gain"]


def test_intervals_are_a_bootstrap_over_tasks_by_hand():
    # t1: gains 0 (first) and .5 (return), stateless 1.0 in all; t2: gains 0 and -.5, stateless .5
    df = frame_of({("harness-a", "memory-on", "workstreams"):
                   {"stream": list(zip(["t1", "t1", "t2", "t2"], [8, 0, 16, 16]))},
                   ("harness-a", "memory-off", "workstreams"):
                   {"stream": list(zip(["t1", "t1", "t2", "t2"], [8, 8, 16, 8]))}})
    row = clbench_table(df, rng(), n=10_000).iloc[0]
    assert (row["normalized_gain"], row["stability"], row["plasticity"]) == (0.0, 0.0, 0.0)
    # {t1, t1}: gain 1 over 4 with headroom .5 -> .5; {t2, t2}: -1 / (4 * .75) -> -1/3; mixed 0
    assert row["normalized_gain_lo"] == pytest.approx(-1 / 3)
    assert row["normalized_gain_hi"] == pytest.approx(0.5)
    assert (row["plasticity_lo"], row["plasticity_hi"]) == pytest.approx((-1 / 3, 0.5))
    assert (row["stability_lo"], row["stability_hi"]) == (0.0, 0.0)


def test_the_program_library_is_matched_with_its_wiped_row_and_the_procedure_with_its_wiped_twin():
    stream = {"stream": list(zip(STREAM, [8, 8, 8, 8]))}
    df = frame_of({("program-library", "memory-on", "workstreams"): stream,
                   ("program-library", "wiped", "workstreams"): stream,
                   ("harness-a", "program-procedure", "workstreams"): stream,
                   ("harness-a", "program-procedure-wiped", "workstreams"): stream,
                   ("harness-a", "memory-off", "workstreams"): stream,
                   ("stateless-floor", "memory-on", "workstreams"): stream})
    table = clbench_table(df, rng(), n=200).set_index("cell")
    assert table["stateless"].to_dict() == {
        "program-library.medium.workstreams.s0": "program-library-wiped.medium.workstreams.s0",
        "harness-a-program-procedure.medium.workstreams.s0":
            "harness-a-program-procedure-wiped.medium.workstreams.s0"}
    # the procedure's wiped row against memory-off compares two stateless runs: not CL-Bench
    assert (table["normalized_gain"] == 0.0).all()


def test_a_twin_that_used_no_budget_leaves_no_headroom_and_no_normalized_gain():
    df = frame_of({("harness-a", "memory-on", "workstreams"): {"stream": list(zip(STREAM, [2] * 4))},
                   ("harness-a", "memory-off", "workstreams"): {"stream": list(zip(STREAM, [0] * 4))}})
    row = clbench_table(df, rng(), n=200).iloc[0]
    assert row["headroom"] == 0.0 and row["mean_gain"] == -2 / 16
    assert np.isnan(row["normalized_gain"]) and np.isnan(row["stability"])


def test_pooled_over_orders_the_matched_pairs_of_each_order_make_one_schedule():
    df = frame_of({
        ("harness-a", "memory-on", "workstreams"): {"stream": [("t1", 0), ("t1", 0)]},
        ("harness-a", "memory-off", "workstreams"): {"stream": [("t1", 8), ("t1", 8)]},
        ("harness-a", "memory-on", "random"): {"stream": [("t1", 8), ("t1", 16)]},
        ("harness-a", "memory-off", "random"): {"stream": [("t1", 8), ("t1", 16)]}})
    row = clbench_table(df, rng(), n=200, pool_orders=True).iloc[0]
    assert (row["group"], row["stateless"], row["orders"], row["n"]) == (
        "harness-a.medium.s0", "harness-a-memory-off.medium.s0", "random, workstreams", 4)
    # stateless rewards .5 .5 .5 0 -> headroom 1 - 1.5/4; gains .5 .5 0 0 -> mean .25
    assert row["normalized_gain"] == pytest.approx(0.25 / (1 - 1.5 / 4))
    assert row["stability"] == pytest.approx(0.5 / 4 / (1 - 1.5 / 4))
    assert row["n_stability"] == 2


def test_matched_pairs_refuse_a_twin_on_another_schedule():
    df = frame_of({("harness-a", "memory-on", "workstreams"): {"stream": [("t1", 0), ("t2", 0)]},
                   ("harness-a", "memory-off", "workstreams"): {"stream": [("t2", 0), ("t1", 0)]}})
    with pytest.raises(ValueError, match="not on the same schedule"):
        matched_pairs(df)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["t1", "t2", "t3", "t4"]), st.integers(0, 16),
                          st.integers(0, 16)), min_size=1, max_size=30),
       st.lists(st.tuples(st.integers(0, 16), st.integers(0, 16)), max_size=4))
def test_stability_and_plasticity_add_up_exactly_to_the_normalized_gain(stream, epilogue):
    df = frame_of({
        ("harness-a", "memory-on", "workstreams"): {
            "stream": [(t, a) for t, a, _ in stream],
            "epilogue": [(f"e{k}", a) for k, (a, _) in enumerate(epilogue)]},
        ("harness-a", "memory-off", "workstreams"): {
            "stream": [(t, b) for t, _, b in stream],
            "epilogue": [(f"e{k}", b) for k, (_, b) in enumerate(epilogue)]}})
    row = clbench_table(df, np.random.default_rng(0), n=50).iloc[0]
    if row["headroom"] == 0:
        assert np.isnan(row["normalized_gain"])
        return
    assert row["stability"] + row["plasticity"] == row["normalized_gain"]
    assert row["normalized_gain"] == pytest.approx(row["mean_gain"] / row["headroom"], abs=1e-12)
    assert row["n_stability"] + row["n_plasticity"] == len(stream) + len(epilogue)
