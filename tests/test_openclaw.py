"""openclaw, the real package in its real sandbox (gateway inside), through the real proxy, on
the scripted model.

The scripted model appends a note naming the task to the workspace's MEMORY.md with openclaw's
`exec` tool on every instance's first message; openclaw injects MEMORY.md into the system prompt
of every new session, so on a returning instance the note is back in the first request
(memory-on) or not (memory-off: the gateway is stopped, the volume emptied, a fresh start).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from harness_adapters.openclaw import DEFAULTS, render_config
from harness_adapters.scripted_model import NOTE
from orchestrator.records import read_events
from orchestrator.run.local_pool import execute
from proxy.journal import read_journal
from solver_model.conversation import message_text
from tests.docker_fixtures import check_journal_against_upstream, client, run_on_apis  # noqa: F401



def test_the_config_points_at_the_proxy_with_every_mechanism_on():
    config = json.loads(render_config("http://proxy:8081/v1", "m1", "high"))
    provider = config["models"]["providers"]["carc"]
    assert provider["baseUrl"] == "http://proxy:8081/v1" and provider["apiKey"] == "${OPENAI_API_KEY}"
    assert config["agents"]["defaults"]["model"]["primary"] == "carc/m1"
    assert config["agents"]["defaults"]["thinkingDefault"] == "high"
    dreaming = config["plugins"]["entries"]["memory-core"]["config"]["dreaming"]
    assert dreaming == {"enabled": True, "frequency": DEFAULTS["dreaming_frequency"]}
    assert config["memory"]["search"]["provider"] == "none"
    assert config["agents"]["defaults"]["compaction"]["memoryFlush"]["enabled"] is True
    assert config["skills"]["workshop"]["autonomous"]["mode"] == "auto"
    # the outside calls are off: update check, model catalog; no per-30-min heartbeat turns
    assert config["update"]["checkOnStart"] is False and config["models"]["catalogRefresh"]["enabled"] is False
    assert config["agents"]["defaults"]["heartbeat"]["every"] == "0m"
    assert config["logging"]["file"].startswith("/tmp/")


def test_options_are_checked_by_name():
    config = json.loads(render_config("http://p/v1", "m", None, {"dreaming_frequency": "*/5 * * * *"}))
    assert config["plugins"]["entries"]["memory-core"]["config"]["dreaming"]["frequency"] == "*/5 * * * *"
    with pytest.raises(ValueError, match="dreaming_frequncy"):
        render_config("http://p/v1", "m", None, {"dreaming_frequncy": "x"})


@pytest.fixture(scope="module")
def run_dir(scripted_harness_run):
    """openclaw's rows of the scripted harness grid (tests/conftest.py)."""
    return scripted_harness_run


def cell(run: Path, row: str) -> Path:
    name = "openclaw" if row == "memory-on" else f"openclaw-{row}"
    return run / "cells" / f"{name}.low.sequential.s5"


def chat_calls(cell_dir: Path):
    return [e for e in read_journal(cell_dir / "journal" / "journal.jsonl") if e.api == "openai-chat"]


def first_system_prompts(cell_dir: Path) -> dict[int, str]:
    firsts: dict[int, str] = {}
    for entry in chat_calls(cell_dir):
        if entry.slot is not None and entry.slot not in firsts:
            firsts[entry.slot] = str(entry.request["messages"][0]["content"])
    return firsts


def slot_tasks(cell_dir: Path) -> dict[int, tuple[str, int]]:
    return {e.slot: (e.task, e.visit) for e in read_events(cell_dir / "events.jsonl")
            if e.type == "instance_end"}



@pytest.mark.docker
@pytest.mark.slow
def test_every_instance_ends_once_without_learner_errors(run_dir):
    for row in ("memory-on", "memory-off", "asked-to-store"):
        events = read_events(cell(run_dir, row) / "events.jsonl")
        assert sorted(e.slot for e in events if e.type == "instance_end") == [0, 1, 2, 3], row
        assert not [e.error for e in events if e.type == "learner_error"], row


@pytest.mark.docker
@pytest.mark.slow
def test_memory_on_brings_the_note_back_on_a_returning_instance(run_dir):
    folder = cell(run_dir, "memory-on")
    firsts, tasks = first_system_prompts(folder), slot_tasks(folder)
    for slot, (task, visit) in tasks.items():
        assert (NOTE.format(task=task) in firsts[slot]) == (visit > 0), (slot, task, visit)


@pytest.mark.docker
@pytest.mark.slow
def test_memory_off_never_sees_a_note_and_keeps_only_the_current_one(run_dir):
    folder = cell(run_dir, "memory-off")
    assert all("carc-note" not in prompt for prompt in first_system_prompts(folder).values())
    with tarfile.open(folder / "snapshots" / "00003.tar.gz") as tar:
        memory = tar.extractfile("./openclaw/workspace/MEMORY.md").read().decode()
    assert memory.count("carc-note") == 1


@pytest.mark.docker
@pytest.mark.slow
def test_the_stores_are_on_the_volume_and_the_logs_are_collected(run_dir):
    folder = cell(run_dir, "memory-on")
    with tarfile.open(folder / "snapshots" / "00003.tar.gz") as tar:
        names = set(tar.getnames())
    for store in ("./openclaw/openclaw.json", "./openclaw/state/openclaw.sqlite",
                  "./openclaw/agents/main/agent/openclaw-agent.sqlite", "./openclaw/workspace/MEMORY.md"):
        assert store in names, store
    logs = sorted((folder / "logs").glob("*/*openclaw.log"))
    assert logs and "gateway" in logs[0].read_text(errors="replace")


@pytest.mark.docker
@pytest.mark.slow
def test_the_verdict_arrives_in_the_same_session_and_nothing_leaves_but_model_calls(run_dir):
    for row in ("memory-on", "asked-to-store"):
        journal = read_journal(cell(run_dir, row) / "journal" / "journal.jsonl")
        after = [e for e in journal if e.api == "openai-chat" and e.phase == "after"]
        assert after, f"{row}: no call after a verdict"
        for entry in after:
            texts = [str(m.get("content")) for m in entry.request["messages"]]
            assert any("Verdict:" in t for t in texts) and any("Task id:" in t for t in texts)
        # the update check and the model catalog are off: no refused (403) call to the outside
        assert not [e.url for e in journal if e.status == 403], row
    from orchestrator.prompts import PromptSet
    invitation = PromptSet.load().render("store_invitation").strip()
    asked = [e for e in chat_calls(cell(run_dir, "asked-to-store")) if e.phase == "after"]
    assert any(invitation in message_text(m.get("content")) for e in asked for m in e.request["messages"])


DREAM_GRID = """\
name: openclaw-dreaming
seed: 3
track: {name: own, tasks: 8, visits: 3, epilogue: 0, fresh_reference: false}
orders: [sequential]
model: {endpoint: embedded, name: carc-solver}
efforts: [low]
learners: [openclaw]
harness_options:
  openclaw: {dreaming_frequency: "* * * * *"}
workers: 1
"""


@pytest.fixture(scope="module")
def dreaming_run(client, tmp_path_factory):
    """24 instances on the embedded model (about 80 s) with dreaming every minute: openclaw's own
    cron fires inside the gateway while the stream runs, and snapshots are taken meanwhile."""
    run = tmp_path_factory.mktemp("dreaming") / "runs" / "openclaw-dreaming"
    (run / "cells").mkdir(parents=True)
    (run / "grid.yaml").write_text(DREAM_GRID)
    execute(run, show_progress=False)
    return run / "cells" / "openclaw.low.sequential.s3"


def diary_calls(cell_dir: Path):
    return [e for e in chat_calls(cell_dir) if not e.request.get("tools")
            and "dream diary" in message_text(e.request["messages"][0].get("content"))]


@pytest.mark.docker
@pytest.mark.slow
def test_dreaming_fires_during_the_stream_and_the_inspector_attributes_what_it_wrote(dreaming_run):
    from stores_inspector import inspect_run

    events = read_events(dreaming_run / "events.jsonl")
    assert sorted(e.slot for e in events if e.type == "instance_end") == list(range(24))
    assert diary_calls(dreaming_run), "no dreaming sweep reached the model"
    last = max(int(p.name.split(".")[0]) for p in (dreaming_run / "snapshots").glob("*.tar.gz"))
    with tarfile.open(dreaming_run / "snapshots" / f"{last:05d}.tar.gz") as tar:
        names = tar.getnames()
    assert "./openclaw/workspace/DREAMS.md" in names
    assert any(n.startswith("./openclaw/workspace/memory/.dreams/session-corpus/") for n in names)
    result = inspect_run(dreaming_run.parent.parent)
    runs = result.tables["runs"]
    assert (runs["mechanism"] == "dreaming").sum() >= 1
    timeline = result.tables["timeline"]
    assert {"dream diary", "dreaming corpus"} <= set(timeline[timeline["mechanism"] == "dreaming"]["kind"])


# openclaw's own mapping of effort high (thinkingDefault) on each API
# (docs/harnesses/openclaw.md, "Model APIs")
OPENCLAW_EFFORT = {
    "openai-chat": {"reasoning_effort": "high"},
    "openai-responses": {"reasoning": {"effort": "high", "summary": "auto"}},
    # high's 16384 does not fit under the model's maxTokens (16384, harness_options max_tokens):
    # openclaw keeps 1024 for the answer and thinks with the rest
    "anthropic-messages": {"thinking": {"type": "enabled", "budget_tokens": 16384 - 1024}},
}


@pytest.fixture(scope="module")
def on_each_api(client, tmp_path_factory):
    """One openclaw instance on each model API, the three runs side by side."""
    return run_on_apis(tmp_path_factory.mktemp("apis"), "openclaw", list(OPENCLAW_EFFORT))


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("api", list(OPENCLAW_EFFORT))
def test_on_each_api_the_effort_reaches_the_wire_and_the_journal_counts_what_the_upstream_did(
        on_each_api, api):
    served, folder = on_each_api[api].result()
    calls = check_journal_against_upstream(folder, served, api)
    for entry in calls:
        for field, value in OPENCLAW_EFFORT[api].items():
            assert entry.request.get(field) == value, (api, field, entry.request.get(field))


class _FlakyStartSandbox:
    """A sandbox whose gateway becomes ready only at the n-th start (openclaw under load misses
    its fixed 5 s state-lease window now and then): records every command run."""

    def __init__(self, ready_at: int):
        self.ready_at, self.starts, self.commands = ready_at, 0, []

    def exec(self, cmd, **_):
        from sandboxes.environment import ExecResult
        self.commands.append(" ".join(cmd))
        if cmd[:2] == ["python3", "/opt/carc/openclaw_helper.py"]:
            self.starts += 1
            return ExecResult(0 if self.starts >= self.ready_at else 1, b"", b"")
        return ExecResult(0, b"state lease heartbeat did not become ready", b"")


@pytest.mark.parametrize("ready_at, starts_ok", [(1, True), (3, True), (4, False)])
def test_a_gateway_that_does_not_start_is_stopped_and_started_again(ready_at, starts_ok):
    from harness_adapters.harness import HarnessError
    from harness_adapters.openclaw import START_ATTEMPTS, Gateway
    sandbox = _FlakyStartSandbox(ready_at)
    gateway = Gateway(sandbox, "token")
    if starts_ok:
        gateway.start()
    else:
        with pytest.raises(HarnessError, match=f"did not start.*after {START_ATTEMPTS} starts"):
            gateway.start()
    assert sandbox.starts == min(ready_at, START_ATTEMPTS)
    stops = [c for c in sandbox.commands if "kill -TERM" in c]
    assert len(stops) == min(ready_at, START_ATTEMPTS) - 1  # every failed start but the last is stopped first
