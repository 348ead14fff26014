"""hermes-agent 0.19.0: memory entries, the skills tree and its usage file, state.db, reviews.

Store formats (docs/harnesses/hermes-agent.md): `memories/MEMORY.md` and `memories/USER.md`,
entries separated by "\\n§\\n"; `skills/[<category>/]<name>/SKILL.md` with references/,
templates/, scripts/, assets/; `skills/.usage.json` (`created_by: "agent"` only for skills the
background review made); `state.db` (SQLite, schema 22: sessions, messages); `logs/agent.log`.
The background review is a forked agent whose calls never reach state.db: the journal (its
last user message starts "Review the conversation above") and agent.log are its record.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.records import CellPaths
from stores_inspector.calls import ToolCall
from stores_inspector.parser import (NOISE, Artifact, HarnessParser, StoreContext, entries_by_occurrence,
                                     matches, shell_writes, strings)
from stores_inspector.reading import Problems, check_version, open_sqlite, query, read_json, tables
from stores_inspector.volume import Volume

SCHEMA_VERSIONS = {22}
ENTRY_SEPARATOR = "\n§\n"
REVIEW_MARKER = "Review the conversation above"
SKILL_FILE = re.compile(r"(?:^|/)skills/(.+?)/SKILL\.md$")
SUPPORT_DIRS = ("references", "templates", "scripts", "assets")
BLOCK = re.compile(r"═{5,}\n((?:MEMORY|USER PROFILE)[^\n]*?)\s*\[[^\]]*\]\n═{5,}\n(.*?)(?=\n\n|\n═{5,}|\Z)", re.S)
SKILLS = re.compile(r"<available_skills>.*?</available_skills>", re.S)


class Parser(HarnessParser):
    name = "hermes-agent"
    noise = NOISE + ("*/config.yaml", "*/SOUL.md", "*/.skills_prompt_snapshot.json", "*/.update_check",
                     "*/skills/.usage.json", "*/sessions/request_dump_*", "*/logs/*")
    lookup_tools = frozenset({"session_search", "skill_view", "skills_list"})
    write_tools = frozenset({"memory", "skill_manage"})
    background = {REVIEW_MARKER: "background review"}

    def artifacts(self, volume: Volume, problems: Problems) -> dict[str, Artifact]:
        out: dict[str, Artifact] = {}
        usage = _usage(volume)
        for path, text in volume.texts.items():
            if path.endswith("memories/MEMORY.md") or path.endswith("memories/USER.md"):
                kind = "memory entry" if path.endswith("MEMORY.md") else "user-profile entry"
                entries = [e.strip() for e in text.split(ENTRY_SEPARATOR) if e.strip()]
                out.update(entries_by_occurrence(entries, path.rsplit("/", 1)[-1], kind, path))
            elif skill := SKILL_FILE.search(path):
                name = skill.group(1)
                out[f"skill:{name}"] = Artifact(f"skill:{name}", "skill", path, text,
                                                {"created_by": _created_by(usage, name)})
            elif "/skills/" in f"/{path}" and any(f"/{d}/" in path for d in SUPPORT_DIRS):
                out[path] = Artifact(path, "skill file", path, text)
            elif "/pending/" in f"/{path}":
                out[path] = Artifact(path, "pending write", path, text)
            elif path.endswith("cron/jobs.json"):
                out[path] = Artifact(path, "cron job", path, text)
            elif not matches(path, self.noise):
                out[path] = Artifact(path, "file", path, text)
        return out

    def is_lookup(self, call: ToolCall) -> bool:
        if call.name in self.lookup_tools:
            return True
        if call.name in ("read_file", "search_files"):
            return self._touches_memory(call)
        if call.name in ("terminal", "execute_code"):
            return self._touches_memory(call) and not shell_writes(" ".join(strings(call.args)))
        return False

    def is_write(self, call: ToolCall) -> bool:
        if call.name in self.write_tools:
            return True
        if call.name in ("write_file", "patch"):
            return self._touches_memory(call)
        if call.name in ("terminal", "execute_code"):
            return self._touches_memory(call) and shell_writes(" ".join(strings(call.args)))
        return False

    def default_mechanism(self, artifact: Artifact, first_snapshot: bool) -> tuple[str, str] | None:
        if artifact.info.get("created_by") == "agent":
            return "background review", "skills/.usage.json created_by=agent"
        return None

    def digest(self, system: str) -> str | None:
        """The memory and user-profile blocks (without their fill gauge) and the skills index."""
        blocks = [f"{title.strip()}\n{body.strip()}" for title, body in BLOCK.findall(system)]
        blocks += SKILLS.findall(system)
        return "\n\n".join(blocks)

    def store_tables(self, volume: Volume | None, context: StoreContext) -> dict[str, pd.DataFrame]:
        out = {"hermes_reviews_log": _review_log(context)}
        if volume is None:
            return out
        out["hermes_skills"] = _skills(volume, context)
        db = next((p for p in volume.files if p.endswith("state.db")), None)
        if db is None:
            context.problems.add("state.db", "not in the last snapshot: no sessions table")
            return out
        volume.extract([db], context.workdir, context.problems)
        out["hermes_sessions"] = _sessions(Path(context.workdir) / db, db, context)
        return out

    def summary(self, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
        skills, log, returns = (tables.get(k, pd.DataFrame()) for k in
                                ("hermes_skills", "hermes_reviews_log", "returns"))
        out: dict[str, Any] = {}
        if not skills.empty:
            out["skills in the store"] = len(skills)
            out["skills naming a task"] = int((skills["names_task"] != "").sum())
            out["skill reference files"] = int(skills["support_files"].sum())
        if not log.empty:
            out["review runs in agent.log"] = int(log["review_runs"].sum())
        if not returns.empty and "lookups_any" in returns:
            back = returns[returns["returning"]]
            if len(back):
                loaded = back["lookups_any"].str.contains("skill_view").sum()
                out["returning instances that loaded a skill"] = f"{loaded} of {len(back)}"
        return out


def _usage(volume: Volume) -> dict[str, Any]:
    path = next((p for p in volume.texts if p.endswith("skills/.usage.json")), None)
    if path is None:
        return {}
    try:
        value = json.loads(volume.texts[path])
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _created_by(usage: dict[str, Any], name: str) -> str | None:
    record = usage.get(name) or usage.get(name.rsplit("/", 1)[-1]) or {}
    return record.get("created_by") if isinstance(record, dict) else None


def _skills(volume: Volume, context: StoreContext) -> pd.DataFrame:
    usage = _usage(volume)
    rows = []
    for path, text in volume.texts.items():
        skill = SKILL_FILE.search(path)
        if not skill:
            continue
        name = skill.group(1)
        folder = path.rsplit("/", 1)[0]
        support = [p for p in volume.files if p.startswith(folder + "/") and p != path]
        texts = text + "\n".join(volume.texts.get(p, "") for p in support)
        description = re.search(r"(?m)^description:\s*(.+)$", text)
        record = usage.get(name) or usage.get(name.rsplit("/", 1)[-1]) or {}
        record = record if isinstance(record, dict) else {}
        rows.append({"skill": name, "description": description.group(1).strip() if description else "",
                     "support_files": len(support), "created_by": record.get("created_by"),
                     "view_count": record.get("view_count"), "use_count": record.get("use_count"),
                     "patch_count": record.get("patch_count"),
                     "names_task": ",".join(sorted(context.material.named(texts)))})
    return pd.DataFrame(rows, columns=["skill", "description", "support_files", "created_by", "view_count",
                                       "use_count", "patch_count", "names_task"])


def _sessions(path: Path, where: str, context: StoreContext) -> pd.DataFrame:
    problems, records = context.problems, context.records
    columns = ["session", "slot", "started_at", "messages", "tool_calls", "tools", "skill_views", "end_reason"]
    with open_sqlite(path, where, problems) as db:
        if db is None:
            return pd.DataFrame(columns=columns)
        if "schema_version" in tables(db):
            versions = query(db, "select version from schema_version", where, problems)
            check_version(versions[0][0] if versions else None, SCHEMA_VERSIONS, where, problems)
        else:
            problems.add(where, "no schema_version table; read as schema 22")
        sessions = query(db, "select * from sessions order by started_at", where, problems)
        messages = query(db, "select session_id, tool_calls from messages where tool_calls is not null",
                         where, problems)
    tools: dict[str, Counter] = {}
    for message in messages:
        calls = read_json(message["tool_calls"], f"{where}:messages.tool_calls", problems) or []
        for call in calls if isinstance(calls, list) else []:
            name = ((call or {}).get("function") or {}).get("name") or (call or {}).get("name")
            tools.setdefault(message["session_id"], Counter())[name] += 1
    rows = []
    for session in sessions:
        keys = session.keys()
        used = tools.get(session["id"], Counter())
        started = session["started_at"] if "started_at" in keys else None
        rows.append({"session": session["id"], "slot": records.slot_at(started) if started else None,
                     "started_at": started,
                     "messages": session["message_count"] if "message_count" in keys else None,
                     "tool_calls": sum(used.values()),
                     "tools": ",".join(f"{k}:{v}" for k, v in sorted(used.items())),
                     "skill_views": used.get("skill_view", 0),
                     "end_reason": session["end_reason"] if "end_reason" in keys else None})
    return pd.DataFrame(rows, columns=columns)


def _review_log(context: StoreContext) -> pd.DataFrame:
    """Review runs per instance from the agent.log bytes collected after it."""
    rows = []
    for folder in sorted(CellPaths(context.records.folder).logs.glob("[0-9]*")):
        for log in folder.glob("*agent.log"):
            text = log.read_text(errors="replace")
            rows.append({"slot": int(folder.name),
                         "review_runs": len(re.findall(r"msg='Review the conversation above", text)),
                         "review_threads": len(set(re.findall(r"thread=bg-review:(\d+)", text)))})
    return pd.DataFrame(rows, columns=["slot", "review_runs", "review_threads"])
