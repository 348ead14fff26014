"""The embedded model as a diligent tool-using agent, for requests that offer tools.

It does what the conversation tells it to, with the tools the request offers, chosen by their
names and schemas only (never by which harness is asking; `classify_tools`):
- a message after the instance's start that asks it to save (a harness's own review or
  refinement prompt, carc's store invitation, the program-procedure save request) gets what it
  holds for the task saved: the task id, the pairs seen (the verified test pair included when
  solved) and its best program that reproduces them. A note goes through the memory tool (shorter
  on an error result, then into a file); a program file goes where the message names it, through
  the file-write tool, else the shell, else python. Then it replies as the message says (the JSON
  finish action when asked for it);
- under the program-procedure rules ("<dir>/<task id>.py" in the instance's opening message) it
  first runs that file on the test input with the shell or python tool, and submits its output;
  when the file is absent or fails, it proceeds as usual;
- material about the current task id in its context (a note in the system prompt or a memory
  block, a tool result, a program file's printout) is used: its pairs are held as pairs, its
  program is the first candidate. A stored program that reproduces every pair held (vacuously
  when none is) is submitted before any pair is bought: the note says it was verified;
- a curation request ("Curate task <id>" and a path ending in "/<id>.py" in the latest user
  message, carc's `curator_task`) gets the one program that reproduces every pair pooled from the
  digest's pair lines and the notes about the task in context (the program most notes keep
  first, then a bounded search's) written to that path as a program file, with the same tools in
  the same order as a save; then, or when no program reproduces them all, it replies "done";
- it never lists or reads anything it was not told about.

It keeps no memory of its own: each reply is recovered from the whole conversation (its own
earlier tool calls, recognised by their arguments, and the results that came back). Without
tools in the request the server never calls this module: the reply is exactly `policy.reply`'s.

Note format (`note_text`, read back by `read_notes`): one block of three lines,
    carc-note task <task id>
    steps: <the program as a tuple of (primitive, params) tuples: ast.literal_eval reads it>
    pairs: <JSON list of [input, output] grids>
A program file (`program_file`) is the program's standalone source with that block as
`CARC_NOTE`; the runner prints the block and `carc-output task <id>: <grid JSON>`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.arc import Demo, Grid, GridError, as_grid, grid_json, grid_list
from orchestrator.protocol import Action, extract_action
from solver_model.conversation import (ConversationState, Feedback, Mode, conversation_digest,
                                       grid_after, message_text, read_conversation)
from solver_model.policy import (FINISH, Reply, SearchFn, default_search, output_of,
                                 program_text, reply, reply_generator, submit_text)
from solver_model.search import Program, Step, consistent

NOTE_HEADER = "carc-note task"
OUTPUT_MARKER = "carc-output task"
# A note's first try: room for about a third of hermes-like 2,200-character memories. On an error
# result it is retried at half, then with the program alone, before a file is written instead.
NOTE_CHARS = (700, 350, 0)
SAVED = "Saved."
CURATED = "done"

# --- tools, by role ----------------------------------------------------------------------------

MEMORY, WRITE, READ, SHELL, PYTHON = "memory", "write", "read", "shell", "python"
_CONTENT = ("content", "text", "note", "entry", "memory", "value", "fact", "body")
_PATH = ("path", "file_path", "filepath", "filename", "file")
_COMMAND = ("command", "cmd", "shell_command", "script")
_CODE = ("code", "source", "python")
_ADD_VERBS = ("add", "create", "append", "save", "write", "set")


@dataclass(frozen=True)
class Tool:
    """One offered tool with the argument names a role needs (by schema)."""

    name: str
    role: str
    properties: frozenset[str]
    arg: str  # the main argument: content, command or code (path for read)
    path: str | None = None  # write/read: the path argument
    action: str | None = None  # memory: the action argument and its add / replace values
    add: str | None = None
    replace_value: str | None = None
    old_text: str | None = None
    target: tuple[str, str] | None = None  # memory: (argument, value) naming the agent's own store
    extras: dict[str, Any] = field(default_factory=dict)  # required string arguments we fill


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """Chat Completions nests the function; the Responses API does not."""
    inner = tool.get("function")
    return inner if isinstance(inner, Mapping) else tool


def _first(names: Sequence[str], props: Mapping[str, Any]) -> str | None:
    return next((n for n in names if isinstance(props.get(n), Mapping)
                 and props[n].get("type", "string") in ("string", ["string", "null"])), None)


def _classify(tool: Mapping[str, Any]) -> list[tuple[int, Tool]]:
    """(score, Tool) for every role this tool can play."""
    fn = _function(tool)
    name = str(fn.get("name", ""))
    params = fn.get("parameters") if isinstance(fn.get("parameters"), Mapping) else {}
    props = params.get("properties") if isinstance(params.get("properties"), Mapping) else {}
    required = [r for r in params.get("required", []) if isinstance(r, str)]
    lowered = name.lower()
    keys = frozenset(props)
    found: list[tuple[int, Tool]] = []
    content, path = _first(_CONTENT, props), _first(_PATH, props)
    command, code = _first(_COMMAND, props), _first(_CODE, props)
    # string arguments the schema requires beyond the one we use (e.g. a title): filled in
    extras = {r: "carc" for r in required if r not in {content, path, command, code, "action",
                                                      "target", "old_text"}
              and isinstance(props.get(r), Mapping) and props[r].get("type") == "string"}
    if content and not path and re.search(r"memor|note|remember", lowered):
        action = "action" if isinstance(props.get("action"), Mapping) else None
        enum = [str(v) for v in (props["action"].get("enum") or [])] if action else []
        add = next((v for v in enum if v in _ADD_VERBS), None) if enum else None
        if not (action and enum and add is None):
            target = None
            if isinstance(props.get("target"), Mapping):
                values = [str(v) for v in props["target"].get("enum") or []]
                target = ("target", "memory" if "memory" in values else (values or ["memory"])[0])
            old = "old_text" if "old_text" in props else None
            found.append((3 if "memor" in lowered else 2, Tool(
                name, MEMORY, keys, content, action=action, add=add,
                replace_value="replace" if "replace" in enum else None, old_text=old,
                target=target, extras=extras)))
    if path and content and not re.search(r"edit|patch|memor|skill", lowered) \
            and re.search(r"write|save|create|put|file", lowered):
        found.append((2 if "write" in lowered else 1, Tool(name, WRITE, keys, content, path=path,
                                                           extras=extras)))
    if path and not content and re.search(r"read|view|cat|open", lowered) and "skill" not in lowered:
        found.append((2 if "read" in lowered else 1, Tool(name, READ, keys, path, path=path,
                                                          extras=extras)))
    if command and re.search(r"terminal|exec|shell|bash|run|command|sh\b", lowered):
        found.append((2, Tool(name, SHELL, keys, command, extras=extras)))
    if code and not command and re.search(r"code|python|exec|run", lowered):
        found.append((2, Tool(name, PYTHON, keys, code, extras=extras)))
    return found


def classify_tools(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Tool]:
    """role -> the offered tool that plays it best (first offered wins a tie)."""
    best: dict[str, tuple[int, Tool]] = {}
    for tool in tools or ():
        if not isinstance(tool, Mapping):
            continue
        for score, role_tool in _classify(tool):
            if role_tool.role not in best or score > best[role_tool.role][0]:
                best[role_tool.role] = (score, role_tool)
    return {role: tool for role, (_, tool) in best.items()}


# --- notes -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Note:
    """What a note or program file says about one task."""

    task_id: str
    program: Program | None
    pairs: tuple[Demo, ...]


def steps_literal(program: Program) -> str:
    return repr(tuple((step.name, step.params) for step in program.steps))


def note_text(task_id: str, program: Program | None, pairs: Sequence[Demo], limit: int = 0) -> str:
    """The note block; with `limit`, as many pairs as fit in that many characters (0: none)."""
    head = f"{NOTE_HEADER} {task_id}\nsteps: {steps_literal(program) if program else 'none'}\npairs: "
    kept: list[list] = []
    for pair in pairs:
        trial = kept + [[grid_list(pair.input), grid_list(pair.output)]]
        if len(head) + len(json.dumps(trial, separators=(",", ":"))) > limit:
            break
        kept = trial
    return head + json.dumps(kept, separators=(",", ":"))


_NOTE = re.compile(re.escape(NOTE_HEADER) + r"[ \t]+(\S+)")
_STEPS = re.compile(r"steps:[ \t]*")
_PAIRS = re.compile(r"pairs:[ \t]*")
_DECODER = json.JSONDecoder()


def _program_from(literal: str) -> Program | None:
    try:
        value = ast.literal_eval(literal)
        return Program(tuple(Step(str(name), tuple(params)) for name, params in value))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def read_notes(text: str, task_id: str) -> list[Note]:
    """Every note about `task_id` in the text, in order; parts that do not parse are dropped."""
    notes = []
    matches = [m for m in _NOTE.finditer(text)]
    for index, match in enumerate(matches):
        if match.group(1).rstrip(".,;:") != task_id:
            continue
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        block = text[match.end():end]
        program = None
        steps = _STEPS.search(block)
        if steps:
            line = block[steps.end():].split("\n", 1)[0].strip()
            program = _program_from(line) if line != "none" else None
        pairs: list[Demo] = []
        found = _PAIRS.search(block)
        if found:
            try:
                value, _ = _DECODER.raw_decode(block, found.end())
                for pair in value:
                    pairs.append(Demo(as_grid(pair[0]), as_grid(pair[1])))
            except (json.JSONDecodeError, GridError, TypeError, IndexError, KeyError):
                pass
        notes.append(Note(task_id, program, tuple(pairs)))
    return notes


def program_file(task_id: str, program: Program | None, pairs: Sequence[Demo]) -> str:
    """A program file: the note as CARC_NOTE, and transform(grid) (None when no program fits)."""
    note = note_text(task_id, program, pairs, limit=10**9)
    body = program.source() if program else (
        "# No program reproducing every pair was found yet; the pairs are kept in CARC_NOTE.\n\n"
        "def transform(grid):\n    return None\n")
    return f"CARC_NOTE = {note!r}\n\n{body}"


def runner_code(path: str, task_id: str, test_input: Grid) -> str:
    """Python that runs a program file on the test input and prints its note and output."""
    return (f"import json,runpy;m=runpy.run_path({json.dumps(path)});"
            f"print(m.get(\"CARC_NOTE\",\"\"));"
            f"print({json.dumps(OUTPUT_MARKER + ' ' + task_id + ':')},"
            f"json.dumps(m[\"transform\"]({grid_json(test_input)})))")


# --- reading the conversation as an agent -------------------------------------------------------

@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments)}}


@dataclass(frozen=True)
class AgentReply:
    """Either tool calls (text None) or a final text; the program it rests on, if any."""

    text: str | None
    calls: tuple[ToolCall, ...] = ()
    program_description: str | None = None
    program: Program | None = None
    purpose: str = "answer"  # answer | run | save | curate


@dataclass(frozen=True)
class _Past:
    """One of this model's earlier tool calls and what came back."""

    index: int  # position of the assistant message
    purpose: str  # run | save | curate | other
    arguments: str
    result: str | None
    ok: bool


def _text_leaves(text: str) -> str:
    """A tool result's text, with the string values of a JSON result appended (unescaped)."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, ValueError, RecursionError):
        return text
    leaves: list[str] = []

    def walk(item: Any) -> None:
        if isinstance(item, str):
            leaves.append(item)
        elif isinstance(item, Mapping):
            for v in item.values():
                walk(v)
        elif isinstance(item, list):
            for v in item:
                walk(v)
    walk(value)
    return "\n".join([text] + leaves)


def _failed(result: str | None) -> bool:
    """Whether a tool result reports an error (by its JSON fields or its first words)."""
    if result is None:
        return True
    try:
        value = json.loads(result)
    except (json.JSONDecodeError, ValueError, RecursionError):
        value = None
    if isinstance(value, Mapping):
        if value.get("success") is False or value.get("ok") is False or value.get("error"):
            return True
        for key in ("exit_code", "exitCode", "returncode", "status_code"):
            if isinstance(value.get(key), int) and value[key] != 0:
                return True
        if str(value.get("status", "")).lower() in ("error", "failed"):
            return True
        return False
    return bool(re.match(r"\s*(error|failed|traceback)\b", result, re.IGNORECASE)
                or re.search(r"Traceback \(most recent call last\)|No such file|command not found",
                             result))


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(m) for m in messages if isinstance(m, Mapping)]


def _instance_start(msgs: list[dict[str, Any]]) -> int | None:
    for index in range(len(msgs) - 1, -1, -1):
        if msgs[index].get("role") == "user" and "Task id:" in message_text(msgs[index].get("content")):
            return index
    return None


def _past_calls(msgs: list[dict[str, Any]], start: int, curated: str | None = None) -> list[_Past]:
    """Its tool calls from `start` on; a program file written to the path `curated` is "curate"."""
    results: dict[str, str] = {}
    for message in msgs[start:]:
        if message.get("role") in ("tool", "function") and message.get("tool_call_id"):
            results[str(message["tool_call_id"])] = message_text(message.get("content"))
    past = []
    for index in range(start, len(msgs)):
        message = msgs[index]
        if message.get("role") != "assistant":
            continue
        following = [message_text(m.get("content")) for m in msgs[index + 1:index + 1 + 8]
                     if m.get("role") in ("tool", "function")]
        for position, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function") or {}
            arguments = str(fn.get("arguments", ""))
            result = results.get(str(call.get("id")))
            if result is None and position < len(following):
                result = following[position]
            if OUTPUT_MARKER in arguments:
                purpose = "run"
            elif NOTE_HEADER in arguments:
                purpose = "curate" if curated and curated in _text_leaves(arguments) else "save"
            else:
                purpose = "other"
            ok = not _failed(result)
            if purpose == "run":
                ok = result is not None and OUTPUT_MARKER in (result or "")
            past.append(_Past(index, purpose, arguments, result, ok))
    return past


def _last_user_block(msgs: list[dict[str, Any]]) -> tuple[int, str] | None:
    """(index of the first message, text) of the latest run of user messages."""
    last = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i].get("role") == "user"), None)
    if last is None:
        return None
    first = last
    while first > 0 and msgs[first - 1].get("role") == "user":
        first -= 1
    return first, "\n".join(message_text(m.get("content")) for m in msgs[first:last + 1])


_SAVE_ASK = re.compile(r"\b(save|saving|store)\b", re.IGNORECASE)
_FINISH_ASK = re.compile(r'"action"\s*:\s*"finish"')
_PROGRAMS_RULE = re.compile(r"(\S+)/<task id>\.py")


def _context_text(msgs: list[dict[str, Any]]) -> str:
    """What material can arrive in: system, user and tool messages (not its own calls)."""
    parts = []
    for message in msgs:
        role = message.get("role")
        if role in ("system", "developer", "user"):
            parts.append(message_text(message.get("content")))
        elif role in ("tool", "function"):
            parts.append(_text_leaves(message_text(message.get("content"))))
    return "\n".join(parts)


def _material(msgs: list[dict[str, Any]], task_id: str) -> tuple[tuple[Demo, ...], list[Program]]:
    """Pairs and programs of every note about the task in context, most recent program first."""
    notes = read_notes(_context_text(msgs), task_id)
    pairs: dict[Demo, None] = {}
    programs: list[Program] = []
    for note in notes:
        for pair in note.pairs:
            pairs.setdefault(pair, None)
    for note in reversed(notes):
        if note.program is not None and note.program not in programs:
            programs.append(note.program)
    return tuple(pairs), programs


def _run_output(past: list[_Past], task_id: str) -> Grid | None:
    marker = re.compile(re.escape(f"{OUTPUT_MARKER} {task_id}:"))
    for call in reversed(past):
        if call.purpose == "run" and call.ok:
            text = _text_leaves(call.result or "")
            for match in marker.finditer(text):
                grid = grid_after(text, match.end())
                if grid is not None:
                    return grid
    return None


# --- acting -------------------------------------------------------------------------------------

def act(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
        effort: str, search: SearchFn | None = None, seed: int = 0,
        state: ConversationState | None = None) -> AgentReply:
    """The agent's next reply to a conversation that offers `tools`."""
    msgs = _messages(messages)
    state = state or read_conversation(msgs)
    roles = classify_tools(tools)
    curation = _curation(msgs)
    if curation is not None:
        return _curate(msgs, curation, roles, effort, search, seed, _CallIds(state.digest))
    if state.mode is Mode.OTHER or state.task_id is None:
        return _answer(reply(state, effort, search, seed))
    start = _instance_start(msgs)
    start = 0 if start is None else start
    past = _past_calls(msgs, start)
    material_pairs, programs = _material(msgs, state.task_id)
    held = tuple(dict.fromkeys(state.pairs + material_pairs))
    ids = _CallIds(state.digest)

    block = _last_user_block(msgs)
    if block is not None and block[0] > start and _SAVE_ASK.search(block[1]):
        return _save(msgs, tools, block, past, state, held, programs, roles, effort, search, seed,
                     ids)
    if state.over:
        return AgentReply(FINISH)

    rules = "\n".join(message_text(m.get("content")) for m in msgs[:start + 1]
                      if m.get("role") in ("system", "developer", "user"))
    rule = _PROGRAMS_RULE.search(rules)
    if rule and state.test_input is not None and not any(c.purpose == "run" for c in past):
        call = _run_call(roles, f"{rule.group(1)}/{state.task_id}.py", state.task_id,
                         state.test_input, ids)
        if call is not None:
            return AgentReply(None, (call,), purpose="run")

    wrong = state.wrong_grids
    submitted = {s.grid for s in state.submissions}
    output = _run_output(past, state.task_id)
    if output is not None and output not in wrong and output not in submitted \
            and state.mode is Mode.ACTION:
        return AgentReply(submit_text(output), program_description="program file run")
    for program in programs:
        if state.test_input is None or not consistent(program, held):
            continue
        output = output_of(program, state.test_input)
        if output is None or output in wrong:
            continue
        if state.mode is Mode.PROGRAM:
            if program.describe() in state.failed_programs:
                continue
            return AgentReply(program_text(program.source(), output),
                              program_description=program.describe(), program=program)
        return AgentReply(submit_text(output), program_description=program.describe(),
                          program=program)
    return _answer(reply(replace(state, pairs=held), effort, search, seed))


def _answer(result: Reply) -> AgentReply:
    return AgentReply(result.text, program_description=result.program_description,
                      program=result.program)


class _CallIds:
    """Deterministic tool-call ids: the conversation's digest and a counter."""

    def __init__(self, digest: str) -> None:
        self.digest, self.count = digest[:16], 0

    def __call__(self) -> str:
        self.count += 1
        return f"call_{self.digest}_{self.count}"


def _shell_write(path: str, content: str, append: bool = False) -> str:
    directory = path.rsplit("/", 1)[0] if "/" in path else "."
    return (f"mkdir -p {_quote(directory)} && cat {'>>' if append else '>'} {_quote(path)} "
            f"<<'CARC_EOF'\n{content}\nCARC_EOF")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _run_call(roles: dict[str, Tool], path: str, task_id: str, test_input: Grid,
              ids: _CallIds) -> ToolCall | None:
    code = runner_code(path, task_id, test_input)
    if SHELL in roles:
        tool = roles[SHELL]
        return ToolCall(ids(), tool.name, {**tool.extras, tool.arg: f"python3 -c {_quote(code)}"})
    if PYTHON in roles:
        tool = roles[PYTHON]
        return ToolCall(ids(), tool.name, {**tool.extras, tool.arg: code})
    return None


def _verified(state: ConversationState) -> Demo | None:
    for submission in state.submissions:
        if submission.verdict is Feedback.CORRECT and state.test_input is not None:
            return Demo(state.test_input, submission.grid)
    return None


def _best_program(msgs: list[dict[str, Any]], tools: Any, state: ConversationState,
                  pairs: tuple[Demo, ...], programs: list[Program], effort: str,
                  search: SearchFn | None, seed: int) -> Program | None:
    """The program to keep: the one its correct submission rested on (its own reply replayed
    from the conversation up to it), else a stored one, else a bounded search's; each must
    reproduce every pair kept."""
    candidates: list[Program] = []
    verified = _verified(state)
    if verified is not None:
        start = _instance_start(msgs) or 0
        for index in range(start + 1, len(msgs)):
            message = msgs[index]
            if message.get("role") != "assistant" or message.get("tool_calls"):
                continue
            action = extract_action(message_text(message.get("content")))
            if isinstance(action, Action) and action.kind == "submit" and action.grid == verified.output:
                earlier = act(msgs[:index], tools, effort, search, seed)
                if earlier.program is not None:
                    candidates.append(earlier.program)
                break
    candidates += programs
    if pairs:
        exploration = (search or default_search)(pairs, effort, None, exclude=(),
                                           rng=reply_generator(seed, state.digest))
        candidates += list(exploration.found)
    return next((p for p in candidates if pairs and consistent(p, pairs)), None) or \
        next((p for p in programs if not pairs), None)


def _save(msgs, tools, block, past, state, held, programs, roles, effort, search, seed,
          ids) -> AgentReply:
    first, ask = block
    attempts = [c for c in past if c.index > first and c.purpose == "save"]
    final = FINISH if _FINISH_ASK.search(ask) else SAVED
    if any(c.ok for c in attempts):
        return AgentReply(final, purpose="save")
    verified = _verified(state)
    pairs = tuple(dict.fromkeys(((verified,) if verified else ()) + held))
    program = _best_program(msgs, tools, state, pairs, programs, effort, search, seed)
    plan = _save_plan(msgs, ask, state, program, pairs, roles, ids)
    if len(attempts) >= len(plan):
        return AgentReply(final, purpose="save")
    return AgentReply(None, (plan[len(attempts)],),
                      program_description=program.describe() if program else None,
                      program=program, purpose="save")


_MEMORY_FILE = re.compile(r"\b(MEMORY\.md|memory\.md|NOTES\.md|notes\.md)\b")


def _save_plan(msgs, ask: str, state: ConversationState, program: Program | None,
               pairs: tuple[Demo, ...], roles: dict[str, Tool], ids: _CallIds) -> list[ToolCall]:
    """The tool calls to try in order until one succeeds."""
    task = state.task_id
    target = re.search(r"(\S+/" + re.escape(task) + r"\.py)\b", ask)
    plan: list[ToolCall] = []
    if target:  # a program file, where the message says
        return _file_plan(target.group(1).strip("`'\""), program_file(task, program, pairs), roles, ids)
    context = _context_text(msgs)
    existing = bool(read_notes(context, task))
    if MEMORY in roles:
        tool = roles[MEMORY]
        for limit in NOTE_CHARS:
            args: dict[str, Any] = {**tool.extras, tool.arg: note_text(task, program, pairs, limit)}
            if tool.target:
                args[tool.target[0]] = tool.target[1]
            if tool.action:
                if existing and tool.replace_value and tool.old_text:
                    args[tool.action] = tool.replace_value
                    args[tool.old_text] = f"{NOTE_HEADER} {task}\n"
                else:
                    args[tool.action] = tool.add
            plan.append(ToolCall(ids(), tool.name, args))
    note = note_text(task, program, pairs, NOTE_CHARS[0])
    system = "\n".join(message_text(m.get("content")) for m in msgs if m.get("role") in ("system", "developer"))
    named = _MEMORY_FILE.search(system)
    if SHELL in roles and named:
        tool = roles[SHELL]
        plan.append(ToolCall(ids(), tool.name, {**tool.extras,
                                                tool.arg: _shell_write(named.group(1), note, append=True)}))
    if WRITE in roles:
        tool = roles[WRITE]
        plan.append(ToolCall(ids(), tool.name, {**tool.extras, tool.path: f"carc-notes/{task}.md",
                                                tool.arg: note}))
    elif SHELL in roles and not named:
        tool = roles[SHELL]
        plan.append(ToolCall(ids(), tool.name, {**tool.extras,
                                                tool.arg: _shell_write(f"carc-notes/{task}.md", note)}))
    return plan


def _file_plan(path: str, source: str, roles: dict[str, Tool], ids: _CallIds) -> list[ToolCall]:
    """Writing a file, to try in order: the file-write tool, else the shell, else python."""
    plan: list[ToolCall] = []
    if WRITE in roles:
        tool = roles[WRITE]
        plan.append(ToolCall(ids(), tool.name, {**tool.extras, tool.path: path, tool.arg: source}))
    if SHELL in roles:
        tool = roles[SHELL]
        plan.append(ToolCall(ids(), tool.name, {**tool.extras, tool.arg: _shell_write(path, source)}))
    if PYTHON in roles:
        tool = roles[PYTHON]
        code = (f"import os;os.makedirs({json.dumps(path.rsplit('/', 1)[0] or '.')},exist_ok=True);"
                f"open({json.dumps(path)},'w').write({source!r})")
        plan.append(ToolCall(ids(), tool.name, {**tool.extras, tool.arg: code}))
    return plan


# --- curating the shared library ----------------------------------------------------------------

_CURATE_ASK = re.compile(r"\bCurate task (\S+?)[:.,;]?(?=\s|$)")
_DIGEST_PAIRS = "Demonstration pairs"


@dataclass(frozen=True)
class _Curation:
    """A curation request: where its user messages start, their text, the task and the path."""

    first: int
    text: str
    task_id: str
    path: str


def _curation(msgs: list[dict[str, Any]]) -> _Curation | None:
    block = _last_user_block(msgs)
    asked = _CURATE_ASK.search(block[1]) if block else None
    if block is None or asked is None:
        return None
    target = re.search(r"(\S+/" + re.escape(asked.group(1)) + r"\.py)\b", block[1])
    if target is None:
        return None
    return _Curation(block[0], block[1], asked.group(1), target.group(1).strip("`'\""))


def _digest_pairs(text: str) -> list[Demo]:
    """The digest's pairs: one JSON [input, output] a line under its header, to a blank line."""
    header = text.find(_DIGEST_PAIRS)
    pairs: list[Demo] = []
    for line in text[header:].splitlines()[1:] if header >= 0 else ():
        if not line.strip():
            break
        try:
            grid_in, grid_out = json.loads(line)
            pairs.append(Demo(as_grid(grid_in), as_grid(grid_out)))
        except (ValueError, TypeError, RecursionError):  # GridError and JSON errors included
            continue
    return pairs


def _curate(msgs: list[dict[str, Any]], request: _Curation, roles: dict[str, Tool], effort: str,
            search: SearchFn | None, seed: int, ids: _CallIds) -> AgentReply:
    attempts = [c for c in _past_calls(msgs, request.first, request.path) if c.purpose == "curate"]
    if any(c.ok for c in attempts):
        return AgentReply(CURATED, purpose="curate")
    notes = read_notes(_context_text(msgs), request.task_id)
    pairs = tuple(dict.fromkeys(_digest_pairs(request.text) + [p for n in notes for p in n.pairs]))
    kept = [n.program for n in notes if n.program is not None]
    candidates = sorted(dict.fromkeys(kept), key=kept.count, reverse=True)  # stable: ties keep order
    program = next((p for p in candidates if consistent(p, pairs)), None) if pairs else None
    if program is None and pairs:
        # seeded by the conversation up to the request, so a retry writes the same program
        rng = reply_generator(seed, conversation_digest(msgs[:request.first + 1]))
        found = (search or default_search)(pairs, effort, None, exclude=(), rng=rng).found
        program = next((p for p in found if consistent(p, pairs)), None)
    plan = _file_plan(request.path, program_file(request.task_id, program, pairs), roles, ids) \
        if program is not None else []
    if len(attempts) >= len(plan):
        return AgentReply(CURATED, purpose="curate")
    return AgentReply(None, (plan[len(attempts)],), program_description=program.describe(),
                      program=program, purpose="curate")
