"""A model trained between rounds: the hook, what it sees, and its offline stand-in.

The row `trained` of a collective grid (orchestrator/rows.py) runs its users' learner on the
model of the round. Between rounds the grid's trainer (`collective.trainer`) is handed every
record of the round just ended (`RoundRecords`: each user's instances, their steps with verdicts,
their transcripts) and the folder of what it trained so far, and writes the next round's model
into a new folder (`shared/round-r/`, written whole by `runner.update_shared`):

    class MyTrainer(RoundTrainer):
        def between_rounds(self, records, previous, out) -> dict[str, int]: ...

It writes `model.json` (a `RoundModel`) there, and returns counts for the round's update.json:
either a prior of the embedded model (a file beside it), or the endpoint and name of a model
served elsewhere (a model it fine-tuned at a provider), which the round's users then call with
the grid's API and key, through the row's journaling proxy.
Round 0 has no trained model: its users call the grid's model, as the row's memory-on twin does,
so the two rows agree exactly until the first update.

`PrimitivePriorTrainer` is the offline stand-in (the seed's "refactor the kept programs into
reusable primitives"): for every instance solved in the round it takes the pairs the transcript
showed, the test input and the answer the verdict accepted, finds the simplest DSL program that
fits those pairs and gives that answer (the reference search, `solver_model.search.search`), and
adds its primitives to the counts of the rounds before. The next round's embedded model draws its
search order from those counts (solver_model/prior.py): same compute per reply, another order.
It sees no test output but the answers a verdict accepted.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.arc import as_grid, GridError
from orchestrator.records import CellPaths, Event, read_events, standing

MODEL_FILE = "model.json"


class RoundModel(BaseModel):
    """The model a round's users call (`model.json` in the round's shared folder): the embedded
    model served with a prior trained here, or a model served elsewhere (a model fine-tuned
    between rounds, at its provider): its endpoint and name, called with the grid's API and key
    through the row's journaling proxy."""

    model_config = ConfigDict(extra="forbid")

    prior: str | None = Field(None, description="the embedded model's primitive prior: a file in this folder")
    endpoint: str | None = Field(None, description="the base URL of a model served elsewhere (http or https)")
    name: str | None = Field(None, description="with endpoint: the model's name there (default: the grid's)")
    trained_on: int = Field(0, description="programs (or records) the model was trained on so far")

    @model_validator(mode="after")
    def _one_model(self) -> "RoundModel":
        if (self.prior is None) == (self.endpoint is None):
            raise ValueError("give exactly one of prior (the embedded model's) and endpoint (a model "
                             "served elsewhere)")
        if self.endpoint is not None and urlparse(self.endpoint).scheme not in ("http", "https"):
            raise ValueError(f"endpoint {self.endpoint!r}: not an http(s) URL")
        if self.name is not None and self.endpoint is None:
            raise ValueError("name is the name of the model at endpoint: give endpoint too")
        return self

    def write(self, folder: Path) -> None:
        (folder / MODEL_FILE).write_text(self.model_dump_json(indent=1) + "\n")

    @classmethod
    def read(cls, folder: Path) -> "RoundModel | None":
        """The round's model; None in a folder without one (round 0: the grid's own model)."""
        path = folder / MODEL_FILE
        if not path.exists():
            return None
        try:
            model = cls.model_validate_json(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path}: not a round's model ({exc})") from exc
        if model.prior is not None and (not (folder / model.prior).is_file()
                                        or Path(model.prior).name != model.prior):
            raise ValueError(f"{path}: prior {model.prior!r} is not a file of {folder}")
        return model

    def prior_path(self, folder: Path) -> Path:
        assert self.prior is not None, "a model served elsewhere has no prior here"
        return folder / self.prior


@dataclass(frozen=True)
class InstanceRecord:
    """One user's instance as its records hold it."""

    user: int
    slot: int
    task: str
    visit: int
    status: str
    steps: tuple[Event, ...]
    transcript: list

    def accepted(self) -> Any:
        """The grid a verdict accepted (None when no submission was correct)."""
        for step in self.steps:
            if step.outcome == "correct" and step.action and step.action.get("grid") is not None:
                try:
                    return as_grid(step.action["grid"])
                except GridError:
                    return None
        return None


class RoundRecords:
    """Every user's records of one round of a row, read from its cell folder."""

    def __init__(self, paths: CellPaths, number: int, users: int):
        self.paths = paths
        self.number = number
        self.users = users

    def instances(self) -> Iterator[InstanceRecord]:
        """The round's finished instances, user by user, slot by slot."""
        for user in range(self.users):
            paths = self.paths.user(user)
            events = [e for e in standing(read_events(paths.events)) if e.round == self.number]
            ends = {e.slot: e for e in events if e.type == "instance_end"}
            if not ends:
                continue
            transcripts = paths.read_transcripts()
            for slot in sorted(ends):
                end = ends[slot]
                steps = tuple(e for e in events if e.slot == slot and e.type == "step")
                yield InstanceRecord(user, slot, end.task, end.visit, end.status or "", steps,
                                     transcripts.get(slot, []))


class RoundTrainer:
    """What trains the model of a row between rounds. Built once per row from the grid (a
    `GridConfig`) and the row's `Cell`; untyped here, since grid_config.py checks a grid's trainer
    by importing this module."""

    def __init__(self, grid: Any, cell: Any):
        self.grid = grid
        self.cell = cell

    def between_rounds(self, records: RoundRecords, previous: Path, out: Path) -> dict[str, int]:
        """Write the next round's model into `out` (model.json, and the files it names) from the
        model trained so far (`previous`: the last round's folder; no model.json in round 0's)
        and the records of the round just ended. Returns counts for the round's update.json."""
        raise NotImplementedError


class PrimitivePriorTrainer(RoundTrainer):
    """The stand-in: a prior over the embedded model's primitives, counted from every program
    verified so far (module docstring)."""

    def between_rounds(self, records: RoundRecords, previous: Path, out: Path) -> dict[str, int]:
        from solver_model.conversation import read_conversation
        from solver_model.prior import PRIOR_FILE, PrimitivePrior
        from solver_model.search import search

        before = RoundModel.read(previous)
        prior = PrimitivePrior.load(before.prior_path(previous)) if before else PrimitivePrior()
        programs: list[list[str]] = []
        solved = unexplained = 0
        for instance in records.instances():
            answer = instance.accepted()
            if answer is None:
                continue
            solved += 1
            state = read_conversation(instance.transcript)
            found = None
            if state.pairs and state.test_input is not None:
                found = next((p for p in search(state.pairs, self.cell.effort, state.test_input)
                              if p(state.test_input) == answer), None)
            if found is None:  # solved by a guess, or by a program the search does not reach
                unexplained += 1
                continue
            programs.append([step.name for step in found.steps])
        trained = prior.add(programs)
        trained.save(out / PRIOR_FILE)
        RoundModel(prior=PRIOR_FILE, trained_on=trained.programs).write(out)
        return {"instances_solved": solved, "programs": len(programs), "unexplained": unexplained,
                "trained_on": trained.programs}


TRAINERS: dict[str, type[RoundTrainer]] = {"primitive-prior": PrimitivePriorTrainer}
EMBEDDED_ONLY = frozenset({"primitive-prior"})  # trainers of the embedded model


def trainer_class(name: str) -> type[RoundTrainer]:
    """A trainer by its name in TRAINERS, or by "module:attribute"."""
    if name in TRAINERS:
        return TRAINERS[name]
    module, _, attribute = name.partition(":")
    if not attribute:
        raise ValueError(f"collective.trainer {name!r}: not one of {', '.join(TRAINERS)}, nor module:attribute")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"collective.trainer {name!r}: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(found, type) and issubclass(found, RoundTrainer)):
        raise ValueError(f"collective.trainer {name!r}: not a RoundTrainer subclass "
                         "(orchestrator/run/collective/training.py)")
    return found
