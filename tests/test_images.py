"""Image recipes: content-addressed tags, cached builds, build errors that name the recipe (real Docker)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.doctor import run_checks
from sandboxes.images import ImageBuildError, Recipe, ensure_image, render
from tests.docker_fixtures import (  # noqa: F401
    BASE,
    _prune_at_end,
    base_image,
    client,
    proxy_image,
    run_id,
)

pytestmark = pytest.mark.docker


def output_of(client, image: str, cmd: list[str], **options) -> bytes:
    """Run to completion, then read the logs (run(remove=True) can lose a short container's output)."""
    container = client.containers.run(image, cmd, detach=True, **options)
    try:
        container.wait(timeout=120)
        return container.logs()
    finally:
        container.remove(force=True)


def tiny_recipe(tmp_path, name: str, run_line: str = "true") -> Recipe:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "Dockerfile").write_text(f"FROM $FROM\nCOPY note.txt /opt/note.txt\nRUN {run_line}\n")
    (folder / "note.txt").write_text("first")
    return Recipe(name, folder, "base")


def test_tag_is_a_hash_of_the_rendered_recipe_and_its_files(tmp_path):
    recipe = tiny_recipe(tmp_path, "pytest-hash")
    first = render(recipe, "carc-base:x").digest()
    assert render(recipe, "carc-base:x").digest() == first
    assert render(recipe, "carc-base:y").digest() != first  # another parent
    (recipe.folder / "note.txt").write_text("second")
    assert render(recipe, "carc-base:x").digest() != first  # another file content


def test_an_unchanged_recipe_is_built_once_and_then_found_in_the_cache(tmp_path, base_image, client,
                                                                      monkeypatch):
    recipe = tiny_recipe(tmp_path, "pytest-cache")
    tag = ensure_image(recipe, BASE, client)
    image_id = client.images.get(tag).id

    def no_second_build(*args):
        raise AssertionError("an unchanged recipe was built again")
    monkeypatch.setattr("sandboxes.images._build", no_second_build)
    assert ensure_image(recipe, BASE, client) == tag
    assert client.images.get(tag).id == image_id
    assert output_of(client, tag, ["cat", "/opt/note.txt"]) == b"first"


def test_a_planned_tag_is_the_one_ensure_image_builds_and_planning_builds_nothing(tmp_path, base_image, client):
    from sandboxes.images import planned_image
    recipe = tiny_recipe(tmp_path, "pytest-plan", run_line="echo planned")
    (recipe.folder / "note.txt").write_text(f"{tmp_path}")  # a content no earlier test built
    before = planned_image(recipe, BASE, client)
    assert before.tag is not None and not before.present
    with pytest.raises(Exception):
        client.images.get(before.tag)  # planning built nothing
    try:
        assert ensure_image(recipe, BASE, client) == before.tag
        assert planned_image(recipe, BASE, client).present
    finally:
        client.images.remove(before.tag, force=True)


def test_builds_have_no_network(tmp_path, base_image, client):
    code = "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)"
    with pytest.raises(ImageBuildError, match="pytest-nonet/Dockerfile"):
        ensure_image(tiny_recipe(tmp_path, "pytest-nonet", f'python3 -c "{code}"'), BASE, client)


def test_unknown_recipe_is_named_with_the_known_ones():
    with pytest.raises(ImageBuildError, match="no image recipe 'nope' in sandboxes; known: arc3-engine, base, proxy"):
        ensure_image("nope")


def test_base_image_has_python_311_node_24_and_the_sandbox_user(base_image, client):
    out = output_of(client, base_image, ["sh", "-c", "python3 --version; node --version; id -u; "
                                                 "stat -c %u /state"]).decode()
    python, node, uid, owner = out.split()[1], out.split()[2], out.split()[3], out.split()[4]
    assert tuple(int(x) for x in python.split(".")[:2]) >= (3, 11)
    assert node.startswith("v24.") and int(node.split(".")[1]) >= 16
    assert (uid, owner) == ("1000", "1000")


def test_proxy_image_runs_the_pinned_mitmproxy(proxy_image, client):
    out = output_of(client, proxy_image, None,
                    entrypoint=["/opt/mitmproxy/bin/mitmdump", "--version"]).decode()
    assert "Mitmproxy: 11.0.2" in out


def test_doctor_finds_the_engine_and_the_built_images(base_image, proxy_image):
    checks = {c.name: c for c in run_checks()}
    assert checks["docker engine"].ok
    assert checks["host address"].ok, checks["host address"].detail
    assert checks["image base"].ok and checks["image proxy"].ok
    assert all(c.fix for c in checks.values() if not c.ok)


def test_prune_command_reports_what_it_removed():
    result = CliRunner().invoke(app, ["sandboxes", "prune", "--run", "pytest-nothing-here"])
    assert result.exit_code == 0
    assert "removed 0 containers, 0 networks, 0 volumes" in result.output
