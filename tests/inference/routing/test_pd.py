"""PD pair selection: pairing keys, the prefill and decode policies, 503 no_prefill_servers, the
smaller context window of a pair, and the bootstrap fields injected."""

from __future__ import annotations

import pytest

from inference.errors import GatewayError
from inference.routing.pd import (
    MAX_GRPC_ROOM, PdMember, PdTraits, batch_size, grpc_room, http_room, inject_bootstrap, pair_context_length,
    build_pd_pool, pd_pairing, select_pair,
)
from inference.routing.policies import RoundRobin
from inference.routing.workers import WorkerHandle, WorkerLoad, WorkerRecord, WorkerStatus, WorkerType
from tests.inference.routing.handles import ask


def member(name: str, kind: WorkerType, runtime: str = "sglang", pairing: str | None = None, kv: str | None = None,
           port: int | None = None, context: int | None = None, url: str | None = None) -> PdMember:
    record = WorkerRecord(id=name, url=url or f"http://{name}:8000", model_id="m", runtime_type=runtime,
                          status=WorkerStatus.READY, worker_type=kind)
    return PdMember.of(WorkerHandle(record, WorkerLoad()), PdTraits(bootstrap_port=port, pairing_protocol=pairing, kv_connector=kv), context)


P, D = WorkerType.PREFILL, WorkerType.DECODE


def test_the_pairing_key_is_the_label_else_runtime_transport_layout() -> None:
    assert member("p", P, pairing="mooncake-v1").pairing == "mooncake-v1"
    assert member("p", P).pairing == "sglang/http/single"
    assert member("p", P, runtime="vllm", kv="NixlConnector", url="grpc://p:1").pairing == "vllm/grpc/single"
    record = member("p", P).handle.record
    assert pd_pairing(record, PdTraits(dp_size=2)) == "sglang/http/dp2"
    record = member("p", P).handle.record
    assert pd_pairing(record, PdTraits(pairing_protocol="x")) == "x"


def test_prefill_and_decode_pair_only_when_their_keys_are_equal() -> None:
    prefills = [member("p-sg", P), member("p-vl", P, runtime="vllm")]
    decodes = [member("d-vl", D, runtime="vllm")]
    for _ in range(4):
        pair = select_pair(prefills, decodes, "m", RoundRobin(), RoundRobin(), ask())
        assert (pair.prefill.handle.id, pair.decode.handle.id) == ("p-vl", "d-vl")
    labelled = [member("p1", P, pairing="a"), member("p2", P, pairing="b")]
    pair = select_pair(labelled, [member("d", D, pairing="b")], "m", RoundRobin(), RoundRobin(), ask())
    assert pair.prefill.handle.id == "p2"


def test_each_side_has_its_own_policy() -> None:
    prefills = [member("p1", P), member("p2", P)]
    decodes = [member("d1", D), member("d2", D)]
    prefill_policy, decode_policy = RoundRobin(), RoundRobin()
    picks = [select_pair(prefills, decodes, "m", prefill_policy, decode_policy, ask()) for _ in range(4)]
    assert [p.prefill.handle.id for p in picks] == ["p1", "p2", "p1", "p2"]
    assert [p.decode.handle.id for p in picks] == ["d1", "d2", "d1", "d2"]


def test_no_prefill_worker_is_503_no_prefill_servers() -> None:
    with pytest.raises(GatewayError) as caught:
        select_pair([], [member("d", D)], "m", RoundRobin(), RoundRobin(), ask())
    assert (caught.value.status, caught.value.code, caught.value.error_type) == (503, "no_prefill_servers", "service_unavailable")
    with pytest.raises(GatewayError) as caught:
        select_pair([member("p", P)], [member("d", D)], "m", RoundRobin(), RoundRobin(), ask(), exclude=frozenset({"p"}))
    assert caught.value.code == "no_prefill_servers"


def test_no_decode_to_pair_with_is_503_no_healthy_workers() -> None:
    with pytest.raises(GatewayError) as caught:
        select_pair([member("p", P)], [member("d", D, runtime="vllm")], "m", RoundRobin(), RoundRobin(), ask())
    assert (caught.value.status, caught.value.code) == (503, "no_healthy_workers")


def test_a_pair_held_only_by_overload_is_the_overload_shed() -> None:
    """What PD admission waits on: a pair could take the request but for overload protection."""
    busy_decode, calm_prefill = member("d", D), member("p", P)
    busy_decode.handle.load.overloaded = True
    with pytest.raises(GatewayError) as caught:
        select_pair([calm_prefill], [busy_decode], "m", RoundRobin(), RoundRobin(), ask())
    assert (caught.value.status, caught.value.code) == (503, "worker_overload_protection_shed")
    assert dict(caught.value.headers)[b"retry-after"] == b"10"  # the load-monitor interval
    busy_prefill = member("p2", P)
    busy_prefill.handle.load.overloaded = True
    with pytest.raises(GatewayError) as caught:
        select_pair([busy_prefill], [member("d2", D)], "m", RoundRobin(), RoundRobin(), ask())
    assert caught.value.code == "worker_overload_protection_shed"
    # An overloaded worker that could not pair anyway is not waited on.
    with pytest.raises(GatewayError) as caught:
        select_pair([busy_prefill], [member("d3", D, runtime="vllm")], "m", RoundRobin(), RoundRobin(), ask())
    assert caught.value.code == "no_prefill_servers"
    # A free pair beside an overloaded one is chosen at once.
    pair = select_pair([busy_prefill, calm_prefill], [member("d4", D)], "m", RoundRobin(), RoundRobin(), ask())
    assert pair.prefill.handle.id == "p"


def test_the_pair_context_window_is_the_smaller_one() -> None:
    pair = select_pair([member("p", P, context=8192)], [member("d", D, context=4096)], "m", RoundRobin(), RoundRobin(), ask())
    assert pair.context_length == 4096
    assert pair_context_length(None, 2048) == 2048 and pair_context_length(1024, None) == 1024
    assert pair_context_length(None, None) is None


def test_bootstrap_fields_name_the_prefill_worker() -> None:
    prefill = member("prefill-host", P, port=9100)
    body = inject_bootstrap({"model": "m"}, prefill)
    assert body["bootstrap_host"] == "prefill-host" and body["bootstrap_port"] == 9100
    assert isinstance(body["bootstrap_room"], int) and 0 <= body["bootstrap_room"] <= 2**63 - 1
    batch = inject_bootstrap({"model": "m"}, member("p", P), 2)
    assert batch["bootstrap_port"] == [None, None] and batch["bootstrap_host"] == ["p", "p"]
    assert len(batch["bootstrap_room"]) == 2


def test_rooms_are_in_range() -> None:
    assert all(0 <= http_room() <= 2**63 - 1 for _ in range(100))
    assert all(0 <= grpc_room() <= MAX_GRPC_ROOM < 2**31 - 1 for _ in range(100))


def test_batch_sizes_as_the_reference_counts_them() -> None:
    assert batch_size("/v1/completions", {"prompt": ["a", "b"]}) == 2
    assert batch_size("/v1/completions", {"prompt": [1, 2, 3]}) is None
    assert batch_size("/v1/completions", {"prompt": "a"}) is None
    assert batch_size("/generate", {"input_ids": [[1], [2]]}) == 2
    assert batch_size("/generate", {"text": ["a", "b", "c"]}) == 3
    assert batch_size("/v1/chat/completions", {"n": 3}) == 3
    assert batch_size("/v1/chat/completions", {"n": 1}) is None


def test_the_pool_holds_ready_prefill_and_decode_workers_per_model() -> None:
    def handle(name: str, kind: WorkerType, model: str | None = "m", status: str = "ready") -> WorkerHandle:
        record = WorkerRecord(id=name, url=f"http://{name}:1", model_id=model, runtime_type="sglang",
                              status=WorkerStatus(status), worker_type=kind)
        return WorkerHandle(record, WorkerLoad())

    handles = [handle("p1", P), handle("p2", P, status="not_ready"), handle("d1", D), handle("d-any", D, model=None),
               handle("r", WorkerType.REGULAR)]
    pool = build_pd_pool(handles, lambda record: PdTraits(bootstrap_port=9000 if record.id == "p1" else None))
    prefills, decodes = pool.members("m")
    assert [m.handle.id for m in prefills] == ["p1"] and prefills[0].traits.bootstrap_port == 9000
    assert [m.handle.id for m in decodes] == ["d1"]
    prefills, decodes = pool.members("other")
    assert prefills == () and [m.handle.id for m in decodes] == ["d-any"]
    assert bool(pool) and not build_pd_pool([handle("r", WorkerType.REGULAR)], lambda record: PdTraits())
