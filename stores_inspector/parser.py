"""What every harness parser provides, and the lookup that picks one by harness name.

A parser turns a state volume into `Artifact`s (the units a harness keeps: a memory entry, a
skill, a note file, a store entry), recognises its harness's background mechanisms among the
journal's model calls, tells lookups and writes apart among tool calls, and pulls the digest
out of a system prompt. Anything it does not know falls to the file-level fallback.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import pandas as pd

from harness_adapters.registry import GENERIC_PARSER, learners, load
from stores_inspector.calls import Call, ToolCall
from stores_inspector.reading import Problems
from stores_inspector.volume import Volume

# bookkeeping in any volume: not something a learner kept
NOISE = ("*.log", "*.log.*", "*.lock", "*.pid", "*-wal", "*-shm", "*.sqlite", "*.db", "*.dill",
         "tmp/*", "*/tmp/*", "*/.cache/*", "*/cache/*", "*/.git/*", "*/__pycache__/*", "home/*")


@dataclass
class Artifact:
    """One unit a harness kept, with a key that stays the same while the unit exists."""

    key: str
    kind: str
    path: str
    text: str
    info: dict[str, Any] = field(default_factory=dict)


def short_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def strings(value: Any) -> Iterator[str]:
    """Every string inside a (JSON) value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


SHELL_WRITE = re.compile(r"(?<![0-9&>])>{1,2}(?!>|\s*(?:&|/dev/null))|\btee\b|\bcp\b|\bmv\b|\bsed\s+-i|"
                         r"open\([^)]*['\"][wa]|write_text|\.write\(")


# carc's own store for the program-procedure rows (harness_adapters.harness.PROGRAMS_DIR, on the
# state volume): the same for every harness, so the base class reads it, not each parser
PROGRAM_FILE = re.compile(r"(?:^|/)programs/[^/]+\.py$")
PROGRAM_MENTION = re.compile(r"(?:^|[\s'\"=/(])programs/[^\s'\"/]+\.py\b")
WRITE_NAME = re.compile(r"(?i)write|edit|patch|save|create")
# a lookup's result that says the file is not there carries nothing, even if it names the task
MISSING = re.compile(r"No such file|FileNotFoundError|ENOENT|does not exist|file not found", re.I)


def shell_writes(command: str) -> bool:
    """A shell or Python command that writes a file (redirect, tee, cp/mv, sed -i, open(..., 'w'))."""
    return bool(SHELL_WRITE.search(command))


def matches(path: str, patterns: tuple[str, ...]) -> bool:
    return _pattern(patterns).match(path) is not None


@functools.lru_cache(maxsize=64)
def _pattern(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """The shell patterns as one compiled regex: a volume of 200,000 files asks this per file."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns) or "(?!)")


def entries_by_occurrence(texts: list[str], prefix: str, kind: str, path: str) -> dict[str, Artifact]:
    """Artifacts keyed by text and occurrence, so a repeated line counts as a new entry."""
    seen: dict[str, int] = {}
    out = {}
    for text in texts:
        seen[text] = seen.get(text, 0) + 1
        key = f"{prefix}:{short_hash(text)}" + (f"#{seen[text]}" if seen[text] > 1 else "")
        out[key] = Artifact(key, kind, path, text)
    return out


class HarnessParser:
    """The base of every parser: one artifact per kept text file; parsers override what they know."""

    name = "generic"
    noise: tuple[str, ...] = NOISE
    lookup_tools: frozenset[str] = frozenset()
    write_tools: frozenset[str] = frozenset()
    memory_paths = re.compile(r"(?i)memor|notes?/|skills?/|harness")  # paths a lookup or write touches
    background: dict[str, str] = {}  # marker in a call's system prompt or last user message -> mechanism
    sweeps: frozenset[str] = frozenset()  # mechanisms whose calls within a minute form one run

    def artifacts(self, volume: Volume, problems: Problems) -> dict[str, Artifact]:
        """Every text file that is not bookkeeping, one artifact per file."""
        return {p: Artifact(p, "file", p, text) for p, text in volume.texts.items()
                if not matches(p, self.noise)}

    def kept(self, volume: Volume, problems: Problems) -> dict[str, Artifact]:
        """`artifacts` plus carc's program files (`programs/<task>.py`), which every harness row
        with the program procedure keeps the same way."""
        out = {k: a for k, a in self.artifacts(volume, problems).items() if not PROGRAM_FILE.search(a.path)}
        for path, text in volume.texts.items():
            if PROGRAM_FILE.search(path):
                out[path] = Artifact(path, "program file", path, text)
        return out

    def _program_call(self, call: ToolCall) -> tuple[bool, bool]:
        """(names a program file, writes it): a write tool, or a command that writes."""
        call = self.tool(call)
        texts = list(strings(call.args))
        if not any(PROGRAM_MENTION.search(t) for t in texts):
            return False, False
        return True, bool(WRITE_NAME.search(call.name)) or any(shell_writes(t) for t in texts)

    def looks_up(self, call: ToolCall) -> bool:
        """A lookup of kept material: the harness's own (`is_lookup`), or reading or running a
        program file."""
        names, writes = self._program_call(call)
        return self.is_lookup(call) or (names and not writes)

    def writes(self, call: ToolCall) -> bool:
        """A write of kept material: the harness's own (`is_write`), or writing a program file."""
        return self.is_write(call) or self._program_call(call)[1]

    def mechanism(self, call: Call) -> str:
        """Which mechanism made this call: "agent" for the harness's agent turn."""
        haystacks = (call.system(), call.trigger())
        for marker, mechanism in self.background.items():
            if any(marker in h for h in haystacks):
                return mechanism
        return "agent"

    def tool(self, call: ToolCall) -> ToolCall:
        """The tool actually called (harnesses that route tools through a dispatcher unwrap here)."""
        return call

    def _touches_memory(self, call: ToolCall) -> bool:
        return any(self.memory_paths.search(s) for s in strings(call.args))

    def is_lookup(self, call: ToolCall) -> bool:
        call = self.tool(call)
        return call.name in self.lookup_tools

    def is_write(self, call: ToolCall) -> bool:
        call = self.tool(call)
        return call.name in self.write_tools

    def default_mechanism(self, artifact: Artifact, first_snapshot: bool) -> tuple[str, str] | None:
        """(mechanism, evidence) the store itself records when no tool call wrote the artifact."""
        return None

    def digest(self, system: str) -> str | None:
        """The part of the system prompt that carries kept material (None: not this harness's)."""
        return None

    def digest_empty(self, digest: str) -> bool:
        """The digest carries no kept material (what a memory-off row sees)."""
        return not digest.strip()

    def describe(self, call: ToolCall) -> str:
        """A tool call in a few words for the tables: its name and first argument."""
        call = self.tool(call)
        first = next(strings(call.args), "")
        first = re.sub(r"\s+", " ", first).strip()
        return f"{call.name}({first[:40]}{'...' if len(first) > 40 else ''})" if first else call.name

    def store_tables(self, volume: Volume | None, context: "StoreContext") -> dict[str, pd.DataFrame]:
        """Harness-specific tables read from the last snapshot (and logs)."""
        return {}

    def summary(self, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
        """Harness-specific counts for the report, from this cell's tables."""
        return {}


@dataclass
class StoreContext:
    """What a parser may use besides the volume: the cell's records, task material, calls."""

    records: Any  # InspectedCell
    material: Any  # TaskMaterial
    calls: list[Call]
    problems: Any  # Problems
    workdir: Any  # a temp Path to unpack databases into


def parser_for(harness: str | None) -> HarnessParser:
    """The parser of a harness by name, as the registry (harness_adapters/learners.yaml) names
    it; the file-level fallback (generic.py) for anything else."""
    known = learners()
    target = known[harness].parser if harness in known else GENERIC_PARSER
    return load(target, f"{harness}: parser")()
