"""The one registry of learners (harness_adapters/learners.yaml): ladder and harnesses, their rows,
and where their code lives, as a lazy name -> "module:attribute" table (Harbor's `_AGENT_MAP`).

Reading the table imports nothing else, so a grid file is validated without Docker; an entry's
code is imported only when asked for (`learner_class`, `adapter`, or `load` of its `parser`, which
the stores inspector does). Nothing in the project registers itself by being imported.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from orchestrator.errors import ConfigError
from orchestrator.rows import HARNESS_ROWS, ROWS

if TYPE_CHECKING:
    from harness_adapters.harness import HarnessAdapter

REGISTRY = Path(__file__).with_name("learners.yaml")
GENERIC_PARSER = "stores_inspector.generic:Parser"


# The grid tracks (a conversation over ARC grids) and arc3 (a game played action by action).
GRID_TRACKS = ("own", "arc1", "arc2")
ALL_TRACKS = (*GRID_TRACKS, "arc3")


class RegistryError(ConfigError):
    pass


@dataclass(frozen=True)
class Registered:
    """One entry of the registry."""

    name: str
    kind: Literal["ladder", "harness"]
    target: str  # "module:attribute": the ladder learner's class, or the harness's HarnessAdapter
    rows: tuple[str, ...]
    parser: str = GENERIC_PARSER  # the stores inspector's parser class
    tracks: tuple[str, ...] = GRID_TRACKS  # the tracks it can play
    arc3: str | None = None  # "module:Class" of its arc3 player, where that is another class

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    def load(self) -> Any:
        return load(self.target, f"{self.name}: {self.kind}")


def load(target: str, what: str = "") -> Any:
    """The attribute a "module:attribute" names (imported now); RegistryError naming it if not."""
    module, _, attribute = target.partition(":")
    where = f"{REGISTRY.name}: {what}: " if what else ""
    try:
        return getattr(importlib.import_module(module), attribute)
    except AttributeError:
        raise RegistryError(f"{where}{module} has no {attribute!r}") from None


@lru_cache(maxsize=4)
def _load(path: Path, mtime_ns: int) -> dict[str, Registered]:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise RegistryError(f"{path}: expected a mapping of learner name -> {{learner|adapter, rows}}")
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or ("learner" in entry) == ("adapter" in entry):
            raise RegistryError(f"{path}: {name}: needs `learner: module:Class` (ladder) or "
                                f"`adapter: module:ATTRIBUTE` (harness), not both")
        kind = "ladder" if "learner" in entry else "harness"
        target = entry["learner" if kind == "ladder" else "adapter"]
        if not isinstance(target, str) or ":" not in target:
            raise RegistryError(f"{path}: {name}: expected `module:attribute`, got {target!r}")
        rows = entry.get("rows", list(HARNESS_ROWS))
        if not isinstance(rows, list) or not rows or not all(isinstance(r, str) for r in rows):
            raise RegistryError(f"{path}: {name}.rows: expected a non-empty list of row names")
        unknown = [r for r in rows if r not in ROWS]
        if unknown:
            raise RegistryError(f"{path}: {name}.rows: no row {', '.join(unknown)}; rows are "
                                f"{', '.join(ROWS)} (orchestrator/rows.py)")
        tracks = entry.get("tracks", list(GRID_TRACKS))
        if not isinstance(tracks, list) or not tracks or not all(t in ALL_TRACKS for t in tracks):
            raise RegistryError(f"{path}: {name}.tracks: expected a list of {', '.join(ALL_TRACKS)}")
        arc3 = entry.get("arc3")
        if arc3 is not None and (not isinstance(arc3, str) or ":" not in arc3):
            raise RegistryError(f"{path}: {name}.arc3: expected `module:Class`, got {arc3!r}")
        out[name] = Registered(name, kind, target, tuple(rows), entry.get("parser") or GENERIC_PARSER,
                               tuple(tracks), arc3)
    return out


def learners(path: Path = REGISTRY) -> dict[str, Registered]:
    """Every registered learner, ladder first, in the file's order."""
    return _load(path, path.stat().st_mtime_ns)


def harnesses(path: Path = REGISTRY) -> dict[str, Registered]:
    return {n: e for n, e in learners(path).items() if e.kind == "harness"}


def entry(name: str, path: Path = REGISTRY) -> Registered:
    known = learners(path)
    if name not in known:
        raise RegistryError(f"no learner {name!r} in {path}; known: {', '.join(known)}")
    return known[name]


def learner_class(name: str) -> type:
    """A ladder learner's class."""
    return entry(name).load()


def arc3_class(name: str) -> type:
    """The class that plays arc3 for a learner: its `arc3` entry, or its own class (a player
    made for arc3 only)."""
    registered = entry(name)
    if "arc3" not in registered.tracks:
        raise RegistryError(f"{REGISTRY.name}: {name} does not play arc3")
    return load(registered.arc3 or registered.target, f"{name}: arc3")


def adapter(name: str) -> "HarnessAdapter":
    """A harness's adapter (its module is imported on first use)."""
    from harness_adapters.harness import HarnessAdapter

    registered = entry(name)
    found = registered.load()
    if registered.kind != "harness" or not isinstance(found, HarnessAdapter):
        raise RegistryError(f"{REGISTRY.name}: {name}: {registered.target} is not a HarnessAdapter")
    return found


def add_harness(name: str, target: str, rows: tuple[str, ...] = HARNESS_ROWS,
                path: Path = REGISTRY) -> None:
    """Append one harness entry (the scaffold's registration), keeping the file's comments."""
    if name in learners(path):
        raise RegistryError(f"{path}: learner {name!r} is already registered")
    with open(path, "a") as handle:
        handle.write(f"{name}:\n  adapter: {target}\n  rows: [{', '.join(rows)}]\n")


def image_recipes(path: Path = REGISTRY) -> dict[str, Any]:
    """Every image carc builds: sandboxes' own recipes (base, proxy), then each harness's, or the
    exception its adapter module raised when loaded (one broken adapter must not hide the others)."""
    from sandboxes.images import RECIPES

    out: dict[str, Any] = dict(RECIPES)
    for name in harnesses(path):
        try:
            out[name] = adapter(name).recipe
        except Exception as exc:  # someone else's module: any failure is reported, not raised
            out[name] = exc
    return out
