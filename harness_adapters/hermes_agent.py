"""hermes-agent as a black-box learner in its Docker sandbox (rows memory-on and memory-off).

The adapter is mostly data: the pinned version, the image recipe (harness_adapters/recipes/
hermes-agent: the package from a host wheelhouse plus an in-sandbox driver), the config it renders
onto the state volume, and the conversation driver: one long-lived driver process per instance
(a `docker exec` with a line protocol) that runs the agent in-process and, at the end of the
instance, joins the background review before it exits. Every model call goes through the cell's proxy.
Verified facts about the package: docs/harnesses/hermes-agent.md.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import yaml

from harness_adapters.base import InstanceView, Learner, Turn
from harness_adapters.chat_model import Usage
from harness_adapters.harness import FailureKind, HarnessAdapter, HarnessCell, HarnessError, register
from orchestrator.prompts import PromptSet
from orchestrator.protocol import Outcome
from sandboxes.docker_sandbox import DockerSandbox
from sandboxes.images import Recipe, register_recipe, wheelhouse

HERMES_VERSION = "0.19.0"
HERMES_HOME = "/state/hermes"
PROGRAMS_DIR = "/state/programs"  # the program-procedure rows' library, on the state volume
RECIPE = Recipe("hermes-agent", Path(__file__).parent / "recipes" / "hermes-agent", "base",
                {"HERMES_VERSION": HERMES_VERSION},
                {"wheelhouse": lambda: wheelhouse("hermes-agent", (f"hermes-agent=={HERMES_VERSION}",))})
register_recipe(RECIPE)
TURN_TIMEOUT_S = 900.0
ERROR_PATTERNS = (
    (r"APIConnectionError|Connection refused|ConnectError", FailureKind.CRASH),
    (r"RateLimitError", FailureKind.RATE_LIMIT),
    (r"APITimeoutError|ReadTimeout", FailureKind.TIMEOUT),
)


def render_config(base_url: str, model: str, effort: str | None, context_length: int = 131072) -> str:
    """config.yaml: the proxy as a custom provider, approvals and outside calls off."""
    config: dict[str, Any] = {
        "model": {"provider": "custom", "base_url": base_url, "default": model,
                  "context_length": context_length},
        "security": {"tirith_enabled": False, "allow_lazy_installs": False},
        "approvals": {"mode": "off"},
        # text: no per-turn probing of the endpoint for a local vision server (/api/tags, /props)
        "agent": {"image_input_mode": "text"},
    }
    if effort:
        config["agent"]["reasoning_effort"] = effort
    return yaml.safe_dump(config, sort_keys=False)


class HermesState:
    """The cell's state volume; after a wipe the config is rendered again (a fresh start)."""

    def __init__(self, sandbox: DockerSandbox, config_text: str):
        self.sandbox = sandbox
        self.config_text = config_text

    def prepare(self) -> None:
        self.sandbox.write_file(f"{HERMES_HOME}/config.yaml", self.config_text)

    def wipe(self) -> None:
        self.sandbox.wipe()
        self.prepare()

    def snapshot(self, dest: Path) -> None:
        self.sandbox.snapshot(dest)

    def restore(self, source: Path | None) -> None:
        self.sandbox.restore(source)
        self.prepare()


class HermesAgent(Learner):
    name = "hermes-agent"

    def __init__(self, sandbox: DockerSandbox, prompts: PromptSet, model: str, effort: str | None,
                 row: str = "memory-on"):
        self.sandbox = sandbox
        self.row = row
        self.task_id = ""
        self.prompts = prompts
        self.model = model
        self.effort = effort
        self.session = ""
        self.pending = ""
        self.driver = None
        self.turns: list[dict[str, Any]] = []

    def begin(self, view: InstanceView) -> None:
        self._close_driver()
        self.session = f"carc-{uuid.uuid4().hex[:12]}"
        self.turns = []
        self.driver = self.sandbox.open_process(
            ["/opt/hermes/bin/python", "/opt/carc/hermes_driver.py"], env={"HERMES_HOME": HERMES_HOME})
        self.driver.send_line(json.dumps({"session": self.session, "model": self.model,
                                          "base_url": self.sandbox.reverse_base_url()}))
        self._read("starting hermes")
        self.task_id = view.task_id
        # hermes keeps its own system prompt; the rules open the first user message
        rules = [self.prompts.render("system")]
        if self.row.startswith("program-procedure"):
            rules.append(self.prompts.render("program_procedure", programs_dir=PROGRAMS_DIR))
        self.pending = "\n".join(rules + [self.prompts.instance_message(
            view.task_id, view.test_input, view.attempts_used, view.demos_used)])

    def _read(self, what: str) -> dict[str, Any]:
        try:
            line = self.driver.read_line(TURN_TIMEOUT_S)
        except TimeoutError as exc:
            raise HarnessError(FailureKind.TIMEOUT, f"hermes while {what}: {exc}") from None
        stderr = self.driver.stderr.decode(errors="replace")[-800:]
        if line is None:
            raise HarnessError(HERMES.classify(stderr) if stderr else FailureKind.CRASH,
                               f"hermes driver ended while {what}: {stderr}")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise HarnessError(FailureKind.BAD_OUTPUT, f"hermes driver said {line[:300]!r}") from None

    def _send(self, message: str) -> Turn:
        self.driver.send_line(json.dumps({"message": message}))
        reply = self._read("answering")
        self.turns.append({"user": message, "assistant": reply["final"], "driver": reply})
        if reply.get("failed") and not reply["final"]:
            error = str(reply.get("error"))
            raise HarnessError(HERMES.classify(error), f"hermes failed: {error[:500]}")
        usage = Usage(reply.get("api_calls", 0), reply.get("prompt_tokens", 0),
                      reply.get("completion_tokens", 0), reply.get("seconds", 0.0))
        return Turn(text=reply["final"], usage=usage)

    def _close_driver(self) -> None:
        if self.driver is not None:
            self.driver.close()  # end of input: the driver joins the background review, exits
            self.driver = None

    def act(self) -> Turn:
        return self._send(self.pending)

    def observe(self, outcome: Outcome, attempts_used: int, demos_used: int) -> None:
        self.pending = self.prompts.outcome_message(outcome, attempts_used, demos_used, demos_used)

    def end(self, solved: bool) -> None:
        """The verdict reaches the harness in the same conversation (it may store something);
        the asked-to-store and program-procedure rows add their request to it."""
        if self.pending and self.driver is not None:
            if self.row == "asked-to-store":
                self.pending += "\n" + self.prompts.render("store_invitation")
            elif self.row.startswith("program-procedure"):
                self.pending += "\n" + self.prompts.render(
                    "program_save_request", task_id=self.task_id, programs_dir=PROGRAMS_DIR)
            self._send(self.pending)
            self.pending = ""
        self._close_driver()

    def close(self) -> None:
        self._close_driver()

    def transcript(self) -> list[dict[str, Any]]:
        return list(self.turns)


def _state(cell: HarnessCell) -> HermesState:
    return HermesState(cell.sandbox, render_config(cell.sandbox.reverse_base_url(), cell.model,
                                                   cell.effort))


HERMES = register(HarnessAdapter(
    name="hermes-agent", version=HERMES_VERSION, recipe=RECIPE,
    rows=("memory-on", "memory-off", "asked-to-store", "program-procedure", "program-procedure-wiped"),
    make_state=_state,
    make_learner=lambda cell: HermesAgent(cell.sandbox, cell.prompts, cell.model, cell.effort, cell.row),
    error_patterns=ERROR_PATTERNS))
