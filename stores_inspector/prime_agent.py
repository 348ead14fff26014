"""prime-agent v0.8.0: the global and per-session harness stores, refinements, session logs.

Store formats (../shared/harnesses/prime-agent.md, refinement.ts at e319a66):
`<agentDir>/harness/harness_state.json` (global) and
`<agentDir>/session-artifacts/<session id>/harness/harness_state.json` (one per session), each
`{"schema": 1, "entries": {"prompt"|"memory"|"skill"|"subagent": {id: entry}}, "refinements": [...]}`
with entry fields id, kind, title, content, path, scope, reference, arguments, metadata,
source ("agent" | "refine"), created_at, updated_at, version; `harness/refinements.jsonl`, the
global refinement history; `sessions/*.jsonl`, one session log per instance (header
`{"type":"session","id","rlmDepth"}`, then entries linked by id/parentId). The digest is the
system prompt's "# Continual Harness State" section.
"""

from __future__ import annotations

import json
import re
import statistics
from datetime import datetime
from typing import Any

import pandas as pd

from stores_inspector.calls import ToolCall
from stores_inspector.parser import NOISE, Artifact, HarnessParser, StoreContext, strings
from stores_inspector.reading import Problems, check_version, read_json, read_jsonl
from stores_inspector.volume import Volume

SCHEMAS = {1}
KINDS = ("prompt", "memory", "skill", "subagent")
KIND_LABEL = {"prompt": "prompt note", "memory": "memory", "skill": "skill", "subagent": "subagent spec"}
DIGEST = re.compile(r"^# Continual Harness State\n.*?(?=^# |\Z)", re.S | re.M)
EMPTY_DIGEST = "No saved harness entries yet."
VERDICT_OVER = re.compile(r"instance is over")
AUTO_REFINE_TURNS = 25
WRITES = re.compile(r"harness\.(create|update|delete)_|refine\.run\(")
READS = re.compile(r"harness\.(list|get|search|show|read)|harness_state\.json|sessions/|\.jsonl")


def _time(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return value / 1000 if value > 1e11 else float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _store_name(path: str) -> str | None:
    """"global", or the session id of a per-session store; None if not a store."""
    if not path.endswith("harness/harness_state.json"):
        return None
    match = re.search(r"session-artifacts/([^/]+)/harness/harness_state\.json$", path)
    return match.group(1) if match else "global"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _entries(state: Any) -> list[dict[str, Any]]:
    entries = state.get("entries") if isinstance(state, dict) else None
    entries = entries if isinstance(entries, dict) else {}
    out = []
    for kind in KINDS:
        by_id = entries.get(kind)
        for entry_id, entry in (by_id.items() if isinstance(by_id, dict) else ()):
            if isinstance(entry, dict):
                out.append({"kind": kind, **entry, "id": entry.get("id") or entry_id})
    return out


class Parser(HarnessParser):
    name = "prime-agent"
    noise = NOISE + ("*/sessions/*", "*/logs/*", "*kernel-state*", "*/models.json", "*/settings.json",
                     "*/auth.json", "*/refinements.jsonl")
    background = {"automatic /refine review gate": "refinement review",
                  "/refine continual harness subsystem": "refinement"}

    def _code(self, call: ToolCall) -> str:
        return " ".join(strings(call.args)) if call.name == "ipython" else ""

    def is_lookup(self, call: ToolCall) -> bool:
        code = self._code(call)
        return bool(READS.search(code)) and not WRITES.search(code)

    def is_write(self, call: ToolCall) -> bool:
        return bool(WRITES.search(self._code(call)))

    def artifacts(self, volume: Volume, problems: Problems) -> dict[str, Artifact]:
        out: dict[str, Artifact] = {}
        for path, text in volume.texts.items():
            store = _store_name(path)
            if store is None:
                continue
            state = read_json(text, f"snapshot {volume.slot}: {path}", problems)
            if isinstance(state, dict):
                check_version(state.get("schema"), SCHEMAS, path, problems)
            for entry in _entries(state):
                scope = entry.get("scope") or ("global" if store == "global" else "local")
                key = f"{store}:{entry['kind']}:{entry['id']}"
                body = "\n".join([str(entry.get("title") or ""), str(entry.get("content") or ""),
                                  json.dumps(entry.get("reference") or {}), json.dumps(entry.get("arguments") or {})])
                out[key] = Artifact(key, f"{KIND_LABEL.get(entry['kind'], entry['kind'])} entry ({scope})", path,
                                    body.strip(), {"source": entry.get("source"), "scope": scope,
                                                   "version": entry.get("version")})
            for event in (state or {}).get("refinements") or [] if isinstance(state, dict) else []:
                if isinstance(event, dict):
                    key = f"{store}:refinement:{event.get('id')}"
                    body = "\n".join(str(event.get(k) or "") for k in ("trigger", "evidence", "outcome"))
                    body += "\n" + "\n".join(map(str, event.get("changes") or []))
                    out[key] = Artifact(key, "refinement event", path, body.strip(), {"source": "refine"})
        return out

    def default_mechanism(self, artifact: Artifact, first_snapshot: bool) -> tuple[str, str] | None:
        source = artifact.info.get("source")
        if source == "refine":
            return "refinement", "store entry source=refine"
        if source == "agent":
            return "agent tool call", "store entry source=agent"
        return None

    def digest(self, system: str) -> str | None:
        match = DIGEST.search(system)
        return match.group(0).strip() if match else ""

    def digest_empty(self, digest: str) -> bool:
        return not digest.strip() or EMPTY_DIGEST in digest

    def store_tables(self, volume: Volume | None, context: StoreContext) -> dict[str, pd.DataFrame]:
        if volume is None:
            return {}
        return {"prime_entries": _entries_table(volume, context),
                "prime_refinements": _refinements_table(volume, context),
                "prime_sessions": _sessions_table(volume, context)}

    def summary(self, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        entries = tables.get("prime_entries", pd.DataFrame())
        if "prime_entries" in tables:
            out["global store exists"] = bool(len(entries) and (entries["store"] == "global").any())
            out["entries marked global"] = int((entries["scope"] == "global").sum()) if len(entries) else 0
            out["entries the agent wrote"] = int((entries["source"] == "agent").sum()) if len(entries) else 0
        refinements = tables.get("prime_refinements", pd.DataFrame())
        if "prime_refinements" in tables:
            out["refinements recorded in the stores and logs"] = len(refinements)
            if len(refinements):
                out["refinement edits applied"] = int(refinements["applied_edits"].sum())
                out["refinement edits to the session's own store"] = int(
                    refinements.loc[refinements["scope"] != "global", "applied_edits"].sum())
                out["refinements naming a task"] = int((refinements["names_task"] != "").sum())
        sessions = tables.get("prime_sessions", pd.DataFrame())
        if len(sessions):
            top = sessions[sessions["rlm_depth"] == 0]
            out["sessions"] = len(top)
            if len(top):
                out["median turns per session"] = statistics.median(top["turns"])
                out[f"sessions reaching {AUTO_REFINE_TURNS} turns"] = int((top["turns"] >= AUTO_REFINE_TURNS).sum())
                over = top[top["verdict_seen"]]
                out["instances with a tool call after the verdict"] = int((over["tool_calls_after_verdict"] > 0).sum())
                out["bare finishes after the verdict"] = f"{int(over['bare_finish'].sum())} of {len(over)}"
        return out


def _entries_table(volume: Volume, context: StoreContext) -> pd.DataFrame:
    rows = []
    for path, text in volume.texts.items():
        store = _store_name(path)
        if store is None:
            continue
        for entry in _entries(read_json(text, path, Problems(""))):
            body = f"{entry.get('title') or ''}\n{entry.get('content') or ''}"
            rows.append({"store": store, "scope": entry.get("scope") or ("global" if store == "global" else "local"),
                         "kind": entry["kind"], "id": entry["id"], "title": entry.get("title"),
                         "source": entry.get("source"), "version": entry.get("version"),
                         "created_at": entry.get("created_at"),
                         "slot": context.records.slot_at(_time(entry.get("created_at")) or 0),
                         "names_task": ",".join(sorted(context.material.named(body))),
                         "content": str(entry.get("content") or "")[:200]})
    return pd.DataFrame(rows, columns=["store", "scope", "kind", "id", "title", "source", "version", "created_at",
                                       "slot", "names_task", "content"])


def _refinements_table(volume: Volume, context: StoreContext) -> pd.DataFrame:
    """Every refinement once, from the stores' refinements[], the global history and the session logs."""
    found: dict[str, dict[str, Any]] = {}

    def add(event_id: Any, scope: str, record: str, text: str, edits: int | None, created: Any) -> None:
        row = found.setdefault(str(event_id), {"id": str(event_id), "scope": scope, "records": set(),
                                               "applied_edits": 0, "created_at": created, "text": ""})
        row["records"].add(record)
        row["text"] += "\n" + text
        if edits is not None:
            row["applied_edits"] = max(row["applied_edits"], edits)

    for path, text in volume.texts.items():
        store = _store_name(path)
        if store is not None:
            state = read_json(text, path, Problems(""))
            for event in state.get("refinements") or [] if isinstance(state, dict) else []:
                if isinstance(event, dict):
                    add(event.get("id"), "global" if store == "global" else "local", "store",
                        json.dumps(event), len(event.get("changes") or []), event.get("created_at"))
        elif path.endswith("harness/refinements.jsonl"):
            for result in read_jsonl(text, path, context.problems):
                if isinstance(result, dict):
                    applied = [e for e in _list(result.get("appliedEdits")) if isinstance(e, dict) and e.get("applied")]
                    add(result.get("id"), result.get("scope") or "global", "refinements.jsonl", json.dumps(result),
                        len(applied), None)
    for path, header, entries in _session_logs(volume, context):
        for entry in entries:
            if entry.get("type") == "custom" and entry.get("customType") == "prime-agent.refinement":
                data = entry.get("data") if isinstance(entry.get("data"), dict) else {}
                applied = [e for e in _list(data.get("appliedEdits")) if isinstance(e, dict) and e.get("applied")]
                add(data.get("id"), data.get("scope") or "local", "session log", json.dumps(data), len(applied),
                    entry.get("timestamp"))
    rows = []
    for row in found.values():
        created = _time(row["created_at"]) if row["created_at"] else None
        rows.append({"id": row["id"], "scope": row["scope"], "applied_edits": row["applied_edits"],
                     "created_at": row["created_at"],
                     "slot": context.records.slot_at(created) if created else None,
                     "records": ",".join(sorted(row["records"])),
                     "names_task": ",".join(sorted(context.material.named(row["text"])))})
    return pd.DataFrame(rows, columns=["id", "scope", "applied_edits", "created_at", "slot", "records",
                                       "names_task"])


def _session_logs(volume: Volume, context: StoreContext):
    """(path, header, entries) of every session log in the volume."""
    for path in volume.glob("*sessions/*.jsonl"):
        rows = read_jsonl(volume.texts.get(path), path, context.problems)
        header = next((r for r in rows if isinstance(r, dict) and r.get("type") == "session"), None)
        if header is None:
            context.problems.add(path, "no session header line; skipped")
            continue
        yield path, header, [r for r in rows if isinstance(r, dict) and r is not header]


def _active_branch(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries from the root to the last one, following parentId (a rewind leaves branches)."""
    by_id = {e["id"]: e for e in entries if isinstance(e.get("id"), str) and e["id"]}
    branch, current, seen = [], entries[-1] if entries else None, set()
    while current is not None and id(current) not in seen:  # a parentId cycle must not hang the inspector
        seen.add(id(current))
        branch.append(current)
        parent = current.get("parentId")
        current = by_id.get(parent) if isinstance(parent, str) else None
    return branch[::-1]


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")


def _sessions_table(volume: Volume, context: StoreContext) -> pd.DataFrame:
    rows = []
    for path, header, entries in _session_logs(volume, context):
        branch = [e for e in _active_branch(entries) if e.get("type") == "message"]
        turns = tool_calls = after = 0
        verdict_seen, bare = False, False
        first_after = None
        for entry in branch:
            message = entry.get("message") if isinstance(entry.get("message"), dict) else {}
            role = message.get("role")
            if role == "user" and VERDICT_OVER.search(_message_text(message)):
                verdict_seen = True
            if role != "assistant":
                continue
            turns += 1
            calls = [b for b in message.get("content") or [] if isinstance(b, dict) and b.get("type") == "toolCall"]
            tool_calls += len(calls)
            if verdict_seen:
                after += len(calls)
                if first_after is None:
                    first_after = message
        if first_after is not None:
            blocks = first_after.get("content") or []
            bare = all(isinstance(b, dict) and b.get("type") in ("text", "thinking") for b in blocks) \
                and first_after.get("stopReason") == "stop"
        started = _time(header.get("timestamp"))
        rows.append({"session": header.get("id"), "file": path.rsplit("/", 1)[-1],
                     "slot": context.records.slot_at(started) if started else None,
                     "rlm_depth": int(header.get("rlmDepth") or 0), "turns": turns, "tool_calls": tool_calls,
                     "verdict_seen": verdict_seen, "tool_calls_after_verdict": after, "bare_finish": bare,
                     "refinements": sum(1 for e in entries if e.get("customType") == "prime-agent.refinement")})
    return pd.DataFrame(rows, columns=["session", "file", "slot", "rlm_depth", "turns", "tool_calls", "verdict_seen",
                                       "tool_calls_after_verdict", "bare_finish", "refinements"])
