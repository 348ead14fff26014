"""Did it come back: on each instance, what about its task reached the model before the first action.

Three questions per instance, from the journal's request and response bodies:
- reached: the instance's first agent call (system prompt, digest, injected memory, any earlier
  conversation) names the task, once the messages carc itself sent in this instance (task id,
  test input) are taken out. Only the first call counts: a harness may re-inject a note the
  agent has just written in this instance into later calls (openclaw rebuilds its prompt).
- looked: an agent call before the first action made a lookup tool call (memory search, a read
  of the memory files, a session search, a skill load, reading or running a program file);
  found: a lookup's result names the task (a "no such file" answer does not count).
- cost 0: the instance was answered with no demonstration bought and no wrong attempt.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pandas as pd

from stores_inspector.calls import Call
from stores_inspector.cell import InspectedCell, Instance
from stores_inspector.material import TaskMaterial
from stores_inspector.parser import MISSING, HarnessParser

COLUMNS = ["cell", "slot", "task", "visit", "returning", "reached", "reached_via", "reached_excerpt",
           "looked", "lookups", "found", "lookups_any", "digest", "digest_empty", "status", "cost", "cost0",
           "pairs_bought", "first_submit_demos"]
WHERE = {"system": "system prompt", "user": "user message (harness-added)", "assistant": "earlier conversation",
         "tool": "earlier tool result"}


def _strip_protocol(text: str, protocol: list[str], task: str) -> str:
    for sent in protocol:
        text = text.replace(sent, " ").replace(sent.strip(), " ")
    if not protocol:  # no transcript: at least drop carc's own task line
        text = re.sub(rf"(?m)^Task id: {re.escape(task)}\s*$", " ", text)
    return text


def _reached(first: Call, instance: Instance, protocol: list[str],
             material: TaskMaterial) -> tuple[bool, str, str]:
    for message in first.messages:
        text = _strip_protocol(message.text, protocol, instance.task)
        if instance.task in material.named(text):
            return True, WHERE.get(message.role, message.role), material.excerpt(text, instance.task)
        for tool in message.tool_calls:  # an earlier conversation's tool call arguments
            if instance.task in material.named(tool.arg_text()):
                return True, "earlier conversation", material.excerpt(tool.arg_text(), instance.task)
    return False, "", ""


def _lookup_results(calls: list[Call], parser: HarnessParser) -> list[str]:
    """Texts of tool results that answer lookup calls, in the requests of these calls."""
    results = []
    for call in calls:
        asked = {}
        for message in call.messages:
            for tool in message.tool_calls:
                asked[tool.id] = tool
            if message.role == "tool" and message.answers in asked and parser.looks_up(asked[message.answers]):
                results.append(message.text)
    return results


def build(records: InspectedCell, parser: HarnessParser, material: TaskMaterial,
          calls: list[Call]) -> pd.DataFrame:
    agent_calls: dict[int, list[Call]] = {}
    for call in calls:
        if call.mechanism == "agent" and call.entry.slot is not None:
            agent_calls.setdefault(call.entry.slot, []).append(call)
    rows: list[dict[str, Any]] = []
    for slot, instance in sorted(records.instances.items()):
        mine = agent_calls.get(slot, [])
        early = [c for c in mine if c.phase != "after"
                 and (instance.first_action_t is None or c.t < instance.first_action_t)]
        row: dict[str, Any] = {"cell": records.name, "slot": slot, "task": instance.task, "visit": instance.visit,
                               "returning": instance.returning, "status": instance.status, "cost": instance.cost,
                               "cost0": instance.cost == 0 if instance.cost is not None else None,
                               "pairs_bought": instance.demos_used,
                               "first_submit_demos": instance.first_submit_demos}
        protocol = records.protocol_texts(slot)
        reached, via, excerpt = _reached(early[0], instance, protocol, material) if early else (None, "", "")
        lookups = [parser.describe(t) for c in early for t in c.tool_calls if parser.looks_up(t)]
        found = any(instance.task in material.named(_strip_protocol(text, protocol, instance.task))
                    for text in _lookup_results(early, parser) if not MISSING.search(text))
        digest = parser.digest(early[0].system()) if early else None
        row.update({"reached": reached, "reached_via": via, "reached_excerpt": excerpt,
                    "looked": bool(lookups) if early else None, "lookups": ", ".join(lookups),
                    "found": found if early else None,
                    "lookups_any": ", ".join(parser.describe(t) for c in mine for t in c.tool_calls
                                             if parser.looks_up(t)),
                    "digest": hashlib.sha1(digest.encode()).hexdigest()[:10] if digest is not None else None,
                    "digest_empty": parser.digest_empty(digest) if digest is not None else None})
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)
