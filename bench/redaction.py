"""Benchmark: what masking the API key costs the proxy per answer (proxy/redact.py).

A proxy holding a real key reads every answer as a client would before passing it on: a JSON body
decoded and its strings searched, a stream parsed event by event into channels. This times both
on answers of a real size with no key in them (the usual case) and with the key quoted once, and
prints milliseconds per answer and MB/s.

    python bench/redaction.py [--repeat 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.redact import KeyMask, StreamRedactor, redact_body  # noqa: E402

KEY = "sk-proj-" + "Q7aYw3PzR1vL9kT2bN6cX0eD4fG8hJ" * 2


def body(kb: int, quote: bool) -> bytes:
    text = ("Here is the grid, row by row:\n[[0,1,2],[3,4,5]]\n" * (kb * 1024 // 48))[:kb * 1024]
    if quote:
        text = text[:len(text) // 2] + KEY + text[len(text) // 2:]
    return json.dumps({"id": "c", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}}]}).encode()


def stream(events: int, quote: bool) -> list[bytes]:
    words = ["The", " grid", " is", " [[0,", "1]]", "\n", " ok"] * (events // 7 + 1)
    if quote:
        words[events // 2] = KEY[:20]
        words[events // 2 + 1] = KEY[20:]
    chunks = [f"data: {json.dumps({'id': 'c', 'object': 'chat.completion.chunk', 'choices': [{'index': 0, 'delta': {'content': w}}]})}\n\n".encode()
              for w in words[:events]]
    return chunks + [b"data: [DONE]\n\n"]


def timed(fn, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    mask = KeyMask(KEY)
    print(f"{'answer':34} {'ms/answer':>10} {'MB/s':>8}")
    for kb in (4, 100, 1000):
        for quote in (False, True):
            data = body(kb, quote)
            ms = timed(lambda: redact_body(mask, data, False), args.repeat)
            print(f"{f'JSON body {kb} KB' + (', key quoted' if quote else ''):34} {ms:10.2f} {len(data) / ms / 1000:8.1f}")
    for events in (200, 2000):
        for quote in (False, True):
            chunks = stream(events, quote)
            size = sum(map(len, chunks))

            def run() -> None:
                redactor = StreamRedactor(mask)
                for chunk in chunks:
                    redactor.feed(chunk)
                redactor.flush()
            ms = timed(run, max(1, args.repeat // 5))
            print(f"{f'stream {events} events' + (', key quoted' if quote else ''):34} {ms:10.2f} {size / ms / 1000:8.1f}")


if __name__ == "__main__":
    main()
