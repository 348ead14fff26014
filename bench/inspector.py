"""`carc inspect` on a cell whose harness wrote very many files: time and peak memory.

    python bench/inspector.py [--files 200000] [--slots 3] [--calls 20]

Writes a synthetic harness cell (the generic parser's `my-agent`): `--slots` snapshots of a state
volume holding `--files` small text notes (1 % of them rewritten after every instance), and a
journal of `--calls` model calls per instance, each writing a file through a `write_file` tool
call. Then runs the inspector on it and prints the time, peak resident memory, and the rows it
wrote. What the issue measured before the bounds: 200,000 files, 184 s and 1.5 GB.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402

from proxy.journal import JournalEntry  # noqa: E402
from stores_inspector.run import inspect_run  # noqa: E402

console = Console()
T0 = 1_700_000_000


def write_cell(root: Path, files: int, slots: int, calls: int) -> None:
    folder = root / "cells" / "my-agent.low.sequential.s0"
    (folder / "snapshots").mkdir(parents=True)
    (folder / "journal").mkdir()
    (folder / "cell.json").write_text(json.dumps({"cell": folder.name, "learner": "my-agent", "row": "memory-on"}))
    events, journal = [], []
    for slot in range(slots):
        event = {"cell": folder.name, "slot": slot, "phase": "stream", "task": f"task{slot % 3:04d}",
                 "visit": slot // 3, "exposure": slot // 3}
        start = T0 + slot * 100
        events += [{"type": "instance_start", "t": start, **event},
                   {"type": "step", "t": start + 50, "step": 0, "over": True, **event},
                   {"type": "instance_end", "t": start + 90, "status": "solved", "cost": 1, **event}]
        for call in range(calls):
            note = f"notes/{call}/{slot}-{call}.md"
            arguments = json.dumps({"path": note, "content": f"slot {slot} call {call}: kept what worked"})
            response = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{call}", "type": "function",
                 "function": {"name": "write_file", "arguments": arguments}}]}}]}
            journal.append(JournalEntry(
                id=f"{slot:05d}{call:05d}", cell=folder.name, slot=slot, phase="before", mode="reverse",
                method="POST", url="/v1/chat/completions", host="model", api="openai-chat", model="m",
                stream=False, status=200, refused=False,
                request={"messages": [{"role": "user", "content": f"instance {slot}"}]}, response=response,
                t_start=start + 1 + call, t_first_byte=None, t_end=start + 1.5 + call, latency_s=0.5).to_json())
        with tarfile.open(folder / "snapshots" / f"{slot:05d}.tar.gz", "w:gz", compresslevel=1) as tar:
            for i in range(files):
                data = f"note {i}, rewritten after slot {slot if i % 100 == 0 else 0}\n".encode()
                info = tarfile.TarInfo(f"./notes/{i // 1000}/{i}.md")
                info.size, info.mtime = len(data), start + 60
                tar.addfile(info, io.BytesIO(data))
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "journal" / "journal.jsonl").write_text("".join(line + "\n" for line in journal))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="carc-inspect-bench-") as tmp:
        root = Path(tmp)
        with console.status(f"writing {args.slots} snapshots of {args.files:,} files"):
            write_cell(root, args.files, args.slots, args.calls)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        inspect_run(root).write(None)
        took = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        timeline = sum(1 for _ in open(root / "inspect" / "timeline.csv", encoding="utf-8")) - 1
        files = sum(1 for _ in open(root / "inspect" / "files.csv", encoding="utf-8")) - 1
        problems = (root / "inspect" / "problems.csv").read_text(encoding="utf-8").strip().splitlines()[1:]
        console.print(f"{args.files:,} files x {args.slots} snapshots, {args.calls} calls per instance: "
                      f"{took:.1f} s ({took / args.slots:.1f} s per snapshot), peak RSS {peak / 1024:.0f} MB "
                      f"(before inspecting {rss_before / 1024:.0f} MB); {timeline:,} timeline rows, "
                      f"{files:,} file rows")
        for line in problems:
            console.print(f"  problem: {line[:200]}")


if __name__ == "__main__":
    main()
