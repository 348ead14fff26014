"""Two-pass symmetry labels: which symmetries of the square a task's rule survives, decided by
independent passes over its pairs (the seed: "we labelled each task with the symmetries its rule
survives, from two independent passes over every pair").

A labels file of format 2 holds, per task, each pass's verdict and the decision drawn from them:

    format: 2
    track: arc2
    passes:
      A: {method: "...", ran: true}
      B: {method: "...", ran: false}
    tasks:
      "136b0064":
        A: {keeps: [identity, flip_h], why: "program: flip_h | colour_map"}
        B: {keeps: null, why: "not run"}
        decision: [identity, flip_h]
        status: decided
        decided_by: [A]

The rule (`decide`): a task is decided when every pass that ran gave a verdict and the verdicts
agree; it then keeps exactly those symmetries. A task a pass could not judge is `undecided`, one
on which verdicts differ is a `disagreement`; both are served in their own frame (identity:
recolourings only) until decided. A pass that did not run (pass B without an endpoint) does not
block a decision: the file says which passes decided each task, and the report counts them. A
reader may settle a task by hand: `decision: [...]`, `status: decided`, `decided_by: [hand]`; the
loader serves what `decision` says whenever `status` is `decided`.

`orchestrator/labelling.py` (`carc labels make`) runs the passes and writes the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping

import yaml

from orchestrator.errors import ConfigError

SYMMETRY_NAMES: tuple[str, ...] = ("identity", "rot90", "rot180", "rot270", "flip_h", "flip_v",
                                   "transpose", "antitranspose")
FORMAT = 2
PASSES = ("A", "B")
Status = Literal["decided", "undecided", "disagreement"]


class LabelsError(ConfigError):
    """A symmetry labels file that cannot be used; the message names the file, line and task."""


@dataclass(frozen=True)
class Verdict:
    """One pass's verdict on one task: the symmetries it keeps (always with identity), or None
    when it could not judge; `why` says what it saw (the program, the model's answers) or why not.
    `ran` is False for a pass that was not run at all (no endpoint)."""

    keeps: tuple[str, ...] | None
    why: str = ""
    ran: bool = True

    @staticmethod
    def not_run(why: str = "not run") -> "Verdict":
        return Verdict(None, why, ran=False)


@dataclass(frozen=True)
class Decision:
    symmetries: tuple[str, ...]  # what a framed visit may use: the decision, or identity only
    status: Status
    decided_by: tuple[str, ...] = ()
    why: str = ""


def ordered(names) -> tuple[str, ...]:
    """`names` in the canonical order, identity always included."""
    names = set(names) | {"identity"}
    return tuple(s for s in SYMMETRY_NAMES if s in names)


def decide(verdicts: Mapping[str, Verdict]) -> Decision:
    """The decision from the passes' verdicts (see the module docstring)."""
    ran = {name: v for name, v in verdicts.items() if v.ran}
    if not ran:
        return Decision(("identity",), "undecided", (), "no pass ran")
    blind = [name for name, v in ran.items() if v.keeps is None]
    if blind:
        return Decision(("identity",), "undecided", (),
                        "; ".join(f"pass {n} gave no verdict ({ran[n].why})" for n in blind))
    sets = {name: ordered(v.keeps or ()) for name, v in ran.items()}
    if len(set(sets.values())) > 1:
        return Decision(("identity",), "disagreement", (),
                        "; ".join(f"pass {n} keeps {', '.join(s)}" for n, s in sets.items()))
    keeps = next(iter(sets.values()))
    return Decision(keeps, "decided", tuple(sorted(ran)), "")


@dataclass
class TaskLabel:
    task_id: str
    verdicts: dict[str, Verdict]
    decision: Decision


@dataclass
class LabelsFile:
    track: str
    passes: dict[str, dict] = field(default_factory=dict)  # pass -> {method, ran, ...}
    tasks: dict[str, TaskLabel] = field(default_factory=dict)

    def allowed(self) -> dict[str, tuple[str, ...]]:
        """Task id -> the symmetries a framed visit may use (identity only unless decided)."""
        return {t: label.decision.symmetries for t, label in self.tasks.items()}

    def counts(self) -> dict[str, int]:
        """Tasks by status, by pass verdict, and the seed's two figures among decided tasks (all 8
        kept, own frame only); an undecided task is served in its own frame but not counted there."""
        labels = list(self.tasks.values())
        out = {"tasks": len(labels)}
        for status in ("decided", "undecided", "disagreement"):
            out[status] = sum(label.decision.status == status for label in labels)
        for name in PASSES:
            out[f"pass {name} verdicts"] = sum(
                name in label.verdicts and label.verdicts[name].keeps is not None for label in labels)
        decided = [label.decision.symmetries for label in labels if label.decision.status == "decided"]
        out["all 8 kept"] = sum(len(s) == 8 for s in decided)
        out["own frame only"] = sum(len(s) == 1 for s in decided)  # decided so, not undecided
        return out


def label_task(task_id: str, verdicts: Mapping[str, Verdict]) -> TaskLabel:
    return TaskLabel(task_id, dict(verdicts), decide(verdicts))


# ----- reading and writing -----

def _verdict_data(v: Verdict) -> dict:
    data: dict = {"keeps": list(v.keeps) if v.keeps is not None else None, "why": v.why}
    if not v.ran:
        data["ran"] = False
    return data


def render_labels(labels: LabelsFile, header: str = "") -> str:
    """The file's text: `header` (comment lines) and the YAML body, tasks in id order."""
    body = {"format": FORMAT, "track": labels.track, "passes": labels.passes, "tasks": {}}
    for task_id in sorted(labels.tasks):
        label = labels.tasks[task_id]
        entry = {name: _verdict_data(label.verdicts[name])
                 for name in sorted(label.verdicts, key=lambda n: (n not in PASSES, n))}
        entry["decision"] = list(label.decision.symmetries)
        entry["status"] = label.decision.status
        entry["decided_by"] = list(label.decision.decided_by)
        if label.decision.why:
            entry["why"] = label.decision.why
        body["tasks"][task_id] = entry
    text = yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=100)
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines()) if header else ""
    return comments + text


def is_format_2(root: yaml.Node) -> bool:
    return isinstance(root, yaml.MappingNode) and any(
        isinstance(k, yaml.ScalarNode) and k.value == "format" for k, _ in root.value)


def _symmetry_list(node: yaml.Node, where: str, task_id: str, what: str) -> tuple[str, ...] | None:
    if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
        return None
    if not isinstance(node, yaml.SequenceNode):
        raise LabelsError(f"{where}:{node.start_mark.line + 1}: task {task_id!r}: {what}: expected a "
                          f"list of symmetry names (or null), e.g. [identity, rot180]")
    names = []
    for item in node.value:
        if not isinstance(item, yaml.ScalarNode) or item.value not in SYMMETRY_NAMES:
            bad = item.value if isinstance(item, yaml.ScalarNode) else "a nested value"
            raise LabelsError(f"{where}:{item.start_mark.line + 1}: task {task_id!r}: {what}: unknown "
                              f"symmetry {bad!r}; known: {', '.join(SYMMETRY_NAMES)}")
        names.append(item.value)
    return ordered(names)


def _mapping(node: yaml.Node, where: str, what: str) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise LabelsError(f"{where}:{node.start_mark.line + 1}: {what}: expected a mapping")
    out: dict[str, yaml.Node] = {}
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode) or not key.value:
            raise LabelsError(f"{where}:{key.start_mark.line + 1}: {what}: a key must be a plain string")
        if key.value in out:
            raise LabelsError(f"{where}:{key.start_mark.line + 1}: {what}: {key.value!r} is given twice")
        out[key.value] = value
    return out


def read_labels(root: yaml.Node, where: str) -> LabelsFile:
    """A format-2 labels file from its composed YAML (ids stay strings as written; errors carry
    the file and line)."""
    top = _mapping(root, where, "the labels file")
    fmt = top.get("format")
    if not isinstance(fmt, yaml.ScalarNode) or fmt.value != str(FORMAT):
        line = fmt.start_mark.line + 1 if fmt is not None else 1
        raise LabelsError(f"{where}:{line}: format: this carc reads symmetry labels of format {FORMAT} "
                          f"(or the flat mapping of task id to symmetry list)")
    track = top.get("track")
    passes_node = top.get("passes")
    passes = yaml.safe_load(yaml.serialize(passes_node)) if passes_node is not None else {}
    labels = LabelsFile(track.value if isinstance(track, yaml.ScalarNode) else "", passes or {})
    tasks = top.get("tasks")
    if tasks is None or (isinstance(tasks, yaml.ScalarNode) and tasks.tag.endswith(":null")):
        return labels
    for task_id, node in _mapping(tasks, where, "tasks").items():
        line = node.start_mark.line + 1
        entry = _mapping(node, where, f"task {task_id!r}")
        verdicts = {}
        for name in (k for k in entry if k in PASSES):
            fields = _mapping(entry[name], where, f"task {task_id!r}: pass {name}")
            keeps = _symmetry_list(fields["keeps"], where, task_id, f"pass {name}: keeps") \
                if "keeps" in fields else None
            why = fields["why"].value if isinstance(fields.get("why"), yaml.ScalarNode) else ""
            ran = not (isinstance(fields.get("ran"), yaml.ScalarNode) and fields["ran"].value == "false")
            verdicts[name] = Verdict(keeps, why, ran)
        status = entry["status"].value if isinstance(entry.get("status"), yaml.ScalarNode) else None
        if status not in ("decided", "undecided", "disagreement"):
            raise LabelsError(f"{where}:{line}: task {task_id!r}: status: expected decided, undecided "
                              f"or disagreement")
        if status == "decided":
            if "decision" not in entry:
                raise LabelsError(f"{where}:{line}: task {task_id!r}: decided, but no decision: give "
                                  f"decision: [identity, ...]")
            symmetries = _symmetry_list(entry["decision"], where, task_id, "decision") or ("identity",)
        else:
            symmetries = ("identity",)  # served in its own frame until decided
        by = entry.get("decided_by")
        decided_by = tuple(i.value for i in by.value) if isinstance(by, yaml.SequenceNode) else ()
        why = entry["why"].value if isinstance(entry.get("why"), yaml.ScalarNode) else ""
        labels.tasks[task_id] = TaskLabel(task_id, verdicts, Decision(symmetries, status, decided_by, why))
    return labels


def load_labels_file(path: str | Path) -> LabelsFile:
    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise LabelsError(f"{where}: cannot read the symmetry labels file: {e.strerror}") from None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        raise LabelsError(f"{where}: not valid YAML: {e}") from None
    if root is None:
        return LabelsFile("")
    return read_labels(root, where)
