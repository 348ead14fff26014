"""How `carc` reports errors: a user error (orchestrator.errors.UserError) as one line with its fix
and exit code 2; anything else with its traceback, as the bug it is; `--debug` shows a user
error's traceback too. Through the real CLI (typer's runner), on a grid file with a wrong field."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.errors import CarcError, ConfigError, InfrastructureError, MachineError, UserError


@pytest.fixture
def bad_grid(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("name: g\nlearners: [stateless-floor]\nefforts: [extreme]\n")
    return path


def test_a_user_error_is_one_line_with_its_field_and_exit_code_2(bad_grid):
    result = CliRunner().invoke(app, ["grid", "check", str(bad_grid)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "efforts" in result.output
    assert "Traceback" not in result.output and result.exception.__class__.__name__ == "SystemExit"


def test_debug_shows_a_user_errors_traceback(bad_grid):
    result = CliRunner().invoke(app, ["--debug", "grid", "check", str(bad_grid)])
    assert isinstance(result.exception, ConfigError) and "efforts" in str(result.exception)


def test_a_bug_inside_a_command_keeps_its_traceback_instead_of_becoming_a_user_error(
        tmp_path, monkeypatch):
    """`carc grid run` used to catch every ValueError and RuntimeError and print it as one line,
    so a bug read as the user's mistake, without its traceback."""
    import orchestrator.run.run_folder as run_folder

    def broken(*args, **kwargs):
        raise ValueError("an internal bug: a value no user wrote")
    monkeypatch.setattr(run_folder, "open_run", broken)
    grid = tmp_path / "grid.yaml"
    grid.write_text("name: g\nlearners: [stateless-floor]\n")
    result = CliRunner().invoke(app, ["grid", "run", str(grid), "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 1 and isinstance(result.exception, ValueError)
    assert "error: an internal bug" not in result.output


def test_every_error_kind_has_one_root_and_keeps_its_builtin_base():
    from harness_adapters.chat_model import ModelUnavailable
    from harness_adapters.harness import HarnessError
    from orchestrator.run.grid_config import GridFileError
    from orchestrator.run.slot_driver import InfrastructureFault
    from proxy.host import ProxyError
    from sandboxes.environment import SandboxError
    from sandboxes.images import ImageBuildError

    assert issubclass(GridFileError, ConfigError) and issubclass(GridFileError, ValueError)
    assert issubclass(ImageBuildError, MachineError) and issubclass(ImageBuildError, RuntimeError)
    for infrastructure in (SandboxError, ProxyError, InfrastructureFault):
        assert issubclass(infrastructure, InfrastructureError)
        assert not issubclass(infrastructure, UserError)
    for kind in (ModelUnavailable, HarnessError):
        assert issubclass(kind, CarcError) and not issubclass(kind, UserError)
