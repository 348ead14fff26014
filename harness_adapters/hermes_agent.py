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
from pathlib import Path
from typing import Any

import yaml

from harness_adapters.base import Turn
from harness_adapters.chat_model import Usage
from harness_adapters.harness import (ConversationHarness, FailureKind, HarnessAdapter, HarnessCell,
                                      HarnessError, HarnessState)
from sandboxes.images import Recipe, wheelhouse

HERMES_VERSION = "0.19.0"
HERMES_HOME = "/state/hermes"
RECIPE = Recipe("hermes-agent", Path(__file__).parent / "recipes" / "hermes-agent", "base",
                {"HERMES_VERSION": HERMES_VERSION},
                # the anthropic extra: hermes' anthropic_messages transport needs the anthropic SDK
                {"wheelhouse": lambda: wheelhouse("hermes-agent", (f"hermes-agent[anthropic]=={HERMES_VERSION}",))})
TURN_TIMEOUT_S = 900.0
# carc's model API -> hermes' transport (`api_mode`, hermes_cli/runtime_provider.py:338)
API_MODES = {"openai-chat": "chat_completions", "openai-responses": "codex_responses",
             "anthropic-messages": "anthropic_messages"}
ERROR_PATTERNS = (
    (r"APIConnectionError|Connection refused|ConnectError", FailureKind.CRASH),
    (r"RateLimitError", FailureKind.RATE_LIMIT),
    (r"APITimeoutError|ReadTimeout", FailureKind.TIMEOUT),
)
# With its model connection gone (the proxy died), hermes does not fail the turn: its final reply is
# "API call failed after 3 retries: Connection error." (agent/conversation_loop.py:4262, the
# openai SDK's APIConnectionError as its `_summarize_api_error` puts it).
CONNECTION_ERROR_PATTERNS = (
    r"API call failed after \d+ retries",
    r"Connection to provider failed",
    r"Connection error|APIConnectionError|Connection refused|ConnectError|RemoteProtocolError|Server disconnected",
)


def render_config(base_url: str, model: str, effort: str | None, context_length: int = 131072,
                  api: str = "openai-chat") -> str:
    """config.yaml: the proxy as a custom provider speaking `api`, approvals and outside calls off.
    (The driver gives AIAgent the same api_mode; the background review inherits it.)"""
    config: dict[str, Any] = {
        "model": {"provider": "custom", "base_url": base_url, "default": model,
                  "context_length": context_length, "api_mode": API_MODES[api]},
        "security": {"tirith_enabled": False, "allow_lazy_installs": False},
        "approvals": {"mode": "off"},
        # text: no per-turn probing of the endpoint for a local vision server (/api/tags, /props)
        "agent": {"image_input_mode": "text"},
    }
    if effort:
        config["agent"]["reasoning_effort"] = effort
    return yaml.safe_dump(config, sort_keys=False)


class HermesAgent(ConversationHarness):
    """One long-lived driver process per instance (conversation); hermes' own session id."""

    name = "hermes-agent"

    def __init__(self, cell: HarnessCell):
        super().__init__(cell)
        self.api_mode = API_MODES[cell.api]
        self.driver = None
        self.prestarted = None  # the next conversation's driver, started ahead (`prestart`)

    def _spawn(self):
        return self.sandbox.open_process(
            ["/opt/hermes/bin/python", "/opt/carc/hermes_driver.py"], env={"HERMES_HOME": HERMES_HOME})

    def prestart(self) -> None:
        """The next conversation's driver, started now on the state it will find: it imports hermes (seconds
        of CPU; the imports create hermes' folders and seed SOUL.md in HERMES_HOME, as they would
        at the conversation's start) and waits for its first line, where it reads its config."""
        if self.prestarted is not None:  # started on an earlier state: never used
            self.prestarted.close(timeout=0)
        self.prestarted = self._spawn()

    def open_conversation(self, session: str) -> None:
        driver, self.prestarted = self.prestarted, None
        if driver is not None and driver.exit_code() is not None:  # ended by a wipe or a restore
            driver.close(timeout=0)
            driver = None
        self.driver = driver or self._spawn()
        self.driver.send_line(json.dumps({"session": session, "model": self.model, "api_mode": self.api_mode,
                                          "base_url": self.sandbox.reverse_base_url()}))
        self._read("starting hermes")

    def _read(self, what: str) -> dict[str, Any]:
        try:
            line = self.driver.read_line(self.seconds_left(TURN_TIMEOUT_S))
        except TimeoutError as exc:
            raise HarnessError(FailureKind.TIMEOUT, f"hermes while {what}: {exc}") from None
        stderr = self.driver.stderr.decode(errors="replace")[-800:]
        if line is None:
            code = self.driver.exit_code()
            kind = HERMES.classify(stderr) if stderr else FailureKind.OTHER
            raise HarnessError(FailureKind.CRASH if kind == FailureKind.OTHER else kind,
                               f"hermes driver ended (exit code {code}{', killed' if code == 137 else ''}) "
                               f"while {what}; its last output: {stderr}")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise HarnessError(FailureKind.BAD_OUTPUT, f"hermes driver said {line[:300]!r}") from None

    def send(self, message: str) -> Turn:
        self.driver.send_line(json.dumps({"message": message}))
        reply = self._read("answering")
        if reply.get("failed") and not reply["final"]:
            error = str(reply.get("error"))
            raise HarnessError(HERMES.classify(error), f"hermes failed: {error[:500]}")
        usage = Usage(reply.get("api_calls", 0), reply.get("prompt_tokens", 0),
                      reply.get("completion_tokens", 0), reply.get("seconds", 0.0))
        return Turn(text=reply["final"], usage=usage, note={"driver": reply})

    def close_conversation(self) -> None:
        if self.driver is not None:
            self.driver.close()  # end of input: the driver joins the background review, exits
            self.driver = None

    def abandon_conversation(self) -> None:
        if self.driver is not None:
            self.driver.close(timeout=0)  # no drain: the driver failed; recover() ends it
            self.driver = None

    def close(self) -> None:
        super().close()
        if self.prestarted is not None:  # never used: its end of input makes it exit
            self.prestarted.close(timeout=0)
            self.prestarted = None


def _state(cell: HarnessCell) -> HarnessState:
    """hermes has no daemon: its state is the volume plus the config rendered after each wipe."""
    config = render_config(cell.sandbox.reverse_base_url(), cell.model, cell.effort, api=cell.api)
    return HarnessState(cell.sandbox, {f"{HERMES_HOME}/config.yaml": config},
                        logs=(f"{HERMES_HOME}/logs/agent.log", f"{HERMES_HOME}/logs/errors.log"))


HERMES = HarnessAdapter(
    name="hermes-agent", version=HERMES_VERSION, recipe=RECIPE, make_state=_state,
    make_learner=HermesAgent, error_patterns=ERROR_PATTERNS,
    connection_error_patterns=CONNECTION_ERROR_PATTERNS, docs="docs/harnesses/hermes-agent.md",
    apis=tuple(API_MODES))
