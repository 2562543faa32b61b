"""The ZMQ codec against vLLM's layouts: positions in the msgpack arrays, keys in the maps, the
type bytes and codes (not just that our own encoder and decoder agree)."""

from __future__ import annotations

import msgspec
import pytest

from inference.upstreams.zmq import codec

REQUEST_FIELDS = (
    "request_id", "prompt_token_ids", "mm_features", "sampling_params", "pooling_params", "eos_token_id",
    "arrival_time", "lora_request", "cache_salt", "data_parallel_rank", "prompt_embeds", "client_index",
    "current_wave", "priority", "trace_headers", "external_req_id",
)  # fmt: skip
OUTPUT_FIELDS = (
    "request_id", "new_token_ids", "new_logprobs", "new_prompt_logprobs_tensors", "pooling_output",
    "finish_reason", "stop_reason", "events", "kv_transfer_params", "trace_headers", "num_cached_tokens",
    "routed_experts", "num_nans_in_logits",
)  # fmt: skip
OUTPUTS_FIELDS = (
    "engine_index", "outputs", "scheduler_stats", "timestamp", "utility_output", "finished_requests",
    "wave_complete", "start_wave",
)  # fmt: skip


def test_field_order_is_vllms() -> None:
    assert codec.EngineCoreRequest.__struct_fields__ == REQUEST_FIELDS
    assert codec.EngineCoreOutput.__struct_fields__ == OUTPUT_FIELDS
    assert codec.EngineCoreOutputs.__struct_fields__ == OUTPUTS_FIELDS
    assert codec.UtilityOutput.__struct_fields__ == ("call_id", "failure_message", "result")


def test_add_is_a_positional_array_with_sampling_params_as_a_map() -> None:
    params = codec.SamplingParams(temperature=0.0, top_k=5, max_tokens=7, stop_token_ids=[9], _eos_token_id=2)
    request = codec.EngineCoreRequest(
        request_id="r-1", prompt_token_ids=[1, 2, 3], mm_features=None, sampling_params=params,
        pooling_params=None, eos_token_id=2, arrival_time=12.5, lora_request=None, cache_salt="salt",
        data_parallel_rank=1, current_wave=4,
    )  # fmt: skip
    wire = msgspec.msgpack.decode(codec.encode(request))
    assert isinstance(wire, list)
    assert wire[0] == "r-1"
    assert wire[1] == [1, 2, 3]
    assert wire[2] is None
    assert wire[4] is None
    assert wire[5] == 2
    assert wire[6] == 12.5
    assert wire[7] is None
    assert wire[8] == "salt"
    assert wire[9] == 1
    assert wire[12] == 4  # current_wave
    sampling = wire[3]
    assert isinstance(sampling, dict)
    assert sampling["temperature"] == 0.0
    assert sampling["top_k"] == 5
    assert sampling["max_tokens"] == 7
    assert sampling["stop_token_ids"] == [9]
    assert sampling["_eos_token_id"] == 2
    assert "n" not in sampling and "ignore_eos" not in sampling and "seed" not in sampling  # vLLM's defaults
    assert codec.decode_request(codec.encode(request)) == request


def test_sampling_params_defaults_are_vllms() -> None:
    """Left out of the map, a field takes vLLM's default on the engine: max_tokens 16, top_k 0."""
    assert msgspec.msgpack.decode(codec.encode(codec.SamplingParams())) == {}
    assert codec.SamplingParams().max_tokens == 16
    assert codec.SamplingParams().top_k == 0
    assert msgspec.msgpack.decode(codec.encode(codec.SamplingParams(max_tokens=None))) == {"max_tokens": None}


def test_outputs_decode_from_vllms_positional_arrays() -> None:
    stats = {"num_running_reqs": 2, "num_waiting_reqs": 1, "kv_cache_usage": 0.25, "prefix_cache_stats": {"hits": 3}}
    wire = [
        1,  # engine_index
        [
            ["a", [5, 6]],  # trailing defaults omitted
            ["b", [7], None, None, None, 0, 7, None, None, None, 12],  # finished: stop on token 7, 12 cached
        ],
        stats,
        99.0,
        None,
        ["b"],
        3,  # wave_complete
    ]
    outputs = codec.decode_outputs(msgspec.msgpack.encode(wire))
    assert outputs.engine_index == 1
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outputs.outputs] == [
        ("a", [5, 6], None),
        ("b", [7], codec.WireFinishReason.STOP),
    ]
    assert outputs.outputs[1].stop_reason == 7
    assert outputs.outputs[1].num_cached_tokens == 12
    assert outputs.outputs[1].finished and not outputs.outputs[0].finished
    assert outputs.scheduler_stats == stats
    assert outputs.finished_requests == ["b"]
    assert outputs.wave_complete == 3 and outputs.start_wave is None


def test_outputs_with_a_utility_answer_and_an_extension_typed_tensor() -> None:
    tensor = msgspec.msgpack.Ext(3, b"\x00\x01")  # vLLM sends tensors as extension types
    wire = [0, [["a", [1], tensor]], None, 1.0, [77, None, None]]
    outputs = codec.decode_outputs(msgspec.msgpack.encode(wire))
    assert outputs.outputs[0].new_logprobs == b"\x00\x01"
    assert outputs.utility_output == codec.UtilityOutput(call_id=77)


def test_request_types_finish_reasons_and_the_death_frame() -> None:
    assert [t.value for t in codec.RequestType] == [b"\x00", b"\x01", b"\x02", b"\x03"]
    assert [t.name for t in codec.RequestType] == ["ADD", "ABORT", "START_DP_WAVE", "UTILITY"]
    assert [(r.name, r.value) for r in codec.WireFinishReason] == [("STOP", 0), ("LENGTH", 1), ("ABORT", 2), ("ERROR", 3)]
    assert codec.ENGINE_CORE_DEAD == b"ENGINE_CORE_DEAD"
    assert msgspec.msgpack.decode(codec.encode(["r-1", "r-2"])) == ["r-1", "r-2"]  # ABORT's payload


def test_identities_are_two_bytes_little_endian() -> None:
    assert codec.engine_identity(0) == b"\x00\x00"
    assert codec.engine_identity(1) == b"\x01\x00"
    assert codec.engine_identity(258) == b"\x02\x01"
    assert codec.engine_index(b"\x02\x01") == 258


def test_handshake_maps() -> None:
    assert msgspec.msgpack.decode(codec.handshake_hello()) == {"status": "HELLO", "local": False, "headless": True}
    init = msgspec.msgpack.decode(codec.handshake_init(["ipc:///x-in.sock"], ["ipc:///x-out.sock"], data_parallel_size=2))
    assert init == {
        "addresses": {
            "inputs": ["ipc:///x-in.sock"],
            "outputs": ["ipc:///x-out.sock"],
            "coordinator_input": None,
            "coordinator_output": None,
            "frontend_stats_publish_address": None,
        },
        "parallel_config": {"data_parallel_master_ip": "127.0.0.1", "data_parallel_master_port": 0, "data_parallel_size": 2},
    }
    assert msgspec.msgpack.decode(codec.handshake_ready(num_gpu_blocks=10)) == {
        "status": "READY", "local": False, "headless": True, "num_gpu_blocks": 10, "dp_stats_address": None,
    }  # fmt: skip


def test_handshake_and_ready_response_decoding() -> None:
    with pytest.raises(ValueError):
        codec.decode_handshake(b"\xc1")
    with pytest.raises(ValueError):
        codec.decode_handshake(msgspec.msgpack.encode([1, 2]))
    assert codec.decode_ready_response(b"") == {}  # older engines register with an empty frame
    ready = {"max_model_len": 4096, "block_size": 16, "data_parallel_rank": 1, "newer_field": True}
    assert codec.decode_ready_response(msgspec.msgpack.encode(ready)) == ready
