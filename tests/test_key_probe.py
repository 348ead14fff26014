"""The key probe, end to end: a grid whose model quotes the API key back in all nine framings
(tests/key_echo.py), on the ladder (a host proxy per cell) and on a harness cell (hermes-agent
behind its proxy container). Real components: Docker, mitmproxy, the harness package.

Afterwards no file of the run (state volumes' snapshots, raw/ bodies, journals, transcripts, events,
logs) holds the key or any 12-character run of it, while the upstream did see the real key.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import uuid
from pathlib import Path

import pytest

from orchestrator.records import read_events
from proxy.journal import read_journal
from tests.key_echo import FRAMINGS, EchoingModel, key_runs

pytestmark = [pytest.mark.slow, pytest.mark.docker]

KEY_ENV = "CARC_TEST_ECHOED_KEY"
REAL_KEY = f"sk-probe-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}"

GRID = """\
name: key-probe
seed: 3
track: {{name: own, tasks: 2, visits: 2, epilogue: 0, fresh_reference: false}}
orders: [sequential]
model: {{endpoint: "{endpoint}", name: carc-scripted, api_key_env: CARC_TEST_ECHOED_KEY}}
efforts: [low]
learners: [stateless-floor, demo-cache-floor, hermes-agent]
workers: 2
"""


@pytest.fixture(scope="module")
def probed_run(tmp_path_factory):
    from harness_adapters.scripted_model import scripted_model_server
    from orchestrator.run.local_pool import execute
    from sandboxes.images import docker_client

    docker_client()
    model = EchoingModel()
    run = tmp_path_factory.mktemp("probe") / "runs" / "key-probe"
    (run / "cells").mkdir(parents=True)
    os.environ[KEY_ENV] = REAL_KEY
    try:
        with scripted_model_server(app=model.app()) as endpoint:
            (run / "grid.yaml").write_text(GRID.format(endpoint=endpoint))
            execute(run, show_progress=False)
    finally:
        os.environ.pop(KEY_ENV, None)
    return run, model


def readable(path: Path) -> list[bytes]:
    """A file's bytes, and what a reader gets out of it: gunzipped, and each member of a tar."""
    data = path.read_bytes()
    texts = [data]
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
            texts.append(data)
        except (OSError, EOFError):
            return texts
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is not None:
                    texts += readable_bytes(handle.read())
    except tarfile.TarError:
        pass
    return texts


def readable_bytes(data: bytes) -> list[bytes]:
    if data[:2] == b"\x1f\x8b":
        try:
            return [data, gzip.decompress(data)]
        except (OSError, EOFError):
            pass
    return [data]


def test_the_upstream_saw_the_real_key_and_served_every_framing(probed_run):
    run, model = probed_run
    assert set(model.served) == set(FRAMINGS), sorted(set(model.served))
    calls = [e for cell in (run / "cells").iterdir() for e in read_journal(cell / "journal" / "journal.jsonl")
             if e.api == "openai-chat"]
    # (hermes drops its background review's stream once it has what it needs: "Client disconnected")
    wrong = [(e.cell, e.status, e.error) for e in calls
             if e.status != 200 or e.error not in (None, "Client disconnected.")]
    assert len(calls) == len(model.served) and wrong == []


def test_no_file_of_the_run_holds_any_run_of_the_key(probed_run):
    run, _ = probed_run
    hits = {}
    files = [p for p in run.rglob("*") if p.is_file()]
    for path in files:
        found = key_runs(REAL_KEY, readable(path))
        if found:
            hits[str(path.relative_to(run))] = found[:3]
    assert hits == {}
    kinds = {p.relative_to(run).parts[2] for p in files if p.relative_to(run).parts[0] == "cells"
             and len(p.relative_to(run).parts) > 2}
    assert {"snapshots", "transcripts.jsonl.gz", "journal"} <= kinds, kinds  # what was scanned


def test_every_instance_ended_and_the_masked_echo_reached_the_learner(probed_run):
    run, _ = probed_run
    for cell in (run / "cells").iterdir():
        events = read_events(cell / "events.jsonl")
        assert len([e for e in events if e.type == "instance_end"]) == 4, cell.name
    transcripts = b"".join(gzip.decompress(p.read_bytes()) for p in run.glob("cells/*/transcripts.jsonl.gz"))
    assert b"<carc:redacted" in transcripts
