"""ARC-AGI-1 through the real Re-ARC (michaelhodel/re-arc), from the checkout CARC_REARC_PATH names.

Live: the real generators and verifiers run in the plugin's worker process, and a tiny arc1 grid
runs end to end on the embedded solver model (`sandbox.engine: process`, no Docker). scripts/test.sh
points CARC_REARC_PATH at ../shared/vendor/re-arc; without a checkout these tests are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.arc import as_grid
from orchestrator.cli import app
from orchestrator.records import RunPaths, read_events
from orchestrator.run.local_pool import start_run
from orchestrator.tasks.base import MAX_DEMOS
from orchestrator.tasks.public import arc1_tasks
from orchestrator.tasks.rearc import PATH_ENV, REARC_REPO, ReArcSource

CHECKOUT = os.environ.get(PATH_ENV, "")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (CHECKOUT and Path(CHECKOUT, "generators.py").is_file()),
    reason=f"set {PATH_ENV} to a Re-ARC checkout (git clone {REARC_REPO}); scripts/test.sh sets it to "
           f"../shared/vendor/re-arc when that folder exists")]

TASKS = ("007bbfb7", "017c7c7b", "05f2a901")  # a 3x3 tiling, a recolour-and-extend, a move-until-touch
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rearc():
    with ReArcSource(CHECKOUT) as source:
        yield source


def test_the_checkout_generates_every_arc1_training_task(rearc):
    assert len(rearc.task_ids()) == 400 and set(rearc.task_ids()) == set(arc1_tasks("training"))


def test_real_generators_give_valid_changed_distinct_pairs_the_same_for_the_same_seed(rearc):
    for task in TASKS:
        instance = rearc.instance(task, 0, seed=7)
        pairs = [(instance.test_input, instance.test_output), *((d.input, d.output) for d in instance.demos)]
        assert len(instance.demos) == MAX_DEMOS
        for given, wanted in pairs:
            assert as_grid(given) == given and as_grid(wanted) == wanted  # rectangular, 1..30 a side, colours 0..9
            assert given != wanted
        assert len({given for given, _ in pairs}) == len(pairs)
        assert rearc.instance(task, 0, seed=7) == instance
        assert rearc.instance(task, 1, seed=7) != instance and rearc.instance(task, 0, seed=8) != instance


def test_the_example_grid_checks_through_the_checkout():
    result = CliRunner().invoke(app, ["grid", "check", str(ROOT / "examples" / "arc1-rearc.yaml")])
    assert result.exit_code == 0, result.output
    assert "4 cells, 48 instances each" in result.output


def test_a_tiny_arc1_grid_runs_end_to_end_through_the_real_generators(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"""\
name: rearc-tiny
track: {{name: arc1, source: rearc, task_ids: [{TASKS[0]}, {TASKS[1]}], visits: 2, epilogue: 0,
         fresh_reference: false}}
orders: [sequential]
efforts: [low]
learners: [stateless-floor]
sandbox: {{engine: process}}
workers: 1
""")
    run = RunPaths(start_run(grid, tmp_path / "runs", "r"))
    (cell,) = [p for p in run.cells.iterdir() if p.is_dir()]
    ends = [e for e in read_events(cell / "events.jsonl") if e.type == "instance_end"]
    assert sorted((e.task, e.visit) for e in ends) == sorted((t, v) for t in TASKS[:2] for v in (0, 1))
    assert all(e.status for e in ends) and not [e for e in ends if e.error]
