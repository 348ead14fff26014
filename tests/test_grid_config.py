"""Grid files: validation errors name file, line and field; cells expand as the grid says."""

import textwrap

import pytest

from orchestrator.run.grid_config import GridFileError, load_grid

GOOD = """\
name: t
track: {name: own, tasks: 3, epilogue: 2}
efforts: [low, medium]
orders: [workstreams, random]
learners:
  - stateless-floor
  - {learner: program-library, row: wiped}
"""


def write(tmp_path, text):
    path = tmp_path / "grid.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_cells_are_learner_by_row_by_effort_by_order(tmp_path):
    cells = load_grid(write(tmp_path, GOOD)).cells()
    assert len(cells) == 2 * 2 * 2
    ids = {c.cell for c in cells}
    assert "program-library-wiped.medium.random.s0" in ids
    assert "stateless-floor.low.workstreams.s0" in ids


def test_unknown_learner_error_names_file_line_and_field(tmp_path):
    path = write(tmp_path, GOOD.replace("  - stateless-floor", "  - stateles-floor"))
    with pytest.raises(GridFileError) as err:
        load_grid(path)
    message = str(err.value)
    assert f"{path}:6: learners[0]" in message and "unknown learner 'stateles-floor'" in message


def test_bad_order_error_names_the_line_of_the_list_item(tmp_path):
    path = write(tmp_path, GOOD.replace("[workstreams, random]", "\n  - workstreams\n  - blocked"))
    with pytest.raises(GridFileError) as err:
        load_grid(path)
    assert f"{path}:6: orders[1]" in str(err.value)


def test_unknown_key_is_refused_with_its_name(tmp_path):
    path = write(tmp_path, GOOD + "effort: high\n")
    with pytest.raises(GridFileError) as err:
        load_grid(path)
    assert f"{path}:8: effort: Extra inputs are not permitted" in str(err.value)


def test_rearc_source_without_a_path_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("CARC_REARC_PATH", raising=False)
    path = write(tmp_path, GOOD.replace("{name: own, tasks: 3, epilogue: 2}", "{name: arc1, source: rearc}"))
    with pytest.raises(GridFileError) as err:
        load_grid(path)
    assert "rearc_path" in str(err.value) and "CARC_REARC_PATH" in str(err.value) and ":2: track" in str(err.value)


def test_carc_rearc_path_serves_a_grid_that_asks_for_rearc_and_never_turns_frames_into_rearc(tmp_path, monkeypatch):
    monkeypatch.setenv("CARC_REARC_PATH", str(tmp_path / "re-arc"))
    asks = write(tmp_path, GOOD.replace("{name: own, tasks: 3, epilogue: 2}", "{name: arc1, source: rearc}"))
    assert load_grid(asks).track.rearc_path == (tmp_path / "re-arc").resolve()
    plain = write(tmp_path, GOOD.replace("{name: own, tasks: 3, epilogue: 2}", "{name: arc1}"))
    assert load_grid(plain).track.source == "frames" and load_grid(plain).track.rearc_path is None
    named = write(tmp_path, GOOD.replace("{name: own, tasks: 3, epilogue: 2}",
                                         "{name: arc1, source: rearc, rearc_path: mine}"))
    assert load_grid(named).track.rearc_path == (tmp_path / "mine").resolve()


def test_a_row_the_learner_does_not_have_is_refused(tmp_path):
    path = write(tmp_path, GOOD.replace("row: wiped", "row: asked-to-store"))
    with pytest.raises(GridFileError) as err:
        load_grid(path)
    assert "has no row 'asked-to-store'" in str(err.value)


def test_missing_file_and_bad_yaml_are_reported_with_the_path(tmp_path):
    with pytest.raises(GridFileError, match="cannot read grid file"):
        load_grid(tmp_path / "nope.yaml")
    with pytest.raises(GridFileError, match="not valid YAML"):
        load_grid(write(tmp_path, "name: [unclosed\n"))


def test_shipped_example_grids_validate():
    for name in ("offline-demo", "offline-demo-harnesses", "offline-demo-prime-agent", "paper-arc1",
                 "paper-arc1-ablations", "paper-arc2"):
        grid = load_grid(f"examples/{name}.yaml")
        assert grid.cells()


# The seed's grids: its systems at its efforts and orders, and its "runs complete" count
# (ARC-AGI-1 108, the ablations 90, ARC-AGI-2 56); carc's count where it differs, and the header
# of the file says why.
LADDER = {("stateless-floor", "memory-on"), ("demo-cache-floor", "memory-on"), ("program-library", "memory-on")}
HARNESS_NAMES = ("prime-agent", "hermes-agent", "openclaw")
PAPER_GRIDS = {
    "paper-arc1": (LADDER | {(h, r) for h in HARNESS_NAMES for r in ("memory-on", "memory-off")},
                   {"low", "medium", "high"}, {"workstreams", "sequential", "random"}, 108, 81),
    "paper-arc1-ablations": ({(h, r) for h in HARNESS_NAMES
                              for r in ("asked-to-store", "program-procedure", "program-procedure-wiped")}
                             | {("program-library", "wiped")},
                             {"low", "medium", "high"}, {"workstreams", "sequential", "random"}, 90, 90),
    "paper-arc2": (LADDER | {("prime-agent", "memory-on"), ("prime-agent", "memory-off")},
                   {"medium", "high", "xhigh", "max"}, {"workstreams", "sequential"}, 56, 40),
}


@pytest.mark.parametrize("name", sorted(PAPER_GRIDS))
def test_each_paper_grid_holds_the_seeds_systems_efforts_and_orders_and_says_why_its_count_differs(name):
    from pathlib import Path

    systems, efforts, orders, seed_count, carc_count = PAPER_GRIDS[name]
    path = Path(f"examples/{name}.yaml")
    cells = load_grid(path).cells()
    assert {(c.learner, c.row) for c in cells} == systems
    assert {c.effort for c in cells} == efforts and {c.order for c in cells} == orders
    assert len(cells) == carc_count == len(systems) * len(efforts) * len(orders)
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    assert f"= {carc_count}" in header
    if carc_count != seed_count:
        assert f"{seed_count} of {seed_count}" in header and "runs complete" in header
        assert f"{seed_count} - {carc_count} = {seed_count - carc_count}" in header


def test_carc_grid_cells_and_check_on_the_paper_grids_give_their_counts():
    from typer.testing import CliRunner

    from orchestrator.cli import app
    for name, (*_, carc_count) in PAPER_GRIDS.items():
        listed = CliRunner().invoke(app, ["grid", "cells", f"examples/{name}.yaml"])
        assert listed.exit_code == 0, listed.output
        assert len(listed.output.split()) == carc_count
        checked = CliRunner().invoke(app, ["grid", "check", f"examples/{name}.yaml"])
        assert checked.exit_code == 0 and f"{carc_count} cells" in checked.output, checked.output


def test_the_demo_harness_grids_hold_every_single_user_row_of_every_harness():
    from orchestrator.rows import HARNESS_ROWS, ROWS
    single_user = [r for r in HARNESS_ROWS if not ROWS[r].shared]
    for name, harnesses in (("offline-demo-harnesses", {"hermes-agent", "openclaw"}),
                            ("offline-demo-prime-agent", {"prime-agent"})):
        rows = {(c.learner, c.row) for c in load_grid(f"examples/{name}.yaml").cells()}
        assert rows >= {(h, r) for h in harnesses for r in single_user}, name


def test_an_effort_that_is_not_one_is_refused_with_its_line(tmp_path):
    path = write(tmp_path, GOOD.replace("efforts: [low, medium]", "efforts: [low, bogus]"))
    with pytest.raises(GridFileError, match=rf"{path}:3: efforts\[1\]: Input should be 'minimal', 'low'"):
        load_grid(path)


def test_an_effort_the_embedded_model_lacks_is_refused_before_anything_runs(tmp_path):
    path = write(tmp_path, GOOD.replace("efforts: [low, medium]", "efforts: [low, max]"))
    with pytest.raises(GridFileError, match=rf"{path}:3: efforts\[1\]: the embedded model has efforts "
                                            r"low, medium, high, not 'max'"):
        load_grid(path)
    endpoint = GOOD.replace("efforts: [low, medium]", "efforts: [max]\nmodel: {endpoint: 'http://h/v1'}")
    assert load_grid(write(tmp_path, endpoint)).efforts == ["max"]


def test_a_misspelled_harness_option_is_refused_at_check_with_its_line(tmp_path):
    grid = GOOD + "  - openclaw\nharness_options:\n  openclaw:\n    dreaming_frequncy: '0 * * * *'\n" \
                  "    workshop_mode: sometimes\n"
    path = write(tmp_path, grid)
    with pytest.raises(GridFileError) as err:
        load_grid(path)
    lines = str(err.value).splitlines()
    assert lines[0].startswith(f"{path}:11: harness_options.openclaw.dreaming_frequncy: openclaw has no "
                               "option 'dreaming_frequncy'; options: dreaming_frequency, workshop_mode")
    assert lines[1].startswith(f"{path}:12: harness_options.openclaw.workshop_mode: Input should be 'auto'")


def test_declared_harness_options_are_accepted_and_reach_the_adapter_with_defaults(tmp_path):
    from harness_adapters.registry import adapter
    grid = GOOD + "  - openclaw\nharness_options:\n  openclaw: {dreaming_frequency: '*/5 * * * *'}\n"
    options = load_grid(write(tmp_path, grid)).harness_options["openclaw"]
    settings = adapter("openclaw").settings(options)
    assert settings["dreaming_frequency"] == "*/5 * * * *" and settings["workshop_mode"] == "auto"


@pytest.mark.parametrize("endpoint", ["localhost:8000/v1", "ftp://host/v1", "http:///v1"])
def test_a_model_endpoint_that_is_not_a_base_url_is_refused_at_load(tmp_path, endpoint):
    path = write(tmp_path, GOOD + f"model: {{endpoint: '{endpoint}'}}\n")
    with pytest.raises(GridFileError, match=r"model.endpoint: .* is not a base URL"):
        load_grid(path)


def test_an_upper_case_scheme_is_read_as_the_url_it_is(tmp_path):
    grid = load_grid(write(tmp_path, GOOD + "model: {endpoint: 'HTTP://127.0.0.1:8000/v1'}\n"))
    assert grid.model.endpoint == "http://127.0.0.1:8000/v1"


def test_cells_start_longest_first_and_the_order_keeps_every_cell_once(tmp_path):
    from orchestrator.run.local_pool import run_order

    cells = load_grid(write(tmp_path, """\
        name: t
        track: {name: own, tasks: 3}
        efforts: [low, medium]
        learners:
          - stateless-floor
          - program-library
          - hermes-agent
          - {learner: hermes-agent, row: memory-off}
          - {learner: openclaw, row: program-procedure-wiped}
        """)).cells()
    ordered = [c.cell for c in run_order(cells)]
    assert sorted(ordered) == sorted(c.cell for c in cells)
    assert ordered[:4] == ["hermes-agent-memory-off.medium.workstreams.s0",
                           "openclaw-program-procedure-wiped.medium.workstreams.s0",
                           "hermes-agent-memory-off.low.workstreams.s0",
                           "openclaw-program-procedure-wiped.low.workstreams.s0"]
    assert ordered[4:6] == ["hermes-agent.medium.workstreams.s0", "hermes-agent.low.workstreams.s0"]
    assert ordered[6:] == ["program-library.medium.workstreams.s0", "program-library.low.workstreams.s0",
                           "stateless-floor.medium.workstreams.s0", "stateless-floor.low.workstreams.s0"]


# --- sandbox.engine process and the API key --------------------------------------------------

HOST_PROGRAMS = """\
name: hostkey
track: {name: own, tasks: 2, visits: 2, epilogue: 0, fresh_reference: false}
efforts: [low]
model: {endpoint: "http://127.0.0.1:9/v1", name: gpt-x, api_key_env: CARC_TEST_HOST_KEY}
learners: [stateless-floor, program-library]
sandbox: {engine: process}
workers: 1
"""
SECRET = {"CARC_TEST_HOST_KEY": "sk-real-host"}


def test_host_programs_of_a_non_root_carc_are_refused_when_the_grid_has_a_key(tmp_path):
    """Programs run on the host share a non-root carc's uid and can read its API key from
    /proc/<carc's pid>/environ: the grid is refused, naming the docker engine and root."""
    from orchestrator.run.cell_services import host_programs_refusal

    grid = load_grid(write(tmp_path, HOST_PROGRAMS))
    reason = host_programs_refusal(grid, uid=1000, environ=SECRET)
    assert reason is not None
    assert "program-library" in reason and "$CARC_TEST_HOST_KEY" in reason and "/proc/" in reason
    assert "sandbox.engine: docker" in reason and "run carc as root" in reason


@pytest.mark.parametrize("change, uid, environ", [
    ({}, 0, SECRET),                                            # root: programs run as nobody
    ({"sandbox: {engine: process}": "sandbox: {engine: docker}"}, 1000, SECRET),
    ({'endpoint: "http://127.0.0.1:9/v1", ': ""}, 1000, SECRET),  # the embedded model: no key
    ({}, 1000, {}),                                             # the key variable is not set
    ({"api_key_env: CARC_TEST_HOST_KEY": 'api_key_env: ""'}, 1000, SECRET),
    ({"stateless-floor, program-library": "stateless-floor"}, 1000, SECRET),  # no host programs
])
def test_host_programs_run_when_nothing_secret_is_within_their_reach(tmp_path, change, uid, environ):
    from orchestrator.run.cell_services import host_programs_refusal

    text = HOST_PROGRAMS
    for old, new in change.items():
        text = text.replace(old, new)
    assert host_programs_refusal(load_grid(write(tmp_path, text)), uid=uid, environ=environ) is None


def test_a_run_of_such_a_grid_stops_before_any_cell_starts(tmp_path, monkeypatch):
    """The refusal comes at run start (and again where a cell picks its program executor, for a
    Ray node running as another user), before a model server, a proxy or a cell folder."""
    import orchestrator.run.cell_services as cell_services
    from orchestrator.run.local_pool import execute
    from orchestrator.run.run_folder import open_run

    monkeypatch.setattr(cell_services, "carc_uid", lambda: 1000)  # the seam: carc as uid 1000
    monkeypatch.setenv("CARC_TEST_HOST_KEY", "sk-real-host")
    run = open_run(write(tmp_path, HOST_PROGRAMS), tmp_path / "runs", "hostkey")
    with pytest.raises(cell_services.HostProgramsRefused, match="use sandbox.engine: docker"):
        execute(run, show_progress=False)
    assert list((run / "cells").iterdir()) == []
    grid = load_grid(run / "grid.yaml")
    with pytest.raises(cell_services.HostProgramsRefused):  # a cell started some other way
        with cell_services.cell_services(grid, grid.cells()[0], run / "cells" / "c", "http://127.0.0.1:9/v1"):
            pass
