"""The vLLM-style KV handoff of a sequential PD request: NIXL tags and relays, Mooncake mints or
falls back to the typed host/port, passthrough relays what comes back, n > 1 relays nothing."""

from __future__ import annotations

import orjson

from inference.upstreams.pd_kv import (
    NIXL_PREFILL_KV_PARAMS, DecodeKv, KvMode, effective_kv_engine_id, kv_plan,
)


def test_nixl_tags_the_prefill_and_relays_what_it_returns() -> None:
    plan = kv_plan("NixlConnector", "p", 9000, None)
    assert plan.mode is KvMode.NIXL and plan.prefill_json == NIXL_PREFILL_KV_PARAMS
    assert plan.decode('{"remote_block_ids":[1]}') == (DecodeKv(json='{"remote_block_ids":[1]}'), False)
    assert plan.decode(None) == (DecodeKv(), True)  # expected a handoff: a KV transfer failure


def test_mooncake_with_an_engine_id_mints_a_transfer_id_for_both_legs() -> None:
    plan = kv_plan("MooncakeConnector", "prefill-host", None, "engine-7")
    assert plan.mode is KvMode.MOONCAKE and plan.transfer_id is not None and plan.transfer_id.startswith("xfer-")
    assert orjson.loads(plan.prefill_json or "") == {
        "do_remote_decode": True, "do_remote_prefill": False, "transfer_id": plan.transfer_id,
    }
    decode, failed = plan.decode(None)
    assert not failed and orjson.loads(decode.json or "") == {
        "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": plan.transfer_id,
        "remote_engine_id": "engine-7", "remote_bootstrap_addr": "http://prefill-host:8998",
    }


def test_mooncake_without_an_engine_id_sends_the_typed_host_and_port() -> None:
    plan = kv_plan("MooncakeConnector", "prefill-host", 9100, "")
    assert plan.prefill_json is None and plan.transfer_id is None
    assert plan.decode(None) == (DecodeKv(remote_host="prefill-host", remote_port=9100), False)


def test_more_than_one_choice_relays_nothing() -> None:
    assert kv_plan("NixlConnector", "p", None, None, n=2).prefill_json is None
    assert kv_plan("NixlConnector", "p", None, None, n=2).decode('{"x":1}') == (DecodeKv(), False)
    assert kv_plan("MooncakeConnector", "p", None, "e", n=3).transfer_id is None


def test_passthrough_relays_whatever_came_back() -> None:
    plan = kv_plan(None, "p", None, None)
    assert plan.mode is KvMode.PASSTHROUGH and plan.prefill_json is None
    assert plan.decode('{"a":1}') == (DecodeKv(json='{"a":1}'), False)
    assert plan.decode(None) == (DecodeKv(), False)


def test_the_effective_engine_id_needs_a_pinned_rank_under_data_parallelism() -> None:
    assert effective_kv_engine_id("e", None, None) == "e"
    assert effective_kv_engine_id("e", 2, 1) == "e_dp1"
    assert effective_kv_engine_id("e", 2, None) is None
    assert effective_kv_engine_id("", 1, None) is None
