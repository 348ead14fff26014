"""The Re-ARC plugin against a fake Re-ARC checkout written here (the real one cannot be fetched).

The fake has Re-ARC's module interface: generators.py and verifiers.py import `dsl` from their own
folder, draw from the global `random`, and misbehave on purpose for some seeds. The plugin runs them
in its real worker process.
"""

import itertools
import json
import random
import runpy
import sys
import textwrap
import time

import pytest

from orchestrator.tasks.base import MAX_DEMOS, TaskSource, derive_seed
from orchestrator.tasks.rearc import ReArcError, ReArcSource

DSL = '''
def flip(g):
    return tuple(tuple(reversed(r)) for r in g)


def noise(h, w):
    return tuple(tuple(random.randint(0, 9) for _ in range(w)) for _ in range(h))


import random
'''

GENERATORS = '''
import os
import random
import time

from dsl import *


def generate_aaaaaaaa(diff_lb, diff_ub):
    g = noise(random.randint(2, 5), random.randint(2, 5))
    return {'input': g, 'output': flip(g)}


def generate_bbbbbbbb(diff_lb, diff_ub):
    if random.random() < 0.15:
        time.sleep(60)
    return generate_aaaaaaaa(diff_lb, diff_ub)


def generate_cccccccc(diff_lb, diff_ub):
    g = noise(2, random.choice([3, 31]))
    return {'input': g, 'output': flip(g)}


def generate_dddddddd(diff_lb, diff_ub):
    if random.random() < 0.4:
        g = ((1, 2, 1), (3, 3, 3))  # its own mirror image: the verifier agrees, input == output
        return {'input': g, 'output': g}
    return generate_aaaaaaaa(diff_lb, diff_ub)


def generate_eeeeeeee(diff_lb, diff_ub):
    if random.random() < 0.4:
        raise ValueError("no room for the object")
    return generate_aaaaaaaa(diff_lb, diff_ub)


def generate_ffffffff(diff_lb, diff_ub):
    raise ValueError("always broken")


def generate_99999999(diff_lb, diff_ub):
    ex = generate_aaaaaaaa(diff_lb, diff_ub)
    if random.random() < 0.4:
        return {'input': ex['input'], 'output': ex['input']}  # not what the verifier computes
    return ex


def generate_gggggggg(diff_lb, diff_ub):
    time.sleep(60)


def generate_hhhhhhhh(diff_lb, diff_ub):
    return generate_aaaaaaaa(diff_lb, diff_ub)


def generate_iiiiiiii(diff_lb, diff_ub):
    if random.random() < 0.3:
        os._exit(3)
    return generate_aaaaaaaa(diff_lb, diff_ub)


def generate_jjjjjjjj(diff_lb, diff_ub):
    # Difficulty reaches the generator: the grid side follows diff_ub.
    g = noise(2, 2 + round(diff_ub * 8))
    return {'input': g, 'output': flip(g)}
'''

VERIFIED = "aaaaaaaa bbbbbbbb cccccccc dddddddd eeeeeeee ffffffff 99999999 gggggggg iiiiiiii jjjjjjjj"
VERIFIERS = "from dsl import *\n" + "".join(
    f"\n\ndef verify_{t}(I):\n    return flip(I)\n" for t in VERIFIED.split())

LIMIT = 0.5


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    folder = tmp_path_factory.mktemp("re-arc")
    (folder / "dsl.py").write_text(textwrap.dedent(DSL))
    (folder / "generators.py").write_text(GENERATORS)
    (folder / "verifiers.py").write_text(VERIFIERS)
    return folder


@pytest.fixture(scope="module")
def source(checkout):
    with ReArcSource(checkout, time_limit_s=LIMIT) as s:
        yield s


def instance_bytes(inst) -> bytes:
    return json.dumps([inst.task_id, inst.visit, inst.test_input, inst.test_output,
                       [d.to_json() for d in inst.demos]]).encode()


def reference(checkout, task_id: str, visit: int, seed: int) -> tuple[list, list[int]]:
    """The instance's examples by the documented rule, run in this process; and each one's attempt.

    Only for generators that neither sleep nor exit.
    """
    sys.path.insert(0, str(checkout))
    state = random.getstate()
    try:
        gen = runpy.run_path(str(checkout / "generators.py"))[f"generate_{task_id}"]
        verify = runpy.run_path(str(checkout / "verifiers.py"))[f"verify_{task_id}"]
        examples, attempts, seen = [], [], set()
        for k in range(1 + MAX_DEMOS):
            for attempt in itertools.count():
                random.seed(derive_seed(seed, "rearc", task_id, visit, k, attempt))
                try:
                    ex = gen(diff_lb=0.0, diff_ub=1.0)
                except ValueError:
                    continue
                i, o = ex["input"], ex["output"]
                if (max(len(i[0]), len(o[0])) <= 30 and verify(i) == o and i != o and i not in seen):
                    examples.append((i, o))
                    attempts.append(attempt)
                    seen.add(i)
                    break
        return examples, attempts
    finally:
        random.setstate(state)
        sys.path.remove(str(checkout))
        sys.modules.pop("dsl", None)


def pairs_of(inst) -> list:
    return [(inst.test_input, inst.test_output)] + [(d.input, d.output) for d in inst.demos]


def test_task_ids_are_the_generate_functions_present(source):
    assert isinstance(source, TaskSource) and source.name == "rearc"
    assert source.task_ids() == sorted(VERIFIED.split() + ["hhhhhhhh"])


def test_an_instance_is_one_test_pair_and_eight_verified_demos(source):
    inst = source.instance("aaaaaaaa", 0, seed=1)
    assert len(inst.demos) == MAX_DEMOS
    for i, o in pairs_of(inst):
        assert o == tuple(tuple(reversed(r)) for r in i)
    assert len({i for i, _ in pairs_of(inst)}) == 1 + MAX_DEMOS


@pytest.mark.parametrize("task_id, reason", [
    ("cccccccc", "invalid grid"),       # sometimes 31 wide
    ("dddddddd", "input equals output"),
    ("eeeeeeee", "raised"),
    ("99999999", "verifier mismatch"),
])
def test_a_rejected_attempt_is_retried_on_the_next_sub_seed(checkout, task_id, reason):
    with ReArcSource(checkout, time_limit_s=LIMIT) as source:
        inst = source.instance(task_id, 2, seed=9)
        assert source.rejected[reason] > 0
    examples, attempts = reference(checkout, task_id, 2, seed=9)
    assert pairs_of(inst) == examples
    assert max(attempts) > 0


def test_a_generation_over_the_time_limit_is_abandoned_and_retried(checkout):
    with ReArcSource(checkout, time_limit_s=LIMIT) as source:
        start = time.monotonic()
        inst = source.instance("bbbbbbbb", 0, seed=3)
        elapsed = time.monotonic() - start
        timeouts = source.rejected["timeout"]
    assert timeouts > 0 and len(inst.demos) == MAX_DEMOS
    assert elapsed < timeouts * (LIMIT + 2) + 2  # the 60 s sleeps were cut short


def test_a_worker_that_exits_mid_generation_is_replaced_and_the_attempt_retried(checkout):
    with ReArcSource(checkout, time_limit_s=LIMIT) as source:
        inst = source.instance("iiiiiiii", 0, seed=3)
        assert source.rejected["worker died"] > 0 and len(inst.demos) == MAX_DEMOS


def test_a_task_that_never_yields_a_valid_example_is_an_error_naming_it(checkout):
    with ReArcSource(checkout, time_limit_s=LIMIT, max_attempts=5) as source:
        with pytest.raises(ReArcError, match=r"task ffffffff: no valid example after 5 attempts.*5 raised"):
            source.instance("ffffffff", 0, seed=1)


def test_a_task_that_always_hangs_gives_up_after_its_attempts_in_bounded_time(checkout):
    with ReArcSource(checkout, time_limit_s=LIMIT, max_attempts=2) as source:
        start = time.monotonic()
        with pytest.raises(ReArcError, match=r"task gggggggg: .*2 timeout"):
            source.instance("gggggggg", 0, seed=1)
    assert time.monotonic() - start < 2 * (LIMIT + 2)


def test_a_generator_without_a_verifier_is_an_error_naming_the_task(source):
    with pytest.raises(ReArcError, match="verifiers.py has no verify_hhhhhhhh"):
        source.instance("hhhhhhhh", 0, seed=1)


def test_an_instance_is_the_same_bytes_for_seed_task_and_visit_in_any_order(checkout):
    calls = [("aaaaaaaa", 0), ("aaaaaaaa", 1), ("aaaaaaaa", 2), ("bbbbbbbb", 0), ("cccccccc", 0),
             ("cccccccc", 1)]
    with ReArcSource(checkout, time_limit_s=LIMIT) as one:
        forward = {c: instance_bytes(one.instance(*c, seed=4)) for c in calls}
    with ReArcSource(checkout, time_limit_s=LIMIT) as other:
        backward = {c: instance_bytes(other.instance(*c, seed=4)) for c in reversed(calls)}
        assert other.instance("aaaaaaaa", 0, seed=5) != other.instance("aaaaaaaa", 0, seed=4)
    assert forward == backward


def test_the_callers_global_random_state_and_import_path_are_left_as_they_were(checkout):
    random.seed(1234)
    state, path = random.getstate(), list(sys.path)
    with ReArcSource(checkout, time_limit_s=LIMIT) as source:
        source.instance("aaaaaaaa", 0, seed=1)
        source.instance("bbbbbbbb", 1, seed=1)
    assert random.getstate() == state
    assert sys.path == path and "dsl" not in sys.modules and "generators" not in sys.modules


def test_difficulty_bounds_reach_the_generator(checkout):
    with ReArcSource(checkout, 0.0, 0.0) as easy, ReArcSource(checkout, 1.0, 1.0) as hard:
        assert len(easy.instance("jjjjjjjj", 0, seed=1).test_input[0]) == 2
        assert len(hard.instance("jjjjjjjj", 0, seed=1).test_input[0]) == 10
    with pytest.raises(ValueError, match="diff_lb"):
        ReArcSource(checkout, 0.8, 0.2)


def test_a_missing_checkout_says_what_to_clone_and_which_field_to_set(tmp_path):
    for folder in (tmp_path / "absent", tmp_path):
        with pytest.raises(ReArcError) as err:
            ReArcSource(folder)
        message = str(err.value)
        assert "git clone https://github.com/michaelhodel/re-arc" in message
        assert "track.rearc_path" in message and str(folder) in message


def test_a_checkout_that_fails_to_import_says_why(tmp_path):
    (tmp_path / "generators.py").write_text("import matplotlib_not_here\n\n\ndef generate_aaaaaaaa(a, b):\n"
                                            "    pass\n")
    (tmp_path / "verifiers.py").write_text("")
    with ReArcSource(tmp_path) as source:
        with pytest.raises(ReArcError, match="ModuleNotFoundError.*matplotlib_not_here"):
            source.instance("aaaaaaaa", 0, seed=1)
