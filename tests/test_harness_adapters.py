"""The harness adapter registry and failure classification (no Docker needed)."""

import pytest

from harness_adapters.harness import FailureKind, adapter_for
from harness_adapters.registry import harnesses
from orchestrator.prompts import PromptSet
from orchestrator.run.grid_config import HARNESSES, LEARNER_ROWS


def test_every_harness_a_grid_may_name_has_an_adapter_with_the_same_rows():
    assert set(harnesses()) == HARNESSES
    for name in HARNESSES:
        adapter = adapter_for(name)
        assert adapter.name == name and adapter.rows == LEARNER_ROWS[name]
        assert (adapter.recipe.folder / "Dockerfile").exists()


def test_unknown_harness_names_the_known_ones():
    with pytest.raises(KeyError, match="known: hermes-agent"):
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
                               "default": "m", "context_length": 131072}
    assert config["security"] == {"tirith_enabled": False, "allow_lazy_installs": False}
    assert config["approvals"] == {"mode": "off"} and config["agent"]["reasoning_effort"] == "low"


def test_ablation_templates_can_be_reworded_from_a_file(tmp_path):
    wording = tmp_path / "w.yaml"
    wording.write_text("store_invitation: Keep notes now.\n")
    assert PromptSet.load(wording).render("store_invitation") == "Keep notes now."
