"""Calibration sweep: the embedded model's first-answer accuracy on first meetings, per setting.

Tries per-reply search caps (one cap per level of `SAMPLED[effort]`) and commit thresholds
(`COMMIT_FIT`) for one effort, with the stateless floor on first meetings averaged over model and
instance seeds 0..K-1, and prints one line per setting. The only quantity calibrated is this
accuracy, toward the seed's 32 / 47 / 68 % at low / medium / high (solver_model/CALIBRATION.md);
nothing here looks at returning instances or the ladder's differences.

    python bench/calibrate.py --effort medium --settings "30,150@0.6 40,200@0.6" [--source own]
                              [--seeds 4] [--limit N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from rich.console import Console

import solver_model.policy as policy
import solver_model.search as search
from harness_adapters.stateless_floor import StatelessFloor
from orchestrator.prompts import PromptSet

from solver import REARC_DEFAULT, InProcessSolver, play, sources


def setting(text: str) -> tuple[tuple[int, ...], float]:
    caps, _, fit = text.partition("@")
    return tuple(int(c) for c in caps.split(",")), float(fit or policy.COMMIT_FIT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effort", required=True, choices=search.EFFORTS)
    parser.add_argument("--settings", required=True, help='e.g. "30,150@0.6 40,200@0.5"')
    parser.add_argument("--source", default="own")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--rearc", type=Path, default=REARC_DEFAULT)
    args = parser.parse_args()
    console = Console()
    name, source = next(iter(sources([args.source], args.rearc)))
    ids = source.task_ids()[: args.limit or None]
    levels = search.SAMPLED[args.effort]
    prompts = PromptSet.load()
    with TemporaryDirectory() as tmp:
        for text in args.settings.split():
            caps, fit = setting(text)
            if len(caps) != len(levels):
                raise SystemExit(f"{text!r}: {args.effort} has {len(levels)} levels, "
                                 f"give {len(levels)} caps")
            search.SAMPLED[args.effort] = tuple(search.Level(level.final, level.extend, cap)
                                                for level, cap in zip(levels, caps))
            policy.COMMIT_FIT = fit
            first = solved = n = 0
            start = time.perf_counter()
            for seed in range(args.seeds):
                learner = StatelessFloor(Path(tmp), prompts, InProcessSolver(args.effort, seed))
                for task_id in ids:
                    result = play(learner, source.instance(task_id, 0, seed))
                    first += bool(result.first_answer_correct)
                    solved += result.status.value == "solved"
                    n += 1
            console.print(f"{name} {args.effort} caps={caps} commit_fit={fit}: first answer "
                          f"{first / n:.1%}, solved {solved / n:.1%}, n={n}, "
                          f"{(time.perf_counter() - start) / n:.3f} s/instance")


if __name__ == "__main__":
    main()
