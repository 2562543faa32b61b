"""PolicySet: --policy for every model, --model-policy overrides, and forgetting departed workers."""

from __future__ import annotations

from typing import Sequence

import pytest

from common.config import parse_gateway_args
from inference.routing import selection
from inference.routing.policies import CacheAware, LeastLoad, Manual, PolicySet, RoundRobin, SelectionRequest
from inference.routing.registry import WorkerRegistry
from inference.routing.workers import WorkerHandle, WorkerRecord
from inference.routing.selection import select_worker

SYSTEM = "Answer in French. " * 50


def record(worker_id: str, model: str) -> WorkerRecord:
    return WorkerRecord(id=worker_id, url=f"http://{worker_id}", model_id=model, runtime_type="sglang", status="ready")


def chat(text: str, model: str = "llama") -> dict:
    return {"model": model, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]}


def test_model_policy_overrides_the_default_for_that_model_only() -> None:
    config = parse_gateway_args(
        ["--policy", "least_load", "--model-policy", "llama=cache_aware", "--model-policy", "qwen=cache_aware",
         "--cache-threshold", "0.6", "--max-tree-size", "1000"]
    )
    policies = PolicySet.from_config(config)
    llama = policies.for_model("llama")
    assert isinstance(llama, CacheAware)
    assert (llama.cache_threshold, llama.max_tree_size) == (0.6, 1000)
    assert policies.for_model("qwen") is not llama  # each override has its own state
    assert isinstance(policies.for_model("mistral"), LeastLoad)
    assert isinstance(policies.for_model(""), LeastLoad)


def test_model_policy_may_name_an_alias() -> None:
    config = parse_gateway_args(["--model-alias", "fast=llama-3-8b", "--model-policy", "fast=manual"])
    assert isinstance(PolicySet.from_config(config).for_model("llama-3-8b"), Manual)


def test_select_worker_uses_each_models_policy() -> None:
    registry = WorkerRegistry()
    snap = registry.publish(
        [record("l0", "llama"), record("l1", "llama"), record("l2", "llama"), record("m0", "mistral"), record("m1", "mistral")], {}
    )
    policies = PolicySet.from_config(parse_gateway_args(["--model-policy", "llama=cache_aware"]))
    first = select_worker(snap, "llama", policies, body=chat("one")).worker
    for question in ("two", "three", "four"):
        assert select_worker(snap, "llama", policies, body=chat(question)).worker is first
    # mistral keeps round robin
    assert [select_worker(snap, "mistral", policies, body=chat("x", "mistral")).worker.id for _ in range(4)] == [
        "m0", "m1", "m0", "m1"
    ]


def test_request_text_is_only_computed_for_policies_that_need_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(body: object) -> str:
        raise AssertionError("request_text called")

    monkeypatch.setattr(selection, "request_text", explode)
    snap = WorkerRegistry().publish([record("w0", "m"), record("w1", "m")], {})
    select_worker(snap, "m", PolicySet(RoundRobin()), body=chat("hi", "m"))
    with pytest.raises(AssertionError):
        select_worker(snap, "m", PolicySet(CacheAware()), body=chat("hi", "m"))


def test_routing_key_reaches_the_policy() -> None:
    snap = WorkerRegistry().publish([record("w0", "m"), record("w1", "m"), record("w2", "m")], {})
    policies = PolicySet(Manual())
    first = select_worker(snap, "m", policies, routing_key="abc").worker
    first.load.in_flight = 9
    assert select_worker(snap, "m", policies, routing_key="abc").worker is first


class Spy:
    name = "spy"
    needs_text = False

    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def select(self, candidates: Sequence[WorkerHandle], request: SelectionRequest) -> WorkerHandle:
        return candidates[0]

    def forget(self, worker_id: str) -> None:
        self.forgotten.append(worker_id)


def test_workers_that_leave_the_registry_are_forgotten_by_every_policy() -> None:
    registry = WorkerRegistry()
    default, override = Spy(), Spy()
    policies = PolicySet(default, {"llama": override})
    snap = registry.publish([record("w0", "m"), record("w1", "m")], {})
    select_worker(snap, "m", policies)
    select_worker(snap, "m", policies)
    assert default.forgotten == []
    snap = registry.publish([record("w1", "m")], {})
    select_worker(snap, "m", policies)
    assert default.forgotten == override.forgotten == ["w0"]
    snap = registry.publish([record("w1", "m"), WorkerRecord("w2", "http://w2", "m", "sglang", "pending")], {})
    select_worker(snap, "m", policies)
    assert default.forgotten == ["w0"]  # a worker that is only not ready is still registered
