"""Benchmark: the embedded solver model's first-exposure solve rate per effort.

Plays one first-exposure instance per task through the real instance protocol, with the
stateless floor's conversation and the model's own policy (in process: the same `reply` the
server calls, without HTTP), and prints per source and effort: first answers correct, instances
solved within the cap, mean budget share, mean pairs bought before the first submission, and
seconds per instance.

    python bench/solver.py [--sources own,arc1-frames,rearc] [--efforts low,medium,high]
                           [--limit N] [--seeds K] [--rearc PATH]

`--seeds K` plays every task K times (model seed and instance seed 0..K-1) and averages: one
seed's first answers on a few dozen tasks move by several points. `rearc` needs a Re-ARC
checkout (`--rearc`, default ../shared/vendor/re-arc beside the repository).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from rich.console import Console
from rich.progress import track
from rich.table import Table

from harness_adapters.chat_model import ChatReply, Usage
from harness_adapters.stateless_floor import StatelessFloor
from harness_adapters.base import InstanceView
from orchestrator.prompts import PromptSet
from orchestrator.protocol import InstanceProtocol, extract_action
from solver_model.conversation import read_conversation
from solver_model.policy import reply


class InProcessSolver:
    """The embedded model's policy behind the `ChatModel.complete` interface."""

    def __init__(self, effort: str, seed: int = 0):
        self.effort = effort
        self.seed = seed

    def complete(self, messages, deadline=None):
        start = time.perf_counter()
        text = reply(read_conversation(messages), self.effort, seed=self.seed).text
        return ChatReply(text, Usage(1, 0, 0, time.perf_counter() - start, 0.0))


REARC_DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "vendor" / "re-arc"


def sources(names: list[str], rearc: Path = REARC_DEFAULT):
    from orchestrator.tasks.frames import FramedSource
    from orchestrator.tasks.own_source import OwnSource
    from orchestrator.tasks.public import arc1_tasks
    from orchestrator.tasks.rearc import ReArcSource
    for name in names:
        if name == "own":
            yield name, OwnSource()
        elif name == "arc1-frames":
            yield name, FramedSource(arc1_tasks("training"), name="arc1-frames")
        elif name == "rearc":
            if not rearc.is_dir():
                raise SystemExit(f"no Re-ARC checkout at {rearc}; pass --rearc PATH")
            yield name, ReArcSource(rearc)
        else:
            raise SystemExit(f"unknown source {name!r}; use own, arc1-frames or rearc")


def play(learner: StatelessFloor, instance) -> InstanceProtocol:
    protocol = InstanceProtocol(instance)
    learner.begin(InstanceView(instance.task_id, instance.test_input))
    while not protocol.over:
        turn = learner.act()
        outcome = protocol.step(extract_action(turn.text))
        learner.observe(outcome, protocol.wrong, protocol.demos_used)
    return protocol


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default="own,arc1-frames")
    parser.add_argument("--efforts", default="low,medium,high")
    parser.add_argument("--limit", type=int, default=0, help="at most N tasks per source (0: all)")
    parser.add_argument("--seeds", type=int, default=1, help="average over model/instance seeds 0..K-1")
    parser.add_argument("--rearc", type=Path, default=REARC_DEFAULT)
    args = parser.parse_args()
    console = Console(width=160)
    table = Table(title="embedded solver model: first exposure, stateless floor")
    for column in ("source", "effort", "tasks", "1st answer correct", "solved", "budget share",
                   "pairs before 1st submit", "s / instance"):
        table.add_column(column, justify="right")
    prompts = PromptSet.load()
    with TemporaryDirectory() as tmp:
        for name, source in sources(args.sources.split(","), args.rearc):
            ids = source.task_ids()[: args.limit or None]
            plays = [(seed, source.instance(t, 0, seed)) for seed in range(args.seeds) for t in ids]
            for effort in args.efforts.split(","):
                learners = {seed: StatelessFloor(Path(tmp), prompts, InProcessSolver(effort, seed))
                            for seed in range(args.seeds)}
                start = time.perf_counter()
                results = [play(learners[seed], instance) for seed, instance
                           in track(plays, f"{name} {effort}", console=console)]
                seconds = time.perf_counter() - start
                n = len(results)
                table.add_row(name, effort, f"{len(ids)} x {args.seeds}",
                              f"{sum(bool(r.first_answer_correct) for r in results) / n:.1%}",
                              f"{sum(r.status.value == 'solved' for r in results) / n:.1%}",
                              f"{sum(r.budget_share for r in results) / n:.1%}",
                              f"{sum(r.first_submit_demos or 0 for r in results) / n:.2f}",
                              f"{seconds / n:.3f}")
    console.print(table)


if __name__ == "__main__":
    main()
