"""Stream orders (SPEC section 5): one process, three presets, exact visits, no deadlock."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from orchestrator.streams import (
    DEFAULT_SEED,
    PRESETS,
    GapSummary,
    Slot,
    Stream,
    StreamSettings,
    StreamSettingsError,
    build_stream,
    epilogue,
    summary_rows,
    summary_table,
)

TASKS = [f"task{i:02d}" for i in range(25)]
ORDERS = list(PRESETS)


def visits_by_task(stream: Stream) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {}
    for slot in stream.slots:
        seen.setdefault(slot.task_id, []).append(slot.visit)
    return seen


def assert_well_formed(stream: Stream, tasks: list[str], visits: int) -> None:
    assert len(stream.slots) == len(tasks) * visits
    assert [slot.index for slot in stream.slots] == list(range(len(stream.slots)))
    assert all(slot.exposure == slot.visit for slot in stream.slots)
    by_task = visits_by_task(stream)
    assert set(by_task) == set(tasks)
    for task, numbers in by_task.items():
        assert numbers == list(range(visits)), task


@pytest.mark.parametrize("order", ORDERS)
def test_every_task_gets_exactly_eight_visits_numbered_0_to_7_in_stream_order(order):
    for seed in range(5):
        assert_well_formed(build_stream(TASKS, order, seed), TASKS, 8)


@settings(max_examples=200, deadline=None)
@given(
    n_tasks=st.integers(0, 30),
    active=st.one_of(st.none(), st.integers(1, 40)),
    spell=st.floats(1, 20),
    rest=st.floats(0, 300),
    arrival=st.floats(0, 60),
    visits=st.integers(1, 10),
    sampling=st.sampled_from(["fixed", "poisson", "geometric"]),
    seed=st.integers(0, 2**32),
)
def test_every_task_gets_exactly_its_visits_under_any_settings(
    n_tasks, active, spell, rest, arrival, visits, sampling, seed
):
    tasks = [f"t{i}" for i in range(n_tasks)]
    chosen = StreamSettings(active, spell, rest, arrival, visits=visits, sampling=sampling)
    stream = build_stream(tasks, chosen, seed)
    assert_well_formed(stream, tasks, visits)
    assert stream.order == "custom"
    cap = n_tasks if active is None else active
    assert all(1 <= count <= cap for count in stream.active_counts)


@pytest.mark.parametrize("order", ORDERS)
def test_same_seed_gives_the_same_stream(order):
    assert build_stream(TASKS, order, 7) == build_stream(TASKS, order, 7)


@pytest.mark.parametrize("order", ["workstreams", "random"])
def test_different_seeds_give_different_streams(order):
    assert build_stream(TASKS, order, 1).slots != build_stream(TASKS, order, 2).slots


def test_every_order_serves_the_same_task_visit_multiset():
    pairs = {
        order: Counter((s.task_id, s.visit) for s in build_stream(TASKS, order, 3).slots)
        for order in ORDERS
    }
    assert pairs["sequential"] == pairs["workstreams"] == pairs["random"]
    assert set(pairs["random"].values()) == {1}


def test_sequential_is_blocked_all_visits_of_one_task_then_the_next():
    stream = build_stream(TASKS, "sequential", 11)
    for block in range(len(TASKS)):
        chunk = stream.slots[block * 8 : (block + 1) * 8]
        assert len({slot.task_id for slot in chunk}) == 1
        assert [slot.visit for slot in chunk] == list(range(8))
    assert set(stream.return_gaps()) == {1}
    assert set(stream.active_counts) == {1}


def test_random_has_every_task_active_from_step_one():
    for seed in range(20):
        stream = build_stream(TASKS, "random", seed)
        assert stream.active_counts[0] == len(TASKS)
        # Interleaved: at least half the tasks are met within the first N instances
        # (sequential meets 4, a uniform draw about 16).
        assert len({slot.task_id for slot in stream.slots[: len(TASKS)]}) >= len(TASKS) // 2


def test_workstreams_keeps_at_most_four_tasks_active_and_usually_several():
    stream = build_stream(TASKS, "workstreams", DEFAULT_SEED)
    assert max(stream.active_counts) == 4
    middle = stream.active_counts[50:150]
    assert sum(middle) / len(middle) > 3.5


def test_workstreams_default_seed_gaps_match_the_source_median_5_p90_49_longest_141():
    gaps = build_stream(TASKS, "workstreams", DEFAULT_SEED).gap_summary()
    assert gaps.count == 25 * 7
    assert abs(gaps.median - 5) <= 1
    assert abs(gaps.p90 - 49) <= 5
    assert abs(gaps.longest - 141) <= 15


def test_gap_figures_do_not_depend_on_task_ids():
    other = [f"x{i}" for i in range(25)]
    a = build_stream(TASKS, "workstreams", DEFAULT_SEED).gap_summary()
    b = build_stream(other, "workstreams", DEFAULT_SEED).gap_summary()
    assert a == b


@pytest.mark.parametrize(
    "extreme",
    [
        StreamSettings(active=1, spell=1, rest=1000, arrival=2),
        StreamSettings(active=1, spell=1, rest=1000, arrival=1000, sampling="fixed"),
        StreamSettings(active=50, spell=1, rest=10_000, arrival=0, sampling="poisson"),
        StreamSettings(active=4, spell=100, rest=0, arrival=10_000),
        StreamSettings(active=None, spell=1, rest=1e9, arrival=1e9, visits=3),
        StreamSettings(active=2, spell=1.5, rest=0.5, arrival=0.5, visits=20),
    ],
)
def test_never_deadlocks_for_extreme_settings(extreme):
    stream = build_stream(TASKS, extreme, 0)
    assert_well_formed(stream, TASKS, extreme.visits)


def test_resting_task_returns_no_sooner_than_its_rest_while_others_can_be_served():
    # With fixed rests of 5 and plenty of tasks, every return waits at least 6 instances.
    chosen = StreamSettings(active=2, spell=1, rest=5, arrival=0, sampling="fixed")
    stream = build_stream(TASKS, chosen, 0)
    gaps = stream.return_gaps()
    assert min(gaps[: len(gaps) // 2]) >= 6


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"active": 0}, "active"),
        ({"active": True}, "active"),
        ({"active": 2.5}, "active"),
        ({"spell": 0.5}, "spell"),
        ({"spell": float("nan")}, "spell"),
        ({"rest": -1}, "rest"),
        ({"arrival": -0.1}, "arrival"),
        ({"arrival": float("inf")}, "arrival"),
        ({"visits": 0}, "visits"),
        ({"visits": "8"}, "visits"),
        ({"sampling": "uniform"}, "sampling"),
    ],
)
def test_invalid_settings_give_an_error_naming_the_field(fields, named):
    base = {"active": 4, "spell": 3, "rest": 30, "arrival": 2}
    with pytest.raises(StreamSettingsError, match=rf"StreamSettings\.{named}\b"):
        StreamSettings(**{**base, **fields})


def test_unknown_order_names_the_presets():
    with pytest.raises(StreamSettingsError, match="sequential, workstreams, random"):
        build_stream(TASKS, "shuffled", 0)


def test_repeated_task_id_and_negative_seed_are_refused():
    with pytest.raises(ValueError, match=r"task_ids\[2\] repeats 'a'"):
        build_stream(["a", "b", "a"], "random", 0)
    with pytest.raises(ValueError, match="seed"):
        build_stream(TASKS, "random", -1)


def test_return_gaps_are_index_differences_between_consecutive_visits_of_a_task():
    slots = tuple(
        Slot(index=i, task_id=t, visit=v, exposure=v)
        for i, (t, v) in enumerate([("a", 0), ("b", 0), ("a", 1), ("a", 2), ("b", 1)])
    )
    stream = Stream(order="custom", seed=0, slots=slots)
    assert stream.return_gaps() == [2, 1, 3]
    assert stream.gap_summary() == GapSummary(count=3, median=2.0, p90=2.8, longest=3, mean=2.0)


def test_epilogue_serves_each_held_out_task_once_as_a_first_visit_after_the_stream():
    held_out = [f"eval{i:02d}" for i in range(25)]
    stream = build_stream(TASKS, "workstreams", DEFAULT_SEED)
    tail = epilogue(held_out, DEFAULT_SEED, start_index=len(stream.slots))
    assert [slot.index for slot in tail] == list(range(200, 225))
    assert sorted(slot.task_id for slot in tail) == held_out
    assert all(slot.visit == 0 and slot.exposure == 0 for slot in tail)
    assert tail == epilogue(held_out, DEFAULT_SEED, start_index=200)
    assert [s.task_id for s in tail] != [s.task_id for s in epilogue(held_out, 1, 200)]


def test_summary_reports_length_visits_activity_gaps_and_the_first_40_slots():
    stream = build_stream(TASKS, "workstreams", DEFAULT_SEED)
    rows = dict(summary_rows(stream))
    gaps = stream.gap_summary()
    assert rows["length"] == "200"
    assert rows["tasks"] == "25"
    assert rows["visits per task"] == "8"
    assert rows["active tasks (mean / max)"].endswith("/ 4")
    assert rows["gap median"] == f"{gaps.median:g}"
    assert rows["gap 90th percentile"] == f"{gaps.p90:g}"
    assert rows["gap longest"] == str(gaps.longest)
    assert len(rows["first 40 slots"]) == 40
    table = summary_table(stream)
    assert isinstance(table, Table)
    console = Console(width=120, record=True)
    console.print(table)
    assert "gap longest" in console.export_text()
