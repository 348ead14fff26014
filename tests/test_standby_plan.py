"""How many standby sandboxes a wiped harness row makes (orchestrator/run/standby.py), without an
engine: a standby is a harness start (an openclaw gateway is ~25 s of CPU), so one is made only
for a wipe still to come. The real sandboxes are tests/test_standby.py's."""

from __future__ import annotations

import threading

from orchestrator.run.standby import Prepared, StandbyCell


class FakeState:
    def __init__(self):
        self.wiped_in_place = 0

    def wipe(self):
        self.wiped_in_place += 1

    def restore(self, source):
        pass


class FakeLearner:
    name = "fake"

    def begin(self, view):
        pass

    def close(self):
        pass


class FakeSandbox:
    def retire(self):
        pass


def cell_with(wipes, made: list[int]) -> StandbyCell:
    lock = threading.Lock()

    def make(generation: int) -> Prepared:
        with lock:
            made.append(generation)
        return Prepared(FakeSandbox(), FakeState(), FakeLearner())
    return StandbyCell(Prepared(FakeSandbox(), FakeState(), FakeLearner()), make, wipes)


def serve(cell: StandbyCell, instances: int) -> None:
    for _ in range(instances):
        cell.state.wipe()
        cell.learner.begin(None)  # the instance is served by the current sandbox


def test_a_pass_of_n_wiped_instances_makes_n_minus_one_standbys_and_none_left_over():
    for n in (1, 2, 4):
        made: list[int] = []
        cell = cell_with(n, made)
        serve(cell, n)
        cell.close()
        # the first met the cell's own; none was begun for an instance that will not come
        assert len(made) == cell.generation == n - 1 and cell.swaps == n - 1, (n, made)
        assert cell.current.state.wiped_in_place == 0


def test_a_resumed_pass_restores_a_served_state_so_every_wipe_takes_a_standby():
    made: list[int] = []
    cell = cell_with(3, made)
    cell.state.restore("snapshot of the last finished instance")
    serve(cell, 3)
    cell.close()
    assert len(made) == cell.generation == 3 and cell.swaps == 3


def test_without_a_count_a_standby_is_always_kept_ready_as_before():
    made: list[int] = []
    cell = cell_with(None, made)
    serve(cell, 3)
    cell.close()
    # one more begun for a fourth instance (made, or given up when the cell closed first)
    assert cell.generation == 3 and cell.swaps == 2
