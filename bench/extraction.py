"""Benchmark: `extract_action` on adversarial replies, to show its time grows linearly.

Prints, per reply shape, the seconds at n, 2n and 4n units and the ratio of each to the one
before (about 2 when linear; the old regex grew about 4x per doubling on unclosed fences); then
the seconds for a reply of 1.6 MB of fenced blocks (past the cap, `MAX_REPLY_CHARS`: refused
unread) and for the same blocks filling the cap (the most a reply can cost).

    python bench/extraction.py [--n 20000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from orchestrator.protocol import MAX_REPLY_CHARS, extract_action  # noqa: E402

SHAPES = {
    "unclosed fences ```{": lambda n: "```{" * n,
    "unclosed braces": lambda n: "{" * n + "}" * (n // 2),
    'nested {"":': lambda n: '{"":' * n,
    "strings holding braces": lambda n: '{"a":"x{' * n + "}" * n,
    'nested {"action":{': lambda n: '{"action":{' * n + "}" * n,
    "prose then an action": lambda n: "word " * n + '{"action": "request_demos"}',
}

FENCED_BLOCKS = {
    "object without action": '```json\n{"note": "' + "x" * 40 + '"}\n```\n',
    "broken action": '```json\n{"action": "submit", "grid": [[1,]]}\n```\n',
    "fence opening": "```{",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    sizes = (args.n, 2 * args.n, 4 * args.n)
    table = Table(title="extract_action: seconds per reply")
    table.add_column("shape")
    for n in sizes:
        table.add_column(f"n={n:,}", justify="right")
    table.add_column("ratios", justify="right")
    for name, make in SHAPES.items():
        times = []
        for n in sizes:
            text = make(n)
            started = time.perf_counter()
            extract_action(text)
            times.append(time.perf_counter() - started)
        ratios = " / ".join(f"{b / a:.1f}" for a, b in zip(times, times[1:]))
        table.add_row(name, *(f"{t:.3f}" for t in times), ratios)
    Console().print(table)
    capped = Table(title=f"extract_action: a reply of fenced blocks, past and at the cap ({MAX_REPLY_CHARS:,} characters)")
    for column in ("block", "characters", "seconds", "outcome"):
        capped.add_column(column)
    for name, block in FENCED_BLOCKS.items():
        for size in (1_600_000, MAX_REPLY_CHARS):
            text = block * (size // len(block))
            started = time.perf_counter()
            out = extract_action(text)
            capped.add_row(name, f"{len(text):,}", f"{time.perf_counter() - started:.3f}",
                           getattr(out, "reason", type(out).__name__)[:40])
    Console(width=140).print(capped)


if __name__ == "__main__":
    main()
