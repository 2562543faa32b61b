"""cache_aware: prefix hits go back to the same worker, imbalance overrides, memory stays bounded."""

from __future__ import annotations

import random
import string

from inference.routing.policies import CacheAware

from tests.inference.routing.handles import ask, fleet

SYSTEM = "You are a careful assistant. " * 40  # a long shared prefix (1,160 chars)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_sharing_a_long_prefix_go_to_the_same_worker() -> None:
    workers = fleet(4)
    policy = CacheAware()
    first = policy.select(workers, ask(SYSTEM + "question one"))
    for question in ("question two", "a different question entirely", "3"):
        assert policy.select(workers, ask(SYSTEM + question)) is first


def test_distinct_prompts_spread_to_the_smallest_trees() -> None:
    workers = fleet(4)
    policy = CacheAware()
    chosen = {policy.select(workers, ask(f"{i} unrelated prompt {i * 7919}")).id for i in range(4)}
    assert chosen == {"w0", "w1", "w2", "w3"}


def test_short_match_below_the_threshold_is_not_a_hit() -> None:
    workers = fleet(2)
    policy = CacheAware(cache_threshold=0.5)
    first = policy.select(workers, ask("abc" + "x" * 100))
    second = policy.select(workers, ask("abc" + "y" * 100))  # 3 of 103 chars match
    assert second is not first  # went to the worker with the smaller (empty) tree


def test_imbalanced_load_goes_to_the_least_loaded() -> None:
    workers = fleet(3)
    policy = CacheAware(balance_abs_threshold=4, balance_rel_threshold=1.5)
    owner = policy.select(workers, ask(SYSTEM + "one"))
    owner.load.in_flight = 10
    idle, busy = (worker for worker in workers if worker is not owner)
    busy.load.in_flight = 3
    assert policy.select(workers, ask(SYSTEM + "two")) is idle


def test_load_within_the_thresholds_does_not_override_a_hit() -> None:
    workers = fleet(3)
    policy = CacheAware(balance_abs_threshold=4, balance_rel_threshold=1.5)
    owner = policy.select(workers, ask(SYSTEM + "one"))
    owner.load.in_flight = 4  # 4 - 0 is not above the absolute threshold
    assert policy.select(workers, ask(SYSTEM + "two")) is owner
    for worker in workers:
        worker.load.in_flight = 80
    owner.load.in_flight = 100  # 20 above the others, but not 1.5 times their load
    assert policy.select(workers, ask(SYSTEM + "three")) is owner


def test_hits_are_only_among_candidates() -> None:
    workers = fleet(3)
    policy = CacheAware()
    owner = policy.select(workers, ask(SYSTEM + "one"))
    others = tuple(worker for worker in workers if worker is not owner)
    second = policy.select(others, ask(SYSTEM + "two"))
    assert second in others
    assert policy.select(others, ask(SYSTEM + "three")) is second  # now the prefix lives there too


def test_each_model_has_its_own_tree() -> None:
    workers = fleet(2)
    policy = CacheAware()
    policy.select(workers, ask(SYSTEM, model="a"))
    assert policy.tree("b").size("w0") == policy.tree("b").size("w1") == 0
    assert policy.tree("a").size("w0") + policy.tree("a").size("w1") == len(SYSTEM)


def test_requests_without_text_go_to_the_least_loaded() -> None:
    workers = fleet(3)
    workers[0].load.in_flight = 2
    workers[2].load.in_flight = 1
    policy = CacheAware()
    assert policy.select(workers, ask(None)) is workers[1]
    assert policy.select(workers, ask("")) is workers[1]


def test_trees_never_grow_past_max_tree_size() -> None:
    rng = random.Random(3)
    clock = Clock()
    workers = fleet(4)
    policy = CacheAware(max_tree_size=3_000, clock=clock)
    systems = ["".join(rng.choices(string.ascii_letters, k=500)) for _ in range(3)]
    for _ in range(1000):
        clock.now += 0.01
        text = rng.choice(systems) + "".join(rng.choices(string.ascii_letters, k=rng.randint(1, 400)))
        policy.select(workers, ask(text))
        assert max(policy.tree("m").size(worker.id) for worker in workers) <= 3_000
    tree = policy.tree("m")
    for worker in workers:
        assert tree.size(worker.id) == tree.chars_owned_by(worker.id)
    recent = systems[0] + "the most recent question"
    owner = policy.select(workers, ask(recent))
    assert policy.select(workers, ask(recent + "?")) is owner  # recent prefixes survive trimming


def test_forget_removes_the_worker_from_every_tree() -> None:
    workers = fleet(2)
    policy = CacheAware()
    owner = policy.select(workers, ask(SYSTEM, model="a"))
    policy.select(workers, ask(SYSTEM, model="b"))
    policy.forget(owner.id)
    assert policy.tree("a").size(owner.id) == policy.tree("b").size(owner.id) == 0
    remaining = next(worker for worker in workers if worker is not owner)
    assert policy.select((remaining,), ask(SYSTEM + "!", model="a")) is remaining  # releases the rest
    assert policy.tree("a").chars_owned_by(owner.id) == 0
