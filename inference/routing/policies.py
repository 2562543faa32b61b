"""Worker selection policies, looked up by name (--policy)."""

from __future__ import annotations

import itertools
import random
from typing import Callable, Protocol, Sequence

from inference.routing.registry import WorkerHandle

__all__ = ["SelectionPolicy", "RoundRobin", "RandomChoice", "PowerOfTwo", "LeastLoad", "make_policy"]


class SelectionPolicy(Protocol):
    name: str

    def select(self, candidates: Sequence[WorkerHandle], key: str) -> WorkerHandle:
        """Pick one of ``candidates`` (never empty). ``key`` groups state, e.g. the model id."""


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count[int]] = {}

    def select(self, candidates: Sequence[WorkerHandle], key: str) -> WorkerHandle:
        if len(candidates) == 1:
            return candidates[0]
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = itertools.count()
        return candidates[next(counter) % len(candidates)]


class RandomChoice:
    name = "random"

    def select(self, candidates: Sequence[WorkerHandle], key: str) -> WorkerHandle:
        return candidates[0] if len(candidates) == 1 else random.choice(candidates)


class PowerOfTwo:
    """Sample two workers at random, take the one with fewer requests in flight."""

    name = "power_of_two"

    def select(self, candidates: Sequence[WorkerHandle], key: str) -> WorkerHandle:
        if len(candidates) == 1:
            return candidates[0]
        first, second = random.sample(candidates, 2)
        return second if second.load.in_flight < first.load.in_flight else first


class LeastLoad:
    """The worker with the fewest requests in flight; ties go to the earliest registered."""

    name = "least_load"

    def select(self, candidates: Sequence[WorkerHandle], key: str) -> WorkerHandle:
        return min(candidates, key=_in_flight)


def _in_flight(handle: WorkerHandle) -> int:
    return handle.load.in_flight


_POLICIES: dict[str, Callable[[], SelectionPolicy]] = {
    RoundRobin.name: RoundRobin,
    RandomChoice.name: RandomChoice,
    PowerOfTwo.name: PowerOfTwo,
    LeastLoad.name: LeastLoad,
}


def make_policy(name: str) -> SelectionPolicy:
    try:
        return _POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}") from None
