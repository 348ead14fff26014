"""Program search over the grid DSL: the embedded solver model's only skill.

A program is a short chain of DSL steps. The search enumerates chains breadth first and keeps
those that map every pair's input to its output. It is bounded by counts only (depth, candidates
evaluated per level), never by time.

Two ways to call it:
- `search`: the exhaustive reference order (fewest steps, then the fixed primitive order of
  `dsl.PRIMITIVES`) within the level caps of `BUDGETS`; the same call always gives the same programs.
- `explore`: what the model does on one reply, with bounded compute. It evaluates at most
  `SAMPLED[effort]` candidate steps, in an order drawn from the generator it is given (the
  frontier, the primitives after each prefix and their learnt bindings are shuffled), and keeps,
  beside the programs that fit every pair, the best partial fit: the candidate that reproduces the
  most pairs, then the most cells. A different generator explores a different part of the space.

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
from solver_model.prior import PrimitivePrior

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
PRIMITIVE_NAMES = tuple(p.name for p in dsl.PRIMITIVES)
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


# The exhaustive reference caps (`search`).
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


# The caps of one reply (`explore`): candidates evaluated per level, in a drawn order. They are
# the embedded model's compute per reply and the one place its skill is set; calibrated only
# against the seed's first-answer accuracy on first meetings (32 / 47 / 68 % at low / medium /
# high; see solver_model/CALIBRATION.md and `python bench/solver.py`).
SAMPLED: dict[str, tuple[Level, ...]] = {
    "low": (
        Level(_ALL, _SYMMETRY_STEPS | {"crop_bbox"}, 10),
        Level(_SYMMETRY_STEPS | {"colour_map", "crop_bbox"}, _NONE, 10),
    ),
    "medium": (
        Level(_ALL, _ALL, 30),
        Level(_ALL, _NONE, 150),
    ),
    "high": (
        Level(_ALL, _ALL, 120),
        Level(_ALL, RESTRICTED, 1_000),
        Level(_ALL, _NONE, 2_000),
    ),
}


@dataclass(frozen=True)
class Exploration:
    """What one bounded reply's search found.

    `found`: programs that fit every pair, in the order found (one per distinct test output when
    a test input was given); `partial`: the best candidate that fits some pairs but not all (None
    when nothing ran or everything fit); `partial_fit`: its share of pair cells reproduced (0..1;
    a pair of the wrong shape counts 0); `evaluated`: candidate steps evaluated.
    """

    found: tuple[Program, ...]
    partial: Program | None
    partial_fit: float
    evaluated: int


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


def explore(pairs: Sequence[Demo], effort: str, rng: np.random.Generator,
            test_input: Grid | None = None, exclude: Collection[str] = (),
            levels: Sequence[Level] | None = None, prior: PrimitivePrior | None = None) -> Exploration:
    """One reply's bounded search: at most the caps of `SAMPLED[effort]` (or `levels`), in an
    order drawn from `rng`, keeping the best partial fit beside the programs that fit. Programs
    whose describe() is in `exclude` are neither found nor kept as the partial fit. With `prior`
    (solver_model/prior.py) the primitives' order is drawn by its weights instead of uniformly."""
    if effort not in EFFORTS:
        raise ValueError(f"effort {effort!r} is not one of {', '.join(EFFORTS)}")
    if not pairs:
        return Exploration((), None, 0.0, 0)
    run = _Search(pairs, test_input, frozenset(exclude), rng, prior)
    found = run.run(SAMPLED[effort] if levels is None else levels)
    partial = None
    if run.partial is not None:
        partial = Program(tuple(Step(name, params) for name, params in run.partial))
    return Exploration(tuple(found), partial, run.partial_score[1], run.evaluated)


class _Search:
    def __init__(self, pairs: Sequence[Demo], test_input: Grid | None, exclude: frozenset[str],
                 rng: np.random.Generator | None = None, prior: PrimitivePrior | None = None) -> None:
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
        # Bounded mode (explore): a drawn order, and the best partial fit kept.
        self.rng = rng
        self.log_weights = None if prior is None else np.log(prior.weights(PRIMITIVE_NAMES))
        self.partial: tuple[StepKey, ...] | None = None
        self.partial_score: tuple[int, float] = (0, 0.0)  # (pairs reproduced, share of cells)
        self.evaluated = 0

    def run(self, levels: Sequence[Level]) -> list[Program]:
        # The empty chain is the input itself; as a program it is identity, the first primitive.
        signature = self.root.signature
        if all(self.root.states[i].key == self.output_keys[i] for i in range(self.n_pairs)):
            self._record(_Node((("identity", ()),), self.root.states), signature)
        elif self.rng is not None:
            self._score(("identity", ()), (), self.root.states)
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
        if self.rng is not None:
            frontier = [frontier[i] for i in self.rng.permutation(len(frontier))]
        for node in frontier:
            last = node.steps[-1][0] if node.steps else None
            examples = None
            primitives = dsl.PRIMITIVES
            if self.rng is not None:
                order = (self.rng.permutation(len(primitives)) if self.log_weights is None  # uniform
                         else np.argsort(-(self.log_weights + self.rng.gumbel(size=len(primitives))),
                                         kind="stable"))  # by the prior (solver_model/prior.py)
                primitives = [primitives[i] for i in order]
            for primitive in primitives:
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
                    if self.rng is not None and len(bindings) > 1:
                        bindings = [bindings[i] for i in self.rng.permutation(len(bindings))]
                for params in bindings:
                    if evaluated >= level.cap:
                        return next_frontier
                    evaluated += 1
                    self.evaluated += 1
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
            elif self.rng is not None:
                self._score(step, node.steps, [self._apply(node, index, step)
                                               for index in range(len(node.states))])
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
            return
        if final and self.rng is not None:
            self._score(step, node.steps, states)
        if signature not in self.seen:
            self.seen.add(signature)
            self.detours.add(signature)
            next_frontier.append(child)

    def _score(self, step: StepKey, prefix: tuple[StepKey, ...],
               states: Sequence[_State | None]) -> None:
        """Keep the chain as the best partial fit if it beats the one held (and applies to the
        test input): more pairs reproduced, then a larger share of pair cells right."""
        if self.has_test and states[-1] is None:
            return
        matched, cells = 0, 0.0
        for index in range(self.n_pairs):
            state = states[index]
            if state is None or state.array.shape != self.outputs[index].shape:
                continue
            if state.key == self.output_keys[index]:
                matched += 1
                cells += 1.0
            else:
                cells += float(np.mean(state.array == self.outputs[index]))
        score = (matched, cells / self.n_pairs)
        if score <= self.partial_score:
            return
        steps = prefix + (step,) if step[0] != "identity" or prefix else (step,)
        if Program(tuple(Step(n, p) for n, p in steps)).describe() in self.exclude:
            return
        self.partial, self.partial_score = steps, score

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
