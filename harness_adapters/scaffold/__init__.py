"""Adding a harness: the files `carc adapters new` writes, and what `carc adapters list` shows.

The templates beside this module use `@@name` placeholders (string.Template with `@@` as the
delimiter), so the Dockerfiles' own `$FROM` / `$$` and Python's braces pass through untouched.
Every function takes the repository root and the registry file, so tests scaffold into a copy.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Literal

from harness_adapters.registry import REGISTRY, RegistryError, add_harness, harnesses, learners
from orchestrator.errors import ConfigError
from orchestrator.rows import HARNESS_ROWS

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).parent
NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
PACKAGES = {"pip": re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$"),
            "npm": re.compile(r"^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$")}
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$")
Kind = Literal["pip", "npm"]


class ScaffoldError(ConfigError):
    """The scaffold cannot be written; the message says what to change."""


class _Template(Template):
    delimiter = "@@"


@dataclass(frozen=True)
class HarnessScaffold:
    """The names one new harness gets in every file of its scaffold."""

    name: str  # registry and recipe name, e.g. my-agent
    kind: Kind
    package: str  # the PyPI or npm package the image installs
    version: str

    @property
    def module(self) -> str:
        return self.name.replace("-", "_")

    @property
    def const(self) -> str:
        return self.module.upper()

    @property
    def class_name(self) -> str:
        return "".join(part.capitalize() for part in self.name.split("-"))

    @property
    def bin(self) -> str:
        """The command the recipe checks for and FIRST_TURN runs: a guess, to be verified."""
        return self.package.rsplit("/", 1)[-1]

    def values(self) -> dict[str, str]:
        if self.kind == "pip":
            function, input_name = "wheelhouse", "wheelhouse"
            call = f'wheelhouse("{self.name}", (f"{self.package}=={{{self.const}_VERSION}}",))'
            install = f"PyPI `{self.package}` from a host wheelhouse"
        else:
            function, input_name = "npm_tree", "package.tar"
            call = f'npm_tree("{self.name}", f"{self.package}@{{{self.const}_VERSION}}")'
            install = f"npm `{self.package}` installed on the host"
        return {"name": self.name, "module": self.module, "const": self.const,
                "class_name": self.class_name, "package": self.package, "version": self.version,
                "bin": self.bin, "input_function": function, "input_name": input_name,
                "input_call": call, "install_doc": install, "today": datetime.date.today().isoformat()}

    def files(self, root: Path) -> dict[Path, str]:
        """Path -> text of every file of the scaffold."""
        recipe = root / "harness_adapters" / "recipes" / self.name
        sources = {
            root / "harness_adapters" / f"{self.module}.py": "adapter.py.tmpl",
            recipe / "Dockerfile": f"Dockerfile.{self.kind}.tmpl",
            recipe / "driver.py": "driver.py.tmpl",
            root / "tests" / f"test_{self.module}_conformance.py": "test_conformance.py.tmpl",
            root / "docs" / "harnesses" / f"{self.name}.md": "harness.md.tmpl",
        }
        values = self.values()
        return {path: _Template((TEMPLATES / template).read_text()).substitute(values)
                for path, template in sources.items()}


def latest_version(kind: Kind, package: str) -> str:
    """The newest release of `package`, asked of its registry through its own client."""
    cmd = (["npm", "view", package, "version"] if kind == "npm"
           else [sys.executable, "-m", "pip", "index", "versions", package])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ScaffoldError(f"cannot ask for the latest {package} ({exc}); give --version") from None
    found = re.search(r"^(\S+)\s*$" if kind == "npm" else r"^\S+ \(([^)]+)\)", proc.stdout, re.M)
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ScaffoldError(f"`{' '.join(cmd[-4:])}` found no version of {package} ({tail[0]}); "
                            f"check the package name or give --version")
    return found.group(1)


def new_adapter(name: str, root: Path = REPO_ROOT, registry: Path | None = None,
                npm: str | None = None, pip: str | None = None,
                version: str | None = None) -> list[Path]:
    """Write the scaffold of harness `name` under `root` and register it; the paths written.

    `npm` or `pip` names the package the image installs (default: PyPI package `name`); without
    `version` the registry's latest release is pinned."""
    registry = registry or root / "harness_adapters" / "learners.yaml"
    if not NAME.match(name):
        raise ScaffoldError(f"harness name {name!r}: use lowercase letters, digits and single "
                            f"dashes, starting with a letter (e.g. my-agent)")
    if npm and pip:
        raise ScaffoldError("give --npm PACKAGE or --pip PACKAGE, not both")
    kind: Kind = "npm" if npm else "pip"
    package = npm or pip or name
    if not PACKAGES[kind].match(package):
        raise ScaffoldError(f"{package!r} is not a valid {kind} package name")
    try:
        known = learners(registry)
    except (OSError, RegistryError) as exc:
        raise ScaffoldError(f"cannot read the harness registry: {exc}") from None
    if name in known:
        raise ScaffoldError(f"harness {name!r} already exists in {registry} ("
                            f"{known[name].target}); pick another name, or edit its files")
    version = version or latest_version(kind, package)
    if not VERSION.match(version):
        raise ScaffoldError(f"version {version!r}: expected something like 1.2.3")
    scaffold = HarnessScaffold(name, kind, package, version)
    files = scaffold.files(root)
    existing = [str(path) for path in files if path.exists()]
    if existing:
        raise ScaffoldError(f"harness {name!r} is not registered but its files exist: "
                            f"{', '.join(existing)}; remove them or pick another name")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    add_harness(name, f"harness_adapters.{scaffold.module}:{scaffold.const}", HARNESS_ROWS, registry)
    return list(files)


@dataclass(frozen=True)
class RegisteredHarness:
    """One registry entry as `carc adapters list` shows it."""

    name: str
    module: str
    rows: tuple[str, ...]
    importable: bool
    status: str  # "imports" or "module not importable: <reason>"
    recipe: str  # the image recipe folder (relative to the repository), or "-"


def registered_harnesses(registry: Path = REGISTRY) -> list[RegisteredHarness]:
    """Every registered harness, with whether its module imports (one that does not is shown,
    never raised: adapters are written while others run)."""
    from harness_adapters.harness import HarnessAdapter

    listed = []
    for name, entry in harnesses(registry).items():
        try:
            found = entry.load()
            adapter = found if isinstance(found, HarnessAdapter) else None
            status = "imports" if adapter else f"imports, but {entry.target} is not a HarnessAdapter"
        except Exception as exc:  # any failure of someone else's module is a row, not a crash
            adapter, status = None, f"module not importable: {type(exc).__name__}: {exc}"
        folder = adapter.recipe.folder if adapter else REPO_ROOT / "harness_adapters" / "recipes" / name
        recipe = str(folder.relative_to(REPO_ROOT)) if folder.is_relative_to(REPO_ROOT) else str(folder)
        listed.append(RegisteredHarness(name, entry.target, entry.rows, adapter is not None,
                                        status, recipe if folder.exists() else "-"))
    return listed
