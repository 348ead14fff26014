"""The instance protocol (SPEC section 3), rule by rule, plus its invariants under any actions."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.arc import Demo
from orchestrator.protocol import (Action, DemoGiven, Finished, InstanceProtocol, Limits,
                                   Malformed, MalformedReply, Refused, Status, Verdict,
                                   extract_action, parse_action)
from orchestrator.tasks.base import ArcInstance

RIGHT = ((1, 2), (3, 4))
WRONG = ((0, 0), (0, 0))


def make_instance(n_demos: int = 8) -> ArcInstance:
    demos = tuple(Demo(((k % 10,),), ((9 - k % 10,),)) for k in range(n_demos))
    return ArcInstance("t1", 0, ((4, 3), (2, 1)), RIGHT, demos)


def proto(**kw) -> InstanceProtocol:
    return InstanceProtocol(make_instance(kw.pop("n_demos", 8)), Limits(**kw))


def submit(grid) -> Action:
    return Action("submit", grid)


def test_demo_request_costs_one_and_returns_the_next_pair_never_the_test_input():
    p = proto()
    out = p.step(Action("request_demos"))
    assert isinstance(out, DemoGiven) and out.number == 1
    assert out.demo == p.instance.demos[0]
    assert out.demo.input != p.instance.test_input
    assert p.cost == 1


def test_ninth_demo_request_is_refused_without_charge():
    p = proto()
    for _ in range(8):
        assert isinstance(p.step(Action("request_demos")), DemoGiven)
    out = p.step(Action("request_demos"))
    assert isinstance(out, Refused) and "8" in out.reason
    assert p.cost == 8 and p.demos_used == 8 and not p.over


def test_demo_request_beyond_a_sources_pairs_is_refused_without_charge():
    p = proto(n_demos=3)
    for _ in range(3):
        p.step(Action("request_demos"))
    out = p.step(Action("request_demos"))
    assert isinstance(out, Refused) and "no more demonstration" in out.reason
    assert p.cost == 3


def test_correct_submission_costs_nothing_and_ends_the_instance():
    p = proto()
    p.step(Action("request_demos"))
    out = p.step(submit(RIGHT))
    assert out == Verdict(correct=True, over=True)
    assert p.status is Status.SOLVED and p.cost == 1 and p.budget_share == 1 / 16


def test_incorrect_submission_costs_one_and_the_instance_continues():
    p = proto()
    out = p.step(submit(WRONG))
    assert out == Verdict(correct=False, over=False)
    assert p.cost == 1 and not p.over


def test_eighth_wrong_answer_fails_instance_and_charges_16():
    p = proto()
    p.step(Action("request_demos"))
    for k in range(7):
        assert p.step(submit(WRONG)) == Verdict(False, False)
    assert p.step(submit(WRONG)) == Verdict(False, True)
    assert p.status is Status.FAILED and p.cost == 16 and p.budget_share == 1.0
    assert p.failure_reason == "8 incorrect submissions"


def test_solved_after_seven_wrong_and_eight_demos_costs_fifteen():
    p = proto()
    for _ in range(8):
        p.step(Action("request_demos"))
    for _ in range(7):
        p.step(submit(WRONG))
    p.step(submit(RIGHT))
    assert p.status is Status.SOLVED and p.cost == 15


def test_finish_is_refused_until_the_instance_is_over_then_accepted():
    p = proto()
    out = p.step(Action("finish"))
    assert isinstance(out, Refused) and "until the instance is over" in out.reason
    assert p.cost == 0 and not p.finished
    p.step(submit(RIGHT))
    assert isinstance(p.step(Action("finish")), Finished) and p.finished


def test_actions_after_the_end_are_refused_and_change_nothing():
    p = proto()
    p.step(submit(RIGHT))
    before = (p.cost, p.demos_used, p.wrong, p.status)
    assert isinstance(p.step(Action("request_demos")), Refused)
    assert isinstance(p.step(submit(WRONG)), Refused)
    assert (p.cost, p.demos_used, p.wrong, p.status) == before


def test_aliases_request_demo_and_demo_mean_request_demos():
    assert parse_action('{"action": "request_demo"}') == Action("request_demos")
    assert parse_action('{"action": "demo"}') == Action("request_demos")
    assert parse_action({"action": "request_demos"}) == Action("request_demos")


def test_malformed_actions_name_exactly_what_is_wrong():
    cases = {
        '{"action": "submit", "grid": [[1, 2], [3]]}': "not rectangular: row 0 has 2 cells, row 1 has 1",
        '{"action": "submit", "grid": [[1, 10]]}': "cell [0][1] is 10",
        '{"action": "submit", "grid": [[1, -1]]}': "cell [0][1] is -1",
        '{"action": "submit", "grid": [[true]]}': "cell [0][0] is true",
        '{"action": "submit", "grid": []}': "grid has 0 rows",
        '{"action": "submit", "grid": [[]]}': "row 0 has 0 cells",
        json.dumps({"action": "submit", "grid": [[0] * 31]}): "row 0 has 31 cells",
        json.dumps({"action": "submit", "grid": [[0]] * 31}): "grid has 31 rows",
        '{"action": "submit"}': 'needs a "grid"',
        '{"action": "submit", "grid": "[[1]]"}': "grid must be an array of rows, got string \"[[1]]\"",
        '{"action": "jump"}': 'unknown action "jump"',
        '{"action": "finish", "why": "done"}': 'unexpected key(s) "why" for "finish"',
        '{"grid": [[1]]}': 'no "action" key',
        '[1, 2]': "must be a JSON object, got array",
        '{"action": "submit", "grid": [[1]': "not valid JSON at line 1 column 34",
    }
    for text, expected in cases.items():
        parsed = parse_action(text)
        assert isinstance(parsed, Malformed), text
        assert expected in parsed.reason, (text, parsed.reason)


def test_malformed_action_costs_nothing_and_is_answered():
    p = proto()
    out = p.step(parse_action("not json"))
    assert isinstance(out, MalformedReply) and not out.over
    assert p.cost == 0 and p.malformed == 1


def test_twentieth_malformed_action_fails_the_instance_with_the_reason():
    p = proto()
    for n in range(19):
        assert p.step(Malformed("x")) == MalformedReply("x", over=False, left=19 - n)
    assert p.step(Malformed("x")) == MalformedReply("x", over=True, left=0)
    assert p.status is Status.FAILED and p.cost == 16
    assert p.failure_reason == "20 malformed actions"


def test_malformed_cap_is_configurable():
    p = proto(max_malformed=3)
    for _ in range(3):
        p.step(Malformed("x"))
    assert p.status is Status.FAILED


def test_wall_clock_expiry_fails_the_instance_and_charges_16():
    p = proto()
    p.step(Action("request_demos"))
    p.expire("wall-clock limit of 900 s exceeded")
    assert p.status is Status.FAILED and p.cost == 16
    assert p.failure_reason == "wall-clock limit of 900 s exceeded"


def test_expiry_after_a_solve_changes_nothing():
    p = proto()
    p.step(submit(RIGHT))
    p.expire("late")
    assert p.status is Status.SOLVED and p.cost == 0


def test_first_answer_and_demos_before_it_are_remembered():
    p = proto()
    p.step(Action("request_demos"))
    p.step(Action("request_demos"))
    p.step(submit(WRONG))
    p.step(submit(RIGHT))
    assert p.first_submit_demos == 2 and p.first_answer_correct is False


def test_extract_action_tolerates_code_fences_and_prose():
    text = 'I think the rule is a flip.\n```json\n{"action": "submit", "grid": [[1,2],[3,4]]}\n```\nDone.'
    assert extract_action(text) == submit(RIGHT)
    assert extract_action('Sure: {"action": "demo"} please') == Action("request_demos")
    assert extract_action('{"action": "finish"}') == Action("finish")


def test_extract_action_reports_a_reply_without_an_action():
    out = extract_action("I need more time to think.")
    assert isinstance(out, Malformed) and "no JSON action" in out.reason
    assert isinstance(extract_action(""), Malformed)
    out = extract_action('{"action": "submit", "grid": [[1, 2], [3]]}')
    assert isinstance(out, Malformed) and "not rectangular" in out.reason


# --- invariants under arbitrary action sequences -------------------------------------------

action_strategy = st.one_of(
    st.just(Action("request_demos")),
    st.just(Action("finish")),
    st.just(submit(RIGHT)),
    st.just(submit(WRONG)),
    st.builds(Malformed, st.text(max_size=5)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(action_strategy, max_size=60), st.integers(1, 30))
def test_cost_stays_in_0_to_16_and_a_failed_instance_costs_16(actions, max_malformed):
    p = proto(max_malformed=max_malformed)
    for a in actions:
        p.step(a)
        assert 0 <= p.cost <= 16
        if p.status is Status.FAILED:
            assert p.cost == 16
        if p.status is Status.SOLVED:
            assert p.cost == p.demos_used + p.wrong <= 15


@settings(max_examples=300, deadline=None)
@given(st.lists(action_strategy, max_size=60), st.lists(action_strategy, max_size=20))
def test_no_action_after_the_end_changes_the_record(actions, after):
    p = proto()
    for a in actions:
        p.step(a)
    if not p.over:
        return
    record = (p.cost, p.status, p.demos_used, p.wrong, p.malformed, p.failure_reason,
              p.first_answer_correct)
    for a in after:
        p.step(a)
    assert (p.cost, p.status, p.demos_used, p.wrong, p.malformed, p.failure_reason,
            p.first_answer_correct) == record


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                    max_leaves=20))
def test_parse_action_never_raises_on_any_json_value(value):
    out = parse_action(value)
    assert isinstance(out, (Action, Malformed))
    out = extract_action(json.dumps(value))
    assert isinstance(out, (Action, Malformed))
