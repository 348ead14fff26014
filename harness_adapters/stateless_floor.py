"""The stateless floor: the bare model, no tools, no memory, a fresh conversation per instance.

It decides for itself when to buy a pair and when to submit; it keeps nothing between instances.
"""

from __future__ import annotations

from harness_adapters.base import ChatLearner


class StatelessFloor(ChatLearner):
    name = "stateless-floor"
