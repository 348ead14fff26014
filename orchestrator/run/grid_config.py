"""Grid files: YAML -> validated `GridConfig` -> cells (learner x row x model x effort x order x seed).

Validation errors name the file, the line and the field, e.g.
`examples/x.yaml:12: efforts[1]: Input should be 'low', 'medium' or 'high'`.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness_adapters import registry
from harness_adapters.chat_model import ANTHROPIC_THINKING_BUDGET, Api, ModelEndpoint
from orchestrator.errors import ConfigError
from orchestrator.protocol import Limits
from orchestrator.records import RECORDS_FORMAT, CellRecord, RunPaths
from orchestrator.run.collective.training import EMBEDDED_ONLY, trainer_class
from orchestrator.rows import COLLECTIVE_ROWS, MEMORY_ON, TRAINED, label, row
from orchestrator.tasks.rearc import PATH_ENV as REARC_PATH_ENV
from sandboxes.engines import known_engines

ARC3_GAMES_ENV = "CARC_ARC3_GAMES"
from proxy.prices import PriceTable
from solver_model.search import EFFORTS as EMBEDDED_EFFORTS
from solver_model.timing import Timing
from solver_model.timing import resolve as resolve_timing

# harnesses run in their own Docker sandbox behind a proxy container (harness_adapters/learners.yaml)
HARNESSES = frozenset(registry.harnesses())
LEARNER_ROWS: dict[str, tuple[str, ...]] = {name: e.rows for name, e in registry.learners().items()}
# The efforts a grid may name; each API's own field for them is the adapter's and the client's.
Effort = Literal["minimal", "low", "medium", "high", "xhigh", "max"]
EMBEDDED = "embedded"


class GridFileError(ConfigError):
    """A grid file that cannot be run; the message names file, line and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TrackConfig(_Strict):
    name: Literal["own", "arc1", "arc2", "arc3"] = "own"
    source: Literal["own", "rearc", "frames"] | None = Field(
        None, description="arc1 only: rearc (needs rearc_path), own generators, or public pairs in frames")
    tasks: int = Field(25, ge=1, le=400)
    task_ids: list[str] | None = None
    epilogue: int = Field(25, ge=0, le=400)
    fresh_reference: bool = True
    visits: int = Field(8, ge=1, le=64)
    rearc_path: Path | None = None
    labels: Path | None = None
    environments_dir: Path | None = Field(
        None, description="arc3 only: an ARC-AGI-3 environment_files/ folder (<game>/<version>/"
        "metadata.json and the game's source); default: the variable CARC_ARC3_GAMES")

    @model_validator(mode="after")
    def _source_fits_track(self) -> "TrackConfig":
        if self.name == "arc1" and self.source is None:
            self.source = "rearc" if self.rearc_path else "frames"
        if self.name != "arc1" and self.source not in (None, "own" if self.name == "own" else "frames"):
            raise ValueError(f"source {self.source!r} is only for track arc1")
        if self.source == "rearc" and self.rearc_path is None and os.environ.get(REARC_PATH_ENV):
            # only for an explicit `source: rearc`: the variable never turns a frames grid into Re-ARC
            self.rearc_path = Path(os.environ[REARC_PATH_ENV]).expanduser().resolve()
        if self.source == "rearc" and self.rearc_path is None:
            raise ValueError(f"source rearc needs rearc_path (or the variable {REARC_PATH_ENV}): the folder "
                             "of a Re-ARC checkout (git clone of michaelhodel/re-arc)")
        if self.name == "arc3":
            self._arc3()
        elif self.environments_dir is not None:
            raise ValueError("environments_dir is for track arc3 only")
        return self

    def _arc3(self) -> None:
        """A game is a task and a level an instance; there is no held-out epilogue (yet); `tasks`
        is at most how many games are played (all of them when the folder has fewer)."""
        given = self.model_fields_set
        if self.environments_dir is None and os.environ.get(ARC3_GAMES_ENV):
            self.environments_dir = Path(os.environ[ARC3_GAMES_ENV]).expanduser().resolve()
        if self.environments_dir is None:
            raise ValueError(f"track arc3 needs environments_dir (or the variable {ARC3_GAMES_ENV}): an "
                             "ARC-AGI-3 environment_files/ folder; `carc arc3 fetch DIR` downloads the "
                             "public games on a machine with internet")
        if "epilogue" in given and self.epilogue:
            raise ValueError("track arc3 has no held-out epilogue: set epilogue: 0")
        if "fresh_reference" in given and self.fresh_reference:
            raise ValueError("track arc3 has no fresh reference (it needs an epilogue): remove it")
        if self.source is not None or self.labels is not None or self.rearc_path is not None:
            raise ValueError("source, labels and rearc_path are not arc3's: remove them")
        self.epilogue, self.fresh_reference = 0, False


class ModelConfig(_Strict):
    endpoint: str = Field(EMBEDDED, description="'embedded' (the project's solver model) or a base URL")
    name: str = "carc-solver"
    api: Api = Field("openai-chat", description="the API the endpoint speaks: openai-chat (also "
                     "OpenRouter, vLLM, Ollama, llama.cpp), openai-responses, anthropic-messages")
    api_key_env: str = "OPENAI_API_KEY"
    input_usd_per_mtok: float | None = Field(None, ge=0, description="the model's input price "
                                             "(USD per million tokens); null: the price table's")
    output_usd_per_mtok: float | None = Field(None, ge=0, description="the model's output price; "
                                              "null: the price table's")
    timeout_s: float = Field(600.0, gt=0)
    max_tokens: int | None = None
    seed: int = Field(0, ge=0, description="the embedded model's seed (with each conversation, it "
                                           "seeds the reply's search order); ignored by an endpoint")
    timing: Timing | None = Field(
        None, description="the embedded model's real-model timing: a profile (hosted, hosted-fast) "
        "or {ttft_s: {median, sigma}, tokens_per_s: {median, sigma}}; null: answer at once")

    @field_validator("timing", mode="before")
    @classmethod
    def _timing_profile(cls, value: Any) -> Any:
        return resolve_timing(value) if isinstance(value, str) else value

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if value == EMBEDDED:
            return value
        parts = urlsplit(value)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not a base URL: give 'embedded' or http(s)://host[:port]/path "
                             "(e.g. https://api.openai.com/v1)")
        return f"{parts.scheme.lower()}://{value.split('://', 1)[1]}"

    @model_validator(mode="after")
    def _timing_is_embedded(self) -> "ModelConfig":
        if self.timing is not None and self.endpoint != EMBEDDED:
            raise ValueError("timing is the embedded model's (a real endpoint has its own): remove "
                             "model.timing or set model.endpoint: embedded")
        return self

    @model_validator(mode="after")
    def _anthropic_base(self) -> "ModelConfig":
        # Anthropic's SDKs add /v1/messages to their base URL: https://api.anthropic.com/v1 and
        # https://api.anthropic.com name the same endpoint.
        if self.api == "anthropic-messages" and self.endpoint != EMBEDDED:
            self.endpoint = self.endpoint.rstrip("/").removesuffix("/v1")
        return self

    def endpoint_for(self, effort: str, base_url: str) -> ModelEndpoint:
        return ModelEndpoint(base_url=base_url, model=self.name, api=self.api, api_key_env=self.api_key_env,
                             effort=effort, input_usd_per_mtok=self.input_usd_per_mtok or 0.0,
                             output_usd_per_mtok=self.output_usd_per_mtok or 0.0,
                             timeout_s=self.timeout_s, max_tokens=self.max_tokens)


class LearnerEntry(_Strict):
    learner: str
    row: str = "memory-on"

    @model_validator(mode="after")
    def _known(self) -> "LearnerEntry":
        if self.learner not in LEARNER_ROWS:
            raise ValueError(f"unknown learner {self.learner!r}; known: {', '.join(LEARNER_ROWS)}")
        if self.row not in LEARNER_ROWS[self.learner]:
            raise ValueError(f"learner {self.learner} has no row {self.row!r}; rows: "
                             f"{', '.join(LEARNER_ROWS[self.learner])}")
        return self


class LimitsConfig(_Strict):
    max_malformed: int = Field(20, ge=1)
    wall_clock_s: float = Field(900.0, gt=0)
    snapshot_mb: int = Field(1024, ge=1, description="file data one state snapshot keeps (MiB): the "
                             "bytes files store, holes not counted (a sparse file costs its data, not "
                             "its apparent size); files past it are left out and named in the "
                             "instance_end event")
    snapshot_s: float = Field(600.0, gt=0, description="time one state snapshot may take")
    state_mb: int | None = Field(4096, ge=16, description="a harness's state volume quota (MiB): "
                                 "writing past it fails with ENOSPC in the sandbox; null: no quota")
    usd_per_cell: float | None = Field(None, gt=0, description="dollars a cell may spend (the proxy "
                                       "journal's, at the run's prices): checked before every "
                                       "instance; at the cap the cell stops, recorded, and "
                                       "continues on resume after the cap is raised")

    def limits(self) -> Limits:
        return Limits(max_malformed=self.max_malformed, wall_clock_s=self.wall_clock_s)


class SandboxConfig(_Strict):
    """Where learners' code runs: Docker sandboxes (the default) or host processes."""

    engine: str = Field(
        "docker", description="docker: program checks and harnesses in containers; process: "
                              "program checks in host subprocesses (no Docker needed; refused to a "
                              "non-root carc when the grid has an API key its programs could read); "
                              "or an engine registered with sandboxes.engines.register_engine")
    base: Literal["auto", "registry", "offline"] = Field(
        "auto", description="image base: a registry image, the offline debootstrap rootfs, or "
                            "auto (registry when reachable)")
    cpus: float = Field(1.0, gt=0)
    memory: str = "2g"
    pids: int = Field(512, ge=16)
    standby: bool = Field(
        True, description="prepare a harness's next instance ahead: for wiped rows (memory-off) its "
                          "fresh sandbox (a second container, its own empty volume, the harness "
                          "started) while the current instance runs, so the wipe is a swap; for kept "
                          "rows the next conversation's driver after the snapshot (hermes-agent)")

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, name: str) -> str:
        if name not in known_engines():
            raise ValueError(f"{name!r} is not a sandbox engine; give one of {', '.join(known_engines())} "
                             "(another registers itself with sandboxes.engines.register_engine)")
        return name


class CollectiveConfig(_Strict):
    """The seed's second regime (docs/collective.md): `users` users, each on a stream of its own
    over the same tasks, in rounds of `round_slots` slots; between rounds an update step merges
    what every user kept into the next round's shared state (`share: false`: never, so every
    row is its own users' independent learners)."""

    users: int = Field(100, ge=1, le=1000)
    round_slots: int = Field(25, ge=1)
    share: bool = True
    trainer: str = Field("primitive-prior", description="what trains the model of the row trained "
                         "between rounds: a name in orchestrator/run/collective/training.py's "
                         "TRAINERS, or module:attribute of a RoundTrainer class")


class ProxyConfig(_Strict):
    journal: bool = Field(True, description="route every model call through the journaling proxy")


class GridConfig(_Strict):
    name: str
    seed: int = 0
    seeds: list[int] | None = None
    track: TrackConfig = TrackConfig()
    orders: list[Literal["sequential", "workstreams", "random"]] = ["workstreams"]
    model: ModelConfig = ModelConfig()
    efforts: list[Effort] = ["medium"]
    learners: list[LearnerEntry]
    limits: LimitsConfig = LimitsConfig()
    prompts: Path | None = None
    prices: Path | None = Field(None, description="a price file (the shape of proxy/prices.json) whose "
                                "models extend and override carc's table")
    workers: int = Field(2, ge=1, le=64)
    sandbox: SandboxConfig = SandboxConfig()
    proxy: ProxyConfig = ProxyConfig()
    collective: CollectiveConfig | None = Field(
        None, description="the collective regime: {users, round_slots, share} (docs/collective.md)")
    harness_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per harness, settings its adapter reads, e.g. "
        "openclaw: {dreaming_frequency: '0 * * * *', workshop_mode: auto}")

    @model_validator(mode="after")
    def _collective_has_no_fresh_reference(self) -> "GridConfig":
        if self.collective is not None and "fresh_reference" not in self.track.model_fields_set:
            self.track.fresh_reference = False  # its epilogue halves measure new tasks instead
        return self

    @field_validator("harness_options")
    @classmethod
    def _known_harnesses(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        unknown = sorted(set(value) - HARNESSES)
        if unknown:
            raise ValueError(f"no harness {', '.join(unknown)}; known: {', '.join(sorted(HARNESSES))}")
        return value

    @field_validator("learners", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"learner": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("efforts")
    @classmethod
    def _efforts(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one effort is needed")
        return value

    def problems(self) -> list[tuple[tuple[Any, ...], str]]:
        """What the field types cannot see, as (location, message): efforts the embedded model
        lacks, an API it or a harness cannot speak, an Anthropic max_tokens the thinking budget
        does not fit in, and harness options their adapter does not declare or types
        differently (each named harness's adapter module is imported for its declarations)."""
        found = []
        if self.model.endpoint == EMBEDDED:
            found += [(("efforts", i), f"the embedded model has efforts {', '.join(EMBEDDED_EFFORTS)}, "
                                       f"not {effort!r}")
                      for i, effort in enumerate(self.efforts) if effort not in EMBEDDED_EFFORTS]
            found += self._embedded_api_problems()
        if self.model.api == "anthropic-messages" and self.model.max_tokens is not None:
            found += [(("model", "max_tokens"), f"{self.model.max_tokens} does not exceed the thinking "
                       f"budget of effort {effort} ({ANTHROPIC_THINKING_BUDGET[effort]} tokens, "
                       f"docs/providers.md); give more than that, or no max_tokens (carc then sends the "
                       f"budget + 8192)")
                      for effort in dict.fromkeys(self.efforts)
                      if self.model.max_tokens <= ANTHROPIC_THINKING_BUDGET[effort]][:1]
        found += self._collective_problems()
        for i, entry in enumerate(self.learners):
            if self.track.name == "arc3" and row(entry.row).program_procedure:
                found.append((("learners", i), f"row {entry.row} asks for grid programs, which arc3 does "
                              "not have; on arc3 use memory-on, memory-off or asked-to-store"))
            tracks = registry.entry(entry.learner).tracks
            if self.track.name not in tracks:
                players = [n for n, e in registry.learners().items() if self.track.name in e.tracks]
                found.append((("learners", i), f"{entry.learner} plays {', '.join(tracks)}, not track "
                              f"{self.track.name} (which {', '.join(players)} play)"))
        for i, entry in enumerate(self.learners):
            if entry.learner not in HARNESSES:
                continue  # the ladder speaks every API
            try:
                apis = registry.adapter(entry.learner).apis
            except Exception as exc:  # reported below for harness_options, or here
                found.append((("learners", i), f"the adapter of {entry.learner} does not load: "
                                               f"{type(exc).__name__}: {exc}"))
                continue
            if self.model.api not in apis:
                found.append((("learners", i), f"{entry.learner} cannot use model.api {self.model.api}: "
                              f"its adapter speaks {', '.join(apis)}; remove this learner or change "
                              f"model.api (docs/providers.md)"))
        for harness, given in self.harness_options.items():
            try:
                adapter = registry.adapter(harness)
            except Exception as exc:  # a broken adapter module is the grid's problem to report here
                found.append((("harness_options", harness), f"its adapter does not load: {type(exc).__name__}: {exc}"))
                continue
            found += [(("harness_options", harness, key), message)
                      for key, message in adapter.option_problems(given).items()]
        return found

    def _collective_problems(self) -> list[tuple[tuple[Any, ...], str]]:
        """A collective grid: ARC instances (own, Re-ARC, frames), one order, users instead of
        seeds, learners on rows memory-on (independent) or a collective row (collective, trained;
        a harness's collective row has a curator session between rounds); the collective rows
        nowhere else."""
        if self.collective is None:
            return [(("learners", i), f"row {e.row} is for collective grids: add "
                     "collective: {users: N, round_slots: S} or use another row")
                    for i, e in enumerate(self.learners) if e.row in COLLECTIVE_ROWS]
        found: list[tuple[tuple[Any, ...], str]] = []
        if self.track.name == "arc3":
            found.append((("track", "name"), "a collective grid serves ARC instances (tracks own, arc1, "
                          "arc2), not arc3's games: an ARC-AGI-3 level runs on its own runner"))
        if len(self.orders) != 1:
            found.append((("orders",), "a collective grid has one order (its users' streams differ by "
                          "seed): give one"))
        if self.seeds is not None:
            found.append((("seeds",), "a collective grid has users instead of seeds: remove seeds"))
        if self.track.fresh_reference and "fresh_reference" in self.track.model_fields_set:
            found.append((("track", "fresh_reference"), "a collective grid measures new tasks by its "
                          "epilogue halves, not a fresh reference: remove it"))
        if self.track.epilogue and self.collective.users < 2:
            found.append((("collective", "users"), "the epilogue is served to half the users, then to "
                          "the other half: give at least 2 users, or epilogue: 0"))
        for i, entry in enumerate(self.learners):
            if entry.row not in (MEMORY_ON, *COLLECTIVE_ROWS):
                found.append((("learners", i), f"row {entry.row} is not a collective grid's: use "
                              f"{MEMORY_ON} (each user's independent learner) or one of "
                              f"{', '.join(COLLECTIVE_ROWS)}"))
        if any(e.row == TRAINED for e in self.learners):
            problem = self._trainer_problem()
            if problem:
                found.append((("collective", "trainer"), problem))
        return found

    def _trainer_problem(self) -> str | None:
        """Why the grid's trained row cannot run, or None."""
        collective = self.collective_settings
        try:
            trainer_class(collective.trainer)
        except ValueError as exc:
            return str(exc)
        if collective.trainer in EMBEDDED_ONLY and self.model.endpoint != EMBEDDED:
            return (f"trainer {collective.trainer} trains the embedded model "
                    f"(model.endpoint: embedded); this grid calls {self.model.endpoint}: use the "
                    "embedded model or a trainer of your own")
        if not collective.share:
            return "share: false trains nothing between rounds: remove the row trained, or share"
        return None

    def _embedded_api_problems(self) -> list[tuple[tuple[Any, ...], str]]:
        """The embedded model serves chat completions and Anthropic messages (streamed or not) and
        non-streamed Responses: the ladder can use any, a harness (which streams) not Responses."""
        if self.model.api == "openai-responses":
            return [(("learners", i), f"{e.learner} streams its Responses calls, and the embedded model "
                                      "serves Responses unstreamed only; use model.api openai-chat")
                    for i, e in enumerate(self.learners) if e.learner in HARNESSES]
        return []

    @property
    def collective_settings(self) -> CollectiveConfig:
        """The `collective:` section, for code that runs only on a collective grid: a grid without
        one is a ConfigError that says so (an `assert` was gone under `python -O`)."""
        if self.collective is None:
            raise ConfigError(f"grid {self.name!r} is not a collective grid: it has no `collective:` "
                              "section (docs/collective.md)")
        return self.collective

    def cells(self) -> list["Cell"]:
        out = []
        for seed in self.seeds or [self.seed]:
            for order in self.orders:
                for effort in self.efforts:
                    for entry in self.learners:
                        out.append(Cell(learner=entry.learner, row=entry.row, model=self.model.name,
                                        effort=effort, order=order, seed=seed,
                                        track=self.track.name))
        ids = [c.cell for c in out]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise GridFileError(f"grid {self.name!r} repeats cell(s) {dupes}; remove the duplicate learner entries")
        return out


class Cell(_Strict):
    """One run of one learner on one stream: the unit the runner executes and the report rows."""

    learner: str
    row: str
    model: str
    effort: str
    order: str
    seed: int
    track: str

    @property
    def label(self) -> str:
        return label(self.learner, self.row)

    @property
    def cell(self) -> str:
        return f"{self.label}.{self.effort}.{self.order}.s{self.seed}"

    def record(self) -> CellRecord:
        return CellRecord(cell=self.cell, label=self.label, format=RECORDS_FORMAT, **self.model_dump())


def _line_of(root: yaml.Node, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the YAML node at a pydantic error location, or its nearest parent."""
    node, line = root, root.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == part), None)
            if match is None:
                break
            line = next(k for k, v in node.value if v is match).start_mark.line + 1
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[") or "(top level)"


def load_grid(path: Path | str) -> GridConfig:
    """Read and validate a grid file; relative paths inside it are relative to the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise GridFileError(f"{path}: cannot read grid file: {exc.strerror}") from exc
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GridFileError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or root is None:
        raise GridFileError(f"{path}:1: a grid file is a mapping with at least 'name' and 'learners'")
    try:
        grid = GridConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            field = _field(loc)
            message = err['msg'].removeprefix('Value error, ')
            lines.append(f"{path}:{_line_of(root, loc)}: {field}: {message}")
        raise GridFileError("\n".join(lines)) from None
    if grid.prices is not None:
        try:
            PriceTable.load(grid.prices if grid.prices.is_absolute() else path.parent / grid.prices)
        except ValueError as exc:
            raise GridFileError(f"{path}:{_line_of(root, ('prices',))}: prices: {exc}") from None
    problems = grid.problems()
    if problems:
        raise GridFileError("\n".join(f"{path}:{_line_of(root, loc)}: {_field(loc)}: {message}"
                                      for loc, message in problems))
    base = path.parent
    for holder, attr in ((grid.track, "rearc_path"), (grid.track, "labels"),
                         (grid.track, "environments_dir"), (grid, "prompts"),
                         (grid, "prices")):
        value = getattr(holder, attr)
        if value is not None and not value.is_absolute():
            setattr(holder, attr, (base / value).resolve())
    return grid


# --- the grid of a run folder ---------------------------------------------------------------------

# Files a grid names that are copied into the run folder, so a run resumes from its folder alone
# (Re-ARC's checkout is a folder of code, not copied: its absolute path is kept).
_COPIED = ((("prompts",), "prompts"), (("track", "labels"), "labels"), (("prices",), "prices"))


def run_grid_data(grid: GridConfig) -> tuple[dict[str, Any], dict[str, Path]]:
    """The validated grid as the run folder stores it, and the files to copy beside it: name in
    the run folder -> source. Every path in the stored grid is absolute or relative to it."""
    data = grid.model_dump(mode="json")
    copies = {}
    for keys, stem in _COPIED:
        holder = data
        for key in keys[:-1]:
            holder = holder[key]
        if holder.get(keys[-1]):
            source = Path(holder[keys[-1]])
            name = f"{stem}{source.suffix}"
            copies[name] = source
            holder[keys[-1]] = name
    return data, copies


EFFECTIVE_PRICES = "prices.effective.json"


def price_table(grid: GridConfig) -> PriceTable:
    """The run's prices: carc's table (`proxy/prices.json`), then the grid's `prices` file, then
    the model's own `input_usd_per_mtok`/`output_usd_per_mtok` when given."""
    table = PriceTable.load(None)
    if grid.prices is not None:
        table = table.merged(PriceTable.load(grid.prices))
    model = grid.model
    if model.input_usd_per_mtok is not None or model.output_usd_per_mtok is not None:
        known = table.lookup(model.name)
        table = table.with_price(
            model.name, model.input_usd_per_mtok if model.input_usd_per_mtok is not None
            else (known.input_per_m if known else 0.0),
            model.output_usd_per_mtok if model.output_usd_per_mtok is not None
            else (known.output_per_m if known else 0.0), "the grid's model prices")
    return table


def run_prices(run_root: Path) -> Path:
    """The run's price file, written once from the stored grid (so a resumed run prices as it
    started, whatever becomes of carc's table); every cell's proxy journals dollars by it."""
    path = Path(run_root) / EFFECTIVE_PRICES
    if not path.exists():
        price_table(load_grid(RunPaths(run_root).grid)).dump(path)
    return path


def write_run_grid(grid: GridConfig, original: Path, run_root: Path) -> Path:
    """Write `grid.yaml` (validated, paths resolved), `grid.original.yaml` and the copied files."""
    data, copies = run_grid_data(grid)
    for name, source in copies.items():
        try:
            (run_root / name).write_bytes(source.read_bytes())
        except OSError as exc:
            raise GridFileError(f"{original}: cannot copy {source} into the run folder: {exc.strerror}") from None
    RunPaths(run_root).grid_original.write_bytes(Path(original).read_bytes())
    path = RunPaths(run_root).grid
    path.write_text("# the validated grid of this run; resume reads only this file\n"
                    + yaml.safe_dump(data, sort_keys=False))
    run_prices(run_root)
    return path


def grid_differences(stored: GridConfig, given: GridConfig) -> list[str]:
    """Where two grids differ, as `field: a != b`, and `<file> differs` for a file they name
    whose content differs."""
    (data_a, files_a), (data_b, files_b) = run_grid_data(stored), run_grid_data(given)
    import pandas as pd  # here: a cell's worker process never needs it

    a, b = pd.json_normalize(data_a).iloc[0].to_dict(), pd.json_normalize(data_b).iloc[0].to_dict()
    fields = [f"{key}: {_short(a.get(key))} != {_short(b.get(key))}"
              for key in dict.fromkeys([*a, *b]) if a.get(key) != b.get(key)]

    def content(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None and path.exists() else None
    return fields + [f"{name} differs" for name in dict.fromkeys([*files_a, *files_b])
                     if content(files_a.get(name)) != content(files_b.get(name))]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
