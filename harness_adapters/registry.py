"""The harness registry file (harness_adapters/harnesses.yaml), read without importing adapters."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

REGISTRY = Path(__file__).with_name("harnesses.yaml")
STANDARD_ROWS = ("memory-on", "memory-off", "asked-to-store", "program-procedure",
                 "program-procedure-wiped")


class RegistryError(ValueError):
    pass


@lru_cache(maxsize=4)
def _load(path: Path, mtime_ns: int) -> dict[str, dict]:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise RegistryError(f"{path}: expected a mapping of harness name -> {{module, rows}}")
    for name, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("module"), str):
            raise RegistryError(f"{path}: {name}: needs `module: package.module`")
        rows = entry.get("rows", list(STANDARD_ROWS))
        if not isinstance(rows, list) or not rows or not all(isinstance(r, str) for r in rows):
            raise RegistryError(f"{path}: {name}.rows: expected a non-empty list of row names")
        entry["rows"] = tuple(rows)
    return data


def harnesses(path: Path = REGISTRY) -> dict[str, dict]:
    """name -> {"module": str, "rows": tuple[str, ...]}"""
    return _load(path, path.stat().st_mtime_ns)


def add_harness(name: str, module: str, rows: tuple[str, ...] = STANDARD_ROWS,
                path: Path = REGISTRY) -> None:
    """Append one entry (the scaffold's registration), keeping the file's comments."""
    if name in harnesses(path):
        raise RegistryError(f"{path}: harness {name!r} is already registered")
    with open(path, "a") as handle:
        handle.write(f"{name}:\n  module: {module}\n  rows: [{', '.join(rows)}]\n")
