"""The stores inspector: what each harness kept, when, by which mechanism, and whether it came back.

Fast tests read the prime-agent run the project generates (tests/fixtures/prime_agent/generate.py;
no prime-agent binary is obtainable here) and small damaged cells built below. The Docker tests
run hermes-agent and openclaw, the real packages in their real sandboxes behind the real proxy,
on the scripted model, which writes a note naming the task on every instance's first message:
the inspector must report the write at the first meeting and its return on the returning instance.
"""

from __future__ import annotations

import filecmp
import json
import random
import re
import sqlite3
from pathlib import Path

import pytest

from orchestrator.records import CellPaths
from stores_inspector import inspect_run
from stores_inspector.generic import file_diff
from stores_inspector.reading import Problems, decompress, open_sqlite, read_json, salvage_json
from stores_inspector.volume import Volume
from tests.conftest import SCRIPTED_HARNESS_CELLS
from tests.docker_fixtures import client  # noqa: F401  (the Docker engine fixture)
from tests.fixtures.prime_agent.generate import CELL, T0, TASK_A, TASK_B, state, tar_gz, write_run

FIXTURE_RUN = Path(__file__).parent / "fixtures" / "prime_agent" / "run"


def rows(frame, **where):
    for column, value in where.items():
        frame = frame[frame[column] == value]
    return frame


# --- prime-agent, on the generated run ------------------------------------------------------------

@pytest.fixture(scope="module")
def prime():
    return inspect_run(FIXTURE_RUN)


def test_the_committed_prime_agent_fixtures_are_what_the_generator_writes(tmp_path):
    write_run(tmp_path)
    ours, committed = tmp_path / "cells" / CELL, FIXTURE_RUN / "cells" / CELL
    files = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(ours) for p in ours.rglob("*") if p.is_file())
    assert all(filecmp.cmp(committed / f, ours / f, shallow=False) for f in files), \
        "regenerate with `python tests/fixtures/prime_agent/generate.py`"


def test_a_global_memory_the_agent_writes_at_instance_0_comes_back_in_the_digest_at_instance_1(prime):
    kept = rows(prime.tables["timeline"], slot=0, change="created").iloc[0]
    assert (kept["kind"], kept["mechanism"], kept["when"], kept["names_task"]) == \
        ("memory entry (global)", "agent tool call", "before", TASK_A)
    assert kept["evidence"].startswith("journal call 00000001: ipython")
    back = rows(prime.tables["returns"], slot=1).iloc[0]
    assert back["reached"] and back["reached_via"] == "system prompt" and back["cost0"]
    assert TASK_A in back["reached_excerpt"]


def test_the_automatic_refinement_writes_only_the_sessions_own_store_before_the_verdict(prime):
    written = rows(prime.tables["timeline"], slot=2, change="created")
    entry = rows(written, kind="memory entry (local)").iloc[0]
    assert (entry["mechanism"], entry["when"], entry["names_task"]) == ("refinement", "before", TASK_B)
    assert "source=refine" in entry["evidence"]
    runs = prime.tables["runs"]
    assert sorted(runs["mechanism"]) == ["refinement", "refinement review"] and runs["before_verdict"].all()
    refinement = prime.tables["prime_refinements"].iloc[0]
    assert (refinement["scope"], refinement["applied_edits"], refinement["names_task"]) == ("local", 1, TASK_B)


def test_a_returning_task_whose_note_died_with_its_session_is_looked_for_and_not_found(prime):
    back = rows(prime.tables["returns"], slot=3).iloc[0]
    assert not back["reached"] and back["looked"] and not back["found"]
    assert back["lookups"] == "ipython(print(harness.list()))" and back["pairs_bought"] == 2


def test_sessions_give_turns_tool_calls_after_the_verdict_and_bare_finishes(prime):
    sessions = prime.tables["prime_sessions"].set_index("session")
    assert sessions.loc["sess-2", "turns"] == 27 and sessions.loc["sess-2", "tool_calls_after_verdict"] == 1
    assert list(sessions["bare_finish"]) == [True, True, False, True]
    summary = prime.summaries[0]
    assert summary["bare finishes after the verdict"] == "3 of 4"
    assert summary["sessions reaching 25 turns"] == 1
    assert summary["session digest"] == "2 distinct in 4 sessions; empty in 1"
    assert summary["global store exists"] is True and summary["entries marked global"] == 1
    assert summary["returning: task material reached the model before the first action"] == "1 of 2 (50%)"
    assert summary["pairs bought per returning instance"] == 1.0
    assert summary["could not read"] == 0


def test_the_markdown_has_a_section_per_cell_with_the_counts_and_both_tables(prime):
    assert f"## {CELL}" in prime.markdown
    for line in ("- entries written that name a task: 2", "- written by refinement: 2 (2 before the verdict)",
                 "### What was kept, when, by which mechanism", "### Did it come back (returning instances)"):
        assert line in prime.markdown, line


def test_carc_inspect_writes_csv_tables_and_inspect_md(tmp_path):
    from typer.testing import CliRunner

    from orchestrator.cli import app
    result = CliRunner().invoke(app, ["inspect", str(FIXTURE_RUN), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "inspect.md").read_text().startswith("# What each harness kept")
    for table in ("timeline", "returns", "runs", "files", "instances", "cells", "prime_sessions", "problems"):
        assert (tmp_path / f"{table}.csv").exists(), table
    missing = CliRunner().invoke(app, ["inspect", str(FIXTURE_RUN), "--cell", "nope"])
    assert missing.exit_code == 2 and CELL in missing.output


# --- robust reading --------------------------------------------------------------------------------

def test_truncated_json_keeps_the_complete_part_before_the_cut():
    problems = Problems("c")
    text = json.dumps({"schema": 1, "entries": {"memory": {"a": {"id": "a"}, "b": {"id": "b", "title": "cut here"}}}})
    value = read_json(text[:-25], "harness_state.json", problems)
    assert value["schema"] == 1 and value["entries"]["memory"]["a"] == {"id": "a"}
    assert len(problems) == 1 and "truncated" in problems[0].what
    assert salvage_json('[1, 2, {"x": [3, 4') == [1, 2, {"x": [3]}]
    assert read_json("", "empty.json", problems) is None and "nothing readable" in problems[-1].what


def replace_member(snapshot: Path, path: str, content: str | bytes) -> None:
    """Rewrite one member of a generated snapshot (as if the harness had left it so)."""
    import tarfile
    with tarfile.open(snapshot) as tar:
        files = {m.name.removeprefix("./"): (tar.extractfile(m).read(), m.mtime) for m in tar if m.isfile()}
    files[path] = (content, files.get(path, (b"", T0))[1])
    snapshot.write_bytes(tar_gz(files))


def test_a_truncated_store_and_an_unknown_schema_are_reported_and_read_as_far_as_they_go(tmp_path):
    folder = write_run(tmp_path)
    store = "prime/agent/harness/harness_state.json"
    replace_member(folder / "snapshots" / "00003.tar.gz", store, state([])[:-40])
    replace_member(folder / "snapshots" / "00002.tar.gz", store, state([], schema=7))
    result = inspect_run(tmp_path)
    problems = result.tables["problems"]
    assert problems["what"].str.contains("unknown schema version 7").any()
    assert problems["what"].str.contains("truncated or invalid JSON").any()
    assert len(result.tables["returns"]) == 4  # everything else was still read


def test_a_live_sqlite_database_is_read_from_a_copy_with_its_wal_while_the_writer_holds_it(tmp_path):
    live = tmp_path / "live" / "state.db"
    live.parent.mkdir()
    writer = sqlite3.connect(live)
    writer.execute("pragma journal_mode=wal")
    writer.execute("pragma wal_autocheckpoint=0")
    writer.execute("create table t (x)")
    writer.executemany("insert into t values (?)", [(i,) for i in range(5)])
    writer.commit()
    writer.execute("begin immediate")  # the writer holds the write lock, as a running harness may
    assert live.with_name("state.db-wal").stat().st_size > 0
    problems = Problems("c")
    with open_sqlite(live, "state.db", problems) as db:
        assert db.execute("select count(*) from t").fetchone()[0] == 5
    writer.rollback()
    writer.close()
    assert not problems


def hermes_cell(run: Path, db_files: dict[str, bytes]) -> Path:
    """A hermes-agent cell with one instance whose snapshot holds these state.db files."""
    folder = run / "cells" / "hermes-agent.low.sequential.s0"
    (folder / "snapshots").mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps({"cell": folder.name, "learner": "hermes-agent", "row": "memory-on"}))
    (folder / "sandbox.json").write_text(json.dumps({"harness": "hermes-agent"}))
    event = {"cell": folder.name, "slot": 0, "phase": "stream", "task": TASK_A, "visit": 0, "exposure": 0}
    (folder / "events.jsonl").write_text(json.dumps({"type": "instance_start", "t": T0, **event}) + "\n" + json.dumps(
        {"type": "instance_end", "t": T0 + 5, "status": "solved", "cost": 1, "demos_used": 1, **event}) + "\n")
    files = {f"hermes/{name}": (data, T0 + 1) for name, data in db_files.items()}
    files["hermes/memories/MEMORY.md"] = (f"carc-note: task {TASK_A} was seen", T0 + 1)
    (folder / "snapshots" / "00000.tar.gz").write_bytes(tar_gz(files))
    return folder


def test_hermes_state_db_with_an_unknown_schema_version_and_its_wal_is_still_read(tmp_path):
    live = tmp_path / "db" / "state.db"
    live.parent.mkdir()
    writer = sqlite3.connect(live)
    writer.execute("pragma journal_mode=wal")
    writer.execute("pragma wal_autocheckpoint=0")
    writer.executescript("create table schema_version (version); insert into schema_version values (99);"
                         "create table sessions (id, started_at, message_count, end_reason);"
                         "create table messages (session_id, role, tool_calls);")
    writer.execute("insert into sessions values ('s1', ?, 4, null)", (T0 + 1,))
    writer.execute("insert into messages values ('s1', 'assistant', ?)",
                   (json.dumps([{"function": {"name": "skill_view", "arguments": "{}"}}]),))
    writer.commit()  # committed to the WAL, not checkpointed: the copy must carry the -wal
    files = {n: (live.parent / n).read_bytes() for n in ("state.db", "state.db-wal", "state.db-shm")}
    writer.close()
    hermes_cell(tmp_path / "run", files)
    result = inspect_run(tmp_path / "run")
    sessions = result.tables["hermes_sessions"]
    assert list(sessions["session"]) == ["s1"] and sessions["skill_views"].iloc[0] == 1
    assert result.tables["problems"]["what"].str.contains("unknown schema version 99").any()
    assert rows(result.tables["timeline"], kind="memory entry")["names_task"].tolist() == [TASK_A]


def test_a_half_written_database_is_reported_and_the_rest_of_the_cell_still_read(tmp_path):
    hermes_cell(tmp_path, {"state.db": b"SQLite format 3\x00" + b"\x10\x00" + b"\x00" * 90})
    result = inspect_run(tmp_path)
    assert result.tables["problems"]["what"].str.contains("not a readable SQLite database").any()
    assert len(rows(result.tables["timeline"], kind="memory entry")) == 1


def test_zstd_compressed_events_are_read():
    zstandard = pytest.importorskip("zstandard")
    problems = Problems("c")
    data = zstandard.ZstdCompressor().compress(b'{"type": "x"}\n')
    assert decompress(data, "events.jsonl.zst", problems) == b'{"type": "x"}\n' and not problems


def test_a_zstd_event_log_gives_the_same_instances(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    folder = write_run(tmp_path)
    events = folder / "events.jsonl"
    (folder / "events.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(events.read_bytes()))
    events.unlink()
    returns = inspect_run(tmp_path).tables["returns"]
    assert list(returns["task"]) == [TASK_A, TASK_A, TASK_B, TASK_B] and returns.loc[1, "reached"]


def test_a_cell_with_nothing_but_its_settings_says_what_is_missing(tmp_path):
    folder = tmp_path / "cells" / "openclaw.low.sequential.s0"
    folder.mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps({"cell": folder.name, "learner": "openclaw", "row": "memory-on"}))
    result = inspect_run(tmp_path)
    where = set(result.tables["problems"]["where"])
    assert {"events.jsonl", "journal/journal.jsonl", "snapshots/"} <= where
    assert result.summaries[0]["instances"] == 0 and "Could not read" in result.markdown


def test_a_torn_snapshot_keeps_the_files_before_the_damage(tmp_path):
    snapshot = tmp_path / "00000.tar.gz"
    noise = random.Random(0).randbytes(200_000)  # incompressible: the cut lands inside this member
    snapshot.write_bytes(tar_gz({"a/one.md": ("first", T0), "b/two.bin": (noise, T0)})[:-2000])
    problems = Problems("c")
    volume = Volume.read(0, snapshot, problems)
    assert "a/one.md" in volume.files and problems and "unreadable" in problems[0].what


# --- openclaw stores the short Docker run does not reach (dreaming runs hourly) -------------------

def journal_call(cell: str, slot: int | None, phase: str, t: float, messages: list, reply: str | None = None,
                 tool_call: dict | None = None) -> str:
    message = {"role": "assistant", "content": reply, **({"tool_calls": [tool_call]} if tool_call else {})}
    return json.dumps({"id": f"{int(t * 10):012d}", "cell": cell, "slot": slot, "phase": phase, "mode": "reverse",
                       "method": "POST", "url": "http://proxy/v1/chat/completions", "host": "proxy",
                       "api": "openai-chat", "model": "m", "stream": True, "status": 200, "refused": False,
                       "request": {"messages": messages}, "response": {"choices": [{"message": message}]},
                       "t_start": t, "t_first_byte": t, "t_end": t + 0.1, "latency_s": 0.1}) + "\n"


def openclaw_databases(folder: Path) -> dict[str, bytes]:
    """state/openclaw.sqlite with a promoted staging entry; the agent db with one zstd event."""
    zstandard = pytest.importorskip("zstandard")
    folder.mkdir()
    state_db = sqlite3.connect(folder / "state.sqlite")
    state_db.executescript("create table schema_meta (meta_key, schema_version); insert into schema_meta values "
                           "('primary', 18); create table plugin_state_entries (plugin_id, namespace, entry_key, "
                           "value_json, created_at, expires_at);")
    staged = {"path": "memory/2027-01-15.md", "startLine": 1, "endLine": 1, "source": "memory",
              "snippet": f"{TASK_A}: colours map 3->4", "recallCount": 3, "queryHashes": ["q1", "q2", "q3"],
              "maxScore": 0.81, "firstRecalledAt": "2027-01-15T08:00:02Z", "promotedAt": "2027-01-15T08:01:00Z"}
    state_db.execute("insert into plugin_state_entries values ('memory-core', 'short-term-recall', 'store', ?, 0, "
                     "null)", (json.dumps({"version": 1, "entries": {"memory:memory/2027-01-15.md:1:1": staged}}),))
    state_db.commit()
    state_db.close()
    agent_db = sqlite3.connect(folder / "agent.sqlite")
    agent_db.executescript("create table schema_meta (meta_key, schema_version); insert into schema_meta values "
                           "('primary', 23); create table session_windows (session_id, session_key);"
                           "create table transcript_events (session_id, seq, event_json, created_at, event_zstd);")
    event = {"type": "message", "message": {"role": "assistant", "content": [
        {"type": "toolCall", "name": "tool_call", "arguments": {"id": "memory_search", "args": {"query": "x"}}}]}}
    agent_db.execute("insert into session_windows values ('s1', 'agent:main:explicit:carc-1')")
    agent_db.execute("insert into transcript_events values ('s1', 0, null, ?, ?)",
                     (int((T0 + 101) * 1000), zstandard.ZstdCompressor().compress(json.dumps(event).encode())))
    agent_db.commit()
    agent_db.close()
    return {"state/openclaw.sqlite": (folder / "state.sqlite").read_bytes(),
            "agents/main/agent/openclaw-agent.sqlite": (folder / "agent.sqlite").read_bytes()}


def test_openclaw_dreaming_promotion_staging_and_a_memory_search_that_finds_the_task(tmp_path):
    databases = openclaw_databases(tmp_path / "db")
    folder = tmp_path / "run" / "cells" / "openclaw.low.sequential.s0"
    (folder / "snapshots").mkdir(parents=True)
    (folder / "journal").mkdir()
    (folder / "cell.json").write_text(json.dumps({"cell": folder.name, "learner": "openclaw", "row": "memory-on"}))
    (folder / "sandbox.json").write_text(json.dumps({"harness": "openclaw"}))
    lines = []
    for slot in (0, 1):
        event = {"cell": folder.name, "slot": slot, "phase": "stream", "task": TASK_A, "visit": slot, "exposure": slot}
        t = T0 + 100 * slot
        lines += [{"type": "instance_start", "t": t, **event},
                  {"type": "step", "t": t + 3, "step": 1, "outcome": "correct", "over": True, "cost": 0, **event},
                  {"type": "instance_end", "t": t + 5, "status": "solved", "cost": 0, "demos_used": 0, **event}]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    opening = f"Task id: {TASK_A}\nTest input:\n[[3,1,2],[3,1,2]]\n"
    arguments = json.dumps({"id": "memory_search", "args": {"query": "task"}})
    search = {"id": "call1", "type": "function", "function": {"name": "tool_call", "arguments": arguments}}
    (folder / "journal" / "journal.jsonl").write_text("".join([
        journal_call(folder.name, 0, "before", T0 + 1, [{"role": "user", "content": opening}], reply="{}"),
        journal_call(folder.name, None, "between", T0 + 50,
                     [{"role": "system", "content": "You are keeping a dream diary. Write a single entry."},
                      {"role": "user", "content": "fragments"}], reply="light through the window"),
        journal_call(folder.name, None, "between", T0 + 52,
                     [{"role": "system", "content": "You are keeping a dream diary. Write a single entry."},
                      {"role": "user", "content": "fragments"}], reply="rem"),
        journal_call(folder.name, 1, "before", T0 + 101, [{"role": "user", "content": opening}], tool_call=search),
        journal_call(folder.name, 1, "before", T0 + 102, [
            {"role": "user", "content": opening}, {"role": "assistant", "content": None, "tool_calls": [search]},
            {"role": "tool", "tool_call_id": "call1", "content": f"memory/2027-01-15.md: {TASK_A}: colours map 3->4"}],
            reply="{}")]))
    for slot in (0, 1):
        CellPaths(folder).append_transcript(slot, [{"user": opening}])
    note = ("openclaw/workspace/memory/2027-01-15.md", (f"{TASK_A}: colours map 3->4\n", T0 + 2))
    promoted = (f"# Memory\n\n<!-- openclaw-memory-promotion:memory:memory/2027-01-15.md:1:1 -->\n"
                f"- {TASK_A}: colours map 3->4 [score=0.810 recalls=3 source=memory/2027-01-15.md:1-1]\n")
    (folder / "snapshots" / "00000.tar.gz").write_bytes(tar_gz(dict([note])))
    (folder / "snapshots" / "00001.tar.gz").write_bytes(tar_gz({
        **dict([note]), "openclaw/workspace/MEMORY.md": (promoted, T0 + 51),
        "openclaw/workspace/DREAMS.md": ("# Dreams\n\nlight through the window\n", T0 + 51),
        **{f"openclaw/{p}": (data, T0 + 104) for p, data in databases.items()}}))
    result = inspect_run(tmp_path / "run")
    timeline, summary = result.tables["timeline"], result.summaries[0]
    promotion = rows(timeline, kind="promotion").iloc[0]
    assert (promotion["slot"], promotion["mechanism"], promotion["when"], promotion["names_task"]) == \
        (1, "dreaming", "between", TASK_A)
    assert rows(timeline, kind="dream diary").iloc[0]["mechanism"] == "dreaming"
    assert rows(timeline, kind="note").iloc[0]["slot"] == 0
    runs = result.tables["runs"]
    assert list(zip(runs["mechanism"], runs["slot"], runs["phase"], runs["calls"])) == [("dreaming", 0, "between", 2)]
    back = rows(result.tables["returns"], slot=1).iloc[0]
    assert back["looked"] and back["found"] and back["lookups"] == "memory_search(task)"
    assert summary["promotions written to MEMORY.md"] == 1 and summary["staging entries promoted"] == 1
    assert summary["most distinct queries"] == 3 and summary["memory_search calls (transcripts)"] == 1
    assert result.tables["openclaw_sessions"]["slot"].tolist() == [1]
    assert summary["could not read"] == 0, result.tables["problems"]


# --- the generic fallback: a file-level diff for any adapter ------------------------------------

def test_the_generic_fallback_lists_files_created_changed_and_deleted_after_each_instance(tmp_path):
    folder = tmp_path / "cells" / "my-agent.low.sequential.s0"
    (folder / "snapshots").mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps({"cell": folder.name, "learner": "my-agent", "row": "memory-on"}))
    lines = []
    for slot, task in enumerate((TASK_A, TASK_B)):
        event = {"cell": folder.name, "slot": slot, "phase": "stream", "task": task, "visit": 0, "exposure": 0}
        lines += [{"type": "instance_start", "t": T0 + 10 * slot, **event},
                  {"type": "instance_end", "t": T0 + 10 * slot + 5, "status": "solved", "cost": 1, **event}]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    volumes = [{"notes/a.md": (f"{TASK_A}: flip", T0 + 1), "run.log": ("x", T0 + 1), "notes/old.md": ("old", T0)},
               {"notes/a.md": (f"{TASK_A}: flip; {TASK_B}: fill", T0 + 11), "run.log": ("xy", T0 + 11)}]
    for slot, files in enumerate(volumes):
        (folder / "snapshots" / f"{slot:05d}.tar.gz").write_bytes(tar_gz(files))
    result = inspect_run(tmp_path)
    timeline = result.tables["timeline"]
    assert set(zip(timeline["slot"], timeline["change"], timeline["path"])) == {
        (0, "created", "notes/a.md"), (0, "created", "notes/old.md"), (1, "changed", "notes/a.md"),
        (1, "deleted", "notes/old.md")}  # the log is bookkeeping: in `files`, not in the timeline
    assert rows(timeline, slot=1, change="changed")["names_task"].iloc[0] == f"{TASK_A},{TASK_B}"
    files = result.tables["files"]
    assert rows(files, slot=1, path="run.log")["sort"].iloc[0] == "log"

    before = Volume.read(0, folder / "snapshots" / "00000.tar.gz", Problems("c"))
    after = Volume.read(1, folder / "snapshots" / "00001.tar.gz", Problems("c"))
    assert {(r["path"], r["change"]) for r in file_diff(before.files, after)} == {
        ("notes/a.md", "changed"), ("run.log", "changed"), ("notes/old.md", "deleted")}


def test_a_name_that_is_not_utf8_and_a_climbing_member_do_not_stop_carc_inspect(tmp_path):
    """A harness may write any byte string as a file name; a crafted archive may name `../x`.
    `carc inspect` writes its account with the name escaped and unpacks nothing outside."""
    import io
    import tarfile

    from typer.testing import CliRunner

    from orchestrator.cli import app
    folder = tmp_path / "cells" / "my-agent.low.sequential.s0"
    (folder / "snapshots").mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps({"cell": folder.name, "learner": "my-agent", "row": "memory-on"}))
    event = {"cell": folder.name, "slot": 0, "phase": "stream", "task": TASK_A, "visit": 0, "exposure": 0}
    deep = "./deep/" + "d/" * 2100 + "leaf"
    (folder / "events.jsonl").write_text(json.dumps({"type": "instance_start", "t": T0, **event}) + "\n" +
                                         json.dumps({"type": "instance_end", "t": T0 + 5, "status": "solved",
                                                     "cost": 1, "snapshot_left_out_n": 1, "snapshot_left_out": [
                                                         f"{deep}\t\tpath longer than the engine's archive reads (PATH_MAX)"],
                                                     **event}) + "\n")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in (b"./bad-\xff\xfe.txt".decode("utf-8", "surrogateescape"), "./../escaped.db", "./notes.md"):
            data = f"{TASK_A}: flip".encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), T0 + 1
            tar.addfile(info, io.BytesIO(data))
    (folder / "snapshots" / "00000.tar.gz").write_bytes(buffer.getvalue())
    result = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert result.exit_code == 0, result.output
    timeline = (tmp_path / "inspect" / "timeline.csv").read_text(encoding="utf-8")
    assert "bad-\\xff\\xfe.txt" in timeline
    account = (tmp_path / "inspect" / "inspect.md").read_text(encoding="utf-8")
    assert "carc left 1 file(s) of the state out of this snapshot" in account and "PATH_MAX" in account
    volume = Volume.read(0, folder / "snapshots" / "00000.tar.gz", Problems("c"))
    problems = Problems("c")
    volume.extract(["../escaped.db"], tmp_path / "unpacked", problems)
    assert not (tmp_path / "escaped.db").exists() and "climbs out" in str(list(problems))


# --- hermes-agent and openclaw: the real harnesses on the scripted model (Docker) -----------------

@pytest.fixture(scope="module")
def real_run(scripted_harness_run):
    """A real 2-task x 2-visit grid of hermes-agent's and openclaw's rows (tests/conftest.py); the
    scripted model writes `carc-note: task <id> was seen`."""
    return scripted_harness_run


@pytest.fixture(scope="module")
def real(real_run):
    return inspect_run(real_run)


def first_meetings(result, cell: str) -> dict[str, tuple[int, int]]:
    """task -> (slot of its first meeting, slot of its return)."""
    instances = result.cell(cell, "instances")
    return {task: tuple(group.sort_values("visit")["slot"]) for task, group in instances.groupby("task")}


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("cell, kind, tool", [("hermes-agent.low.sequential.s5", "memory entry", "memory"),
                                              ("openclaw.low.sequential.s5", "memory line", "exec")])
def test_the_note_written_at_the_first_meeting_comes_back_on_the_returning_instance(real, cell, kind, tool):
    timeline, returns = real.cell(cell, "timeline"), real.cell(cell, "returns")
    for task, (first, back) in first_meetings(real, cell).items():
        write = rows(timeline, slot=first, kind=kind, change="created", names_task=task)
        assert len(write) == 1, (cell, task, timeline[["slot", "kind", "change", "names_task"]])
        assert write.iloc[0]["mechanism"] == "agent tool call" and write.iloc[0]["when"] == "before"
        assert write.iloc[0]["evidence"].endswith(f": {tool}")
        came_back = rows(returns, slot=back).iloc[0]
        assert came_back["reached"] and came_back["reached_via"] == "system prompt", came_back
        assert f"carc-note: task {task} was seen" in came_back["reached_excerpt"]
        assert not rows(returns, slot=first).iloc[0]["reached"]
    assert f"## {cell}" in real.markdown and real.cell(cell, "problems").empty


@pytest.mark.docker
@pytest.mark.slow
def test_memory_off_writes_the_note_every_time_and_nothing_comes_back(real):
    cell = "hermes-agent-memory-off.low.sequential.s5"
    summary = next(s for s in real.summaries if s["cell"] == cell)
    assert summary["returning: task material reached the model before the first action"] == "0 of 2 (0%)"
    assert summary["session digest"] == "identical in all 4 sessions; empty in 4"
    timeline = real.cell(cell, "timeline")
    assert sorted(rows(timeline, change="created")["slot"]) == [0, 1, 2, 3]
    assert set(rows(timeline, change="deleted")["mechanism"]) == {"wipe"}


@pytest.mark.docker
@pytest.mark.slow
def test_hermes_background_reviews_are_found_in_the_journal_and_in_agent_log(real):
    cell = "hermes-agent.low.sequential.s5"
    runs = real.cell(cell, "runs")
    assert len(runs) and set(runs["mechanism"]) == {"background review"}
    assert real.cell(cell, "hermes_reviews_log")["review_runs"].sum() == len(runs)
    sessions = real.cell(cell, "hermes_sessions")
    assert sorted(sessions["slot"]) == [0, 1, 2, 3]


@pytest.mark.docker
@pytest.mark.slow
def test_carc_inspect_on_the_real_run_writes_a_section_per_cell(real_run):
    from typer.testing import CliRunner

    from orchestrator.cli import app
    result = CliRunner().invoke(app, ["inspect", str(real_run)])
    assert result.exit_code == 0, result.output
    text = (real_run / "inspect" / "inspect.md").read_text()
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[0] == "Per harness and row", sections
    assert len(sections[1:]) == SCRIPTED_HARNESS_CELLS and all(s.endswith(".s5") for s in sections[1:]), sections
    assert (real_run / "inspect" / "timeline.csv").exists()


# --- shapes a harness or an upstream only sometimes writes -------------------------------------------

def _entry(api: str, request, response):
    from proxy.journal import JournalEntry
    return JournalEntry(id="x", cell="c", slot=0, phase="before", mode="reverse", method="POST", url="/",
                        host="h", api=api, model=None, stream=False, status=200, refused=False,
                        request=request, response=response, t_start=0.0, t_first_byte=None, t_end=0.0,
                        latency_s=0.0)


@pytest.mark.parametrize("api,request_body,response_body", [
    ("openai-chat", {"messages": ["text", 3, {"role": "user", "content": "hi",
                                              "tool_calls": [{"function": "not-a-dict"}]}]},
     {"choices": {"0": "not a list"}}),
    ("openai-chat", {"messages": [{"content": "hi"}]}, {"choices": ["not a dict"]}),
    ("openai-responses", {"input": [7, None, {"type": "message", "content": "hi"}]}, {"output": ["x", 1]}),
    ("anthropic-messages", {"messages": ["x", {"role": "user", "content": "hi"}]}, {"content": "plain"}),
])
def test_journaled_bodies_of_odd_shapes_are_read_without_a_crash(api, request_body, response_body):
    from stores_inspector.calls import request_messages, response_output
    messages = request_messages(_entry(api, request_body, response_body))
    assert any(m.text == "hi" for m in messages)
    text, calls = response_output(_entry(api, request_body, response_body))
    assert isinstance(text, str) and isinstance(calls, list)


def test_a_prime_agent_session_log_whose_parents_form_a_cycle_does_not_hang():
    from stores_inspector.prime_agent import _active_branch
    entries = [{"id": "a", "parentId": "b"}, {"id": "b", "parentId": "a"}, {"id": {"odd": 1}, "parentId": []}]
    assert _active_branch(entries) == [entries[2]]
    assert [e["id"] for e in _active_branch(entries[:2])] == ["a", "b"]


def test_prime_agent_state_with_entries_of_the_wrong_shape_gives_no_entries():
    from stores_inspector.prime_agent import _entries
    assert _entries({"entries": ["a list"]}) == []
    assert _entries({"entries": {"memory": ["x"]}}) == []


def test_openclaw_tool_names_holding_separators_and_odd_timestamps_are_counted():
    from stores_inspector.openclaw import _epoch_ms, _tool_counts
    assert _tool_counts("memory_search:2,a,b:1,weird:name:3,:4,x:y") == {"memory_search": 2, "b": 1, "weird:name": 3}
    assert _tool_counts(None) == {}
    assert _epoch_ms(1_700_000_000_000) == 1_700_000_000.0
    assert _epoch_ms("2026-01-01T00:00:00Z") is None and _epoch_ms(None) is None


# --- the program procedure: carc's own store, read the same way for every harness ----------------

@pytest.mark.parametrize("harness, tool", [("hermes-agent", "terminal"), ("openclaw", "exec"),
                                           ("prime-agent", "ipython"), ("my-agent", "shell")])
def test_a_program_file_written_after_the_verdict_is_run_and_found_on_the_return(tmp_path, harness, tool):
    folder = tmp_path / "run" / "cells" / f"{harness}-program-procedure.low.sequential.s0"
    (folder / "snapshots").mkdir(parents=True)
    (folder / "journal").mkdir()
    (folder / "cell.json").write_text(json.dumps({"cell": folder.name, "learner": harness,
                                                  "row": "program-procedure"}))
    (folder / "sandbox.json").write_text(json.dumps({"harness": harness}))
    lines = []
    for slot in (0, 1):
        event = {"cell": folder.name, "slot": slot, "phase": "stream", "task": TASK_A, "visit": slot,
                 "exposure": slot}
        t = T0 + 100 * slot
        lines += [{"type": "instance_start", "t": t, **event},
                  {"type": "step", "t": t + 3, "step": 1, "outcome": "correct", "over": True, "cost": 0, **event},
                  {"type": "instance_end", "t": t + 5, "status": "solved", "cost": 0, "demos_used": 0, **event}]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    opening = f"Task id: {TASK_A}\nTest input:\n[[3,1,2],[3,1,2]]\n"
    path = f"/state/programs/{TASK_A}.py"
    source = f"CARC_NOTE = 'carc-note task {TASK_A}'\n\ndef transform(grid):\n    return grid\n"
    run = f"python3 -c 'import runpy;m=runpy.run_path(\"{path}\");print(m[\"transform\"]([[3]]))'"
    write = f"mkdir -p /state/programs && cat > {path} <<'EOF'\n{source}EOF"
    if tool == "ipython":
        run = f"import runpy;m=runpy.run_path({path!r});print(m['transform']([[3]]))"
        write = f"open({path!r}, 'w').write({source!r})"

    def call(slot: int, t: float, command: str, result: str | None) -> list[str]:
        tool_call = {"id": f"c{slot}{int(t)}", "type": "function",
                     "function": {"name": tool, "arguments": json.dumps({"command": command, "code": command})}}
        out = [journal_call(folder.name, slot, "before" if result is not None else "after", t,
                            [{"role": "user", "content": opening}], tool_call=tool_call)]
        if result is not None:
            out.append(journal_call(folder.name, slot, "before", t + 0.5, [
                {"role": "user", "content": opening}, {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                {"role": "tool", "tool_call_id": tool_call["id"], "content": result}], reply="{}"))
        return out
    missing = f"python3: can't open file '{path}': [Errno 2] No such file or directory"
    (folder / "journal" / "journal.jsonl").write_text("".join(
        call(0, T0 + 1, run, missing) + call(0, T0 + 4, write, None)
        + call(1, T0 + 101, run, f"carc-output task {TASK_A}: [[3]]")))
    for slot in (0, 1):
        CellPaths(folder).append_transcript(slot, [{"user": opening}])
    program = {f"programs/{TASK_A}.py": (source, T0 + 4.5)}
    (folder / "snapshots" / "00000.tar.gz").write_bytes(tar_gz(program))
    (folder / "snapshots" / "00001.tar.gz").write_bytes(tar_gz(program))
    result = inspect_run(tmp_path / "run")
    kept = rows(result.tables["timeline"], kind="program file")
    assert len(kept) == 1, result.tables["timeline"]
    assert (kept.iloc[0]["slot"], kept.iloc[0]["change"], kept.iloc[0]["mechanism"], kept.iloc[0]["names_task"]) \
        == (0, "created", "agent tool call", TASK_A)
    returns = result.tables["returns"].set_index("slot")
    assert returns.loc[0, "looked"] and not returns.loc[0, "found"]  # "no such file" carries nothing
    assert returns.loc[1, "looked"] and returns.loc[1, "found"] and tool in returns.loc[1, "lookups"]


def test_a_volume_of_very_many_files_is_read_as_far_as_the_bounds_and_says_so(tmp_path, monkeypatch):
    """Past the member bound a snapshot is read that far and no deletion is inferred from it;
    past the attribution bound the changes are listed as 'not attributed'; both are problems."""
    import io
    import tarfile

    from stores_inspector import timeline, volume
    monkeypatch.setattr(volume, "MAX_MEMBERS", 20)
    monkeypatch.setattr(timeline, "MAX_ATTRIBUTED", 5)
    folder = tmp_path / "cells" / "my-agent.low.sequential.s0"
    (folder / "snapshots").mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps({"cell": folder.name, "learner": "my-agent", "row": "memory-on"}))
    lines = []
    for slot in range(2):
        event = {"cell": folder.name, "slot": slot, "phase": "stream", "task": TASK_A, "visit": slot,
                 "exposure": slot}
        lines += [json.dumps({"type": "instance_start", "t": T0 + 10 * slot, **event}),
                  json.dumps({"type": "instance_end", "t": T0 + 10 * slot + 5, "status": "solved", "cost": 1, **event})]
        with tarfile.open(folder / "snapshots" / f"{slot:05d}.tar.gz", "w:gz") as tar:
            for i in range(30 if slot == 0 else 25):  # slot 1 deleted 5, in the part not read
                data = f"note {i} {slot}".encode()
                info = tarfile.TarInfo(f"./notes/{i:02d}.md")
                info.size, info.mtime = len(data), T0 + 10 * slot + 1
                tar.addfile(info, io.BytesIO(data))
    (folder / "events.jsonl").write_text("\n".join(lines) + "\n")
    result = inspect_run(tmp_path)
    files, rows = result.tables["files"], result.tables["timeline"]
    assert len(files[files.slot == 0]) == 20 and "deleted" not in set(files.change)
    assert "deleted" not in set(rows.change)
    assert (rows.mechanism == "not attributed").sum() == 2 * (20 - 5)
    problems = " ".join(result.tables["problems"].astype(str).agg(" ".join, axis=1))
    assert "more than 20 entries" in problems and "the first 5 are attributed" in problems
