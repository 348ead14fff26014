"""The proxy's key redaction (proxy/redact.py), pure: what a client could read out of an answer
never holds the API key or any 12-character run of it, however the upstream frames it and
however the network cuts the stream. Judged by tests/key_echo.py's own reader, not the proxy's."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.redact import KeyLeak, KeyMask, StreamRedactor, redact_body
from tests.key_echo import chunk, escaped, event, key_runs, seen_by_client

KEY = "sk-proj-Q7aYw3PzR1vL9kT2bN6cX0eD4fG8hJ"
MASK = KeyMask(KEY)


def through(redactor: StreamRedactor, pieces: list[bytes]) -> tuple[bytes, list[bytes]]:
    """The stream as the client gets it, and what each piece let out at once."""
    outs = [redactor.feed(piece) for piece in pieces]
    return b"".join(outs) + redactor.flush(), outs


def split_stream() -> bytes:
    return (event(chunk({"role": "assistant", "content": "you sent Bearer sk-pr"}))
            + event(chunk({"content": "oj-Q7aYw3PzR1vL9kT2bN6cX0eD4fG8hJ and"}))
            + event(chunk({"content": " more é text"}))
            + event(chunk({"tool_calls": [{"index": 0, "id": "c", "type": "function",
                                           "function": {"name": "f", "arguments": "{\"a\": \"sk-proj-Q7a"}}]}))
            + event(chunk({"content": "interleaved"}))
            + event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "Yw3PzR1vL9kT2bN6cX0eD4fG8hJ\"}"}}]}))
            + event("[DONE]"))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0), max_size=12))
def test_a_key_split_across_deltas_is_masked_wherever_the_network_cuts_the_stream(cuts):
    stream = split_stream()
    points = sorted({c % (len(stream) + 1) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)])]
    out, _ = through(StreamRedactor(MASK), pieces)
    assert key_runs(KEY, seen_by_client(out)) == []
    assert out.count(b"\n\n") == stream.count(b"\n\n")  # every event passed, none merged or lost
    assert out.endswith(b"data: [DONE]\n\n")
    # the client's joined text keeps its length: the mask stands in for the key, char for char
    joined = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                     for line in out.decode().split("\n\n") if line.startswith("data: {"))
    assert joined == f"you sent Bearer {'<carc:redacted-key>' + '*' * (len(KEY) - 19)} and more é textinterleaved"


def test_events_with_nothing_of_the_key_pass_at_once():
    redactor = StreamRedactor(MASK)
    for word in ("Hello", " world", " again"):
        assert redactor.feed(event(chunk({"content": word}))) == event(chunk({"content": word}))


def test_a_tail_that_could_begin_the_key_waits_for_the_next_event_only():
    redactor = StreamRedactor(MASK)
    assert redactor.feed(event(chunk({"content": "token sk-pr"}))) == b""
    released = redactor.feed(event(chunk({"content": "ose is fine"})))
    assert b"sk-pr" in released and b"ose is fine" in released


def test_a_run_of_twelve_characters_of_the_key_is_masked_not_only_the_whole_key():
    partial = KEY[5:19]
    assert MASK.text(f"key ends in {partial}!") == f"key ends in {MASK.mask(len(partial))}!"
    assert MASK.text(KEY[5:16]) == KEY[5:16]  # eleven characters are not the key


@pytest.mark.parametrize("body", [
    json.dumps({"error": {"message": f"bad key {KEY}"}}),
    json.dumps({"m": "x"}).replace("x", escaped(f"Bearer {KEY}")),
    json.dumps({"tool": {"arguments": json.dumps({"k": KEY}).replace(KEY, escaped(KEY))}}),
    json.dumps({"nested": json.dumps({"deeper": json.dumps({"k": KEY})})}),
    f"plain text: {KEY}",
    f"a python repr: 'k\\x73-proj-Q7aYw3PzR1vL9kT2bN6cX0eD4fG8hJ'",
])
def test_a_whole_body_is_masked_in_every_form_a_client_decodes(body):
    masked = redact_body(MASK, body.encode(), event_stream=False)
    assert key_runs(KEY, seen_by_client(masked)) == []
    assert b"<carc:redacted" in masked or b"*" * 12 in masked


@pytest.mark.parametrize("body", ["k=" + "".join(f"%{ord(c):02x}" for c in KEY),
                                  "".join(f"&#{ord(c)};" for c in KEY)])
def test_a_body_that_spells_the_key_in_a_form_not_masked_in_place_is_withheld(body):
    with pytest.raises(KeyLeak):
        redact_body(MASK, body.encode(), event_stream=False)


def test_a_stream_that_spells_the_key_percent_encoded_is_cut_with_an_error_event():
    redactor = StreamRedactor(MASK)
    before = redactor.feed(event(chunk({"content": "fine"})))
    encoded = "".join(f"%{ord(c):02x}" for c in KEY)
    out = redactor.feed(event(chunk({"content": "k=" + encoded}))) + redactor.flush()
    assert b"fine" in before and b"carc_proxy_withheld" in out and encoded[:36].encode() not in out
    assert redactor.withheld and redactor.feed(event("[DONE]")) == b""


def test_a_compressed_stream_read_whole_is_masked_as_a_stream():
    masked = redact_body(MASK, split_stream(), event_stream=True)
    assert key_runs(KEY, seen_by_client(masked)) == []


def test_headers_and_raw_bytes_are_masked_by_run():
    assert MASK.bytes(f"x-echo: Bearer {KEY}".encode()) == f"x-echo: Bearer {MASK.mask(len(KEY))}".encode()
    assert MASK.bytes(b"nothing here") == b"nothing here"


def test_a_multibyte_character_cut_between_chunks_passes_whole():
    data = ("data: " + json.dumps(chunk({"content": "naïve ☃ text"}), ensure_ascii=False) + "\n\n").encode()
    cut = data.index("☃".encode()) + 1
    out, _ = through(StreamRedactor(MASK), [data[:cut], data[cut:]])
    assert out == data
