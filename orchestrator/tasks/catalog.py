"""Which instance sources a track uses for its stream and its held-out epilogue."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.errors import ConfigError
from orchestrator.tasks.base import TaskSource


@dataclass(frozen=True)
class TrackSources:
    stream: TaskSource
    stream_tasks: list[str]
    epilogue: TaskSource
    epilogue_tasks: list[str]


def _pick(ids: list[str], n: int, seed: int, tag: int, what: str) -> list[str]:
    """A seeded choice of `n` ids (in a seeded order); all of them when n covers the list."""
    ids = sorted(ids)
    if n > len(ids):
        raise ConfigError(f"{what}: {n} tasks asked for, the source has {len(ids)}")
    rng = np.random.default_rng([seed, tag])
    return [ids[i] for i in rng.choice(len(ids), size=n, replace=False)]


def track_sources(track, seed: int) -> TrackSources:
    """Build the sources of a `TrackConfig` (see orchestrator.run.grid_config) for a seed."""
    from orchestrator.tasks.frames import ARC2_LABELS, FramedSource
    from orchestrator.tasks.own_source import OwnSource
    from orchestrator.tasks.public import PublicPairsSource, arc1_tasks, arc2_new_eval_tasks

    if track.name == "arc3":
        from orchestrator.tasks.arc3_games import Arc3Source, load_games
        games = Arc3Source(load_games(track.environments_dir))
        ids = games.task_ids()
        picked = _pick(ids, min(track.tasks, len(ids)), seed, 1, "track.tasks")
        return TrackSources(games, picked, games, [])
    if track.name == "own" or track.source == "own":
        stream: TaskSource = OwnSource(split="stream")
        epilogue: TaskSource = OwnSource(split="heldout")
    else:
        epilogue = PublicPairsSource(arc1_tasks("evaluation"), name="arc1-evaluation")
        if track.name == "arc2":
            stream = FramedSource(arc2_new_eval_tasks(), name="arc2-frames", labels_file=track.labels,
                                  default_labels=ARC2_LABELS)
        elif track.source == "rearc":
            from orchestrator.tasks.rearc import ReArcSource
            stream = ReArcSource(track.rearc_path)
        else:
            stream = FramedSource(arc1_tasks("training"), name="arc1-frames", labels_file=track.labels)
    if track.task_ids:
        known = set(stream.task_ids())
        unknown = [t for t in track.task_ids if t not in known]
        if unknown:
            raise ConfigError(f"track.task_ids: {unknown} are not tasks of source {stream.name}")
        stream_tasks = list(track.task_ids)
    else:
        stream_tasks = _pick(stream.task_ids(), track.tasks, seed, 1, "track.tasks")
    epilogue_tasks = _pick(epilogue.task_ids(), track.epilogue, seed, 2, "track.epilogue")
    return TrackSources(stream, stream_tasks, epilogue, epilogue_tasks)
