"""manual: sticky placement by routing key."""

from __future__ import annotations

from inference.routing.policies import Manual

from tests.inference.routing.handles import ask, fleet


def test_first_request_picks_the_least_loaded_and_later_ones_stick() -> None:
    workers = fleet(3)
    workers[0].load.in_flight = 5
    workers[1].load.in_flight = 1
    policy = Manual()
    first = policy.select(workers, ask(key="conversation-1"))
    assert first is workers[2]
    workers[2].load.in_flight = 50  # load no longer matters for this key
    assert all(policy.select(workers, ask(key="conversation-1")) is first for _ in range(5))
    assert policy.select(workers, ask(key="conversation-2")) is workers[1]


def test_a_key_is_placed_again_when_its_worker_is_not_a_candidate() -> None:
    workers = fleet(3)
    policy = Manual()
    first = policy.select(workers, ask(key="k"))
    remaining = tuple(worker for worker in workers if worker is not first)
    second = policy.select(remaining, ask(key="k"))
    assert second in remaining
    assert policy.select(workers, ask(key="k")) is second  # remembered anew, even once first is back


def test_keys_are_per_model() -> None:
    workers = fleet(2)
    workers[0].load.in_flight = 1
    policy = Manual()
    assert policy.select(workers, ask(key="k", model="a")) is workers[1]
    workers[1].load.in_flight = 2
    assert policy.select(workers, ask(key="k", model="b")) is workers[0]
    assert policy.select(workers, ask(key="k", model="a")) is workers[1]


def test_without_a_key_it_is_least_load() -> None:
    workers = fleet(3)
    workers[0].load.in_flight = 2
    workers[1].load.in_flight = 1
    workers[2].load.in_flight = 3
    policy = Manual()
    assert policy.select(workers, ask()) is workers[1]
    assert len(policy) == 0


def test_the_table_is_a_bounded_lru() -> None:
    workers = fleet(2)
    policy = Manual(max_entries=3)
    for key in ("a", "b", "c"):
        policy.select(workers, ask(key=key))
    policy.select(workers, ask(key="a"))  # refresh a; b is now the oldest
    policy.select(workers, ask(key="d"))
    assert len(policy) == 3
    assert ("m", "b") not in policy._sticky and ("m", "a") in policy._sticky


def test_long_keys_are_stored_as_a_digest() -> None:
    workers = fleet(2)
    policy = Manual()
    key = "x" * 10_000
    first = policy.select(workers, ask(key=key))
    assert policy.select(workers, ask(key=key)) is first
    assert all(len(stored) < 64 for _, stored in policy._sticky)


def test_forget_drops_the_workers_keys() -> None:
    workers = fleet(2)
    policy = Manual()
    owner = policy.select(workers, ask(key="k"))
    owner.load.in_flight = 1
    assert policy.select(workers, ask(key="other")) is not owner
    policy.forget(owner.id)
    assert owner.id not in policy._sticky.values()
    assert len(policy) == 1
