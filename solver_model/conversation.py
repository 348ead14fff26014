"""Reading an OpenAI-style chat conversation into what the embedded solver model decides from.

The model sees only what any learner sees: the environment's messages (rendered from
`orchestrator/prompts/default.yaml`, whose markers are parsed here) and its own earlier replies.
It never sees a test output. Parsing is forgiving: text that does not parse is ignored.

Scope: the instance starts at the last user message carrying "Task id:"; anything before it
(an earlier instance a harness kept in its session) is not this instance. Verdicts and counts are
read from user messages only, so a harness reading an old note through a tool cannot end the
instance; demonstration pairs are read from user and tool messages.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from orchestrator.arc import Demo, Grid, GridError, as_grid
from orchestrator.protocol import Action, extract_action


class Mode(str, Enum):
    """What kind of reply the conversation asks for."""

    ACTION = "action"  # one JSON action per reply
    PROGRAM = "program"  # a ```python block defining transform(grid), or request_demos
    OTHER = "other"  # not an instance at all (a harness's memory review, a title request)


class Feedback(str, Enum):
    """What the environment said after one of this model's replies."""

    CORRECT = "correct"
    INCORRECT = "incorrect"
    DID_NOT_REPRODUCE = "did_not_reproduce"
    REFUSED = "refused"
    MALFORMED = "malformed"


@dataclass(frozen=True)
class Submission:
    """A grid this model submitted (directly, or as its program's predicted output)."""

    grid: Grid
    verdict: Feedback | None  # CORRECT, INCORRECT, or None while no verdict has arrived


@dataclass(frozen=True)
class ProgramAttempt:
    """A program this model proposed, by its "# program:" description."""

    description: str
    feedback: Feedback | None
    predicted_output: Grid | None = None


@dataclass(frozen=True)
class ConversationState:
    """Everything the policy needs about one instance, read from the conversation."""

    mode: Mode
    task_id: str | None = None
    test_input: Grid | None = None
    pairs: tuple[Demo, ...] = ()
    attempts_used: int = 0
    demos_used: int = 0
    submissions: tuple[Submission, ...] = ()
    programs: tuple[ProgramAttempt, ...] = ()
    demos_refused: bool = False  # the environment refused a request_demos: no more pairs to buy
    over: bool = False
    digest: str = "0" * 64  # sha256 of the whole conversation (roles, texts, tool calls)

    @property
    def wrong_grids(self) -> frozenset[Grid]:
        return frozenset(s.grid for s in self.submissions if s.verdict is Feedback.INCORRECT)

    @property
    def failed_programs(self) -> frozenset[str]:
        """Descriptions of programs that did not reproduce the pairs or were judged incorrect."""
        bad = (Feedback.DID_NOT_REPRODUCE, Feedback.INCORRECT)
        return frozenset(p.description for p in self.programs if p.feedback in bad)

    @property
    def proposed_programs(self) -> tuple[str, ...]:
        return tuple(p.description for p in self.programs)


# Markers of the environment's messages (see orchestrator/prompts/default.yaml).
_TASK_ID = re.compile(r"Task id:[ \t]*(\S+)")
_TEST_INPUT = re.compile(r"Test input:")
# a harness may prefix the user's text with an envelope such as "[Tue 2026-12-01 02:43 UTC] "
_ENVELOPE = r"(?:\[[^\]\n]{0,80}\][ \t]*)?"
_DEMO = re.compile(rf"^{_ENVELOPE}[ \t>*_-]*Demonstration[ \t]+(\d+)[ \t]+(input|output):", re.MULTILINE)
_COUNTS = re.compile(
    r"used\s+(\d+)\s+of\s+\d+\s+attempts\s+and\s+(\d+)\s+of\s+\d+\s+demonstrations", re.IGNORECASE)
_VERDICT = re.compile(r"Verdict:\s*(correct|incorrect)\b", re.IGNORECASE)
# "finish is refused until the instance is over" must not read as the end of the instance.
_OVER = re.compile(r"(?<!until )\bthe instance is over\b", re.IGNORECASE)
_DID_NOT_REPRODUCE = re.compile(r"did not reproduce", re.IGNORECASE)
_REFUSED = re.compile(rf"^\s*{_ENVELOPE}Refused\b", re.IGNORECASE | re.MULTILINE)
_MALFORMED = re.compile(r"Malformed action|No program was found", re.IGNORECASE)
_PROGRAM_LINE = re.compile(r"^[ \t]*#[ \t]*program:[ \t]*(.+?)[ \t]*$", re.MULTILINE)
_PYTHON_BLOCK = re.compile(r"```python[ \t]*\n", re.IGNORECASE)
_SUBMIT_EXAMPLE = re.compile(r'"action"\s*:\s*"submit"')
# The model's own note of what its program outputs for the test input (see policy.py).
PREDICTED_OUTPUT = "Predicted test output:"

_ROLES = {"developer": "system", "function": "tool"}
_DECODER = json.JSONDecoder()
_GRID_START = re.compile(r"\s*(?:```(?:json)?\s*)?(?=\[)")
# What one message's text says is read once per text, not once per request: a conversation is
# sent again whole on every turn, so most of its messages were read before. (Every cached result
# is immutable: grids and pairs are tuples, actions frozen.)
_TEXTS_CACHED = 4096


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or the text of its content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "\n".join(texts)
    return ""


def grid_after(text: str, position: int) -> Grid | None:
    """The JSON grid starting at `position` (after optional blanks or a ```json fence), if any."""
    start = _GRID_START.match(text, position)
    if start is None:
        return None
    try:
        value, _ = _DECODER.raw_decode(text, start.end())
        return as_grid(value)
    except (json.JSONDecodeError, GridError, RecursionError):
        return None


@dataclass(frozen=True)
class _Message:
    role: str
    text: str


def read_conversation(messages: Sequence[Mapping[str, Any]]) -> ConversationState:
    """Read an OpenAI `messages` list into a `ConversationState`. Never raises on odd content."""
    msgs = [_Message(_ROLES.get(str(m.get("role")), str(m.get("role"))),
                     message_text(m.get("content")))
            for m in messages if isinstance(m, Mapping)]
    digest = conversation_digest(messages)
    header = _instance_start(msgs)
    instance = msgs[header:] if header is not None else msgs
    head_text = msgs[header].text if header is not None else ""

    task_match = _TASK_ID.search(head_text) if header is not None else None
    task_id = task_match.group(1) if task_match else None
    test_input = _test_input(head_text, instance)
    pairs = _pairs(instance)
    if task_id is None and test_input is None and not pairs:
        return ConversationState(mode=Mode.OTHER, digest=digest)

    turns = _turns(instance)
    submissions: list[Submission] = []
    programs: list[ProgramAttempt] = []
    requests_granted = 0
    demos_refused = False
    for action, program, predicted, feedback in turns:
        if program is not None:
            programs.append(ProgramAttempt(program, feedback, predicted))
            # The environment submitted the program's output only if a verdict came back.
            if predicted is not None and feedback in (Feedback.CORRECT, Feedback.INCORRECT):
                submissions.append(Submission(predicted, feedback))
        elif isinstance(action, Action) and action.kind == "submit" and action.grid is not None:
            verdict = feedback if feedback in (Feedback.CORRECT, Feedback.INCORRECT) else None
            submissions.append(Submission(action.grid, verdict))
        if isinstance(action, Action) and action.kind == "request_demos":
            if feedback is Feedback.REFUSED:
                demos_refused = True
            elif feedback is None:
                requests_granted += 1

    user_texts = [m.text for m in instance if m.role == "user"]
    attempts_used, demos_used = 0, requests_granted
    for text in user_texts:
        for match in _COUNTS.finditer(text):
            attempts_used, demos_used = int(match.group(1)), int(match.group(2))
    over = any(_says_over(t) for t in user_texts)

    return ConversationState(
        mode=_mode(msgs, header),
        task_id=task_id,
        test_input=test_input,
        pairs=pairs,
        attempts_used=attempts_used,
        demos_used=demos_used,
        submissions=tuple(submissions),
        programs=tuple(programs),
        demos_refused=demos_refused,
        over=over,
        digest=digest,
    )


# The calendar a harness writes into its messages: hermes-agent's system prompt says "Conversation
# started: Tuesday, December 08, 2026", openclaw wraps each user message in "[Mon 2026-12-07 13:54
# UTC]". Left in the digest, the day (or the minute) would decide the model's draws: a run would
# not repeat on another day, and a test's outcome would change at midnight.
_CALENDAR = re.compile(
    r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?:day|sday|nesday|rsday|urday)?\b,?"
    r"|\b(?:January|February|March|April|May|June|July|August|September|October|November|December)"
    r"\s+\d{1,2},?\s+\d{4}"
    r"|\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:\s?(?:UTC|GMT|Z|[+-]\d{2}:?\d{2}))?"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\s?(?:UTC|GMT|AM|PM|am|pm)?\b")


def conversation_digest(messages: Sequence[Mapping[str, Any]]) -> str:
    """sha256 of the conversation's roles, texts and tool calls: what seeds a reply.

    A tool call counts by what it calls, not by its id: ids are drawn by whoever answered (a
    scripted endpoint draws them at random), so two runs of the same calls read as one. Dates and
    clock times a harness writes (`_CALENDAR`) do not count either: the same conversation on
    another day is the same conversation."""
    canonical = [[str(m.get("role")), _CALENDAR.sub("<date>", message_text(m.get("content"))),
                  _calls(m.get("tool_calls"))]
                 for m in messages if isinstance(m, Mapping)]
    data = json.dumps(canonical, sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(data.encode()).hexdigest()


def _calls(tool_calls: Any) -> Any:
    if not isinstance(tool_calls, list):
        return tool_calls or []
    return [{k: v for k, v in call.items() if k not in ("id", "call_id")} if isinstance(call, Mapping) else call
            for call in tool_calls]


def _instance_start(msgs: list[_Message]) -> int | None:
    for index in range(len(msgs) - 1, -1, -1):
        if msgs[index].role == "user" and _TASK_ID.search(msgs[index].text):
            return index
    return None


def _test_input(head_text: str, instance: list[_Message]) -> Grid | None:
    texts = [head_text] + [m.text for m in instance if m.role == "user"]
    for text in texts:
        for match in _TEST_INPUT.finditer(text):
            grid = grid_after(text, match.end())
            if grid is not None:
                return grid
    return None


def _pairs(instance: list[_Message]) -> tuple[Demo, ...]:
    """Demonstration pairs in order of first appearance, each once.

    Pairs are deduplicated by content, not only by number: cached pairs and bought pairs are
    numbered separately, so two different pairs may share a number.
    """
    found: dict[Demo, None] = {}
    for message in instance:
        if message.role not in ("user", "tool"):
            continue
        for demo in _message_pairs(message.text):
            found.setdefault(demo, None)
    return tuple(found)


@functools.lru_cache(maxsize=_TEXTS_CACHED)
def _message_pairs(text: str) -> tuple[Demo, ...]:
    """The demonstration pairs one message shows, in order (an input, then its output)."""
    pairs = []
    pending: dict[int, Grid] = {}
    for match in _DEMO.finditer(text):
        number, side = int(match.group(1)), match.group(2)
        grid = grid_after(text, match.end())
        if grid is None:
            continue
        if side == "input":
            pending[number] = grid
        elif number in pending:
            pairs.append(Demo(pending.pop(number), grid))
    return tuple(pairs)


def _verdict(text: str) -> Feedback | None:
    match = _VERDICT.search(text)
    if match is None:
        return None
    return Feedback.CORRECT if match.group(1).lower() == "correct" else Feedback.INCORRECT


@functools.lru_cache(maxsize=_TEXTS_CACHED)
def _says_over(text: str) -> bool:
    return bool(_OVER.search(text)) or _verdict(text) is Feedback.CORRECT


@functools.lru_cache(maxsize=_TEXTS_CACHED)
def _feedback(text: str) -> Feedback | None:
    verdict = _verdict(text)
    if verdict is not None:
        return verdict
    if _DID_NOT_REPRODUCE.search(text):
        return Feedback.DID_NOT_REPRODUCE
    if _REFUSED.search(text):
        return Feedback.REFUSED
    if _MALFORMED.search(text):
        return Feedback.MALFORMED
    return None


def _turns(instance: list[_Message]):
    """Each assistant reply as (action, program description, predicted output, feedback).

    The feedback is read from the user messages between that reply and the next assistant one.
    """
    turns = []
    for index, message in enumerate(instance):
        if message.role != "assistant" or not message.text.strip():
            continue
        replies = []
        for later in instance[index + 1:]:
            if later.role == "assistant":
                break
            if later.role == "user":
                replies.append(later.text)
        feedback = _feedback("\n".join(replies))
        turns.append((*_reply_of(message.text), feedback))
    return turns


@functools.lru_cache(maxsize=_TEXTS_CACHED)
def _reply_of(text: str) -> tuple[Any, str | None, Grid | None]:
    """One assistant reply as (action, program description, predicted output)."""
    program = None
    predicted = None
    if _PYTHON_BLOCK.search(text) or _PROGRAM_LINE.search(text):
        line = _PROGRAM_LINE.search(text)
        program = line.group(1) if line else None
        marker = text.find(PREDICTED_OUTPUT)
        if marker >= 0:
            predicted = grid_after(text, marker + len(PREDICTED_OUTPUT))
    action = extract_action(text) if program is None else None
    return action, program, predicted


def _mode(msgs: list[_Message], header: int | None) -> Mode:
    """`program` when the instructions ask for transform(grid) and offer no submit action.

    The instructions are the system messages plus the user messages up to the instance header;
    a harness told to keep transform(grid) files but to answer with JSON actions stays `action`.
    """
    last = header if header is not None else len(msgs) - 1
    instructions = "\n".join(m.text for i, m in enumerate(msgs)
                             if m.role == "system" or (m.role == "user" and i <= last))
    if "transform(grid)" in instructions and not _SUBMIT_EXAMPLE.search(instructions):
        return Mode.PROGRAM
    return Mode.ACTION
