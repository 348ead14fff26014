"""How many of a frames track's tasks are served with how many symmetries, and who decided them.

A frames track (arc2, or arc1 with `source: frames`) serves each visit of a task under a
symmetry its labels allow and a fresh recolouring. The report counts, for the run's stream tasks
and for the whole track, the tasks by the number of symmetries served and by the labels' status:
decided by which passes, undecided or in disagreement (served in their own frame until decided),
or not listed in a flat labels file.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from orchestrator.records import RunPaths
from orchestrator.tasks.labels import is_format_2, read_labels

TITLE = "Frames served"
INTRO = ("Each visit of a task comes in a frame no earlier visit of it used: one of the "
         "symmetries of the square its labels allow, and a fresh recolouring. Tasks by the number "
         "of symmetries served and how their labels were decided (orchestrator/tasks/labels.py): "
         "by which passes (A: the embedded program search; B: a model asked two ways), or "
         "undecided / in disagreement, served in their own frame (recolourings only) until "
         "decided. `labels` names the file the run read.")
COLUMNS = ["symmetries", "labels status", "stream tasks", "track tasks", "labels"]


def _track(run_dir: Path) -> tuple[str | None, Path | None, str | None]:
    """(track name, labels file or None for the shipped one, the shipped file's name) of a frames
    track; (None, None, None) for any other track."""
    path = RunPaths(run_dir).grid
    if not path.exists():
        return None, None, None
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    track = data.get("track") or {}
    name, source = track.get("name", "own"), track.get("source")
    if not (name == "arc2" or (name == "arc1" and source == "frames")):
        return None, None, None
    labels = track.get("labels")
    file = None if not labels else (Path(labels) if Path(labels).is_absolute() else path.parent / labels)
    from orchestrator.tasks.frames import ARC2_LABELS, DEFAULT_LABELS
    return name, file, ARC2_LABELS if name == "arc2" else DEFAULT_LABELS


def _statuses(text: str, where: str) -> dict[str, tuple[int, str]]:
    """Task id -> (symmetries served, status) from a labels file of either format."""
    root = yaml.compose(text)
    if root is None:
        return {}
    if is_format_2(root):
        labels = read_labels(root, where)
        out = {}
        for task_id, label in labels.tasks.items():
            d = label.decision
            status = f"decided by {' and '.join(d.decided_by)}" if d.status == "decided" else d.status
            out[task_id] = (len(d.symmetries), status)
        return out
    from orchestrator.tasks.frames import parse_symmetry_labels
    return {t: (len(s), "listed (flat file)") for t, s in parse_symmetry_labels(text, where).items()}


def frames_table(run_dir: Path, instances: pd.DataFrame) -> pd.DataFrame | None:
    """The table, or None when the run's track serves no frames."""
    from orchestrator.tasks.frames import shipped_labels_text
    from orchestrator.tasks.public import arc1_tasks, arc2_new_eval_tasks
    name, file, shipped = _track(run_dir)
    if name is None:
        return None
    text = file.read_text() if file is not None else shipped_labels_text(shipped)
    where = str(file) if file is not None else shipped
    statuses = _statuses(text, where)
    track_tasks = list(arc2_new_eval_tasks() if name == "arc2" else arc1_tasks("training"))
    stream = set(instances.loc[instances["phase"] == "stream", "task"]) if not instances.empty else set()
    rows: dict[tuple[int, str], list[int]] = {}
    for task_id in track_tasks:
        key = statuses.get(task_id, (1, "not listed"))
        counts = rows.setdefault(key, [0, 0])
        counts[0] += task_id in stream
        counts[1] += 1
    shown = Path(where).name if file is not None else where
    table = pd.DataFrame([[n, status, s, t, shown] for (n, status), (s, t) in rows.items()],
                         columns=COLUMNS)
    return table.sort_values(["symmetries", "labels status"], ascending=[False, True],
                             kind="stable").reset_index(drop=True)
