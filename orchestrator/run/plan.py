"""The bill of a grid before anything is spent: `carc grid plan GRID [--pilot RUN]`.

Per cell: the instances its schedule serves (stream, epilogue, fresh reference), and the model
calls, input and output tokens, dollars, wall time and state-snapshot disk those instances are
expected to take; in total: the same, the wall time at the grid's `workers`, and the Docker images
a run would build first. Per-instance rates come from a pilot run's records when one is given
(its proxy journal and events), else from the stated priors in `plan_priors.yaml`. Every cell
says which source its rates came from. Dollars are an estimate: tokens times the price table's
list price for the grid's model. The plan also suggests `workers` for the machine it runs on: the
cells its cores and memory hold at the per-cell cost `bench/scale.py` measured (`scale_priors.yaml`).
"""

from __future__ import annotations

import heapq
import json
from collections import defaultdict
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import ConfigError
from orchestrator.records import CellPaths, CellRecord, RunPaths, read_events, standing
from orchestrator.run.grid_config import HARNESSES, Cell, GridConfig, price_table
from proxy.journal import read_journal
from proxy.prices import Price, PriceTable

PRIORS = Path(__file__).with_name("plan_priors.yaml")
CURATOR_ROW = "curator"  # the rate key of a harness's curator conversations: one per task curated
SCALE_PRIORS = Path(__file__).with_name("scale_priors.yaml")
CPU_SHARE = 0.8     # of the machine's cores the suggested cells may keep busy
MEMORY_SHARE = 0.8  # of its available memory they may hold
MAX_WORKERS = 64    # GridConfig.workers' own bound
EFFORT_ORDER = ("minimal", "low", "medium", "high", "xhigh", "max")


class PlanError(ConfigError):
    """A priors file or pilot run that cannot be used; the message names the file and what to fix."""


# --- per-instance rates ---------------------------------------------------------------------------

class Rate(BaseModel):
    """What one instance takes, on average."""

    model_config = ConfigDict(extra="forbid")

    calls: float = Field(ge=0)
    input_tokens: float = Field(ge=0)
    output_tokens: float = Field(ge=0)
    seconds: float = Field(ge=0)
    snapshot_bytes: float = Field(ge=0)


class RateOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")

    calls: float | None = Field(None, ge=0)
    input_tokens: float | None = Field(None, ge=0)
    output_tokens: float | None = Field(None, ge=0)
    seconds: float | None = Field(None, ge=0)
    snapshot_bytes: float | None = Field(None, ge=0)


class RowPriors(BaseModel):
    """One row's rates: per instance, and where an effort differs, the fields that differ."""

    model_config = ConfigDict(extra="forbid")

    per_instance: Rate
    by_effort: dict[str, RateOverride] = {}
    source: str = ""

    def rate(self, effort: str) -> Rate:
        fields = self.per_instance.model_dump()
        if effort in self.by_effort:
            fields.update(self.by_effort[effort].model_dump(exclude_none=True))
        return Rate(**fields)


class LearnerPriors(RowPriors):
    """A learner's rates (its memory-on row), rows whose rates differ, and for a harness, what
    its curator session takes per task it curates (the collective row's update step)."""

    rows: dict[str, RowPriors] = {}
    curator: RowPriors | None = None


class Priors(BaseModel):
    """`plan_priors.yaml`: per learner, what one instance takes; `default-harness` covers a
    registered harness with no entry of its own."""

    model_config = ConfigDict(extra="forbid")

    learners: dict[str, LearnerPriors]
    arc3: dict[str, LearnerPriors] = {}  # per level of the arc3 track

    def rate(self, learner: str, row: str, effort: str, track: str = "own") -> tuple[Rate, str]:
        if track == "arc3":
            if learner not in self.arc3:
                raise PlanError(f"{PRIORS}: no arc3 prior for learner {learner!r}; add it under `arc3:` "
                                "(per level) or plan with --pilot RUN (an arc3 run)")
            entry = self.arc3[learner]
            return (entry.rows.get(row) or entry).rate(effort), "prior (arc3, per level)"
        name = learner if learner in self.learners else (
            "default-harness" if learner in HARNESSES and "default-harness" in self.learners else None)
        if name is None:
            raise PlanError(f"{PRIORS}: no prior for learner {learner!r}; add a `{learner}:` entry "
                            "(per_instance: calls, input_tokens, output_tokens, seconds, snapshot_bytes) "
                            "or plan with --pilot RUN")
        entry = self.learners[name]
        if row == CURATOR_ROW:  # a harness with no curator prior of its own takes default-harness's
            if entry.curator is None and "default-harness" in self.learners:
                name, entry = "default-harness", self.learners["default-harness"]
            if entry.curator is None:
                raise PlanError(f"{PRIORS}: no curator prior for {learner!r}; add `curator: {{per_instance: "
                                "{...}}` (per task curated) under it or plan with --pilot RUN (a collective run)")
            return entry.curator.rate(effort), "curator prior" if name == learner else "curator prior (default-harness)"
        rate = (entry.rows.get(row) or entry).rate(effort)
        return rate, "prior" if name == learner else "prior (default-harness)"


def load_priors(path: Path = PRIORS) -> Priors:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise PlanError(f"{path}: cannot read the plan priors: {exc}") from None
    try:
        return Priors.model_validate(data)
    except ValidationError as exc:
        raise PlanError("\n".join(f"{path}: {'.'.join(map(str, e['loc']))}: {e['msg']}"
                                  for e in exc.errors())) from None


Key = tuple[str, str, str]  # learner, row, effort


class Measured(BaseModel):
    """A pilot run's totals for one (learner, row, effort)."""

    instances: int = 0
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    snapshot_bytes: int = 0
    cells: list[str] = []

    def add(self, other: "Measured") -> None:
        """Count `other`'s totals and cells in this one."""
        for name in ("instances", "calls", "input_tokens", "output_tokens", "seconds", "snapshot_bytes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cells += other.cells

    def rate(self) -> Rate:
        n = self.instances
        return Rate(calls=self.calls / n, input_tokens=self.input_tokens / n,
                    output_tokens=self.output_tokens / n, seconds=self.seconds / n,
                    snapshot_bytes=self.snapshot_bytes / n)


def measure_cell(folder: CellPaths) -> tuple[Key, Measured] | None:
    """One pilot cell's totals: instances finished (each slot once, the last attempt), model calls
    and tokens from its proxy journal (the finished instances' lines and those between instances;
    the events' own counts when it has no journal), seconds from each instance's start to its end (the snapshot
    included), and the bytes of its state snapshots. None for a cell with no finished instance."""
    if not folder.settings.exists():
        return None
    try:
        record = CellRecord.read(folder.settings)
    except ValueError as exc:
        raise PlanError(f"pilot {folder.settings}: not a cell record ({str(exc).splitlines()[0]}); "
                        "remove the folder from the pilot run or plan without it") from None
    users = folder.user_folders()
    if users:  # a collective row: its users' records, the row's journal shared by them (ladder)
        shared = _journal(folder) if (folder.journal / "journal.jsonl").exists() else None
        total = Measured(cells=[record.cell])
        for user in users:
            own = _journal(user) if (user.journal / "journal.jsonl").exists() else \
                [e for e in shared if e.user == user.number] if shared is not None else None
            measured = _measure(user, own)
            if measured is not None:
                total.add(measured)
        return ((record.learner, record.row, record.effort), total) if total.instances else None
    measured = _measure(folder, _journal(folder) if (folder.journal / "journal.jsonl").exists() else None)
    if measured is None:
        return None
    measured.cells = [record.cell]
    return (record.learner, record.row, record.effort), measured


def _journal(folder: CellPaths) -> list:
    try:
        return read_journal(folder.journal / "journal.jsonl")
    except ValueError as exc:
        raise PlanError(f"pilot {exc}; the journal is damaged: plan without this run") from None


def _measure(folder: CellPaths, entries: list | None) -> Measured | None:
    """The totals of one folder of events (a cell's, or a collective user's) and its journal's
    lines (None: count from the events)."""
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    steps: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])  # slot -> calls, input, output
    for event in standing(read_events(folder.events)):  # a rerun instance: its standing attempt
        if event.type == "instance_start":
            starts[event.slot] = event.t
        elif event.type == "instance_end" and event.slot in starts:
            ends[event.slot] = event.t - starts[event.slot]
        elif event.type == "step":
            counts = steps[event.slot]
            counts[0] += event.model_calls or 0
            counts[1] += event.prompt_tokens or 0
            counts[2] += event.completion_tokens or 0
    if not ends:
        return None
    if entries is not None:
        # an instance a stopped pilot left unfinished is not counted, so neither are its calls
        entries = [e for e in entries if e.slot is None or e.slot in ends]
        calls = sum(1 for e in entries if not e.refused)
        tokens_in = sum(e.prompt_tokens or 0 for e in entries)
        tokens_out = sum(e.completion_tokens or 0 for e in entries)
    else:
        calls, tokens_in, tokens_out = (sum(steps[slot][i] for slot in ends) for i in range(3))
    snapshots = sum(p.stat().st_size for p in folder.snapshots.glob("*.tar.gz")) if folder.snapshots.is_dir() else 0
    return Measured(instances=len(ends), calls=calls, input_tokens=tokens_in, output_tokens=tokens_out,
                    seconds=sum(ends.values()), snapshot_bytes=snapshots)


def measure_curator(folder: CellPaths) -> tuple[Key, Measured] | None:
    """A harness's collective row's curator sessions in a pilot, per task curated: each finished
    update's calls and tokens (its journal) and seconds (its transcript). None when there is none."""
    from orchestrator.run.collective.harness_rows import CURATOR

    record = CellRecord.read(folder.settings)
    total = Measured(cells=[record.cell])
    for update in sorted(folder.root.glob("shared/round-*/" + CURATOR)):
        if update.parent.name.endswith((".tmp", ".aborted")) or not (update / "transcript.json").exists():
            continue
        turns = json.loads((update / "transcript.json").read_text(encoding="utf-8"))
        entries = [e for e in read_journal(update / "journal" / "journal.jsonl") if not e.refused]
        total.instances += len(turns)
        total.seconds += sum(float(turn.get("seconds") or 0.0) for turn in turns)
        total.calls += len(entries)
        total.input_tokens += sum(e.prompt_tokens or 0 for e in entries)
        total.output_tokens += sum(e.completion_tokens or 0 for e in entries)
    return ((record.learner, CURATOR_ROW, record.effort), total) if total.instances else None


def read_pilot(run_dir: Path) -> dict[Key, Measured]:
    """Per (learner, row, effort), the pilot run's totals over its cells."""
    paths = RunPaths(run_dir)
    if not paths.cells.is_dir():
        raise PlanError(f"--pilot {run_dir}: not a run directory (no cells/); give a folder "
                        "`carc grid run` made, e.g. runs/<id>")
    out: dict[Key, Measured] = {}
    for folder in paths.cell_folders():
        for measured in (measure_cell(folder), measure_curator(folder) if (folder.root / "shared").is_dir() else None):
            if measured is None:
                continue
            key, m = measured
            out.setdefault(key, Measured()).add(m)
    if not out:
        raise PlanError(f"--pilot {run_dir}: no cell of it finished an instance; run the pilot "
                        "further (carc grid run --resume) or plan from the priors")
    return out


def pilot_rate(pilot: dict[Key, Measured], learner: str, row: str, effort: str) -> tuple[Rate, str] | None:
    """The pilot's rate for this learner and row at this effort, else at the nearest effort it ran."""
    if (learner, row, effort) in pilot:
        return pilot[(learner, row, effort)].rate(), "pilot"
    others = [e for (l, r, e) in pilot if (l, r) == (learner, row)]
    if not others:
        return None

    def distance(other: str) -> int:
        known = EFFORT_ORDER.index
        return abs(known(other) - known(effort)) if other in EFFORT_ORDER and effort in EFFORT_ORDER else 99
    nearest = min(others, key=lambda e: (distance(e), e))
    return pilot[(learner, row, nearest)].rate(), f"pilot at effort {nearest}"


# --- how many cells this machine holds -------------------------------------------------------------

class CellCost(BaseModel):
    """What one running cell holds of the machine (the model's own work left out)."""

    model_config = ConfigDict(extra="forbid")

    cpu_s_per_instance: float = Field(gt=0, description="CPU seconds an instance costs this machine")
    wait_s_per_instance: float = Field(gt=0, description="seconds an instance waits on its model")
    rss_mb: float = Field(gt=0, description="memory per running cell (MiB)")
    source: str = ""

    @property
    def cpu_cores(self) -> float:
        """Cores a running cell keeps busy, at most: its CPU spread over its model wait alone
        (orchestration taking no time), so the suggestion errs toward fewer cells."""
        return self.cpu_s_per_instance / self.wait_s_per_instance


class ScalePriors(BaseModel):
    """`scale_priors.yaml`: per cell kind (`ladder`, `program-library`, a harness, or
    `default-harness`), the measured cost of one running cell."""

    model_config = ConfigDict(extra="forbid")

    source: str
    kinds: dict[str, CellCost]

    def cost(self, learner: str) -> tuple[str, CellCost]:
        if learner in HARNESSES:
            name = learner if learner in self.kinds else "default-harness"
        else:
            name = learner if learner in self.kinds else "ladder"
        if name not in self.kinds:
            raise PlanError(f"{SCALE_PRIORS}: no cell cost for {learner!r} (nor {name!r}); add it "
                            "from `python bench/scale.py --kinds ...`")
        return name, self.kinds[name]


def load_scale_priors(path: Path = SCALE_PRIORS) -> ScalePriors:
    try:
        return ScalePriors.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError) as exc:
        raise PlanError(f"{path}: cannot read the scale priors: {exc}") from None
    except ValidationError as exc:
        raise PlanError("\n".join(f"{path}: {'.'.join(map(str, e['loc']))}: {e['msg']}"
                                  for e in exc.errors())) from None


class WorkersSuggestion(BaseModel):
    workers: int
    cores: int
    memory_bytes: int
    basis: str


def suggest_workers(grid: GridConfig, cores: int, memory_bytes: int,
                    priors: ScalePriors | None = None) -> WorkersSuggestion:
    """The cells this machine (`cores`, `memory_bytes` available) runs at once without its CPU or
    memory becoming the limit: the grid's cells' mean measured cost (scale_priors.yaml) against
    CPU_SHARE of the cores and MEMORY_SHARE of the memory, at most the grid's cells and 64.
    The embedded model without `model.timing` answers as fast as its search runs, on these same
    cores: then a cell is CPU-bound and the suggestion is one cell per core."""
    cells = grid.cells()
    if grid.model.endpoint == "embedded" and grid.model.timing is None:
        workers = max(1, min(cores, len(cells)))
        return WorkersSuggestion(workers=workers, cores=cores, memory_bytes=memory_bytes, basis=(
            f"one per core: the embedded model without model.timing is CPU-bound on this machine's "
            f"{cores} cores"))
    priors = priors or load_scale_priors()
    costs = [priors.cost(c.learner) for c in cells]
    cpu = sum(c.cpu_cores for _, c in costs) / len(costs)
    rss = sum(c.rss_mb for _, c in costs) / len(costs)
    by_cpu = int(cores * CPU_SHARE / cpu + 1e-9)  # 1.6 / 0.05 is 31.999...
    by_memory = int(memory_bytes / 2**20 * MEMORY_SHARE / rss + 1e-9)
    workers = max(1, min(by_cpu, by_memory, len(cells), MAX_WORKERS))
    limit = min((by_cpu, "CPU"), (by_memory, "memory"), (len(cells), "the grid's cells"),
                (MAX_WORKERS, "the workers bound"))[1]
    kinds = ", ".join(sorted({name for name, _ in costs}))
    return WorkersSuggestion(workers=workers, cores=cores, memory_bytes=memory_bytes, basis=(
        f"{limit} bounds it: a cell ({kinds}) holds {cpu:.3f} cores and {rss:.0f} MiB "
        f"({priors.source}); {CPU_SHARE:.0%} of {cores} cores fit {by_cpu}, {MEMORY_SHARE:.0%} of "
        f"{memory_bytes / 2**30:.1f} GiB available fit {by_memory}"))


def this_machine() -> tuple[int, int]:
    """This machine's cores (those this process may use) and available memory in bytes."""
    import os

    import psutil
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores, psutil.virtual_memory().available


# --- prices ---------------------------------------------------------------------------------------

def price_for(grid: GridConfig) -> tuple[Price | None, str]:
    """The grid's model price (USD per million tokens) from the run's price table
    (`grid_config.price_table`: carc's, the grid's `prices` file, the model's own prices) and
    where it came from."""
    model = grid.model
    price = price_table(grid).lookup(model.name)
    if model.input_usd_per_mtok is not None or model.output_usd_per_mtok is not None:
        return price, "the grid's model.*_usd_per_mtok"
    if price is None:
        return None, (f"no price for model {model.name!r} in proxy/prices.json"
                      + (f" or {grid.prices}" if grid.prices else "")
                      + ": set model.input_usd_per_mtok and model.output_usd_per_mtok in the grid, "
                        "or give it a prices file")
    if grid.prices is not None and PriceTable.load(grid.prices).lookup(model.name) is not None:
        return price, str(grid.prices)
    return price, "proxy/prices.json"


# --- the plan -------------------------------------------------------------------------------------

class CellPlan(BaseModel):
    cell: str
    learner: str
    row: str
    effort: str
    order: str
    instances: int
    stream: int
    epilogue: int
    fresh: int
    calls: float
    input_tokens: float
    output_tokens: float
    usd: float | None
    seconds: float
    snapshot_bytes: float
    source: str
    curated_tasks: int = 0  # a harness's collective row: curator conversations, one per task per update
    curator_source: str = ""  # where their rate came from (included in calls, tokens, dollars, seconds)


class ImagePlan(BaseModel):
    name: str
    tag: str | None
    status: Literal["present", "to build", "unknown"]
    note: str = ""


class Plan(BaseModel):
    grid: str
    model: str
    endpoint: str
    workers: int
    cells: list[CellPlan]
    instances: int
    calls: float
    input_tokens: float
    output_tokens: float
    usd: float | None
    usd_is_estimate: bool = True
    price_source: str
    cell_seconds: float  # the sum of every cell's wall time
    wall_seconds: float  # at `workers` cells at once (longest cells first)
    snapshot_bytes: float
    images: list[ImagePlan]
    pilot: str | None
    notes: list[str]
    suggested_workers: WorkersSuggestion | None = None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2)


def schedule_counts(grid: GridConfig, cells: list[Cell]) -> dict[tuple[str, int], dict[str, int]]:
    """Per (order, seed), the instances of a cell's schedule by phase (the row does not change
    them); a collective grid's row: every user's."""
    from orchestrator.run.schedule import build_schedule

    out: dict[tuple[str, int], dict[str, int]] = {}
    for cell in cells:
        key = (cell.order, cell.seed)
        if key not in out:
            counts = {"stream": 0, "epilogue": 0, "fresh": 0}
            if grid.collective is not None:  # a row serves every user's schedule (all one length)
                from orchestrator.run.collective.schedule import user_schedule
                for placed in user_schedule(grid, cell, 0):
                    counts[placed.slot.phase] += grid.collective.users
            else:
                for slot in build_schedule(grid, cell):
                    counts[slot.phase] += 1
            out[key] = counts
    return out


def curated_tasks(grid: GridConfig, cell: Cell) -> int:
    """The curator conversations of a harness's collective row: after each round but the last,
    one per task any user met in it (orchestrator/run/collective/harness_rows.py, round_digest); 0 for
    every other cell."""
    from orchestrator.rows import COLLECTIVE

    if grid.collective is None or cell.row != COLLECTIVE or cell.learner not in HARNESSES:
        return 0
    from orchestrator.run.collective.schedule import rounds, user_schedule

    met: dict[int, set[str]] = defaultdict(set)
    for user in range(grid.collective.users):
        for placed in user_schedule(grid, cell, user):
            met[placed.round].add(placed.slot.task_id)
    return sum(len(met[number]) for number in range(rounds(grid).total - 1))


def wall_at(seconds: list[float], workers: int) -> float:
    """The run's wall time with `workers` cells at once, longest first (as the grid run starts them)."""
    finish = [0.0] * max(1, workers)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(finish, finish[0] + s)
    return max(finish)


def needed_images(grid: GridConfig) -> list[ImagePlan]:
    """The images `carc grid run` would make before its first cell, and whether the engine has each."""
    from harness_adapters import registry
    from orchestrator.run.run_folder import harness_learners, needs_docker
    from sandboxes.images import ImageBuildError, docker_client, planned_image

    if not needs_docker(grid):
        return []
    harnesses = harness_learners(grid)
    first = "arc3-engine" if grid.track.name == "arc3" else "base"  # arc3 cells need the engine, not base
    names = [first] + (["proxy"] if harnesses else [])
    try:
        client = docker_client()
    except ImageBuildError as exc:
        return [ImagePlan(name=n, tag=None, status="unknown", note=f"Docker not reachable: {exc}")
                for n in names + harnesses]
    out = []
    for name in names + harnesses:
        try:
            recipe = name if name in ("base", "proxy", "arc3-engine") else registry.adapter(name).recipe
            planned = planned_image(recipe, grid.sandbox.base, client)
        except Exception as exc:  # an adapter module that does not load is reported, not raised
            out.append(ImagePlan(name=name, tag=None, status="unknown", note=f"{type(exc).__name__}: {exc}"))
            continue
        out.append(ImagePlan(name=name, tag=planned.tag, status="present" if planned.present else "to build",
                             note=planned.note))
    return out


def plan_grid(grid: GridConfig, pilot_dir: Path | None = None, priors_path: Path = PRIORS,
              images: bool = True, machine: tuple[int, int] | None = None) -> Plan:
    """The bill of `grid`: per cell and in total (see the module docstring), and the workers
    `machine` (cores, available memory bytes; default this one) holds."""
    cells = grid.cells()
    counts = schedule_counts(grid, cells)
    pilot = read_pilot(pilot_dir) if pilot_dir is not None else {}
    priors: Priors | None = None
    price, price_source = price_for(grid)
    planned = []
    for cell in cells:
        found = pilot_rate(pilot, cell.learner, cell.row, cell.effort) if pilot else None
        if found is None:
            priors = priors or load_priors(priors_path)
            found = priors.rate(cell.learner, cell.row, cell.effort, grid.track.name)
        rate, source = found
        phases = counts[(cell.order, cell.seed)]
        n = sum(phases.values())
        calls, tokens_in, tokens_out, seconds = rate.calls * n, rate.input_tokens * n, rate.output_tokens * n, rate.seconds * n
        curated, curator_source = curated_tasks(grid, cell), ""
        if curated:
            found = pilot_rate(pilot, cell.learner, CURATOR_ROW, cell.effort) if pilot else None
            if found is None:
                priors = priors or load_priors(priors_path)
                found = priors.rate(cell.learner, CURATOR_ROW, cell.effort, grid.track.name)
            curator, curator_source = found
            calls, seconds = calls + curator.calls * curated, seconds + curator.seconds * curated
            tokens_in, tokens_out = tokens_in + curator.input_tokens * curated, tokens_out + curator.output_tokens * curated
        usd = None if price is None else (tokens_in * price.input_per_m + tokens_out * price.output_per_m) / 1e6
        planned.append(CellPlan(
            cell=cell.cell, learner=cell.learner, row=cell.row, effort=cell.effort, order=cell.order,
            instances=n, stream=phases["stream"], epilogue=phases["epilogue"], fresh=phases["fresh"],
            calls=calls, input_tokens=tokens_in, output_tokens=tokens_out, usd=usd,
            seconds=seconds, snapshot_bytes=rate.snapshot_bytes * n, source=source,
            curated_tasks=curated, curator_source=curator_source))
    notes = []
    if any(p.source.startswith("prior") for p in planned):
        if grid.model.endpoint == "embedded":
            notes.append("priors were measured on the embedded model on this project's machine; "
                         "--pilot RUN replaces them with your own run's")
        else:
            notes.append(f"priors were measured on the embedded model: for {grid.model.name} they are "
                         "rough (a real model's reasoning tokens, latency and tool use differ); run a "
                         "small pilot grid and plan with --pilot RUN")
    if grid.model.endpoint == "embedded" and grid.model.timing is None:
        notes.append("the embedded model shares this machine's cores: more workers than cores "
                     "stretch each cell's seconds")
    for p in planned:
        if p.curated_tasks:
            notes.append(f"{p.cell}: its curator's {p.curated_tasks} conversations (one per task met in a "
                         f"round, per update) are in its calls, tokens and time ({p.curator_source})")
    if price is None:
        notes.append(f"dollars unknown: {price_source}")
    return Plan(
        grid=grid.name, model=grid.model.name, endpoint=grid.model.endpoint, workers=grid.workers,
        cells=planned, instances=sum(p.instances for p in planned), calls=sum(p.calls for p in planned),
        input_tokens=sum(p.input_tokens for p in planned), output_tokens=sum(p.output_tokens for p in planned),
        usd=None if price is None else sum(p.usd or 0.0 for p in planned), price_source=price_source,
        cell_seconds=sum(p.seconds for p in planned), wall_seconds=wall_at([p.seconds for p in planned], grid.workers),
        snapshot_bytes=sum(p.snapshot_bytes for p in planned),
        images=needed_images(grid) if images else [], pilot=str(pilot_dir) if pilot_dir else None, notes=notes,
        suggested_workers=suggest_workers(grid, *(machine or this_machine())))


# --- the table ------------------------------------------------------------------------------------

def _count(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def _bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(round(seconds)), 3600)
    minutes, secs = divmod(rest, 60)
    if hours >= 48:
        return f"{hours / 24:.1f} d"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _usd(value: float | None) -> str:
    return "?" if value is None else f"~${value:,.2f}"


def _sources(plan: Plan) -> str:
    counts: dict[str, int] = defaultdict(int)
    for p in plan.cells:
        counts[p.source.split(" ")[0]] += 1
    return ", ".join(f"{source} {n}" for source, n in sorted(counts.items()))


def render_plan(plan: Plan, console) -> None:
    """The plan as a rich table per cell, a total line, the images and the notes."""
    from rich.table import Table

    table = Table(title=f"plan: {plan.grid} ({len(plan.cells)} cells, model {plan.model}, "
                        f"{plan.workers} workers)", show_footer=True)
    columns = (("cell", "total"), ("instances", f"{plan.instances:,}"), ("calls", _count(plan.calls)),
               ("input tok", _count(plan.input_tokens)), ("output tok", _count(plan.output_tokens)),
               ("USD (est.)", _usd(plan.usd)),
               ("wall", f"{_duration(plan.wall_seconds)} at {plan.workers}"),
               ("snapshots", _bytes(plan.snapshot_bytes)), ("rates from", _sources(plan)))
    for i, (name, footer) in enumerate(columns):
        table.add_column(name, footer=footer, justify="left" if i in (0, 8) else "right")
    for p in plan.cells:
        table.add_row(p.cell, f"{p.instances}", _count(p.calls), _count(p.input_tokens),
                      _count(p.output_tokens), _usd(p.usd), _duration(p.seconds), _bytes(p.snapshot_bytes),
                      p.source)
    console.print(table)
    dollars = (f"{_usd(plan.usd)} (an estimate; prices: {plan.price_source})" if plan.usd is not None
               else "dollars unknown (no price: see the note)")
    console.print(f"total: {plan.instances:,} instances, {_count(plan.calls)} model calls, "
                  f"{_count(plan.input_tokens)} input + {_count(plan.output_tokens)} output tokens, "
                  f"{dollars}, {_duration(plan.cell_seconds)} of cell time = {_duration(plan.wall_seconds)} "
                  f"wall at {plan.workers} workers, {_bytes(plan.snapshot_bytes)} of state snapshots",
                  highlight=False, soft_wrap=True)
    if plan.suggested_workers is not None:
        s = plan.suggested_workers
        console.print(f"workers: the grid says {plan.workers}; this machine holds {s.workers} "
                      f"({s.basis})", highlight=False, soft_wrap=True)
    if plan.images:
        build = [i.name for i in plan.images if i.status == "to build"]
        console.print(f"images: {', '.join(build) or 'none'} to build", highlight=False)
        for image in plan.images:
            console.print(f"  {image.name:<14} {image.status:<9} {image.tag or '-':<36} {image.note}",
                          highlight=False, soft_wrap=True)
    else:
        console.print("images: none (no Docker: no harness, program checks in host processes)", highlight=False)
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
