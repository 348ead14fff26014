"""Prompt templates: the project's own wording (prompts/default.yaml), overridable from a file.

Templates use `$name` placeholders (string.Template) so JSON braces need no escaping. Rendering
functions here are the only place the environment's messages are turned into text.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

import yaml

from typing import TYPE_CHECKING

from orchestrator.arc import Demo, Grid, grid_json
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.protocol import Outcome

REQUIRED = ("system", "instance", "cached_header", "demo", "after_demo", "verdict_incorrect",
            "verdict_correct", "verdict_failed", "refused", "malformed", "program_system",
            "program_check_failed", "program_no_code", "store_invitation", "program_procedure",
            "program_save_request", "malformed_failed", "malformed_warning", "shared_library",
            "curator_task")
# From this many malformed replies left before the cap, the learner is warned after each one.
MALFORMED_WARNING = 5


class PromptError(ConfigError):
    pass


@dataclass(frozen=True)
class PromptSet:
    texts: dict[str, str]
    origin: str

    @classmethod
    def load(cls, path: Path | str | None = None) -> "PromptSet":
        """The default templates, with any keys of the file at `path` replacing them."""
        default_text = resources.files("orchestrator").joinpath("prompts/default.yaml").read_text()
        texts = yaml.safe_load(default_text)
        origin = "default"
        if path is not None:
            path = Path(path)
            try:
                override = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError) as exc:
                raise PromptError(f"{path}: cannot read prompt templates: {exc}") from exc
            if not isinstance(override, dict):
                raise PromptError(f"{path}: must be a mapping of template name to text")
            unknown = sorted(set(override) - set(REQUIRED))
            if unknown:
                raise PromptError(f"{path}: unknown template name(s) {unknown}; "
                                  f"known: {', '.join(REQUIRED)}")
            for key, value in override.items():
                if not isinstance(value, str):
                    raise PromptError(f"{path}: template {key!r} must be text")
            texts.update(override)
            origin = str(path)
        return cls(texts, origin)

    def render(self, name: str, **values: object) -> str:
        try:
            return Template(self.texts[name]).substitute(**{k: str(v) for k, v in values.items()})
        except KeyError as exc:
            raise PromptError(f"template {name!r} ({self.origin}) uses unknown placeholder {exc}")

    # The environment's messages -------------------------------------------------------------

    def demo_block(self, demo: Demo, number: int) -> str:
        return self.render("demo", number=number, input=grid_json(demo.input),
                           output=grid_json(demo.output))

    def instance_message(self, task_id: str, test_input: Grid, attempts_used: int,
                         demos_used: int, shown: list[tuple[int, Demo]] = (),
                         cached: list[Demo] = ()) -> str:
        """The opening message: task id, counts, free cached pairs, pairs already bought, test input."""
        parts = []
        if cached:
            parts.append(self.render("cached_header").rstrip("\n"))
            parts.extend(self.demo_block(d, i).rstrip("\n") for i, d in enumerate(cached, 1))
        parts.extend(self.demo_block(d, n).rstrip("\n") for n, d in shown)
        text = self.render("instance", task_id=task_id, attempts_used=attempts_used,
                           demos_used=demos_used, cached="\n".join(parts),
                           test_input=grid_json(test_input))
        return "\n".join(line for line in text.splitlines() if line.strip() or False) + "\n"

    def outcome_message(self, outcome: "Outcome", attempts_used: int, demos_used: int,
                        demo_number: int | None = None) -> str:
        """What the learner is told after an action. `demo_number` renumbers a bought pair."""
        from orchestrator.protocol import (DemoGiven, Finished, MalformedReply, Refused,
                                           Verdict)

        counts = dict(attempts_used=attempts_used, demos_used=demos_used)
        if isinstance(outcome, DemoGiven):
            number = demo_number if demo_number is not None else outcome.number
            return self.demo_block(outcome.demo, number) + self.render("after_demo", **counts)
        if isinstance(outcome, Verdict):
            if outcome.correct:
                return self.render("verdict_correct")
            return self.render("verdict_failed" if outcome.over else "verdict_incorrect", **counts)
        if isinstance(outcome, Refused):
            return self.render("refused", reason=outcome.reason)
        if isinstance(outcome, MalformedReply):
            if outcome.left == 0:  # this reply reached the cap: the instance failed, charged in full
                return self.render("malformed_failed", reason=outcome.reason)
            text = self.render("malformed", reason=outcome.reason)
            if outcome.left is not None and outcome.left <= MALFORMED_WARNING:
                text += self.render("malformed_warning", left=outcome.left,
                                    replies="reply" if outcome.left == 1 else "replies")
            return text
        if isinstance(outcome, Finished):
            return "The conversation is over."
        raise TypeError(f"unknown outcome {outcome!r}")
