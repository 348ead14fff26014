"""The learner registry and failure classification (no Docker needed)."""

import importlib
import sys

import pytest

from harness_adapters.harness import FailureKind
from harness_adapters.registry import RegistryError, harnesses, learner_class, learners
from harness_adapters.registry import adapter as adapter_for
from orchestrator.prompts import PromptSet
from orchestrator.rows import ROWS
from orchestrator.run.grid_config import HARNESSES, LEARNER_ROWS


def test_every_harness_a_grid_may_name_has_an_adapter_and_a_recipe():
    assert set(harnesses()) == HARNESSES
    for name in HARNESSES:
        adapter = adapter_for(name)
        assert adapter.name == name
        assert (adapter.recipe.folder / "Dockerfile").exists()


def test_the_registry_is_the_one_table_of_learners_and_their_rows():
    assert LEARNER_ROWS == {name: entry.rows for name, entry in learners().items()}
    assert all(row in ROWS for rows in LEARNER_ROWS.values() for row in rows)
    assert {"stateless-floor", "demo-cache-floor", "program-library"} <= set(LEARNER_ROWS)
    assert learner_class("program-library").runs_programs
    assert not learner_class("stateless-floor").runs_programs


def test_reading_the_registry_imports_no_adapter_and_no_recipe_is_registered_by_an_import():
    for module in [m for m in sys.modules if m.startswith("harness_adapters.") and m.endswith(
            ("hermes_agent", "openclaw", "prime_agent"))]:
        del sys.modules[module]
    assert set(learners()) >= {"hermes-agent", "openclaw"}
    assert "harness_adapters.openclaw" not in sys.modules
    from sandboxes.images import RECIPES
    importlib.import_module("harness_adapters.openclaw")
    assert set(RECIPES) == {"base", "proxy", "arc3-engine"}  # importing an adapter adds no recipe anywhere


def test_unknown_learner_names_the_known_ones():
    with pytest.raises(RegistryError, match="known: stateless-floor.*hermes-agent"):
        adapter_for("nope")


@pytest.mark.parametrize("text, kind", [
    ("openai.RateLimitError: Error code: 429", FailureKind.RATE_LIMIT),
    ("httpx.ReadTimeout: timed out", FailureKind.TIMEOUT),
    ("APIConnectionError: Connection refused", FailureKind.CRASH),
    ("Traceback (most recent call last):\n  ValueError", FailureKind.CRASH),
    ("json.decoder.JSONDecodeError: Expecting value", FailureKind.BAD_OUTPUT),
    ("something else entirely", FailureKind.OTHER),
])
def test_hermes_failures_are_classified_by_pattern(text, kind):
    assert adapter_for("hermes-agent").classify(text) is kind


def test_hermes_config_points_at_the_proxy_with_outside_calls_off():
    import yaml

    from harness_adapters.hermes_agent import render_config
    config = yaml.safe_load(render_config("http://proxy:8081/v1", "m", "low"))
    assert config["model"] == {"provider": "custom", "base_url": "http://proxy:8081/v1",
                               "default": "m", "context_length": 131072,
                               "api_mode": "chat_completions"}
    assert config["security"] == {"tirith_enabled": False, "allow_lazy_installs": False}
    assert config["approvals"] == {"mode": "off"} and config["agent"]["reasoning_effort"] == "low"


def test_ablation_templates_can_be_reworded_from_a_file(tmp_path):
    wording = tmp_path / "w.yaml"
    wording.write_text("store_invitation: Keep notes now.\n")
    assert PromptSet.load(wording).render("store_invitation") == "Keep notes now."
