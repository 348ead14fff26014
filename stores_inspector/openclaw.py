"""openclaw 2026.9.6: MEMORY.md and memory/ notes, dreaming, the staging store, workshop skills.

Store formats (docs/harnesses/openclaw.md): the workspace (`workspace/MEMORY.md`, injected into
every new session's system prompt; `memory/*.md` notes and flush targets; `DREAMS.md`, the
diary; `memory/dreaming/{light,rem,deep}/` reports; `memory/.dreams/` session corpus),
`agents/<id>/agent/workshop-skills/<name>/SKILL.md`, `state/openclaw.sqlite` (plugin state: the
short-term staging store `memory-core/short-term-recall`, memory-file provenance) and
`agents/main/agent/openclaw-agent.sqlite` (`transcript_events`, JSON or zstd). Promotions are
MEMORY.md blocks under `<!-- openclaw-memory-promotion:KEY -->`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from stores_inspector.calls import ToolCall
from stores_inspector.parser import (Artifact, HarnessParser, StoreContext, entries_by_occurrence, matches,
                                     shell_writes, strings)
from stores_inspector.reading import Problems, check_version, decompress, open_sqlite, query, read_json, tables
from stores_inspector.volume import Volume

STATE_SCHEMAS, AGENT_SCHEMAS = {18}, {23}
PROMOTION = re.compile(r"^\s*<!--\s*openclaw-memory-promotion:([^\n]*?)\s*-->\s*$")
BOOTSTRAP = ("AGENTS.md", "SOUL.md", "IDENTITY.md", "USER.md", "BOOTSTRAP.md", "TOOLS.md", "HEARTBEAT.md")
MEMORY_SECTION = re.compile(r"^## \S*/MEMORY\.md\n(.*?)(?=^<!-- |^## |\Z)", re.S | re.M)
READS = re.compile(r"\b(cat|head|tail|less|grep|rg|sed|awk|ls|find)\b")


class Parser(HarnessParser):
    name = "openclaw"
    lookup_tools = frozenset({"memory_search", "memory_get", "sessions_search", "sessions_history",
                              "sessions_list"})
    write_tools = frozenset({"skill_workshop"})
    memory_paths = re.compile(r"MEMORY\.md|DREAMS\.md|memory/|skills?/")
    background = {"You are keeping a dream diary": "dreaming",
                  "Pre-compaction memory flush": "memory flush",
                  "Skill review. Distill new durable learning": "skill workshop review",
                  "You are a memory search agent": "active memory"}
    sweeps = frozenset({"dreaming"})

    def artifacts(self, volume: Volume, problems: Problems) -> dict[str, Artifact]:
        out: dict[str, Artifact] = {}
        for path, text in volume.texts.items():
            inside = path.split("workspace/", 1)[1] if "workspace/" in path else None
            if inside == "MEMORY.md":
                out.update(_memory_entries(path, text))
            elif inside == "DREAMS.md":
                out[path] = Artifact(path, "dream diary", path, text)
            elif inside is not None and inside.startswith("memory/dreaming/"):
                out[path] = Artifact(path, "dreaming report", path, text)
            elif inside is not None and inside.startswith("memory/.dreams/"):
                out[path] = Artifact(path, "dreaming corpus", path, text)
            elif inside is not None and inside.startswith("memory/"):
                out[path] = Artifact(path, "note", path, text)
            elif "/workshop-skills/" in path or path.startswith("skill-workshop/") or "/skill-workshop/" in path:
                kind = "workshop skill" if path.endswith("/SKILL.md") else "workshop file"
                out[path] = Artifact(path, kind, path, text)
            elif inside is not None and not matches(inside, (".git/*", "*.lock", ".openclaw/*")):
                kind = "skill" if inside.startswith("skills/") else "workspace file"
                out[path] = Artifact(path, kind, path, text)
        return out

    def tool(self, call: ToolCall) -> ToolCall:
        """Deferred tools are called through `tool_call {"id": name, "args": {...}}`."""
        if call.name == "tool_call" and isinstance(call.args, dict) and isinstance(call.args.get("id"), str):
            return ToolCall(call.args["id"], call.args.get("args") or {}, call.id)
        return call

    def is_lookup(self, call: ToolCall) -> bool:
        call = self.tool(call)
        if call.name in self.lookup_tools:
            return True
        if call.name in ("read", "ls"):
            return self._touches_memory(call)
        if call.name == "exec":
            command = " ".join(strings(call.args))
            return self._touches_memory(call) and bool(READS.search(command)) and not shell_writes(command)
        return False

    def is_write(self, call: ToolCall) -> bool:
        call = self.tool(call)
        if call.name in self.write_tools:
            return True
        if call.name in ("write", "edit", "apply_patch"):
            return self._touches_memory(call)
        if call.name == "exec":
            return self._touches_memory(call) and shell_writes(" ".join(strings(call.args)))
        return False

    def default_mechanism(self, artifact: Artifact, first_snapshot: bool) -> tuple[str, str] | None:
        if artifact.kind in ("dream diary", "dreaming report", "dreaming corpus", "promotion"):
            return "dreaming", f"{artifact.kind}: written only by memory-core dreaming"
        if artifact.kind.startswith("workshop"):
            return "skill workshop", "workshop-skills/ is written by the Skill Workshop"
        if first_snapshot and artifact.path.rsplit("/", 1)[-1] in BOOTSTRAP:
            return "setup", "openclaw seeds the workspace bootstrap files on first start"
        return None

    def digest(self, system: str) -> str | None:
        """The injected MEMORY.md ("" when the prompt carries none)."""
        return "\n".join(m.strip() for m in MEMORY_SECTION.findall(system))

    def store_tables(self, volume: Volume | None, context: StoreContext) -> dict[str, pd.DataFrame]:
        if volume is None:
            return {}
        workdir, problems = Path(context.workdir), context.problems
        state = next((p for p in volume.files if p.endswith("state/openclaw.sqlite")), None)
        agent = next((p for p in volume.files if p.endswith("agent/openclaw-agent.sqlite")), None)
        volume.extract([p for p in (state, agent) if p], workdir, problems)
        out = {}
        if state is None:
            problems.add("state/openclaw.sqlite", "not in the last snapshot: no staging store")
        else:
            out.update(_state_tables(workdir / state, state, context))
        if agent is None:
            problems.add("openclaw-agent.sqlite", "not in the last snapshot: no sessions table")
        else:
            out["openclaw_sessions"] = _sessions(workdir / agent, agent, context)
        return out

    def summary(self, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        staging = tables.get("openclaw_staging", pd.DataFrame())
        if not staging.empty:
            out["short-term staging entries"] = len(staging)
            out["best staging score"] = round(float(staging["max_score"].max()), 3)
            out["most recall signals"] = int(staging["recall_count"].max())
            out["most distinct queries"] = int(staging["unique_queries"].max())
            out["staging entries promoted"] = int(staging["promoted_at"].notna().sum())
        elif "openclaw_staging" in tables:
            out["short-term staging entries"] = 0
        timeline = tables.get("timeline", pd.DataFrame())
        if not timeline.empty:
            promotions = timeline[(timeline["kind"] == "promotion") & (timeline["change"] == "created")]
            out["promotions written to MEMORY.md"] = len(promotions)
            diary = timeline[timeline["kind"] == "dream diary"]
            if len(diary):
                out["diary names a task"] = bool((diary["names_task"] != "").any())
        sessions = tables.get("openclaw_sessions", pd.DataFrame())
        if not sessions.empty:
            tools = Counter()
            for text in sessions["tools"]:
                tools.update(_tool_counts(text))
            out["memory_search calls (transcripts)"] = tools.get("memory_search", 0)
        return out


def _epoch_ms(value: Any) -> float | None:
    """openclaw's created_at (epoch milliseconds) in seconds; None for a value of another shape."""
    try:
        return float(value) / 1000 if value else None
    except (TypeError, ValueError):
        return None


def _tool_counts(text: Any) -> Counter:
    """`name:count,...` of the sessions table back into counts (a name may itself hold , or :)."""
    counts: Counter = Counter()
    for piece in str(text or "").split(","):
        name, _, count = piece.rpartition(":")
        if name and count.isdigit():
            counts[name] += int(count)
    return counts


def _memory_entries(path: str, text: str) -> dict[str, Artifact]:
    """Promotion blocks by their key; every other content line as an entry."""
    out: dict[str, Artifact] = {}
    lines, current = [], None
    for line in text.splitlines():
        marker = PROMOTION.match(line)
        if marker:
            current = Artifact(f"promotion:{marker.group(1)}", "promotion", path, "")
            out[current.key] = current
        elif current is not None and line.strip():
            current.text += line + "\n"
        else:
            current = None
            if line.strip() and not line.lstrip().startswith(("#", "<!--")):
                lines.append(line.strip())
    out.update(entries_by_occurrence(lines, "MEMORY.md", "memory line", path))
    return out


def _schema(db, where: str, known: set[int], context: StoreContext) -> None:
    if "schema_meta" in tables(db):
        rows = query(db, "select schema_version from schema_meta where meta_key='primary'", where,
                     context.problems)
        check_version(rows[0][0] if rows else None, known, where, context.problems)


def _state_tables(path: Path, where: str, context: StoreContext) -> dict[str, pd.DataFrame]:
    problems, material = context.problems, context.material
    staging_rows, provenance_rows = [], []
    with open_sqlite(path, where, problems) as db:
        if db is None:
            return {}
        _schema(db, where, STATE_SCHEMAS, context)
        rows = query(db, "select plugin_id, namespace, entry_key, value_json from plugin_state_entries "
                         "where (plugin_id='memory-core' and namespace='short-term-recall') "
                         "or plugin_id='core:memory-artifact-provenance'", where, problems)
    for row in rows:
        value = read_json(row["value_json"], f"{where}:plugin_state_entries[{row['entry_key']}]", problems)
        if not isinstance(value, dict):
            continue
        if row["plugin_id"] == "memory-core":
            entries = value.get("entries") if isinstance(value.get("entries"), dict) else {row["entry_key"]: value}
            for key, entry in entries.items():
                if isinstance(entry, dict):
                    staging_rows.append(_staging_row(key, entry, material))
        else:
            session = value.get("sessionId") or value.get("session_id")
            provenance_rows.append({"entry": row["entry_key"], "path": value.get("path") or row["entry_key"],
                                    "session": session, "session_key": value.get("sessionKey"),
                                    "detail": json.dumps(value)[:300]})
    staging = pd.DataFrame(staging_rows, columns=["key", "path", "snippet", "recall_count", "daily_count",
                                                  "unique_queries", "max_score", "first_recalled",
                                                  "last_recalled", "promoted_at", "names_task"])
    return {"openclaw_staging": staging,
            "openclaw_provenance": pd.DataFrame(provenance_rows,
                                                columns=["entry", "path", "session", "session_key", "detail"])}


def _staging_row(key: str, entry: dict[str, Any], material) -> dict[str, Any]:
    snippet = entry.get("snippet") or ""
    return {"key": key, "path": entry.get("path"), "snippet": snippet[:200],
            "recall_count": int(entry.get("recallCount") or 0), "daily_count": int(entry.get("dailyCount") or 0),
            "unique_queries": len(entry.get("queryHashes") or []),
            "max_score": float(entry.get("maxScore") or 0.0),
            "first_recalled": entry.get("firstRecalledAt"), "last_recalled": entry.get("lastRecalledAt"),
            "promoted_at": entry.get("promotedAt"), "names_task": ",".join(sorted(material.named(snippet)))}


def _sessions(path: Path, where: str, context: StoreContext) -> pd.DataFrame:
    """One row per conversation: its session key, when it started, its messages and tool calls."""
    problems, records = context.problems, context.records
    columns = ["session", "session_key", "slot", "started_at", "messages", "tools"]
    with open_sqlite(path, where, problems) as db:
        if db is None:
            return pd.DataFrame(columns=columns)
        _schema(db, where, AGENT_SCHEMAS, context)
        keys = {r["session_id"]: r["session_key"] for r in
                query(db, "select session_id, session_key from session_windows", where, problems)}
        events = query(db, "select session_id, created_at, event_json, event_zstd from transcript_events "
                           "order by session_id, seq", where, problems)
    sessions: dict[str, dict[str, Any]] = {}
    for event in events:
        data = event["event_json"]
        if data is None and event["event_zstd"] is not None:
            raw = decompress(bytes(event["event_zstd"]), f"{where}:transcript_events", problems)
            data = raw.decode("utf-8", errors="replace") if raw is not None else None
        value = read_json(data, f"{where}:transcript_events", problems) if data else None
        row = sessions.setdefault(event["session_id"], {
            "session": event["session_id"], "session_key": keys.get(event["session_id"]),
            "started_at": _epoch_ms(event["created_at"]),
            "messages": 0, "tools": Counter()})
        message = (value or {}).get("message") if isinstance(value, dict) else None
        if not isinstance(message, dict):
            continue
        row["messages"] += 1
        for block in message.get("content") if isinstance(message.get("content"), list) else []:
            if isinstance(block, dict) and block.get("type") == "toolCall":
                name = str(block.get("name") or "")
                if name == "tool_call" and isinstance(block.get("arguments"), dict):
                    name = str(block["arguments"].get("id") or name)
                row["tools"][name] += 1
    out = []
    for row in sessions.values():
        row["slot"] = records.slot_at(row["started_at"]) if row["started_at"] else None
        row["tools"] = ",".join(f"{k}:{v}" for k, v in sorted(row["tools"].items()))
        out.append(row)
    return pd.DataFrame(out, columns=columns)
