"""prime-agent's adapter: config, the RPC driver, the conversation flow, the image's inputs.

Most tests need neither Docker nor prime-agent: the RPC driver and the learner run against
`FakePrime`, a scripted peer whose records have the shapes prime-agent v0.8.0 sends (seen on the
real one, docs/harnesses/prime-agent.md). The live tests at the end run the real prime-agent in
its real sandbox through the real proxy on the scripted model; they need the source the image is
built from (CARC_PRIME_AGENT_SOURCE) and are skipped without it.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import json
import os
import socket
import subprocess
import tarfile
import threading
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from harness_adapters import prime_agent
from harness_adapters.base import InstanceView
from harness_adapters.harness import PROGRAMS_DIR, FailureKind, HarnessCell, HarnessError
from harness_adapters.registry import adapter as adapter_for
from harness_adapters.prime_agent import (AGENT_DIR, ARCHIVE_FILES_SHA256, ENVIRONMENT, LAUNCH,
                                          PRIME_AGENT_COMMIT, SOURCE_ENV, URL_ENV, RpcClient, check_source,
                                          fetch_archive, files_digest, render_models, render_settings,
                                          source_commit, source_digest, supplied_source)
from orchestrator.prompts import PromptSet
from orchestrator.protocol import Verdict
from sandboxes.environment import ExecResult
from sandboxes.images import ImageBuildError

PRIME = adapter_for("prime-agent")


# --- the scripted peer ----------------------------------------------------------------------------

LATER = {"type": "carc-test-later"}  # events after it reach the client just before its next answer
DIE = "die"                          # the peer exits instead of running the prompt
SILENT = "silent"                    # the peer accepts the prompt and then says nothing


def assistant(text: str = "", *, stop: str = "stop", error: str | None = None,
              tokens: tuple[int, int, int] = (100, 10, 0)) -> dict[str, Any]:
    message = {"role": "assistant", "content": [{"type": "text", "text": text}] if text else [],
               "api": "openai-completions", "provider": "carc", "model": "m",
               "usage": {"input": tokens[0], "output": tokens[1], "cacheRead": tokens[2], "cacheWrite": 0,
                         "totalTokens": sum(tokens), "cost": {"input": 0, "output": 0, "total": 0.001}},
               "stopReason": stop, "timestamp": 1796093587655}
    if error:
        message["errorMessage"] = error
    return message


def run(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    """One run's events as prime-agent streams them: per model reply message_start, updates,
    message_end and turn_end, all between agent_start and agent_end."""
    events: list[dict[str, Any]] = [{"type": "agent_start"}, {"type": "turn_start"}]
    for message in messages:
        events += [{"type": "message_start", "message": {**message, "content": []}},
                   {"type": "message_update", "message": message,
                    "assistantMessageEvent": {"type": "text_delta", "delta": "x"}},
                   {"type": "message_end", "message": message},
                   {"type": "turn_end", "message": message, "toolResults": []}]
    return events + [{"type": "agent_end", "messages": list(messages)}]


class FakePrime:
    """A scripted peer speaking prime-agent's RPC protocol: it answers commands, and plays the
    next script for each prompt (a list of events, DIE, SILENT, or {"refuse": error})."""

    def __init__(self, *scripts: Any, model: tuple[str, str] = ("carc", "m")):
        self.scripts = list(scripts)
        self.model = model
        self.sent: list[dict[str, Any]] = []
        self.out: deque[str] = deque()
        self.held: list[dict[str, Any]] = []
        self.stderr = b""
        self.alive = True
        self.session = 1
        self.busy = 0  # how many get_state answers still say isStreaming
        self.last_text: str | None = None

    def emit(self, record: dict[str, Any]) -> None:
        self.out.append(json.dumps(record))

    def send_line(self, text: str) -> None:
        if not self.alive:
            raise BrokenPipeError("the peer is gone")
        try:
            command = json.loads(text)
        except ValueError:
            return self.emit({"type": "response", "command": "parse", "success": False,
                              "error": "Failed to parse command: Unexpected token"})
        self.sent.append(command)
        for record in self.held:  # emitted before the peer read this command
            self.emit(record)
        self.held = []
        kind = command["type"]
        reply: dict[str, Any] = {"id": command.get("id"), "type": "response", "command": kind, "success": True}
        if kind == "prompt":
            return self.play(self.scripts.pop(0), reply)
        if kind == "extension_ui_response":
            return None
        if kind == "get_state":
            reply["data"] = {"model": {"provider": self.model[0], "id": self.model[1]},
                             "sessionId": f"s{self.session}", "isStreaming": self.busy > 0, "isCompacting": False}
            self.busy -= 1
        elif kind == "get_last_assistant_text":
            reply["data"] = {} if self.last_text is None else {"text": self.last_text}
        elif kind == "new_session":
            self.session += 1
            reply["data"] = {"cancelled": False}
        elif kind == "set_session_name":
            self.emit({"type": "session_info_changed", "name": command["name"]})
        else:
            reply = {"type": "response", "command": kind, "success": False, "error": f"Unknown command: {kind}"}
        self.emit(reply)

    def play(self, script: Any, reply: dict[str, Any]) -> None:
        if script == DIE:
            self.alive, self.stderr = False, b"Error: Prime Agent daemon exited during startup (code 1)"
            return
        if isinstance(script, dict):
            return self.emit({**reply, "success": False, "error": script["refuse"]})
        self.emit(reply)
        if script == SILENT:
            return
        cut = script.index(LATER) if LATER in script else len(script)
        for record in script[:cut]:
            self.emit(record)
        self.held = script[cut + 1:]
        ends = [e for e in script if e.get("type") == "message_end" and e["message"]["role"] == "assistant"]
        texts = [c["text"] for c in ends[-1]["message"]["content"] if c["type"] == "text"] if ends else []
        self.last_text = "".join(texts) or None

    def read_line(self, timeout: float) -> str | None:
        if self.out:
            return self.out.popleft()
        if not self.alive:
            return None
        raise TimeoutError(f"no answer in {timeout:g} s")

    def close(self, timeout: float = 900) -> None:
        self.alive = False

    def commands(self) -> list[str]:
        return [c["type"] for c in self.sent]


class FakeSandbox:
    """Hands out the given peers as processes; records commands and files."""

    def __init__(self, *peers: FakePrime):
        self.peers = list(peers)
        self.opened: list[tuple[list[str], dict[str, str]]] = []
        self.execs: list[list[str]] = []
        self.files: dict[str, str] = {}

    def open_process(self, cmd, env=None, user=None):
        self.opened.append((cmd, env))
        return self.peers.pop(0)

    def exec(self, cmd, input=None, cwd=None, env=None, timeout=None, user=None) -> ExecResult:
        self.execs.append(cmd)
        return ExecResult(0, b"", b"")

    def write_file(self, path: str, data: str) -> None:
        self.files[path] = data

    def wipe(self) -> None:
        self.execs.append(["wipe"])

    def restore(self, source) -> None:
        self.wipe()

    def reverse_base_url(self) -> str:
        return "http://proxy:8081/v1"


def client(*scripts: Any) -> tuple[RpcClient, FakePrime]:
    peer = FakePrime(*scripts)
    return RpcClient(peer, PRIME.classify), peer


def cell(sandbox: FakeSandbox, row: str = "memory-on", effort: str | None = "low") -> HarnessCell:
    return HarnessCell(sandbox, PromptSet.load(), "m", effort, row)


VIEW = InstanceView("007bbfb7", [[0, 1], [1, 0]])


def finish(learner) -> None:
    """What the runner does after the last action: the verdict, then the end of the instance."""
    learner.observe(Verdict(correct=False, over=True), 8, 0)
    learner.end(False)


# --- configuration ----------------------------------------------------------------------------

def test_models_json_points_the_only_provider_at_the_proxy_with_the_placeholder_key_variable():
    config = json.loads(render_models("http://proxy:8081/v1", "m1", "high"))
    assert list(config["providers"]) == ["carc"]
    provider = config["providers"]["carc"]
    assert provider["baseUrl"] == "http://proxy:8081/v1" and provider["api"] == "openai-completions"
    assert provider["apiKey"] == "OPENAI_API_KEY"  # an env var name: prime-agent reads the placeholder
    assert provider["models"] == [{"id": "m1", "name": "m1", "reasoning": True, "input": ["text"],
                                   "contextWindow": 131072, "maxTokens": 16384}]


def test_settings_make_the_proxy_model_the_default_with_automatic_refinement_on():
    settings = json.loads(render_settings("m1", "high"))
    assert (settings["defaultProvider"], settings["defaultModel"], settings["defaultThinkingLevel"]) == \
        ("carc", "m1", "high")
    assert settings["autoRefine"] == {"enabled": True, "turnInterval": 25, "compact": True, "cooldownMs": 1200000}
    assert settings["telemetry"] == {"enabled": False}


def test_no_effort_means_no_reasoning_and_thinking_off():
    assert json.loads(render_models("http://p/v1", "m", None))["providers"]["carc"]["models"][0]["reasoning"] is False
    assert json.loads(render_settings("m", None))["defaultThinkingLevel"] == "off"


def test_options_are_checked_by_name_and_merge_into_the_defaults():
    models = json.loads(render_models("http://p/v1", "m", "low", {"compat": {"supportsDeveloperRole": False},
                                                                  "max_tokens": 4096}))
    entry = models["providers"]["carc"]["models"][0]
    assert entry["compat"] == {"supportsDeveloperRole": False} and entry["maxTokens"] == 4096
    settings = json.loads(render_settings("m", "low", {"auto_refine": {"turnInterval": 5}}))
    assert settings["autoRefine"] == {"enabled": True, "turnInterval": 5, "compact": True, "cooldownMs": 1200000}
    with pytest.raises(ValueError, match="turn_interval"):
        render_settings("m", "low", {"turn_interval": 5})


def test_state_is_on_the_volume_and_the_daemon_socket_on_tmpfs():
    assert ENVIRONMENT["PRIME_AGENT_CODING_AGENT_DIR"] == AGENT_DIR == "/state/prime/agent"
    assert ENVIRONMENT["PRIME_AGENT_SESSION_DIR"] == "/state/prime/agent/sessions"
    assert ENVIRONMENT["TMPDIR"].startswith("/tmp/")  # the daemon socket: $TMPDIR/prime-agent-<uid>/
    assert ENVIRONMENT["PRIME_AGENT_KERNEL_PYTHON"].startswith("/opt/")  # in the image, not bootstrapped
    assert ENVIRONMENT["PI_OFFLINE"] == "1" and ENVIRONMENT["PRIME_AGENT_TELEMETRY"] == "0"
    assert LAUNCH.endswith("exec prime-agent --mode rpc") and "--no-session" not in LAUNCH
    state = PRIME.make_state(cell(FakeSandbox()))
    assert set(state.files) == {f"{AGENT_DIR}/models.json", f"{AGENT_DIR}/settings.json"}


# --- the RPC driver ---------------------------------------------------------------------------

def test_a_prompt_returns_the_runs_assistant_messages_once_answered_and_ended():
    rpc, peer = client(run(assistant(stop="toolUse"), assistant('{"action": "request_demos"}')))
    messages = rpc.prompt("hello")
    assert [m["stopReason"] for m in messages] == ["toolUse", "stop"]
    assert peer.sent[0] == {"id": "carc-1", "type": "prompt", "message": "hello"}
    assert peer.commands() == ["prompt", "get_state"]  # the probe after agent_end
    assert rpc.command("get_last_assistant_text") == {"text": '{"action": "request_demos"}'}


def test_an_automatic_retry_after_agent_end_is_waited_for():
    failed, answer = assistant(stop="error", error="429 rate limited"), assistant("done")
    script = run(failed) + [LATER, {"type": "auto_retry_start", "attempt": 1, "maxAttempts": 3,
                                    "delayMs": 2000, "errorMessage": "429 rate limited"}] \
        + run(answer) + [{"type": "auto_retry_end", "success": True, "attempt": 1}]
    rpc, peer = client(script)
    messages = rpc.prompt("hello")
    assert [m["stopReason"] for m in messages] == ["error", "stop"]  # not over at the first agent_end
    assert peer.commands() == ["prompt", "get_state"]  # answered after the retry's agent_end


def test_a_busy_session_after_agent_end_is_asked_again():
    rpc, peer = client(run(assistant("done")))
    peer.busy = 1  # the first probe finds it still streaming
    assert len(rpc.prompt("hello")) == 1
    assert peer.commands() == ["prompt", "get_state", "get_state"]


def test_a_refused_prompt_is_a_harness_error_with_the_reason():
    rpc, _ = client({"refuse": "Agent is already streaming"})
    with pytest.raises(HarnessError, match="already streaming"):
        rpc.prompt("hello")


def test_an_unknown_command_is_refused_even_without_an_id():
    rpc, _ = client()
    with pytest.raises(HarnessError, match="Unknown command: nonsense"):
        rpc.command("nonsense")


def test_a_peer_that_dies_is_a_crash_with_its_stderr():
    rpc, _ = client(DIE)
    with pytest.raises(HarnessError) as failure:
        rpc.prompt("hello")
    assert failure.value.kind is FailureKind.CRASH and "daemon exited during startup" in str(failure.value)


def test_a_peer_that_stops_answering_is_a_timeout():
    rpc, _ = client(SILENT)
    with pytest.raises(HarnessError) as failure:
        rpc.prompt("hello", timeout=0.1)
    assert failure.value.kind is FailureKind.TIMEOUT


def test_lines_that_are_not_protocol_records_are_skipped_and_named_when_it_dies():
    rpc, peer = client(DIE)
    peer.out.extend(["Warning: Python skills unavailable", "[1, 2]", '{"no": "type"}'])
    peer.emit({"id": "carc-1", "type": "response", "command": "get_state", "success": True, "data": {"ok": 1}})
    assert rpc.command("get_state") == {"ok": 1}
    assert rpc.skipped == ["Warning: Python skills unavailable", "[1, 2]", '{"no": "type"}']
    with pytest.raises(HarnessError, match="Python skills unavailable"):
        rpc.prompt("hello")


def test_dialog_requests_are_cancelled_and_notifications_ignored():
    events = run(assistant("done"))
    events.insert(1, {"type": "extension_ui_request", "id": "ui-1", "method": "confirm", "title": "Allow?"})
    events.insert(1, {"type": "extension_ui_request", "id": "ui-2", "method": "notify", "message": "hi"})
    rpc, peer = client(events)
    rpc.prompt("hello")
    assert {"type": "extension_ui_response", "id": "ui-1", "cancelled": True} in peer.sent
    assert not any(c.get("id") == "ui-2" for c in peer.sent)


def test_usage_counts_every_model_call_and_cached_prompt_tokens():
    usage = prime_agent.turn_usage([assistant(tokens=(100, 10, 50)), assistant(tokens=(30, 5, 0))], 2.5)
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens, usage.seconds) == (2, 180, 15, 2.5)
    assert usage.usd == pytest.approx(0.002)


# --- the learner: one process per cell, one session per instance ------------------------------

def test_each_instance_is_a_new_named_session_on_the_cells_one_process():
    peer = FakePrime(run(assistant("a")), run(assistant("ok")), run(assistant("b")))
    sandbox = FakeSandbox(peer)
    learner = PRIME.make_learner(cell(sandbox))
    learner.begin(VIEW)
    assert learner.act().text == "a"
    finish(learner)
    learner.begin(VIEW)
    assert learner.act().text == "b"
    assert len(sandbox.opened) == 1 and sandbox.opened[0] == (["sh", "-c", LAUNCH], ENVIRONMENT)
    turn = ["prompt", "get_state", "get_last_assistant_text"]
    assert peer.commands() == ["get_state", "set_session_name", *turn, *turn,
                               "new_session", "set_session_name", *turn]
    names = [c["name"] for c in peer.sent if c["type"] == "set_session_name"]
    assert names[0] != names[1] and all(n.startswith("carc-") for n in names)


def test_the_verdict_reaches_the_same_session_and_ending_disposes_it():
    peer = FakePrime(run(assistant('{"action": "submit"}')), run(assistant("noted")))
    learner = PRIME.make_learner(cell(FakeSandbox(peer)))
    learner.begin(VIEW)
    learner.act()
    learner.observe(Verdict(correct=False, over=True), 8, 0)
    learner.end(False)
    prompts = [c["message"] for c in peer.sent if c["type"] == "prompt"]
    assert len(prompts) == 2 and "Task id: 007bbfb7" in prompts[0] and "Verdict:" in prompts[1]
    assert peer.commands()[-1] == "new_session"  # after the verdict's turn, not before it
    assert peer.commands().count("new_session") == 1


def test_asked_to_store_invites_storing_after_the_verdict_only():
    invitation = PromptSet.load().render("store_invitation").strip()
    peer = FakePrime(run(assistant("x")), run(assistant("saved")))
    learner = PRIME.make_learner(cell(FakeSandbox(peer), row="asked-to-store"))
    learner.begin(VIEW)
    learner.act()
    learner.observe(Verdict(correct=True, over=True), 0, 0)
    learner.end(True)
    first, after = [c["message"] for c in peer.sent if c["type"] == "prompt"]
    assert invitation not in first and after.index("Verdict") < after.index(invitation)


def test_program_procedure_rules_open_the_first_message():
    rules = PromptSet.load().render("program_procedure", programs_dir=PROGRAMS_DIR).strip()
    peer = FakePrime(run(assistant("x")), run(assistant("y")))
    learner = PRIME.make_learner(cell(FakeSandbox(peer), row="program-procedure"))
    learner.begin(VIEW)
    learner.act()
    first = peer.sent[[c["type"] for c in peer.sent].index("prompt")]["message"]
    assert rules in first and first.index(rules) < first.index("Task id: 007bbfb7")


def test_a_failed_run_is_a_harness_error_of_its_kind():
    peer = FakePrime(run(assistant(stop="error", error="429 Too Many Requests")),
                     run(assistant(stop="error", error="Connection error.")))
    learner = PRIME.make_learner(cell(FakeSandbox(peer)))
    learner.begin(VIEW)
    with pytest.raises(HarnessError) as failure:
        learner.act()
    assert failure.value.kind is FailureKind.RATE_LIMIT
    with pytest.raises(HarnessError) as failure:
        learner.act()
    assert failure.value.kind is FailureKind.CRASH and "Connection error" in str(failure.value)


def test_a_crashed_process_is_stopped_and_the_next_instance_starts_a_new_one():
    first, second = FakePrime(DIE), FakePrime(run(assistant("back")))
    sandbox = FakeSandbox(first, second)
    learner = PRIME.make_learner(cell(sandbox))
    learner.begin(VIEW)
    with pytest.raises(HarnessError):
        learner.act()
    assert ["prime-agent", "shutdown", "--force"] in sandbox.execs
    sent = len(first.sent)
    learner.end(False)  # a failed harness is left: the verdict is not sent, nothing waits on it
    assert not learner.open and len(first.sent) == sent
    learner.begin(VIEW)
    assert learner.act().text == "back" and len(sandbox.opened) == 2


def test_a_process_that_chose_another_model_is_refused():
    sandbox = FakeSandbox(FakePrime(model=("prime-intellect", "other")))
    learner = PRIME.make_learner(cell(sandbox))
    with pytest.raises(HarnessError, match="prime-intellect/other, not carc/m"):
        learner.begin(VIEW)


def test_a_wipe_stops_the_process_writes_the_config_and_starts_a_fresh_one():
    first, second = FakePrime(run(assistant("a")), run(assistant("ok"))), FakePrime(run(assistant("b")))
    sandbox = FakeSandbox(first, second)
    harness_cell = cell(sandbox)
    state, learner = PRIME.make_state(harness_cell), PRIME.make_learner(harness_cell)
    state.restore(None)
    assert json.loads(sandbox.files[f"{AGENT_DIR}/settings.json"])["defaultModel"] == "m"
    learner.begin(VIEW)
    learner.act()
    finish(learner)
    state.wipe()
    assert sandbox.execs[-2:] == [["prime-agent", "shutdown", "--force"], ["wipe"]] and not first.alive
    learner.begin(VIEW)
    assert learner.act().text == "b"
    assert second.commands()[:2] == ["get_state", "set_session_name"]  # its first session, no new_session


# --- logs ---------------------------------------------------------------------------------------

class LocalSandbox:
    """Runs the state's commands on this machine, /state mapped to a folder."""

    def __init__(self, root: Path):
        self.root = root

    def exec(self, cmd, input=None, cwd=None, env=None, timeout=None, user=None) -> ExecResult:
        mapped = [str(self.root) + a[len("/state"):] if a.startswith("/state") else a for a in cmd]
        proc = subprocess.run(mapped, capture_output=True, timeout=timeout)
        return ExecResult(proc.returncode, proc.stdout.replace(str(self.root).encode(), b"/state"), proc.stderr)


def test_logs_are_every_file_in_the_agent_log_folder_collected_incrementally(tmp_path):
    logs = tmp_path / "volume" / "prime" / "agent" / "logs"
    logs.mkdir(parents=True)
    (logs / "agent.jsonl").write_text('{"a": 1}\n')
    (logs / "daemon.sock.3bcb13c2.log").write_text("listening\n")
    state = prime_agent.PrimeAgentState(LocalSandbox(tmp_path / "volume"), logs=(f"{AGENT_DIR}/logs/agent.jsonl",))
    written = state.collect_logs(tmp_path / "out0")
    assert sorted(p.name for p in written) == ["state__prime__agent__logs__agent.jsonl",
                                               "state__prime__agent__logs__daemon.sock.3bcb13c2.log"]
    (logs / "worker-3bcb13c26170-3f0c5b68105a.sock.d4a413d8.log").write_text("worker\n")
    with open(logs / "agent.jsonl", "a") as handle:
        handle.write('{"b": 2}\n')
    written = state.collect_logs(tmp_path / "out1")
    assert {p.name: p.read_text() for p in written} == {
        "state__prime__agent__logs__agent.jsonl": '{"b": 2}\n',
        "state__prime__agent__logs__worker-3bcb13c26170-3f0c5b68105a.sock.d4a413d8.log": "worker\n"}


# --- the image's inputs -----------------------------------------------------------------------

def test_building_with_no_source_and_no_download_names_the_variable_and_the_commit(monkeypatch, tmp_path):
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    monkeypatch.setenv("CARC_CACHE", str(tmp_path))
    monkeypatch.setenv(URL_ENV, f"http://127.0.0.1:{closed_port()}/prime-agent.tar.gz")
    with pytest.raises(ImageBuildError) as failure:
        PRIME.recipe.inputs["prime-agent.tar"]()
    assert SOURCE_ENV in str(failure.value) and PRIME_AGENT_COMMIT in str(failure.value)
    assert "cannot download" in str(failure.value)
    monkeypatch.setenv(SOURCE_ENV, "/nonexistent/prime-agent.zip")
    with pytest.raises(ImageBuildError, match="not a directory or a .tar.gz"):
        PRIME.recipe.inputs["kernel-wheels"]()


def source_tree(root: Path, version: str = "0.8.0", name: str = "prime-agent") -> Path:
    (root / "packages" / "coding-agent").mkdir(parents=True)
    (root / "package.json").write_text(json.dumps({"name": "prime-agent", "version": version}))
    (root / "packages" / "coding-agent" / "package.json").write_text(json.dumps({"piConfig": {"name": name}}))
    return root


def test_a_source_of_another_version_or_commit_is_refused(tmp_path):
    good = source_tree(tmp_path / "good")
    check_source(good, PRIME_AGENT_COMMIT, good)
    check_source(good, None, good)  # a plain copy names no commit
    with pytest.raises(ImageBuildError, match="found prime-agent 0.7.4, need prime-agent 0.8.0"):
        check_source(source_tree(tmp_path / "old", "0.7.4"), None, tmp_path / "old")
    with pytest.raises(ImageBuildError, match="commit 8d7deeab5"):
        check_source(good, "8d7deeab5" + "0" * 31, good)
    with pytest.raises(ImageBuildError, match="no prime-agent source"):
        check_source(tmp_path, None, tmp_path)


def test_the_commit_is_read_from_a_git_archive_or_a_checkout(tmp_path):
    archive = tmp_path / "prime-agent.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": PRIME_AGENT_COMMIT}) as tar:
        data = b"{}"
        info = tarfile.TarInfo("prime-agent/package.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert source_commit(archive) == PRIME_AGENT_COMMIT
    git = tmp_path / "checkout" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text(f"# pack-refs\n{PRIME_AGENT_COMMIT} refs/heads/main\n")
    assert source_commit(tmp_path / "checkout") == PRIME_AGENT_COMMIT
    (git / "refs" / "heads" / "main").write_text("a" * 40 + "\n")
    assert source_commit(tmp_path / "checkout") == "a" * 40
    (git / "HEAD").write_text("b" * 40 + "\n")
    assert source_commit(tmp_path / "checkout") == "b" * 40
    assert source_commit(tmp_path) is None


def test_the_source_digest_ignores_installed_and_built_files(tmp_path):
    tree = source_tree(tmp_path / "src")
    before = source_digest(tree)
    for skipped in ("node_modules/x/index.js", "packages/ai/dist/index.js", ".git/HEAD"):
        (tree / skipped).parent.mkdir(parents=True, exist_ok=True)
        (tree / skipped).write_text("x")
    assert source_digest(tree) == before
    (tree / "packages" / "coding-agent" / "cli.ts").write_text("changed")
    assert source_digest(tree) != before


# --- the download when no source is supplied (a real HTTP server on 127.0.0.1, no Docker) --------

def git_archive_like(path: Path, top: str, files: dict[str, bytes], level: int = 9) -> Path:
    """A tarball as `git archive` writes one: a pax comment naming the commit, one top folder."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": PRIME_AGENT_COMMIT}) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode = len(data), 0o775 if name.endswith(".sh") else 0o664
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(raw.getvalue(), compresslevel=level, mtime=0))
    return path


class Served:
    """A folder served over HTTP on 127.0.0.1 in a thread; `requests` counts the GETs."""

    def __init__(self, folder: Path):
        served = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                served.requests += 1
                super().do_GET()

            def log_message(self, *args):
                pass

        self.requests = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def served(tmp_path):
    folder = tmp_path / "served"
    folder.mkdir()
    server = Served(folder)
    yield folder, server
    server.stop()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


FILES = {"package.json": b'{"version": "0.8.0"}', "scripts/build.sh": b"echo hi\n", "README.md": b"# pa\n"}


def test_the_files_digest_is_the_same_for_any_top_folder_and_compression_and_changes_with_a_file(tmp_path):
    ours = files_digest(git_archive_like(tmp_path / "a.tar.gz", "prime-agent", FILES))
    github_like = git_archive_like(tmp_path / "b.tar.gz", f"prime-agent-{PRIME_AGENT_COMMIT}", FILES, level=6)
    assert files_digest(github_like) == ours
    assert github_like.read_bytes() != (tmp_path / "a.tar.gz").read_bytes()
    changed = git_archive_like(tmp_path / "c.tar.gz", "prime-agent", {**FILES, "README.md": b"# pa!\n"})
    assert files_digest(changed) != ours


def test_a_download_whose_files_match_the_pinned_digest_is_used_and_kept_for_the_next_build(served, tmp_path):
    folder, server = served
    archive = git_archive_like(folder / "pa.tar.gz", f"prime-agent-{PRIME_AGENT_COMMIT}", FILES)
    expected = files_digest(archive)
    got = fetch_archive(server.url("pa.tar.gz"), expected, tmp_path / "cache")
    assert got == tmp_path / "cache" / f"{expected}.tar.gz" and got.read_bytes() == archive.read_bytes()
    server.stop()  # the second build finds it in the cache: no server needed, nothing downloaded
    assert fetch_archive(server.url("pa.tar.gz"), expected, tmp_path / "cache") == got
    assert server.requests == 1
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [got.name]


def test_a_download_with_another_digest_is_refused_naming_expected_and_actual(served, tmp_path):
    folder, server = served
    archive = git_archive_like(folder / "pa.tar.gz", "prime-agent", {**FILES, "README.md": b"tampered\n"})
    expected = files_digest(git_archive_like(tmp_path / "good.tar.gz", "prime-agent", FILES))
    with pytest.raises(ImageBuildError) as failure:
        fetch_archive(server.url("pa.tar.gz"), expected, tmp_path / "cache")
    message = str(failure.value)
    assert f"expected {expected}" in message and f"sha256 {files_digest(archive)}" in message
    assert "refused" in message and SOURCE_ENV in message
    assert list((tmp_path / "cache").iterdir()) == []  # nothing kept, nothing used


def test_a_download_that_is_not_a_tarball_or_not_there_says_so(served, tmp_path):
    folder, server = served
    (folder / "page.html").write_text("<html>rate limited</html>")
    with pytest.raises(ImageBuildError, match="did not give a .tar.gz"):
        fetch_archive(server.url("page.html"), "0" * 64, tmp_path / "cache")
    with pytest.raises(ImageBuildError, match="cannot download .*404"):
        fetch_archive(server.url("missing.tar.gz"), "0" * 64, tmp_path / "cache")
    down = f"http://127.0.0.1:{closed_port()}/pa.tar.gz"
    with pytest.raises(ImageBuildError, match=f"cannot download prime-agent's source from {down}: .*refused"):
        fetch_archive(down, "0" * 64, tmp_path / "cache")


VENDORED = os.environ.get(SOURCE_ENV, "")


@pytest.mark.skipif(not VENDORED.endswith(".tar.gz"), reason=f"set {SOURCE_ENV} to the `git archive` tarball "
                    f"of {PRIME_AGENT_COMMIT[:9]} (scripts/test.sh does, from ../shared/vendor/)")
def test_with_no_source_set_the_pinned_commits_archive_is_downloaded_verified_and_cached(served, tmp_path, monkeypatch):
    """The real prime-agent tarball, re-served under GitHub's archive name: the pinned digest is its files'."""
    folder, server = served
    name = f"{PRIME_AGENT_COMMIT}.tar.gz"
    (folder / name).write_bytes(Path(VENDORED).read_bytes())
    assert files_digest(folder / name) == ARCHIVE_FILES_SHA256
    monkeypatch.delenv(SOURCE_ENV)
    monkeypatch.setenv("CARC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(URL_ENV, server.url(name))
    first = supplied_source()
    assert first.read_bytes() == Path(VENDORED).read_bytes() and source_commit(first) == PRIME_AGENT_COMMIT
    assert supplied_source() == first and server.requests == 1


# --- live: the real prime-agent in its sandbox ------------------------------------------------

GRID = """\
name: prime-it
seed: 5
track: {{name: own, tasks: 2, visits: 2, epilogue: 0, fresh_reference: false}}
orders: [sequential]
model: {{endpoint: "{endpoint}", name: carc-scripted}}
efforts: [low]
learners:
  - prime-agent
  - {{learner: prime-agent, row: memory-off}}
  - {{learner: prime-agent, row: asked-to-store}}
  - {{learner: prime-agent, row: program-procedure}}
workers: 2
"""



def live(test):
    """A live test: Docker, slow, and the source prime-agent's image is built from."""
    for mark in (pytest.mark.docker, pytest.mark.slow, pytest.mark.skipif(
            not os.environ.get(SOURCE_ENV), reason=f"set {SOURCE_ENV} to a prime-agent checkout or source "
                                                   f".tar.gz at {PRIME_AGENT_COMMIT[:9]} to build its image")):
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from tests.docker_fixtures import run_scripted_grid
    return run_scripted_grid(tmp_path_factory.mktemp("prime"), "prime-it", GRID)


def cell_dir(run: Path, row: str) -> Path:
    name = "prime-agent" if row == "memory-on" else f"prime-agent-{row}"
    return run / "cells" / f"{name}.low.sequential.s5"


def chat_calls(folder: Path) -> list:
    from proxy.journal import read_journal
    return [e for e in read_journal(folder / "journal" / "journal.jsonl") if e.api == "openai-chat"]


def slot_tasks(folder: Path) -> dict[int, tuple[str, int]]:
    from orchestrator.records import read_events
    return {e.slot: (e.task, e.visit) for e in read_events(folder / "events.jsonl") if e.type == "instance_end"}


def first_calls(folder: Path) -> dict[int, Any]:
    firsts: dict[int, Any] = {}
    for entry in chat_calls(folder):
        if entry.slot is not None and entry.slot not in firsts:
            firsts[entry.slot] = entry
    return firsts


def user_texts(entry) -> list[str]:
    from solver_model.conversation import message_text
    return [message_text(m.get("content")) or "" for m in entry.request["messages"] if m.get("role") == "user"]


@live
@pytest.mark.parametrize("row", ["memory-on", "memory-off", "asked-to-store", "program-procedure"])
def test_live_every_instance_ends_once_without_learner_errors(run_dir, row):
    from orchestrator.records import read_events
    events = read_events(cell_dir(run_dir, row) / "events.jsonl")
    assert sorted(e.slot for e in events if e.type == "instance_end") == [0, 1, 2, 3]
    assert not [e.error for e in events if e.type == "learner_error"]


@live
def test_live_memory_on_brings_the_note_back_and_memory_off_never(run_dir):
    from harness_adapters.scripted_model import NOTE
    for row in ("memory-on", "memory-off"):
        folder = cell_dir(run_dir, row)
        firsts, tasks = first_calls(folder), slot_tasks(folder)
        for slot, (task, visit) in tasks.items():
            system = str(firsts[slot].request["messages"][0]["content"])  # the developer message
            assert (NOTE.format(task=task) in system) == (row == "memory-on" and visit > 0), (row, slot)


@live
def test_live_the_global_store_on_the_volume_holds_one_note_per_task(run_dir):
    def notes(folder: Path) -> list[str]:
        with tarfile.open(folder / "snapshots" / "00003.tar.gz") as tar:
            store = json.load(tar.extractfile("./prime/agent/harness/harness_state.json"))
        return sorted(entry["title"] for entry in store["entries"]["memory"].values())

    tasks = {task for task, _ in slot_tasks(cell_dir(run_dir, "memory-on")).values()}
    from harness_adapters.scripted_model import NOTE
    assert notes(cell_dir(run_dir, "memory-on")) == sorted(NOTE.format(task=t) for t in tasks)
    assert len(notes(cell_dir(run_dir, "memory-off"))) == 1


@live
def test_live_the_verdict_reaches_the_instances_session_and_effort_is_sent(run_dir):
    calls = chat_calls(cell_dir(run_dir, "memory-on"))
    after = [e for e in calls if e.phase == "after"]
    assert after and all(any("Task id:" in t for t in user_texts(e)) and any("Verdict:" in t for t in user_texts(e))
                         for e in after)
    assert {e.request.get("reasoning_effort") for e in calls if e.request.get("tools")} == {"low"}


@live
def test_live_the_ablation_messages_arrive_where_they_should(run_dir):
    prompts = PromptSet.load()
    invitation = prompts.render("store_invitation").strip()
    rules = prompts.render("program_procedure", programs_dir=PROGRAMS_DIR).strip()
    asked = chat_calls(cell_dir(run_dir, "asked-to-store"))
    assert any(invitation in user_texts(e)[-1] for e in asked if e.phase == "after")
    assert not any(invitation in t for e in asked if e.phase == "before" for t in user_texts(e))
    firsts = first_calls(cell_dir(run_dir, "program-procedure"))
    assert firsts and all(rules in user_texts(e)[0] for e in firsts.values())


@live
def test_live_the_agent_logs_are_collected_per_instance(run_dir):
    names = {p.name for p in (cell_dir(run_dir, "memory-on") / "logs" / "00000").iterdir()}
    assert "state__prime__agent__logs__agent.jsonl" in names
    assert any(n.startswith("state__prime__agent__logs__daemon.sock.") for n in names)



# prime-agent's own mapping of effort high (defaultThinkingLevel) on each API
# (docs/harnesses/prime-agent.md, "Model APIs")
PRIME_EFFORT = {
    "openai-chat": {"reasoning_effort": "high"},
    "openai-responses": {"reasoning": {"effort": "high", "summary": "auto"}},
    # high's 16384 leaves no room under the model's maxTokens (16384): pi-ai keeps 1024 for the answer
    # (packages/ai/src/providers/simple-options.ts:27-50)
    "anthropic-messages": {"thinking": {"type": "enabled", "budget_tokens": 16384 - 1024, "display": "summarized"}},
}


@pytest.fixture(scope="module")
def on_each_api(tmp_path_factory):
    """One prime-agent instance on each model API, the three runs side by side."""
    from tests.docker_fixtures import run_on_apis
    return run_on_apis(tmp_path_factory.mktemp("apis"), "prime-agent", list(PRIME_EFFORT))


@live
@pytest.mark.parametrize("api", list(PRIME_EFFORT))
def test_live_on_each_api_the_effort_reaches_the_wire_and_the_journal_counts_what_the_upstream_did(
        on_each_api, api):
    from tests.docker_fixtures import check_journal_against_upstream
    served, folder = on_each_api[api].result()
    calls = check_journal_against_upstream(folder, served, api)
    for entry in calls:
        for field, value in PRIME_EFFORT[api].items():
            assert entry.request.get(field) == value, (api, field, entry.request.get(field))
