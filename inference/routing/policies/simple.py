"""The stateless (or nearly) policies: round_robin, random, power_of_two, least_load."""

from __future__ import annotations

import itertools
import random
from typing import Sequence

from inference.routing.policies.base import SelectionRequest, least_loaded
from inference.routing.workers import WorkerHandle

__all__ = ["RoundRobin", "RandomChoice", "PowerOfTwo", "LeastLoad"]


class RoundRobin:
    """Each model's candidates in turn (one counter per model)."""

    name = "round_robin"
    needs_text = False

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count[int]] = {}

    def select(self, candidates: Sequence[WorkerHandle], request: SelectionRequest) -> WorkerHandle:
        if len(candidates) == 1:
            return candidates[0]
        counter = self._counters.get(request.model)
        if counter is None:
            counter = self._counters[request.model] = itertools.count()
        return candidates[next(counter) % len(candidates)]

    def forget(self, worker_id: str) -> None:
        pass


class RandomChoice:
    name = "random"
    needs_text = False

    def select(self, candidates: Sequence[WorkerHandle], request: SelectionRequest) -> WorkerHandle:
        return candidates[0] if len(candidates) == 1 else random.choice(candidates)

    def forget(self, worker_id: str) -> None:
        pass


class PowerOfTwo:
    """Sample two workers at random, take the one with fewer requests in flight."""

    name = "power_of_two"
    needs_text = False

    def select(self, candidates: Sequence[WorkerHandle], request: SelectionRequest) -> WorkerHandle:
        if len(candidates) == 1:
            return candidates[0]
        first, second = random.sample(candidates, 2)
        return second if second.load.in_flight < first.load.in_flight else first

    def forget(self, worker_id: str) -> None:
        pass


class LeastLoad:
    """The worker with the fewest requests in flight; ties go to the earliest registered."""

    name = "least_load"
    needs_text = False

    def select(self, candidates: Sequence[WorkerHandle], request: SelectionRequest) -> WorkerHandle:
        return least_loaded(candidates)

    def forget(self, worker_id: str) -> None:
        pass
