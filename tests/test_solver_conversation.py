"""Reading conversations into the embedded solver model's state.

Transcripts are rendered with the project's own templates (orchestrator/prompts/default.yaml
through `PromptSet`), so a change of wording that drops a marker the model needs fails here.
"""

from __future__ import annotations

import pytest

from orchestrator.arc import Demo, as_grid
from orchestrator.prompts import PromptSet
from orchestrator.protocol import DemoGiven, Refused, Verdict
from solver_model.conversation import Feedback, Mode, read_conversation

PROMPTS = PromptSet.load()
TEST_INPUT = as_grid([[1, 2], [3, 4]])
PAIR_1 = Demo(as_grid([[5, 6], [7, 8]]), as_grid([[6, 5], [8, 7]]))
PAIR_2 = Demo(as_grid([[0, 1, 2]]), as_grid([[2, 1, 0]]))
WRONG = as_grid([[9, 9], [9, 9]])


def opening(task_id: str = "abc123", cached: list[Demo] = (), program: bool = False,
            demos_used: int = 0) -> list[dict]:
    system = PROMPTS.texts["program_system" if program else "system"]
    text = PROMPTS.instance_message(task_id, TEST_INPUT, 0, demos_used, cached=list(cached))
    return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def said(text: str) -> dict:
    return {"role": "assistant", "content": text}


def told(text: str) -> dict:
    return {"role": "user", "content": text}


def demo_given(demo: Demo, number: int, attempts: int = 0) -> dict:
    return told(PROMPTS.outcome_message(DemoGiven(demo, number), attempts, number))


def test_opening_message_gives_task_id_test_input_and_no_pairs():
    state = read_conversation(opening())
    assert state.mode is Mode.ACTION
    assert state.task_id == "abc123"
    assert state.test_input == TEST_INPUT
    assert state.pairs == ()
    assert (state.attempts_used, state.demos_used) == (0, 0)
    assert not state.over


def test_bought_pairs_are_read_with_the_latest_counts():
    messages = opening() + [said('{"action": "request_demos"}'), demo_given(PAIR_1, 1),
                            said('{"action": "request_demos"}'), demo_given(PAIR_2, 2)]
    state = read_conversation(messages)
    assert state.pairs == (PAIR_1, PAIR_2)
    assert state.demos_used == 2


def test_cached_pairs_and_bought_pairs_sharing_a_number_are_both_kept():
    messages = opening(cached=[PAIR_1]) + [said('{"action": "request_demos"}'),
                                           demo_given(PAIR_2, 1)]
    state = read_conversation(messages)
    assert state.pairs == (PAIR_1, PAIR_2)
    assert state.demos_used == 1


def test_a_pair_shown_twice_is_held_once():
    messages = opening(cached=[PAIR_1]) + [said('{"action": "request_demos"}'),
                                           demo_given(PAIR_1, 1)]
    assert read_conversation(messages).pairs == (PAIR_1,)


def test_incorrect_submission_is_remembered_with_its_verdict():
    messages = opening() + [
        said('{"action": "request_demos"}'), demo_given(PAIR_1, 1),
        said('{"action": "submit", "grid": [[9,9],[9,9]]}'),
        told(PROMPTS.outcome_message(Verdict(False, False), 1, 1)),
    ]
    state = read_conversation(messages)
    assert [s.grid for s in state.submissions] == [WRONG]
    assert state.submissions[0].verdict is Feedback.INCORRECT
    assert state.wrong_grids == {WRONG}
    assert state.attempts_used == 1
    assert not state.over


def test_submission_awaiting_its_verdict_has_none():
    state = read_conversation(opening() + [said('{"action": "submit", "grid": [[9,9],[9,9]]}')])
    assert state.submissions[0].verdict is None
    assert state.wrong_grids == frozenset()


@pytest.mark.parametrize("verdict", [Verdict(True, True), Verdict(False, True)],
                         ids=["correct", "eighth-wrong"])
def test_instance_is_over_after_a_correct_or_the_eighth_wrong_verdict(verdict):
    messages = opening() + [said('{"action": "submit", "grid": [[9,9],[9,9]]}'),
                            told(PROMPTS.outcome_message(verdict, 8, 0))]
    assert read_conversation(messages).over


def test_refused_finish_does_not_read_as_the_instance_being_over():
    refusal = Refused("finish is refused until the instance is over (a correct answer or the "
                      "eighth wrong one)")
    messages = opening() + [said('{"action": "finish"}'),
                            told(PROMPTS.outcome_message(refusal, 0, 0))]
    assert not read_conversation(messages).over


def test_refused_request_means_no_more_pairs_can_be_bought():
    refusal = Refused("this task has no more demonstration pairs (all 3 given)")
    messages = opening() + [said('{"action": "request_demos"}'),
                            told(PROMPTS.outcome_message(refusal, 0, 3))]
    assert read_conversation(messages).demos_refused


def test_program_system_prompt_selects_program_mode():
    assert read_conversation(opening(program=True)).mode is Mode.PROGRAM


def test_harness_rules_about_program_files_with_json_actions_stay_action_mode():
    messages = opening()
    rules = "Keep one file per task id with a Python transform(grid); run it first."
    messages.insert(1, told(rules))
    assert read_conversation(messages).mode is Mode.ACTION


def test_program_that_did_not_reproduce_and_program_judged_incorrect_both_count_as_failed():
    check_failed = PROMPTS.render("program_check_failed", details="pair 1 differs")
    messages = opening(program=True) + [
        said("```python\n# program: flip up-down\n"
             "def transform(grid):\n    return grid[::-1]\n```"),
        told(check_failed),
        said("```python\n# program: recolour 1 to 9\ndef transform(grid):\n    return grid\n```\n"
             "Predicted test output: [[9, 9],\n [9, 9]]"),
        told(PROMPTS.outcome_message(Verdict(False, False), 1, 0)),
        said("```python\n# program: identity\ndef transform(grid):\n    return grid\n```"),
    ]
    state = read_conversation(messages)
    assert state.proposed_programs == ("flip up-down", "recolour 1 to 9", "identity")
    assert state.failed_programs == {"flip up-down", "recolour 1 to 9"}
    assert state.wrong_grids == {WRONG}


def test_memory_review_without_task_or_grids_is_other_mode():
    messages = [{"role": "system", "content": "You review the session and save durable notes."},
                told("Is there anything worth remembering from this session?")]
    assert read_conversation(messages).mode is Mode.OTHER


def test_title_request_is_other_mode():
    messages = [told("Write a five-word title for this conversation: hello there")]
    assert read_conversation(messages).mode is Mode.OTHER


def test_content_parts_multiline_grids_and_spaces_are_read():
    text = ("Task id: t-9\nDemonstration 1 input:\n[[5, 6],\n [7, 8]]\n"
            "Demonstration 1 output:\n```json\n[ [6,5], [8,7] ]\n```\n"
            "Test input:\n  [[1, 2],\n[3, 4]]")
    messages = [{"role": "user", "content": [{"type": "text", "text": text},
                                             {"type": "image_url", "image_url": {"url": "x"}}]}]
    state = read_conversation(messages)
    assert state.task_id == "t-9"
    assert state.pairs == (PAIR_1,)
    assert state.test_input == TEST_INPUT


def test_unparseable_and_invalid_grids_are_ignored():
    text = ("Task id: t\nDemonstration 1 input:\n[[1, 2], [3]]\nDemonstration 1 output:\n[[1]]\n"
            "Demonstration 2 input:\n[[1, 12]]\nDemonstration 2 output:\n[[1, 1]]\n"
            "Demonstration 3 input:\n[[1, 2\nDemonstration 3 output:\n[[2, 1]]\n"
            "Test input:\n[[1, 2], [3, 4]]")
    state = read_conversation([told(text), said("not json {"), said('{"action": "submit"}')])
    assert state.pairs == ()
    assert state.test_input == TEST_INPUT
    assert state.submissions == ()


def test_an_earlier_instance_in_the_same_session_is_not_read():
    earlier = opening(task_id="old") + [
        said('{"action": "request_demos"}'), demo_given(PAIR_2, 1),
        said('{"action": "submit", "grid": [[9,9],[9,9]]}'),
        told(PROMPTS.outcome_message(Verdict(True, True), 0, 1)), said('{"action": "finish"}')]
    state = read_conversation(earlier + opening(task_id="new")[1:])
    assert state.task_id == "new"
    assert state.pairs == ()
    assert state.submissions == ()
    assert not state.over


def test_pairs_in_tool_results_count_but_verdicts_there_do_not():
    note = PROMPTS.demo_block(PAIR_1, 1) + "Verdict: correct. The instance is over.\n"
    messages = opening() + [{"role": "assistant", "content": None,
                             "tool_calls": [{"id": "1", "type": "function",
                                             "function": {"name": "read", "arguments": "{}"}}]},
                            {"role": "tool", "tool_call_id": "1", "content": note}]
    state = read_conversation(messages)
    assert state.pairs == (PAIR_1,)
    assert not state.over


def test_developer_role_counts_as_system_for_the_mode():
    messages = opening(program=True)
    messages[0]["role"] = "developer"
    assert read_conversation(messages).mode is Mode.PROGRAM


def test_a_harness_envelope_before_the_text_does_not_hide_pairs_or_refusals():
    """openclaw prefixes every user message with "[<weekday> <date> <time> UTC] "."""
    from solver_model.conversation import read_conversation
    messages = [
        {"role": "user", "content": "[Tue 2026-12-01 02:42 UTC] Task id: t1\nTest input:\n[[1,0]]\n\nRuntime: agent=main"},
        {"role": "assistant", "content": '{"action": "request_demos"}'},
        {"role": "user", "content": "[Tue 2026-12-01 02:43 UTC] Demonstration 1 input:\n[[1,0]]\n"
                                    "Demonstration 1 output:\n[[0,1]]\n"},
        {"role": "assistant", "content": '{"action": "request_demos"}'},
        {"role": "user", "content": "[Tue 2026-12-01 02:44 UTC] Refused: no more demonstrations."},
    ]
    state = read_conversation(messages)
    assert state.task_id == "t1" and len(state.pairs) == 1 and state.demos_refused


def test_what_seeds_a_reply_is_what_a_tool_call_calls_not_the_id_its_answerer_drew():
    def with_call(call_id: str, command: str) -> list[dict]:
        call = {"id": call_id, "type": "function", "function": {"name": "memory", "arguments": command}}
        return opening() + [{"role": "assistant", "content": None, "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": call_id, "content": "saved"}]
    first = read_conversation(with_call("call_1a2b3c4d", '{"content": "note"}')).digest
    assert read_conversation(with_call("call_99ffee00", '{"content": "note"}')).digest == first
    assert read_conversation(with_call("call_1a2b3c4d", '{"content": "other"}')).digest != first
    assert read_conversation(opening()).digest != first
