"""The embedded model as a tool-using agent (solver_model/agent.py), on synthetic harnesses.

A small in-process harness plays each tool for real (memory entries with a character limit and
an error result when full, files in a temporary folder, shell commands and python run by the real
interpreter) and the real protocol judges the actions. The tools differ by harness only in names
and schemas: hermes-like, openclaw-like, and a fourth harness with `save_note`/`run_command`.
The server tests talk to a real uvicorn server with the official openai client.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest
import uvicorn
from fastapi.testclient import TestClient

from orchestrator.arc import Demo, as_grid
from orchestrator.prompts import PromptSet
from orchestrator.protocol import InstanceProtocol, extract_action
from orchestrator.tasks.base import ArcInstance
from proxy.host import free_port
from solver_model.agent import (MEMORY, PYTHON, READ, SHELL, WRITE, classify_tools, note_text,
                                read_notes)
from solver_model.search import Exploration, Program, Step
from solver_model.server import answer_conversation, create_app

PROMPTS = PromptSet.load()
FLIP = Program((Step("flip_h"),))
LIBRARY = (Program((Step("flip_v"),)), FLIP, Program((Step("rot180"),)), Program((Step("transpose"),)))


def library_search(pairs, effort, test_input=None, exclude=(), rng=None) -> Exploration:
    """Every program of LIBRARY that fits, one per distinct test output (deterministic)."""
    found, outputs = [], set()
    for program in LIBRARY:
        if program.describe() in exclude or not all(program(p.input) == p.output for p in pairs):
            continue
        output = program(test_input) if test_input is not None else None
        if output is None and test_input is not None or output in outputs:
            continue
        outputs.add(output)
        found.append(program)
    return Exploration(tuple(found), None, 0.0, len(LIBRARY))


def g(rows) -> Any:
    return as_grid(rows)


def pair(rows) -> Demo:
    grid = g(rows)
    return Demo(grid, FLIP(grid))


DEMOS = (pair([[1, 2, 3], [4, 5, 6]]), pair([[7, 0, 1], [2, 2, 3]]), pair([[3, 1, 1], [5, 4, 4]]))


def instance(visit: int) -> ArcInstance:
    test = g([[visit, 2, 5], [6, visit + 1, 8]])
    return ArcInstance("own-flip", visit, test, FLIP(test), DEMOS)


# --- tool schemas, as three different harnesses name them --------------------------------------

def fn(name: str, properties: dict[str, Any], required: list[str], description: str = "") -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}}


S = {"type": "string"}
HERMES_TOOLS = [
    fn("memory", {"action": {"type": "string", "enum": ["add", "replace", "remove"]},
                  "target": {"type": "string", "enum": ["memory", "user"]}, "content": S,
                  "old_text": S}, ["target"]),
    fn("write_file", {"path": S, "content": S}, ["path", "content"]),
    fn("read_file", {"path": S, "offset": {"type": "integer"}}, ["path"]),
    fn("terminal", {"command": S, "background": {"type": "boolean"}}, ["command"]),
    fn("execute_code", {"code": S}, ["code"]),
    fn("skill_view", {"name": S, "file_path": S}, ["name"]),
]
OPENCLAW_TOOLS = [
    fn("read", {"path": S, "offset": {"type": "integer"}}, ["path"]),
    fn("write", {"path": S, "content": S}, ["path", "content"]),
    fn("edit", {"path": S, "edits": {"type": "array"}}, ["path", "edits"]),
    fn("exec", {"title": S, "command": S}, ["command"]),
    fn("ls", {"path": S}, []),
]
FOURTH_TOOLS = [
    fn("save_note", {"note": S}, ["note"], "Keep a note that is shown to you in later sessions."),
    fn("run_command", {"command": S}, ["command"], "Run a shell command."),
]


def test_tools_are_chosen_by_schema_and_name_not_by_harness():
    hermes, openclaw, fourth = (classify_tools(t) for t in (HERMES_TOOLS, OPENCLAW_TOOLS, FOURTH_TOOLS))
    assert {r: t.name for r, t in hermes.items()} == {
        MEMORY: "memory", WRITE: "write_file", READ: "read_file", SHELL: "terminal",
        PYTHON: "execute_code"}
    assert hermes[MEMORY].action == "action" and hermes[MEMORY].target == ("target", "memory")
    assert {r: t.name for r, t in openclaw.items()} == {READ: "read", WRITE: "write", SHELL: "exec"}
    assert openclaw[SHELL].extras == {} and openclaw[WRITE].path == "path"
    assert {r: t.name for r, t in fourth.items()} == {MEMORY: "save_note", SHELL: "run_command"}
    assert fourth[MEMORY].arg == "note" and fourth[MEMORY].action is None
    # the Responses API's flat tool form is read the same way
    flat = [{"type": "function", **t["function"]} for t in FOURTH_TOOLS]
    assert {r: t.name for r, t in classify_tools(flat).items()} == {MEMORY: "save_note",
                                                                   SHELL: "run_command"}


def test_a_note_reads_back_its_program_and_pairs():
    text = note_text("own-flip", FLIP, DEMOS, limit=10_000)
    assert text.startswith("carc-note task own-flip\nsteps: (('flip_h', ()),)\npairs: [[")
    [note] = read_notes("MEMORY block\n" + text + "\n§\ncarc-note task other\nsteps: none\npairs: []",
                        "own-flip")
    assert note.program == FLIP and note.pairs == DEMOS
    assert read_notes(json.dumps({"output": text}), "own-flip") == []  # escaped: read via leaves
    short = note_text("own-flip", FLIP, DEMOS, limit=120)
    assert len(short) <= 120 and read_notes(short, "own-flip")[0].pairs == DEMOS[:1]


# --- a small harness that plays its tools for real ---------------------------------------------

class Harness:
    """Memory entries (with a limit), a folder for files, a real shell and python; one model."""

    def __init__(self, tools: list[dict], root: Path, memory_limit: int = 2200,
                 effort: str = "low") -> None:
        self.tools, self.root, self.memory_limit, self.effort = tools, root, memory_limit, effort
        self.memory: list[str] = []
        self.calls: list[tuple[str, dict]] = []
        root.mkdir(parents=True, exist_ok=True)

    def system(self) -> str:
        text = "You are a helpful agent with tools."
        if self.memory:
            text += "\n\nMEMORY (your personal notes)\n" + "\n§\n".join(self.memory)
        return text

    def execute(self, name: str, args: dict) -> str:
        self.calls.append((name, args))
        if name in ("memory", "save_note"):
            content = args.get("content") or args.get("note") or ""
            if args.get("action") == "replace":
                self.memory = [e for e in self.memory if args["old_text"] not in e]
            if sum(map(len, self.memory)) + len(content) > self.memory_limit:
                return json.dumps({"success": False, "error": f"Memory at limit {self.memory_limit}"})
            self.memory.append(content)
            return json.dumps({"success": True, "message": "Entry added."})
        if name in ("write_file", "write"):
            path = Path(args["path"]) if args["path"].startswith("/") else self.root / args["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(args["content"])
            return json.dumps({"bytes_written": len(args["content"])})
        if name in ("terminal", "exec", "run_command", "execute_code"):
            command = ["python3", "-c", args["code"]] if name == "execute_code" else \
                ["bash", "-c", args["command"]]
            done = subprocess.run(command, cwd=self.root, capture_output=True, text=True, timeout=60)
            return json.dumps({"output": done.stdout + done.stderr, "exit_code": done.returncode})
        return json.dumps({"error": f"unknown tool {name}"})

    def play(self, inst: ArcInstance, opening: list[str] = (), ending: str = "") -> InstanceProtocol:
        """One instance, one conversation: actions judged by the protocol, tools executed."""
        protocol = InstanceProtocol(inst)
        first = "\n".join([PROMPTS.render("system"), *opening,
                           PROMPTS.instance_message(inst.task_id, inst.test_input, 0, 0)])
        messages: list[dict] = [{"role": "system", "content": self.system()},
                                {"role": "user", "content": first}]
        for _ in range(60):
            answer = answer_conversation(messages, self.effort, search=library_search,
                                         tools=self.tools)
            if answer.calls:
                messages.append({"role": "assistant", "content": None,
                                 "tool_calls": [c.to_openai() for c in answer.calls]})
                for call in answer.calls:
                    messages.append({"role": "tool", "tool_call_id": call.id,
                                     "content": self.execute(call.name, call.arguments)})
                continue
            messages.append({"role": "assistant", "content": answer.text})
            action = extract_action(answer.text)
            was_over = protocol.over
            outcome = protocol.step(action)
            if protocol.finished:
                return protocol
            text = PROMPTS.outcome_message(outcome, protocol.wrong, protocol.demos_used,
                                           protocol.demos_used)
            if protocol.over and not was_over and ending:
                text += "\n" + ending
            messages.append({"role": "user", "content": text})
        raise AssertionError(f"the instance never finished: {messages[-3:]}")


INVITATION = PROMPTS.render("store_invitation")


@pytest.mark.parametrize("tools", [HERMES_TOOLS, FOURTH_TOOLS], ids=["hermes-like", "fourth"])
def test_a_stored_note_comes_back_and_the_returning_instance_buys_no_pair(tools, tmp_path):
    harness = Harness(tools, tmp_path)
    first = harness.play(instance(0), ending=INVITATION)
    assert first.status.value == "solved" and first.demos_used == 1
    [note] = harness.memory
    assert note.startswith("carc-note task own-flip\nsteps: (('flip_h', ()),)")
    assert len(read_notes(note, "own-flip")[0].pairs) == 2  # the bought pair and the verified one
    back = harness.play(instance(1), ending=INVITATION)
    assert back.status.value == "solved" and back.demos_used == 0 and back.cost == 0
    forgetful = Harness(tools, tmp_path / "off")
    again = forgetful.play(instance(1))
    assert again.demos_used == 1 and again.cost > back.cost


def test_without_an_invitation_nothing_is_saved(tmp_path):
    harness = Harness(HERMES_TOOLS, tmp_path)
    harness.play(instance(0))
    assert harness.memory == [] and harness.calls == []


def test_a_full_memory_gets_a_shorter_note_then_a_file(tmp_path):
    short = Harness(HERMES_TOOLS, tmp_path / "short", memory_limit=100)
    short.play(instance(0), ending=INVITATION)
    sizes = [len(args["content"]) for name, args in short.calls if name == "memory"]
    assert sizes[0] > 100 >= sizes[-1] and len(short.memory) == 1
    assert read_notes(short.memory[0], "own-flip")[0].program == FLIP
    full = Harness(HERMES_TOOLS, tmp_path / "full", memory_limit=10)
    full.play(instance(0), ending=INVITATION)
    assert [name for name, _ in full.calls] == ["memory"] * 3 + ["write_file"]
    assert read_notes((tmp_path / "full" / "carc-notes" / "own-flip.md").read_text(),
                      "own-flip")[0].program == FLIP


def test_a_harness_without_a_memory_tool_appends_to_the_memory_file_its_prompt_names(tmp_path):
    class Openclawish(Harness):
        def system(self) -> str:
            memory = self.root / "MEMORY.md"
            return ("Long-term: `MEMORY.md` holds durable facts.\n"
                    + (memory.read_text() if memory.exists() else ""))
    harness = Openclawish(OPENCLAW_TOOLS, tmp_path)
    harness.play(instance(0), ending=INVITATION)
    assert [name for name, _ in harness.calls] == ["exec"]
    back = harness.play(instance(1), ending=INVITATION)
    assert back.cost == 0
    assert (tmp_path / "MEMORY.md").read_text().count("carc-note task own-flip") == 2


@pytest.mark.parametrize("tools", [HERMES_TOOLS, OPENCLAW_TOOLS, FOURTH_TOOLS],
                         ids=["hermes-like", "openclaw-like", "fourth"])
def test_the_program_procedure_runs_the_saved_file_first_and_submits_its_output(tools, tmp_path):
    programs = tmp_path / "programs"
    rules = PROMPTS.render("program_procedure", programs_dir=programs)
    save = PROMPTS.render("program_save_request", task_id="own-flip", programs_dir=programs)
    harness = Harness(tools, tmp_path / "work")
    first = harness.play(instance(0), [rules], save)
    assert first.demos_used == 1
    run, *_ = harness.calls  # it looked for the file first: absent, so it went on as usual
    assert str(programs / "own-flip.py") in json.dumps(run[1])
    assert (programs / "own-flip.py").exists()
    harness.calls.clear()
    back = harness.play(instance(1), [rules], save)
    assert back.status.value == "solved" and back.cost == 0
    assert "carc-output task own-flip:" in harness.execute(*harness.calls[0])
    (programs / "own-flip.py").unlink()  # wiped: the procedure finds nothing and buys again
    wiped = harness.play(instance(2), [rules], save)
    assert wiped.demos_used == 1


def test_a_stored_program_that_contradicts_a_held_pair_is_not_submitted():
    wrong = note_text("own-flip", Program((Step("flip_v"),)), DEMOS[:1], limit=10_000)
    messages = [{"role": "system", "content": "MEMORY\n" + wrong},
                {"role": "user", "content": PROMPTS.instance_message(
                    "own-flip", instance(1).test_input, 0, 0)}]
    answer = answer_conversation(messages, "low", search=library_search, tools=HERMES_TOOLS)
    assert extract_action(answer.text).grid == FLIP(instance(1).test_input)  # from the pair


def test_without_tools_the_reply_ignores_material_in_context():
    note = note_text("own-flip", FLIP, DEMOS, limit=10_000)
    messages = [{"role": "system", "content": "MEMORY\n" + note},
                {"role": "user", "content": PROMPTS.instance_message(
                    "own-flip", instance(1).test_input, 0, 0)}]
    assert answer_conversation(messages, "low", search=library_search).text == \
        '{"action": "request_demos"}'


# --- the server: tool calls on the wire ---------------------------------------------------------

def save_conversation() -> list[dict]:
    inst = instance(0)
    return [{"role": "system", "content": "agent"},
            {"role": "user", "content": PROMPTS.instance_message(
                inst.task_id, inst.test_input, 0, 0, cached=list(DEMOS[:1]))},
            {"role": "assistant", "content": json.dumps({"action": "submit", "grid": FLIP(inst.test_input)})},
            {"role": "user", "content": "Verdict: correct. The instance is over.\n" + INVITATION}]


@pytest.fixture(scope="module")
def served():
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app("low", search=library_search),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=5)


def test_the_openai_client_reads_tool_calls_streamed_and_not(served):
    client = openai.OpenAI(base_url=served, api_key="unused", max_retries=0, timeout=30)
    plain = client.chat.completions.create(model="carc-solver", messages=save_conversation(),
                                           tools=FOURTH_TOOLS)
    assert plain.choices[0].finish_reason == "tool_calls"
    [call] = plain.choices[0].message.tool_calls
    assert call.function.name == "save_note"
    note = json.loads(call.function.arguments)["note"]
    assert read_notes(note, "own-flip")[0].program == FLIP
    calls: dict[int, dict] = {}
    finish = None
    with client.chat.completions.create(model="carc-solver", messages=save_conversation(),
                                        tools=FOURTH_TOOLS, stream=True,
                                        stream_options={"include_usage": True}) as stream:
        for chunk in stream:
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for delta in choice.delta.tool_calls or []:
                    entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                    entry["id"] = delta.id or entry["id"]
                    if delta.function and delta.function.name:
                        entry["name"] += delta.function.name
                    if delta.function and delta.function.arguments:
                        entry["arguments"] += delta.function.arguments
    assert finish == "tool_calls"
    assert calls == {0: {"id": call.id, "name": "save_note", "arguments": call.function.arguments}}
    # the tool result goes back; the model then says what the message asked: finish
    after = save_conversation() + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "saved"}]
    done = client.chat.completions.create(model="carc-solver", messages=after, tools=FOURTH_TOOLS)
    assert done.choices[0].finish_reason == "stop"
    assert json.loads(done.choices[0].message.content) == {"action": "finish"}


def test_the_responses_api_gives_function_calls_and_reads_their_outputs():
    client = TestClient(create_app("low", search=library_search))
    flat = [{"type": "function", **t["function"]} for t in FOURTH_TOOLS]
    items = [{"role": m["role"], "content": m["content"]} for m in save_conversation()]
    body = client.post("/v1/responses", json={"model": "carc-solver", "input": items,
                                               "tools": flat}).json()
    [item] = body["output"]
    assert item["type"] == "function_call" and item["name"] == "save_note"
    items += [item, {"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}]
    body = client.post("/v1/responses", json={"model": "carc-solver", "input": items,
                                               "tools": flat}).json()
    assert body["output"][0]["content"][0]["text"] == '{"action": "finish"}'
