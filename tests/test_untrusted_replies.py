"""Whatever a learner or a harness replies is untrusted input: extraction never raises, its work is
linear in the reply, a malformed reply costs nothing, and every reply is journaled exactly as
received before its effect counts.

The three reproducers of issue 18's fuzz (an integer over 4,300 digits, a lone surrogate, the
quadratic fence) run through `extract_action`, the program library and the real `CellRunner`
(a grid on a scripted OpenAI-compatible endpoint on loopback, behind the real journaling proxy).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import orchestrator.protocol as protocol_module
from orchestrator.arc import Demo, as_grid
from orchestrator.prompts import PromptSet
from orchestrator.protocol import (Action, InstanceProtocol, Limits, Malformed, MalformedReply, Status,
                                   extract_action, parse_action)
from orchestrator.tasks.base import ArcInstance

HUGE_INT = "1" * 5000
HUGE_INT_REPLY = '{"action": "request_demos", "n": ' + HUGE_INT + "}"
SURROGATE_REPLY = 'Here it is: {"action": "request_demos"} \ud83d'  # a reply cut mid-emoji
FENCES_REPLY = "```{" * 20000  # 80 KB of fence openings that never close


def instance() -> ArcInstance:
    pair = Demo(as_grid([[1]]), as_grid([[2]]))
    return ArcInstance(task_id="t", visit=0, demos=(pair,) * 8, test_input=as_grid([[1]]),
                       test_output=as_grid([[2]]))


# --- extraction: the reproducers --------------------------------------------------------------

def test_an_integer_over_4300_digits_is_malformed_not_an_error():
    for text in (HUGE_INT_REPLY, '{"action": "submit", "grid": [[' + HUGE_INT + "]]}",
                 "```json\n" + HUGE_INT_REPLY + "\n```"):
        out = extract_action(text)
        assert isinstance(out, Malformed) and "too many digits" in out.reason, out
    assert isinstance(parse_action(HUGE_INT_REPLY), Malformed)


def test_a_reply_with_a_lone_surrogate_still_yields_its_action():
    assert extract_action(SURROGATE_REPLY) == Action("request_demos")


def test_unclosed_fence_openings_are_scanned_in_linear_time(monkeypatch):
    decoded = []
    real = protocol_module._decode
    monkeypatch.setattr(protocol_module, "_decode", lambda text: decoded.append(len(text)) or real(text))
    out = extract_action(FENCES_REPLY)
    assert isinstance(out, Malformed)
    # The work handed to the JSON decoder is bounded by the reply's length (the old regex
    # backtracked for 13.5 s here; the time itself is measured in bench, not asserted).
    assert sum(decoded) <= protocol_module.DECODE_BUDGET_FACTOR * len(FENCES_REPLY) + \
        protocol_module.DECODE_BUDGET_MIN + len(FENCES_REPLY)


@pytest.mark.parametrize("text", [
    'I think {the rule is "mirror" so: {"action": "request_demos"}',  # unmatched { before the action
    'It\'s "quoted {"action": "request_demos"} there',  # a stray quote pairs with the action's
    'prose } and { and then\n```json\n{"action": "request_demos"}\n```\n',
])
def test_a_valid_action_after_broken_prose_is_found(text):
    assert extract_action(text) == Action("request_demos")


@pytest.mark.parametrize("text", [
    'first {"action": "request_demos"} then {"action": "finish"}',
    '```json\n{"action": "request_demos"}\n```\nno, rather:\n```json\n{"action": "finish"}\n```',
    'x {"note": {"action": "request_demos"} {"action": "finish"}',  # inside an unclosed brace
])
def test_of_several_actions_the_last_one_wins(text):
    assert extract_action(text) == Action("finish")


def test_a_json_error_inside_a_fence_names_its_line_and_column_in_the_reply():
    out = extract_action('Answer:\n```json\n{"action": "submit", "grid": [[1,]]}\n```')
    assert isinstance(out, Malformed)
    assert out.reason.startswith("not valid JSON at line 3 column 34 of the reply"), out.reason


def test_echoed_values_are_json_and_capped_at_200_characters():
    out = extract_action(json.dumps({"action": "x" * 1_000_000}))
    assert isinstance(out, Malformed) and len(out.reason) < 400 and "…" in out.reason
    assert "None" not in parse_action('{"action": null}').reason
    assert "null" in parse_action('{"action": null}').reason
    assert "true" in parse_action('{"action": "submit", "grid": [[true]]}').reason
    assert "NaN" in parse_action('{"action": "submit", "grid": [[NaN]]}').reason  # not JSON
    assert isinstance(parse_action('{"action": "submit", "grid": [[Infinity]]}'), Malformed)


FENCED_ACTION = '```json\n{"action": "request_demos"}\n```\n'


def test_a_reply_past_1_mib_is_malformed_unread_free_and_says_its_size(monkeypatch):
    """A 1.6 MB reply of fenced blocks took 3.6-13.8 s to search on a loaded machine (bench/
    extraction.py measures it); past the cap it is refused before any of it is read, on the grid
    tracks and on arc3 (whose extraction is the same function)."""
    from orchestrator.arc3 import extract_arc3_action

    at_cap = FENCED_ACTION * (protocol_module.MAX_REPLY_CHARS // len(FENCED_ACTION))
    assert extract_action(at_cap) == Action("request_demos")  # up to the cap it is read as before
    past = FENCED_ACTION * 40_000
    assert len(past) == 1_600_000
    decoded = []
    monkeypatch.setattr(protocol_module, "_decode", lambda text: decoded.append(len(text)))
    for extract in (extract_action, extract_arc3_action):
        out = extract(past)
        assert isinstance(out, Malformed), out
        assert "1,600,000 characters" in out.reason and "1,048,576" in out.reason, out.reason
    assert decoded == []
    p = InstanceProtocol(instance(), Limits())
    p.step(extract_action(past))
    assert (p.cost, p.malformed, p.status) == (0, 1, Status.OPEN)


def test_an_out_of_range_cell_of_4300_digits_is_echoed_capped():
    """The cell-range message once echoed the integer whole: 4,346 characters for 4,300 digits."""
    out = parse_action('{"action": "submit", "grid": [[1, ' + "9" * 4300 + "]]}")
    assert isinstance(out, Malformed) and len(out.reason) < 400, len(out.reason)
    assert out.reason.startswith("cell [0][1] is 9999") and "…" in out.reason


def test_a_null_grid_or_row_reads_got_null_once():
    assert parse_action('{"action": "submit", "grid": null}').reason == \
        "grid must be an array of rows, got null"
    assert parse_action('{"action": "submit", "grid": [null]}').reason == \
        "row 0 must be an array of cells, got null"


# --- the malformed cap is told truthfully ------------------------------------------------------

def test_the_reply_that_reaches_the_malformed_cap_is_told_the_instance_failed():
    prompts = PromptSet.load()
    p = InstanceProtocol(instance(), Limits(max_malformed=7))
    messages = [prompts.outcome_message(p.step(Malformed("bad")), p.wrong, p.demos_used) for _ in range(7)]
    assert "nothing was charged" in messages[0] and "Warning" not in messages[0]
    assert "Warning: 5 more malformed replies" in messages[1]
    assert "Warning: 1 more malformed reply and" in messages[5]
    assert "nothing was charged" not in messages[6]
    assert "failed and is charged the whole budget" in messages[6]
    assert p.status is Status.FAILED and p.cost == 16


# --- properties over arbitrary replies -------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30)
fragments = st.sampled_from(['{', '}', '"', '\\', '```', '```json\n', '\n', ' ', '[', ']', ',', ':',
                             '"action"', '"submit"', '"request_demos"', '"grid"', '[[1]]', '1' * 50,
                             '\ud83d', 'NaN', 'prose'])
replies = st.one_of(st.text(max_size=400),
                    st.lists(fragments, max_size=80).map("".join),
                    json_values.map(json.dumps),
                    st.tuples(st.text(max_size=40), json_values, st.text(max_size=40)).map(
                        lambda t: f"{t[0]}```json\n{json.dumps({'action': 'submit', 'grid': t[1]})}\n```{t[2]}"))


@settings(max_examples=600, deadline=None)
@given(replies)
def test_any_reply_extracts_without_raising_and_a_malformed_one_costs_nothing(text):
    out = extract_action(text)
    assert isinstance(out, (Action, Malformed))
    p = InstanceProtocol(instance())
    outcome = p.step(out)
    if isinstance(out, Malformed):
        assert isinstance(outcome, MalformedReply) and p.cost == 0 and p.status is Status.OPEN
    json.dumps(getattr(outcome, "reason", ""))  # whatever it says can be sent back


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_value_parses_without_raising(value):
    assert isinstance(parse_action(value), (Action, Malformed))
    assert isinstance(extract_action(json.dumps(value)), (Action, Malformed))


# --- through the program library -------------------------------------------------------------

class _Replies:
    """A ChatModel stand-in for the program library: fixed replies in order."""

    def __init__(self, texts: list[str]):
        self.texts = list(texts)

    def complete(self, messages, deadline=None):
        from harness_adapters.chat_model import ChatReply, Usage
        return ChatReply(self.texts.pop(0), Usage(1, 0, 0, 0.0, 0.0))


def _library(tmp_path: Path, texts: list[str]):
    from harness_adapters.base import InstanceView
    from harness_adapters.program_library import ProgramLibrary
    learner = ProgramLibrary(tmp_path, PromptSet.load(), _Replies(texts))
    item = instance()
    learner.begin(InstanceView("t", item.test_input, 0, 0, ()))
    return learner


def test_the_program_library_grants_a_fenced_or_prose_wrapped_request(tmp_path):
    learner = _library(tmp_path, ['Let me see more.\n```json\n{"action": "request_demos"}\n```'])
    assert learner.act().action == Action("request_demos")


def test_the_program_library_survives_the_reproducers_and_says_when_no_program_came(tmp_path):
    learner = _library(tmp_path, [HUGE_INT_REPLY, SURROGATE_REPLY] + [FENCES_REPLY] * 6)
    assert learner.act().action == Action("request_demos")  # the surrogate reply's request
    learner = _library(tmp_path, [HUGE_INT_REPLY] * 6)
    action = learner.act().action
    assert isinstance(action, Malformed) and "none of 6 replies held a program" in action.reason


# --- through the real CellRunner -------------------------------------------------------------

class _ScriptedChat(BaseHTTPRequestHandler):
    """OpenAI chat completions on loopback: the n-th assistant turn of a conversation gets the
    n-th scripted reply (JSON-escaped, so a lone surrogate crosses the wire as `\\ud83d`)."""

    script: list[str] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        turn = sum(m.get("role") == "assistant" for m in body["messages"])
        text = self.script[min(turn, len(self.script) - 1)]
        payload = json.dumps({
            "id": f"c{turn}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


WRONG = '{"action": "submit", "grid": [[0]]}'


@pytest.fixture
def scripted_endpoint():
    _ScriptedChat.script = [HUGE_INT_REPLY, SURROGATE_REPLY, FENCES_REPLY] + [WRONG] * 8
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedChat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


@pytest.mark.slow
def test_the_reproducers_through_the_cell_runner_cost_nothing_and_every_reply_is_journaled(
        tmp_path, scripted_endpoint, monkeypatch):
    """Real CellRunner, real journaling proxy, scripted model: the huge integer and the fences are
    malformed at cost 0, the surrogate reply's request is applied and journaled with its reply
    exactly as sent, and the instance ends on its own eight wrong answers (not a learner error)."""
    from orchestrator.records import read_events
    from orchestrator.run.local_pool import execute
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-untrusted-replies")
    grid = (f"name: untrusted\nseed: 0\ntrack: {{name: own, tasks: 1, visits: 1, epilogue: 0, fresh_reference: false}}\norders: [sequential]\n"
            f"efforts: [low]\nlearners: [stateless-floor]\nworkers: 1\n"
            f"model: {{endpoint: '{scripted_endpoint}', name: scripted}}\n")
    run_dir = tmp_path / "runs" / "untrusted"
    (run_dir / "cells").mkdir(parents=True)
    (run_dir / "grid.yaml").write_text(grid)
    execute(run_dir, show_progress=False)
    [cell] = (run_dir / "cells").iterdir()
    events = read_events(cell / "events.jsonl")
    steps = [e for e in events if e.type == "step"]
    assert [s.outcome for s in steps] == ["malformed", "demo", "malformed"] + ["incorrect"] * 8
    assert [s.cost for s in steps[:3]] == [0, 1, 1]
    assert "too many digits" in steps[0].message
    assert steps[1].reply == SURROGATE_REPLY  # exactly as received, surrogate and all
    assert steps[2].reply == FENCES_REPLY
    [end] = [e for e in events if e.type == "instance_end"]
    assert end.status == "failed" and end.failure_kind == "wrong-answers" and end.cost == 16
    assert not [e for e in events if e.type == "learner_error"]
