"""--request-timeout-secs over served engine generations (D104): an engine that stops answering is
answered 504 upstream_timeout before anything went out, or ends a started stream with the relay's
in-band error; either way its request is aborted (gRPC Abort, ZMQ ABORT). The stand-ins hang on
``state.stall_after``; the flag is short (0.5 s); nothing here asserts a duration."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from inference.pipeline.parsers import choose_parsers
from inference.pipeline.tokenizer_registry import TOKENIZERS
from inference.routing.workers import EngineSpec, WorkerRecord
from standins.grpc_engine import GrpcEngineState
from standins.zmq_engine import ZmqEngineConfig, ZmqEngineGroup, ZmqEngineState
from tests.conftest import GatewayFactory, free_port
from tests.inference.served.conftest import QWEN, QWEN_MODEL, Start
from tests.inference.served.test_pd_served import pd_engines

TIMEOUT = {"request_timeout_secs": 0.5, "retry_max_retries": 0}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
CHAT = {"model": QWEN_MODEL, "messages": [{"role": "user", "content": "hi"}], **NO_THINKING}


def events(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]


async def until(check: Callable[[], bool]) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never happened")


def assert_504(answer: httpx.Response) -> None:
    assert answer.status_code == 504
    assert answer.headers["x-gw-error-code"] == "upstream_timeout"
    assert answer.json()["error"]["code"] == "upstream_timeout"


def assert_timed_out_in_band(answer: httpx.Response) -> list[str]:
    """The relay's in-band timeout, then [DONE]; the events before it."""
    assert answer.status_code == 200
    lines = events(answer.content)
    assert lines[-1] == "[DONE]"
    error = orjson.loads(lines[-2])["error"]
    assert error["type"] == "internal_error" and "timed out" in error["message"]
    return lines[:-2]


def grpc_aborted(state: GrpcEngineState) -> Callable[[], bool]:
    return lambda: bool(state.requests) and state.requests[-1].request_id in state.aborted_ids()


# --- gRPC -------------------------------------------------------------------------------------------


async def test_grpc_engine_that_never_answers_gets_504_and_its_abort(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(gateway=TIMEOUT)
    gw.engine.state.stall_after = 0
    for stream in (False, True):  # nothing went out either way: the relay's 504
        assert_504(await gw.http.post("/v1/chat/completions", json={**CHAT, "stream": stream}))
        await until(grpc_aborted(gw.engine.state))
        assert gw.engine.state.requests[-1].cancelled


async def test_grpc_stream_that_stalls_ends_in_band_and_aborts(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, gateway=TIMEOUT)
    gw.engine.state.stall_after = 2
    before = assert_timed_out_in_band(await gw.http.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    assert any('"content"' in line for line in before)  # its first tokens went out
    await until(grpc_aborted(gw.engine.state))


async def test_grpc_whole_answer_that_stalls_after_its_first_output_gets_504(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, gateway=TIMEOUT)
    gw.engine.state.stall_after = 2  # the answer opened (first output), nothing written yet
    body = {**CHAT, "stop": ["never matched"]}  # streamed from the engine, answered whole
    assert_504(await gw.http.post("/v1/chat/completions", json=body))
    await until(grpc_aborted(gw.engine.state))


async def test_completions_and_generate_time_out_too(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, gateway=TIMEOUT)
    gw.engine.state.stall_after = 0
    assert_504(await gw.http.post("/v1/completions", json={"model": QWEN_MODEL, "prompt": ["a", "b"]}))
    assert_504(await gw.http.post("/generate", json={"model": QWEN_MODEL, "text": "a"}))
    await until(grpc_aborted(gw.engine.state))


async def test_messages_stream_that_stalls_ends_with_the_error_event(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(chunk_tokens=1, gateway=TIMEOUT)
    gw.engine.state.stall_after = 2
    body = {"model": QWEN_MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    answer = await gw.http.post("/v1/messages", json=body)
    assert answer.status_code == 200
    last = orjson.loads(events(answer.content)[-1])
    assert last["type"] == "error" and last["error"]["type"] == "api_error"
    assert "timed out" in last["error"]["message"]
    await until(grpc_aborted(gw.engine.state))


async def test_an_answer_within_the_timeout_is_untouched(start_engine_gateway: Start) -> None:
    gw = await start_engine_gateway(gateway=TIMEOUT)
    answer = await gw.http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert events(answer.content)[-1] == "[DONE]" and "timed out" not in answer.text
    await asyncio.sleep(0.7)  # past the deadline: nothing fires on a finished answer
    assert (await gw.http.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert gw.engine.state.aborted_ids() == []


async def test_pd_decode_that_never_answers_gets_504_and_its_abort(make_gateway: GatewayFactory) -> None:
    def timed(records: object, **config: object) -> httpx.AsyncClient:
        return make_gateway(records, **{**config, "request_timeout_secs": 0.5})  # type: ignore[arg-type]

    async with pd_engines(timed) as (http, _prefill, decode):  # type: ignore[arg-type]
        decode.state.stall_after = 0
        assert_504(await http.post("/v1/chat/completions", json={**CHAT, "stream": True}))
        await until(grpc_aborted(decode.state))


# --- ZMQ --------------------------------------------------------------------------------------------

StartZmq = Callable[[], Awaitable[tuple[httpx.AsyncClient, ZmqEngineState]]]


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="zmq", dir="/tmp") as folder:  # ipc paths must stay short
        yield Path(folder)


@pytest.fixture
async def start_zmq(make_gateway: GatewayFactory, ipc_dir: Path) -> AsyncIterator[StartZmq]:
    groups: list[ZmqEngineGroup] = []

    async def start() -> tuple[httpx.AsyncClient, ZmqEngineState]:
        handshake = f"tcp://127.0.0.1:{free_port()}"
        family = choose_parsers(QWEN_MODEL)
        record = WorkerRecord(
            id=str(uuid.uuid4()), url=f"ipc://{ipc_dir}/engine", model_id=QWEN_MODEL, runtime_type="vllm",
            status="ready",  # type: ignore[arg-type]
            engine=EngineSpec(
                tokenizer=QWEN, tool_parser=family.tool_parser, reasoning_parser=family.reasoning_parser,
                zmq_handshake_address=handshake,
            ),
        )  # fmt: skip
        TOKENIZERS.cache.get(QWEN, None)
        group = ZmqEngineGroup(ZmqEngineConfig(tokenizer=QWEN, model=QWEN_MODEL, chunk_tokens=1), handshake, 1)
        await group.start()
        groups.append(group)
        http = make_gateway([record], history_backend="memory", **TIMEOUT)
        return http, group.engines[0].state

    yield start
    for group in groups:
        await group.stop()


async def test_zmq_engine_that_never_answers_gets_504_and_abort(start_zmq: StartZmq) -> None:
    http, state = await start_zmq()
    state.stall_after = 0
    assert_504(await http.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    await until(lambda: bool(state.abort_messages))
    assert state.abort_messages == [[state.adds[-1][0]]]


async def test_zmq_stream_that_stalls_ends_in_band_and_aborts(start_zmq: StartZmq) -> None:
    http, state = await start_zmq()
    state.stall_after = 2
    before = assert_timed_out_in_band(await http.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    assert any('"content"' in line for line in before)
    await until(lambda: bool(state.abort_messages))
    assert state.abort_messages == [[state.adds[-1][0]]]
