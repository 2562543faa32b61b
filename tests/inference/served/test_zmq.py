"""ZMQ workers (ipc://, vLLM's EngineCore in headless mode) through the whole served pipeline: the
gateway in-process with a ZMQ worker in its registry, the project's EngineCore stand-in dialing in
(driven by the Qwen3 fixture tokenizer), read through the openai SDK in strict mode. The gateway's
engine pool binds the worker's sockets on first use; the EOS ids come from the gateway's tokenizer."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from gateway_project.asgi import application
from inference.dataplane import data_plane
from inference.pipeline.parsers import choose_parsers
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.workers import EngineSpec, WorkerRecord
from inference.upstreams.zmq import ZmqEngineClient
from standins.scripted_engine import DEFAULT_TEXT
from standins.zmq_engine import ZmqEngineConfig, ZmqEngineGroup
from tests.conftest import GatewayFactory, free_port
from tests.inference.served.conftest import QWEN, QWEN_MODEL

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@dataclass
class ZmqGateway:
    http: httpx.AsyncClient
    group: ZmqEngineGroup
    record: WorkerRecord

    def sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url="http://gateway/v1", api_key="x", http_client=self.http, _strict_response_validation=True,
            max_retries=0,
        )

    @property
    def engine(self) -> ZmqEngineCoreLike:
        return self.group.engines[0]

    @property
    def client(self) -> ZmqEngineClient:
        client = data_plane().engines.client(self.record)
        assert isinstance(client, ZmqEngineClient)
        return client


ZmqEngineCoreLike = object  # the stand-in's engine core (standins.zmq_engine.ZmqEngineCore)
StartZmq = Callable[..., Awaitable[ZmqGateway]]


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="zmq", dir="/tmp") as folder:  # ipc paths must stay short
        yield Path(folder)


@pytest.fixture
async def start_zmq_gateway(make_gateway: GatewayFactory, ipc_dir: Path) -> AsyncIterator[StartZmq]:
    groups: list[ZmqEngineGroup] = []

    async def start(dp_size: int = 1, runtime: str = "vllm", **engine: object) -> ZmqGateway:
        handshake = f"tcp://127.0.0.1:{free_port()}"
        family = choose_parsers(QWEN_MODEL)
        record = WorkerRecord(
            id=str(uuid.uuid4()), url=f"ipc://{ipc_dir}/engine", model_id=QWEN_MODEL, runtime_type=runtime,
            status="ready",  # type: ignore[arg-type]
            engine=EngineSpec(
                tokenizer=QWEN, tool_parser=family.tool_parser, reasoning_parser=family.reasoning_parser,
                dp_size=dp_size, zmq_handshake_address=handshake,
            ),
        )  # fmt: skip
        TOKENIZERS.cache.get(QWEN, None)  # loaded up front
        group = ZmqEngineGroup(ZmqEngineConfig(tokenizer=QWEN, model=QWEN_MODEL, **engine), handshake, dp_size)  # type: ignore[arg-type]
        await group.start()  # dials in; the gateway binds on the first request
        groups.append(group)
        http = make_gateway([record], history_backend="memory")
        return ZmqGateway(http, group, record)

    yield start
    for group in groups:
        await group.stop()


async def test_chat_whole_answer_with_usage_and_eos_from_the_gateway(start_zmq_gateway: StartZmq) -> None:
    gw = await start_zmq_gateway()
    answer = await gw.sdk().chat.completions.create(model=QWEN_MODEL, messages=user("Hello there"), extra_body=NO_THINKING)
    assert answer.choices[0].message.content == DEFAULT_TEXT
    assert answer.choices[0].finish_reason == "stop"
    served = gw.group.engines[0].state.requests[-1]
    assert served.prompt_matches and "Hello there" in served.prompt_text
    assert answer.usage is not None and answer.usage.prompt_tokens == len(served.input_ids)
    assert answer.usage.completion_tokens == len(served.outputs[0])
    add = gw.group.engines[0].state.adds[-1]
    tokenizer = TOKENIZERS.cache.get(QWEN, None)
    assert add[5] == tokenizer.eos_token_ids[0]  # eos_token_id: the gateway's, the engine has no tokenizer


async def test_chat_streaming(start_zmq_gateway: StartZmq) -> None:
    gw = await start_zmq_gateway()
    stream = await gw.sdk().chat.completions.create(
        model=QWEN_MODEL, messages=user("Hello"), stream=True, stream_options={"include_usage": True},
        extra_body=NO_THINKING,
    )  # fmt: skip
    text, finish, usage = "", None, None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    assert text == DEFAULT_TEXT and finish == "stop"
    assert usage is not None and usage.completion_tokens > 0


async def test_completions_and_stop_strings_matched_by_the_gateway(start_zmq_gateway: StartZmq) -> None:
    gw = await start_zmq_gateway()
    whole = await gw.sdk().completions.create(model=QWEN_MODEL, prompt="Say something", max_tokens=64)
    assert whole.choices[0].text and whole.choices[0].finish_reason in ("stop", "length")
    word = DEFAULT_TEXT.split()[1]
    cut = await gw.sdk().chat.completions.create(
        model=QWEN_MODEL, messages=user("Hello"), stop=[word], extra_body=NO_THINKING
    )
    assert cut.choices[0].message.content == DEFAULT_TEXT[: DEFAULT_TEXT.index(word)]
    assert cut.choices[0].finish_reason == "stop"


async def test_messages_and_responses_on_a_zmq_worker(start_zmq_gateway: StartZmq) -> None:
    gw = await start_zmq_gateway()
    messages = await gw.http.post(
        "/v1/messages",
        json={"model": QWEN_MODEL, "max_tokens": 64, "messages": user("Hi"), "thinking": {"type": "disabled"}},
    )
    assert messages.status_code == 200, messages.text
    assert messages.json()["content"][-1]["text"] == DEFAULT_TEXT
    responses = await gw.sdk().responses.create(model=QWEN_MODEL, input="Hi")
    assert responses.status == "completed" and DEFAULT_TEXT in responses.output_text


async def test_client_disconnect_sends_abort(start_zmq_gateway: StartZmq) -> None:
    gw = await start_zmq_gateway(delay_ms=20, chunk_tokens=1)
    engine = gw.group.engines[0]
    payload = {"model": QWEN_MODEL, "messages": user("Hello"), "stream": True, "max_tokens": 200, **NO_THINKING}
    body = httpx.Request("POST", "http://gateway", json=payload).content
    first_chunk = asyncio.Event()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, object]:
        if messages:
            return messages.pop()
        await first_chunk.wait()
        return {"type": "http.disconnect"}  # the client goes away mid-stream

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.body" and b"content" in message.get("body", b""):  # type: ignore[operator]
            first_chunk.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"gateway"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000), "server": ("gateway", 80),
    }  # fmt: skip
    await asyncio.wait_for(application(scope, receive, send), 5)  # type: ignore[arg-type]

    async def aborted() -> bool:
        return bool(engine.state.abort_messages)

    await _until(aborted)
    assert engine.state.abort_messages == [[engine.state.adds[-1][0]]]  # ABORT of that request, once
    assert all(handle.load.in_flight == 0 for handle in data_plane().registry.snapshot.workers)


async def _asgi_stream(payload: dict[str, object]) -> bytes:
    """POST /v1/chat/completions straight to the ASGI app (httpx's ASGI transport would buffer the
    whole answer): the body as the client reads it, piece by piece."""
    body = httpx.Request("POST", "http://gateway", json=payload).content
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    received: list[bytes] = []
    done = asyncio.Event()

    async def receive() -> dict[str, object]:
        if messages:
            return messages.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.body":
            received.append(message.get("body", b""))  # type: ignore[arg-type]
            if not message.get("more_body"):
                done.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"gateway"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000), "server": ("gateway", 80),
    }  # fmt: skip
    await application(scope, receive, send)  # type: ignore[arg-type]
    return b"".join(received)


async def test_engine_death_mid_stream_ends_every_request_and_the_worker_recovers(
    start_zmq_gateway: StartZmq,
) -> None:
    gw = await start_zmq_gateway(delay_ms=50, chunk_tokens=1)
    engine = gw.group.engines[0]
    payloads = [
        {"model": QWEN_MODEL, "messages": user(f"Hello {i}"), "stream": True, "max_tokens": 200, **NO_THINKING}
        for i in range(2)
    ]
    streams = [asyncio.create_task(_asgi_stream(payload)) for payload in payloads]

    async def both_streaming() -> bool:
        return len(engine.state.adds) == 2 and engine.state.outputs_sent >= 2

    await _until(both_streaming)
    await engine.die()
    bodies = await asyncio.wait_for(asyncio.gather(*streams), 10)  # none hangs
    for raw in bodies:  # each stream ends at once with the error event, then [DONE]
        events = [event[6:] for event in raw.decode().split("\n\n") if event.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert "error" in orjson.loads(events[-2]), events[-2]
    assert not gw.client.ready
    # A restarted engine handshakes again and the worker serves.
    restarted = ZmqEngineGroup(ZmqEngineConfig(tokenizer=QWEN, model=QWEN_MODEL), gw.client.handshake_endpoint)
    await restarted.start()
    try:
        await asyncio.wait_for(gw.client.wait_ready(), 10)
        answer = await gw.sdk().chat.completions.create(
            model=QWEN_MODEL, messages=user("again"), extra_body=NO_THINKING
        )
        assert answer.choices[0].message.content == DEFAULT_TEXT
    finally:
        await restarted.stop()


async def test_dp_size_two_uses_both_ranks(start_zmq_gateway: StartZmq) -> None:
    gw = await start_zmq_gateway(dp_size=2, delay_ms=20, chunk_tokens=1)
    sdk = gw.sdk()
    answers = await asyncio.gather(
        *(sdk.chat.completions.create(model=QWEN_MODEL, messages=user(f"n{i}"), extra_body=NO_THINKING) for i in range(4))
    )
    assert all(answer.choices[0].message.content == DEFAULT_TEXT for answer in answers)
    assert all(engine.state.adds for engine in gw.group.engines)  # both ranks served requests


async def test_loads_come_from_the_worker_client(start_zmq_gateway: StartZmq) -> None:
    gw = await start_zmq_gateway(dp_size=2)
    await gw.sdk().chat.completions.create(model=QWEN_MODEL, messages=user("hi"), extra_body=NO_THINKING)
    loads = await gw.client.loads()
    assert len(loads) == 2


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.02)
