"""`carc adapters`: the scaffold a new harness starts from, the registry listing, the refusals.

Scaffolds are written into a temporary root holding a copy of the registry file, never into
this checkout. The generic driver is run for real (host Python); the Docker test builds the
images of two scaffolds for real (PyPI and npm `cowsay`, two tiny CLIs) and has their driver
answer a message inside a real sandbox.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from string import Template

import pytest
from typer.testing import CliRunner

from harness_adapters.harness import ConversationHarness
from harness_adapters.registry import REGISTRY, harnesses
from orchestrator.rows import HARNESS_ROWS
from harness_adapters.scaffold import ScaffoldError, new_adapter
from orchestrator.cli import app
from sandboxes.images import RECIPES
from tests.docker_fixtures import client, run_id  # noqa: F401

runner = CliRunner()


@pytest.fixture
def root(tmp_path) -> Path:
    """A repository root with only the registry file (a copy of the real one)."""
    (tmp_path / "harness_adapters").mkdir()
    shutil.copy(REGISTRY, tmp_path / "harness_adapters" / "learners.yaml")
    return tmp_path


@pytest.fixture
def load():
    """Import a scaffolded module from its file; forget its adapter and recipe afterwards."""
    names = []

    def load(path: Path, name: str):
        spec = importlib.util.spec_from_file_location(f"harness_adapters.{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        names.append(name)
        return module

    yield load


def relative(paths: list[Path], root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in paths}


def test_new_writes_module_recipe_driver_test_and_docs_and_registers_the_harness(root):
    written = new_adapter("my-agent", root, pip="my-agent", version="1.2.3")
    assert relative(written, root) == {
        "harness_adapters/my_agent.py", "harness_adapters/recipes/my-agent/Dockerfile",
        "harness_adapters/recipes/my-agent/driver.py", "tests/test_my_agent_conformance.py",
        "docs/harnesses/my-agent.md"}
    registry = harnesses(root / "harness_adapters" / "learners.yaml")
    assert registry["my-agent"].target == "harness_adapters.my_agent:MY_AGENT"
    assert registry["my-agent"].rows == HARNESS_ROWS
    assert set(harnesses()) <= set(registry)  # the earlier entries are kept


def test_the_generated_pip_module_imports_and_declares_its_adapter_and_recipe(root, load):
    new_adapter("my-agent", root, pip="my-agent", version="1.2.3")
    module = load(root / "harness_adapters" / "my_agent.py", "my-agent")
    adapter = module.MY_AGENT
    assert adapter.version == "1.2.3" and adapter.docs == "docs/harnesses/my-agent.md"
    assert issubclass(adapter.make_learner, ConversationHarness) and adapter.make_learner.name == "my-agent"
    assert "my-agent" not in RECIPES  # sandboxes keeps only its own recipes; nothing registers on import
    assert adapter.recipe.folder == root / "harness_adapters" / "recipes" / "my-agent"
    assert adapter.recipe.versions == {"MY_AGENT_VERSION": "1.2.3"}
    assert list(adapter.recipe.inputs) == ["wheelhouse"]
    assert module.FIRST_TURN == ("my-agent", "{message}")
    assert adapter.classify("ECONNREFUSED 10.0.0.1:8081").value == "crash"


def test_the_generated_npm_module_installs_the_scoped_package_from_the_host_npm(root, load):
    new_adapter("js-agent", root, npm="@acme/js-agent", version="0.4.0")
    module = load(root / "harness_adapters" / "js_agent.py", "js-agent")
    assert list(module.RECIPE.inputs) == ["package.tar"]
    assert module.FIRST_TURN == ("js-agent", "{message}")
    assert 'npm_tree("js-agent", f"@acme/js-agent@{JS_AGENT_VERSION}")' in \
        (root / "harness_adapters" / "js_agent.py").read_text()


@pytest.mark.parametrize("kind, package, install", [
    ("pip", "my-agent", "pip install --quiet --no-index --find-links /tmp/wheelhouse my-agent==1.2.3"),
    ("npm", "@acme/my-agent", "ADD package.tar /opt/my-agent/")])
def test_every_generated_file_is_well_formed(root, kind, package, install):
    written = new_adapter("my-agent", root, version="1.2.3", **{kind: package})
    for path in written:
        assert "@@" not in path.read_text(), path
    for path in (p for p in written if p.suffix == ".py"):
        ast.parse(path.read_text(), str(path))
    dockerfile = Template((root / "harness_adapters/recipes/my-agent/Dockerfile").read_text()).substitute(
        FROM="carc-base:0123", MY_AGENT_VERSION="1.2.3")  # what sandboxes.images.render does
    assert dockerfile.startswith("# my-agent") and "FROM carc-base:0123" in dockerfile
    assert install in dockerfile and "COPY driver.py /opt/carc/my_agent_driver.py" in dockerfile
    assert "ENV PATH=/opt/my-agent/" in dockerfile and ":$PATH" in dockerfile
    test = (root / "tests/test_my_agent_conformance.py").read_text()
    assert 'run_conformance("my-agent", tmp_path)' in test
    assert "pytest.mark.docker, pytest.mark.slow" in test
    assert (root / "docs/harnesses/my-agent.md").read_text().startswith("# my-agent 1.2.3")


FIRST = "import os, sys; print('first', sys.argv[1], os.environ['OPENAI_BASE_URL'])"
NEXT = "import sys; text = sys.stdin.read(); print('next', text); sys.exit(3 if 'fail' in text else 0)"


def run_driver(driver: Path, setup: dict, *messages: str) -> list[dict]:
    lines = [setup, *({"message": m} for m in messages)]
    proc = subprocess.run([sys.executable, str(driver)], input="".join(json.dumps(x) + "\n" for x in lines),
                          capture_output=True, text=True, timeout=60)
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_the_generic_driver_runs_one_command_per_message_and_reports_failures(root, tmp_path):
    """The scaffold's in-sandbox driver, run for real with the host's Python."""
    new_adapter("my-agent", root, pip="my-agent", version="1.2.3")
    setup = {"session": "carc-1", "model": "m", "base_url": "http://proxy:8081/v1",
             "first": [sys.executable, "-c", FIRST, "{message}"], "next": [sys.executable, "-c", NEXT],
             "cwd": str(tmp_path / "state" / "my-agent"), "log": str(tmp_path / "driver.log"), "timeout": 30}
    replies = run_driver(root / "harness_adapters/recipes/my-agent/driver.py", setup,
                         "hello", "on stdin", "fail now")
    assert replies[0] == {"ready": True} and replies[-1] == {"closed": True}
    assert replies[1]["final"] == "first hello http://proxy:8081/v1" and not replies[1]["failed"]
    assert replies[2]["final"] == "next on stdin" and not replies[2]["failed"]
    assert replies[3]["failed"] and replies[3]["error"].startswith("exit code 3")
    assert (tmp_path / "state" / "my-agent").is_dir()
    assert "--- turn 3 of carc-1" in (tmp_path / "driver.log").read_text()


def test_the_generic_driver_says_when_the_command_is_not_there(root, tmp_path):
    new_adapter("my-agent", root, pip="my-agent", version="1.2.3")
    setup = {"session": "s", "model": "m", "base_url": "u", "first": ["no-such-harness", "{message}"],
             "next": ["no-such-harness"], "cwd": str(tmp_path), "log": str(tmp_path / "log"), "timeout": 5}
    reply = run_driver(root / "harness_adapters/recipes/my-agent/driver.py", setup, "hi")[1]
    assert reply["failed"] and reply["error"].startswith("cannot run no-such-harness")


def test_new_refuses_a_registered_name_and_changes_nothing(root):
    registry = root / "harness_adapters" / "learners.yaml"
    before = registry.read_text()
    with pytest.raises(ScaffoldError, match="'hermes-agent' already exists in .*learners.yaml"):
        new_adapter("hermes-agent", root, version="1.0.0")
    assert registry.read_text() == before
    assert not (root / "harness_adapters" / "hermes_agent.py").exists()


def test_new_refuses_files_left_by_an_unregistered_harness(root):
    (root / "harness_adapters" / "my_agent.py").write_text("# someone's work\n")
    with pytest.raises(ScaffoldError, match="files exist: .*my_agent.py"):
        new_adapter("my-agent", root, version="1.0.0")
    assert "my-agent" not in harnesses(root / "harness_adapters" / "learners.yaml")


@pytest.mark.parametrize("name, options, message", [
    ("My_Agent", {}, "lowercase letters"),
    ("my-agent", {"npm": "a", "pip": "b"}, "not both"),
    ("my-agent", {"pip": "bad name; rm -rf /"}, "not a valid pip package"),
    ("my-agent", {"version": "1.0 && curl x"}, "expected something like 1.2.3")])
def test_new_refuses_bad_names_packages_and_versions(root, name, options, message):
    with pytest.raises(ScaffoldError, match=message):
        new_adapter(name, root, **({"version": "1.0.0"} | options))


def test_adapters_new_on_the_command_line_writes_the_scaffold(root):
    result = runner.invoke(app, ["adapters", "new", "my-agent", "--npm", "@acme/my-agent",
                                 "--version", "0.1.0", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "wrote harness_adapters/my_agent.py" in result.output
    assert "carc adapters check my-agent" in result.output


def test_adapters_new_on_the_command_line_refuses_a_duplicate_with_exit_2(root):
    result = runner.invoke(app, ["adapters", "new", "hermes-agent", "--version", "1.0.0",
                                 "--root", str(root)])
    assert result.exit_code == 2
    assert "error: harness 'hermes-agent' already exists" in result.output


def test_adapters_list_shows_every_registered_harness_and_whether_it_imports():
    result = runner.invoke(app, ["adapters", "list"])
    assert result.exit_code == 0, result.output
    heads = {line.split()[0]: line for line in result.output.splitlines() if not line.startswith(" ")}
    assert set(heads) == set(harnesses())
    assert heads["hermes-agent"].split()[1:] == ["harness_adapters.hermes_agent:HERMES", "imports"]
    for line in heads.values():  # a module still being written is a row, not a crash
        assert line.split()[2] == "imports" or "module not importable: " in line
    assert "recipe: harness_adapters/recipes/hermes-agent" in result.output


def test_adapters_list_shows_a_module_that_does_not_import_or_register(tmp_path):
    registry = tmp_path / "learners.yaml"
    registry.write_text("ghost-agent:\n  adapter: harness_adapters.ghost_agent:GHOST\n"
                        "quiet-agent:\n  adapter: json.decoder:JSONDecoder\n")
    result = runner.invoke(app, ["adapters", "list", "--registry", str(registry)])
    assert result.exit_code == 0, result.output
    assert "ghost-agent  harness_adapters.ghost_agent:GHOST  module not importable: ModuleNotFoundError: " \
           "No module named 'harness_adapters.ghost_agent'" in result.output
    assert "quiet-agent  json.decoder:JSONDecoder  imports, but json.decoder:JSONDecoder is not a " \
           "HarnessAdapter" in result.output


def test_adapters_check_refuses_an_unregistered_harness_before_touching_docker():
    result = runner.invoke(app, ["adapters", "check", "no-such-agent"])
    assert result.exit_code == 2 and "no harness 'no-such-agent' registered" in result.output


# --- the scaffold for real ------------------------------------------------------------------------

@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("kind, first_turn", [
    ("npm", None),  # npm cowsay takes the text as arguments: the scaffold's default command as is
    ("pip", ("cowsay", "-t", "{message}"))])  # PyPI cowsay wants -t
def test_a_scaffolded_harness_builds_its_image_and_answers_in_a_real_sandbox(
        root, load, kind, first_turn, client, run_id, tmp_path):
    from harness_adapters.harness import HarnessCell
    from orchestrator.prompts import PromptSet
    from sandboxes.docker_sandbox import DockerSandbox, SandboxSpec, prune
    from sandboxes.images import ensure_image
    from tests.docker_fixtures import BASE

    name = f"cowsay-{kind}-it"
    new_adapter(name, root, version={"npm": "1.6.0", "pip": "6.1"}[kind], **{kind: "cowsay"})
    module = load(root / "harness_adapters" / f"{name.replace('-', '_')}.py", name)
    if first_turn:
        module.FIRST_TURN = module.NEXT_TURN = first_turn
    adapter = getattr(module, module.__name__.rsplit(".", 1)[-1].upper())
    image = ensure_image(adapter.recipe, BASE, client)
    sandbox = DockerSandbox(SandboxSpec(image, run=run_id, cell=name), client).start()
    try:
        cell = HarnessCell(sandbox, PromptSet.load(), "carc-scripted", None, "memory-on")
        state, learner = adapter.make_state(cell), adapter.make_learner(cell)
        state.restore(None)
        learner.open_conversation("carc-test")
        turn = learner.send("moo from carc")
        learner.close_conversation()
        assert "moo from carc" in turn.text and turn.note["driver"]["returncode"] == 0
        logs = state.collect_logs(tmp_path / "logs")
        assert "--- turn 1 of carc-test: cowsay" in logs[0].read_text()
    finally:
        sandbox.teardown()
        prune(run=run_id)
