"""What every learner implements, and the conversation mechanics the ladder learners share.

The runner owns the protocol; a learner only ever sees an `InstanceView` (task id, test input,
counts, and on a resumed instance the steps it already took) and the outcomes of its actions.
A learner keeps whatever it keeps in its own `state_dir`, which the runner wipes, snapshots and
restores; nothing else carries over between instances.
"""

from __future__ import annotations

import abc
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from orchestrator.arc import Demo, Grid
from orchestrator.prompts import PromptSet
from orchestrator.protocol import Action, DemoGiven, Malformed, Outcome, Verdict

from harness_adapters.chat_model import ChatModel, Usage


@dataclass(frozen=True)
class StepRecord:
    """An earlier step of the current instance, replayed to a learner when a killed run resumes."""

    action: Action | Malformed
    outcome: Outcome
    reply: str = ""
    note: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InstanceView:
    """Everything a learner is told about an instance. Never the test output, never the stream."""

    task_id: str
    test_input: Grid
    attempts_used: int = 0
    demos_used: int = 0
    history: tuple[StepRecord, ...] = ()
    deadline: float | None = None  # time.monotonic() at which the instance's wall clock runs out


@dataclass(frozen=True)
class Turn:
    """A learner's next move: a reply text carrying one JSON action, or an action it built itself."""

    text: str = ""
    action: Action | Malformed | None = None
    usage: Usage = field(default_factory=Usage)
    note: dict[str, Any] = field(default_factory=dict)


class Learner(abc.ABC):
    """One learner of the ladder, or a harness. One instance per cell; one conversation per instance."""

    name: str = "learner"
    # Capabilities the runner reads (declared, never probed with getattr):
    talks_after_verdict: bool = False  # may take more turns once the instance is over (up to 4)
    runs_programs: bool = False  # built with the cell's ProgramExecutor (the program library)
    deadline: float | None = None  # time.monotonic() when the current instance's wall clock runs out
    # The collective regime's shared state of the current round (read-only, in the learner's own
    # layout), set by the collective runner; None everywhere else.
    shared_dir: Path | None = None

    def __init__(self, state_dir: Path, prompts: PromptSet):
        self.state_dir = state_dir
        self.prompts = prompts
        state_dir.mkdir(parents=True, exist_ok=True)

    def seconds_left(self, most: float) -> float:
        """How long the next model call or harness turn may take: at most `most`, and no longer
        than the instance's wall clock has left (`limits.wall_clock_s`), but never below 1 s."""
        if self.deadline is None:
            return most
        return max(1.0, min(most, self.deadline - time.monotonic()))

    @abc.abstractmethod
    def begin(self, view: InstanceView) -> None:
        """Start a fresh conversation for this instance."""

    @abc.abstractmethod
    def act(self) -> Turn:
        """Produce the next action."""

    @abc.abstractmethod
    def observe(self, outcome: Outcome, attempts_used: int, demos_used: int) -> None:
        """Receive the environment's answer to the last action."""

    def end(self, solved: bool) -> None:
        """The instance is over; keep whatever this learner keeps in `state_dir`."""

    def transcript(self) -> list[dict[str, Any]]:
        """The conversation of the current instance, for the records."""
        return []

    def prestart(self) -> None:
        """Between two instances whose state is kept (after the snapshot, before the next begin):
        start ahead what the next conversation's start would start, on the state as the next
        instance will find it (harness_adapters/hermes_agent.py). Default: nothing."""

    def close(self) -> None:
        """Release processes and connections (the runner always calls it)."""

    @classmethod
    def merge_shared(cls, previous: Path | None, kept: Sequence[Path], out: Path) -> dict[str, int]:
        """The collective regime's update step for this learner: write into the empty folder
        `out` the next round's shared state, from the round's shared state `previous` (None
        before the first update) and every user's own state at the round's end, in user order.
        Deterministic in its inputs: the order users ran in never matters. Returns counts for
        the records. Only learners with a collective row implement it."""
        raise NotImplementedError(f"{cls.__name__} keeps nothing to share (it has no collective row)")


class ChatLearner(Learner):
    """A bare model in a chat: the orchestrator is the user, each reply carries one JSON action."""

    system_template = "system"

    def __init__(self, state_dir: Path, prompts: PromptSet, model: ChatModel):
        super().__init__(state_dir, prompts)
        self.model = model
        self.messages: list[dict[str, Any]] = []
        self.task_id = ""
        self.test_input: Grid = ((0,),)
        self.pairs: list[Demo] = []  # every pair held on this instance: cached then bought
        self.bought: list[Demo] = []
        self.cached: list[Demo] = []

    def cached_pairs(self, task_id: str) -> list[Demo]:
        """Pairs shown free at the start of an instance; none for a stateless learner."""
        return []

    def begin(self, view: InstanceView) -> None:
        """Open the conversation; on a resumed instance, rebuild it from the steps already taken."""
        self.task_id, self.test_input = view.task_id, view.test_input
        self.deadline = view.deadline
        self.cached = self.cached_pairs(view.task_id)
        self.bought, self.pairs = [], list(self.cached)
        opening = self.prompts.instance_message(view.task_id, view.test_input, 0, 0,
                                                cached=self.cached)
        self.messages = [{"role": "system", "content": self.prompts.render(self.system_template)},
                         {"role": "user", "content": opening}]
        self.on_begin(view)
        attempts = demos = 0
        for step in view.history:
            attempts += isinstance(step.outcome, Verdict) and not step.outcome.correct
            demos += isinstance(step.outcome, DemoGiven)
            self.replay(step)
            self.observe(step.outcome, attempts, demos)

    def replay(self, step: StepRecord) -> None:
        """Put an earlier step's reply back into the conversation (resume)."""
        text = step.reply or (json.dumps(step.action.to_json())
                              if isinstance(step.action, Action) else "")
        self.messages.append({"role": "assistant", "content": text})

    def on_begin(self, view: InstanceView) -> None:
        """Hook for subclasses after the conversation is opened."""

    def act(self) -> Turn:
        reply = self.model.complete(self.messages, deadline=self.deadline)
        self.messages.append({"role": "assistant", "content": reply.text})
        return Turn(text=reply.text, usage=reply.usage)

    def observe(self, outcome: Outcome, attempts_used: int, demos_used: int) -> None:
        number = None
        if isinstance(outcome, DemoGiven):
            self.bought.append(outcome.demo)
            self.pairs.append(outcome.demo)
            number = len(self.cached) + outcome.number
        text = self.prompts.outcome_message(outcome, attempts_used, demos_used, number)
        self.messages.append({"role": "user", "content": text})

    def transcript(self) -> list[dict[str, Any]]:
        return list(self.messages)
