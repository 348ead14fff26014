"""The ladder learners and the program checker, with a scripted model standing in for an endpoint.

The checker runs real subprocesses; the scripted model replays fixed replies (no model API is
reachable, and the embedded solver model is exercised end to end in test_runner.py).
"""


from harness_adapters.base import InstanceView, StepRecord
from harness_adapters.chat_model import ChatReply, Usage
from harness_adapters.demo_cache_floor import DemoCache, DemoCacheFloor
from harness_adapters.program_check import ProgramLimits, check_program, run_program
from harness_adapters.program_library import ProgramLibrary, extract_program
from harness_adapters.stateless_floor import StatelessFloor
from orchestrator.arc import Demo
from orchestrator.prompts import PromptSet
from orchestrator.protocol import Action, DemoGiven, Malformed, Verdict

FLIP = "def transform(grid):\n    return [row[::-1] for row in grid]\n"
PAIRS = [Demo(((1, 2),), ((2, 1),)), Demo(((3, 0, 4),), ((4, 0, 3),))]
TEST = ((5, 6, 7),)


class ScriptedModel:
    """Replays replies in order and records every conversation it was sent."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen = []

    def complete(self, messages, deadline=None):
        self.seen.append([dict(m) for m in messages])
        return ChatReply(self.replies.pop(0), Usage(1, 10, 5, 0.01, 0.0))


def test_a_correct_program_passes_and_yields_its_test_output():
    result = check_program(FLIP, PAIRS, TEST)
    assert result.passed and result.test_output == ((7, 6, 5),)


def test_a_program_that_misses_a_pair_fails_with_the_pair_named():
    result = check_program("def transform(grid):\n    return grid\n", PAIRS, TEST)
    assert not result.passed and "Pair 1" in result.details and "Pair 2" in result.details


def test_a_failed_check_shows_the_first_three_failing_pairs_and_names_the_rest():
    """A demo cache can hold dozens of pairs; the message shows three returned grids, not all."""
    pairs = [Demo(((n, 1),), ((n, 2),)) for n in range(8)]
    result = check_program("def transform(grid):\n    return [[9]]\n", pairs, TEST)
    shown = [line for line in result.details.splitlines() if line.startswith("Pair ")]
    assert [line.split(":")[0] for line in shown] == ["Pair 1", "Pair 2", "Pair 3"]
    assert all(line.endswith("returned [[9]]") for line in shown)
    assert result.details.splitlines()[-1] == "8 of the 8 pairs failed; also pairs 4, 5, 6, 7, 8."
    pairs[1] = Demo(((2, 1),), ((1, 2),))  # the flip reproduces pair 2 only
    four = check_program(FLIP, pairs[:5], TEST)
    assert [line.split(":")[0] for line in four.details.splitlines()[:3]] == ["Pair 1", "Pair 3", "Pair 4"]
    assert four.details.splitlines()[-1] == "4 of the 5 pairs failed; also pair 5."
    assert check_program(FLIP, pairs[1:2], TEST).passed


def test_an_endless_program_is_killed_at_the_time_limit():
    source = "def transform(grid):\n    while True:\n        pass\n"
    results = run_program(source, [TEST], ProgramLimits(wall_s=2, cpu_s=1))
    assert results[0].output is None and results[0].error


def test_a_memory_hungry_program_fails_without_harm():
    source = "def transform(grid):\n    x = bytearray(4 << 30)\n    return grid\n"
    results = run_program(source, [TEST], ProgramLimits(memory_bytes=256 << 20))
    assert results[0].output is None and "MemoryError" in results[0].error


def test_invalid_output_and_missing_transform_are_reported():
    bad = run_program("def transform(grid):\n    return [[1, 2], [3]]\n", [TEST])
    assert "not rectangular" in bad[0].error
    none = run_program("x = 1\n", [TEST])
    assert "transform" in none[0].error


def test_extract_program_takes_the_last_fenced_block_defining_transform():
    text = f"Here:\n```python\n{FLIP}```\nand\n```python\nprint(1)\n```"
    assert extract_program(text) == FLIP
    assert extract_program('{"action": "request_demos"}') is None


def test_stateless_floor_sends_the_protocol_messages_and_keeps_nothing(tmp_path):
    model = ScriptedModel(['{"action": "request_demos"}', '{"action": "submit", "grid": [[7,6,5]]}'])
    learner = StatelessFloor(tmp_path, PromptSet.load(), model)
    learner.begin(InstanceView("t", TEST))
    assert learner.act().text == '{"action": "request_demos"}'
    learner.observe(DemoGiven(PAIRS[0], 1), 0, 1)
    learner.act()
    opening = model.seen[0][1]["content"]
    assert "Task id: t" in opening and "Test input:\n[[5,6,7]]" in opening
    assert "Demonstration 1 input:\n[[1,2]]" in model.seen[1][-1]["content"]
    learner.end(True)
    assert list(tmp_path.iterdir()) == []


def test_demo_cache_floor_shows_pairs_bought_earlier_for_free(tmp_path):
    prompts = PromptSet.load()
    first = DemoCacheFloor(tmp_path, prompts, ScriptedModel([]))
    first.begin(InstanceView("t", TEST))
    first.observe(DemoGiven(PAIRS[0], 1), 0, 1)
    first.observe(DemoGiven(PAIRS[1], 2), 0, 2)
    first.end(True)
    model = ScriptedModel(['{"action": "request_demos"}'])
    again = DemoCacheFloor(tmp_path, prompts, model)
    again.begin(InstanceView("t", TEST))
    again.act()
    opening = model.seen[0][1]["content"]
    assert "shown again at no cost" in opening and "Demonstration 2 output:\n[[4,0,3]]" in opening
    again.observe(DemoGiven(PAIRS[0], 1), 0, 1)  # a repeat purchase is numbered after the cache
    assert "Demonstration 3 input" in again.messages[-1]["content"]
    again.end(True)
    assert DemoCache(tmp_path).get("t") == PAIRS
    assert DemoCache(tmp_path).get("other") == []


def test_program_library_submits_a_checked_program_and_keeps_it(tmp_path):
    prompts = PromptSet.load()
    (tmp_path / "demos").mkdir()
    DemoCache(tmp_path).add("t", PAIRS)
    model = ScriptedModel(["```python\ndef transform(grid):\n    return grid\n```", f"```python\n{FLIP}```"])
    learner = ProgramLibrary(tmp_path, prompts, model)
    learner.begin(InstanceView("t", TEST))
    turn = learner.act()
    # the first program failed its free check and went back to the model; the second passed
    assert "did not reproduce" in model.seen[1][-1]["content"]
    assert turn.action == Action("submit", ((7, 6, 5),)) and turn.note["from"] == "model"
    assert turn.usage.calls == 2
    learner.observe(Verdict(True, True), 0, 0)
    learner.end(True)
    assert (tmp_path / "programs" / "t.py").read_text() == FLIP


def test_program_library_runs_the_kept_program_first_without_asking_the_model(tmp_path):
    (tmp_path / "programs").mkdir()
    (tmp_path / "programs" / "t.py").write_text(FLIP)
    model = ScriptedModel([])
    learner = ProgramLibrary(tmp_path, PromptSet.load(), model)
    learner.begin(InstanceView("t", TEST))
    turn = learner.act()
    assert turn.action == Action("submit", ((7, 6, 5),)) and turn.note["from"] == "kept"
    assert model.seen == []


def test_a_wrong_kept_program_is_shown_to_the_model_with_its_verdict_and_dropped(tmp_path):
    (tmp_path / "programs").mkdir()
    (tmp_path / "programs" / "t.py").write_text(FLIP)
    model = ScriptedModel(['{"action": "request_demos"}'])
    learner = ProgramLibrary(tmp_path, PromptSet.load(), model)
    learner.begin(InstanceView("t", TEST))
    learner.act()
    learner.observe(Verdict(False, False), 1, 0)
    turn = learner.act()
    assert turn.action == Action("request_demos")
    sent = model.seen[0]
    assert FLIP in sent[-2]["content"] and "Verdict: incorrect" in sent[-1]["content"]
    learner.end(False)
    assert not (tmp_path / "programs" / "t.py").exists()


def test_program_library_gives_up_a_turn_as_a_free_malformed_action(tmp_path):
    model = ScriptedModel(["I am not sure."] * 6)
    learner = ProgramLibrary(tmp_path, PromptSet.load(), model)
    learner.begin(InstanceView("t", TEST))
    turn = learner.act()
    assert isinstance(turn.action, Malformed) and turn.usage.calls == 6


def test_a_resumed_instance_gets_its_conversation_back(tmp_path):
    model = ScriptedModel(['{"action": "submit", "grid": [[7,6,5]]}'])
    learner = DemoCacheFloor(tmp_path, PromptSet.load(), model)
    history = (StepRecord(Action("request_demos"), DemoGiven(PAIRS[0], 1), '{"action": "demo"}'),
               StepRecord(Action("submit", ((1,),)), Verdict(False, False), '{"action": "submit", "grid": [[1]]}'))
    learner.begin(InstanceView("t", TEST, 1, 1, history))
    learner.act()
    roles = [m["role"] for m in model.seen[0]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert model.seen[0][2]["content"] == '{"action": "demo"}'
    assert "Verdict: incorrect" in model.seen[0][-1]["content"]
    learner.end(False)
    assert DemoCache(tmp_path).get("t") == [PAIRS[0]]


def test_a_program_on_the_process_engine_sees_no_key_in_its_environment_or_the_orchestrators(monkeypatch):
    """The process engine runs a model-written program with an empty environment and, when carc
    runs as root, as nobody: neither os.environ nor /proc/<parent>/environ gives the key."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-process-engine-secret")
    source = (
        "import os\n"
        "def transform(grid):\n"
        "    seen = repr(dict(os.environ))\n"
        "    for pid in (os.getppid(), 1):\n"
        "        try:\n"
        "            seen += open(f'/proc/{pid}/environ', 'rb').read().decode('latin-1')\n"
        "        except OSError as exc:\n"
        "            seen += str(exc)\n"
        "    return [[9 if 'sk-process-engine-secret' in seen else 1]]\n")
    [result] = run_program(source, [((0,),)])
    assert result.error is None and result.output == ((1,),), result


def test_a_resumed_program_library_instance_sends_the_model_exactly_what_it_would_have(tmp_path):
    """Every reply of a turn and every failed check's message is recorded in the step's note and
    replayed on resume: the conversation sent after a resume equals the uninterrupted one."""
    wrong = "# program: identity\n```python\ndef transform(grid):\n    return grid\n```\nPredicted test output: [[5,6,7]]"
    right = f"# program: flip\n```python\n{FLIP}```\nPredicted test output: [[7,6,5]]"
    replies = [wrong, right, '{"action": "request_demos"}', right]

    def play(learner, steps):
        history, wrong_answers, demos = [], 0, 0
        for _ in range(steps):
            turn = learner.act()
            action = turn.action or Action("request_demos")
            if action.kind == "submit":
                outcome, wrong_answers = Verdict(False, False), wrong_answers + 1
            else:
                outcome, demos = DemoGiven(PAIRS[1], demos + 1), demos + 1
            history.append(StepRecord(action, outcome, turn.text, turn.note))
            learner.observe(outcome, wrong_answers, demos)
        return history

    uninterrupted = ScriptedModel(replies)
    learner = ProgramLibrary(tmp_path / "a", PromptSet.load(), uninterrupted)
    learner.pairs = [PAIRS[0]]
    learner.begin(InstanceView("t", TEST))
    history = play(learner, 2)
    learner.act()

    resumed = ScriptedModel(replies[3:])
    again = ProgramLibrary(tmp_path / "b", PromptSet.load(), resumed)
    again.begin(InstanceView("t", TEST, 1, 1, tuple(history)))
    again.act()
    assert resumed.seen[-1] == uninterrupted.seen[-1]
    assert any("Predicted test output" in m["content"] for m in resumed.seen[-1] if m["role"] == "assistant")
