"""The `carc` command line."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from typer.core import TyperGroup

from orchestrator.errors import RunFailed, UserError


class CarcCommands(TyperGroup):
    """Every `carc` command's errors, handled once: a UserError (what is wrong, where, and how to
    fix it) is one line and exit code 2; any other exception is shown with its traceback, as the
    bug or failure it is. `carc --debug ...` shows a user error's traceback too."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            if ctx.params.get("debug"):
                raise
            console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None


app = typer.Typer(cls=CarcCommands, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_show_locals=False,  # a frame's locals may hold a key
                  help="Continual-ARC harness grid: streams, learners, records and reports.")
grid_app = typer.Typer(no_args_is_help=True, help="Run grids of cells.")
stream_app = typer.Typer(no_args_is_help=True, help="Inspect streams.")
model_app = typer.Typer(no_args_is_help=True, help="The embedded offline solver model.")
tasks_app = typer.Typer(no_args_is_help=True, help="Task sources.")
images_app = typer.Typer(no_args_is_help=True, help="Sandbox images (built from recipes, cached).")
sandboxes_app = typer.Typer(no_args_is_help=True, help="Docker sandboxes of cells.")
adapters_app = typer.Typer(no_args_is_help=True, help="Harness adapters: list, scaffold, check.")
node_app = typer.Typer(no_args_is_help=True, help="This machine as a node of a Ray cluster (--executor ray).")
labels_app = typer.Typer(no_args_is_help=True, help="Symmetry labels of a frames track (two passes).")
arc3_app = typer.Typer(no_args_is_help=True, help="ARC-AGI-3: the games of the arc3 track.")
app.add_typer(grid_app, name="grid")
app.add_typer(stream_app, name="stream")
app.add_typer(model_app, name="model")
app.add_typer(tasks_app, name="tasks")
app.add_typer(images_app, name="images")
app.add_typer(sandboxes_app, name="sandboxes")
app.add_typer(adapters_app, name="adapters")
app.add_typer(node_app, name="node")
app.add_typer(labels_app, name="labels")
app.add_typer(arc3_app, name="arc3")
console = Console()


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="show the traceback of a user error too")) -> None:
    pass  # --debug is read where errors are handled: CarcCommands.invoke


def _fail(message: str) -> None:
    console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@grid_app.command("run")
def grid_run(grid: Optional[Path] = typer.Argument(None, help="grid YAML file"),
             resume: Optional[Path] = typer.Option(None, help="continue the run in this directory"),
             runs_dir: Path = typer.Option(Path("runs"), help="where new runs are created"),
             run_id: Optional[str] = typer.Option(None, help="name of the run directory (an existing "
                                                  "one continues if it holds the same grid)"),
             workers: Optional[int] = typer.Option(None, help="cells run in parallel"),
             usd_per_cell: Optional[float] = typer.Option(
                 None, help="with --resume: set the run's limits.usd_per_cell (cells stopped at "
                            "the old cap continue)"),
             report: bool = typer.Option(True, help="write report.md when the run ends"),
             executor: str = typer.Option("local", help="local: a process pool on this machine; ray: "
                                          "a Ray task per cell (pip install 'carc\\[ray]')"),
             address: Optional[str] = typer.Option(None, help="with --executor ray: the cluster's "
                                                   "address (default RAY_ADDRESS, else Ray on this machine)"),
             durability: str = typer.Option("shared", help="with --executor ray: shared, every node "
                                            "writes into the run folder (a shared filesystem); head, "
                                            "records reach the head's folder as they are written")) -> None:
    """Run every cell of GRID (or continue --resume RUN), then write the report."""
    from orchestrator.records import RunPaths
    from orchestrator.run import executors
    from orchestrator.run.run_folder import RunInterrupted, open_run, set_usd_per_cell, stopped_cells

    if (grid is None) == (resume is None):
        _fail("give a grid file, or --resume RUN_DIR (not both)")
    executors.check(executor, address, durability)  # before a run folder is made

    def run_cells(run_dir: Path, workers: Optional[int]) -> list[str]:
        return executors.run(run_dir, executor, workers, address=address, durability=durability)

    # Ctrl-C always stops a run: a process started with SIGINT ignored (a background job of a
    # script, some CI runners) inherits that, and Python then never raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C: workers and containers go
    try:
        if resume is not None:
            if not RunPaths(resume).grid.exists():
                _fail(f"{resume}: not a run directory (no grid.yaml)")
            run_dir = resume
            if usd_per_cell is not None:
                set_usd_per_cell(run_dir, usd_per_cell)
            run_cells(run_dir, workers)
        else:
            if usd_per_cell is not None:
                _fail("--usd-per-cell is for --resume; a new run takes limits.usd_per_cell from its grid")
            run_dir = open_run(grid, runs_dir, run_id)
            run_cells(run_dir, workers)
    except RunInterrupted as exc:
        console.print(f"run: {exc.run_dir}: {exc}", highlight=False)
        raise typer.Exit(130)
    except RunFailed as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"run: {run_dir}")
    stopped = stopped_cells(run_dir)
    if stopped:
        console.print(f"[yellow]{len(stopped)} cell(s) stopped at limits.usd_per_cell[/yellow]: "
                      f"{', '.join(stopped)}; raise it with `carc grid run --resume {run_dir} "
                      "--usd-per-cell X`", highlight=False, soft_wrap=True)
    if report:
        console.print(f"report: {_write_report(run_dir)}")
        _inspect_harness_cells(run_dir)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _inspect_harness_cells(run_dir: Path) -> None:
    """A run with harness cells also gets the stores inspector's account (RUN/inspect/)."""
    from orchestrator.run.grid_config import HARNESSES, load_grid
    from orchestrator.records import RunPaths
    from stores_inspector import inspect_run

    if not {c.learner for c in load_grid(RunPaths(run_dir).grid).cells()} & HARNESSES:
        return
    try:
        folder = inspect_run(run_dir).write()
    except Exception as exc:  # the run and its report stand; the account can be redone
        console.print(f"inspect: failed ({type(exc).__name__}: {exc}); retry with `carc inspect {run_dir}`")
        return
    console.print(f"what the harnesses kept: {folder / 'inspect.md'}", highlight=False)


@grid_app.command("cells")
def grid_cells(grid: Path) -> None:
    """List the cells a grid file expands to."""
    from orchestrator.run.grid_config import load_grid
    for cell in load_grid(grid).cells():
        console.print(cell.cell, highlight=False)


@grid_app.command("check")
def grid_check(grid: Path) -> None:
    """Validate a grid file and print its cells and schedule length."""
    from orchestrator.run.grid_config import load_grid
    from orchestrator.run.schedule import build_schedule
    try:
        config = load_grid(grid)
        cells = config.cells()
        if config.collective is not None:
            from orchestrator.run.collective.schedule import rounds, user_schedule
            users = config.collective.users
            per_user = len(user_schedule(config, cells[0], 0))
        else:
            schedule = build_schedule(config, cells[0])
    except KeyError as exc:  # a name the grid gives that no table knows
        _fail(f"{grid}: {exc}")
    if config.collective is not None:
        console.print(f"{grid}: {len(cells)} rows x {users} users x {per_user} instances = "
                      f"{len(cells) * users * per_user:,} instances, in {rounds(config).total} rounds",
                      highlight=False)
        return
    console.print(f"{grid}: {len(cells)} cells, {len(schedule)} instances each", highlight=False)


@grid_app.command("plan")
def grid_plan(grid: Path,
              pilot: Optional[Path] = typer.Option(None, help="a run folder whose journal and events "
                                                   "give the per-instance rates (else the priors)"),
              format: str = typer.Option("table", "--format", help="table | json")) -> None:
    """The bill before anything is spent: per cell and in total, instances, model calls, tokens,
    dollars (an estimate), wall time at the grid's workers, snapshot disk, images to build."""
    from orchestrator.run.grid_config import load_grid
    from orchestrator.run.plan import plan_grid, render_plan
    if format not in ("table", "json"):
        _fail(f"--format {format!r}: use table or json")
    try:
        plan = plan_grid(load_grid(grid), pilot)
    except KeyError as exc:  # a name the grid gives that no table knows
        _fail(f"{grid}: {exc}")
    if format == "json":
        print(plan.to_json())
    else:  # piped or captured: wide enough for the cell ids
        render_plan(plan, console if console.is_terminal else Console(width=200))


def _write_report(run: Path, **options) -> Path:
    """The run's report: a collective run's (users in rounds) or a grid's."""
    from orchestrator.analysis.collective_report import is_collective, write_collective_report
    from orchestrator.analysis.report import write_report
    return (write_collective_report if is_collective(run) else write_report)(run, **options)


@app.command("report")
def report(run: Path, resamples: int = typer.Option(10_000), seed: int = typer.Option(0)) -> None:
    """Write RUN/report.md and RUN/report.html (tables and figures) from the run's records."""
    from orchestrator.records import RunPaths
    if not RunPaths(run).cells.is_dir():
        _fail(f"{run}: not a run directory (no cells/)")
    console.print(f"report: {_write_report(run, seed=seed, resamples=resamples)}")


@app.command("status")
def status_cmd(run: Path, json_out: bool = typer.Option(False, "--json", help="machine-readable"),
               watch: float = typer.Option(0.0, help="refresh every this many seconds (Ctrl-C ends)")) -> None:
    """Where RUN stands: cells done / running / stopped / failed / waiting, instances, budget and
    dollars so far, seconds per instance and the estimated finish. Reads the folder only."""
    import time as _time

    from rich.live import Live

    from orchestrator.records import RunPaths
    from orchestrator.run.status import run_status
    if not RunPaths(run).grid.exists():
        _fail(f"{run}: not a run directory (no grid.yaml)")
    if json_out:
        print(run_status(run).to_json())
        return
    if watch <= 0:
        console.print(_status_table(run_status(run)))
        return
    try:
        with Live(_status_table(run_status(run)), console=console, refresh_per_second=1) as live:
            while True:
                _time.sleep(watch)
                live.update(_status_table(run_status(run)))
    except KeyboardInterrupt:
        pass


def _status_table(status) -> "Group":
    """The run's line, one line per cell (names cut to the parts that differ between cells; the
    parts all share are said once), then each failed cell's reason: fits an 80-column terminal."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from orchestrator.analysis.report import pct

    def duration(seconds: float | None) -> str:
        if seconds is None:
            return "–"
        minutes = int(seconds // 60)
        return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{int(seconds % 60):02d}s"

    counts = ", ".join(f"{n} {state}" for state, n in status.counts().items() if n)
    rate = f"{status.rate_per_hour:,.0f} instances/h" if status.rate_per_hour else "no rate yet"
    finish = (f"finish in about {duration(status.eta_s)}" if status.eta_s is not None
              else "no run process alive" if not status.process_alive else "finish: not yet estimable")
    names, shared = short_cell_names([c.cell for c in status.cells])
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=0, title_justify="left",
                  title=f"run {status.run}: {counts}; {status.finished:,}/{status.total:,} instances, "
                        f"${status.usd:,.4f}; {rate}; {finish}"
                        + (f"\ncells: <name>.{shared}" if shared else ""))
    table.add_column("cell", overflow="fold")
    for column in ("state", "done", "budget", "solved", "USD", "s/inst"):
        table.add_column(column, justify="left" if column == "state" else "right", no_wrap=True)
    for name, c in zip(names, status.cells):
        table.add_row(name, c.state, f"{c.finished}/{c.total}",
                      pct(c.budget) if c.budget is not None else "–",
                      pct(c.solved) if c.solved is not None else "–", f"{c.usd:,.4f}",
                      f"{c.seconds_per_instance:.1f}" if c.seconds_per_instance is not None else "–")
    failures = [Text(f"{name}: {c.failure}", overflow="fold")
                for name, c in zip(names, status.cells) if c.failure]
    return Group(table, *([Text("why the failed cells failed:")] + failures if failures else []))


def short_cell_names(cells: list[str]) -> tuple[list[str], str]:
    """Cell names without the dot-separated parts every cell has in the same place (a grid's one
    effort, order and seed), and those parts joined: `hermes-agent.low.sequential.s2` and
    `openclaw.low.sequential.s2` are `hermes-agent` and `openclaw`, with `low.sequential.s2`."""
    split = [name.split(".") for name in cells]
    if len(cells) < 2 or len({len(parts) for parts in split}) != 1:
        return list(cells), ""
    same = [len({parts[i] for parts in split}) == 1 for i in range(len(split[0]))]
    if all(same):
        return list(cells), ""
    names = [".".join(part for part, common in zip(parts, same) if not common) for parts in split]
    shared = [part if common else "*" for part, common in zip(split[0], same)]
    return names, ".".join(shared[1:]) if shared[0] == "*" and shared.count("*") == 1 else ".".join(shared)


@app.command("results")
def results_cmd(run: Path,
                format: str = typer.Option("parquet", "--format", help="parquet | csv | json"),
                out: Optional[Path] = typer.Option(None, help="folder to write to (default RUN/results)"),
                resamples: int = typer.Option(10_000), seed: int = typer.Option(0)) -> None:
    """RUN's results as data: instances (one row per instance) and measures (every number of the
    report, long format, unrounded). Rewrites the report first when the records are newer."""
    from orchestrator.analysis import results
    from orchestrator.analysis.report import results_current
    from orchestrator.records import RunPaths
    if format not in ("parquet", "csv", "json"):
        _fail(f"--format {format!r}: use parquet, csv or json")
    paths = RunPaths(run)
    if not paths.cells.is_dir():
        _fail(f"{run}: not a run directory (no cells/)")
    if not results_current(run):
        console.print(f"report: {_write_report(run, seed=seed, resamples=resamples)}")
    target = out or paths.results
    for path in results.export(paths.results, target, format):
        console.print(f"{path}", highlight=False)


@app.command("compare")
def compare_cmd(run_a: Path, run_b: Path,
                out: Optional[Path] = typer.Option(None, help="also write the table (.csv, .parquet or .json)"),
                resamples: int = typer.Option(10_000), seed: int = typer.Option(0),
                phase: str = typer.Option("stream", help="stream | epilogue | fresh")) -> None:
    """Pair every cell of RUN_A with the cell of RUN_B on the same schedule (learner, row, track,
    effort, order, seed) and print the slot-paired difference A - B in budget share, with its
    bootstrap interval over tasks."""
    import numpy as np
    from rich.table import Table

    from orchestrator.analysis import results
    from orchestrator.analysis.compare import compare_runs
    from orchestrator.analysis.report import pct, pct_ci
    from orchestrator.records import RunPaths
    for run in (run_a, run_b):
        if not RunPaths(run).cells.is_dir():
            _fail(f"{run}: not a run directory (no cells/)")
    table = compare_runs(run_a, run_b, np.random.default_rng(seed), resamples, phase=phase)
    models = bool((table["model_a"] != table["model_b"]).any())
    shown = Table(title=f"{run_a.name} (A) against {run_b.name} (B), {phase} instances, "
                        "budget share %; A - B in points, negative: A used less")
    shown.add_column("cell", overflow="fold")
    if models:
        shown.add_column("model A", overflow="fold")
        shown.add_column("model B", overflow="fold")
    for column in ("A", "B", "A - B", "excluded beyond", "MDE", "pairs"):
        shown.add_column(column, justify="right", no_wrap=column != "excluded beyond")
    for r in table.itertuples():
        named = [r.cell_a, *([str(r.model_a), str(r.model_b)] if models else [])]
        if r.problem:
            shown.add_row(*named, "", "", r.problem, "", "", "0")
            continue
        shown.add_row(*named, pct(r.budget_a), pct(r.budget_b),
                      pct_ci(r.mean, r.lo, r.hi, signed=True), pct(r.bound), pct(r.mde), str(r.pairs))
    console.print(shown)
    if out is not None:
        results.write_frame(table, out)
        console.print(f"table: {out}", highlight=False)


@stream_app.command("show")
def stream_show(order: str = typer.Option("workstreams", help="sequential | workstreams | random"),
                seed: int = typer.Option(0), tasks: int = typer.Option(25),
                visits: int = typer.Option(8)) -> None:
    """Print a stream's schedule summary and its return-gap distribution."""
    import dataclasses

    from orchestrator.streams import PRESETS, build_stream, summary_table
    if order not in PRESETS:
        _fail(f"unknown order {order!r}; use one of {', '.join(PRESETS)}")
    settings = dataclasses.replace(PRESETS[order], visits=visits)
    ids = [f"task{k:02d}" for k in range(tasks)]
    stream = build_stream(ids, settings, seed)
    console.print(summary_table(dataclasses.replace(stream, order=order)))


@model_app.command("serve")
def model_serve(host: str = typer.Option("127.0.0.1"), port: int = typer.Option(8765),
                effort: str = typer.Option("medium", help="default effort: low | medium | high"),
                workers: int = typer.Option(1),
                usage_log: Optional[Path] = typer.Option(
                    None, help="append one JSON line of token counts per answered request"),
                seed: int = typer.Option(0, help="the model seed: with the conversation, it seeds "
                                                 "each reply's search order"),
                timing: Optional[str] = typer.Option(
                    None, help="real-model timing: a profile (hosted, hosted-fast) or JSON "
                               '{"ttft_s": {"median": 1, "sigma": 0.5}, "tokens_per_s": {...}}; '
                               "default: none (answer at once)"),
                prior: Optional[Path] = typer.Option(
                    None, help="a primitive prior (prior.json, solver_model/prior.py): serve the model "
                               "as trained between rounds of a collective grid")) -> None:
    """Serve the embedded solver model as an OpenAI-compatible endpoint."""
    import json

    from pydantic import ValidationError

    from solver_model.server import serve
    from solver_model.timing import resolve
    try:
        drawn = resolve(json.loads(timing) if timing and timing.lstrip().startswith("{") else timing)
    except (ValueError, ValidationError) as exc:
        _fail(f"--timing: {exc}")
    if prior is not None:
        from solver_model.prior import PrimitivePrior
        try:
            PrimitivePrior.load(prior)
        except ValueError as exc:
            _fail(f"--prior: {exc}")
    serve(host=host, port=port, effort_default=effort, workers=workers,
          usage_log=str(usage_log) if usage_log else None, seed=seed, timing=drawn, prior=prior)


@tasks_app.command("list")
def tasks_list(source: str = typer.Option("own", help="own | arc1 | arc2")) -> None:
    """List the task ids of a source."""
    if source == "own":
        from orchestrator.tasks.own import OWN_TASKS
        for task in OWN_TASKS.values():
            console.print(f"{task.task_id:<36} {task.split:<8} {task.kind:<10} {task.description}",
                          highlight=False)
    elif source == "arc1":
        from orchestrator.tasks.public import arc1_tasks
        console.print(" ".join(sorted(arc1_tasks("training"))))
    elif source == "arc2":
        from orchestrator.tasks.public import arc2_new_eval_tasks
        console.print(" ".join(sorted(arc2_new_eval_tasks())))
    else:
        _fail(f"unknown source {source!r}")


@arc3_app.command("fetch")
def arc3_fetch(
    dest: Path = typer.Argument(..., help="the folder to fill (a grid's track.environments_dir)"),
    game: Optional[list[str]] = typer.Option(None, "--game", help="only these games (ls20 or "
                                             "ls20-cb3b57cc); default: every public game"),
    offline_base: bool = typer.Option(False, "--offline", help="build the engine image from an "
                                      "offline Debian rootfs"),
) -> None:
    """Download the public ARC-AGI-3 games with the official toolkit (needs internet; an
    anonymous key is taken unless ARC_API_KEY is set)."""
    from orchestrator.run.arc3_fetch import fetch_games
    games = fetch_games(dest, "offline" if offline_base else "auto", tuple(game or ()))
    for info in games.values():
        console.print(f"{info.game_id:<24} {info.levels} levels, baselines "
                      f"{' '.join(map(str, info.baselines))}", highlight=False)
    console.print(f"{len(games)} games in {dest}; name it in a grid: track: {{name: arc3, "
                  f"environments_dir: {dest}}}", highlight=False)


@labels_app.command("make")
def labels_make(
    track: str = typer.Option("arc2", help="the track whose tasks are labelled (arc2: the 114 tasks new in ARC-AGI-2)"),
    out: Path = typer.Option(Path("arc2_labels.yaml"), help="the labels file to write (an existing one "
                             "keeps its pass B when no --endpoint is given); a grid reads it as track.labels"),
    effort: str = typer.Option("high", help="pass A's search effort: low | medium | high"),
    endpoint: Optional[str] = typer.Option(None, help="pass B's model endpoint (base URL); without "
                                           "it only pass A runs"),
    model: str = typer.Option("", help="pass B's model (both prompts)"),
    model_check: Optional[str] = typer.Option(None, "--model-check", help="a second model for pass "
                                              "B's `check` prompt (default: --model)"),
    api: str = typer.Option("openai-chat", help="openai-chat | openai-responses | anthropic-messages"),
    api_key_env: str = typer.Option("OPENAI_API_KEY", help="the variable holding the endpoint's key"),
    model_effort: Optional[str] = typer.Option(None, "--model-effort", help="pass B's reasoning effort"),
    workers: Optional[int] = typer.Option(None, help="pass A's processes (default: the cores)"),
    concurrency: int = typer.Option(4, min=1, help="pass B: tasks asked at once"),
) -> None:
    """Decide which symmetries each task's rule survives: pass A (the embedded program search,
    mechanical) and, with --endpoint, pass B (a model asked two ways); write the labels file."""
    from orchestrator.labelling import (PassB, endpoint_asker, make_labels, previous_labels,
                                        track_tasks, write_labels)
    tasks = track_tasks(track)
    previous = previous_labels(out)
    if effort not in ("low", "medium", "high"):
        _fail(f"--effort {effort!r}: give low, medium or high")
    with_b = None
    if endpoint:
        if not model:
            _fail("--endpoint needs --model (the model pass B asks)")
        check = model_check or model
        with_b = PassB(endpoint_asker(endpoint, model, api, api_key_env, model_effort),
                       endpoint_asker(endpoint, check, api, api_key_env, model_effort), model, check,
                       concurrency)
    labels = make_labels(tasks, track, effort, with_b, previous, workers,
                         checkpoint=lambda partial: write_labels(partial, out, endpoint))
    write_labels(labels, out, endpoint)
    c = labels.counts()
    console.print(f"wrote {out}: {c['tasks']} tasks; decided {c['decided']} (all 8 kept "
                  f"{c['all 8 kept']}, own frame only {c['own frame only']}), undecided "
                  f"{c['undecided']}, disagreement {c['disagreement']}; pass A gave a verdict on "
                  f"{c['pass A verdicts']}, pass B on {c['pass B verdicts']}", highlight=False)


@images_app.command("build")
def images_build(names: Optional[list[str]] = typer.Argument(None, help="recipes (default: all)"),
                 offline: bool = typer.Option(False, "--offline",
                                              help="base on a debootstrap rootfs, not a registry image"),
                 base: str = typer.Option("auto", help="auto | registry | offline")) -> None:
    """Build the images of the named recipes (and their parents); print each tag and size."""
    import time

    from harness_adapters.registry import image_recipes
    from sandboxes.images import ImageBuildError, docker_client, ensure_image, image_size_mb
    recipes = image_recipes()
    for name in names or ():
        if name not in recipes:
            _fail(f"no image {name!r}; images: {', '.join(recipes)}")
        if isinstance(recipes[name], Exception):
            _fail(f"harness {name}: {type(recipes[name]).__name__}: {recipes[name]}")
    chosen = "offline" if offline else base
    if chosen not in ("auto", "registry", "offline"):
        _fail(f"--base {base!r}: use auto, registry or offline")
    client = docker_client()
    for name in names or list(recipes):
        start = time.monotonic()
        if isinstance(recipes[name], Exception):
            console.print(f"{name:<16} skipped: its adapter does not load: {recipes[name]}",
                          highlight=False, soft_wrap=True)
            continue
        try:
            with console.status(f"building {name} ..."):
                tag = ensure_image(recipes[name], chosen, client)
        except ImageBuildError as exc:
            if names:
                raise
            # building all: a recipe whose input the user has not supplied (prime-agent's
            # source) is skipped with the reason, the others are built
            console.print(f"{name:<16} skipped: {exc}", highlight=False, soft_wrap=True)
            continue
        console.print(f"{name:<16} {tag:<40} {image_size_mb(client, tag):8.0f} MB "
                      f"{time.monotonic() - start:6.1f} s", highlight=False)


@sandboxes_app.command("prune")
def sandboxes_prune(run: Optional[str] = typer.Option(None, help="only this run id")) -> None:
    """Remove the containers, networks and volumes a crashed run left behind (found by label)."""
    from sandboxes.docker_sandbox import prune
    pruned = prune(run=run)
    console.print(f"removed {len(pruned.containers)} containers, {len(pruned.networks)} networks, "
                  f"{len(pruned.volumes)} volumes")


@adapters_app.command("list")
def adapters_list(registry: Optional[Path] = typer.Option(None, hidden=True)) -> None:
    """The registered harnesses: module (and whether it imports), rows, image recipe."""
    from rich.markup import escape

    from harness_adapters.registry import REGISTRY
    from harness_adapters.scaffold import registered_harnesses
    try:
        listed = registered_harnesses(registry or REGISTRY)
    except OSError as exc:
        _fail(str(exc))
    for entry in listed:
        status = escape(entry.status)
        status = f"[green]{status}[/green]" if entry.importable else f"[red]{status}[/red]"
        console.print(f"[bold]{entry.name}[/bold]  {entry.module}  {status}", highlight=False, soft_wrap=True)
        console.print(f"  rows:   {', '.join(entry.rows)}\n  recipe: {entry.recipe}",
                      highlight=False, soft_wrap=True)


@adapters_app.command("new")
def adapters_new(name: str = typer.Argument(..., help="harness name, e.g. my-agent"),
                 npm: Optional[str] = typer.Option(None, help="npm package the image installs"),
                 pip: Optional[str] = typer.Option(None, help="PyPI package (default: NAME)"),
                 version: Optional[str] = typer.Option(None, help="pinned version (default: latest)"),
                 root: Optional[Path] = typer.Option(None, hidden=True)) -> None:
    """Scaffold a harness adapter (module, recipe, driver, conformance test, docs) and register it."""
    from harness_adapters.scaffold import REPO_ROOT, new_adapter
    base = root or REPO_ROOT
    written = new_adapter(name, base, npm=npm, pip=pip, version=version)
    for path in written:
        console.print(f"wrote {path.relative_to(base)}", highlight=False)
    console.print(f"registered {name} in harness_adapters/learners.yaml; next: "
                  f"docs/adding-a-harness.md, then `carc adapters check {name}`",
                  highlight=False, soft_wrap=True)


@adapters_app.command("check")
def adapters_check(name: str,
                   keep: Optional[Path] = typer.Option(None, help="keep the run's records in this folder"),
                   tasks: int = typer.Option(2, min=1), visits: int = typer.Option(2, min=2)) -> None:
    """Run NAME through a short stream on the scripted model and check it (exit 1 on a failure)."""
    import tempfile

    from harness_adapters.registry import harnesses
    from orchestrator.run.conformance import print_report, run_conformance
    if name not in harnesses():
        _fail(f"no harness {name!r} registered; known: {', '.join(harnesses())} "
              f"(scaffold one with `carc adapters new {name}`)")
    with tempfile.TemporaryDirectory(prefix="carc-conformance-") as scratch:
        workdir = keep or Path(scratch)
        with console.status(f"running {name} on the scripted model (builds its image on first use) ..."):
            report = run_conformance(name, workdir, tasks=tasks, visits=visits)
        print_report(report, console)
    console.print(f"records: {report.run_dir}" if keep else "(records removed; keep them with --keep DIR)",
                  highlight=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(1)


@app.command("doctor")
def doctor(endpoint: Optional[str] = typer.Option(None, help="a model base URL to check "
                                                            "(default: the embedded model)")) -> None:
    """Check the Docker engine, images, proxy and model endpoint; say how to fix what is missing."""
    from rich.table import Table

    from orchestrator.doctor import run_checks
    table = Table("check", "", "detail", "fix")
    checks = run_checks(endpoint)
    for check in checks:
        table.add_row(check.name, "[green]ok[/green]" if check.ok else "[red]missing[/red]",
                      check.detail, check.fix)
    console.print(table)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


@node_app.command("join")
def node_join(address: str = typer.Argument(..., help="the Ray cluster's address, HOST:PORT of its head"),
              cells: Optional[int] = typer.Option(None, help="how many cells this node hosts (its `docker` "
                                                  "resource); default: one per core, at most one per 2 GiB"),
              cpus: Optional[int] = typer.Option(None, help="CPUs this node offers Ray (default: all)"),
              memory: Optional[int] = typer.Option(None, help="bytes of memory it offers (default: Ray's count)"),
              node_ip: Optional[str] = typer.Option(None, help="the address other nodes reach this one on"),
              block: bool = typer.Option(False, help="stay in the foreground until the node leaves"),
              dry_run: bool = typer.Option(False, help="check and print the `ray start` command only")) -> None:
    """Check this machine (`carc doctor`: engine, host address, images; CA and the rest as warnings)
    and join it to the Ray cluster at ADDRESS with `docker: N` cell slots; then remove what cell
    attempts of lost nodes left on this engine (a node that was lost mid-run and comes back)."""
    import subprocess
    import sys
    import time

    from rich.table import Table

    try:
        from orchestrator.run.ray_executor import (default_slots, join_command, node_checks, node_running,
                                                   prune_after_join)
        import ray  # noqa: F401
    except ImportError as exc:
        _fail(f"carc node join needs Ray ({exc}): pip install 'carc\\[ray]'")
    required, warnings = node_checks()
    table = Table("check", "", "detail", "fix")
    for check in required + warnings:
        state = "[green]ok[/green]" if check.ok else ("[red]missing[/red]" if check in required
                                                     else "[yellow]warning[/yellow]")
        table.add_row(check.name, state, check.detail, check.fix)
    console.print(table)
    if not all(c.ok for c in required):
        _fail("this machine cannot host cells yet: fix the missing checks above, then join again")
    if cells is not None and cells < 1:
        _fail(f"--cells {cells}: give at least 1")
    slots = cells or default_slots(cpus)
    command = join_command(address, slots, cpus, memory, node_ip)
    console.print(f"joining {address} with docker: {slots}: {' '.join(command)}", highlight=False,
                  soft_wrap=True)
    if dry_run:
        return
    code = subprocess.call(command)
    if code:
        _fail(f"`ray start` exited with {code}; its messages are above")
    pruned = prune_after_join(address)
    left = pruned.containers + pruned.networks + pruned.volumes
    console.print(f"joined; removed {len(left)} Docker objects that attempts of lost nodes left here"
                  + (f" ({', '.join(left)})" if left else ""), highlight=False, soft_wrap=True)
    if not block:
        console.print("leave the cluster with `ray stop`", highlight=False)
        return
    console.print("in the foreground until the node leaves (Ctrl-C: `ray stop`)", highlight=False)
    try:
        while node_running():
            time.sleep(5)
    except KeyboardInterrupt:
        subprocess.call([sys.executable, "-m", "ray.scripts.scripts", "stop"])


@app.command("inspect")
def inspect_stores(run: Path = typer.Argument(..., help="run directory"),
                   cell: Optional[str] = typer.Option(None, help="only this cell"),
                   out: Optional[Path] = typer.Option(None, help="where the tables and inspect.md go "
                                                                 "(default: RUN/inspect)")) -> None:
    """What each harness kept, when, by which mechanism, and whether it came back."""
    from stores_inspector import inspect_run

    result = inspect_run(run, cell)
    folder = result.write(out)
    for summary in result.summaries:
        console.print(f"{summary['cell']}: {summary['entries written']} entries written, "
                      f"{summary['could not read']} unreadable", highlight=False)
    for note in result.notes:
        console.print(note, highlight=False)
    console.print(f"written: {folder / 'inspect.md'} and {len(result.tables)} tables", highlight=False)


if __name__ == "__main__":
    app()
