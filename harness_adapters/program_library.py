"""The program library: the demo-cache floor where every submission is a program the model writes.

Each program `transform(grid)` is checked free, in a sandbox (see program_check), against every pair held;
failures go back to the model (the first three failing pairs with what the program returned, the
rest by number); a passing program's test output is submitted. The program that
answered a task is kept (`state_dir/programs/<task>.py`) with the pairs, and when the task
returns it runs first, before the model is asked. The wiped variant is the same learner with its
state emptied before every instance (a row setting of the cell, not a code path here).

In the collective regime the shared state has the same layout: the pool of pairs (the demo-cache
floor's) and, per task, the program most users keep (`merge_shared`); a user runs its own kept
program first and, without one, the shared one, each checked against the pairs held.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from orchestrator.prompts import PromptSet
from orchestrator.protocol import Action, Malformed, Outcome, Verdict, extract_action

from harness_adapters.base import InstanceView, StepRecord, Turn
from harness_adapters.chat_model import ChatModel, Usage
from harness_adapters.demo_cache_floor import DemoCacheFloor
from harness_adapters.program_check import ProgramExecutor, ProgramLimits, check_program, local_executor

_CODE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
MAX_CHECKS_PER_TURN = 6


def extract_program(text: str) -> str | None:
    """The last fenced code block that defines transform, or the whole reply if it is bare code."""
    blocks = [b for b in _CODE.findall(text) if "def transform" in b]
    if blocks:
        return blocks[-1]
    if text.lstrip().startswith(("def transform", "import ", "from ", "#")) and "def transform" in text:
        return text
    return None


class ProgramLibrary(DemoCacheFloor):
    name = "program-library"
    system_template = "program_system"
    runs_programs = True

    def __init__(self, state_dir: Path, prompts: PromptSet, model: ChatModel,
                 limits: ProgramLimits = ProgramLimits(), executor: ProgramExecutor = local_executor):
        super().__init__(state_dir, prompts, model)
        self.limits = limits
        self.executor = executor
        self.kept_pending = False
        self.last_program: str | None = None   # the program behind the last submission
        self.passing: str | None = None        # the last program that reproduced every pair

    def _kept_path(self, task_id: str) -> Path:
        return self.state_dir / "programs" / f"{task_id}.py"

    def _kept_source(self, task_id: str) -> str | None:
        """The program to run first: the learner's own kept one, else the round's shared one."""
        for folder in (self.state_dir, self.shared_dir):
            if folder is not None and (path := folder / "programs" / f"{task_id}.py").exists():
                return path.read_text()
        return None

    @classmethod
    def merge_shared(cls, previous: Path | None, kept: Sequence[Path], out: Path) -> dict[str, int]:
        """The pool of pairs, and per task the program the most users keep (ties: the previous
        round's, then the one a lower-numbered user keeps); a task no user keeps a program for
        keeps the previous round's."""
        counts = super().merge_shared(previous, kept, out)
        votes: dict[str, Counter[str]] = {}
        for folder in kept:
            for path in sorted((folder / "programs").glob("*.py")) if (folder / "programs").is_dir() else []:
                votes.setdefault(path.stem, Counter())[path.read_text()] += 1
        before = {p.stem: p.read_text() for p in sorted((previous / "programs").glob("*.py"))} \
            if previous is not None and (previous / "programs").is_dir() else {}
        chosen = dict(before)
        for task_id, count in votes.items():
            order = ([before[task_id]] if task_id in before else []) + list(count)  # first seen first
            chosen[task_id] = max(order, key=lambda source: (count[source], -order.index(source)))
        (out / "programs").mkdir(parents=True, exist_ok=True)
        for task_id, source in sorted(chosen.items()):
            (out / "programs" / f"{task_id}.py").write_text(source)
        return {**counts, "programs": len(chosen)}

    def on_begin(self, view: InstanceView) -> None:
        # On a resumed instance the kept program already had its turn (it is in the history).
        self.kept_pending = self._kept_source(view.task_id) is not None and not view.history
        self.last_program = self.passing = None

    def replay(self, step: StepRecord) -> None:
        """A resumed instance gets back the turn's whole exchange (every reply, every failed
        check's message), as recorded in the step's note, so the model is sent exactly what an
        uninterrupted run would have sent it."""
        program = step.note.get("program")
        if program:
            self.last_program = self.passing = program
        exchange = step.note.get("exchange")
        if isinstance(exchange, list):
            self.messages.extend(m for m in exchange if isinstance(m, dict))
        elif program:  # a record from before exchanges were kept
            self.messages.append({"role": "assistant", "content": f"```python\n{program}```"})
        else:
            super().replay(step)

    def act(self) -> Turn:
        turn_start = len(self.messages)
        turn = self._act()
        return replace(turn, note={**(turn.note or {}), "exchange": self.messages[turn_start:]})

    def _act(self) -> Turn:
        if self.kept_pending:
            self.kept_pending = False
            turn = self._run_kept()
            if turn is not None:
                return turn
        usage = Usage()
        programs = 0
        for _ in range(MAX_CHECKS_PER_TURN):
            reply = self.model.complete(self.messages, deadline=self.deadline)
            usage = usage + reply.usage
            self.messages.append({"role": "assistant", "content": reply.text})
            source = extract_program(reply.text)
            if source is None:
                action = extract_action(reply.text)
                if isinstance(action, Action) and action.kind in ("request_demos", "finish"):
                    return Turn(text=reply.text, action=action, usage=usage)
                reason = ("the reply holds neither a ```python block defining transform(grid) "
                          "nor a JSON request for a demonstration")
                self.messages.append({"role": "user",
                                      "content": self.prompts.render("program_no_code", reason=reason)})
                continue
            programs += 1
            result = check_program(source, self.pairs, self.test_input, self.limits, self.executor)
            if result.passed:
                self.last_program = self.passing = source
                return Turn(text=reply.text, action=Action("submit", result.test_output), usage=usage,
                            note={"program": source, "from": "model"})
            self.messages.append({"role": "user", "content": self.prompts.render(
                "program_check_failed", details=result.details)})
        # The model gave no passing program this turn; the protocol counts it as malformed (free).
        why = (f"no program reproduced the pairs ({programs} of {MAX_CHECKS_PER_TURN} replies held one)"
               if programs else f"none of {MAX_CHECKS_PER_TURN} replies held a program or a JSON "
                                "request for a demonstration")
        return Turn(action=Malformed(why), usage=usage)

    def _run_kept(self) -> Turn | None:
        source = self._kept_source(self.task_id)
        if source is None:
            return None
        result = check_program(source, self.pairs, self.test_input, self.limits, self.executor)
        if not result.passed:
            return None
        self.last_program = source
        # The model sees the kept program and its verdict, so it does not propose it again.
        self.messages.append({"role": "assistant", "content": f"```python\n{source}```"})
        return Turn(action=Action("submit", result.test_output),
                    note={"program": source, "from": "kept"})

    def observe(self, outcome: Outcome, attempts_used: int, demos_used: int) -> None:
        super().observe(outcome, attempts_used, demos_used)
        if isinstance(outcome, Verdict) and not outcome.correct:
            self.passing = None if self.passing == self.last_program else self.passing

    def end(self, solved: bool) -> None:
        super().end(solved)
        path = self._kept_path(self.task_id)
        keep = self.last_program if solved else self.passing
        if keep:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(keep)
        elif path.exists() and not solved:
            path.unlink()  # the kept program was wrong here and nothing better was found
