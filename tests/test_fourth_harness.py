"""A fourth harness, scaffolded with `carc adapters new`, gets the embedded model's diligent
behaviour with no change to the model: it offers tools under its own names and schemas
(`keep_note`, `shell`), and the model picks them by schema.

The scaffold's generic driver runs for real (host Python), one CLI run per user message, as in a
sandbox. The CLI is a minimal tool-calling agent on the official openai SDK: it keeps its
conversation per session in its state folder, shows its kept notes in the system prompt of every
new conversation, and executes the tool calls it gets (a note appended to notes.md, a shell
command run for real). The model is the real embedded server over HTTP (a fixed program library
for its search, so the test is about delivery, not solving).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness_adapters.registry import REGISTRY
from harness_adapters.scaffold import new_adapter
from orchestrator.prompts import PromptSet
from orchestrator.protocol import Finished, InstanceProtocol, extract_action
from tests.test_solver_agent import instance, served  # noqa: F401 - the embedded server fixture

PROMPTS = PromptSet.load()

AGENT_CLI = textwrap.dedent('''\
    """A minimal tool-calling agent: python agent.py STATE SESSION MESSAGE."""
    import json, os, subprocess, sys
    import openai

    state, session, message = sys.argv[1], sys.argv[2], sys.argv[3]
    notes = os.path.join(state, "notes.md")
    history = os.path.join(state, f"{session}.json")
    TOOLS = [
        {"type": "function", "function": {"name": "keep_note",
         "description": "Keep a note; every note is shown to you at the start of later sessions.",
         "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                        "required": ["text"]}}},
        {"type": "function", "function": {"name": "shell", "description": "Run a bash command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                        "required": ["cmd"]}}},
    ]
    if os.path.exists(history):
        messages = json.load(open(history))
    else:
        kept = open(notes).read() if os.path.exists(notes) else "(none yet)"
        messages = [{"role": "system", "content": "You are an agent. Your notes:\\n" + kept}]
    messages.append({"role": "user", "content": message})
    client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="none")
    for _ in range(12):
        reply = client.chat.completions.create(model=os.environ["OPENAI_MODEL"],
                                               messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            args = json.loads(call.function.arguments)
            if call.function.name == "keep_note":
                with open(notes, "a") as f:
                    f.write(args["text"] + "\\n")
                out = "kept"
            else:
                run = subprocess.run(["bash", "-c", args["cmd"]], capture_output=True, text=True)
                out = run.stdout + run.stderr
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
    json.dump(messages, open(history, "w"))
    print(reply.content or "")
''')


class Scaffolded:
    """The scaffold's driver, one process per conversation, as the adapter runs it."""

    def __init__(self, root: Path, base_url: str, state: Path):
        new_adapter("note-agent", root, pip="note-agent", version="0.1.0")
        self.driver = root / "harness_adapters" / "recipes" / "note-agent" / "driver.py"
        self.cli = root / "agent.py"
        self.cli.write_text(AGENT_CLI)
        self.base_url, self.state = base_url, state
        state.mkdir(parents=True, exist_ok=True)
        self.sessions = 0

    def play(self, inst, store: bool) -> InstanceProtocol:
        self.sessions += 1
        session = f"carc-{self.sessions}"
        command = [sys.executable, str(self.cli), str(self.state), session, "{message}"]
        setup = {"session": session, "model": "carc-solver", "base_url": self.base_url,
                 "first": command, "next": command, "cwd": str(self.state),
                 "log": str(self.state / "driver.log"), "timeout": 60}
        proc = subprocess.Popen([sys.executable, str(self.driver)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            proc.stdin.write(json.dumps(setup) + "\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline()) == {"ready": True}
            protocol = InstanceProtocol(inst)
            message = "\n".join([PROMPTS.render("system"), PROMPTS.instance_message(
                inst.task_id, inst.test_input, 0, 0)])
            for _ in range(30):
                proc.stdin.write(json.dumps({"message": message}) + "\n")
                proc.stdin.flush()
                reply = json.loads(proc.stdout.readline())
                assert not reply["failed"], reply
                outcome = protocol.step(extract_action(reply["final"]))
                if isinstance(outcome, Finished):
                    break
                message = PROMPTS.outcome_message(outcome, protocol.wrong, protocol.demos_used)
            if store:  # the verdict, with the store invitation, in the same conversation
                ending = PROMPTS.outcome_message(outcome, protocol.wrong, protocol.demos_used)
                proc.stdin.write(json.dumps({"message": ending + "\n" + PROMPTS.render(
                    "store_invitation")}) + "\n")
                proc.stdin.flush()
                assert not json.loads(proc.stdout.readline())["failed"]
            return protocol
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)


@pytest.fixture
def root(tmp_path) -> Path:
    (tmp_path / "harness_adapters").mkdir()
    shutil.copy(REGISTRY, tmp_path / "harness_adapters" / "learners.yaml")
    return tmp_path


@pytest.mark.slow
def test_a_scaffolded_harness_with_its_own_tool_names_gets_the_note_kept_and_used(root, served):
    harness = Scaffolded(root, served, root / "state")
    first = harness.play(instance(0), store=True)
    assert first.status.value == "solved" and first.demos_used == 1
    notes = (root / "state" / "notes.md").read_text()
    assert "carc-note task own-flip" in notes  # saved through keep_note, chosen by its schema
    back = harness.play(instance(1), store=True)
    assert back.status.value == "solved" and back.demos_used == 0 and back.cost == 0


@pytest.mark.slow
def test_the_same_scaffolded_harness_without_its_notes_pays_again(root, served):
    """The control: the notes wiped before the return (memory off), the return buys its pair."""
    harness = Scaffolded(root, served, root / "state")
    harness.play(instance(0), store=True)
    (root / "state" / "notes.md").unlink()
    back = harness.play(instance(1), store=True)
    assert back.demos_used == 1 and back.cost == 1
