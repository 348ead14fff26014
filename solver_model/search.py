"""Deterministic program search over the grid DSL: the embedded solver model's only skill.

A program is a short chain of DSL steps. The search enumerates chains breadth first (fewest
steps, then the fixed primitive order of `dsl.PRIMITIVES`) and keeps those that map every pair's
input to its output. It is bounded by counts only (depth, candidates evaluated per level), so the
same call always returns the same programs.

Pruning: a candidate step runs on the first pair before any other; each step's result on a pair
is memoised by (grid, step); and a chain whose grids on every known input (the pairs' inputs, plus
the test input when given) equal those of an earlier chain is dropped, as prefix and as answer.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.arc import Demo, Grid, GridError, as_grid
from solver_model import dsl

EFFORTS = ("low", "medium", "high")

StepKey = tuple[str, tuple]  # (primitive name, bound parameters): the search's working form of a Step


@dataclass(frozen=True)
class Step:
    """One primitive with its parameters bound, e.g. colour_map with ((1, 2), (3, 4))."""

    name: str
    params: tuple = ()

    def describe(self) -> str:
        if not self.params:
            return self.name
        parts = (f"{p[0]}:{p[1]}" if isinstance(p, tuple) else str(p) for p in self.params)
        return f"{self.name}{{{','.join(parts)}}}"


@dataclass(frozen=True)
class Program:
    """A chain of DSL steps, applied left to right."""

    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("a program needs at least one step (use identity for none)")
        unknown = [s.name for s in self.steps if s.name not in dsl.BY_NAME]
        if unknown:
            raise ValueError(f"unknown DSL primitive(s) {unknown}; see solver_model.dsl.PRIMITIVES")

    def __call__(self, grid: Grid) -> Grid | None:
        """The program's output, or None when a step does not apply (or `grid` is not a grid)."""
        try:
            array = dsl.to_array(as_grid(grid))
        except GridError:
            return None
        for step in self.steps:
            array = dsl.apply_step(step.name, step.params, array)
            if array is None:
                return None
        return dsl.to_grid(array)

    def describe(self) -> str:
        return " | ".join(step.describe() for step in self.steps)

    def source(self) -> str:
        """Standalone standard-library Python defining transform(grid), equal to calling the program."""
        names = list(dict.fromkeys(step.name for step in self.steps))
        steps = "".join(f"    ({step.name}, {step.params!r}),\n" for step in self.steps)
        return (
            f"# program: {self.describe()}\n"
            f"# Written by carc's solver model (a DSL program search); standard library only.\n"
            f"\n\n{dsl.portable_source(names)}\n\n"
            f"STEPS = [\n{steps}]\n"
            "\n\n"
            "def transform(grid):\n"
            "    grid = [list(row) for row in grid]\n"
            "    for step, params in STEPS:\n"
            "        grid = step(grid, *params)\n"
            f"        if grid is None or not 1 <= len(grid) <= {dsl.MAX_SIDE} "
            f"or not 1 <= len(grid[0]) <= {dsl.MAX_SIDE}:\n"
            "            return None\n"
            "    return grid\n"
        )


def consistent(program: Program, pairs: Sequence[Demo]) -> bool:
    """Whether the program maps every pair's input to exactly its output."""
    return all(program(pair.input) == pair.output for pair in pairs)


# --- budgets -----------------------------------------------------------------------------------

_ALL = frozenset(dsl.BY_NAME)
_NONE: frozenset[str] = frozenset()
_SYMMETRY_STEPS = dsl.SYMMETRY_NAMES - {"identity"}

# Second steps worth extending to a third (high effort): steps that commonly chain in ARC tasks.
# (Steps that learn from the output, such as colour_map, only ever come last and need no place here.)
RESTRICTED = _SYMMETRY_STEPS | {
    "remove_colour", "keep_colour", "keep_majority_colour", "crop_bbox", "extract_colour",
    "crop_largest_object", "crop_smallest_object", "keep_largest_object", "keep_smallest_object",
    "hollow", "fill_bbox", "remove_noise", "gravity_down", "gravity_up", "gravity_left",
    "gravity_right", "scale_2", "scale_3", "downscale_2", "tile_1x2", "tile_2x1", "tile_2x2",
    "mirror_right", "mirror_down", "mirror_quad", "left_half", "right_half", "top_half", "bottom_half",
}


@dataclass(frozen=True)
class Level:
    """What one depth of the search may try.

    `final`: primitives tried as the last step of a program of this depth;
    `extend`: primitives whose results become prefixes for the next depth;
    `cap`: candidate steps evaluated (on the first pair) before the level stops.
    """

    final: frozenset[str]
    extend: frozenset[str]
    cap: int


BUDGETS: dict[str, tuple[Level, ...]] = {
    "low": (
        Level(_ALL, _SYMMETRY_STEPS | {"crop_bbox"}, 1_000),
        Level(_SYMMETRY_STEPS | {"colour_map", "crop_bbox"}, _NONE, 200),
    ),
    "medium": (
        Level(_ALL, _ALL, 1_000),
        Level(_ALL, _NONE, 12_000),
    ),
    "high": (
        Level(_ALL, _ALL, 1_000),
        Level(_ALL, RESTRICTED, 20_000),
        Level(_ALL, _NONE, 200_000),
    ),
}


# --- the search --------------------------------------------------------------------------------


class _Miss:
    """Memo marker: the step was computed there and did not give the pair's output."""


_MISS = _Miss()


class _State:
    """A grid reached on one input, with its hashable key."""

    __slots__ = ("array", "key")

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.key = (array.shape, array.tobytes())


@dataclass
class _Node:
    steps: tuple[StepKey, ...]
    states: tuple[_State, ...]  # one per known input: the pairs' inputs, then the test input

    @property
    def signature(self) -> tuple:
        return tuple(s.key for s in self.states)


def search(pairs: Sequence[Demo], effort: str, test_input: Grid | None = None,
           exclude: Collection[str] = ()) -> list[Program]:
    """Every program found that maps each pair's input to its output, simplest first (fewest steps,
    then a fixed primitive order), skipping programs whose describe() is in `exclude`. When
    `test_input` is given, programs inapplicable to it are dropped and programs giving the same
    test output as an earlier one are dropped (one per distinct answer). Deterministic: bounded by
    counts (depth, candidates evaluated), never by wall-clock time."""
    if effort not in EFFORTS:
        raise ValueError(f"effort {effort!r} is not one of {', '.join(EFFORTS)}")
    if not pairs:
        return []
    return _Search(pairs, test_input, frozenset(exclude)).run(BUDGETS[effort])


class _Search:
    def __init__(self, pairs: Sequence[Demo], test_input: Grid | None, exclude: frozenset[str]) -> None:
        inputs = [pair.input for pair in pairs] + ([test_input] if test_input is not None else [])
        self.n_pairs = len(pairs)
        self.has_test = test_input is not None
        self.root = _Node((), tuple(_State(dsl.to_array(g)) for g in inputs))
        self.outputs = [dsl.to_array(pair.output) for pair in pairs]
        self.output_keys = [_State(o).key for o in self.outputs]
        self.exclude = exclude
        self.memo: list[dict] = [{} for _ in inputs]
        self.seen: set[tuple] = set()  # the grids of every chain kept, as prefix or answer
        self.detours: set[tuple] = set()  # the grids of the input and of every prefix that is no answer
        self.found: list[Program] = []

    def run(self, levels: Sequence[Level]) -> list[Program]:
        # The empty chain is the input itself; as a program it is identity, the first primitive.
        signature = self.root.signature
        if all(self.root.states[i].key == self.output_keys[i] for i in range(self.n_pairs)):
            self._record(_Node((("identity", ()),), self.root.states), signature)
        self.seen.add(signature)
        self.detours.add(signature)
        frontier = [self.root]
        for depth, level in enumerate(levels, start=1):
            frontier = self._level(frontier, depth, level)
        return self.found

    def _apply(self, node: _Node, index: int, step: StepKey) -> _State | None:
        """The step's grid on one input, memoised by (grid, step)."""
        key = (node.states[index].key, step)
        memo = self.memo[index]
        state = memo.get(key, _MISS)
        if state is _MISS:
            out = dsl.apply_step(step[0], step[1], node.states[index].array)
            state = memo[key] = None if out is None else _State(out)
        return state

    def _matches(self, node: _Node, index: int, step: StepKey) -> bool:
        """Whether the step gives pair `index`'s output; a miss is memoised without its grid."""
        key = (node.states[index].key, step)
        memo = self.memo[index]
        state = memo.get(key, _MISS)
        if state is _MISS and key not in memo:
            out = dsl.apply_step(step[0], step[1], node.states[index].array)
            state = None if out is None else _State(out)
            # Most last steps miss; keeping only a marker keeps the memo small at the deepest level.
            memo[key] = state if state is not None and state.key == self.output_keys[index] else _MISS
        return state is not None and state is not _MISS and state.key == self.output_keys[index]

    def _level(self, frontier: list[_Node], depth: int, level: Level) -> list[_Node]:
        """Try every allowed step after every prefix; record answers; return the next prefixes."""
        next_frontier: list[_Node] = []
        evaluated = 0
        for node in frontier:
            last = node.steps[-1][0] if node.steps else None
            examples = None
            for primitive in dsl.PRIMITIVES:
                name = primitive.name
                final = name in level.final
                extend = name in level.extend and not primitive.final_only
                if not (final or extend):
                    continue
                if name == "identity":
                    continue  # tried as the empty chain, before any level
                if last in dsl.SYMMETRY_NAMES and name in dsl.SYMMETRY_NAMES:
                    continue  # two symmetries compose to one, already tried a level up
                if primitive.learn is None:
                    bindings: list[tuple] = [()]
                else:
                    if examples is None:
                        examples = [(node.states[i].array, self.outputs[i]) for i in range(self.n_pairs)]
                    bindings = primitive.learn(examples)
                for params in bindings:
                    if evaluated >= level.cap:
                        return next_frontier
                    evaluated += 1
                    self._try(node, (name, params), final, extend, next_frontier)
        return next_frontier

    def _try(self, node: _Node, step: StepKey, final: bool, extend: bool, next_frontier: list[_Node]) -> None:
        if not extend:
            # Only ever a last step: what matters on each pair is whether it gives the output.
            if all(self._matches(node, index, step) for index in range(self.n_pairs)):
                states = [self._apply(node, index, step) for index in range(len(node.states))]
                if states[-1] is not None:  # None only for a test input it does not apply to
                    child = _Node(node.steps + (step,), tuple(states))
                    self._record(child, child.signature)
            return
        answer = final
        states = []
        for index in range(len(node.states)):
            state = self._apply(node, index, step)
            if state is None:
                return  # inapplicable to a pair or to the test input: neither answer nor prefix
            answer = answer and (index >= self.n_pairs or state.key == self.output_keys[index])
            states.append(state)
        child = _Node(node.steps + (step,), tuple(states))
        signature = child.signature
        if answer:
            self._record(child, signature)  # an answer is not extended: its pairs are already right
        elif signature not in self.seen:
            self.seen.add(signature)
            self.detours.add(signature)
            next_frontier.append(child)

    def _record(self, child: _Node, signature: tuple) -> None:
        # With a test input the signature holds the test output: one program per distinct answer.
        # Without one, every answer has the same signature, so only detours are dropped: chains
        # that arrive where a shorter chain already stood (the input itself, a non-answer prefix).
        duplicate = signature in (self.seen if self.has_test else self.detours)
        if duplicate:
            return
        program = Program(tuple(Step(name, params) for name, params in child.steps))
        if program.describe() in self.exclude:
            return  # as if it did not exist: it does not hide an equivalent program
        self.found.append(program)
        self.seen.add(signature)
