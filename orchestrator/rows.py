"""Rows: the settings of a learner's cell that the seed names (memory-on, memory-off, ...).

One table says, for every row, what it does to the learner's state and to the conversation, how
the report names it, and which row is its memory-off twin in the paired comparisons. Every rule
about rows is read from here; nothing else tests a row by its name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    name: str
    wiped_before_each: bool  # the learner's state is emptied before every instance
    asks_to_store: bool = False  # the verdict comes with an invitation to save for next time
    program_procedure: bool = False  # rules: keep one program per task, run it first, save it
    twins: tuple[str, ...] = ()  # the rows it is paired against, first present on the schedule wins
    help: str = ""
    # collective grids only: what is rewritten between rounds from every user's records, "learner"
    # (a shared state the learner reads) or "model" (the model its users call); None: nothing
    shared: str | None = None


MEMORY_ON = "memory-on"
COLLECTIVE = "collective"
TRAINED = "trained"

ROWS: dict[str, Row] = {row.name: row for row in (
    # The program library has no memory-off row: its wiped row is the twin. The procedure's wiped
    # row is itself paired with memory-off (what following the procedure with nothing kept is worth).
    Row(MEMORY_ON, False, twins=("memory-off", "wiped"),
        help="every learning mechanism on; state carries over"),
    Row("memory-off", True, help="everything the learner wrote deleted before every instance"),
    Row("wiped", True, help="the program library keeping neither programs nor pairs"),
    Row("asked-to-store", False, asks_to_store=True, twins=("memory-off",),
        help="after every verdict, an invitation to save anything that could help next time"),
    Row("program-procedure", False, program_procedure=True, twins=("program-procedure-wiped",),
        help="rules: keep one program file per task id, run it first, save it after the verdict"),
    Row("program-procedure-wiped", True, program_procedure=True, twins=("memory-off",),
        help="the program procedure with the state wiped before every instance"),
    # The collective regime (orchestrator/run/collective/): each user keeps its own state as in
    # memory-on, and also reads the round's shared state, merged from every user between rounds
    # (a ladder learner's merge_shared; a harness's curator session).
    # Its twin is memory-on, which in a collective grid is the independent learner of each user.
    Row(COLLECTIVE, False, twins=(MEMORY_ON,), shared="learner",
        help="collective grids: the learner also reads the shared state of its round, merged "
             "from what every user kept in the rounds before"),
    # A model trained between rounds (collective.trainer): every user of the row calls the model
    # of its round, trained from every user's records of the rounds before; the learner is the
    # same as its memory-on twin's, so the difference is the training's.
    Row(TRAINED, False, twins=(MEMORY_ON,), shared="model",
        help="collective grids: the users call the model of their round, trained between rounds "
             "from every user's records (collective.trainer)"),
)}

COLLECTIVE_ROWS = tuple(r.name for r in ROWS.values() if r.shared)

# A harness's collective row (collective grids): its users read a library a curator session of
# the harness rewrites between rounds (orchestrator/run/collective/harness_rows.py).
HARNESS_ROWS = (MEMORY_ON, "memory-off", "asked-to-store", "program-procedure", "program-procedure-wiped",
                COLLECTIVE)


def row_name(value: object) -> str:
    """A recorded row, memory-on when the record leaves it unset (None, or NaN from a frame)."""
    return MEMORY_ON if value is None or value != value or str(value) == "<NA>" else str(value)


def row(name: object) -> Row:
    """The row named `name` (memory-on when unset); KeyError naming the known rows otherwise."""
    name = row_name(name)
    try:
        return ROWS[name]
    except KeyError:
        raise KeyError(f"no row {name!r}; rows: {', '.join(ROWS)}") from None


def twins_of(name: object) -> tuple[str, ...]:
    """The rows a recorded row is paired against (none for a row this version does not know)."""
    known = ROWS.get(row_name(name))
    return known.twins if known else ()


def label(learner: str, name: object) -> str:
    """The learner as cell ids and reports name it: with its row unless that is memory-on."""
    return f"{learner}" if row_name(name) == MEMORY_ON else f"{learner}-{row_name(name)}"


STATELESS_ROWS = frozenset(r.name for r in ROWS.values() if r.wiped_before_each)
