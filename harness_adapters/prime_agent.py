"""prime-agent as a black-box learner: its RPC mode inside the sandbox, one session per instance.

prime-agent is not on npm or PyPI, so its image is built from a source checkout (or source
tarball) the user supplies in CARC_PRIME_AGENT_SOURCE, or else from GitHub's archive of the pinned
commit, downloaded once and checked against a pinned sha256: the host runs `npm ci --ignore-scripts` in
a copy and wheels the Python kernel's packages; the image build (offline) compiles and bundles
with the base image's Node 24. In the sandbox, one `prime-agent --mode rpc` process per cell
talks JSON lines on stdin/stdout; behind it prime-agent starts its own daemon and a worker that
runs the session. It runs for the whole cell and restarts after a wipe or restore (the state's
start hook) or after it failed; each instance is a `new_session`. Every model call goes through
the cell's proxy. Verified facts: docs/harnesses/prime-agent.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from harness_adapters.base import Turn
from harness_adapters.chat_model import Usage
from harness_adapters.harness import (ConversationHarness, FailureKind, HarnessAdapter, HarnessCell,
                                      HarnessError, HarnessState, Option)
from sandboxes.environment import LineProcess, Sandbox
from sandboxes.images import ImageBuildError, Recipe, cache_dir, require_fetching, run, wheelhouse

PRIME_AGENT_VERSION = "0.8.0"
PRIME_AGENT_COMMIT = "e319a66d7351c75abe7f040d02d9a8d6e25028e9"  # main on 2026-08-21, after v0.8.0
SOURCE_ENV = "CARC_PRIME_AGENT_SOURCE"
REPOSITORY = "https://github.com/PrimeIntellect-ai/prime-agent"

AGENT_DIR = "/state/prime/agent"        # PRIME_AGENT_CODING_AGENT_DIR: stores, settings, logs
SESSION_DIR = f"{AGENT_DIR}/sessions"   # PRIME_AGENT_SESSION_DIR
LOG_DIR = f"{AGENT_DIR}/logs"
WORK_DIR = "/state/work"                # the agent's cwd (its kernel's too)
TMP_DIR = "/tmp/prime"                  # tmpfs: the daemon socket is $TMPDIR/prime-agent-<uid>/
KERNEL_PYTHON = "/opt/prime-kernel/bin/python"
PROVIDER = "carc"
KEY_ENV = "OPENAI_API_KEY"              # the sandbox holds the placeholder; the proxy swaps the key
# carc's model API -> prime-agent's provider `api` (packages/ai/src/types.ts:6 KnownApi)
PROVIDER_APIS = {"openai-chat": "openai-completions", "openai-responses": "openai-responses",
                 "anthropic-messages": "anthropic-messages"}
START_TIMEOUT_S = 300.0
TURN_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 60.0

ENVIRONMENT = {
    "PRIME_AGENT_CODING_AGENT_DIR": AGENT_DIR, "PRIME_AGENT_SESSION_DIR": SESSION_DIR,
    "PRIME_AGENT_KERNEL_PYTHON": KERNEL_PYTHON, "TMPDIR": TMP_DIR,
    # no telemetry, no version check, no model catalog or package lookups at startup
    "PI_OFFLINE": "1", "DO_NOT_TRACK": "1", "PRIME_AGENT_TELEMETRY": "0", "PI_SKIP_VERSION_CHECK": "1",
}
LAUNCH = f"mkdir -p {TMP_DIR} {WORK_DIR} && cd {WORK_DIR} && exec prime-agent --mode rpc"
OPTIONS = (
    Option("context_window", int, 131072, "the model's context window in tokens"),
    Option("max_tokens", int, 16384, "the most tokens a reply may have"),
    Option("compat", dict[str, Any], {}, "models.json compat flags for servers lacking features "
                                         "(supportsDeveloperRole, ...)"),
    Option("auto_refine", dict[str, Any],
           {"enabled": True, "turnInterval": 25, "compact": True, "cooldownMs": 1_200_000},
           "settings.json autoRefine keys; the ones given replace the defaults one by one"),
)
DEFAULTS: dict[str, Any] = {o.name: o.default for o in OPTIONS}
ERROR_PATTERNS = (
    (r"ECONNREFUSED|ECONNRESET|fetch failed|Connection error|socket hang up", FailureKind.CRASH),
    (r"daemon .*(exited|not connected)|Failed to connect to the Prime Agent daemon", FailureKind.CRASH),
    (r"\boverloaded\b", FailureKind.RATE_LIMIT),
)
# prime-agent ends a run whose model connection is gone with `stopReason:"error", errorMessage:
# "Connection error."` (docs/harnesses/prime-agent.md), a HarnessError; should such text come as
# a reply, it is the same sign.
CONNECTION_ERROR_PATTERNS = (r"Connection error|ECONNREFUSED|ECONNRESET|fetch failed|socket hang up",)


# --- configuration on the state volume ----------------------------------------------------------

def _options(options: dict[str, Any] | None) -> dict[str, Any]:
    merged = PRIME.settings(options or {})
    merged["auto_refine"] = {**DEFAULTS["auto_refine"], **(options or {}).get("auto_refine", {})}
    return merged


def render_models(base_url: str, model: str, effort: str | None, options: dict[str, Any] | None = None,
                  api: str = "openai-chat") -> str:
    """models.json: the proxy as the only provider, speaking `api`; no effort = no reasoning."""
    opts = _options(options)
    entry: dict[str, Any] = {"id": model, "name": model, "reasoning": effort is not None, "input": ["text"],
                             "contextWindow": opts["context_window"], "maxTokens": opts["max_tokens"]}
    if opts["compat"]:
        entry["compat"] = opts["compat"]
    return json.dumps({"providers": {PROVIDER: {
        "baseUrl": base_url, "api": PROVIDER_APIS[api], "apiKey": KEY_ENV, "models": [entry]}}}, indent=2)


def render_settings(model: str, effort: str | None, options: dict[str, Any] | None = None) -> str:
    """settings.json: the proxy's model by default, automatic refinement on, telemetry off."""
    opts = _options(options)
    return json.dumps({
        "defaultProvider": PROVIDER, "defaultModel": model, "defaultThinkingLevel": effort or "off",
        "autoRefine": opts["auto_refine"], "telemetry": {"enabled": False},
        "quietStartup": True, "onboardingCompleted": True}, indent=2)


# --- the RPC protocol ---------------------------------------------------------------------------

class RpcClient:
    """prime-agent's `--mode rpc`: one JSON object per line each way (LF only). A command carries
    an `id` that its `response` echoes; a prompt's events stream until `agent_end`. Lines that are
    not protocol records are skipped (the last few kept for error messages)."""

    DIALOGS = ("select", "confirm", "input", "editor")

    def __init__(self, process: LineProcess, classify: Callable[[str], FailureKind]):
        self.process = process
        self.classify = classify
        self.sent = 0
        self.skipped: list[str] = []

    def _send(self, kind: str, **fields: Any) -> str:
        self.sent += 1
        request_id = f"carc-{self.sent}"
        try:
            self.process.send_line(json.dumps({"id": request_id, "type": kind, **fields}))
        except OSError as exc:
            raise HarnessError(FailureKind.CRASH, f"prime-agent is gone ({exc}): {self._stderr()}") from None
        return request_id

    def _stderr(self) -> str:
        return self.process.stderr.decode("utf-8", "replace")[-800:].strip()

    def _next(self, deadline: float, what: str) -> dict[str, Any]:
        """The next protocol record; HarnessError when the process ends or the deadline passes."""
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                line = self.process.read_line(remaining)
            except TimeoutError:
                raise HarnessError(FailureKind.TIMEOUT, f"prime-agent gave no answer while {what}") from None
            if line is None:
                stderr = self._stderr()
                noise = f"; its other output: {self.skipped}" if self.skipped else ""
                raise HarnessError(self.classify(stderr) if stderr else FailureKind.CRASH,
                                   f"prime-agent ended while {what}: {stderr or '(no stderr)'}{noise}")
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not (isinstance(record, dict) and isinstance(record.get("type"), str)):
                self.skipped = (self.skipped + [line[:200]])[-5:]
                continue
            if record["type"] == "extension_ui_request" and record.get("method") in self.DIALOGS:
                # nobody is there to answer: a dialog would block the run until its own timeout
                self.process.send_line(json.dumps({"type": "extension_ui_response", "id": record.get("id"),
                                                   "cancelled": True}))
                continue
            return record

    @staticmethod
    def _answers(record: dict[str, Any], request_id: str, kind: str) -> bool:
        """A response to this request: its id echoed, or (unknown command, unparsable line) none."""
        if record["type"] != "response":
            return False
        return record.get("id") == request_id or ("id" not in record and record.get("command") in (kind, "parse"))

    def _check(self, response: dict[str, Any], kind: str) -> dict[str, Any]:
        if not response.get("success"):
            error = str(response.get("error"))
            raise HarnessError(self.classify(error), f"prime-agent refused {kind}: {error[:500]}")
        return response.get("data") or {}

    def command(self, kind: str, timeout: float = TURN_TIMEOUT_S, **fields: Any) -> dict[str, Any]:
        """Send one command, return its response's `data` (events meanwhile are not ours)."""
        request_id = self._send(kind, **fields)
        deadline = time.monotonic() + timeout
        while True:
            record = self._next(deadline, f"waiting for {kind}")
            if self._answers(record, request_id, kind):
                return self._check(record, kind)

    def prompt(self, message: str, timeout: float = TURN_TIMEOUT_S) -> list[dict[str, Any]]:
        """One user message; the assistant messages of the run (their `message_end` events).

        `agent_end` alone does not end a run: an automatic retry (after a failed model call) or an
        overflow compaction continues it after `agent_end`, announced in the same tick. So once
        the prompt is answered and `agent_end` seen, a `get_state` probe is sent; the run is over
        when its answer comes with no new start in between and nothing streaming or compacting.
        """
        request_id = self._send("prompt", message=message)
        deadline = time.monotonic() + timeout
        answered = ended = False
        probe: str | None = None
        assistant: list[dict[str, Any]] = []
        while True:
            record = self._next(deadline, "answering")
            kind = record["type"]
            if self._answers(record, request_id, "prompt"):
                self._check(record, "prompt")
                answered = True
            elif probe and self._answers(record, probe, "get_state"):
                state, probe = self._check(record, "get_state"), None
                if ended and not (state.get("isStreaming") or state.get("isCompacting")):
                    return assistant
            elif kind == "message_end" and (record.get("message") or {}).get("role") == "assistant":
                assistant.append(record["message"])
            elif kind == "agent_end":
                ended = True
            elif kind in ("agent_start", "auto_retry_start") or (kind == "compaction_end" and record.get("willRetry")):
                ended = False
            if answered and ended and probe is None:
                probe = self._send("get_state")

    def close(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """End of input; wait at most `timeout` for the process to end (it may be hung)."""
        self.process.close(timeout)


def turn_usage(messages: list[dict[str, Any]], seconds: float) -> Usage:
    """A run's model calls and tokens (pi-ai's `input` excludes cached prompt tokens)."""
    prompt = completion = 0
    usd = 0.0
    for message in messages:
        usage = message.get("usage") or {}
        prompt += (usage.get("input") or 0) + (usage.get("cacheRead") or 0) + (usage.get("cacheWrite") or 0)
        completion += usage.get("output") or 0
        usd += (usage.get("cost") or {}).get("total") or 0.0
    return Usage(len(messages), prompt, completion, seconds, usd)


# --- the cell's prime-agent process and the learner ----------------------------------------------

class PrimeAgentProcess:
    """The cell's `prime-agent --mode rpc` (and the daemon it starts), shared by the state (start,
    stop) and the learner (conversations). One process for the cell: starting one costs a daemon,
    a worker and a kernel, and its sessions then only need `new_session`."""

    def __init__(self, sandbox: Sandbox, model: str, classify: Callable[[str], FailureKind]):
        self.sandbox = sandbox
        self.model = model
        self.classify = classify
        self.client: RpcClient | None = None
        self.used = False  # the current session has had a prompt

    def start(self) -> None:
        if self.client is not None:  # a process ended under it (recover): its socket goes too
            client, self.client = self.client, None
            try:
                client.close(timeout=0)
            except OSError:
                pass
        process = self.sandbox.open_process(["sh", "-c", LAUNCH], env=ENVIRONMENT)
        self.client = RpcClient(process, self.classify)
        state = self.call(lambda c: c.command("get_state", timeout=START_TIMEOUT_S))
        model = state.get("model") or {}
        if (model.get("provider"), model.get("id")) != (PROVIDER, self.model):
            self.stop()
            raise HarnessError(FailureKind.CRASH, f"prime-agent chose model {model.get('provider')}/"
                                                  f"{model.get('id')}, not {PROVIDER}/{self.model}: see "
                                                  f"{AGENT_DIR}/models.json and settings.json")
        self.used = False

    def stop(self) -> None:
        """The daemon and its workers stop (the used session was already disposed by
        end_session), which ends the RPC process too."""
        if self.client is None:
            return
        self.sandbox.exec(["prime-agent", "shutdown", "--force"], env=ENVIRONMENT, timeout=STOP_TIMEOUT_S)
        client, self.client = self.client, None
        try:
            client.close()
        except OSError:
            pass

    def call(self, action: Callable[[RpcClient], Any]) -> Any:
        """Run `action` on the client; after a crash or timeout the process is stopped (the next
        instance starts a new one), and the rest of this instance fails."""
        if self.client is None:
            raise HarnessError(FailureKind.CRASH, "prime-agent is not running (it failed earlier in this instance)")
        try:
            return action(self.client)
        except HarnessError as exc:
            if exc.kind in (FailureKind.CRASH, FailureKind.TIMEOUT):
                self.stop()
            raise

    def new_session(self, name: str) -> None:
        """A fresh, named session: the process's first (after a start) or a `new_session`."""
        if self.client is None:
            self.start()
        elif self.used:
            self.call(lambda c: c.command("new_session"))
        self.call(lambda c: c.command("set_session_name", name=name))
        self.used = True

    def end_session(self) -> None:
        """`new_session` disposes the used session: a refinement it triggered at its last
        `agent_end` completes and its kernel state is flushed before the runner's snapshot."""
        if self.client is not None and self.used:
            self.call(lambda c: c.command("new_session"))
            self.used = False


class PrimeAgent(ConversationHarness):
    """One prime-agent session per instance (conversation), all on the cell's one RPC process."""

    name = "prime-agent"

    def __init__(self, cell: HarnessCell, agent: PrimeAgentProcess):
        super().__init__(cell)
        self.agent = agent

    def open_conversation(self, session: str) -> None:
        self.agent.new_session(session)

    def send(self, message: str) -> Turn:
        started = time.monotonic()
        messages = self.agent.call(lambda c: c.prompt(message, timeout=self.seconds_left(TURN_TIMEOUT_S)))
        last = messages[-1] if messages else {}
        if last.get("stopReason") in ("error", "aborted"):
            error = str(last.get("errorMessage") or last["stopReason"])
            raise HarnessError(self.agent.classify(error), f"prime-agent's run failed: {error[:500]}")
        text = self.agent.call(lambda c: c.command("get_last_assistant_text")).get("text") or ""
        return Turn(text=text, usage=turn_usage(messages, time.monotonic() - started),
                    note={"prime_agent": {"assistant_messages": len(messages), "stop": last.get("stopReason")}})

    def close_conversation(self) -> None:
        self.agent.end_session()


class PrimeAgentState(HarnessState):
    """The state volume; its logs are every file in <agentDir>/logs (their names carry hashes)."""

    def collect_logs(self, dest: Path) -> list[Path]:
        listing = self.sandbox.exec(["find", LOG_DIR, "-maxdepth", "1", "-type", "f"], timeout=60)
        found = listing.stdout.decode("utf-8", "replace").split() if listing.ok else []
        self.logs = tuple(sorted({*self.logs, *found}))
        return super().collect_logs(dest)


def _agent(cell: HarnessCell) -> PrimeAgentProcess:
    if "prime-agent" not in cell.shared:
        cell.shared["prime-agent"] = PrimeAgentProcess(cell.sandbox, cell.model, PRIME.classify)
    return cell.shared["prime-agent"]


def _state(cell: HarnessCell) -> PrimeAgentState:
    agent = _agent(cell)
    files = {f"{AGENT_DIR}/models.json": render_models(cell.sandbox.reverse_base_url(), cell.model,
                                                       cell.effort, cell.options, cell.api),
             f"{AGENT_DIR}/settings.json": render_settings(cell.model, cell.effort, cell.options)}
    return PrimeAgentState(cell.sandbox, files, start=agent.start, stop=agent.stop,
                           logs=(f"{LOG_DIR}/agent.jsonl",))


# --- the image's inputs: the supplied source, installed and checked on the host -----------------

# With no source supplied, GitHub's archive of the pinned commit is downloaded (URL_ENV: a mirror of it).
ARCHIVE_URL = f"{REPOSITORY}/archive/{PRIME_AGENT_COMMIT}.tar.gz"
URL_ENV = "CARC_PRIME_AGENT_URL"
# The sha256 of the archive's files (`files_digest`), not of its bytes. GitHub generates the archive
# on request (top folder prime-agent-<commit>/, its own gzip), so no other archive of the commit
# has its bytes, and their digest could not be learnt where this was pinned (no GitHub access).
# Pinned from `git archive --prefix=prime-agent/ e319a66d7` (shared/vendor/prime-agent-e319a66d7.tar.gz,
# bytes sha256 bafedca67e983e88ad2ef6c6844014830ff0e3487951d1fdff3866631db4e5e7): git archive
# of the same commit writes the same files whatever the top folder and compression, so GitHub's
# archive should match; that has not been checked against GitHub itself.
ARCHIVE_FILES_SHA256 = "1b3f19520b002c8442d23e88909db89f67cc01c9b18980071e584790c92a36f6"
DOWNLOAD_TIMEOUT_S = 120.0


def files_digest(archive: Path) -> str:
    """The sha256 of a source tarball's files below its one top folder: each file's path, whether
    it is executable, and its bytes (a symlink's target), in path order. Directories, owners,
    times and the compression are left out, so every `git archive` of one commit gives one digest."""
    entries: list[tuple[str, bytes]] = []
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() or m.issym()]
        tops = {m.name.split("/", 1)[0] for m in members}
        strip = len(next(iter(tops))) + 1 if len(tops) == 1 and all("/" in m.name for m in members) else 0
        for member in members:
            if member.issym():
                content = b"l" + member.linkname.encode()
            else:
                handle = tar.extractfile(member)
                assert handle is not None  # a regular file always has content
                content = (b"x" if member.mode & 0o111 else b"-") + hashlib.file_digest(handle, "sha256").digest()
            entries.append((member.name[strip:], content))
    sha = hashlib.sha256()
    for name, content in sorted(entries):
        sha.update(name.encode() + b"\0" + content)
    return sha.hexdigest()


def fetch_archive(url: str, expected: str, folder: Path) -> Path:
    """The archive at `url` whose files have sha256 `expected`, kept as `folder/<expected>.tar.gz`
    (content-addressed: it is only renamed there once verified, so a later call downloads nothing)."""
    target = folder / f"{expected}.tar.gz"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    offline_fix = (f"without internet, set {SOURCE_ENV} to a checkout or .tar.gz of {REPOSITORY} "
                   f"at {PRIME_AGENT_COMMIT}")
    require_fetching(f"prime-agent's source archive ({url})")
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".part") as part:
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                shutil.copyfileobj(response, part)
            part.flush()
        except (urllib.error.URLError, OSError) as exc:
            reason = (f"HTTP {exc.code} {exc.reason}" if isinstance(exc, urllib.error.HTTPError)
                      else getattr(exc, "reason", None) or exc)
            raise ImageBuildError(f"cannot download prime-agent's source from {url}: {reason}; "
                                  f"{offline_fix}") from None
        try:
            actual = files_digest(Path(part.name))
        except (tarfile.TarError, OSError) as exc:
            raise ImageBuildError(f"{url} did not give a .tar.gz of prime-agent's source ({exc}); "
                                  f"{offline_fix}") from None
        if actual != expected:
            raise ImageBuildError(
                f"refused the prime-agent source downloaded from {url}: its files have sha256 {actual}, "
                f"expected {expected} (ARCHIVE_FILES_SHA256, the files of commit {PRIME_AGENT_COMMIT}); "
                f"nothing was used. Check {URL_ENV} if set, or {offline_fix}")
        os.chmod(part.name, 0o644)  # a cache entry like the others, not a private temporary file
        try:
            os.link(part.name, target)
        except FileExistsError:
            pass  # another build verified the same archive meanwhile
    return target


def supplied_source() -> Path:
    """The checkout or source tarball named by CARC_PRIME_AGENT_SOURCE; without it, the pinned
    commit's archive, downloaded (once) and verified."""
    raw = os.environ.get(SOURCE_ENV, "")
    if not raw:
        return fetch_archive(os.environ.get(URL_ENV) or ARCHIVE_URL, ARCHIVE_FILES_SHA256,
                             cache_dir() / "prime-agent" / "archives")
    path = Path(raw).expanduser().resolve()
    if not (path.is_dir() or (path.is_file() and path.name.endswith((".tar.gz", ".tgz")))):
        raise ImageBuildError(f"{SOURCE_ENV}={raw}: not a directory or a .tar.gz file")
    return path


SKIPPED = ("node_modules", "dist", ".git")  # build output and history: never part of the input


def source_digest(path: Path) -> str:
    """A tarball's bytes, or a checkout's files (minus SKIPPED)."""
    if path.is_file():
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()[:16]
    sha = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file() and not set(SKIPPED) & set(p.parts)):
        sha.update(f"{file.relative_to(path)}\0".encode() + file.read_bytes())
    return sha.hexdigest()[:16]


def source_commit(path: Path) -> str | None:
    """The commit a source names, if it does: a `git archive` tarball's pax comment, or a
    checkout's .git/HEAD (read as files: a detached hash or a loose or packed ref)."""
    if path.is_file():
        with tarfile.open(path) as tar:
            comment = tar.pax_headers.get("comment", "").strip()
        return comment if len(comment) == 40 else None
    git = path / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).exists():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(f" {ref}"):
                return line.split()[0]
    except OSError:
        return None
    return None


def check_source(tree: Path, commit: str | None, origin: Path) -> None:
    """The unpacked source is prime-agent at the pinned version and commit, or a message says not."""
    try:
        version = json.loads((tree / "package.json").read_text()).get("version")
        piconfig = json.loads((tree / "packages/coding-agent/package.json").read_text()).get("piConfig", {})
    except (OSError, ValueError):
        raise ImageBuildError(f"{SOURCE_ENV}={origin}: no prime-agent source there (package.json and "
                              f"packages/coding-agent/package.json expected at its top)") from None
    if piconfig.get("name") != "prime-agent" or version != PRIME_AGENT_VERSION:
        raise ImageBuildError(f"{SOURCE_ENV}={origin}: found {piconfig.get('name')} {version}, need prime-agent "
                              f"{PRIME_AGENT_VERSION} (commit {PRIME_AGENT_COMMIT})")
    if commit and commit != PRIME_AGENT_COMMIT:
        raise ImageBuildError(f"{SOURCE_ENV}={origin}: commit {commit}, the adapter is pinned to "
                              f"{PRIME_AGENT_COMMIT}; check that out (git checkout {PRIME_AGENT_COMMIT[:9]}) "
                              f"or change PRIME_AGENT_COMMIT after checking docs/harnesses/prime-agent.md")


def _unpack(source: Path, dest: Path) -> Path:
    """The source tree under `dest` (a tarball may hold it in one top folder)."""
    if source.is_dir():
        shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(*SKIPPED))
        return dest
    with tarfile.open(source) as tar:
        tar.extractall(dest, filter="data")
    entries = list(dest.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


@functools.cache
def prepared_source(source: Path) -> Path:
    """The source, checked, unpacked under the cache and packed with node_modules from the host's
    npm (`npm ci --ignore-scripts`: the lockfile's tree, no install scripts) into prime-agent.tar
    beside it; made once per source."""
    target = cache_dir() / "prime-agent" / f"{PRIME_AGENT_VERSION}-{source_digest(source)}"
    if (target / ".complete").exists():
        return target / "tree"
    if shutil.which("npm") is None:
        raise ImageBuildError("npm is needed on the host to install prime-agent's dependencies; "
                              "install it (apt-get install -y npm) or run scripts/docker-up.sh")
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        try:
            tree = _unpack(source, Path(tmp) / "unpacked")
            commit = source_commit(source)
        except (tarfile.TarError, OSError) as exc:
            raise ImageBuildError(f"{SOURCE_ENV}={source}: cannot unpack it: {exc}") from None
        check_source(tree, commit, source)
        run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"], cwd=tree,
            what=f"npm ci in a copy of {source}")
        work = Path(tmp) / "work"
        work.mkdir()
        tree.rename(work / "tree")
        run(["tar", "-C", str(work / "tree"), "-cf", str(work / "prime-agent.tar"), "."],
            what="packing the prime-agent tree")
        shutil.rmtree(work / "tree" / "node_modules")  # in the tar; the tree serves the kernel's wheels
        (work / ".complete").write_text(f"{source}\n")
        work.rename(target)
    return target / "tree"


def source_tar() -> Path:
    return prepared_source(supplied_source()).parent / "prime-agent.tar"


KERNEL_PACKAGES = ("ipykernel", "dill", "requests", "httpx", "pyyaml", "tomli", "python-dotenv", "pandas",
                   "numpy", "scipy", "beautifulsoup4", "lxml", "pydantic", "tyro",
                   "soupsieve<3")  # the offline base's Python is 3.11.2; soupsieve 3+ wants 3.11.5


def kernel_wheels() -> Path:
    """Wheels for the kernel: prime-agent-runtime and the Python skills (from the source) plus the
    packages prime-agent's own kernel setup installs (core/kernel/bootstrap.ts)."""
    tree = prepared_source(supplied_source())
    skills = sorted(str(p.parent) for p in (tree / "packages/coding-agent/skills").glob("*/pyproject.toml"))
    digest = tree.parent.name
    return wheelhouse(f"prime-agent-kernel-{digest}", (str(tree / "prime-agent-runtime"), *skills, *KERNEL_PACKAGES))


RECIPE = Recipe("prime-agent", Path(__file__).parent / "recipes" / "prime-agent", "base",
                {"PRIME_AGENT_VERSION": PRIME_AGENT_VERSION, "PRIME_AGENT_COMMIT": PRIME_AGENT_COMMIT},
                {"prime-agent.tar": source_tar, "kernel-wheels": kernel_wheels})

PRIME = HarnessAdapter(
    name="prime-agent", version=PRIME_AGENT_VERSION, recipe=RECIPE,
    make_state=_state, make_learner=lambda cell: PrimeAgent(cell, _agent(cell)),
    error_patterns=ERROR_PATTERNS, connection_error_patterns=CONNECTION_ERROR_PATTERNS, options=OPTIONS,
    docs="docs/harnesses/prime-agent.md",
    apis=tuple(PROVIDER_APIS))
