"""`carc labels make`: the two passes that decide which symmetries each task's rule survives.

Pass A is mechanical: the embedded model's exhaustive program search (`solver_model.search.search`,
effort high by default) over every public pair of the task, train and test. Where it finds a
program that fits all of them, a symmetry g is kept when the simplest such program maps g(input)
to g(output) on every pair: the rule as found commutes with g on the task's own grids. Where it
finds none, pass A gives no verdict. It can only judge what the search's DSL can express.

Pass B asks a model through any endpoint (a grid's model APIs, `harness_adapters.chat_model`),
two ways: `list` shows the task's training pairs and asks which of the 8 symmetries leave its
rule unchanged; `check` shows the training pairs beside their image under one symmetry and asks
whether they follow the same rule, once per symmetry. The two prompts may go to one model or to
two. Pass B's verdict is the set both prompts agree on; where they differ it gives none (both
answers are kept in `why`). Pass B sees training pairs only: no test output enters a prompt.

The decision is `orchestrator.tasks.labels.decide`: every pass that ran must give a verdict and
agree. The file keeps each pass's verdict, so a later pass B can be added to a file pass A wrote.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.arc import Demo, grid_json
from orchestrator.errors import ConfigError
from orchestrator.tasks.frames import apply_symmetry
from orchestrator.tasks.labels import (SYMMETRY_NAMES, LabelsFile, Verdict, label_task,
                                       load_labels_file, ordered, render_labels)
from orchestrator.tasks.public import PublicTask

PASS_A_METHOD = ("the embedded model's exhaustive program search (solver_model.search.search, "
                 "effort {effort}) over every public pair, train and test; a symmetry is kept when "
                 "the simplest program found maps g(input) to g(output) on every pair")
PASS_B_METHOD = ("a model asked two ways over the training pairs only: `list` (which symmetries "
                 "leave the rule unchanged) on {list_model}, `check` (one symmetry at a time: do "
                 "the transformed pairs follow the same rule?) on {check_model}; kept where both agree")


# ----- pass A -----

def pass_a(task: PublicTask, effort: str = "high") -> Verdict:
    """Pass A on one task (see the module docstring): the simplest program the search finds for
    all of the task's pairs (fewest steps, then the DSL's fixed order) stands for its rule. Not
    every program that fits: a task's few pairs are also fitted by contrived chains (rot180 by
    `flip_h | sort_rows` on three pairs), which would strike symmetries the rule has."""
    from solver_model.search import search
    pairs = task.pairs
    programs = search(pairs, effort)
    if not programs:
        return Verdict(None, f"the search (effort {effort}) finds no program that fits all {len(pairs)} pairs")
    program = programs[0]
    keeps = ordered(g for g in SYMMETRY_NAMES
                    if all(program(apply_symmetry(g, d.input)) == apply_symmetry(g, d.output) for d in pairs))
    others = f" (the simplest of {len(programs)} that fit)" if len(programs) > 1 else ""
    return Verdict(keeps, f"program {program.describe()}{others} fits all {len(pairs)} pairs")


def _pass_a_job(args: tuple[str, PublicTask, str]) -> tuple[str, Verdict]:
    task_id, task, effort = args
    return task_id, pass_a(task, effort)


# ----- pass B -----

SYMMETRY_WORDS = {
    "identity": "leave the grid as it is",
    "rot90": "rotate a quarter turn clockwise",
    "rot180": "rotate a half turn",
    "rot270": "rotate a quarter turn anticlockwise",
    "flip_h": "mirror left to right",
    "flip_v": "mirror top to bottom",
    "transpose": "mirror in the main diagonal (top-left to bottom-right)",
    "antitranspose": "mirror in the other diagonal (top-right to bottom-left)",
}


def _pairs_text(pairs: Sequence[Demo]) -> str:
    return "\n".join(f"Pair {i + 1}\ninput: {grid_json(d.input)}\noutput: {grid_json(d.output)}"
                     for i, d in enumerate(pairs))


LIST_PROMPT = """\
Below are the example pairs of an ARC task: each output is made from its input by one rule.
Grids are lists of rows; numbers are colours, 0 is the background.

{pairs}

Transform a pair by applying one of these to BOTH its input and its output:
{symmetries}
For which of them does every transformed pair still follow exactly the same rule (the same rule
seen in another orientation, not a different rule such as "things fall left" instead of "things
fall down")? Think it through, then end your answer with one line:
KEEP: <the names that keep the rule, comma-separated; identity always keeps it>
"""

CHECK_PROMPT = """\
Below are the example pairs of an ARC task, each output made from its input by one rule, and the
same pairs after applying "{words}" to both input and output. Grids are lists of rows; numbers are
colours, 0 is the background.

Original pairs:
{pairs}

Transformed pairs:
{moved}

Does every transformed output follow from its transformed input by exactly the same rule as in
the original pairs (not a mirrored or rotated variant of it)? Think it through, then end your
answer with one line: SAME: yes  or  SAME: no
"""

_KEEP = re.compile(r"^[\s*_#]*KEEP[\s*_]*:[\s*_]*(.*)$", re.I | re.M)
_SAME = re.compile(r"^[\s*_#]*SAME[\s*_]*:[\s*_]*(yes|no)\b", re.I | re.M)


def parse_keep(text: str) -> tuple[str, ...] | None:
    """The symmetries of the last `KEEP:` line, or None when there is none or it names something
    that is not a symmetry."""
    found = _KEEP.findall(text)
    if not found:
        return None
    names = [n.strip().strip("`*.").lower() for n in re.split(r"[,\s]+", found[-1]) if n.strip()]
    if any(n not in SYMMETRY_NAMES for n in names):
        return None
    return ordered(names)


def parse_same(text: str) -> bool | None:
    found = _SAME.findall(text)
    return None if not found else found[-1].lower() == "yes"


Ask = Callable[[str], str]  # one prompt -> the model's reply text


def pass_b(task: PublicTask, ask_list: Ask, ask_check: Ask) -> Verdict:
    """Pass B on one task: the `list` prompt (one call) and the `check` prompt (one call per
    symmetry other than identity), over the training pairs only."""
    pairs = task.train
    text = _pairs_text(pairs)
    menu = "\n".join(f"- {name}: {words}" for name, words in SYMMETRY_WORDS.items())
    listed = parse_keep(ask_list(LIST_PROMPT.format(pairs=text, symmetries=menu)))
    checked: list[str] = ["identity"]
    unanswered: list[str] = []
    for g in SYMMETRY_NAMES[1:]:
        moved = [Demo(apply_symmetry(g, d.input), apply_symmetry(g, d.output)) for d in pairs]
        same = parse_same(ask_check(CHECK_PROMPT.format(words=SYMMETRY_WORDS[g], pairs=text,
                                                        moved=_pairs_text(moved))))
        if same is None:
            unanswered.append(g)
        elif same:
            checked.append(g)
    list_says = "no KEEP: line" if listed is None else ", ".join(listed)
    check_says = ", ".join(ordered(checked)) + (f" (no SAME: line for {', '.join(unanswered)})"
                                                 if unanswered else "")
    why = f"list: {list_says}; check: {check_says}"
    if listed is None or unanswered or listed != ordered(checked):
        return Verdict(None, f"the prompts disagree or did not answer: {why}")
    return Verdict(listed, why)


def endpoint_asker(base_url: str, model: str, api: str = "openai-chat",
                   api_key_env: str = "OPENAI_API_KEY", effort: str | None = None) -> Ask:
    """A prompt -> reply function on a model endpoint, over the ladder's client (the providers'
    SDKs, with its retries)."""
    from harness_adapters.chat_model import ChatModel, ModelEndpoint
    client = ChatModel(ModelEndpoint(base_url=base_url, model=model, api=api,
                                     api_key_env=api_key_env, effort=effort))

    def ask(prompt: str) -> str:
        return client.complete([{"role": "user", "content": prompt}]).text
    return ask


# ----- the file -----

@dataclass(frozen=True)
class PassB:
    ask_list: Ask
    ask_check: Ask
    list_model: str
    check_model: str
    concurrency: int = 4  # tasks asked at once

    @property
    def method(self) -> str:
        return PASS_B_METHOD.format(list_model=self.list_model, check_model=self.check_model)


FAILED = "the endpoint failed"


def _pass_b_safe(task: PublicTask, with_b: PassB) -> Verdict:
    try:
        return pass_b(task, with_b.ask_list, with_b.ask_check)
    except Exception as exc:  # an endpoint that stays down: this task is asked again next time
        return Verdict(None, f"{FAILED}: {str(exc)[:300]}")


def make_labels(tasks: Mapping[str, PublicTask], track: str, effort: str = "high",
                pass_b_with: PassB | None = None, previous: LabelsFile | None = None,
                workers: int | None = None, show_progress: bool = True,
                checkpoint: Callable[[LabelsFile], None] | None = None) -> LabelsFile:
    """Run pass A on every task (in a process pool) and, with an endpoint, pass B (tasks asked
    concurrently; `checkpoint` gets the file after each task, so a stopped run loses no answer
    it paid for). Pass B verdicts of `previous` made by the same models are kept and not asked
    again, except where the endpoint failed; without an endpoint the previous pass B is kept."""
    workers = workers or max(1, min(os.cpu_count() or 1, len(tasks)))
    verdicts: dict[str, dict[str, Verdict]] = {t: {} for t in tasks}
    prev_b = previous.passes.get("B", {}) if previous is not None else {}
    if pass_b_with is not None:
        b_info = {"method": pass_b_with.method, "ran": True}
        reusable = prev_b.get("ran") and prev_b.get("method") == pass_b_with.method
    elif prev_b.get("ran"):
        b_info, reusable = dict(prev_b), True
    else:
        b_info = {"method": PASS_B_METHOD.format(list_model="-", check_model="-"), "ran": False,
                  "why": "no --endpoint given"}
        reusable = False
    for task_id in tasks:
        old = previous.tasks.get(task_id) if reusable and previous is not None else None
        kept = old.verdicts.get("B") if old is not None else None
        if kept is not None and kept.ran and not kept.why.startswith(FAILED):
            verdicts[task_id]["B"] = kept
        elif pass_b_with is None:
            verdicts[task_id]["B"] = kept if kept is not None else Verdict.not_run()
    passes = {"A": {"method": PASS_A_METHOD.format(effort=effort), "ran": True}, "B": b_info}

    def current() -> LabelsFile:
        return LabelsFile(track, passes, {t: label_task(t, v) for t, v in verdicts.items()
                                          if "A" in v and "B" in v})

    progress = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), disable=not show_progress)
    with progress:
        bar = progress.add_task("pass A (program search)", total=len(tasks))
        jobs = [(t, task, effort) for t, task in tasks.items()]
        if workers == 1:
            for task_id, verdict in map(_pass_a_job, jobs):
                verdicts[task_id]["A"] = verdict
                progress.advance(bar)
        else:
            with ProcessPoolExecutor(workers) as pool:
                for task_id, verdict in pool.map(_pass_a_job, jobs):
                    verdicts[task_id]["A"] = verdict
                    progress.advance(bar)
        asked = [t for t in tasks if "B" not in verdicts[t]]
        if pass_b_with is not None and asked:
            bar = progress.add_task("pass B (model, 8 calls/task)", total=len(asked))
            with ThreadPoolExecutor(pass_b_with.concurrency) as pool:
                futures = {pool.submit(_pass_b_safe, tasks[t], pass_b_with): t for t in asked}
                for future in as_completed(futures):
                    verdicts[futures[future]]["B"] = future.result()
                    progress.advance(bar)
                    if checkpoint is not None:
                        checkpoint(current())
    return current()


HEADER = """\
Symmetry labels of the {track} track, format 2 (orchestrator/tasks/labels.py): which of the 8
symmetries of the square each task's rule survives, from two independent passes over its pairs.
A task is served in the symmetries of its decision; one undecided or in disagreement is served in
its own frame (recolourings only) until decided (settle one by hand: decision, status: decided,
decided_by: [hand]).

GENERATED by `carc labels make --track {track}{endpoint}`; nothing was written by hand.
Tasks {tasks}: decided {decided} (all 8 kept {all8}, own frame only {own}), undecided {undecided},
disagreement {disagreement}; pass A gave a verdict on {a}, pass B on {b}.
"""


def header_for(labels: LabelsFile, endpoint: str | None) -> str:
    c = labels.counts()
    return HEADER.format(track=labels.track, endpoint=f" --endpoint {endpoint}" if endpoint else "",
                         tasks=c["tasks"], decided=c["decided"], all8=c["all 8 kept"],
                         own=c["own frame only"], undecided=c["undecided"],
                         disagreement=c["disagreement"], a=c["pass A verdicts"], b=c["pass B verdicts"])


def write_labels(labels: LabelsFile, path: Path, endpoint: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_labels(labels, header_for(labels, endpoint)))
    tmp.replace(path)


def previous_labels(path: Path) -> LabelsFile | None:
    return load_labels_file(path) if path.exists() else None


def track_tasks(track: str) -> dict[str, PublicTask]:
    from orchestrator.tasks.public import arc2_new_eval_tasks
    if track != "arc2":
        raise ConfigError(f"--track {track}: labels are made for arc2 (the 114 tasks new in ARC-AGI-2); "
                         "arc1's frames use orchestrator/data/symmetry_labels.yaml")
    return arc2_new_eval_tasks()
