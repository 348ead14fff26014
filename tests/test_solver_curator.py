"""The embedded model as a curator of the shared program library (solver_model/agent.py, `act`).

A curator conversation is carc's `curator_task` message rendered with a round digest (demonstration
pair lines, kept passages). The tool schemas are hermes-like and openclaw-like; the written program
files are executed for real (the write tool's content exec'd, the shell's command run by bash).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from orchestrator.arc import Demo, as_grid, grid_json, grid_list
from orchestrator.prompts import PromptSet
from solver_model.agent import act, note_text, program_file, read_notes
from solver_model.search import Exploration, Program, Step

PROMPTS = PromptSet.load()
FLIP_H, FLIP_V = Program((Step("flip_h"),)), Program((Step("flip_v"),))
ROT180, TRANSPOSE = Program((Step("rot180"),)), Program((Step("transpose"),))
LIBRARY = (FLIP_V, FLIP_H, ROT180, TRANSPOSE)
TASK = "own-0007"


def library_search(pairs, effort, test_input=None, exclude=(), rng=None) -> Exploration:
    """Every program of LIBRARY that reproduces the pairs, in LIBRARY's order."""
    found = [p for p in LIBRARY if all(p(d.input) == d.output for d in pairs)]
    return Exploration(tuple(found), None, 0.0, len(LIBRARY))


def nothing_found(pairs, effort, test_input=None, exclude=(), rng=None) -> Exploration:
    return Exploration((), None, 0.0, 0)


def demo(rows, program: Program = FLIP_H) -> Demo:
    grid = as_grid(rows)
    return Demo(grid, program(grid))


PAIRS = (demo([[1, 2, 3], [4, 5, 6]]), demo([[7, 0, 1], [2, 2, 3]]))
SYMMETRIC = demo([[1, 2], [1, 2]])  # flip_h and rot180 agree on it; flip_v does not


def fn(name: str, properties: dict[str, Any], required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": "",
            "parameters": {"type": "object", "properties": properties, "required": required}}}


S = {"type": "string"}
HERMES_TOOLS = [
    fn("memory", {"action": {"type": "string", "enum": ["add", "replace", "remove"]},
                  "target": {"type": "string", "enum": ["memory", "user"]}, "content": S,
                  "old_text": S}, ["target"]),
    fn("write_file", {"path": S, "content": S}, ["path", "content"]),
    fn("read_file", {"path": S}, ["path"]),
    fn("terminal", {"command": S}, ["command"]),
    fn("execute_code", {"code": S}, ["code"]),
]
OPENCLAW_TOOLS = [fn("read", {"path": S}, ["path"]),
                  fn("write", {"path": S, "content": S}, ["path", "content"]),
                  fn("exec", {"title": S, "command": S}, ["command"])]
MEMORY_ONLY = [HERMES_TOOLS[0]]


def digest(task: str, pairs: tuple[Demo, ...], passages: list[tuple[str, str]] = ()) -> str:
    """A round digest as the collective runner renders it."""
    return "\n".join([
        f"Task {task}: met 4 times by 2 users in round 1; solved 3 of 4; 5 demonstrations bought.",
        "", "Demonstration pairs the users bought (one JSON [input, output] per line):",
        *[f"[{grid_json(p.input)}, {grid_json(p.output)}]" for p in pairs],
        "", f"What the users kept that mentions task {task} ({len(passages)} passages):",
        *[f"--- user {i}, {name}\n{text}" for i, (name, text) in enumerate(passages)]])


def curator(shared: Path | str, pairs: tuple[Demo, ...], passages: list[tuple[str, str]] = (),
            task: str = TASK) -> list[dict]:
    message = PROMPTS.render("curator_task", round=1, task_id=task, shared_dir=shared,
                             digest=digest(task, pairs, passages))
    return [{"role": "system", "content": "You are a helpful agent with tools."},
            {"role": "user", "content": message}]


def note(program: Program | None, pairs: tuple[Demo, ...] = (), task: str = TASK) -> str:
    return note_text(task, program, pairs, limit=10_000)


def run_file(source: str) -> dict[str, Any]:
    """The written program file's names (transform, CARC_NOTE), by executing it."""
    scope: dict[str, Any] = {}
    exec(compile(source, "<program file>", "exec"), scope)
    return scope


def reproduces(source: str, pairs) -> bool:
    transform = run_file(source)["transform"]
    return all(transform(grid_list(p.input)) == grid_list(p.output) for p in pairs)


def called(messages: list[dict], reply, result: str) -> list[dict]:
    """The conversation after the harness ran the reply's one tool call and returned `result`."""
    [call] = reply.calls
    return messages + [{"role": "assistant", "content": None, "tool_calls": [call.to_openai()]},
                       {"role": "tool", "tool_call_id": call.id, "content": result}]


# --- (a) the digest's pairs alone -----------------------------------------------------------------

def test_the_digest_pairs_alone_get_a_program_file_that_reproduces_every_pair_written():
    messages = curator("/shared/programs", PAIRS)
    for effort, search in (("low", library_search), ("medium", None)):  # a stub, the real search
        reply = act(messages, HERMES_TOOLS, effort, search)
        [call] = reply.calls
        assert reply.text is None and reply.purpose == "curate"
        assert call.name == "write_file" and call.arguments["path"] == f"/shared/programs/{TASK}.py"
        assert reproduces(call.arguments["content"], PAIRS)
        [kept] = read_notes(run_file(call.arguments["content"])["CARC_NOTE"], TASK)  # the pooled pairs
        assert kept.pairs == PAIRS and kept.program == reply.program
    assert act(messages, HERMES_TOOLS, "low", library_search).calls[0].arguments["content"] == \
        program_file(TASK, FLIP_H, PAIRS)  # the search's first fit, deterministically


def test_the_same_curator_conversation_always_gets_the_same_reply():
    messages = curator("/shared/programs", PAIRS)
    first, again = (act(messages, OPENCLAW_TOOLS, "medium", seed=3) for _ in range(2))
    assert first == again and first.calls[0].name == "write"


def test_pair_lines_that_do_not_parse_are_ignored_and_kept_passages_are_not_pair_lines():
    text = digest(TASK, PAIRS).replace("\n\nWhat", "\n[[1, 2], 3]\nnot json\n\nWhat") + \
        f"\n[{grid_json(as_grid([[1, 2]]))}, {grid_json(as_grid([[9, 9]]))}]"
    messages = [{"role": "user", "content": PROMPTS.render(
        "curator_task", round=1, task_id=TASK, shared_dir="/shared/programs", digest=text)}]
    [call] = act(messages, HERMES_TOOLS, "low", library_search).calls
    assert read_notes(run_file(call.arguments["content"])["CARC_NOTE"], TASK)[0].pairs == PAIRS


# --- (b), (c) notes in context --------------------------------------------------------------------

def test_a_note_program_that_reproduces_every_pooled_pair_is_preferred_to_the_search():
    pairs = (SYMMETRIC,)
    messages = curator("/shared/programs", pairs, [("hermes/memories/MEMORY.md", note(ROT180))])
    [call] = act(messages, HERMES_TOOLS, "low", library_search).calls
    assert call.arguments["content"] == program_file(TASK, ROT180, pairs)
    assert reproduces(call.arguments["content"], pairs)


def test_the_program_most_notes_keep_comes_first_and_a_note_pair_joins_the_pool():
    extra = demo([[5, 6], [5, 6]])
    passages = [("a/MEMORY.md", note(FLIP_H)), ("b/MEMORY.md", note(ROT180, (extra,))),
                ("c/notes.md", note(ROT180))]
    messages = curator("/shared/programs", (SYMMETRIC,), passages)
    [call] = act(messages, HERMES_TOOLS, "low", library_search).calls
    assert call.arguments["content"] == program_file(TASK, ROT180, (SYMMETRIC, extra))
    tie = curator("/shared/programs", (SYMMETRIC,), passages[:2])  # one note each: the first wins
    assert act(tie, HERMES_TOOLS, "low", library_search).program == FLIP_H


def test_a_note_program_that_contradicts_a_pooled_pair_is_not_written():
    messages = curator("/shared/programs", PAIRS, [("a/MEMORY.md", note(FLIP_V))])
    [call] = act(messages, HERMES_TOOLS, "low", library_search).calls
    assert call.arguments["content"] == program_file(TASK, FLIP_H, PAIRS)
    # the note's own pair contradicts the digest's: nothing reproduces them all
    flipped = demo([[1, 2, 3], [4, 5, 6]], FLIP_V)
    clash = curator("/shared/programs", PAIRS, [("a/MEMORY.md", note(FLIP_V, (flipped,)))])
    reply = act(clash, HERMES_TOOLS, "low", library_search)
    assert reply.text == "done" and reply.calls == ()
    alone = act(messages, HERMES_TOOLS, "low", nothing_found)
    assert alone.text == "done" and alone.calls == ()


def test_notes_about_other_tasks_are_not_material():
    messages = curator("/shared/programs", (SYMMETRIC,),
                       [("a/MEMORY.md", note(ROT180, task="own-0008"))])
    assert act(messages, HERMES_TOOLS, "low", library_search).program == FLIP_H


# --- (d) after the tool result --------------------------------------------------------------------

def test_after_a_successful_write_it_replies_done(tmp_path):
    messages = curator(tmp_path, PAIRS)
    reply = act(messages, HERMES_TOOLS, "low", library_search)
    after = called(messages, reply, json.dumps({"bytes_written": 1234}))
    done = act(after, HERMES_TOOLS, "low", library_search)
    assert done.text == "done" and done.calls == ()


def test_after_a_failed_write_it_falls_back_to_the_shell_then_python_then_done(tmp_path):
    shared = tmp_path / "library"
    messages = curator(shared, PAIRS)
    first = act(messages, HERMES_TOOLS, "low", library_search)
    assert first.calls[0].name == "write_file"
    messages = called(messages, first, json.dumps({"success": False, "error": "read-only"}))
    shell = act(messages, HERMES_TOOLS, "low", library_search)
    [call] = shell.calls
    assert call.name == "terminal" and call.id != first.calls[0].id
    subprocess.run(["bash", "-c", call.arguments["command"]], check=True, timeout=30)
    source = (shared / f"{TASK}.py").read_text()
    assert source.rstrip("\n") == program_file(TASK, FLIP_H, PAIRS).rstrip("\n")
    assert reproduces(source, PAIRS)
    messages = called(messages, shell, json.dumps({"output": "denied", "exit_code": 1}))
    python = act(messages, HERMES_TOOLS, "low", library_search)
    assert python.calls[0].name == "execute_code"
    (shared / f"{TASK}.py").unlink()
    subprocess.run(["python3", "-c", python.calls[0].arguments["code"]], check=True, timeout=30)
    assert (shared / f"{TASK}.py").read_text() == program_file(TASK, FLIP_H, PAIRS)
    messages = called(messages, python, "Traceback (most recent call last): PermissionError")
    last = act(messages, HERMES_TOOLS, "low", library_search)
    assert last.text == "done" and last.calls == ()


def test_the_next_task_of_the_same_session_is_curated_after_the_first_is_done(tmp_path):
    messages = curator(tmp_path, PAIRS)
    messages = called(messages, act(messages, HERMES_TOOLS, "low", library_search), "ok")
    messages += [{"role": "assistant", "content": "done"},
                 curator(tmp_path, (SYMMETRIC,), task="own-0008")[1]]
    [call] = act(messages, HERMES_TOOLS, "low", library_search).calls
    assert call.arguments["path"] == f"{tmp_path}/own-0008.py"
    assert reproduces(call.arguments["content"], (SYMMETRIC,))


# --- (e) nothing to write -------------------------------------------------------------------------

def test_without_a_consistent_program_or_a_tool_to_write_with_it_replies_done():
    clash = (PAIRS[0], Demo(PAIRS[0].input, FLIP_V(PAIRS[0].input)))
    for messages, tools in ((curator("/shared/programs", clash), HERMES_TOOLS),
                            (curator("/shared/programs", ()), HERMES_TOOLS),
                            (curator("/shared/programs", PAIRS), MEMORY_ONLY)):
        reply = act(messages, tools, "low", library_search)
        assert reply.text == "done" and reply.calls == ()


# --- (f) other conversations are not curation -----------------------------------------------------

def instance_save(request: str) -> list[dict]:
    test = as_grid([[3, 2, 5], [6, 4, 8]])
    return [{"role": "system", "content": "agent"},
            {"role": "user", "content": PROMPTS.instance_message(TASK, test, 0, 0, cached=list(PAIRS))},
            {"role": "assistant", "content": json.dumps({"action": "submit", "grid": FLIP_H(test)})},
            {"role": "user", "content": "Verdict: correct. The instance is over.\n" + request}]


def test_an_instance_save_request_is_still_a_save(tmp_path):
    invited = act(instance_save(PROMPTS.render("store_invitation")), HERMES_TOOLS, "low", library_search)
    assert invited.purpose == "save" and invited.calls[0].name == "memory"
    request = PROMPTS.render("program_save_request", task_id=TASK, programs_dir=tmp_path)
    saved = act(instance_save(request), HERMES_TOOLS, "low", library_search)
    [call] = saved.calls
    assert saved.purpose == "save" and call.arguments["path"] == f"{tmp_path}/{TASK}.py"


def test_mentioning_curation_without_the_task_file_path_is_not_a_curation_request():
    for text in (f"Please curate task {TASK} carefully and reply with done.",
                 f"Curate task {TASK}: write it to /shared/programs/own-0008.py."):
        reply = act([{"role": "user", "content": text}], HERMES_TOOLS, "low", library_search)
        assert reply.purpose != "curate" and reply.calls == ()
