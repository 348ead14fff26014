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
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from orchestrator.arc import Demo, Grid, GridError, as_grid
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


# Why an instance failed (charged the full budget), as the records count it: the protocol's own
# two caps, the runner's wall clock and empty conversation, and what went wrong with the learner
# (a harness's own failure kinds: rate-limit, timeout, crash, bad-output, other).
FailureKind = Literal["wrong-answers", "malformed", "wall-clock", "no-verdict", "model-unavailable",
                      "learner-error", "rate-limit", "timeout", "crash", "bad-output", "other"]


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


def parse_action(value: Any) -> Action | Malformed:
    """Parse one action from JSON text or an already-decoded object. Never raises."""
    raw = value if isinstance(value, str) else ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError) as exc:
            return Malformed(f"not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})", raw)
    if not isinstance(value, dict):
        return Malformed(f"an action must be a JSON object, got {type(value).__name__}", raw)
    if "action" not in value:
        return Malformed('the object has no "action" key', raw)
    name = value["action"]
    if not isinstance(name, str) or name not in ACTION_ALIASES:
        known = ", ".join(sorted(ACTION_ALIASES))
        return Malformed(f'unknown action {name!r}; known actions: {known}', raw)
    kind = ACTION_ALIASES[name]
    extra = sorted(set(value) - ALLOWED_KEYS[kind])
    if extra:
        allowed = ", ".join(f'"{k}"' for k in sorted(ALLOWED_KEYS[kind]))
        return Malformed(f"unexpected key(s) {', '.join(repr(k) for k in extra)} for {name!r}; "
                         f"allowed: {allowed}", raw)
    if kind != "submit":
        return Action(kind)
    if "grid" not in value:
        return Malformed('submit needs a "grid": a list of rows of integers 0 to 9', raw)
    try:
        return Action("submit", as_grid(value["grid"]))
    except GridError as exc:
        return Malformed(str(exc), raw)


_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


def extract_action(text: str) -> Action | Malformed:
    """Find the one JSON action in a reply that may wrap it in prose or a code fence.

    The last fenced JSON object wins; otherwise the last balanced `{...}` that decodes to an
    object with an "action" key; otherwise the whole text is parsed (and reported malformed).
    """
    if not isinstance(text, str):
        return Malformed(f"reply must be text, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        return Malformed("the reply is empty; it must carry one JSON action")
    direct = parse_action(stripped)
    if isinstance(direct, Action):
        return direct
    fenced = _FENCE.findall(stripped)
    candidates = list(reversed(fenced)) + list(reversed(_json_objects(stripped)))
    for candidate in candidates:
        try:
            obj = json.loads(candidate)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(obj, dict) and "action" in obj:
            return parse_action(obj)
    return direct if stripped.startswith(("{", "[")) else Malformed(
        "no JSON action found in the reply; send one object such as {\"action\": \"request_demos\"}",
        text)


def _json_objects(text: str) -> list[str]:
    """Balanced top-level `{...}` spans of the text, in order (strings respected)."""
    spans, depth, start, in_str, esc = [], 0, -1, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"' and depth > 0:
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start:i + 1])
    return spans


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
    over: bool  # the malformed cap was reached and the instance failed


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

    @property
    def demos_given(self) -> tuple[Demo, ...]:
        return self.instance.demos[: self.demos_used]

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
        if self.malformed >= self.limits.max_malformed:
            self.status = Status.FAILED
            self.failure_reason = f"{self.limits.max_malformed} malformed actions"
            self.failure_kind = "malformed"
            return MalformedReply(reason, over=True)
        return MalformedReply(reason, over=False)
