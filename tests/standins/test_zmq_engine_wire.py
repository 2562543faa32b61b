"""The ZMQ stand-in's outputs byte for byte as vLLM's engine core lays them out: each message decoded
with a strict, complete layout (every field of the positional arrays present, every SchedulerStats
and PrefixCacheStats field present, in vLLM's order, no other) and encoded again as vLLM's msgspec
does (arrays of every field: ``omit_defaults`` does not apply to array-like Structs; dataclasses as
maps of every field) to the same bytes. And the gateway's own client reading both the older stats
layout and a newer one with extra fields."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from inference.upstreams.zmq import codec
from inference.upstreams.zmq.ranks import EngineRank
from standins.engine_core_wire import PREFIX_CACHE_STATS_FIELDS, SCHEDULER_STATS_FIELDS
from standins.fixtures import FIXTURE_MODELS
from standins.zmq_engine import ZmqEngineConfig, ZmqEngineGroup, scripted_model

QWEN = str(FIXTURE_MODELS / "qwen3")


class PrefixCacheStats(msgspec.Struct, forbid_unknown_fields=True):
    reset: bool
    requests: int
    queries: int
    hits: int
    preempted_requests: int
    preempted_queries: int
    preempted_hits: int


class SchedulerStats(msgspec.Struct, forbid_unknown_fields=True):
    """vLLM's SchedulerStats, every field required (a dataclass goes out as a map of all of them)."""

    num_running_reqs: int
    num_waiting_reqs: int
    step_counter: int
    current_wave: int
    kv_cache_usage: float
    encoder_cache_usage: float
    prefix_cache_stats: PrefixCacheStats
    connector_prefix_cache_stats: PrefixCacheStats | None
    kv_cache_eviction_events: list[Any]
    spec_decoding_stats: dict[str, Any] | None
    kv_connector_stats: dict[str, Any] | None
    waiting_lora_adapters: dict[str, int]
    running_lora_adapters: dict[str, int]
    cudagraph_stats: dict[str, Any] | None
    perf_stats: dict[str, Any] | None


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, forbid_unknown_fields=True):
    request_id: str
    new_token_ids: list[int]
    new_logprobs: Any = None
    new_prompt_logprobs_tensors: Any = None
    pooling_output: Any = None
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    events: list[Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    trace_headers: dict[str, str] | None = None
    num_cached_tokens: int = 0
    routed_experts: Any = None
    num_nans_in_logits: int = 0


class UtilityOutput(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    call_id: int
    failure_message: str | None = None
    result: Any = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, forbid_unknown_fields=True):
    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    finished_requests: list[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None


_STRICT = msgspec.msgpack.Decoder(EngineCoreOutputs)


def strict(payload: bytes) -> EngineCoreOutputs:
    """The message decoded with the strict layout, checked to be exactly what vLLM's msgspec sends."""
    message = _STRICT.decode(payload)
    assert msgspec.msgpack.encode(message) == payload
    raw = msgspec.msgpack.decode(payload)
    assert len(raw) == len(EngineCoreOutputs.__struct_fields__)
    assert all(len(output) == len(EngineCoreOutput.__struct_fields__) for output in raw[1])
    assert raw[4] is None or len(raw[4]) == len(UtilityOutput.__struct_fields__)
    if message.scheduler_stats is not None:
        assert tuple(raw[2]) == SCHEDULER_STATS_FIELDS == SchedulerStats.__struct_fields__
        assert tuple(raw[2]["prefix_cache_stats"]) == PREFIX_CACHE_STATS_FIELDS == PrefixCacheStats.__struct_fields__
    return message


class Binder:
    """The gateway's side of the sockets, raw: a handshake ROUTER, an input ROUTER, an output PULL."""

    def __init__(self, folder: str) -> None:
        self.context = zmq.asyncio.Context()
        self.handshake = self.context.socket(zmq.ROUTER)
        port = self.handshake.bind_to_random_port("tcp://127.0.0.1")
        self.handshake_address = f"tcp://127.0.0.1:{port}"
        self.inputs, self.outputs = f"ipc://{folder}/in", f"ipc://{folder}/out"
        self.input = self.context.socket(zmq.ROUTER)
        self.input.bind(self.inputs)
        self.output = self.context.socket(zmq.PULL)
        self.output.bind(self.outputs)

    async def accept(self, dp_size: int) -> list[bytes]:
        identities, ready = [], 0
        while ready < dp_size:  # one engine's READY may come before another's HELLO
            identity, payload = await self.handshake.recv_multipart()
            if codec.decode_handshake(payload)["status"] == "HELLO":
                init = codec.handshake_init([self.inputs], [self.outputs], data_parallel_size=dp_size)
                await self.handshake.send_multipart([identity, init])
                identities.append(identity)
            else:
                ready += 1
        for _ in range(dp_size):
            await self.input.recv_multipart()  # the ready responses
        return identities

    async def send(self, identity: bytes, kind: codec.RequestType, message: Any) -> None:
        await self.input.send_multipart([identity, kind.value, codec.encode(message)])

    async def until_finished(self, request_id: str) -> list[tuple[EngineCoreOutputs, list[bytes]]]:
        seen = []
        while True:
            frames = await self.output.recv_multipart()
            message = strict(frames[0])
            seen.append((message, frames[1:]))
            if any(o.request_id == request_id and o.finish_reason is not None for o in message.outputs):
                return seen

    def close(self) -> None:
        self.context.destroy(linger=0)


@pytest.fixture
async def binder() -> AsyncIterator[Binder]:
    with tempfile.TemporaryDirectory(prefix="zmqwire", dir="/tmp") as folder:
        b = Binder(folder)
        yield b
        b.close()


def _add(request_id: str, prompt: list[int], eos: int | None, **sampling: Any) -> codec.EngineCoreRequest:
    return codec.EngineCoreRequest(
        request_id=request_id, prompt_token_ids=prompt, mm_features=None,
        sampling_params=codec.SamplingParams(**sampling), pooling_params=None, eos_token_id=eos, arrival_time=0.0,
        lora_request=None, cache_salt=None, data_parallel_rank=None,
    )  # fmt: skip


async def test_every_output_has_vllms_complete_layout(binder: Binder) -> None:
    config = ZmqEngineConfig(tokenizer=QWEN, chunk_tokens=2)
    model = scripted_model(config)
    group = ZmqEngineGroup(config, binder.handshake_address)
    await group.start()
    try:
        (identity,) = await binder.accept(1)
        prompt = list(model.tokenizer.encode("Hello there").ids)
        await binder.send(identity, codec.RequestType.ADD, _add("r-1", prompt, model.eos_token_id, max_tokens=5,
                                                               logprobs=2, prompt_logprobs=1))  # fmt: skip
        seen = await binder.until_finished("r-1")
        steps = [message for message, _aux in seen]
        assert all(m.scheduler_stats is not None and m.utility_output is None for m in steps)
        assert [o.finish_reason for m in steps for o in m.outputs][-1] == codec.WireFinishReason.LENGTH
        assert sum(len(o.new_token_ids) for m in steps for o in m.outputs) == 5
        assert all(m.finished_requests is None for m in steps)  # one engine: vLLM keeps no finished set
        assert steps[0].outputs[0].new_prompt_logprobs_tensors is not None
        assert all(o.new_logprobs is not None for m in steps for o in m.outputs)
        assert steps[-1].scheduler_stats is not None and steps[-1].scheduler_stats.prefix_cache_stats.requests == 1

        await binder.send(identity, codec.RequestType.UTILITY, [0, 7, "is_sleeping", []])
        utility = strict(await binder.output.recv())
        assert utility.utility_output == UtilityOutput(call_id=7)
        assert utility.scheduler_stats is None and utility.outputs == []

        await binder.send(identity, codec.RequestType.ADD, _add("r-2", [], model.eos_token_id))
        (refused, _), = await binder.until_finished("r-2")  # fmt: skip
        assert refused.outputs == [EngineCoreOutput("r-2", [], finish_reason=codec.WireFinishReason.ERROR)]
    finally:
        await group.stop()


async def test_a_data_parallel_group_sends_finished_requests_and_the_wave_end(binder: Binder) -> None:
    config = ZmqEngineConfig(tokenizer=QWEN, chunk_tokens=8)
    model = scripted_model(config)
    group = ZmqEngineGroup(config, binder.handshake_address, dp_size=2)
    await group.start()
    try:
        assert sorted(await binder.accept(2)) == [codec.engine_identity(0), codec.engine_identity(1)]
        prompt = list(model.tokenizer.encode("Hello").ids)
        await binder.send(codec.engine_identity(1), codec.RequestType.ADD, _add("r-1", prompt, None, max_tokens=3))
        seen = await binder.until_finished("r-1")
        last = seen[-1][0]
        assert last.engine_index == 1 and last.finished_requests == ["r-1"]
        wave = strict(await binder.output.recv())
        assert wave.wave_complete == 0 and wave.scheduler_stats is None and wave.outputs == []
    finally:
        await group.stop()


@pytest.mark.parametrize(
    "stats",
    [
        # vLLM before the preempted counts and the eviction events (and the stand-in before them)
        {"num_running_reqs": 2, "num_waiting_reqs": 1, "step_counter": 4, "current_wave": 0, "kv_cache_usage": 0.25,
         "prefix_cache_stats": {"reset": False, "requests": 2, "queries": 10, "hits": 5},
         "connector_prefix_cache_stats": None, "spec_decoding_stats": None, "kv_connector_stats": None},
        # a newer one: every field of today's, and fields we do not know yet
        {"num_running_reqs": 2, "num_waiting_reqs": 1, "num_skipped_waiting_reqs": 3, "step_counter": 4,
         "current_wave": 0, "kv_cache_usage": 0.25, "encoder_cache_usage": 0.5,
         "prefix_cache_stats": {"reset": False, "requests": 2, "queries": 10, "hits": 5, "preempted_requests": 1,
                                "preempted_queries": 4, "preempted_hits": 2, "later": [1]},
         "connector_prefix_cache_stats": None, "kv_cache_eviction_events": [{"lifetime_seconds": 1.0}],
         "spec_decoding_stats": None, "kv_connector_stats": None, "waiting_lora_adapters": {"a": 1},
         "running_lora_adapters": {}, "cudagraph_stats": None, "perf_stats": None, "later": {"x": 1}},
    ],
    ids=["older", "newer"],
)
def test_the_gateways_client_reads_older_and_newer_stats(stats: dict[str, Any]) -> None:
    outputs = codec.decode_outputs(msgspec.msgpack.encode([0, [], stats, 1.0]))
    rank = EngineRank(index=0, ready_response={"block_size": 16, "num_gpu_blocks": 100, "max_num_seqs": 8},
                      stats=outputs.scheduler_stats or {})  # fmt: skip
    load = rank.load()
    assert (load["num_running_reqs"], load["num_waiting_reqs"], load["token_usage"]) == (2, 1, 0.25)
    assert load["cache_hit_rate"] == 0.5 and load["num_used_tokens"] == 400
