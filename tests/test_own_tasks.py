"""Specification of the project's own task generators and the `OwnSource` that serves them."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.arc import Demo, as_grid, grid_json
from orchestrator.tasks.base import MAX_DEMOS, ArcInstance, TaskSource
from orchestrator.tasks.own import OWN_TASKS, OwnTask, Redraw
from orchestrator.tasks.own_source import OwnSource, OwnTaskError

ALL_IDS = list(OWN_TASKS)
SEEDS = (0, 1, 2, 3)
VISITS = (0, 1, 2)
REPO = Path(__file__).resolve().parents[1]


def _pairs(instance: ArcInstance) -> list[Demo]:
    return [Demo(instance.test_input, instance.test_output), *instance.demos]


def _digest(instances: list[ArcInstance]) -> str:
    text = "|".join(
        f"{i.task_id}/{i.visit}:" + ";".join(grid_json(p.input) + ">" + grid_json(p.output) for p in _pairs(i))
        for i in instances
    )
    return hashlib.sha256(text.encode()).hexdigest()


def test_catalogue_has_at_least_52_tasks_27_in_stream_and_25_held_out():
    splits = Counter(task.split for task in OWN_TASKS.values())
    assert len(OWN_TASKS) >= 52
    assert splits["stream"] >= 27
    assert splits["heldout"] >= 25
    assert set(splits) == {"stream", "heldout"}


def test_task_ids_are_unique_kebab_case_and_prefixed_own():
    assert len(set(ALL_IDS)) == len(ALL_IDS)
    for task_id, task in OWN_TASKS.items():
        assert task.task_id == task_id
        assert re.fullmatch(r"own(-[a-z0-9]+)+", task_id), task_id


def test_at_least_six_kinds_have_three_or_more_tasks():
    kinds = Counter(task.kind for task in OWN_TASKS.values())
    assert sum(1 for count in kinds.values() if count >= 3) >= 6


def test_both_splits_cover_every_kind():
    for split in ("stream", "heldout"):
        kinds = {task.kind for task in OWN_TASKS.values() if task.split == split}
        assert kinds == {task.kind for task in OWN_TASKS.values()}, split


def test_every_task_describes_its_rule_in_one_line():
    for task in OWN_TASKS.values():
        assert task.description.strip() and "\n" not in task.description, task.task_id


@pytest.mark.parametrize("task_id", ALL_IDS)
def test_every_pair_is_valid_differs_from_its_input_and_matches_the_reference_rule(task_id: str):
    source, task = OwnSource(), OWN_TASKS[task_id]
    for seed in SEEDS:
        for visit in VISITS:
            instance = source.instance(task_id, visit, seed)
            assert (instance.task_id, instance.visit) == (task_id, visit)
            assert len(instance.demos) == MAX_DEMOS
            pairs = _pairs(instance)
            for pair in pairs:
                assert as_grid(pair.input) == pair.input
                assert as_grid(pair.output) == pair.output
                assert pair.input != pair.output
                assert task.verify(pair.input) == pair.output
            assert len({pair.input for pair in pairs}) == MAX_DEMOS + 1


@pytest.mark.parametrize("task_id", ALL_IDS)
def test_every_visit_serves_fresh_demos_and_a_fresh_test(task_id: str):
    source = OwnSource()
    instances = [source.instance(task_id, visit, 0) for visit in VISITS]
    for a, b in zip(instances, instances[1:]):
        assert a.demos != b.demos
        assert a.test_input != b.test_input


def test_same_seed_task_and_visit_give_identical_instances_in_any_call_order():
    keys = [(task_id, visit) for task_id in ALL_IDS for visit in (0, 3)]
    forward = {key: OwnSource().instance(key[0], key[1], 11) for key in keys}
    backward_source = OwnSource()
    backward = {key: backward_source.instance(key[0], key[1], 11) for key in reversed(keys)}
    assert forward == backward
    assert OwnSource("heldout").instance(ALL_IDS[-1], 3, 11) == forward[(ALL_IDS[-1], 3)]


def test_instances_are_identical_in_a_fresh_process_with_another_hash_seed():
    """Runs a real Python subprocess, so set order or hash randomisation would show up."""
    script = (
        "from orchestrator.tasks.own_source import OwnSource\n"
        "from tests.test_own_tasks import _digest, ALL_IDS\n"
        "s = OwnSource()\n"
        "print(_digest([s.instance(t, 2, 5) for t in ALL_IDS]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            check=True)
    source = OwnSource()
    assert result.stdout.strip() == _digest([source.instance(t, 2, 5) for t in ALL_IDS])


def test_different_visits_and_seeds_give_different_instances():
    source = OwnSource()
    for task_id in ALL_IDS:
        base = source.instance(task_id, 0, 1)
        assert base != source.instance(task_id, 1, 1)
        assert base != source.instance(task_id, 0, 2)


def test_a_split_source_serves_only_that_split_in_catalogue_order():
    for split in ("stream", "heldout"):
        ids = OwnSource(split).task_ids()
        assert ids == [t for t in ALL_IDS if OWN_TASKS[t].split == split]
    assert OwnSource().task_ids() == ALL_IDS


def test_own_source_is_a_task_source_named_own():
    source = OwnSource()
    assert isinstance(source, TaskSource)
    assert source.name == "own"


def test_unknown_task_id_raises_key_error_saying_where_the_valid_ids_are():
    with pytest.raises(KeyError, match="task_ids"):
        OwnSource().instance("own-no-such-task", 0, 0)


def test_a_task_of_the_other_split_is_unknown_to_a_split_source():
    heldout_id = OwnSource("heldout").task_ids()[0]
    with pytest.raises(KeyError, match="stream"):
        OwnSource("stream").instance(heldout_id, 0, 0)


def test_unknown_split_is_rejected_with_the_valid_choices():
    with pytest.raises(ValueError, match="heldout"):
        OwnSource("test")


def _identity_pair(rng) -> Demo:
    grid = ((rng.randrange(1, 10),),)
    return Demo(grid, grid)


def test_a_generator_that_never_passes_its_checks_raises_an_error_naming_the_task(monkeypatch):
    broken = OwnTask("own-broken", "geometry", "returns its input", "stream", _identity_pair, lambda grid: grid)
    monkeypatch.setitem(OWN_TASKS, broken.task_id, broken)
    with pytest.raises(OwnTaskError, match=r"own-broken.*input equals output.*test_own_tasks"):
        OwnSource().instance("own-broken", 0, 0)


def test_a_generator_that_asks_to_redraw_is_retried_with_the_next_attempt(monkeypatch):
    def sometimes(rng) -> Demo:
        if rng.random() < 0.5:
            raise Redraw
        grid = tuple(tuple(rng.randrange(10) for _ in range(3)) for _ in range(3))
        return Demo(grid, grid[::-1])

    flaky = OwnTask("own-flaky", "geometry", "mirror top to bottom", "stream", sometimes, lambda grid: grid[::-1])
    monkeypatch.setitem(OWN_TASKS, flaky.task_id, flaky)
    instance = OwnSource().instance("own-flaky", 0, 0)
    assert len(instance.demos) == MAX_DEMOS


@settings(max_examples=60, deadline=None)
@given(task_id=st.sampled_from(ALL_IDS), visit=st.integers(0, 10_000), seed=st.integers(0, 2**63))
def test_any_seed_and_visit_yields_a_sound_instance(task_id: str, visit: int, seed: int):
    task = OWN_TASKS[task_id]
    pairs = _pairs(OwnSource().instance(task_id, visit, seed))
    assert all(task.verify(p.input) == p.output and p.input != p.output for p in pairs)
    assert len({p.input for p in pairs}) == MAX_DEMOS + 1
