"""Security of a cell's sandbox, for real: Docker, the mitmproxy proxy container, a host upstream.

From inside the sandbox every direct connection fails (while the proxy, the positive control, is
reachable); the proxy refuses hosts that are not allowlisted and journals the refusal; the real
API key reaches the upstream but never the sandbox (environment, files, /proc).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import socket
import subprocess
import threading
import time
import uuid

import pytest
import uvicorn
from fastapi import FastAPI, Request

from proxy.journal import read_journal, write_slot
from sandboxes.docker_sandbox import PROXY_HOST, REGULAR_PORT, DockerSandbox, ProxySpec, SandboxSpec
from sandboxes.networks import host_address, ipv4_subnets, network_gateway
from tests.key_echo import FRAMINGS, echo_reply, key_runs, seen_by_client
from tests.docker_fixtures import base_image, client, proxy_image, run_id, _prune_at_end  # noqa: F401

pytestmark = pytest.mark.docker

KEY_ENV = "CARC_TEST_REAL_KEY"
REAL_KEY = f"sk-real-{uuid.uuid4().hex}"


def serve_upstream(client, **ssl):
    """A scripted model endpoint on the host's docker0 address; it reports whether it saw the key."""
    app = FastAPI()
    seen: list[dict] = []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        auth = request.headers.get("authorization", "")
        if str(body.get("model", "")).startswith("echo-"):  # a provider that quotes the key back
            return echo_reply(body["model"][len("echo-"):], auth)
        if body.get("model") == "hang":  # a provider still thinking when the proxy dies
            await asyncio.sleep(30)
        seen.append({"auth_is_real": auth == f"Bearer {REAL_KEY}", "model": body.get("model")})
        return {"id": "chatcmpl-1", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": '{"action": "demo"}'}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
                "saw_real_key": auth == f"Bearer {REAL_KEY}"}

    host = host_address(client)
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", **ssl))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield {"host": host, "port": port, "seen": seen}
    server.should_exit = True
    thread.join(5)


@pytest.fixture(scope="module")
def upstream(client):
    yield from serve_upstream(client)


@pytest.fixture(scope="module")
def tls_upstream(client, tmp_path_factory):
    """The same endpoint over HTTPS with a private certificate for host.docker.internal."""
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=host.docker.internal",
                    "-addext", "subjectAltName=DNS:host.docker.internal"],
                   check=True, capture_output=True)
    for endpoint in serve_upstream(client, ssl_keyfile=str(key), ssl_certfile=str(cert)):
        yield {**endpoint, "ca": cert}


@pytest.fixture(scope="module")
def cell(base_image, proxy_image, client, run_id, upstream, tmp_path_factory):
    os.environ[KEY_ENV] = REAL_KEY
    journal = tmp_path_factory.mktemp("journal")
    spec = SandboxSpec(base_image, run_id, "cell-security", proxy=ProxySpec(
        proxy_image, journal, f"http://host.docker.internal:{upstream['port']}/v1",
        key_env=KEY_ENV))
    box = DockerSandbox(spec, client).start()
    write_slot(journal / "slot.json", 4, "before")
    yield box, journal
    box.teardown()
    os.environ.pop(KEY_ENV, None)


PROBE = r"""
import json, socket, sys, concurrent.futures as cf
targets = json.loads(sys.argv[1])
def attempt(target):
    host, port = target
    try:
        socket.create_connection((host, port), timeout=3).close()
        return [host, port, "connected"]
    except OSError as exc:
        return [host, port, f"{type(exc).__name__}: {exc}"]
with cf.ThreadPoolExecutor(len(targets)) as pool:
    print(json.dumps(list(pool.map(attempt, targets))))
"""


def test_direct_connections_from_the_sandbox_all_fail_but_the_proxy_answers(cell, client, upstream):
    box, _ = cell
    box.network.reload()
    internal_first = str(next(ipv4_subnets(box.network.attrs)[0].hosts()))
    egress_gateway = network_gateway(client, "carc-egress")
    destinations = [
        ["1.1.1.1", 443], ["8.8.8.8", 53], ["93.184.216.34", 80],          # public
        ["10.0.0.1", 80], ["192.168.0.1", 80], ["172.16.0.1", 22],          # private ranges
        [upstream["host"], upstream["port"]],                               # the model host itself
        [egress_gateway, upstream["port"]], [internal_first, 22],           # host gateways
        ["169.254.169.254", 80],                                            # cloud metadata
        ["registry-1.docker.io", 443], ["ghcr.io", 443], ["pypi.org", 443],
        ["registry.npmjs.org", 443],                                        # registries by name
    ]
    result = box.exec(["python3", "-c", PROBE, json.dumps(destinations + [[PROXY_HOST, REGULAR_PORT]])],
                      timeout=60)
    outcomes = json.loads(result.stdout)
    control = outcomes.pop()
    assert control[2] == "connected", f"the positive control (the proxy) must answer: {control}"
    connected = [o for o in outcomes if o[2] == "connected"]
    print(f"\ndirect connections: {len(outcomes)} tried, {len(outcomes) - len(connected)} refused")
    for host, port, outcome in outcomes:
        print(f"  {host}:{port} -> {outcome}")
    assert len(outcomes) >= 10 and connected == []


def _through_proxy(box, url: str, method: str = "GET") -> str:
    code = (
        "import sys, urllib.request\n"
        f"req = urllib.request.Request({url!r}, method={method!r})\n"
        "try:\n"
        "    print(urllib.request.urlopen(req, timeout=20).status)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, e.read().decode()[:200])\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n")
    return box.exec(["python3", "-c", code], timeout=60).text()


def test_non_allowlisted_host_through_the_proxy_gets_403_and_a_journal_line(cell):
    box, journal = cell
    assert _through_proxy(box, "http://example.com/exfiltrate?x=1").startswith("403")
    assert "403" in _through_proxy(box, "https://pypi.org/simple/")  # CONNECT refused
    refused = [e for e in read_journal(journal / "journal.jsonl") if e.refused and e.mode != "dns"]
    hosts = {e.host for e in refused}
    assert {"example.com", "pypi.org"} <= hosts
    assert all(e.status == 403 and e.cell == "cell-security" for e in refused)


def test_nothing_the_harness_writes_in_tmp_survives_a_wipe(cell):
    """/tmp/carc (the proxy's CA) is kept by the wipe, so the harness must not be able to write
    there; everything else in /tmp and the volume goes."""
    box, _ = cell
    wrote = box.exec(["sh", "-c", "echo note > /tmp/carc/note; echo $?; echo note > /tmp/elsewhere; "
                      "mkdir -p /tmp/carc/sub 2>/dev/null; echo $?"]).text().split()
    assert wrote[0] != "0" and wrote[1] != "0", wrote
    assert box.read_file("/tmp/carc/ca.pem").startswith(b"-----BEGIN CERTIFICATE-----")
    box.wipe()
    left = box.exec(["sh", "-c", "ls -A /tmp /tmp/carc"]).text()
    assert "elsewhere" not in left and "note" not in left and "ca.pem" in left


LOOKUP = r"""
import json, socket, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = socket.getaddrinfo(name, 443, socket.AF_INET)[0][4][0]
    except socket.gaierror as exc:
        out[name] = exc.errno
print(json.dumps(out))
"""


def test_name_lookups_in_the_sandbox_are_refused_by_the_proxy_and_journaled(cell):
    """An outside name gets "no such name" from the proxy's DNS mode (EAI_NONAME), not a resolver
    timeout (EAI_AGAIN, 10 s, which is what Docker's resolver alone gives on an internal network),
    and the lookup is journaled as refused; the cell network's own name still resolves."""
    box, journal = cell
    name = f"exfil-{uuid.uuid4().hex[:12]}.example.org"
    result = box.exec(["python3", "-c", LOOKUP, name, PROXY_HOST], timeout=60)
    answers = json.loads(result.stdout)
    assert answers[name] == socket.EAI_NONAME, answers
    assert answers[PROXY_HOST] == box.proxy_address
    lookups = [e for e in read_journal(journal / "journal.jsonl") if e.mode == "dns" and e.host == name]
    assert lookups and all(e.refused and e.method == "DNS" and e.slot == 4 and e.phase == "before"
                           and e.cell == "cell-security" and "NXDOMAIN" in e.error for e in lookups)
    assert not [e for e in read_journal(journal / "journal.jsonl") if e.host == PROXY_HOST]


def test_model_call_through_the_reverse_proxy_reaches_upstream_with_the_real_key(cell, upstream):
    box, journal = cell
    code = (
        "import json, os, urllib.request\n"
        "body = json.dumps({'model': 'm1', 'messages': [{'role': 'user', 'content': 'hi'}]}).encode()\n"
        "req = urllib.request.Request('http://proxy:8081/v1/chat/completions', data=body, headers={\n"
        "    'content-type': 'application/json',\n"
        "    'authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
        "print(urllib.request.urlopen(req, timeout=20).read().decode())\n")
    answer = json.loads(box.exec(["python3", "-c", code], timeout=60).stdout)
    assert answer["saw_real_key"] is True
    assert upstream["seen"][-1] == {"auth_is_real": True, "model": "m1"}
    entry = [e for e in read_journal(journal / "journal.jsonl") if e.api == "openai-chat"][-1]
    assert (entry.slot, entry.phase, entry.status) == (4, "before", 200)
    assert (entry.prompt_tokens, entry.completion_tokens) == (11, 7)
    assert REAL_KEY not in (journal / "journal.jsonl").read_text()


def test_the_real_key_is_absent_from_the_sandbox_environment_files_and_proc(cell):
    box, _ = cell
    box.container.reload()
    assert not any(REAL_KEY in v for v in box.container.attrs["Config"]["Env"])
    assert box.exec(["sh", "-c", "echo $OPENAI_API_KEY"]).text().strip() == "carc-placeholder-key"
    box.exec(["sh", "-c", "nohup sleep 120 >/dev/null 2>&1 &"])
    box.write_file("/state/control-marker", "carc-control-marker-7f3a")

    def files_holding(text: str) -> list[str]:
        found = box.exec(["grep", "-rlsF", text, "/", "--exclude-dir=proc", "--exclude-dir=sys"],
                         timeout=120)
        return found.text().split()

    assert files_holding("carc-control-marker-7f3a") == ["/state/control-marker"]  # the search works
    assert files_holding(REAL_KEY) == []
    # The key goes in on stdin, so the scanning process's own command line does not hold it.
    scan = ("import glob, sys\nkey = sys.stdin.read().encode()\nhits = []\n"
            "for path in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
            "    try:\n        data = open(path, 'rb').read()\n    except OSError:\n        continue\n"
            "    hits += [path] if key in data else []\n"
            "print(len(glob.glob('/proc/[0-9]*/environ')), hits)")
    processes, hits = box.exec(["python3", "-c", scan], input=REAL_KEY).text().split(" ", 1)
    assert int(processes) >= 3 and hits.strip() == "[]"


ECHO_CLIENT = r"""
import base64, json, os, sys, urllib.request
got = {}
for framing in json.loads(sys.argv[1]):
    body = json.dumps({'model': 'echo-' + framing, 'messages': []}).encode()
    req = urllib.request.Request('http://proxy:8081/v1/chat/completions', data=body, headers={
        'content-type': 'application/json', 'accept-encoding': 'gzip',
        'authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})
    with urllib.request.urlopen(req, timeout=20) as answer:
        wire = answer.read()
        got[framing] = [answer.status, base64.b64encode(wire).decode(), str(answer.headers.items()),
                        answer.headers.get('content-encoding', '')]
    with open('/state/answer-' + framing, 'wb') as kept:  # as a harness keeps what it was told
        kept.write(wire)
print(json.dumps(got))
"""


def test_a_key_the_upstream_echoes_in_any_framing_never_reaches_the_sandbox(cell):
    """The container proxy masks the key in all nine framings (tests/key_echo.py): what the
    sandbox could decode from each answer, what it stored, and the journal hold no 12-character
    run of it."""
    import base64
    box, journal = cell
    result = box.exec(["python3", "-c", ECHO_CLIENT, json.dumps(FRAMINGS)], timeout=120)
    assert result.ok, result.stderr.decode()[-800:]
    got = json.loads(result.stdout)
    for framing, (status, wire, headers, encoding) in got.items():
        seen = seen_by_client(base64.b64decode(wire), headers, encoding)
        assert status == 200 and key_runs(REAL_KEY, seen) == [], framing
        assert any("<carc:redacted" in text for text in seen), framing
    stored = box.exec(["sh", "-c", "cat /state/answer-*"]).stdout
    assert stored and key_runs(REAL_KEY, [stored]) == []
    files = [(journal / "journal.jsonl").read_bytes()] + [
        gzip.decompress(p.read_bytes()) for p in (journal / "raw").iterdir()]
    assert key_runs(REAL_KEY, files) == []


def test_a_call_in_flight_when_the_proxy_container_is_killed_is_journaled_at_teardown(
        base_image, proxy_image, client, run_id, upstream, tmp_path):
    """`docker kill` of the proxy under a call: the addon never writes that call's line; the
    sandbox's teardown journals it from the marker the addon left, so the journal counts every
    call the upstream got."""
    os.environ[KEY_ENV] = REAL_KEY
    journal = tmp_path / "journal"
    spec = SandboxSpec(base_image, run_id, "cell-killed-proxy", proxy=ProxySpec(
        proxy_image, journal, f"http://host.docker.internal:{upstream['port']}/v1", key_env=KEY_ENV))
    box = DockerSandbox(spec, client).start()
    try:
        write_slot(journal / "slot.json", 3, "before")
        box.exec(["sh", "-c", "nohup python3 -c \"import json, urllib.request; urllib.request.urlopen("
                  "urllib.request.Request('http://proxy:8081/v1/chat/completions', data=json.dumps("
                  "{'model': 'hang', 'messages': []}).encode(), headers={'content-type': "
                  "'application/json'}), timeout=60)\" >/dev/null 2>&1 &"])
        marks, deadline = journal / "in-flight.jsonl", time.monotonic() + 30
        while '"begin"' not in (marks.read_text() if marks.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.05)  # until the call has passed the proxy and waits on the upstream
        assert '"begin"' in marks.read_text()
        box.proxy_container.kill()
        assert [e for e in read_journal(journal) if e.model == "hang"] == []
    finally:
        box.teardown()
        os.environ.pop(KEY_ENV, None)
    lost = [e for e in read_journal(journal) if e.model == "hang"]
    assert len(lost) == 1 and lost[0].slot == 3 and "in flight" in lost[0].error
    assert REAL_KEY not in (journal / "journal.jsonl").read_text()


def test_the_sandbox_trusts_the_proxy_ca_through_every_ca_variable(cell):
    box, _ = cell
    env = box.exec(["env"]).text()
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "PIP_CERT"):
        assert f"{name}=/tmp/carc/ca.pem" in env
    assert box.read_file("/tmp/carc/ca.pem") == box.proxy_ca()
    check = box.exec(["python3", "-c", "import ssl; c = ssl.create_default_context(); "
                      "print(len(c.get_ca_certs()))"]).text().strip()
    assert check == "1"


def test_https_through_connect_to_an_allowlisted_host_is_intercepted_and_trusted(
        base_image, proxy_image, client, run_id, tls_upstream, tmp_path):
    """The HTTPS_PROXY path: CONNECT, mitmproxy's certificate, trusted via SSL_CERT_FILE."""
    os.environ[KEY_ENV] = REAL_KEY
    origin = f"host.docker.internal:{tls_upstream['port']}"
    spec = SandboxSpec(base_image, run_id, "cell-https", proxy=ProxySpec(
        proxy_image, tmp_path / "journal", f"https://{origin}/v1", allow=(origin,),
        key_env=KEY_ENV, upstream_ca=tls_upstream["ca"]))
    try:
        with DockerSandbox(spec, client).start() as box:
            code = (
                "import json, os, urllib.request\n"
                "body = json.dumps({'model': 'm2', 'messages': []}).encode()\n"
                f"req = urllib.request.Request('https://{origin}/v1/chat/completions', data=body,\n"
                "    headers={'content-type': 'application/json',\n"
                "             'authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
                "print(urllib.request.urlopen(req, timeout=20).read().decode())\n")
            result = box.exec(["python3", "-c", code], timeout=60)
            assert result.ok, result.stderr.decode()[-800:]
            assert json.loads(result.stdout)["saw_real_key"] is True
            entries = read_journal(tmp_path / "journal" / "journal.jsonl")
            call = [e for e in entries if e.api == "openai-chat"][-1]
            assert (call.mode, call.status, call.model) == ("regular", 200, "m2")
            assert call.url.startswith("https://host.docker.internal")
    finally:
        os.environ.pop(KEY_ENV, None)


def test_a_proxy_that_exits_at_start_is_reported_with_its_log_and_leaves_nothing(
        base_image, proxy_image, client, run_id, tmp_path):
    """The start waits on the proxy's readiness file and asks the engine only whether it is
    still up: a proxy that dies at start is named with the tail of its own log, at once."""
    from sandboxes.environment import SandboxError
    spec = SandboxSpec(base_image, run_id, "cell-dead-proxy", proxy=ProxySpec(
        proxy_image, tmp_path / "journal", "http://host.docker.internal:99999/v1", key_env=KEY_ENV))
    started = time.monotonic()
    with pytest.raises(SandboxError, match="the proxy exited") as failure:
        DockerSandbox(spec, client).start()
    assert time.monotonic() - started < 60  # not the readiness deadline: the exit was seen
    assert "reverse" in str(failure.value).lower() or "invalid" in str(failure.value).lower()
    from sandboxes.docker_sandbox import LABEL_CELL
    left = client.containers.list(all=True, filters={"label": f"{LABEL_CELL}=cell-dead-proxy"})
    assert [c.name for c in left] == []
