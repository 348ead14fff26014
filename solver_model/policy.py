"""The embedded solver model's policy: from a conversation state to the text of its next reply.

Each reply runs one bounded search (`search.explore`) in an order drawn from a generator seeded
by the model seed and the conversation's content, so the same conversation always gets the same
reply, and a conversation that differs in anything (a returning task's new test input, one more
verdict) is searched afresh. The policy buys a demonstration pair while it holds none, or while
the programs that fit disagree widely on the test input and few pairs are held; otherwise it
submits the first fitting program's output (or, in program mode, the program itself). When
nothing fits within the reply's budget it commits to its best partial fit if that fits well
enough (`COMMIT_FIT`) or no pair is left to buy, as a model answering without verifying does;
else it buys a pair. With nothing at all and no pair left it submits a fallback guess not yet
judged incorrect, so an instance always moves toward its end. It knows nothing but the
conversation: no memory of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.arc import Demo, Grid, as_grid, grid_json, grid_list
from orchestrator.tasks.base import MAX_DEMOS
from solver_model.conversation import PREDICTED_OUTPUT, ConversationState, Mode
from solver_model.prior import PrimitivePrior
from solver_model.search import EFFORTS, Exploration, Program, explore

# (pairs, effort, test_input, exclude=..., rng=...) -> Exploration; tests inject small ones.
SearchFn = Callable[..., Exploration]

REQUEST = '{"action": "request_demos"}'
FINISH = '{"action": "finish"}'
NOTHING_TO_ADD = "Nothing to add."

# Another pair is worth buying only while the candidates disagree widely: this many different
# test outputs. On ARC-1 (training and evaluation, medium effort) buying on any disagreement cost
# more than submitting the simplest; buying at 10 answers cost least and solved the most.
WIDE_DISAGREEMENT = 10
# ... and only until this many pairs are held (more effort finds more look-alikes).
PAIRS_WORTH_HOLDING = {"low": 2, "medium": 2, "high": 3}
# With nothing that fits every pair, the best partial fit is committed to (submitted, or proposed
# as the program) when it reproduces at least this share of the pairs' cells; below it a pair is
# bought while one can be. Part of the guess policy calibrated in solver_model/CALIBRATION.md.
COMMIT_FIT = 0.6


def reply_generator(seed: int, digest: str) -> np.random.Generator:
    """The generator of one reply: the model seed and the conversation's content, nothing else."""
    return np.random.default_rng([seed & 0xFFFFFFFF, int(digest[:16], 16)])


def default_search(pairs, effort, test_input=None, exclude=(), rng=None) -> Exploration:
    """The bounded search of the untrained model: the `SearchFn` a reply uses unless given one."""
    return explore(pairs, effort, rng, test_input, exclude)


def prior_search(prior: PrimitivePrior) -> SearchFn:
    """The bounded search of a model trained to a primitive prior (solver_model/prior.py)."""
    def search(pairs, effort, test_input=None, exclude=(), rng=None) -> Exploration:
        return explore(pairs, effort, rng, test_input, exclude, prior=prior)
    return search


@dataclass(frozen=True)
class Reply:
    """The reply text and, when it rests on a program, that program's description."""

    text: str
    program_description: str | None = None
    program: Program | None = None  # the DSL program it rests on (not for fallback guesses)


def reply(state: ConversationState, effort: str, search: SearchFn | None = None,
          seed: int = 0) -> Reply:
    """The model's next reply to the conversation read into `state` (its generator: `seed` and
    the conversation's digest). `search` replaces the bounded program search (tests inject one)."""
    search = default_search if search is None else search
    if effort not in EFFORTS:
        raise ValueError(f"effort {effort!r} is not one of {', '.join(EFFORTS)}")
    if state.mode is Mode.OTHER:
        return Reply(NOTHING_TO_ADD)
    if state.over:
        return Reply(FINISH)
    can_buy = state.demos_used < MAX_DEMOS and not state.demos_refused
    if not state.pairs:
        return Reply(REQUEST) if can_buy else _fallback(state)

    wrong = state.wrong_grids
    exclude = state.failed_programs if state.mode is Mode.PROGRAM else frozenset()
    rng = reply_generator(seed, state.digest)
    exploration = search(state.pairs, effort, state.test_input, exclude=exclude, rng=rng)
    found = candidates(exploration.found, state.test_input, exclude)
    remaining = [(p, out) for p, out in found if out is None or out not in wrong]
    answers = {out for _, out in remaining}
    wide = len(answers) >= WIDE_DISAGREEMENT
    if wide and len(state.pairs) < PAIRS_WORTH_HOLDING[effort] and can_buy:
        return Reply(REQUEST)
    if remaining:
        program, output = remaining[0]
        if state.mode is Mode.PROGRAM:
            return Reply(program_text(program.source(), output), program.describe(), program)
        if output is not None:
            return Reply(submit_text(output), program.describe(), program)
    partial = exploration.partial
    if partial is not None and (exploration.partial_fit >= COMMIT_FIT or not can_buy):
        output = output_of(partial, state.test_input) if state.test_input is not None else None
        if state.mode is Mode.PROGRAM and partial.describe() not in exclude:
            return Reply(program_text(partial.source(), output), f"partial fit: {partial.describe()}",
                         partial)
        if state.mode is Mode.ACTION and output is not None and output not in wrong:
            return Reply(submit_text(output), f"partial fit: {partial.describe()}", partial)
    return Reply(REQUEST) if can_buy else _fallback(state)


def candidates(programs: Sequence, test_input: Grid | None,
               exclude: frozenset[str]) -> tuple[tuple[object, Grid | None], ...]:
    """Programs that fit, in the order found, each with its test output, one per distinct output.

    Candidates whose test output cannot be computed are dropped when there is a test input.
    """
    found = []
    seen: set[Grid] = set()
    for program in programs:
        if program.describe() in exclude:
            continue
        if test_input is None:
            found.append((program, None))
            continue
        output = output_of(program, test_input)
        if output is not None and output not in seen:
            seen.add(output)
            found.append((program, output))
    return tuple(found)


def output_of(program: Callable[[Grid], Grid | None], grid: Grid) -> Grid | None:
    """The program's output on `grid`, or None when it gives none or fails."""
    try:
        output = program(grid)
        return as_grid(output) if output is not None else None
    # A candidate that fails on the test input is no answer; the reply must still be made.
    except Exception:  # noqa: BLE001
        return None


def submit_text(grid: Grid) -> str:
    """The reply that submits `grid` as the answer."""
    return f'{{"action": "submit", "grid": {grid_json(grid)}}}'


def program_text(source: str, output: Grid | None) -> str:
    """The reply that proposes a program (program mode), with its predicted output when known."""
    text = f"```python\n{source.rstrip()}\n```"
    if output is not None:
        text += f"\n{PREDICTED_OUTPUT} {grid_json(output)}"
    return text


# --- fallback guesses: used only when no program fits and no pair is left to buy -------------

@dataclass(frozen=True)
class Guess:
    """A fixed guess at the test output, as the body of a Python function of `grid`."""

    name: str
    body: str

    @functools.cached_property
    def function(self) -> Callable[[list[list[int]]], list[list[int]]]:
        # Compiled from the same body the program source carries, so the two cannot disagree.
        namespace: dict = {}
        exec(compile(f"def guess(grid):\n    {self.body}\n", f"<guess {self.name}>", "exec"),
             namespace)
        return namespace["guess"]

    def __call__(self, grid: Grid) -> Grid:
        return as_grid(self.function(grid_list(grid)))

    def program_source(self, pairs: Sequence[Demo]) -> str:
        """A transform(grid) that reproduces every pair by lookup and otherwise makes this guess."""
        table = [[grid_list(d.input), grid_list(d.output)] for d in pairs]
        return "\n".join([
            f"# program: {self.program_description}",
            f"PAIRS = {table!r}",
            "",
            "",
            "def guess(grid):",
            f"    {self.body}",
            "",
            "",
            "def transform(grid):",
            "    grid = [list(row) for row in grid]",
            "    for pair_input, pair_output in PAIRS:",
            "        if grid == pair_input:",
            "            return [list(row) for row in pair_output]",
            "    return guess(grid)",
            "",
        ])

    @property
    def program_description(self) -> str:
        return f"fallback guess: demonstration lookup, else {self.name}"


GUESSES: tuple[Guess, ...] = (
    Guess("identity", "return [list(row) for row in grid]"),
    Guess("flip left-right", "return [list(row)[::-1] for row in grid]"),
    Guess("flip up-down", "return [list(row) for row in grid[::-1]]"),
    Guess("rotate 180", "return [list(row)[::-1] for row in grid[::-1]]"),
    Guess("transpose", "return [list(col) for col in zip(*grid)]"),
    Guess("rotate 90 clockwise", "return [list(col) for col in zip(*grid[::-1])]"),
    Guess("rotate 90 counter-clockwise", "return [list(col) for col in zip(*grid)][::-1]"),
    Guess("anti-transpose", "return [list(col)[::-1] for col in zip(*grid)][::-1]"),
) + tuple(Guess(f"fill with colour {c}", f"return [[{c}] * len(grid[0]) for _ in grid]")
          for c in range(10))


def _fallback(state: ConversationState) -> Reply:
    """The first guess not yet judged incorrect (and, for programs, not yet failed)."""
    base = state.test_input if state.test_input is not None else ((0,),)
    wrong = state.wrong_grids
    failed = state.failed_programs
    for guess in GUESSES:
        output = guess(base)
        if output in wrong:
            continue
        if state.mode is Mode.PROGRAM:
            if guess.program_description in failed:
                continue
            return Reply(program_text(guess.program_source(state.pairs), output),
                         guess.program_description)
        return Reply(submit_text(output), f"fallback guess: {guess.name}")
    # Unreachable within 8 wrong answers (ten fills differ); still, always answer something.
    guess = GUESSES[0]
    if state.mode is Mode.PROGRAM:
        return Reply(program_text(guess.program_source(state.pairs), guess(base)),
                     guess.program_description)
    return Reply(submit_text(guess(base)), f"fallback guess: {guess.name}")
