"""`carc grid plan`: the bill of a grid before anything is spent.

The pilot test is end to end and real: a small ladder grid runs on the embedded solver model
through the journaling proxy (program checks in host processes, `sandbox.engine: process`), then
the same grid is planned from that run and its estimate is held against the run's own journal.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.records import RunPaths, read_events
from orchestrator.run.grid_config import load_grid
from orchestrator.run.plan import PRIORS, PlanError, load_priors, plan_grid, read_pilot, wall_at
from proxy.journal import read_journal

PILOT_GRID = """\
name: pilot
seed: 1
track: {name: own, tasks: 2, visits: 2, epilogue: 1, fresh_reference: true}
orders: [workstreams]
model: {endpoint: embedded, name: carc-solver}
efforts: [low]
learners: [stateless-floor, demo-cache-floor, program-library]
sandbox: {engine: process}
workers: 2
"""


def test_the_paper_grid_plan_is_a_bill_per_cell_from_the_stated_priors():
    grid = load_grid("examples/paper-arc1.yaml")
    plan = plan_grid(grid, images=False)
    assert len(plan.cells) == 81
    # 25 tasks x 8 visits, the 25-task epilogue and its fresh reference, in every cell
    assert {(c.instances, c.stream, c.epilogue, c.fresh) for c in plan.cells} == {(250, 200, 25, 25)}
    assert plan.instances == 81 * 250
    assert all(c.source.startswith("prior") for c in plan.cells)
    assert plan.input_tokens == pytest.approx(sum(c.input_tokens for c in plan.cells))
    assert plan.input_tokens > 0
    assert plan.calls > 0 and plan.snapshot_bytes > 0
    # four workers: the wall time is at least a quarter of the cell time and at most all of it
    assert plan.cell_seconds / 4 <= plan.wall_seconds <= plan.cell_seconds
    # harness cells keep bigger snapshots than the stateless floor's
    snap = {(c.learner, c.row): c.snapshot_bytes for c in plan.cells if c.effort == "low" and c.order == "random"}
    assert snap[("hermes-agent", "memory-on")] > snap[("stateless-floor", "memory-on")]
    # the model has no price in the table and the grid sets none: dollars unknown, and said why
    assert plan.usd is None
    assert any("no price for model 'gpt-6-luna'" in note for note in plan.notes)
    assert any("rough" in note and "--pilot" in note for note in plan.notes)


def test_the_grids_own_prices_give_dollars_marked_as_an_estimate(tmp_path):
    text = Path("examples/paper-arc1.yaml").read_text()
    text = text.replace("# input_usd_per_mtok: 2.0", "input_usd_per_mtok: 2").replace(
        "# output_usd_per_mtok: 8.0", "output_usd_per_mtok: 8")
    assert "input_usd_per_mtok: 2\n" in text
    path = tmp_path / "priced.yaml"
    path.write_text(text)
    plan = plan_grid(load_grid(path), images=False)
    assert plan.usd == pytest.approx((plan.input_tokens * 2 + plan.output_tokens * 8) / 1e6)
    assert plan.usd_is_estimate and "model.*_usd_per_mtok" in plan.price_source


def test_carc_grid_plan_prints_the_table_and_the_total_and_json_for_machines():
    result = CliRunner().invoke(app, ["grid", "plan", "examples/paper-arc1.yaml"])
    assert result.exit_code == 0, result.output
    assert "total: 20,250 instances" in result.output and "images:" in result.output
    data = json.loads(CliRunner().invoke(app, ["grid", "plan", "examples/paper-arc1.yaml",
                                               "--format", "json"]).output)
    assert data["instances"] == 20250 and len(data["cells"]) == 81 and data["usd_is_estimate"]


def test_an_unreachable_docker_is_said_never_raised(monkeypatch):
    import sandboxes.images as images

    def no_engine():
        raise images.ImageBuildError("no Docker engine answers (connection refused)")
    monkeypatch.setattr(images, "docker_client", no_engine)
    plan = plan_grid(load_grid("examples/paper-arc1.yaml"))
    assert [i.name for i in plan.images] == ["base", "proxy", "hermes-agent", "openclaw", "prime-agent"]
    assert {i.status for i in plan.images} == {"unknown"}
    assert all("Docker not reachable" in i.note for i in plan.images)


def test_planning_an_image_fetches_nothing_and_says_what_is_missing(tmp_path):
    from sandboxes.images import NotPrepared, Recipe, no_fetching, run

    with no_fetching(), pytest.raises(NotPrepared, match="npm install x"):
        run(["npm", "install", "x"], what="npm install x")
    recipe = Recipe("t", tmp_path, None, inputs={"x": lambda: Path(run(["false"], what="fetching x"))})
    (tmp_path / "Dockerfile").write_text("FROM $FROM\n")
    from sandboxes.images import planned_image

    class Engine:  # the machine base is present; nothing else is asked of the engine
        class images:
            @staticmethod
            def get(tag):
                return object()
    planned = planned_image(recipe, "auto", Engine())
    assert planned.tag is None and not planned.present and "fetching x" in planned.note


def test_a_learner_with_no_prior_names_the_file_and_the_way_out(tmp_path):
    priors = tmp_path / "priors.yaml"
    priors.write_text("learners:\n  stateless-floor:\n    per_instance: {calls: 1, input_tokens: 1, "
                      "output_tokens: 1, seconds: 1, snapshot_bytes: 1}\n")
    with pytest.raises(PlanError, match="no prior for learner 'demo-cache-floor'.*--pilot"):
        plan_grid(load_grid("examples/offline-demo.yaml"), priors_path=priors, images=False)


def test_the_shipped_priors_cover_every_ladder_learner_and_say_where_they_came_from():
    priors = load_priors()
    assert {"stateless-floor", "demo-cache-floor", "program-library", "default-harness"} <= set(priors.learners)
    assert all(entry.source for entry in priors.learners.values())
    assert "--pilot" in PRIORS.read_text()


def test_a_harness_collective_row_is_billed_its_curators_conversations_too(tmp_path):
    """One curator conversation per task met in each round but the last, at the curator prior;
    a harness with no curator prior of its own takes default-harness's; other rows have none."""
    from orchestrator.run.collective.schedule import user_schedule

    path = tmp_path / "collective.yaml"
    path.write_text(textwrap.dedent("""\
        name: collective-plan
        seed: 2
        track: {name: own, tasks: 6, visits: 2, epilogue: 2}
        collective: {users: 3, round_slots: 4}
        efforts: [low]
        learners:
          - {learner: hermes-agent, row: collective}
          - {learner: openclaw, row: collective}
          - hermes-agent
          - {learner: demo-cache-floor, row: collective}
        """))
    grid = load_grid(path)
    plan = plan_grid(grid, images=False)
    cells = {c.learner + "/" + c.row: (c, cell) for c, cell in zip(plan.cells, grid.cells())}
    c, cell = cells["hermes-agent/collective"]
    met: dict[int, set] = {}
    for user in range(3):
        for placed in user_schedule(grid, cell, user):
            met.setdefault(placed.round, set()).add(placed.slot.task_id)
    assert sorted(met) == list(range(5))  # 12 stream slots in rounds of 4, then the epilogue's two
    assert c.curated_tasks == sum(len(met[r]) for r in range(4)) > 0
    priors = load_priors()
    instance, curator = priors.learners["hermes-agent"].rows.get("collective") or priors.learners["hermes-agent"], \
        priors.learners["hermes-agent"].curator
    assert c.calls == pytest.approx(instance.rate("low").calls * c.instances + curator.rate("low").calls * c.curated_tasks)
    assert c.curator_source == "curator prior"
    assert cells["openclaw/collective"][0].curator_source == "curator prior (default-harness)"
    assert cells["hermes-agent/memory-on"][0].curated_tasks == 0
    assert cells["demo-cache-floor/collective"][0].curated_tasks == 0
    assert any(f"{c.cell}: its curator's {c.curated_tasks} conversations" in n for n in plan.notes)


def test_wall_time_packs_the_longest_cells_first():
    assert wall_at([10, 10, 10, 10], 2) == 20
    assert wall_at([30, 10, 10, 10], 2) == 30
    assert wall_at([5], 4) == 5


@pytest.fixture(scope="module")
def pilot_run(tmp_path_factory) -> tuple[Path, Path]:
    from orchestrator.run.local_pool import execute

    root = tmp_path_factory.mktemp("pilot")
    grid = root / "pilot.yaml"
    grid.write_text(textwrap.dedent(PILOT_GRID))
    run = root / "runs" / "pilot"
    RunPaths(run).cells.mkdir(parents=True)
    RunPaths(run).grid.write_text(grid.read_text())
    execute(run, show_progress=False)
    return grid, run


@pytest.mark.slow
def test_a_plan_from_its_own_pilot_estimates_that_runs_tokens_within_ten_percent(pilot_run):
    grid, run = pilot_run
    journal = [e for cell in RunPaths(run).cell_folders() for e in read_journal(cell.journal / "journal.jsonl")]
    actual = sum((e.prompt_tokens or 0) + (e.completion_tokens or 0) for e in journal)
    finished = sum(1 for cell in RunPaths(run).cell_folders() for e in read_events(cell.events)
                   if e.type == "instance_end")
    plan = plan_grid(load_grid(grid), pilot_dir=run, images=False)
    estimate = plan.input_tokens + plan.output_tokens
    assert actual > 0 and plan.instances == finished
    assert all(c.source == "pilot" for c in plan.cells)
    error = abs(estimate - actual) / actual
    print(f"pilot: {actual} tokens journaled, {estimate:.0f} estimated, error {error:.2%}")
    assert error <= 0.10
    assert plan.calls == pytest.approx(len(journal), rel=0.10)


@pytest.mark.slow
def test_a_pilot_at_one_effort_stands_in_for_another_and_says_so(pilot_run, tmp_path):
    grid, run = pilot_run
    wider = tmp_path / "wider.yaml"
    wider.write_text(grid.read_text().replace("efforts: [low]", "efforts: [low, high]").replace(
        "[stateless-floor, demo-cache-floor, program-library]",
        "[stateless-floor, demo-cache-floor, program-library, {learner: program-library, row: wiped}]"))
    plan = plan_grid(load_grid(wider), pilot_dir=run, images=False)
    sources = {(c.learner, c.row, c.effort): c.source for c in plan.cells}
    assert sources[("stateless-floor", "memory-on", "low")] == "pilot"
    assert sources[("stateless-floor", "memory-on", "high")] == "pilot at effort low"
    assert sources[("program-library", "wiped", "low")] == "prior"
    assert read_pilot(run)[("stateless-floor", "memory-on", "low")].instances == plan.cells[0].instances


def test_a_folder_that_is_no_run_is_refused_with_what_to_give(tmp_path):
    result = CliRunner().invoke(app, ["grid", "plan", "examples/offline-demo.yaml", "--pilot", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in result.output


def test_a_stopped_pilots_unfinished_instance_and_its_calls_are_not_counted(tmp_path):
    from orchestrator.records import Event
    from proxy.journal import JournalEntry
    from tests.run_dirs import new_cell_folder

    cell, folder = new_cell_folder(tmp_path, "stateless-floor")
    base = dict(cell=cell, phase="stream", task="t", visit=0, exposure=0)
    events = [Event(type="instance_start", slot=0, t=100.0, **base),
              Event(type="instance_end", slot=0, t=104.0, status="solved", **base),
              Event(type="instance_start", slot=1, t=105.0, **base)]  # stopped mid-instance
    (folder / "events.jsonl").write_text("".join(e.line() + "\n" for e in events))

    def call(slot, n):
        return JournalEntry(id=f"c{n}", cell=cell, slot=slot, phase="before", mode="reverse", method="POST",
                            url="http://x/v1/chat/completions", host="x", api="openai-chat", model="m",
                            stream=False, status=200, refused=False, request=None, response=None,
                            t_start=0.0, t_first_byte=None, t_end=0.0, latency_s=0.0,
                            prompt_tokens=100, completion_tokens=10).to_json()
    (folder / "journal").mkdir()
    (folder / "journal" / "journal.jsonl").write_text(
        "\n".join([call(0, 1), call(0, 2), call(None, 3), call(1, 4)]) + "\n")
    measured = read_pilot(tmp_path)[("stateless-floor", "memory-on", "medium")]
    assert (measured.instances, measured.calls, measured.input_tokens, measured.output_tokens) == (1, 3, 300, 30)
    assert measured.seconds == 4.0


# --- the workers suggestion -------------------------------------------------------------------------

from orchestrator.run.plan import SCALE_PRIORS, CellCost, ScalePriors, load_scale_priors, suggest_workers  # noqa: E402

COSTS = ScalePriors(source="a test's figures", kinds={
    "ladder": CellCost(cpu_s_per_instance=1, wait_s_per_instance=20, rss_mb=200),
    "default-harness": CellCost(cpu_s_per_instance=6, wait_s_per_instance=30, rss_mb=600)})


def scaled_grid(tmp_path: Path, learners: str, seeds: int, model: str = "{timing: hosted}") -> object:
    path = tmp_path / "g.yaml"
    path.write_text(f"name: s\nseeds: {list(range(seeds))}\nmodel: {model}\nlearners: {learners}\n")
    return load_grid(path)


def test_a_timed_grid_gets_the_cells_the_cpu_holds_at_the_measured_cost(tmp_path):
    ladder = suggest_workers(scaled_grid(tmp_path, "[stateless-floor]", 40), 2, 24 << 30, COSTS)
    assert ladder.workers == 32  # 0.8 x 2 cores / 0.05 per cell
    assert ladder.basis.startswith("CPU bounds it") and "a test's figures" in ladder.basis
    harness = suggest_workers(scaled_grid(tmp_path, "[hermes-agent]", 40), 2, 24 << 30, COSTS)
    assert harness.workers == 8  # 1.6 / 0.2
    mixed = suggest_workers(scaled_grid(tmp_path, "[stateless-floor, openclaw]", 20), 2, 24 << 30, COSTS)
    assert mixed.workers == 12  # 1.6 / the mean 0.125


def test_memory_or_the_grids_cells_can_bound_the_suggestion_instead(tmp_path):
    small = suggest_workers(scaled_grid(tmp_path, "[hermes-agent]", 40), 16, 2 << 30, COSTS)
    assert small.workers == 2 and small.basis.startswith("memory bounds it")  # 0.8 x 2048 MiB / 600
    few = suggest_workers(scaled_grid(tmp_path, "[stateless-floor]", 3), 2, 24 << 30, COSTS)
    assert few.workers == 3 and few.basis.startswith("the grid's cells")
    endpoint = scaled_grid(tmp_path, "[stateless-floor]", 40, '{endpoint: "http://127.0.0.1:9/v1"}')
    assert suggest_workers(endpoint, 2, 24 << 30, COSTS).workers == 32  # a provider waits like the timed model


def test_the_untimed_embedded_model_gets_one_cell_per_core(tmp_path):
    grid = scaled_grid(tmp_path, "[stateless-floor]", 8, "{endpoint: embedded}")
    suggestion = suggest_workers(grid, 2, 24 << 30, COSTS)
    assert suggestion.workers == 2 and "CPU-bound" in suggestion.basis


def test_the_shipped_scale_priors_cost_every_learner_and_say_where_they_came_from():
    priors = load_scale_priors(SCALE_PRIORS)
    assert "bench/scale.py" in priors.source
    from orchestrator.run.grid_config import LEARNER_ROWS
    for learner in LEARNER_ROWS:
        name, cost = priors.cost(learner)
        assert cost.cpu_cores > 0 and cost.rss_mb > 0


def test_the_plan_prints_the_suggestion_for_this_machine(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("name: s\nseeds: [0, 1, 2]\nmodel: {timing: hosted}\nlearners: [stateless-floor]\n")
    out = CliRunner().invoke(app, ["grid", "plan", str(path)])
    assert out.exit_code == 0, out.output
    assert "workers: the grid says 2; this machine holds" in out.output
