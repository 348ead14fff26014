"""What a cell kept, when, and by which mechanism: snapshots diffed in order, writes found in the journal.

Each snapshot (the volume after instance N) is compared with the one before. For every artifact
created, changed or deleted, the model calls between the two snapshots are searched for the
write tool call that carries the artifact's text or file name; the call's mechanism (agent turn,
background review, dreaming, flush, refinement...) and phase (before / after the verdict,
between instances) are the answer, and `evidence` says which call. Without such a call the
store's own record (e.g. `created_by`, an entry's `source`) or the file's mtime against the
verdict time is used, and `evidence` says so.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import pandas as pd

from stores_inspector.calls import Call, is_model_call, read_call
from stores_inspector.cell import InspectedCell, Instance
from stores_inspector.generic import file_diff
from stores_inspector.material import TaskMaterial
from stores_inspector.parser import Artifact, HarnessParser, strings
from stores_inspector.reading import Problems
from stores_inspector.volume import Volume, snapshot_paths

MAX_ATTRIBUTED = 5_000  # changes per snapshot searched for in the journal; the rest are listed only
SWEEP_GAP_S = 120.0  # calls of one dreaming sweep come within this many seconds of each other
TIMELINE_COLUMNS = ["cell", "slot", "task", "visit", "change", "kind", "artifact", "path", "mechanism", "when",
                    "when_from", "evidence", "names_task", "names_own_task", "named_by", "excerpt", "chars"]
FILE_COLUMNS = ["cell", "slot", "task", "visit", "path", "change", "size", "size_before", "mtime", "sort"]
RUN_COLUMNS = ["cell", "slot", "phase", "mechanism", "calls", "writes", "before_verdict", "t_start"]


def read_calls(records: InspectedCell, parser: HarnessParser) -> list[Call]:
    """Every model call of the cell, with its slot and the mechanism that made it."""
    calls = []
    for entry in records.journal:
        if is_model_call(entry):
            call = read_call(entry, records.call_slot(entry))
            call.mechanism = parser.mechanism(call)
            calls.append(call)
    return calls


def mechanism_runs(records: InspectedCell, parser: HarnessParser, calls: list[Call]) -> pd.DataFrame:
    """Background runs: a run opens with a new request and goes on through its tool loop;
    a sweep mechanism (dreaming) groups its calls within two minutes."""
    rows: list[dict[str, Any]] = []
    last: dict[str, dict[str, Any]] = {}
    for call in calls:
        if call.mechanism == "agent":
            continue
        run = last.get(call.mechanism)
        writes = sum(parser.writes(t) for t in call.tool_calls)
        joins = run is not None and run["slot"] == call.slot and (
            call.continues() or (call.mechanism in parser.sweeps and call.t - run["_t_last"] < SWEEP_GAP_S))
        if joins:
            run["calls"] += 1
            run["writes"] += writes
            run["_t_last"] = call.t
            continue
        run = {"cell": records.name, "slot": call.slot, "phase": call.phase, "mechanism": call.mechanism,
               "calls": 1, "writes": writes, "before_verdict": call.phase == "before", "t_start": call.t,
               "_t_last": call.t}
        rows.append(run)
        last[call.mechanism] = run
    return pd.DataFrame(rows, columns=RUN_COLUMNS + ["_t_last"]).drop(columns="_t_last")


def _needles(artifact: Artifact, deleted: bool) -> list[str]:
    """Short texts a write call for this artifact would carry: its first lines, its file name
    (not for a deletion: a write to the same file does not delete an entry)."""
    needles = []
    for line in artifact.text.splitlines():
        line = line.strip().strip("-*# ").strip()
        if len(line) >= 8 and not line.startswith(("---", "name:", "description:", "<!--")):
            needles.append(line[:60])
        if len(needles) == 2:
            break
    name = artifact.path.rsplit("/", 1)[-1]
    if artifact.kind in ("skill", "workshop skill"):
        name = artifact.path.rsplit("/", 2)[-2]
    if deleted:
        return needles
    if len(name) >= 6 and artifact.kind not in ("memory entry", "user-profile entry", "memory line", "promotion"):
        needles.append(name)
    elif artifact.kind == "memory line":
        needles.append("MEMORY.md")
    return needles


def _when_from_mtime(volume: Volume, artifact: Artifact, instance: Instance | None) -> str:
    info = volume.files.get(artifact.path)
    if info is None or instance is None:
        return "unknown"
    if instance.start_t and info.mtime < instance.start_t - 1:
        return "between"
    if instance.verdict_t is None:
        return "unknown"
    if info.mtime < instance.verdict_t - 1:
        return "before"
    return "after" if info.mtime > instance.verdict_t + 1 else "at the verdict (1 s)"


@dataclass
class Write:
    """A write tool call of the window, read once for every change it may explain."""

    call: Call
    tool: str
    texts: list[str]


def window_writes(candidates: list[Call], parser: HarnessParser) -> list[Write]:
    return [Write(call, parser.tool(tool).name, list(strings(parser.tool(tool).args)))
            for call in candidates for tool in call.tool_calls if parser.writes(tool)]


def attribute(artifact: Artifact, candidates: list[Call], writes: list[Write], parser: HarnessParser,
              volume: Volume, instance: Instance | None, first_snapshot: bool,
              deleted: bool) -> tuple[str, str, str, str]:
    """(mechanism, when, when_from, evidence) of one change; `writes` are the candidates' writes."""
    if deleted and instance is not None and instance.wiped_before:
        return "wipe", "between", "schedule", "carc empties the state before every instance of this row"
    needles = _needles(artifact, deleted)
    for write in writes:
        if any(n in t for n in needles for t in write.texts):
            call = write.call
            mechanism = "agent tool call" if call.mechanism == "agent" else call.mechanism
            return (mechanism, call.phase or "unknown", "journal", f"journal call {call.entry.id[:8]}: {write.tool}")
    when = "unknown" if deleted else _when_from_mtime(volume, artifact, instance)
    when_from = "unknown" if when == "unknown" else "mtime"
    known = parser.default_mechanism(artifact, first_snapshot)
    background = sorted({c.mechanism for c in candidates if c.mechanism != "agent"})
    if known:
        mechanism, evidence = known
    elif len(background) == 1:
        mechanism = background[0]
        evidence = f"inferred: no write call names it, and only {mechanism} ran in this window"
    else:
        return "unknown", when, when_from, "no write call in the journal names it"
    runs = [c for c in candidates if c.mechanism == mechanism]
    if runs and not deleted:  # the mechanism's own calls say when it ran, finer than an mtime
        return mechanism, runs[-1].phase or when, "journal", f"{evidence}; its calls: {runs[-1].entry.id[:8]}"
    return mechanism, when, when_from, evidence


def _changes(before: dict[str, Artifact], after: dict[str, Artifact], wiped: bool,
             complete: bool = True) -> list[tuple[str, Artifact]]:
    """(change, artifact) between two snapshots; after a wipe everything now there is new, and a
    snapshot not read whole (`complete` False) deletes nothing."""
    if wiped:
        return [("deleted", a) for a in before.values()] + [("created", a) for a in after.values()]
    return ([("created", a) for k, a in after.items() if k not in before]
            + [("changed", a) for k, a in after.items() if k in before and before[k].text != a.text]
            + [("deleted", a) for k, a in before.items() if complete and k not in after])


def build(records: InspectedCell, parser: HarnessParser, material: TaskMaterial, calls: list[Call],
          problems: Problems) -> tuple[pd.DataFrame, pd.DataFrame, Volume | None]:
    """(files, timeline, last volume) of a cell. Each snapshot's rows become a frame at once: a
    volume of 200,000 files would otherwise hold 200,000 row dicts per table until the end."""
    file_frames: list[pd.DataFrame] = []
    frames: list[pd.DataFrame] = []
    before: Volume | None = None
    artifacts_before: dict[str, Artifact] = {}
    window_start = float("-inf")
    times = [c.t for c in calls]  # the journal is in time order
    for slot, path in snapshot_paths(records.folder):
        volume = Volume.read(slot, path, problems)
        instance = records.instances.get(slot)
        task, visit = (instance.task, instance.visit) if instance else (None, None)
        window_end = instance.end_t if instance and instance.end_t else float("inf")
        candidates = calls[bisect.bisect_right(times, window_start):bisect.bisect_right(times, window_end)]
        file_rows = [{"cell": records.name, "slot": slot, "task": task, "visit": visit, **row}
                     for row in file_diff(before.files if before else {}, volume)]
        file_frames.append(pd.DataFrame(file_rows, columns=FILE_COLUMNS))
        del file_rows
        rows: list[dict[str, Any]] = []
        with problems.guard(f"snapshots/{path.name}", "artifacts could not be parsed"):
            artifacts = parser.kept(volume, problems)
            wiped = instance is not None and instance.wiped_before
            changes = _changes(artifacts_before, artifacts, wiped, volume.complete)
            writes = window_writes(candidates, parser)
            if len(changes) > MAX_ATTRIBUTED:
                problems.add(f"snapshots/{path.name}",
                             f"{len(changes):,} changes after this instance: the first {MAX_ATTRIBUTED:,} are "
                             "attributed to a mechanism, the rest are listed as 'not attributed'")
            for n, (change, artifact) in enumerate(changes):
                if n < MAX_ATTRIBUTED:
                    mechanism, when, when_from, evidence = attribute(
                        artifact, candidates, writes, parser, volume, instance, before is None or wiped,
                        change == "deleted")
                else:
                    mechanism, when, when_from, evidence = ("not attributed", "unknown", "unknown",
                                                            f"past the first {MAX_ATTRIBUTED:,} changes")
                named = material.named(artifact.text)
                first = next(iter(named), None)
                rows.append({"cell": records.name, "slot": slot, "task": task, "visit": visit,
                             "change": change, "kind": artifact.kind, "artifact": artifact.key,
                             "path": artifact.path, "mechanism": mechanism, "when": when,
                             "when_from": when_from, "evidence": evidence,
                             "names_task": ",".join(sorted(named)), "names_own_task": task in named,
                             "named_by": ",".join(sorted(set(named.values()))),
                             "excerpt": material.excerpt(artifact.text, first or "\0"),
                             "chars": len(artifact.text)})
            artifacts_before = artifacts
        frames.append(pd.DataFrame(rows, columns=TIMELINE_COLUMNS))
        before = volume
        window_start = window_end
    return _concat(file_frames, FILE_COLUMNS), _concat(frames, TIMELINE_COLUMNS), before


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    kept = [f for f in frames if not f.empty]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=columns)
