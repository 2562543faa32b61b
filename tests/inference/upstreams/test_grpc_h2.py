"""Generation streams read on the event loop (inference/upstreams/grpc/h2.py) against the real
grpc.aio server of the engine stand-in: the same outputs as grpc.aio's reader, bursts folded into
one output, messages larger than a frame, requests larger than the peer's window, a server that
goes away mid-stream, and the flag that keeps grpc.aio."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from common.config import GatewayConfig, install_config
from inference.upstreams.engine import EngineOutput, EngineRequest, SamplingParams
from inference.upstreams.failures import UpstreamFailure
from inference.upstreams.grpc import SglangClient, VllmClient
from inference.upstreams.grpc.client import GrpcEngineClient
from inference.upstreams.grpc.h2 import H2Channel
from standins.grpc_engine import GrpcEngineConfig, GrpcEngineServer, Thinking
from standins.fixtures import FIXTURE_MODELS as FIXTURES

QWEN = str(FIXTURES / "qwen3")
PROMPT = "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(params=["native", "grpcio"])
def reader(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    install_config(GatewayConfig(grpc_stream_reader=request.param), export=False)
    yield str(request.param)
    install_config(GatewayConfig(), export=False)


async def serve(runtime: str = "sglang", **options: object) -> GrpcEngineServer:
    server = GrpcEngineServer(GrpcEngineConfig(runtime=runtime, tokenizer=QWEN, **options))  # type: ignore[arg-type]
    await server.start()
    return server


def request(server: GrpcEngineServer, request_id: str = "r1", **sampling: object) -> EngineRequest:
    stream = bool(sampling.pop("stream", True))
    return EngineRequest(
        request_id=request_id, input_ids=server.engine.model.encode(PROMPT), original_text=PROMPT,
        sampling=SamplingParams(**sampling), stream=stream,  # type: ignore[arg-type]
    )  # fmt: skip


async def collect(client: GrpcEngineClient[object], engine_request: EngineRequest) -> list[EngineOutput]:
    return [output async for output in client.generate(engine_request)]


@pytest.mark.parametrize("runtime", ["sglang", "vllm"])
async def test_both_readers_give_the_same_tokens(reader: str, runtime: str) -> None:
    server = await serve(runtime, chunk_tokens=1)
    client = (SglangClient if runtime == "sglang" else VllmClient)(server.url)
    try:
        assert (client.channel.native is not None) is (reader == "native")
        outputs = await collect(client, request(server))
        model = server.engine.model
        assert [t for o in outputs for t in o.token_ids] == [*model.encode(model.reply_text("text", Thinking.MODEL)), model.eos_token_id]
        assert outputs[-1].finished and outputs[-1].completion_tokens == sum(len(o.token_ids) for o in outputs)
        big = await collect(client, request(server, "big", stream=False, ignore_eos=True, max_new_tokens=6000, logprobs=True))
        assert sum(len(o.token_ids) for o in big) == 6000 and len(big[-1].logprobs or ()) == 6000  # > one 16 KiB frame
        long_prompt = EngineRequest(request_id="long", input_ids=tuple([9707] * 30_000), sampling=SamplingParams(max_new_tokens=2))
        assert sum(len(o.token_ids) for o in await collect(client, long_prompt)) == 2  # > the peer's 64 KiB window
    finally:
        await client.close()
        await server.stop()


async def test_a_burst_of_messages_is_one_output(reader: str) -> None:
    server = await serve(chunk_tokens=1)
    client = SglangClient(server.url)
    try:
        stream = client.generate(request(server, ignore_eos=True, max_new_tokens=64))
        first = await stream.__anext__()
        await asyncio.sleep(0.3)  # the engine sends the rest meanwhile
        rest = [output async for output in stream]
        assert len(first.token_ids) + sum(len(o.token_ids) for o in rest) == 64
        if reader == "native":
            assert len(rest) < 8  # folded: the 64 messages that were waiting came as a few outputs
        else:
            assert len(rest) == 64  # grpc.aio hands over one message at a time (63 tokens, then the finish)
    finally:
        await client.close()
        await server.stop()


async def test_a_server_that_goes_away_mid_stream_breaks_the_stream(reader: str) -> None:
    server = await serve(chunk_tokens=1, delay_ms=20.0)
    client = SglangClient(server.url)
    try:
        stream = client.generate(request(server, ignore_eos=True, max_new_tokens=500))
        assert (await stream.__anext__()).token_ids
        await server.stop(grace=0)
        with pytest.raises(UpstreamFailure):
            async for _ in stream:
                pass
    finally:
        await client.close()


async def test_a_consumer_that_stops_reading_stops_its_stream_at_one_window() -> None:
    server = await serve(chunk_tokens=1)
    client = SglangClient(server.url)
    channel = H2Channel("127.0.0.1", int(server.url.rsplit(":", 1)[1]), server.url[len("grpc://"):], stream_window=65_535)
    try:
        path, parse = client._generate_route()
        message = client.encode(request(server, "held", ignore_eos=True, max_new_tokens=8000)).SerializeToString()
        call = await channel.unary_stream(path, message, (), parse)
        await asyncio.sleep(0.5)  # nobody reads: the engine may send one window ahead, then waits
        held = call.ready
        assert 0 < held < 4000 and not call.done
        count = held + len(call.drain())
        async for _ in call:
            count += 1
        assert count >= 8000  # once read again, the window is given back and the rest arrives
    finally:
        channel.close()
        await client.close()
        await server.stop()
