"""The gRPC engine clients (SGLang, vLLM) against the gRPC engine stand-in over loopback: a real
``grpc.aio`` server in the test's event loop, driven by a real fixture tokenizer."""

from __future__ import annotations

import asyncio
import io
import zipfile
from collections.abc import AsyncIterator

import pytest

from inference.routing.workers import Transport
from inference.upstreams.engine import (
    ENGINE_CLIENTS,
    Constraint,
    ConstraintKind,
    EngineKey,
    EngineOutput,
    EngineRequest,
    FinishReason,
    ProfileOptions,
    SamplingParams,
)
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.grpc import SglangClient, VllmClient, WorkerChannel, connect, detect_runtime
from inference.upstreams.grpc.client import GrpcEngineClient, WireChunk, _Choice
from protos import sglang_scheduler_pb2 as sglang_pb
from standins.grpc_engine import GrpcEngineConfig, GrpcEngineServer, Thinking
from tests.conftest import free_port, until
from standins.fixtures import FIXTURE_MODELS as FIXTURES

QWEN = str(FIXTURES / "qwen3")
PROMPT = "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
RUNTIMES = ("sglang", "vllm")
ALL_RUNTIMES = (*RUNTIMES, "trtllm", "tokenspeed", "mlx")  # what every runtime's client must do alike


async def _serve(runtime: str, **options: object) -> GrpcEngineServer:
    server = GrpcEngineServer(GrpcEngineConfig(runtime=runtime, tokenizer=QWEN, **options))  # type: ignore[arg-type]
    await server.start()
    return server


@pytest.fixture(params=RUNTIMES)
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[tuple[GrpcEngineServer, GrpcEngineClient[object]]]:
    server = await _serve(request.param)
    client = ENGINE_CLIENTS.get(EngineKey(Transport.GRPC, request.param))(server.url)
    assert isinstance(client, GrpcEngineClient)
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop()


def _request(server: GrpcEngineServer, request_id: str = "chatcmpl-1", **sampling: object) -> EngineRequest:
    ids = server.engine.model.encode(PROMPT)
    stream = bool(sampling.pop("stream", True))
    return EngineRequest(
        request_id=request_id,
        input_ids=ids,
        sampling=SamplingParams(**sampling),  # type: ignore[arg-type]
        stream=stream,
        original_text=PROMPT,
    )


async def _collect(client: GrpcEngineClient[object], request: EngineRequest) -> list[EngineOutput]:
    return [output async for output in client.generate(request)]


def _reply(server: GrpcEngineServer) -> list[int]:
    model = server.engine.model
    assert model.eos_token_id is not None
    return [*model.encode(model.reply_text("text", Thinking.MODEL)), model.eos_token_id]


async def test_generate_streams_the_scripted_tokens_with_finish_and_usage(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    request = _request(server)
    outputs = await _collect(client, request)

    reply = _reply(server)
    assert [token for output in outputs for token in output.token_ids] == reply
    assert all(len(output.token_ids) <= 3 for output in outputs)
    assert [output.finished for output in outputs] == [False] * (len(outputs) - 1) + [True]
    last = outputs[-1]
    assert last.finish is not None and last.finish.reason is FinishReason.STOP
    assert last.finish.matched_token_id == server.engine.model.eos_token_id
    assert (last.prompt_tokens, last.completion_tokens) == (len(request.input_ids), len(reply))
    # Counts are cumulative on both runtimes (vLLM reports per chunk; the client adds them up).
    counts = [output.completion_tokens for output in outputs]
    assert counts == sorted(counts) and counts[0] == len(outputs[0].token_ids)

    served = server.state.request("chatcmpl-1")
    assert served.prompt_matches and served.prompt_text == PROMPT
    assert served.input_ids == request.input_ids
    assert served.done and not served.cancelled and server.state.aborts == []


async def test_neutral_sampling_values_are_sent_explicitly(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    await _collect(client, _request(server, stop_token_ids=(151643,), ignore_eos=False))
    params = server.state.request("chatcmpl-1").sampling["sampling_params"]
    assert params["temperature"] == 1.0 and params["top_p"] == 1.0 and params["repetition_penalty"] == 1.0
    assert params["skip_special_tokens"] is True and params["stop_token_ids"] == [151643]
    if client.runtime == "sglang":
        assert params["top_k"] == -1 and params["n"] == 1
        assert server.state.request("chatcmpl-1").sampling["logprob_start_len"] == -1
    else:
        assert "top_k" not in params  # vLLM's top_k is unsigned: 0 (unset) means no top-k
    assert "max_new_tokens" not in params and "max_tokens" not in params  # unset: up to the context


async def test_greedy_temperature_zero_reaches_the_engine(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    await _collect(client, _request(server, temperature=0.0, max_new_tokens=0))
    params = server.state.request("chatcmpl-1").sampling["sampling_params"]
    if client.runtime == "vllm":  # proto3 optional there: the explicit 0 is on the wire
        assert params["temperature"] == 0.0 and params["max_tokens"] == 0
    else:
        assert params["max_new_tokens"] == 0


async def test_non_streaming_gives_every_token_in_one_output(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    outputs = await _collect(client, _request(server, stream=False))
    assert len(outputs) == 1
    assert list(outputs[0].token_ids) == _reply(server)
    assert outputs[0].completion_tokens == len(_reply(server))
    assert outputs[0].finish is not None and outputs[0].finish.reason is FinishReason.STOP


async def test_max_new_tokens_ends_with_length(engine: tuple[GrpcEngineServer, GrpcEngineClient[object]]) -> None:
    server, client = engine
    outputs = await _collect(client, _request(server, max_new_tokens=5))
    assert [t for o in outputs for t in o.token_ids] == _reply(server)[:5]
    assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.LENGTH
    assert outputs[-1].completion_tokens == 5


async def test_n_choices_are_told_apart_by_index(engine: tuple[GrpcEngineServer, GrpcEngineClient[object]]) -> None:
    server, client = engine
    outputs = await _collect(client, _request(server, n=2))
    for index in (0, 1):
        mine = [o for o in outputs if o.index == index]
        assert [t for o in mine for t in o.token_ids] == _reply(server)
        assert mine[-1].finished and mine[-1].completion_tokens == len(_reply(server))


async def test_logprobs_one_entry_per_new_token(engine: tuple[GrpcEngineServer, GrpcEngineClient[object]]) -> None:
    server, client = engine
    outputs = await _collect(client, _request(server, logprobs=True, top_logprobs=2))
    for output in outputs:
        if output.token_ids:
            assert output.logprobs is not None
            assert [entry.token_id for entry in output.logprobs] == list(output.token_ids)
            assert all(len(entry.top) == 2 and entry.top[0][0] == entry.token_id for entry in output.logprobs)
        else:
            assert output.logprobs is None  # the closing output repeats nothing


async def test_constraints_map_to_each_engine(engine: tuple[GrpcEngineServer, GrpcEngineClient[object]]) -> None:
    server, client = engine
    cases = [
        Constraint(ConstraintKind.REGEX, "[a-z]+"),
        Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "object"}'),
        Constraint(ConstraintKind.GRAMMAR, 'root ::= "yes"'),
        Constraint(ConstraintKind.CHOICE, ("yes", "no")),
        Constraint(ConstraintKind.JSON_OBJECT),
    ]
    seen = []
    for number, constraint in enumerate(cases):
        await _collect(client, _request(server, f"c-{number}", constraint=constraint))
        params = server.state.request(f"c-{number}").sampling["sampling_params"]
        seen.append({k: v for k, v in params.items() if k in ("regex", "json_schema", "ebnf_grammar", "grammar", "choice", "json_object")})
    if client.runtime == "sglang":
        assert seen == [
            {"regex": "[a-z]+"},
            {"json_schema": '{"type": "object"}'},
            {"ebnf_grammar": 'root ::= "yes"'},
            {"regex": "(yes|no)"},
            {"json_schema": '{"type": "object"}'},
        ]
    else:
        assert seen == [
            {"regex": "[a-z]+"},
            {"json_schema": '{"type": "object"}'},
            {"grammar": 'root ::= "yes"'},
            {"choice": {"choices": ["yes", "no"]}},
            {"json_object": True},
        ]


async def test_closing_the_stream_mid_way_sends_exactly_one_abort(runtime_server: GrpcEngineServer) -> None:
    server = runtime_server
    client = ENGINE_CLIENTS.get(EngineKey(Transport.GRPC, server.config.runtime))(server.url)
    try:
        stream = client.generate(_request(server, "chatcmpl-gone"))
        first = await stream.__anext__()
        assert first.token_ids and not first.finished
        await stream.aclose()  # type: ignore[attr-defined]
        assert server.state.aborted_ids() == ["chatcmpl-gone"]
        await until(lambda: _true(server.state.request("chatcmpl-gone").cancelled))
        assert not server.state.request("chatcmpl-gone").done
        await asyncio.sleep(0.05)
        assert server.state.aborted_ids() == ["chatcmpl-gone"]
    finally:
        await client.close()


async def test_cancelling_the_consumer_task_sends_exactly_one_abort(runtime_server: GrpcEngineServer) -> None:
    server = runtime_server
    client = ENGINE_CLIENTS.get(EngineKey(Transport.GRPC, server.config.runtime))(server.url)
    got_one = asyncio.Event()

    async def consume() -> None:
        async for _output in client.generate(_request(server, "chatcmpl-cancel")):
            got_one.set()

    try:
        task = asyncio.create_task(consume())
        await asyncio.wait_for(got_one.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert server.state.aborted_ids() == ["chatcmpl-cancel"]
        if server.config.runtime in ("sglang", "tokenspeed"):  # the runtimes whose Abort carries a reason
            assert server.state.aborts[0].reason == "aborted by the gateway"
        await until(lambda: _true(server.state.request("chatcmpl-cancel").cancelled))
    finally:
        await client.close()


async def _true(value: bool) -> bool:
    return value


@pytest.fixture(params=ALL_RUNTIMES)
async def runtime_server(request: pytest.FixtureRequest) -> AsyncIterator[GrpcEngineServer]:
    server = await _serve(request.param, delay_ms=20.0, chunk_tokens=1)  # slow enough to leave mid-way
    try:
        yield server
    finally:
        await server.stop()


async def test_engine_error_is_an_upstream_failure_without_abort(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    too_long = EngineRequest(request_id="big", input_ids=tuple([9707] * 40_000))
    with pytest.raises(UpstreamFailure) as failure:
        await _collect(client, too_long)
    assert failure.value.kind is FailureKind.BROKEN and "INVALID_ARGUMENT" in failure.value.detail
    assert server.state.aborts == []


async def test_unreachable_worker_is_a_connect_failure() -> None:
    client = SglangClient(f"grpc://127.0.0.1:{free_port()}", control_timeout=2.0)
    try:
        with pytest.raises(UpstreamFailure) as failure:
            await client.health()
        assert failure.value.kind is FailureKind.CONNECT
        with pytest.raises(UpstreamFailure) as failure:
            await _collect(client, EngineRequest(request_id="x", input_ids=(1, 2)))
        assert failure.value.kind is FailureKind.CONNECT
    finally:
        await client.close()


async def test_model_info_server_info_loads_flush_profile_and_health(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    info = await client.model_info()
    assert info.served_model_name == "mock-model" and info.tokenizer_path == QWEN
    assert info.max_context_length == 32768 and info.eos_token_ids == (151645,)
    assert info.bos_token_id is None and info.architectures == ("Qwen3ForCausalLM",)

    server_info = await client.server_info()
    assert server_info["active_requests"] == 0 and server_info["uptime_seconds"] >= 0

    server.state.loads = [{"num_waiting_reqs": 4, "token_usage": 0.25}, {}]
    loads = await client.loads()
    assert [load["dp_rank"] for load in loads] == [0, 1]
    assert loads[0]["num_waiting_reqs"] == 4 and loads[0]["token_usage"] == 0.25

    await _collect(client, _request(server, "warm"))
    again = await _collect(client, _request(server, "again"))
    assert again[-1].cached_tokens > 0  # the same prompt: its prefix is cached
    flushed = await client.flush_cache()
    assert flushed.success and server.state.flushes == 1
    after = await _collect(client, _request(server, "after"))
    assert after[-1].cached_tokens == 0

    assert (await client.start_profile(ProfileOptions(num_steps=3))).success
    assert (await client.stop_profile()).success
    assert server.state.profiles == ["start", "stop"]

    assert (await client.health()).healthy
    server.state.healthy = False
    assert not (await client.health()).healthy


async def test_tokenizer_stream_is_checked_against_its_sha256(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    bundle = await client.tokenizer()
    assert bundle.intact
    names = zipfile.ZipFile(io.BytesIO(bundle.data)).namelist()
    assert "tokenizer.json" in names and "tokenizer_config.json" in names

    server.state.tokenizer_sha256 = "0" * 64  # a fault: the digest does not match the archive
    with pytest.raises(UpstreamFailure, match="sha256"):
        await client.tokenizer()


async def test_one_channel_per_worker_reused_and_closed(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    await client.health()
    await _collect(client, _request(server))
    await client.model_info()
    await client.loads()
    assert client.channel.opened == 1 and client.channel.is_open
    await client.close()
    assert not client.channel.is_open
    await client.close()  # twice is fine


async def test_detection_by_health_check_picks_each_runtime() -> None:
    servers = [await _serve(runtime) for runtime in RUNTIMES]
    try:
        for runtime, server in zip(RUNTIMES, servers):
            channel = WorkerChannel(server.url)
            try:
                assert await detect_runtime(channel) == runtime
            finally:
                await channel.close()
            # HealthCheck of the sglang service came first; the vLLM stand-in said UNIMPLEMENTED to it.
            assert server.state.health_checks == 1

            client = await connect(server.url)
            try:
                assert type(client) is {"sglang": SglangClient, "vllm": VllmClient}[runtime]
                outputs = await _collect(client, _request(server, f"detected-{runtime}"))
                assert outputs[-1].finished
                assert client.channel.opened == 1  # detection and generation on one channel
            finally:
                await client.close()
    finally:
        for server in servers:
            await server.stop()


async def test_detection_of_an_unreachable_worker_fails_to_connect() -> None:
    channel = WorkerChannel(f"grpc://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(UpstreamFailure) as failure:
            await detect_runtime(channel, timeout=2.0)
        assert failure.value.kind in (FailureKind.CONNECT, FailureKind.TIMEOUT)
    finally:
        await channel.close()


def test_clients_are_registered_by_runtime_name() -> None:
    assert ENGINE_CLIENTS.get(EngineKey(Transport.GRPC, "sglang")) is SglangClient
    assert ENGINE_CLIENTS.get(EngineKey(Transport.GRPC, "vllm")) is VllmClient


def test_worker_urls() -> None:
    assert (WorkerChannel("grpc://10.0.0.1:30001").target, WorkerChannel("grpc://h:1").secure) == ("10.0.0.1:30001", False)
    assert WorkerChannel("grpcs://h:443").secure
    with pytest.raises(ValueError):
        WorkerChannel("ipc:///tmp/x")


def test_a_chunk_is_decoded_and_folded_field_by_field() -> None:
    """SGLang's chunk to WireChunk to EngineOutput (both built positionally, D87): every count lands
    in its own field."""
    response = sglang_pb.GenerateResponse(request_id="r")
    chunk = response.chunk
    chunk.index, chunk.prompt_tokens, chunk.completion_tokens = 2, 40, 7
    chunk.cached_tokens, chunk.reasoning_tokens = 11, 5
    chunk.token_ids.extend([101, 102])
    client = SglangClient("grpc://127.0.0.1:1")
    piece = client._decode(response)
    assert piece == WireChunk(index=2, token_ids=(101, 102), prompt_tokens=40, completion_tokens=7, cached_tokens=11,
                              reasoning_tokens=5, logprobs=None, prompt_logprobs=None)  # fmt: skip
    assert isinstance(piece, WireChunk)
    output = client._fold_chunk(_Choice(), piece)
    assert output == EngineOutput(index=2, token_ids=(101, 102), prompt_tokens=40, completion_tokens=7,
                                  cached_tokens=11, reasoning_tokens=5)  # fmt: skip


def test_sglang_chunk_fields_are_the_decoded_chunks_fields() -> None:
    """The one-token message's fields read without a WireChunk (D105) are _decode's, field by field,
    logprobs included; a complete message is not a chunk's (None: _decode reads it)."""
    client = SglangClient("grpc://127.0.0.1:1")
    plain = sglang_pb.GenerateResponse(request_id="r")
    plain.chunk.index, plain.chunk.prompt_tokens, plain.chunk.completion_tokens = 1, 40, 7
    plain.chunk.cached_tokens, plain.chunk.reasoning_tokens = 11, 5
    plain.chunk.token_ids.extend([101])
    with_logprobs = sglang_pb.GenerateResponse(request_id="r")
    with_logprobs.chunk.CopyFrom(plain.chunk)
    with_logprobs.chunk.output_logprobs.token_ids.extend([101])
    with_logprobs.chunk.output_logprobs.token_logprobs.extend([-0.5])
    top = with_logprobs.chunk.output_logprobs.top_logprobs.add()
    top.token_ids.extend([101, 7])
    top.values.extend([-0.5, -1.5])
    for response in (plain, with_logprobs):
        fields = client._chunk_fields(response)
        assert fields is not None
        assert WireChunk(*fields) == client._decode(response)
    assert client._chunk_fields(with_logprobs)[6] is not None  # type: ignore[index]
    complete = sglang_pb.GenerateResponse(request_id="r")
    complete.complete.index, complete.complete.finish_reason = 0, "stop"
    assert client._chunk_fields(complete) is None
    assert client._chunk_fields(sglang_pb.GenerateResponse(request_id="r")) is None
