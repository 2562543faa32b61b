"""The gRPC engine stand-in's TensorRT-LLM, TokenSpeed and MLX services (and Embed), talked to with the
project's raw stubs: the wire shapes their own servicers send, the RPCs each proto declares and no
others, and one service per server."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from django.core.management.base import CommandParser

from inference.upstreams.grpc.detect import HEALTH_PROBES
from protos import common_pb2
from protos import mlx_engine_pb2 as mx
from protos import mlx_engine_pb2_grpc as mx_rpc
from protos import sglang_scheduler_pb2 as sg
from protos import sglang_scheduler_pb2_grpc as sg_rpc
from protos import tokenspeed_scheduler_pb2 as ts
from protos import tokenspeed_scheduler_pb2_grpc as ts_rpc
from protos import trtllm_service_pb2 as tr
from protos import trtllm_service_pb2_grpc as tr_rpc
from protos import vllm_engine_pb2 as vl
from protos import vllm_engine_pb2_grpc as vl_rpc
from standins.grpc_engine import EMBEDDING_DIM, RUNTIMES, GrpcEngineConfig, GrpcEngineServer, Thinking, embedding_for
from standins.grpc_services import SERVICES
from standins.management.commands import runmockworker
from standins.fixtures import FIXTURE_MODELS as FIXTURES

QWEN = str(FIXTURES / "qwen3")
HELLO = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


async def _server(runtime: str, **options: Any) -> GrpcEngineServer:
    server = GrpcEngineServer(GrpcEngineConfig(runtime=runtime, tokenizer=QWEN, **options))
    await server.start()
    return server


@pytest.fixture
async def channel_to() -> AsyncIterator[Any]:
    """``await channel_to(runtime)``: (server, channel) for a fresh stand-in; all closed afterwards."""
    opened: list[tuple[GrpcEngineServer, grpc.aio.Channel]] = []

    async def open_one(runtime: str, **options: Any) -> tuple[GrpcEngineServer, grpc.aio.Channel]:
        server = await _server(runtime, **options)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        opened.append((server, channel))
        return server, channel

    yield open_one
    for server, channel in opened:
        await channel.close()
        await server.stop()


def test_every_runtime_has_a_service() -> None:
    assert set(SERVICES) == set(RUNTIMES) == {"sglang", "vllm", "trtllm", "tokenspeed", "mlx"}


async def test_trtllm_stream_shape(channel_to: Any) -> None:
    server, channel = await channel_to("trtllm")
    model = server.engine.model
    prompt = model.encode(HELLO)
    request = tr.GenerateRequest(
        request_id="t1",
        tokenized=tr.TokenizedInput(input_token_ids=prompt),
        sampling_config=tr.SamplingConfig(beam_width=1, num_return_sequences=2),
        output_config=tr.OutputConfig(logprobs=1),
        max_tokens=100,
        streaming=True,
    )
    responses = [r async for r in tr_rpc.TrtllmServiceStub(channel).Generate(request)]
    assert {r.request_id for r in responses} == {"t1"}
    reply = [*model.encode(model.reply_text("text", Thinking.MODEL)), 151645]
    for index in (0, 1):
        chunks = [r.chunk for r in responses if r.WhichOneof("response") == "chunk" and r.chunk.sequence_index == index]
        streamed = [t for c in chunks for t in c.token_ids]
        assert streamed == reply
        assert [c.completion_tokens for c in chunks] == [sum(len(x.token_ids) for x in chunks[: i + 1]) for i in range(len(chunks))]
        assert all([e.token_id for e in c.logprobs] == list(c.token_ids) for c in chunks)
        [complete] = [r.complete for r in responses if r.WhichOneof("response") == "complete" and r.complete.sequence_index == index]
        assert list(complete.output_token_ids) == reply  # the whole choice again, unlike SGLang's
        assert (complete.finish_reason, complete.matched_token_id, complete.completion_tokens) == ("stop", 151645, len(reply))
        assert len(complete.logprobs) == len(reply)
    assert server.state.request("t1").n == 2


async def test_trtllm_needs_max_tokens_and_answers_a_status_word(channel_to: Any) -> None:
    server, channel = await channel_to("trtllm")
    stub = tr_rpc.TrtllmServiceStub(channel)
    request = tr.GenerateRequest(request_id="zero", tokenized=tr.TokenizedInput(input_token_ids=[9707]))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        [r async for r in stub.Generate(request)]
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in (error.value.details() or "")
    assert (await stub.HealthCheck(tr.HealthCheckRequest())).status == "OK"
    server.state.healthy = False
    assert (await stub.HealthCheck(tr.HealthCheckRequest())).status != "OK"
    info = await stub.GetModelInfo(tr.GetModelInfoRequest())
    assert (info.model_id, info.max_seq_len, info.vocab_size) == ("mock-model", 32768, server.engine.model.vocab_size)
    answer = await stub.Abort(tr.AbortRequest(request_id="nothing-running"))
    assert not answer.success and server.state.aborted_ids() == ["nothing-running"]


async def test_tokenspeed_stream_shape_is_sglangs(channel_to: Any) -> None:
    server, channel = await channel_to("tokenspeed")
    model = server.engine.model
    request = ts.GenerateRequest(
        request_id="s1", tokenized=ts.TokenizedInput(input_ids=model.encode(HELLO), original_text=HELLO), stream=True
    )
    responses = [r async for r in ts_rpc.TokenSpeedSchedulerStub(channel).Generate(request)]
    assert {r.request_id for r in responses} == {"s1"}
    chunks = [r.chunk for r in responses[:-1]]
    assert [c.completion_tokens for c in chunks] == [sum(len(x.token_ids) for x in chunks[: i + 1]) for i in range(len(chunks))]
    complete = responses[-1].complete
    assert list(complete.output_ids) == list(chunks[-1].token_ids)
    assert (complete.finish_reason, complete.matched_token_id) == ("stop", 151645)
    assert server.state.request("s1").prompt_matches


async def test_mlx_stream_shape_counts_per_chunk_and_one_choice(channel_to: Any) -> None:
    server, channel = await channel_to("mlx")
    model = server.engine.model
    request = mx.GenerateRequest(
        request_id="m1", tokenized=mx.TokenizedInput(input_ids=model.encode(HELLO)), stream=True,
        sampling_params=mx.SamplingParams(max_tokens=5),
    )
    responses = [r async for r in mx_rpc.MlxEngineStub(channel).Generate(request)]
    chunks = [r.chunk for r in responses if r.WhichOneof("response") == "chunk"]
    assert all(c.completion_tokens == len(c.token_ids) and c.index == 0 for c in chunks)
    complete = responses[-1].complete
    assert complete.finish_reason == "length" and not complete.HasField("matched_stop_token_id")
    assert list(complete.output_ids) == list(chunks[-1].token_ids)

    text_input = mx.GenerateRequest(request_id="m2", text="Hello")
    with pytest.raises(grpc.aio.AioRpcError) as error:
        [r async for r in mx_rpc.MlxEngineStub(channel).Generate(text_input)]
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    whole = mx.GenerateRequest(request_id="m3", tokenized=mx.TokenizedInput(input_ids=[9707]))
    [response] = [r async for r in mx_rpc.MlxEngineStub(channel).Generate(whole)]
    assert response.complete.matched_stop_token_id == 151645


async def test_only_its_own_service_answers_health_checks(channel_to: Any) -> None:
    for runtime in RUNTIMES:
        server, channel = await channel_to(runtime)
        for probed, probe in HEALTH_PROBES.items():
            if probed == runtime:
                await probe(channel, (), 5.0)
                continue
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await probe(channel, (), 5.0)
            assert error.value.code() is grpc.StatusCode.UNIMPLEMENTED, (runtime, probed)
        assert server.state.health_checks == 1


@pytest.mark.parametrize(
    ("runtime", "service"),
    [
        ("trtllm", "trtllm.TrtllmService"),
        ("mlx", "mlx.grpc.engine.MlxEngine"),
        ("tokenspeed", "tokenspeed.grpc.scheduler.TokenSpeedScheduler"),
    ],
)
async def test_rpcs_the_proto_does_not_declare_are_unimplemented(channel_to: Any, runtime: str, service: str) -> None:
    server, channel = await channel_to(runtime)
    undeclared = {
        "trtllm": ("FlushCache", "StartProfile", "GetLoads"),
        "mlx": ("FlushCache", "StartProfile", "GetLoads", "Embed"),
        "tokenspeed": ("Embed", "LoadLoRAAdapter"),
    }[runtime]
    for rpc in undeclared:
        call = channel.unary_unary(
            f"/{service}/{rpc}",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=common_pb2.FlushCacheResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call(common_pb2.FlushCacheRequest())
        assert error.value.code() is grpc.StatusCode.UNIMPLEMENTED, rpc
    assert server.state.flushes == 0 and server.state.profiles == []


async def test_embed_on_the_three_runtimes_that_have_it(channel_to: Any) -> None:
    ids = [9707, 1879, 1052]
    calls = {
        "sglang": lambda channel: sg_rpc.SglangSchedulerStub(channel).Embed(
            sg.EmbedRequest(request_id="e", tokenized=sg.TokenizedInput(input_ids=ids, original_text="Hi"))
        ),
        "vllm": lambda channel: vl_rpc.VllmEngineStub(channel).Embed(
            vl.EmbedRequest(request_id="e", tokenized=vl.TokenizedInput(input_ids=ids, original_text="Hi"))
        ),
        "trtllm": lambda channel: tr_rpc.TrtllmServiceStub(channel).Embed(
            tr.EmbedRequest(request_id="e", tokenized=tr.TokenizedInput(input_token_ids=ids, original_text="Hi"))
        ),
    }
    for runtime, call in calls.items():
        server, channel = await channel_to(runtime)
        answer = await call(channel)
        assert list(answer.embedding) == pytest.approx(embedding_for(tuple(ids)), abs=1e-6)
        assert answer.prompt_tokens == 3 and len(answer.embedding) == EMBEDDING_DIM
        if runtime != "trtllm":
            assert answer.embedding_dim == EMBEDDING_DIM
        [record] = server.state.embeds
        assert (record.request_id, record.input_ids, record.original_text) == ("e", tuple(ids), "Hi")


def test_the_embedding_is_deterministic_normalised_and_order_sensitive() -> None:
    first = embedding_for((1, 2, 3))
    assert first == embedding_for((1, 2, 3)) and len(first) == EMBEDDING_DIM
    assert math.isclose(sum(v * v for v in first), 1.0)
    assert first != embedding_for((3, 2, 1))


@pytest.mark.parametrize("runtime", ["trtllm", "tokenspeed", "mlx"])
def test_management_command_serves_each_runtime(monkeypatch: pytest.MonkeyPatch, runtime: str) -> None:
    calls: list[GrpcEngineConfig] = []
    monkeypatch.setattr(runmockworker, "run_grpc_engine", lambda config, host, port: calls.append(config))
    command = runmockworker.Command()
    parser: CommandParser = command.create_parser("manage.py", "runmockworker")
    command.handle(**vars(parser.parse_args(["--grpc", "--runtime", runtime, "--tokenizer", QWEN, "--port", "0"])))
    assert calls == [GrpcEngineConfig(runtime=runtime, tokenizer=QWEN)]
