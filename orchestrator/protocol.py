"""The Continual-ARC instance protocol: actions, costs, caps, refusals and the end of an instance.

A pure state machine (no clock, no I/O): the runner feeds it parsed actions and, when a wall-clock
limit passes, calls `expire`. Every rule of SPEC section 3 lives here and only here.

| action          | effect                                   | cost                                   |
| request_demos   | one more demonstration pair              | 1; refused without charge after 8      |
| submit + grid   | verdict correct / incorrect              | 0 if correct (ends); 1 if incorrect    |
| finish          | ends the conversation                    | refused without charge until over      |

An instance ends on a correct answer or on the 8th incorrect one. A failed instance is charged
the whole budget of 16. Malformed actions cost nothing; after `max_malformed` of them the
instance fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from orchestrator.arc import SPELL_LIMIT, Demo, Grid, GridError, as_grid, json_type, spell
from orchestrator.tasks.base import ArcInstance

ACTION_ALIASES = {
    "request_demos": "request_demos",
    "request_demo": "request_demos",
    "demo": "request_demos",
    "submit": "submit",
    "finish": "finish",
}
ALLOWED_KEYS = {"request_demos": {"action"}, "submit": {"action", "grid"}, "finish": {"action"}}


@dataclass(frozen=True)
class Limits:
    """The caps of one instance. Defaults are the benchmark's; only the last two are settings."""

    max_demos: int = 8
    max_wrong: int = 8
    budget: int = 16
    max_malformed: int = 20
    wall_clock_s: float = 900.0


class FailureKind(str, Enum):
    """Why an instance failed (charged the full budget), as the records count it: the protocol's
    own two caps, the runner's wall clock and empty conversation, and what went wrong with the
    learner (a harness's failed turn: rate-limit, timeout, crash, bad-output, other; its
    HarnessError). Records hold the value, a string."""

    WRONG_ANSWERS = "wrong-answers"
    MALFORMED = "malformed"
    WALL_CLOCK = "wall-clock"
    NO_VERDICT = "no-verdict"
    MODEL_UNAVAILABLE = "model-unavailable"
    LEARNER_ERROR = "learner-error"
    RATE_LIMIT = "rate-limit"
    TIMEOUT = "timeout"
    CRASH = "crash"
    BAD_OUTPUT = "bad-output"
    OTHER = "other"
    ACTION_CAP = "action-cap"  # arc3: 5 x the level's human baseline without completing it


class Status(str, Enum):
    OPEN = "open"
    SOLVED = "solved"
    FAILED = "failed"


@dataclass(frozen=True)
class Action:
    """A well-formed action: `kind` is the canonical name; `grid` only for submit."""

    kind: str
    grid: Grid | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.kind}
        if self.grid is not None:
            out["grid"] = [list(r) for r in self.grid]
        return out


@dataclass(frozen=True)
class Malformed:
    """Anything that is not a well-formed action, with the exact reason."""

    reason: str
    raw: str = ""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _decode(text: str) -> Any:
    """json.loads, strict: NaN and Infinity refused. Raises ValueError (JSONDecodeError, or
    Python's integer-digits limit) or RecursionError."""
    return json.loads(text, parse_constant=_reject_constant)


def _json_error(exc: Exception, text: str, offset: int) -> str:
    """Why JSON text failed to decode, with the line and column in the reply when known."""
    if isinstance(exc, json.JSONDecodeError):
        pos = offset + exc.pos
        line = text.count("\n", 0, pos) + 1
        column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        return f"not valid JSON at line {line} column {column} of the reply: {exc.msg}"
    if isinstance(exc, RecursionError):
        return "not valid JSON: nested too deeply"
    if "digits" in str(exc):  # Python's limit on integer digits (sys.get_int_max_str_digits)
        return "not valid JSON: a number has too many digits (more than 4300)"
    return f"not valid JSON: {str(exc)[:SPELL_LIMIT]}"


def parse_action(value: Any) -> Action | Malformed:
    """Parse one action from JSON text or an already-decoded object. Never raises."""
    raw = value if isinstance(value, str) else ""
    if isinstance(value, str):
        try:
            value = _decode(value)
        except (ValueError, RecursionError) as exc:
            return Malformed(_json_error(exc, raw, 0), raw)
    if not isinstance(value, dict):
        return Malformed(f"an action must be a JSON object, got {json_type(value)}", raw)
    if "action" not in value:
        return Malformed('the object has no "action" key', raw)
    name = value["action"]
    if not isinstance(name, str) or name not in ACTION_ALIASES:
        known = ", ".join(sorted(ACTION_ALIASES))
        return Malformed(f"unknown action {spell(name)}; known actions: {known}", raw)
    kind = ACTION_ALIASES[name]
    extra = sorted(set(value) - ALLOWED_KEYS[kind])
    if extra:
        allowed = ", ".join(f'"{k}"' for k in sorted(ALLOWED_KEYS[kind]))
        listed = spell(extra)[1:-1] if len(extra) > 1 else spell(extra[0])
        return Malformed(f"unexpected key(s) {listed} for {spell(name)}; allowed: {allowed}", raw)
    if kind != "submit":
        return Action(kind)
    if "grid" not in value:
        return Malformed('submit needs a "grid": an array of rows of integers 0 to 9', raw)
    try:
        return Action("submit", as_grid(value["grid"]))
    except GridError as exc:
        return Malformed(str(exc), raw)


# The most of a reply extraction reads: a longer one is malformed (free) unread. A reply of 1.6 MB
# of fenced blocks took 3.6-13.8 s to search on a loaded machine; an action is a few KB at most
# (a 30 x 30 grid is under 2,000 characters).
MAX_REPLY_CHARS = 1 << 20

# Work bound of the search for an embedded action: characters handed to the JSON decoder, as a
# multiple of the reply's length, so extraction stays linear in the reply whatever it holds.
DECODE_BUDGET_FACTOR = 4
DECODE_BUDGET_MIN = 65_536


def extract_action(text: str, parse: Callable[[Any], Any] | None = None) -> Action | Malformed:
    """Find the one JSON action in a reply that may wrap it in prose or a code fence.

    The whole reply is tried first; then the last fenced JSON object; then the last `{...}` span
    (outermost first, searching inside a span only when it does not decode) that decodes to an
    object with an "action" key. Never raises, and its work is linear in the reply's length: an
    unclosed fence or brace, a stray quote, an over-long number or a deep nesting is malformed
    (free), never an error or a hang. `parse` reads the decoded object (default `parse_action`,
    the grid tracks' actions; the arc3 track passes its own). A reply longer than
    `MAX_REPLY_CHARS` is malformed without being read.
    """
    parse = parse or parse_action
    if not isinstance(text, str):
        return Malformed(f"reply must be text, got {json_type(text)}")
    if len(text) > MAX_REPLY_CHARS:
        return Malformed(f"the reply is {len(text):,} characters; carc reads at most {MAX_REPLY_CHARS:,} "
                         "(1 MiB): send one JSON action in a shorter reply", text)
    stripped = text.strip()
    if not stripped:
        return Malformed("the reply is empty; it must carry one JSON action")
    try:
        direct = parse(_decode(stripped))
    except (ValueError, RecursionError) as exc:  # positions count from the reply
        direct = Malformed(_json_error(exc, text, len(text) - len(text.lstrip())), text)
    if not isinstance(direct, Malformed):
        return direct
    # Candidates in priority order: the fences, last first; then the `{...}` spans, last first;
    # then the spans found without string awareness (a stray quote in prose can pair with a
    # quote of the action and hide it from the first pass).
    candidates = [(start, end, []) for start, end in reversed(_fenced_objects(text))]
    candidates += reversed(_object_spans(text, strings=True))
    candidates += reversed(_object_spans(text, strings=False))
    stack = candidates[::-1]  # pop() takes them in priority order
    budget = DECODE_BUDGET_FACTOR * len(text) + DECODE_BUDGET_MIN
    broken: Malformed | None = None
    while stack and budget > 0:
        start, end, inner = stack.pop()
        budget -= end - start
        try:
            obj = _decode(text[start:end])
        except (ValueError, RecursionError) as exc:
            if broken is None and '"action"' in text[start:end]:
                broken = Malformed(_json_error(exc, text, start), text)
            stack.extend(inner)  # a span that does not decode may hold one that does (last first)
            continue
        if isinstance(obj, dict) and "action" in obj:
            return parse(obj)
    if stripped.startswith(("{", "[")):
        return direct
    return broken or Malformed(
        'no JSON action found in the reply; send one object such as {"action": "request_demos"}',
        text)


def _fenced_objects(text: str) -> list[tuple[int, int]]:
    """(start, end) of the body of every closed ``` fence (info string none or json) that opens
    with `{`, in order. Fences pair up left to right; an unclosed one is ignored."""
    spans, pos = [], 0
    while (opening := text.find("```", pos)) >= 0:
        closing = text.find("```", opening + 3)
        if closing < 0:
            break
        start = opening + 3
        newline = text.find("\n", start, closing)
        info = text[start:newline if newline >= 0 else closing].strip()
        if info.lower() == "json":
            start = newline if newline >= 0 else start + text[start:closing].lower().index("json") + 4
        elif info.startswith("{") or not info:
            pass
        else:
            pos = closing + 3
            continue
        body = text[start:closing]
        left = start + len(body) - len(body.lstrip())
        right = start + len(body.rstrip())
        if left < right and text[left] == "{":
            spans.append((left, right))
        pos = closing + 3
    return spans


def _object_spans(text: str, strings: bool) -> list[tuple[int, int, list]]:
    """The outermost closed `{...}` spans of the text, in order, each with the spans directly
    inside it. Braces inside JSON strings are skipped; a string ends at a newline (JSON strings
    hold none), so a stray quote in prose cannot hide the rest of the reply, and an unclosed `{`
    leaves the spans after it intact. With `strings` false, quotes are not looked at."""
    open_: list[tuple[int, list]] = []  # (start, children) of each unclosed `{`
    top: list[tuple[int, int, list]] = []
    in_str = esc = False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"' or ch == "\n":
                in_str = False
            continue
        if ch == '"' and open_ and strings:
            in_str = True
        elif ch == "{":
            open_.append((i, []))
        elif ch == "}" and open_:
            start, children = open_.pop()
            span = (start, i + 1, children)
            (open_[-1][1] if open_ else top).append(span)
    # Spans closed inside a `{` that never closed are outermost too.
    for _start, children in open_:
        top.extend(children)
    top.sort(key=lambda span: span[0])
    return top


# --- outcomes: what the environment answers --------------------------------------------------

@dataclass(frozen=True)
class DemoGiven:
    demo: Demo
    number: int  # 1-based among the demos bought on this instance


@dataclass(frozen=True)
class Verdict:
    correct: bool
    over: bool


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class MalformedReply:
    reason: str
    over: bool  # the instance is over (this reply reached the malformed cap, or it was over before)
    # malformed replies the instance still takes before it fails (0: this one failed it); None when
    # the instance was already over and the reply was not counted
    left: int | None = None


@dataclass(frozen=True)
class Finished:
    """finish accepted: the conversation ends."""


Outcome = DemoGiven | Verdict | Refused | MalformedReply | Finished


@dataclass
class InstanceProtocol:
    """The state of one instance under the protocol. Mutated only through `step` and `expire`."""

    instance: ArcInstance
    limits: Limits = field(default_factory=Limits)
    demos_used: int = 0
    wrong: int = 0
    malformed: int = 0
    status: Status = Status.OPEN
    failure_reason: str | None = None
    failure_kind: FailureKind | None = None
    finished: bool = False
    first_submit_demos: int | None = None
    first_answer_correct: bool | None = None

    @property
    def over(self) -> bool:
        return self.status is not Status.OPEN

    @property
    def cost(self) -> int:
        if self.status is Status.FAILED:
            return self.limits.budget
        return self.demos_used + self.wrong

    @property
    def budget_share(self) -> float:
        return self.cost / self.limits.budget

    def step(self, action: Action | Malformed) -> Outcome:
        """Apply one action and return the environment's answer. Never raises."""
        if isinstance(action, Malformed):
            return self._malformed(action.reason)
        if action.kind == "finish":
            if not self.over:
                return Refused("finish is refused until the instance is over (a correct answer "
                               "or the eighth wrong one)")
            self.finished = True
            return Finished()
        if self.over:
            return Refused(f"the instance is over ({self.status.value}); reply "
                           '{"action": "finish"}')
        if action.kind == "request_demos":
            return self._request_demo()
        return self._submit(action.grid)

    def expire(self, reason: str, kind: FailureKind = "other") -> None:
        """Fail the instance from outside the conversation (wall-clock limit, learner crash)."""
        if not self.over:
            self.status = Status.FAILED
            self.failure_reason = reason
            self.failure_kind = kind

    def _request_demo(self) -> Outcome:
        if self.demos_used >= self.limits.max_demos:
            return Refused(f"all {self.limits.max_demos} demonstrations of this instance are used")
        if self.demos_used >= len(self.instance.demos):
            return Refused(f"this task has no more demonstration pairs (all "
                           f"{len(self.instance.demos)} given)")
        self.demos_used += 1
        return DemoGiven(self.instance.demos[self.demos_used - 1], self.demos_used)

    def _submit(self, grid: Grid | None) -> Outcome:
        correct = grid == self.instance.test_output
        if self.first_answer_correct is None:
            self.first_answer_correct = correct
            self.first_submit_demos = self.demos_used
        if correct:
            self.status = Status.SOLVED
            return Verdict(True, True)
        self.wrong += 1
        if self.wrong >= self.limits.max_wrong:
            self.status = Status.FAILED
            self.failure_reason = f"{self.limits.max_wrong} incorrect submissions"
            self.failure_kind = "wrong-answers"
        return Verdict(False, self.over)

    def _malformed(self, reason: str) -> Outcome:
        if self.over:
            return MalformedReply(reason, over=True)
        self.malformed += 1
        left = self.limits.max_malformed - self.malformed
        if left <= 0:
            self.status = Status.FAILED
            self.failure_reason = f"{self.limits.max_malformed} malformed actions"
            self.failure_kind = "malformed"
            return MalformedReply(reason, over=True, left=0)
        return MalformedReply(reason, over=False, left=left)
