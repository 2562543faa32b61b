"""consistent_hashing: stable placement by routing key, and minimal movement when the fleet changes."""

from __future__ import annotations

from collections import Counter

from inference.routing.policies import ConsistentHashing
from inference.routing.policies.consistent_hashing import stable_hash

from tests.inference.routing.handles import ask, fleet

KEYS = [f"session-{i}" for i in range(4000)]


def placement(policy: ConsistentHashing, workers) -> dict[str, str]:
    return {key: policy.select(workers, ask(key=key)).id for key in KEYS}


def test_the_same_key_always_goes_to_the_same_worker() -> None:
    workers = fleet(5)
    policy = ConsistentHashing()
    assert {policy.select(workers, ask(key="user-42")).id for _ in range(20)} == {
        policy.select(workers, ask(key="user-42")).id
    }


def test_placement_is_the_same_in_a_fresh_instance() -> None:
    workers = fleet(5)
    assert placement(ConsistentHashing(), workers) == placement(ConsistentHashing(), workers)
    assert stable_hash("user-42") == 0x6FA0CA4D7BE6EFA6  # blake2b: the same in every process and release


def test_keys_spread_over_every_worker() -> None:
    workers = fleet(5)
    counts = Counter(placement(ConsistentHashing(), workers).values())
    assert set(counts) == {worker.id for worker in workers}
    assert min(counts.values()) > len(KEYS) / 5 * 0.6  # 160 virtual nodes keep it roughly even


def test_removing_a_worker_moves_only_its_keys() -> None:
    workers = fleet(8)
    policy = ConsistentHashing()
    before = placement(policy, workers)
    gone = workers[3]
    after = placement(policy, tuple(worker for worker in workers if worker is not gone))
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == gone.id}
    assert len(moved) < len(KEYS) / 8 * 1.5


def test_adding_a_worker_moves_about_one_in_n_keys_all_to_it() -> None:
    workers = fleet(9)
    policy = ConsistentHashing()
    before = placement(policy, workers[:8])
    after = placement(policy, workers)
    moved = [key for key in KEYS if before[key] != after[key]]
    assert {after[key] for key in moved} == {workers[8].id}
    assert len(KEYS) / 9 * 0.5 < len(moved) < len(KEYS) / 9 * 1.5


def test_candidate_order_does_not_change_placement() -> None:
    workers = fleet(4)
    policy = ConsistentHashing()
    assert placement(policy, workers) == placement(policy, tuple(reversed(workers)))


def test_without_a_routing_key_requests_are_spread_at_random() -> None:
    workers = fleet(3)
    policy = ConsistentHashing()
    assert {policy.select(workers, ask()).id for _ in range(200)} == {"w0", "w1", "w2"}


def test_forget_drops_cached_rings() -> None:
    workers = fleet(3)
    policy = ConsistentHashing()
    before = placement(policy, workers)
    policy.forget("w1")
    assert placement(policy, workers) == before  # rebuilt the same from the same fleet
