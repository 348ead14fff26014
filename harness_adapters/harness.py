"""What a harness adapter declares, and the registry the cell services build harness cells from.

An adapter is mostly data (Harbor's installed-agent style): name and pinned version, the image
recipe (Dockerfile template + in-sandbox driver), the rows it supports, the patterns that
classify its failures, and two factories: the cell's state volume (which renders the harness's
config onto it after every wipe) and the learner (the conversation driver). The orchestrator
owns the protocol; the learner only turns messages into final texts.
"""

from __future__ import annotations

import abc
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import TypeAdapter, ValidationError

from harness_adapters.base import InstanceView, Learner, Turn
from orchestrator.errors import CarcError
from orchestrator.prompts import PromptSet
from orchestrator.protocol import FailureKind, Outcome
from orchestrator.rows import row
from sandboxes.environment import LeftOut, SandboxEnvironment, StateVolume
from sandboxes.images import Recipe

PROGRAMS_DIR = "/state/programs"  # the program-procedure rows' library, on the state volume
# A collective row's shared library in a user's sandbox: the round's files, written by the keeper
# (orchestrator/run/collective/harness_rows.py), which the harness reads and cannot change.
SHARED_DIR = "/tmp/carc/shared"



class HarnessError(CarcError, RuntimeError):
    """A harness turn failed; `kind` says how (the runner fails the instance with this reason)."""

    def __init__(self, kind: FailureKind, message: str):
        super().__init__(f"[{kind.value}] {message}")
        self.kind = kind
        self.detail = message

    def __reduce__(self):  # crosses the worker pool intact (the default would lose `kind`)
        return (HarnessError, (self.kind, self.detail))


COMMON_PATTERNS: tuple[tuple[str, FailureKind], ...] = (
    (r"\b429\b|rate.?limit|too many requests", FailureKind.RATE_LIMIT),
    (r"timed? ?out|timeout|deadline exceeded", FailureKind.TIMEOUT),
    (r"Traceback \(most recent call last\)|Segmentation fault|exit code -?\d+|Killed", FailureKind.CRASH),
    (r"JSONDecodeError|invalid json|unexpected token", FailureKind.BAD_OUTPUT),
)


@dataclass(frozen=True)
class HarnessCell:
    """Everything an adapter's factories get about the cell they build for."""

    sandbox: SandboxEnvironment
    prompts: PromptSet
    model: str
    effort: str | None
    row: str
    options: dict[str, Any] = field(default_factory=dict)  # the grid's harness_options[name]
    shared: dict[str, Any] = field(default_factory=dict)   # what the state and learner share
    api: str = "openai-chat"  # the grid's model.api: one of the adapter's `apis`


@dataclass(frozen=True)
class Option:
    """A setting a grid may give the harness under `harness_options.<name>` (mitmproxy's
    `add_option`: name, type, default, help). `kind` is any type pydantic validates."""

    name: str
    kind: Any
    default: Any
    help: str


@dataclass(frozen=True)
class HarnessAdapter:
    """A harness, declared. Its rows are the registry's (harness_adapters/learners.yaml)."""

    name: str
    version: str
    recipe: Recipe
    make_state: Callable[[HarnessCell], StateVolume]
    make_learner: Callable[[HarnessCell], Learner]
    error_patterns: tuple[tuple[str, FailureKind], ...] = ()
    # what the harness says, as its reply text, when it lost its model connection (its proxy died
    # under it): such a reply makes the runner ask the cell's services for a fault at once
    connection_error_patterns: tuple[str, ...] = ()
    options: tuple[Option, ...] = ()
    docs: str = ""  # the project's page of verified facts about the harness
    # the model APIs the adapter renders a config for (harness_adapters.chat_model.APIS);
    # `carc grid check` refuses a grid whose model.api is not among them
    apis: tuple[str, ...] = ("openai-chat",)

    def option_problems(self, given: dict[str, Any]) -> dict[str, str]:
        """option name -> what is wrong with the value a grid gives it (empty when all is well)."""
        declared = {o.name: o for o in self.options}
        problems = {}
        for key, value in given.items():
            if key not in declared:
                problems[key] = (f"{self.name} has no option {key!r}; options: "
                                 f"{', '.join(declared) or 'none'}")
                continue
            try:
                TypeAdapter(declared[key].kind).validate_python(value, strict=True)
            except ValidationError as exc:
                problems[key] = f"{exc.errors()[0]['msg']} ({declared[key].help})"
        return problems

    def settings(self, given: dict[str, Any]) -> dict[str, Any]:
        """Every option's value: the grid's, else the default. ValueError on a wrong one."""
        problems = self.option_problems(given)
        if problems:
            raise ValueError("; ".join(f"harness_options.{self.name}.{k}: {v}" for k, v in problems.items()))
        return {o.name: given.get(o.name, o.default) for o in self.options}

    def reports_lost_connection(self, text: str) -> bool:
        """Whether `text` is the harness telling of a lost model connection, not an answer."""
        return any(re.search(pattern, text, re.IGNORECASE) for pattern in self.connection_error_patterns)

    def classify(self, text: str) -> FailureKind:
        """The first pattern (the adapter's own, then the common ones) that matches `text`."""
        for pattern, kind in (*self.error_patterns, *COMMON_PATTERNS):
            if re.search(pattern, text, re.IGNORECASE):
                return kind
        return FailureKind.OTHER


class HarnessState:
    """A harness cell's state volume: the files it starts from, and its long-lived processes.

    After every wipe or restore the harness's config files are written again and `start` runs
    (a gateway or daemon, if the harness has one); `stop` runs before the volume is touched.
    `logs` are paths inside the sandbox (volume or tmpfs) whose new bytes are collected after
    each instance into the cell's folder, so logs outside the snapshots are kept too.
    """

    def __init__(self, sandbox: SandboxEnvironment, files: dict[str, str] | None = None,
                 start: Callable[[], None] | None = None, stop: Callable[[], None] | None = None,
                 logs: tuple[str, ...] = (), stop_before_wipe: bool = True):
        self.sandbox = sandbox
        self.files = dict(files or {})
        self.start = start
        self.stop = stop
        self.logs = logs
        # False where `stop` is only a graceful shutdown: the wipe's kill -9 stops the processes
        # as surely, and whatever a graceful shutdown would save, the wipe deletes.
        self.stop_before_wipe = stop_before_wipe
        self.offsets: dict[str, int] = {}

    def prepare(self) -> None:
        for path, text in self.files.items():
            self.sandbox.write_file(path, text)
        self.offsets = {}
        if self.start:
            self.start()

    def _halt(self) -> None:
        if self.stop:
            self.stop()

    def wipe(self) -> None:
        if self.stop_before_wipe:
            self._halt()
        self.sandbox.wipe()
        self.prepare()

    def recover(self) -> None:
        """After the harness failed an instance (hung past the wall clock, crashed, exited): its
        processes are ended and started again as after a restore, on the same volume, so what it
        kept stays and the next instance meets a harness that runs."""
        self.sandbox.end_processes()
        self.prepare()

    def snapshot(self, dest: Path) -> list[LeftOut]:
        return self.sandbox.snapshot(dest)

    def restore(self, source: Path | None) -> None:
        self._halt()
        self.sandbox.restore(source)
        self.prepare()

    def collect_logs(self, dest: Path) -> list[Path]:
        """The bytes each log gained since the last call, as files under `dest` (never raises:
        a missing or unreadable log is noted in `dest/missing.txt`)."""
        written, missing = [], []
        for path in self.logs:
            offset = self.offsets.get(path, 0)
            result = self.sandbox.exec(
                ["sh", "-c", 'test -f "$1" || exit 3; size=$(stat -c %s "$1"); '
                 '[ "$size" -lt "$2" ] && set -- "$1" 0; echo "$size"; tail -c +$(($2 + 1)) "$1"',
                 "sh", path, str(offset)], timeout=120)
            if not result.ok:
                missing.append(f"{path}: {'not there' if result.returncode == 3 else result.stderr.decode(errors='replace').strip()}")
                continue
            size_line, _, data = result.stdout.partition(b"\n")
            self.offsets[path] = int(size_line or 0)
            if data:
                dest.mkdir(parents=True, exist_ok=True)
                target = dest / path.strip("/").replace("/", "__")
                target.write_bytes(data)
                written.append(target)
        if missing:
            dest.mkdir(parents=True, exist_ok=True)
            (dest / "missing.txt").write_text("\n".join(missing) + "\n")
        return written


class ConversationHarness(Learner):
    """A harness driven one conversation per instance; the rows are settings of the cell.

    Subclasses implement three things: open a new conversation (`open_conversation`), send one
    user message and return the final text (`send`), and end the conversation
    (`close_conversation`, which lets post-turn work finish). The rows: the program-procedure
    rules open each instance; the verdict is sent in the same conversation, with the store
    invitation (asked-to-store) or the save request (program-procedure rows) added to it.
    """

    name = "harness"

    def __init__(self, cell: HarnessCell):
        self.sandbox = cell.sandbox
        self.prompts = cell.prompts
        self.model = cell.model
        self.effort = cell.effort
        self.row = row(cell.row)
        self.task_id = ""
        self.session = ""
        self.pending = ""
        self.open = False
        self.broken = False  # the harness failed a turn: nothing more is sent to it this instance
        self.turns: list[dict[str, Any]] = []

    # --- what an adapter implements -------------------------------------------------------

    @abc.abstractmethod
    def open_conversation(self, session: str) -> None:
        """Start a fresh conversation named `session` (nothing of an earlier one in context)."""

    @abc.abstractmethod
    def send(self, message: str) -> Turn:
        """One user message in the current conversation -> the harness's final text (+ usage);
        raise HarnessError when the harness fails."""

    def close_conversation(self) -> None:
        """End the conversation; wait for the harness's post-turn work (reviews) if it has any."""

    def prestart(self) -> None:
        """Start, on the state the next conversation will find, what its start would start (a
        driver process that loads the harness before it reads anything of the conversation):
        on a standby sandbox once it is prepared (orchestrator/run/standby.py), or after an
        instance's snapshot when the next instance keeps the state. Nothing changes the state
        until that conversation opens. Default: nothing."""

    def abandon_conversation(self) -> None:
        """End a conversation whose harness failed (hung, crashed) without waiting on it; the
        cell's state then ends and restarts its processes (`HarnessState.recover`)."""
        self.close_conversation()

    def opening_rules(self) -> list[str]:
        """Texts that open the first user message (harnesses keep their own system prompts)."""
        rules = [self.prompts.render("system")]
        if self.row.program_procedure:
            rules.append(self.prompts.render("program_procedure", programs_dir=PROGRAMS_DIR))
        if self.row.shared == "learner":
            rules.append(self.prompts.render("shared_library", shared_dir=SHARED_DIR))
        return rules

    # --- the protocol side, the same for every harness --------------------------------------

    def begin(self, view: InstanceView) -> None:
        self._close()
        self.session = f"carc-{uuid.uuid4().hex[:12]}"
        self.turns = []
        self.task_id = view.task_id
        self.deadline = view.deadline
        self.broken = False
        self.open_conversation(self.session)
        self.open = True
        self.pending = "\n".join(self.opening_rules() + [self.prompts.instance_message(
            view.task_id, view.test_input, view.attempts_used, view.demos_used)])

    def converse(self, message: str, deadline: float | None = None) -> Turn:
        """One conversation of one message, outside any instance (a collective row's curator,
        orchestrator/run/collective/harness_rows.py): opened, sent, and closed (a failed one is
        abandoned; its HarnessError reaches the caller)."""
        self._close()
        self.session = f"carc-{uuid.uuid4().hex[:12]}"
        self.turns, self.task_id, self.deadline, self.broken = [], "", deadline, False
        self.open_conversation(self.session)
        self.open = True
        try:
            return self._send(message)
        finally:
            if self.broken:
                self.open = False
                self.abandon_conversation()
            else:
                self._close()

    def _send(self, message: str) -> Turn:
        try:
            turn = self.send(message)
        except HarnessError:
            self.broken = True
            raise
        self.turns.append({"user": message, "assistant": turn.text, **turn.note})
        return turn

    def act(self) -> Turn:
        return self._send(self.pending)

    def observe(self, outcome: Outcome, attempts_used: int, demos_used: int) -> None:
        self.pending = self.prompts.outcome_message(outcome, attempts_used, demos_used, demos_used)

    def end(self, solved: bool) -> None:
        """The verdict reaches the harness in the same conversation (it may store something);
        a harness that failed a turn is left, not waited on."""
        if self.broken and self.open:
            self.open = False
            self.abandon_conversation()
            return
        if self.pending and self.open:
            if self.row.asks_to_store:
                self.pending += "\n" + self.prompts.render("store_invitation")
            elif self.row.program_procedure:
                self.pending += "\n" + self.prompts.render(
                    "program_save_request", task_id=self.task_id, programs_dir=PROGRAMS_DIR)
            self._send(self.pending)
            self.pending = ""
        self._close()

    def _close(self) -> None:
        if self.open:
            self.open = False
            self.close_conversation()

    def close(self) -> None:
        self._close()

    def transcript(self) -> list[dict[str, Any]]:
        return list(self.turns)
