"""Selection policies and model resolution over a registry snapshot."""

from __future__ import annotations

from collections import Counter

import pytest

from inference import errors
from inference.routing.policies import LeastLoad, PolicySet, PowerOfTwo, RandomChoice, RoundRobin, make_policy
from inference.routing.registry import WorkerRegistry
from inference.routing.workers import WorkerRecord
from inference.routing import selection
from inference.routing.breaker import BreakerState
from inference.routing.selection import select_worker


def publish(*specs: tuple[str, str | None, str], aliases: dict[str, str] | None = None):
    registry = WorkerRegistry()
    records = [WorkerRecord(id=f"w{i}", url=url, model_id=model, runtime_type="sglang", status=status) for i, (url, model, status) in enumerate(specs)]
    return registry, registry.publish(records, aliases or {})


def test_round_robin_cycles_per_model() -> None:
    _, snap = publish(("http://a", "m", "ready"), ("http://b", "m", "ready"), ("http://c", "m", "ready"))
    policy = PolicySet(RoundRobin())
    picked = [select_worker(snap, "m", policy).worker.url for _ in range(6)]
    assert picked == ["http://a", "http://b", "http://c"] * 2


def test_random_uses_every_worker() -> None:
    _, snap = publish(("http://a", "m", "ready"), ("http://b", "m", "ready"))
    seen = Counter(select_worker(snap, "m", PolicySet(RandomChoice())).worker.url for _ in range(200))
    assert set(seen) == {"http://a", "http://b"}


def test_least_load_prefers_fewest_in_flight() -> None:
    _, snap = publish(("http://a", "m", "ready"), ("http://b", "m", "ready"))
    snap.workers[0].load.in_flight = 3
    assert select_worker(snap, "m", PolicySet(LeastLoad())).worker.url == "http://b"
    snap.workers[1].load.in_flight = 5
    assert select_worker(snap, "m", PolicySet(LeastLoad())).worker.url == "http://a"


def test_power_of_two_never_picks_the_busier_of_two() -> None:
    _, snap = publish(("http://a", "m", "ready"), ("http://b", "m", "ready"))
    snap.workers[0].load.in_flight = 10
    assert {select_worker(snap, "m", PolicySet(PowerOfTwo())).worker.url for _ in range(50)} == {"http://b"}


def test_load_survives_snapshot_rebuilds() -> None:
    registry, snap = publish(("http://a", "m", "ready"))
    snap.workers[0].load.in_flight = 2
    again = registry.publish([snap.workers[0].record], {})
    assert again.workers[0].load.in_flight == 2


def test_alias_resolves_to_canonical_model() -> None:
    _, snap = publish(("http://a", "llama", "ready"), aliases={"fast": "llama"})
    decision = select_worker(snap, "fast", PolicySet(RoundRobin()))
    assert decision.model == "llama" and decision.worker.url == "http://a"


def test_not_ready_workers_are_skipped() -> None:
    _, snap = publish(("http://a", "m", "pending"), ("http://b", "m", "ready"))
    assert {select_worker(snap, "m", PolicySet(RoundRobin())).worker.url for _ in range(4)} == {"http://b"}


def test_unknown_model_is_404_and_known_unready_is_503() -> None:
    _, snap = publish(("http://a", "m", "pending"))
    with pytest.raises(errors.GatewayError) as unready:
        select_worker(snap, "m", PolicySet(RoundRobin()))
    assert unready.value.status == 503
    with pytest.raises(errors.GatewayError) as unknown:
        select_worker(snap, "other", PolicySet(RoundRobin()))
    assert unknown.value.status == 404 and unknown.value.code == "model_not_found"


def test_undiscovered_worker_makes_unknown_models_503() -> None:
    _, snap = publish(("http://a", None, "pending"))
    with pytest.raises(errors.GatewayError) as exc:
        select_worker(snap, "anything", PolicySet(RoundRobin()))
    assert exc.value.status == 503


def test_worker_without_model_list_serves_any_model() -> None:
    _, snap = publish(("http://a", None, "ready"))
    assert select_worker(snap, "whatever", PolicySet(RoundRobin())).worker.url == "http://a"


def test_no_model_means_any_ready_worker() -> None:
    _, snap = publish(("http://a", "m1", "ready"), ("http://b", "m2", "ready"))
    policy = PolicySet(RoundRobin())
    assert {select_worker(snap, None, policy).worker.url for _ in range(4)} == {"http://a", "http://b"}


def test_make_policy_knows_every_policy() -> None:
    for name in ("round_robin", "random", "power_of_two", "least_load", "cache_aware", "consistent_hashing", "manual"):
        assert make_policy(name).name == name
    with pytest.raises(ValueError):
        make_policy("cache_aware_typo")


def test_a_usable_pick_is_taken_without_scanning_the_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """At a thousand workers a request costs what the policy costs: the pick is checked, the fleet is
    filtered only when the pick may not take traffic."""
    _, snap = publish(*((f"http://w{i}", "m", "ready") for i in range(1000)))
    policies = PolicySet(RoundRobin())
    monkeypatch.setattr(selection, "_usable", lambda *args: pytest.fail("scanned the fleet"))
    assert [select_worker(snap, "m", policies).worker.url for _ in range(3)] == ["http://w0", "http://w1", "http://w2"]


def test_an_unusable_pick_falls_back_to_a_usable_worker() -> None:
    _, snap = publish(("http://a", "m", "ready"), ("http://b", "m", "ready"), ("http://c", "m", "ready"))
    snap.workers[0].load.overloaded = True
    snap.workers[1].load.breaker.state = BreakerState.OPEN
    snap.workers[1].load.breaker.opened_at = float("inf")  # stays open
    policies = PolicySet(RoundRobin())
    assert {select_worker(snap, "m", policies).worker.url for _ in range(6)} == {"http://c"}
