"""The registry of learners a grid may name, and how a cell's learner is built."""

from __future__ import annotations

from pathlib import Path

from harness_adapters.base import Learner
from harness_adapters.chat_model import ChatModel
from harness_adapters.demo_cache_floor import DemoCacheFloor
from harness_adapters.program_check import ProgramExecutor, local_executor
from harness_adapters.program_library import ProgramLibrary
from harness_adapters.stateless_floor import StatelessFloor
from orchestrator.prompts import PromptSet
from orchestrator.run.grid_config import Cell

LADDER = {
    "stateless-floor": StatelessFloor,
    "demo-cache-floor": DemoCacheFloor,
    "program-library": ProgramLibrary,
}


def build_learner(cell: Cell, state_dir: Path, prompts: PromptSet, model: ChatModel,
                  executor: ProgramExecutor = local_executor) -> Learner:
    if cell.learner == "program-library":
        return ProgramLibrary(state_dir, prompts, model, executor=executor)
    return LADDER[cell.learner](state_dir, prompts, model)
