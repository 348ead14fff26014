"""A prior over the embedded model's primitives: what a model trained between rounds learnt.

The collective regime's stand-in for a model trained between rounds (docs/collective.md, the row
`trained`) counts the primitives of every program verified so far and serves, in the next round,
a model whose bounded search (`search.explore`) draws its primitive order from those counts
instead of uniformly: a primitive used often by programs that solved tasks comes up earlier, so
within the same compute per reply the model reaches more of what worked. It is the seed's
"refactor the kept programs into reusable primitives" at its simplest: nothing is added to the
DSL, only the order in which the model tries what it has.

Weights are Laplace-smoothed counts, so an unused primitive keeps a chance and the prior of no
programs is uniform. An order is drawn by the Gumbel-top-k trick (weighted sampling without
replacement), from the reply's own generator, so a reply stays a function of the conversation,
the model seed and the prior.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from solver_model import dsl

PRIOR_FILE = "prior.json"
# Laplace smoothing: every primitive counts this many times before any program is seen.
SMOOTHING = 1.0


@dataclass(frozen=True)
class PrimitivePrior:
    """Counts of primitives in verified programs; `programs`: how many programs were counted."""

    counts: Mapping[str, int] = field(default_factory=dict)
    programs: int = 0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.counts) - set(dsl.BY_NAME))
        if unknown:
            raise ValueError(f"prior: unknown DSL primitive(s) {unknown}; see solver_model.dsl.PRIMITIVES")
        negative = sorted(name for name, n in self.counts.items() if n < 0)
        if negative:
            raise ValueError(f"prior: negative count for {negative}")

    def add(self, programs: Iterable[Sequence[str]]) -> "PrimitivePrior":
        """This prior with the primitives of more programs counted (each a sequence of step names)."""
        counts = Counter(self.counts)
        added = 0
        for names in programs:
            counts.update(n for n in names if n != "identity" or len(names) == 1)
            added += 1
        return PrimitivePrior(dict(sorted(counts.items())), self.programs + added)

    def weights(self, names: Sequence[str]) -> np.ndarray:
        return np.array([self.counts.get(n, 0) + SMOOTHING for n in names], dtype=float)

    def to_json(self) -> dict:
        return {"programs": self.programs, "counts": dict(self.counts)}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: Path) -> "PrimitivePrior":
        try:
            data = json.loads(Path(path).read_text())
            return cls(dict(data["counts"]), int(data["programs"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a primitive prior ({exc}); expected "
                             '{"programs": N, "counts": {"primitive": n, ...}}') from exc
