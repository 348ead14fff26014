"""openclaw as a black-box learner: its gateway inside the sandbox, one session per instance.

The gateway (`openclaw gateway run`) is the harness's own long-lived process: dreaming is one of
its cron jobs, the skill workshop's reviews and memory flushes are timers in it. It runs for
the whole cell and restarts only after a wipe (memory-off rows) or a restore. Each instance is
a new session key on the gateway's OpenAI-compatible HTTP endpoint; a turn is one request made
by a helper inside the sandbox (the host has no route into the sandbox network). Every model
call goes from openclaw through the proxy container. Verified facts: docs/harnesses/openclaw.md.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any, Literal

import structlog

from harness_adapters.base import Turn
from harness_adapters.chat_model import Usage
from harness_adapters.harness import (ConversationHarness, FailureKind, HarnessAdapter, HarnessCell,
                                      HarnessError, HarnessState, Option)
from sandboxes.environment import Sandbox
from sandboxes.images import Recipe, npm_tree

OPENCLAW_VERSION = "2026.9.6"
STATE_DIR = "/state/openclaw"
LOG_DIR = "/tmp/openclaw-logs"  # tmpfs: collected after every instance (the runner's logs/ folder)
PORT = 18789
RECIPE = Recipe("openclaw", Path(__file__).parent / "recipes" / "openclaw", "base",
                {"OPENCLAW_VERSION": OPENCLAW_VERSION},
                {"openclaw.tar": lambda: npm_tree("openclaw", f"openclaw@{OPENCLAW_VERSION}")})
log = structlog.get_logger("carc.openclaw")
START_TIMEOUT_S = 180.0
START_ATTEMPTS = 3  # gateway starts before a cell (or a wipe) gives up
TURN_TIMEOUT_S = 900.0
ERROR_PATTERNS = (
    (r"HTTP 429|rate.?limit", FailureKind.RATE_LIMIT),
    (r"HTTP 50[234]|ECONNREFUSED|fetch failed|Connection refused", FailureKind.CRASH),
    (r"aborted|ETIMEDOUT|timed out", FailureKind.TIMEOUT),
)
# What openclaw's gateway answers as the reply text when its model connection is gone (the user-
# facing copies of dist/*.mjs `formatTransportErrorCopy`, and its "Agent failed before reply").
CONNECTION_ERROR_PATTERNS = (
    r"LLM request failed: (connection refused|network connection|DNS lookup|the provider endpoint is "
    r"unreachable|provider reported a network error)",
    r"Agent failed before reply",
    r"Connection error|ECONNREFUSED|ECONNRESET|fetch failed|socket hang up",
)
OPTIONS = (
    Option("dreaming_frequency", str, "0 * * * *",
           "cron schedule of memory-core dreaming (openclaw's own default is 03:00 daily)"),
    Option("workshop_mode", Literal["auto", "propose", "off"], "auto", "the skill workshop's autonomous mode"),
    Option("context_window", int, 131072, "the model's context window in tokens"),
    Option("max_tokens", int, 16384, "the most tokens a reply may have"),
)
DEFAULTS: dict[str, Any] = {o.name: o.default for o in OPTIONS}
# carc's model API -> openclaw's provider `api` (dist/model-data-*.mjs MODEL_DATA_APIS)
PROVIDER_APIS = {"openai-chat": "openai-completions", "openai-responses": "openai-responses",
                 "anthropic-messages": "anthropic-messages"}


def render_config(base_url: str, model: str, effort: str | None, options: dict[str, Any] | None = None,
                  api: str = "openai-chat") -> str:
    """openclaw.json: the proxy as the only provider, speaking `api`; every learning mechanism on;
    the outside calls (update check, model catalog) off; memory search set explicitly to FTS-only."""
    opts = OPENCLAW.settings(options or {})
    entry: dict[str, Any] = {"id": model, "name": model, "reasoning": True, "input": ["text"],
                             "contextWindow": opts["context_window"], "maxTokens": opts["max_tokens"]}
    if api == "openai-chat":  # completions-only compat flags
        entry["compat"] = {"supportsReasoningEffort": True,
                           # stream_options.include_usage: the journal counts tokens
                           "supportsUsageInStreaming": True}
    config = {
        "models": {
            "catalogRefresh": {"enabled": False},  # it bypasses the proxy (its own DNS lookup)
            "providers": {"carc": {
                "baseUrl": base_url, "apiKey": "${OPENAI_API_KEY}", "api": PROVIDER_APIS[api],
                "models": [entry]}}},
        "agents": {"defaults": {
            "model": {"primary": f"carc/{model}"},
            "thinkingDefault": effort or "medium",
            "heartbeat": {"every": "0m"},  # no model turns of its own every 30 min
            "compaction": {"memoryFlush": {"enabled": True}}}},
        # the unset default (remote embeddings) breaks recall once an OPENAI_API_KEY is set
        "memory": {"search": {"provider": "none"}},
        "plugins": {"entries": {"memory-core": {"config": {"dreaming": {
            "enabled": True, "frequency": opts["dreaming_frequency"]}}}}},
        "skills": {"workshop": {"autonomous": {"mode": opts["workshop_mode"]}}},
        "gateway": {"mode": "local", "port": PORT, "bind": "loopback", "auth": {"mode": "token"},
                    "controlUi": {"enabled": False},
                    "http": {"endpoints": {"chatCompletions": {"enabled": True}}}},
        "update": {"checkOnStart": False},
        "logging": {"file": f"{LOG_DIR}/openclaw.log"},
    }
    return json.dumps(config, indent=2)


def environment(token: str) -> dict[str, str]:
    return {"OPENCLAW_STATE_DIR": STATE_DIR, "HOME": "/state/home", "TMPDIR": "/tmp",
            "OPENCLAW_GATEWAY_TOKEN": token, "OPENCLAW_GATEWAY_PORT": str(PORT),
            "OPENCLAW_NO_AUTO_UPDATE": "1"}


class Gateway:
    """The gateway process in the sandbox: started detached, its pid in the log folder."""

    def __init__(self, sandbox: Sandbox, token: str):
        self.sandbox = sandbox
        self.token = token

    def start(self) -> None:
        """Start the gateway and wait until it answers; a start that fails is stopped and tried
        again (START_ATTEMPTS in all). openclaw gives its state lease a fixed 5 s to become
        ready at start-up and gives up otherwise, which a loaded machine misses now and then
        ("state lease heartbeat did not become ready ... timeoutMs=5000"): that is the machine's
        fault, not the harness's, and no instance is running while the gateway starts."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_once()
                return
            except HarnessError as exc:
                if attempt == START_ATTEMPTS:
                    raise HarnessError(FailureKind.CRASH, f"{exc} (after {START_ATTEMPTS} starts)") from exc
                log.warning("openclaw_gateway_start_retry", attempt=attempt, error=str(exc)[-300:])
                self.stop()

    def _start_once(self) -> None:
        script = (f"mkdir -p {LOG_DIR} /state/home || exit 1; cd /state/home || exit 1; "
                  f"setsid openclaw gateway run >> {LOG_DIR}/gateway.out 2>&1 < /dev/null & "
                  f"echo $! > {LOG_DIR}/gateway.pid")
        result = self.sandbox.exec(["sh", "-c", script], env=environment(self.token), timeout=30)
        if not result.ok:
            raise HarnessError(FailureKind.CRASH, f"cannot start the openclaw gateway: {result.stderr[-500:]!r}")
        ready = self.sandbox.exec(["python3", "/opt/carc/openclaw_helper.py", "wait", str(PORT),
                                   str(START_TIMEOUT_S)], timeout=START_TIMEOUT_S + 10)
        if not ready.ok:
            tail = self.sandbox.exec(["sh", "-c", f"tail -c 1500 {LOG_DIR}/gateway.out"]).text()
            raise HarnessError(FailureKind.CRASH, f"the openclaw gateway did not start: {tail}")

    def stop(self) -> None:
        """SIGTERM (openclaw shuts down cleanly in 2-6 s), then wait for it to be gone."""
        self.sandbox.exec(["sh", "-c", f'pid=$(cat {LOG_DIR}/gateway.pid 2>/dev/null) || exit 0; '
                           'kill -TERM -"$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null; '
                           'for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.1; done; '
                           'kill -KILL -"$pid" 2>/dev/null; exit 0'], timeout=30)


class OpenClaw(ConversationHarness):
    name = "openclaw"

    def __init__(self, cell: HarnessCell, gateway: Gateway):
        super().__init__(cell)
        self.gateway = gateway
        self.key = ""

    def open_conversation(self, session: str) -> None:
        self.key = f"agent:main:explicit:{session.lower()}"

    def send(self, message: str) -> Turn:
        limit = self.seconds_left(TURN_TIMEOUT_S)
        job = json.dumps({"port": PORT, "session_key": self.key, "message": message, "timeout": limit})
        result = self.sandbox.exec(["python3", "/opt/carc/openclaw_helper.py", "turn"], input=job,
                                   env={"OPENCLAW_GATEWAY_TOKEN": self.gateway.token},
                                   timeout=limit + 30)
        if result.timed_out:
            raise HarnessError(FailureKind.TIMEOUT, f"openclaw turn took over {limit:g} s")
        try:
            reply = json.loads(result.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise HarnessError(FailureKind.CRASH, f"openclaw helper said {result.stdout[-300:]!r} "
                                                  f"{result.stderr[-500:]!r}") from None
        if reply.get("failed"):
            error = str(reply.get("error"))
            raise HarnessError(OPENCLAW.classify(error), f"openclaw failed: {error[:500]}")
        usage = reply.get("usage") or {}
        return Turn(text=reply["final"], note={"gateway": reply}, usage=Usage(
            0, usage.get("prompt_tokens") or usage.get("input") or 0,
            usage.get("completion_tokens") or usage.get("output") or 0, reply.get("seconds", 0.0)))


def _gateway(cell: HarnessCell) -> Gateway:
    """One gateway (and token) per cell, shared by the state (start, stop) and the learner (turns)."""
    if "gateway" not in cell.shared:
        cell.shared["gateway"] = Gateway(cell.sandbox, secrets.token_hex(16))
    return cell.shared["gateway"]


def _state(cell: HarnessCell) -> HarnessState:
    gateway = _gateway(cell)
    config = render_config(cell.sandbox.reverse_base_url(), cell.model, cell.effort, cell.options, cell.api)
    return HarnessState(cell.sandbox, {f"{STATE_DIR}/openclaw.json": config},
                        start=gateway.start, stop=gateway.stop,
                        logs=(f"{LOG_DIR}/openclaw.log", f"{LOG_DIR}/gateway.out"),
                        stop_before_wipe=False)  # its graceful stop takes ~6 s, for nothing


OPENCLAW = HarnessAdapter(
    name="openclaw", version=OPENCLAW_VERSION, recipe=RECIPE,
    make_state=_state, make_learner=lambda cell: OpenClaw(cell, _gateway(cell)),
    error_patterns=ERROR_PATTERNS, connection_error_patterns=CONNECTION_ERROR_PATTERNS, options=OPTIONS,
    docs="docs/harnesses/openclaw.md",
    apis=tuple(PROVIDER_APIS))
