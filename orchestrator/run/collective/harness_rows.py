"""A collective grid's harness rows: each user's round in a sandbox of its own, and the curator.

Users. A harness row's user runs each round in a fresh sandbox (its container, proxy container,
network and state volume, named after the row and the user), its state restored from the user's
latest snapshot, its calls journaled into the user's own `journal/`. On the row `collective` the
round's shared library is copied into the sandbox at `SHARED_DIR` by the keeper, so the harness
reads it and cannot change it, and the instance's opening rules point to it (prompt
`shared_library`). The sandbox goes when the user's round ends: nothing of one user's sandbox ever
meets another user, and what a user keeps is its snapshots, as in a single-user cell.

Curator. Between rounds a curator session of the same harness rewrites the library: a sandbox of
its own behind its own journaling proxy (`shared/round-r/curator/journal/`), whose state volume
carries the curator's own memory from update to update (`curator-state.tar.gz`) and the library
at `library/`. It is fed a digest of the round, one conversation per task met (prompt
`curator_task`): how often the task was met and solved, the demonstration pairs the users bought
(read from their transcripts), and the passages of what the users kept (their state at the end of
the round) that mention the task. No test output of the records enters the digest: only what the
users were shown and what they chose to keep. The library is then read back from the curator's
snapshot: one regular file per task of the grid, `<task id>.py`, at most `LIBRARY_FILE_BYTES`
each, into `shared/round-r/library/` on the host; nothing the curator wrote is followed or
extracted anywhere else. The update's record counts the curator's calls and dollars; a curator
killed mid-update leaves its journal in `shared/round-r.aborted/attempt-N/` (its calls were made
and paid for), and the update is done again whole.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import structlog

from harness_adapters import registry
from harness_adapters.harness import SHARED_DIR, HarnessError
from harness_adapters.program_check import local_executor
from orchestrator.arc import grid_json
from orchestrator.prompts import PromptSet
from orchestrator.records import CellPaths, SandboxRecord, UserPaths, write_json
from orchestrator.rows import MEMORY_ON
from orchestrator.run.cell_services import CellServices, ControlFile, harness_spec, prepare_harness
from orchestrator.run.collective.training import InstanceRecord, RoundRecords
from orchestrator.run.grid_config import Cell, GridConfig
from sandboxes.engines import harness_engine
from proxy.host import CONTROL_FILE
from proxy.journal import read_journal

log = structlog.get_logger("carc.collective")

LIBRARY = "library"                      # in a round's shared folder and in the curator's volume
CURATOR = "curator"                      # the curator's journal and transcript, per update
CURATOR_STATE = "curator-state.tar.gz"   # the curator's volume after the update
LIBRARY_FILE_BYTES = 256 << 10
# The digest of a task: its pairs and the users' passages, each bounded.
DIGEST_PAIRS = 32
DIGEST_PASSAGES = 16
PASSAGE_LINES = 12
PASSAGE_CHARS = 2000
KEPT_FILE_BYTES = 1 << 20  # a kept file larger than this is not read for passages


# --- users ----------------------------------------------------------------------------------------

@contextmanager
def user_sandbox(grid: GridConfig, cell: Cell, paths: UserPaths, upstream: str,
                 library: Path | None) -> Iterator[CellServices]:
    """One user's sandbox for one round (the harness prepared on an empty volume: the runner
    restores the user's snapshot), with `library` copied in when the row reads one."""
    adapter = registry.adapter(cell.learner)
    spec = harness_spec(grid, cell, paths.run.root, f"{cell.cell}-u{paths.number:04d}", paths.journal, upstream)
    sandbox = harness_engine(grid.sandbox.engine).open(spec)
    try:
        ready = prepare_harness(sandbox, grid, cell, cell.row, PromptSet.load(grid.prompts))
        if library is not None:
            install_library(sandbox, library)
        SandboxRecord(proxy="container", model_base_url=sandbox.reverse_base_url(), upstream=upstream,
                      image=spec.image, container=sandbox.container.name, harness=adapter.name,
                      version=adapter.version).write(paths.sandbox)
        yield CellServices(sandbox.reverse_base_url(), ready.state, local_executor,
                           ControlFile(paths.journal / CONTROL_FILE), ready.learner,
                           infrastructure=[sandbox.fault])
    finally:
        sandbox.teardown()


def library_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if p.is_file() and not p.is_symlink()) if folder.is_dir() else []


def install_library(sandbox, folder: Path) -> None:
    """The library's files at SHARED_DIR, written by the keeper: readable, not writable, by the harness."""
    from sandboxes.docker_sandbox import KEEPER_USER

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in library_files(folder):
            info = tarfile.TarInfo(path.name)
            data = path.read_bytes()
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    result = sandbox.exec(["sh", "-c", 'rm -rf "$1" && mkdir -p "$1" && tar -x -C "$1" && chmod 755 "$1"',
                           "sh", SHARED_DIR], input=buffer.getvalue(), timeout=120, user=KEEPER_USER)
    if not result.ok:
        raise RuntimeError(f"{sandbox.name}: the shared library could not be copied to {SHARED_DIR}: "
                           f"{result.stderr.decode(errors='replace')[-300:]}")


# --- the digest of a round ------------------------------------------------------------------------

def transcript_messages(transcript: list) -> list[dict]:
    """A transcript as chat messages: a ladder learner's already is one; a harness's turns
    ({user, assistant}) become one user and one assistant message each."""
    if transcript and "role" not in transcript[0]:
        out = []
        for turn in transcript:
            out.append({"role": "user", "content": str(turn.get("user", ""))})
            out.append({"role": "assistant", "content": str(turn.get("assistant", ""))})
        return out
    return transcript


def kept_passages(snapshot: Path, tasks: set[str]) -> dict[str, list[tuple[str, str]]]:
    """task -> (file, passage) for every passage of a user's kept state that mentions the task:
    the lines from the mention to the next blank line, bounded. Text files only; nothing is
    extracted to disk (the archive is read in memory)."""
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    with tarfile.open(snapshot) as tar:
        for member in tar:
            if not member.isfile() or member.size > KEPT_FILE_BYTES:
                continue
            data = tar.extractfile(member).read()
            if b"\0" in data:
                continue
            lines = data.decode("utf-8", errors="replace").splitlines()
            name = member.name.removeprefix("./")
            for index, line in enumerate(lines):
                for task in tasks:
                    if task not in line:
                        continue
                    passage = []
                    for text in lines[index:index + PASSAGE_LINES]:
                        if not text.strip():
                            break
                        passage.append(text)
                    found[task].append((name, "\n".join(passage)[:PASSAGE_CHARS]))
    return found


def round_digest(records: RoundRecords, tasks: set[str]) -> dict[str, str]:
    """task -> the digest the curator reads about it (every task met in the round, in order)."""
    from solver_model.conversation import read_conversation

    met: dict[str, list[InstanceRecord]] = defaultdict(list)
    for instance in records.instances():
        met[instance.task].append(instance)
    passages: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for user in range(records.users):
        snapshot = records.paths.user(user).latest_snapshot()
        if snapshot is None:
            continue
        for task, kept in kept_passages(snapshot, set(met)).items():
            passages[task] += [(user, name, text) for name, text in kept]
    digests = {}
    for task, instances in met.items():
        pairs: dict[str, None] = {}
        for instance in instances:
            state = read_conversation(transcript_messages(instance.transcript))
            for pair in state.pairs:
                pairs.setdefault(f"[{grid_json(pair.input)}, {grid_json(pair.output)}]", None)
        solved = sum(i.status == "solved" for i in instances)
        bought = sum(1 for i in instances for s in i.steps if s.outcome == "demo")
        seen: set[str] = set()
        kept = []
        for user, name, text in passages[task]:
            if text not in seen and len(kept) < DIGEST_PASSAGES:
                seen.add(text)
                kept.append(f"--- user {user}, {name}\n{text}")
        digests[task] = "\n".join([
            f"Task {task}: met {len(instances)} times by {len({i.user for i in instances})} users in "
            f"round {records.number}; solved {solved} of {len(instances)}; {bought} demonstrations bought.",
            "", "Demonstration pairs the users bought (one JSON [input, output] per line):",
            *list(pairs)[:DIGEST_PAIRS],
            "", f"What the users kept that mentions task {task} ({len(kept)} passages):", *kept])
    return digests


# --- the curator --------------------------------------------------------------------------------

def curate(grid: GridConfig, cell: Cell, paths: CellPaths, number: int, previous: Path, out: Path,
           upstream: str, tasks: set[str]) -> dict[str, int]:
    """The update step of a harness's collective row: write round `number`'s library (and the
    curator's state) into `out` from round `number - 1`'s records, and the library and curator
    state of `previous`. A failed curator conversation leaves its task's file as it was."""
    records = RoundRecords(paths, number - 1, grid.collective_settings.users)
    digests = round_digest(records, tasks)
    prompts = PromptSet.load(grid.prompts)
    journal = out / CURATOR / "journal"
    journal.mkdir(parents=True)
    spec = harness_spec(grid, cell, paths.run.root, f"{cell.cell}-curator", journal, upstream)
    sandbox = harness_engine(grid.sandbox.engine).open(spec)
    transcript, errors = [], 0
    try:
        ready = prepare_harness(sandbox, grid, cell, MEMORY_ON, prompts)
        ready.state.restore(previous / CURATOR_STATE if (previous / CURATOR_STATE).exists() else None)
        library = f"{sandbox.state_path}/{LIBRARY}"
        ControlFile(journal / CONTROL_FILE).set_slot(None, "between")
        for task, digest in digests.items():
            message = prompts.render("curator_task", round=number - 1, task_id=task, shared_dir=library,
                                     digest=digest)
            started = time.monotonic()
            try:
                turn = ready.learner.converse(message, started + grid.limits.wall_clock_s)
                reply = turn.text
            except HarnessError as exc:
                errors += 1
                reply = f"[curator error] {exc}"
                log.warning("curator_error", cell=cell.cell, round=number, task=task, error=str(exc)[:300])
                ready.state.recover()
            transcript.append({"task": task, "user": message, "assistant": reply,
                               "seconds": round(time.monotonic() - started, 3)})
        ready.learner.close()
        fault = sandbox.fault()
        if fault:  # the infrastructure's, not the curator's: the update is done again on resume
            raise RuntimeError(f"curator of {cell.cell}, round {number}: {fault}")
        ready.state.snapshot(out / CURATOR_STATE)
    finally:
        sandbox.teardown()
    write_json(out / CURATOR / "transcript.json", transcript)
    written = read_library(out / CURATOR_STATE, out / LIBRARY, tasks)
    before = {p.name: p.read_bytes() for p in library_files(previous / LIBRARY)}
    changed = sum(before.get(p.name) != p.read_bytes() for p in library_files(out / LIBRARY))
    calls = [e for e in read_journal(journal) if not e.refused and e.api != "other"]
    aborted = paths.shared_round(number).with_name(paths.shared_round(number).name + ".aborted")
    return {"tasks_curated": len(digests), "curator_errors": errors, "library_files": written,
            "library_changed": changed, "curator_calls": len(calls),
            "curator_usd": round(sum(e.cost_usd or 0.0 for e in calls), 6),
            "curator_aborted": len(list(aborted.iterdir())) if aborted.is_dir() else 0}


def read_library(snapshot: Path, dest: Path, tasks: set[str]) -> int:
    """The library's files out of the curator's snapshot into `dest`: `library/<task id>.py` of
    a task of the grid, regular, at most LIBRARY_FILE_BYTES; anything else is left where it is."""
    dest.mkdir(parents=True, exist_ok=True)
    written = 0
    with tarfile.open(snapshot) as tar:
        for member in tar:
            parts = Path(member.name.removeprefix("./")).parts
            if (len(parts) != 2 or parts[0] != LIBRARY or not member.isfile()
                    or member.size > LIBRARY_FILE_BYTES or not parts[1].endswith(".py")
                    or parts[1].removesuffix(".py") not in tasks):
                continue
            (dest / parts[1]).write_bytes(tar.extractfile(member).read())
            written += 1
    return written

