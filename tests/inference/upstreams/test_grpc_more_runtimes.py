"""The TensorRT-LLM, TokenSpeed and MLX engine clients against the gRPC engine stand-in over loopback
(a real ``grpc.aio`` server in the test's event loop, a real fixture tokenizer), and what each
runtime lacks raising ``UpstreamFailure`` instead of pretending."""

from __future__ import annotations

import asyncio
import io
import zipfile
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from inference.routing.workers import Transport
from inference.upstreams import engine as engine_module
from inference.upstreams.engine import (
    ENGINE_CLIENTS,
    Constraint,
    ConstraintKind,
    DisaggregationParams,
    EngineKey,
    EngineRequest,
    FinishReason,
    ProfileOptions,
    SamplingParams,
)
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.grpc import (
    MlxClient,
    SglangClient,
    TokenSpeedClient,
    TrtllmClient,
    VllmClient,
    WorkerChannel,
    connect,
    detect_runtime,
)
from inference.upstreams.grpc.client import GrpcEngineClient
from inference.upstreams.grpc.detect import DETECTION_ORDER
from standins.grpc_engine import GrpcEngineServer
from tests.inference.upstreams.test_grpc_clients import PROMPT, QWEN, _collect, _reply, _request, _serve

RUNTIMES = ("trtllm", "tokenspeed", "mlx")
CLIENTS = {"sglang": SglangClient, "vllm": VllmClient, "trtllm": TrtllmClient, "tokenspeed": TokenSpeedClient, "mlx": MlxClient}
CONTEXT = 32768  # the stand-in's default context length


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


@pytest.fixture(params=RUNTIMES)
async def slow_server(request: pytest.FixtureRequest) -> AsyncIterator[GrpcEngineServer]:
    server = await _serve(request.param, delay_ms=20.0, chunk_tokens=1)  # slow enough to leave mid-way
    try:
        yield server
    finally:
        await server.stop()


def _sampling_seen(server: GrpcEngineServer, request_id: str = "chatcmpl-1") -> dict[str, object]:
    seen = server.state.request(request_id).sampling
    key = "sampling_config" if server.config.runtime == "trtllm" else "sampling_params"
    params = seen.get(key, {})
    assert isinstance(params, dict)
    return params


def test_clients_are_registered_by_runtime_name() -> None:
    for runtime, client_class in CLIENTS.items():
        assert ENGINE_CLIENTS.get(EngineKey(Transport.GRPC, runtime)) is client_class
        assert client_class.runtime == runtime
    assert set(CLIENTS) == set(DETECTION_ORDER)


def test_operations_follow_what_each_proto_declares() -> None:
    """Spec 3: FlushCache on three gRPC runtimes, two unsupported; loads and profiling likewise (the
    protos of TensorRT-LLM and MLX declare none of them); Embed on SGLang, vLLM, TensorRT-LLM."""
    declared = {
        rpc: {runtime for runtime, client in CLIENTS.items() if client.declares(rpc)}
        for rpc in ("FlushCache", "GetLoads", "StartProfile", "StopProfile", "Embed", "GetTokenizer")
    }
    assert declared["FlushCache"] == declared["GetLoads"] == {"sglang", "vllm", "tokenspeed"}
    assert declared["StartProfile"] == declared["StopProfile"] == {"sglang", "vllm", "tokenspeed"}
    assert declared["Embed"] == {"sglang", "vllm", "trtllm"}
    assert declared["GetTokenizer"] == set(CLIENTS)


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
    counts = [output.completion_tokens for output in outputs]
    assert counts == sorted(counts) and counts[0] == len(outputs[0].token_ids)

    served = server.state.request("chatcmpl-1")
    assert served.prompt_matches and served.input_ids == request.input_ids
    assert served.done and not served.cancelled and server.state.aborts == []


async def test_non_streaming_gives_every_token_in_one_output(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    outputs = await _collect(client, _request(server, stream=False))
    assert len(outputs) == 1
    assert list(outputs[0].token_ids) == _reply(server)
    assert outputs[0].completion_tokens == len(_reply(server))
    assert outputs[0].finish is not None and outputs[0].finish.reason is FinishReason.STOP
    assert not server.state.request("chatcmpl-1").stream


async def test_neutral_sampling_values_are_sent_explicitly(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    await _collect(client, _request(server, stop_token_ids=(151643,)))
    seen = server.state.request("chatcmpl-1").sampling
    params = _sampling_seen(server)
    assert params["temperature"] == 1.0 and params["top_p"] == 1.0 and params["repetition_penalty"] == 1.0
    runtime = client.runtime
    if runtime == "tokenspeed":  # every value has presence there: zeros are on the wire too
        assert params["top_k"] == -1 and params["n"] == 1 and params["skip_special_tokens"] is True
        assert params["min_p"] == 0.0 and params["frequency_penalty"] == 0.0 and params["presence_penalty"] == 0.0
        assert params["stop_token_ids"] == [151643] and "max_new_tokens" not in params
        assert seen["logprob_start_len"] == -1
    elif runtime == "trtllm":
        assert params["top_k"] == 0 and params["beam_width"] == 1 and params["num_return_sequences"] == 1
        assert params["min_p"] == 0.0 and params["frequency_penalty"] == 0.0 and params["presence_penalty"] == 0.0
        assert seen["stop_token_ids"] == [151643] and seen["output_config"] == {"exclude_input_from_output": True}
        # No max_new_tokens: what the engine's context leaves after the prompt (a uint32 without presence).
        assert seen["max_tokens"] == CONTEXT - len(server.state.request("chatcmpl-1").input_ids)
    else:
        assert "top_k" not in params  # unsigned on MLX: 0 (unset) means no top-k
        assert params["stop_token_ids"] == [151643] and "max_tokens" not in params


async def test_greedy_temperature_zero_and_a_token_limit_reach_the_engine(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    outputs = await _collect(client, _request(server, temperature=0.0, max_new_tokens=4, seed=7))
    assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.LENGTH
    assert outputs[-1].completion_tokens == 4 and [t for o in outputs for t in o.token_ids] == _reply(server)[:4]
    params = _sampling_seen(server)
    assert params["temperature"] == 0.0  # proto3 optional on all three: the explicit 0 is on the wire
    seen = server.state.request("chatcmpl-1").sampling
    limit = {"trtllm": seen.get("max_tokens"), "tokenspeed": params.get("max_new_tokens"), "mlx": params.get("max_tokens")}
    assert limit[client.runtime] == 4
    seed = {"trtllm": params.get("seed"), "tokenspeed": params.get("sampling_seed"), "mlx": params.get("seed")}
    assert str(seed[client.runtime]) == "7"  # a uint64 is a string in proto JSON


async def test_n_choices_are_told_apart_by_index(engine: tuple[GrpcEngineServer, GrpcEngineClient[object]]) -> None:
    server, client = engine
    if client.runtime == "mlx":  # no parallel samples on MLX: refused before any RPC
        with pytest.raises(UpstreamFailure, match=r"mlx has no n > 1") as failure:
            await _collect(client, _request(server, n=2))
        assert failure.value.kind is FailureKind.BROKEN and server.state.requests == []
        return
    for stream in (True, False):
        outputs = await _collect(client, _request(server, f"n-{stream}", n=2, stream=stream))
        for index in (0, 1):
            mine = [o for o in outputs if o.index == index]
            assert [t for o in mine for t in o.token_ids] == _reply(server)
            assert mine[-1].finished and mine[-1].completion_tokens == len(_reply(server))


async def test_logprobs_one_entry_per_new_token(engine: tuple[GrpcEngineServer, GrpcEngineClient[object]]) -> None:
    server, client = engine
    for stream in (True, False):
        outputs = await _collect(client, _request(server, f"lp-{stream}", logprobs=True, top_logprobs=2, stream=stream))
        for output in outputs:
            if output.token_ids:
                assert output.logprobs is not None
                assert [entry.token_id for entry in output.logprobs] == list(output.token_ids)
                assert all(len(entry.top) == 2 and entry.top[0][0] == entry.token_id for entry in output.logprobs)
                assert all(entry.logprob < 0 for entry in output.logprobs)
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
        Constraint(ConstraintKind.STRUCTURAL_TAG, '{"format": {}}'),
    ]
    if client.runtime == "mlx":  # no structured output on MLX
        for constraint in cases:
            with pytest.raises(UpstreamFailure, match=f"mlx has no structured output .{constraint.kind.value}"):
                await _collect(client, _request(server, constraint=constraint))
        assert server.state.requests == []
        return
    seen = []
    for number, constraint in enumerate(cases):
        await _collect(client, _request(server, f"c-{number}", constraint=constraint))
        if client.runtime == "trtllm":
            seen.append(server.state.request(f"c-{number}").sampling["guided_decoding"])
        else:
            params = _sampling_seen(server, f"c-{number}")
            seen.append({k: v for k, v in params.items() if k in ("regex", "json_schema", "ebnf_grammar", "structural_tag")})
    if client.runtime == "tokenspeed":
        assert seen == [
            {"regex": "[a-z]+"},
            {"json_schema": '{"type": "object"}'},
            {"ebnf_grammar": 'root ::= "yes"'},
            {"regex": "(yes|no)"},
            {"json_schema": '{"type": "object"}'},
            {"structural_tag": '{"format": {}}'},
        ]
    else:
        assert seen == [
            {"guide_type": "GUIDE_TYPE_REGEX", "guide": "[a-z]+"},
            {"guide_type": "GUIDE_TYPE_JSON_SCHEMA", "guide": '{"type": "object"}'},
            {"guide_type": "GUIDE_TYPE_EBNF_GRAMMAR", "guide": 'root ::= "yes"'},
            {"guide_type": "GUIDE_TYPE_REGEX", "guide": "(yes|no)"},
            {"guide_type": "GUIDE_TYPE_JSON_SCHEMA", "guide": '{"type": "object"}'},
            {"guide_type": "GUIDE_TYPE_STRUCTURAL_TAG", "guide": '{"format": {}}'},
        ]


async def test_requests_a_runtime_cannot_carry_are_refused_before_any_rpc(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    ids = server.engine.model.encode(PROMPT)
    refused: dict[str, list[tuple[EngineRequest, str]]] = {
        "trtllm": [
            (EngineRequest("r", ids, SamplingParams(logit_bias=((9707, 1.0),))), "logit_bias"),
            (EngineRequest("r", ids, disaggregation=DisaggregationParams("h", 1, 2)), "bootstrap disaggregation"),
        ],
        "tokenspeed": [(EngineRequest("r", ids, return_prompt_logprobs=True), "prompt logprobs")],
        "mlx": [
            (EngineRequest("r", ids, SamplingParams(min_new_tokens=2)), "min_new_tokens"),
            (EngineRequest("r", ids, return_prompt_logprobs=True), "prompt logprobs"),
            (EngineRequest("r", ids, disaggregation=DisaggregationParams("h", 1, 2)), "disaggregation"),
        ],
    }
    for request, what in refused[client.runtime]:
        with pytest.raises(UpstreamFailure, match=f"{client.runtime} has no {what}") as failure:
            await _collect(client, request)
        assert failure.value.kind is FailureKind.BROKEN
    assert server.state.requests == [] and server.state.aborts == []


async def test_trtllm_bounds_a_request_without_a_limit_by_the_engines_context() -> None:
    server = await _serve("trtllm", max_context_length=4096)
    client = TrtllmClient(server.url)
    try:
        short = EngineRequest("short", (9707,), stream=False)
        longer = EngineRequest("longer", (9707, 1879, 1052), stream=False)
        await _collect(client, short)
        await _collect(client, longer)
        assert server.state.request("short").sampling["max_tokens"] == 4096 - 1
        assert server.state.request("longer").sampling["max_tokens"] == 4096 - 3
        assert (await client.model_info()).max_context_length == 4096
    finally:
        await client.close()
        await server.stop()


async def test_an_explicit_abort_ends_a_running_stream_with_abort(slow_server: GrpcEngineServer) -> None:
    server = slow_server
    client = ENGINE_CLIENTS.get(EngineKey(Transport.GRPC, server.config.runtime))(server.url)
    try:
        outputs = []
        async for output in client.generate(_request(server, "chatcmpl-stop")):
            outputs.append(output)
            if len(outputs) == 1:
                await client.abort("chatcmpl-stop")
        assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.ABORT
        assert server.state.aborted_ids() == ["chatcmpl-stop"]  # the engine settled it: no second Abort
        await client.abort("unknown-id")  # harmless
    finally:
        await client.close()


async def test_engine_error_is_an_upstream_failure_without_abort(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    too_long = EngineRequest(request_id="big", input_ids=tuple([9707] * 40_000), sampling=SamplingParams(max_new_tokens=8))
    with pytest.raises(UpstreamFailure) as failure:
        await _collect(client, too_long)
    assert failure.value.kind is FailureKind.BROKEN and "INVALID_ARGUMENT" in failure.value.detail
    assert server.state.aborts == []


async def test_health_model_info_and_server_info(engine: tuple[GrpcEngineServer, GrpcEngineClient[object]]) -> None:
    server, client = engine
    health = await client.health()
    assert health.healthy and health.message
    server.state.healthy = False
    assert not (await client.health()).healthy
    assert server.state.health_checks == 2

    info = await client.model_info()
    assert info.model_path == "mock-model" and info.max_context_length == CONTEXT
    assert info.vocab_size == server.engine.model.vocab_size and info.is_generation
    if client.runtime == "trtllm":  # model_id, sequence and input lengths, vocabulary: nothing more
        assert info.max_req_input_len == CONTEXT - 1 and info.eos_token_ids == () and info.served_model_name == ""
    else:
        assert info.served_model_name == "mock-model" and info.eos_token_ids == (151645,)
        assert info.architectures == ("Qwen3ForCausalLM",) and info.bos_token_id is None
        assert info.max_req_input_len == CONTEXT - 1
        assert info.tokenizer_path == (QWEN if client.runtime == "tokenspeed" else "")  # MLX has none

    server_info = await client.server_info()
    expected = {
        "trtllm": ("backend", "tensorrt-llm"),
        "tokenspeed": ("tokenspeed_version", "0.0.0-mock"),
        "mlx": ("server_type", "mlx-grpc"),
    }
    key, value = expected[client.runtime]
    assert server_info[key] == value


async def test_loads_flush_and_profiling_work_or_are_unsupported(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    if client.runtime == "tokenspeed":
        server.state.loads = [{"num_waiting_reqs": 4, "token_usage": 0.25}, {}]
        loads = await client.loads()
        assert [load["dp_rank"] for load in loads] == [0, 1]
        assert loads[0]["num_waiting_reqs"] == 4 and loads[0]["token_usage"] == 0.25

        await _collect(client, _request(server, "warm"))
        again = await _collect(client, _request(server, "again"))
        assert again[-1].cached_tokens > 0
        assert (await client.flush_cache()).success and server.state.flushes == 1
        after = await _collect(client, _request(server, "after"))
        assert after[-1].cached_tokens == 0

        # Spec 3: TokenSpeed is one of the three gRPC runtimes without profiling (its proto declares it).
        for call in (lambda: client.start_profile(ProfileOptions(num_steps=3)), client.stop_profile):
            with pytest.raises(UpstreamFailure, match="^tokenspeed has no profiling$"):
                await call()
        assert server.state.profiles == []
        return
    calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("GetLoads", client.loads),
        ("FlushCache", client.flush_cache),
        ("StartProfile", lambda: client.start_profile(ProfileOptions())),
        ("StopProfile", client.stop_profile),
    ]
    for rpc, call in calls:
        with pytest.raises(UpstreamFailure, match=f"^{client.runtime} has no {rpc}$") as failure:
            await call()
        assert failure.value.kind is FailureKind.BROKEN
    assert server.state.flushes == 0 and server.state.profiles == []
    assert not client.channel.is_open  # refused without a call


async def test_tokenizer_stream_is_checked_against_its_sha256(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = engine
    bundle = await client.tokenizer()
    assert bundle.intact
    names = zipfile.ZipFile(io.BytesIO(bundle.data)).namelist()
    assert "tokenizer.json" in names and "tokenizer_config.json" in names

    server.state.tokenizer_sha256 = "0" * 64
    with pytest.raises(UpstreamFailure, match="sha256"):
        await client.tokenizer()


async def test_a_tokenizer_stream_larger_than_a_tokenizer_may_take_is_cut(
    engine: tuple[GrpcEngineServer, GrpcEngineClient[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive is not held whole past MAX_TOKENIZER_BYTES: the stream is cut with a failure."""
    server, client = engine
    size = len((await client.tokenizer()).data)
    monkeypatch.setattr(engine_module, "MAX_TOKENIZER_BYTES", size // 2)
    with pytest.raises(UpstreamFailure, match=f"larger than {size // 2} bytes") as failure:
        await client.tokenizer()
    assert failure.value.kind is FailureKind.BROKEN


async def test_detection_by_health_check_picks_each_of_the_five_runtimes() -> None:
    servers = [await _serve(runtime) for runtime in DETECTION_ORDER]
    try:
        for runtime, server in zip(DETECTION_ORDER, servers):
            channel = WorkerChannel(server.url)
            try:
                assert await detect_runtime(channel) == runtime
            finally:
                await channel.close()
            # The services before it in the order said UNIMPLEMENTED; its own answered once.
            assert server.state.health_checks == 1

            client = await connect(server.url)
            try:
                assert type(client) is CLIENTS[runtime]
                outputs = await _collect(client, _request(server, f"detected-{runtime}"))
                assert outputs[-1].finished
                assert client.channel.opened == 1  # detection and generation on one channel
            finally:
                await client.close()
    finally:
        for server in servers:
            await server.stop()
