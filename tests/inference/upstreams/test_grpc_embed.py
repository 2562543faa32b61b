"""Embeddings through the engine-client seam: ``EngineClient.embed`` on the runtimes whose service has
an Embed RPC (SGLang, vLLM, TensorRT-LLM) against the gRPC engine stand-in over loopback, and
``UpstreamFailure`` on the others (TokenSpeed, MLX) without a call."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest

from inference.routing.workers import Transport
from inference.upstreams.engine import ENGINE_CLIENTS, EmbedRequest, EmbedResult, EngineKey
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.grpc.client import GrpcEngineClient
from inference.upstreams.grpc.detect import DETECTION_ORDER
from standins.grpc_engine import EMBEDDING_DIM, GrpcEngineServer, embedding_for
from tests.inference.upstreams.test_grpc_clients import PROMPT, _serve

WITH_EMBED = ("sglang", "vllm", "trtllm")
WITHOUT_EMBED = tuple(runtime for runtime in DETECTION_ORDER if runtime not in WITH_EMBED)


async def _engine(runtime: str) -> tuple[GrpcEngineServer, GrpcEngineClient[object]]:
    server = await _serve(runtime)
    client = ENGINE_CLIENTS.get(EngineKey(Transport.GRPC, runtime))(server.url)
    assert isinstance(client, GrpcEngineClient)
    return server, client


@pytest.fixture(params=WITH_EMBED)
async def embedder(request: pytest.FixtureRequest) -> AsyncIterator[tuple[GrpcEngineServer, GrpcEngineClient[object]]]:
    server, client = await _engine(request.param)
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop()


async def test_embed_answers_the_engines_vector_and_prompt_count(
    embedder: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = embedder
    ids = server.engine.model.encode(PROMPT)
    result = await client.embed(EmbedRequest("embd-1", ids, original_text=PROMPT))

    assert isinstance(result, EmbedResult) and result.prompt_tokens == len(ids)
    assert len(result.embedding) == EMBEDDING_DIM
    assert result.embedding == pytest.approx(embedding_for(ids), abs=1e-6)  # floats on the wire
    assert math.isclose(sum(value * value for value in result.embedding), 1.0, rel_tol=1e-5)
    [record] = server.state.embeds
    assert (record.request_id, record.input_ids, record.original_text) == ("embd-1", ids, PROMPT)
    assert server.state.requests == []  # no generation

    other = await client.embed(EmbedRequest("embd-2", ids[:-1]))
    assert other.embedding != result.embedding and other.prompt_tokens == len(ids) - 1


async def test_sglang_embed_carries_the_dp_rank() -> None:
    server, client = await _engine("sglang")
    try:
        result = await client.embed(EmbedRequest("embd-dp", (9707, 1879), data_parallel_rank=1))
        assert result.prompt_tokens == 2 and server.state.embeds[-1].request_id == "embd-dp"
    finally:
        await client.close()
        await server.stop()


async def test_embed_of_a_bad_prompt_is_an_upstream_failure(
    embedder: tuple[GrpcEngineServer, GrpcEngineClient[object]],
) -> None:
    server, client = embedder
    for ids in ((), (10**7,)):
        with pytest.raises(UpstreamFailure) as failure:
            await client.embed(EmbedRequest("bad", ids))
        assert failure.value.kind is FailureKind.BROKEN and "INVALID_ARGUMENT" in failure.value.detail
    assert server.state.embeds == []


@pytest.mark.parametrize("runtime", WITHOUT_EMBED)
async def test_runtimes_without_embed_refuse_without_a_call(runtime: str) -> None:
    server, client = await _engine(runtime)
    try:
        with pytest.raises(UpstreamFailure, match=f"^{runtime} has no Embed$") as failure:
            await client.embed(EmbedRequest("embd", (9707,)))
        assert failure.value.kind is FailureKind.BROKEN
        assert not client.channel.is_open and server.state.embeds == []
    finally:
        await client.close()
        await server.stop()
