"""Two-pass symmetry labels: the decision rule, pass A on real and constructed tasks, pass B
over a real HTTP endpoint (scripted answers), the file format served by the frames source, and
`carc labels make` end to end."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from orchestrator.arc import Demo, grid_json
from orchestrator.cli import app
from orchestrator.labelling import (PassB, endpoint_asker, make_labels, parse_keep, parse_same,
                                    pass_a, pass_b)
from orchestrator.tasks.frames import ARC2_LABELS, FramedSource, LabelsError, apply_symmetry
from orchestrator.tasks.labels import (SYMMETRY_NAMES, Verdict, decide, label_task,
                                       load_labels_file, read_labels, render_labels, LabelsFile)
from orchestrator.tasks.public import PublicTask, arc1_tasks, arc2_new_eval_tasks

import yaml

ALL = SYMMETRY_NAMES


# ----- the decision -----

def test_passes_that_agree_decide_and_a_pass_not_run_does_not_block():
    d = decide({"A": Verdict(("identity", "flip_h")), "B": Verdict(("flip_h",))})
    assert (d.symmetries, d.status, d.decided_by) == (("identity", "flip_h"), "decided", ("A", "B"))
    d = decide({"A": Verdict(ALL), "B": Verdict.not_run()})
    assert (d.symmetries, d.status, d.decided_by) == (ALL, "decided", ("A",))


def test_a_pass_without_verdict_leaves_the_task_undecided_in_its_own_frame():
    d = decide({"A": Verdict(None, "no program fits"), "B": Verdict(ALL)})
    assert (d.symmetries, d.status) == (("identity",), "undecided")
    assert "pass A gave no verdict (no program fits)" in d.why
    assert decide({"A": Verdict.not_run(), "B": Verdict.not_run()}).status == "undecided"


def test_passes_that_differ_are_a_disagreement_served_in_its_own_frame():
    d = decide({"A": Verdict(ALL), "B": Verdict(("identity", "rot180"))})
    assert (d.symmetries, d.status, d.decided_by) == (("identity",), "disagreement", ())
    assert "pass A keeps" in d.why and "pass B keeps identity, rot180" in d.why


# ----- pass A -----

def gravity_task() -> PublicTask:
    """Cells fall to the bottom: the rule survives a left-right mirror and nothing else."""
    def fall(g):
        cols = list(zip(*g))
        fallen = [tuple([0] * col.count(0) + [c for c in col if c]) for col in cols]
        return tuple(zip(*fallen))
    inputs = [((1, 0, 0), (0, 0, 2), (0, 3, 0)), ((0, 4, 0, 5), (6, 0, 0, 0), (0, 0, 7, 0)),
              ((8, 0), (0, 9), (1, 0), (0, 0)), ((2, 3, 0), (0, 0, 4), (0, 0, 0), (5, 0, 6))]
    pairs = [Demo(g, fall(g)) for g in inputs]
    return PublicTask("gravity", tuple(pairs[:3]), (pairs[3],))


def test_pass_a_keeps_only_what_a_gravity_rule_survives():
    v = pass_a(gravity_task())
    assert v.keeps == ("identity", "flip_h"), v
    assert "gravity_down" in v.why


def test_pass_a_agrees_with_the_shipped_mechanical_labels_on_mirror_tasks():
    tasks = arc1_tasks("training")
    # 68b16354: the input mirrored top to bottom; 3c9b0459: turned a half turn
    assert pass_a(tasks["68b16354"]).keeps == ("identity", "rot180", "flip_h", "flip_v")
    assert pass_a(tasks["3c9b0459"]).keeps == ALL


def test_pass_a_gives_no_verdict_where_the_search_finds_no_program():
    task = next(iter(arc2_new_eval_tasks().values()))
    v = pass_a(task, "low")
    assert v.keeps is None and "finds no program" in v.why


# ----- pass B -----

def test_the_answer_lines_are_read_from_the_end_and_anything_else_is_no_answer():
    assert parse_keep("thinking...\nKEEP: rot90\nno wait\n**KEEP:** identity, flip_h.") == ("identity", "flip_h")
    assert parse_keep("KEEP: rot45") is None and parse_keep("nothing") is None
    assert parse_same("hmm\nSAME: no\n...\nSAME: Yes") is True
    assert parse_same("SAME: maybe") is None


class Scripted:
    """The answers of a model asked by pass B, keyed on what the prompt shows."""

    def __init__(self, keep: str, same: set[str], fail_on: str | None = None):
        self.keep, self.same, self.fail_on = keep, same, fail_on
        self.prompts: list[str] = []
        self.lock = threading.Lock()

    def answer(self, prompt: str) -> str | None:
        with self.lock:
            self.prompts.append(prompt)
        if self.fail_on and self.fail_on in prompt:
            return None
        if prompt.startswith("Below are the example pairs of an ARC task:"):
            return f"It is a gravity rule.\nKEEP: {self.keep}"
        words = prompt.split('applying "', 1)[1].split('"', 1)[0]
        from orchestrator.labelling import SYMMETRY_WORDS
        g = next(name for name, w in SYMMETRY_WORDS.items() if w == words)
        return f"Compared.\nSAME: {'yes' if g in self.same else 'no'}"


@pytest.fixture
def endpoint():
    """An OpenAI-compatible chat endpoint on loopback answering from a `Scripted`."""
    state = {"script": None}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            text = state["script"].answer(body["messages"][-1]["content"])
            if text is None:
                self.send_response(400)
                payload = {"error": {"message": "scripted refusal", "type": "invalid_request_error"}}
            else:
                self.send_response(200)
                payload = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": text}}],
                           "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
            data = json.dumps(payload).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", state
    server.shutdown()


def test_pass_b_keeps_what_both_prompts_agree_on_over_a_real_endpoint(endpoint, monkeypatch):
    url, state = endpoint
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    state["script"] = Scripted("identity, flip_h", {"flip_h"})
    ask = endpoint_asker(url, "m")
    task = gravity_task()
    v = pass_b(task, ask, ask)
    assert v.keeps == ("identity", "flip_h"), v
    assert len(state["script"].prompts) == 8  # one list prompt, one check per symmetry
    # the test pair's output never enters a prompt
    assert all(grid_json(task.test[0].output) not in p for p in state["script"].prompts)
    state["script"] = Scripted("identity, flip_h, rot180", {"flip_h"})
    v = pass_b(task, ask, ask)
    assert v.keeps is None and "list: identity, rot180, flip_h; check: identity, flip_h" in v.why


@pytest.mark.slow
def test_carc_labels_make_writes_both_passes_resumes_pass_b_and_the_source_serves_the_decision(
        endpoint, monkeypatch, tmp_path):
    url, state = endpoint
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    tasks = {"gravity": gravity_task(), "mirror": arc1_tasks("training")["68b16354"],
             "hard": next(iter(arc2_new_eval_tasks().values()))}
    monkeypatch.setattr("orchestrator.labelling.track_tasks", lambda track: tasks)
    out = tmp_path / "labels.yaml"
    # the endpoint fails every call about the mirror task (its first train input shows in the prompt)
    state["script"] = Scripted("identity, flip_h", {"flip_h"}, fail_on=grid_json(tasks["mirror"].train[0].input))
    args = ["labels", "make", "--out", str(out), "--endpoint", url, "--model", "m", "--workers", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    labels = load_labels_file(out)
    g, m, h = (labels.tasks[t] for t in ("gravity", "mirror", "hard"))
    assert (g.decision.status, g.decision.symmetries, g.decision.decided_by) == (
        "decided", ("identity", "flip_h"), ("A", "B"))
    assert m.verdicts["B"].keeps is None and "the endpoint failed" in m.verdicts["B"].why
    assert m.decision.status == "undecided"
    assert h.verdicts["A"].keeps is None and h.decision.symmetries == ("identity",)
    # again: only the task whose endpoint failed is asked again
    asked = len(state["script"].prompts)
    state["script"] = Scripted("identity, rot180, flip_h, flip_v", {"rot180", "flip_h", "flip_v"})
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert asked == 8 + 1 + 8  # the mirror task's first call failed, and stopped its pass B
    assert len(state["script"].prompts) == 8  # a new script: only the mirror task was asked
    labels = load_labels_file(out)
    assert labels.tasks["mirror"].decision.symmetries == ("identity", "rot180", "flip_h", "flip_v")
    assert labels.tasks["gravity"].decision.decided_by == ("A", "B")  # kept, not asked again
    # without an endpoint pass A runs again and pass B's verdicts stay
    result = CliRunner().invoke(app, ["labels", "make", "--out", str(out), "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert load_labels_file(out).tasks["mirror"].decision.decided_by == ("A", "B")
    source = FramedSource(tasks, "t", labels_file=out)
    assert source.allowed_symmetries("gravity") == ("identity", "flip_h")
    assert source.allowed_symmetries("hard") == ("identity",)
    assert "decided 2 (all 8 kept 0, own frame only 0), undecided 1" in result.output


# ----- the file -----

def test_a_labels_file_round_trips_and_a_hand_decision_is_served(tmp_path):
    labels = LabelsFile("arc2", {"A": {"method": "m", "ran": True}}, {
        "t1": label_task("t1", {"A": Verdict(ALL, "p"), "B": Verdict.not_run()}),
        "t2": label_task("t2", {"A": Verdict(None, "none"), "B": Verdict.not_run()})})
    path = tmp_path / "l.yaml"
    path.write_text(render_labels(labels, "a header"))
    back = load_labels_file(path)
    assert back.allowed() == {"t1": ALL, "t2": ("identity",)}
    assert back.tasks["t1"].verdicts["B"] == Verdict.not_run()
    assert path.read_text().startswith("# a header\n")
    data = yaml.safe_load(path.read_text())
    data["tasks"]["t2"].update(decision=["identity", "rot180"], status="decided", decided_by=["hand"])
    path.write_text(yaml.safe_dump(data))
    assert load_labels_file(path).allowed()["t2"] == ("identity", "rot180")


def test_a_bad_decision_is_an_error_naming_file_line_and_task(tmp_path):
    path = tmp_path / "l.yaml"
    path.write_text('format: 2\ntrack: arc2\ntasks:\n  "t1":\n    decision: [identity, rot45]\n'
                    '    status: decided\n')
    with pytest.raises(LabelsError, match=r"l.yaml:5: task 't1': decision: unknown symmetry 'rot45'"):
        FramedSource({}, "t", labels_file=path)
    path.write_text('format: 2\ntasks:\n  "t1":\n    status: maybe\n')
    with pytest.raises(LabelsError, match=r"l.yaml:4: task 't1': status: expected decided"):
        load_labels_file(path)


def test_the_shipped_arc2_labels_cover_all_114_new_tasks_with_pass_a():
    from importlib import resources
    text = resources.files("orchestrator").joinpath("data", "arc2_labels.yaml").read_text()
    labels = read_labels(yaml.compose(text), ARC2_LABELS)
    assert set(labels.tasks) == set(arc2_new_eval_tasks())
    assert all(label.verdicts["A"].ran for label in labels.tasks.values())
    assert labels.passes["A"]["ran"] is True


# ----- the report -----

def test_an_arc2_report_counts_tasks_by_symmetries_served_and_how_they_were_decided(tmp_path):
    from orchestrator.analysis.report import write_report
    from tests.test_report import write_cell
    ids = sorted(arc2_new_eval_tasks())[:2]
    run = tmp_path / "arc2-run"
    write_cell(run, "stateless-floor", [("stream", t, v, v, 8) for v in (0, 1) for t in ids])
    labels = LabelsFile("arc2", {"A": {"method": "m", "ran": True}}, {
        ids[0]: label_task(ids[0], {"A": Verdict(ALL, "p"), "B": Verdict.not_run()}),
        ids[1]: label_task(ids[1], {"A": Verdict(None, "none"), "B": Verdict.not_run()})})
    (run / "labels.yaml").write_text(render_labels(labels))
    (run / "grid.yaml").write_text("name: arc2-toy\ntrack: {name: arc2, labels: labels.yaml}\n"
                                   "learners: [stateless-floor]\n")
    text = write_report(run, resamples=200).read_text()
    section = text.split("## Frames served", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|--") and "---" not in line]
    assert rows[0][:4] == ["symmetries", "labels status", "stream tasks", "track tasks"], rows
    assert rows[1][:5] == ["8", "decided by A", "1", "1", "labels.yaml"], rows
    assert rows[2][:4] == ["1", "not listed", "0", "112"], rows
    assert rows[3][:4] == ["1", "undecided", "1", "1"], rows
    # a run on a track without frames has no such section
    (run / "grid.yaml").write_text("name: own-toy\nlearners: [stateless-floor]\n")
    assert "## Frames served" not in write_report(run, resamples=200).read_text()
