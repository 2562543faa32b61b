"""A ZMQ worker served by several serving processes (``rungateway --workers N``, D69): each
process's client is one of N clients of the engines, as vLLM's API server scale-out. Here the N
clients and the stand-in engines share the test's event loop: the handshake binder's INIT lists
every client's addresses, the engines connect to all of them, each request's outputs come back to
the client that sent it, and a restarted client or a new binder picks up engines that say nothing."""

from __future__ import annotations

import asyncio
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from inference.routing.workers import EngineSpec, WorkerRecord
from inference.upstreams.engine import EngineRequest, FinishReason, SamplingParams
from inference.upstreams.zmq.addresses import ZmqAddressError, zmq_addresses
from inference.upstreams.zmq.client import ZmqEngineClient
from standins.fixtures import FIXTURE_MODELS
from standins.zmq_engine import ZmqEngineConfig, ZmqEngineGroup, scripted_model

QWEN = str(FIXTURE_MODELS / "qwen3")
QWEN_TURN = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
CONFIG = ZmqEngineConfig(tokenizer=QWEN, max_model_len=4096, num_gpu_blocks=777)


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="zmq", dir="/tmp") as folder:  # ipc paths must stay short
        yield Path(folder)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Gateway:
    """N clients of one worker, as N serving processes hold them, and the worker's engines."""

    def __init__(self, ipc_dir: Path, count: int, dp_size: int = 1) -> None:
        self.url = f"ipc://{ipc_dir}/worker"
        self.handshake = f"tcp://127.0.0.1:{_free_port()}"
        self.run_dir = ipc_dir
        self.count, self.dp_size = count, dp_size
        self.clients = [self.client(index) for index in range(count)]
        self.group = ZmqEngineGroup(CONFIG, self.handshake, dp_size)
        self.model = scripted_model(CONFIG)

    def client(self, index: int) -> ZmqEngineClient:
        eos = self.model.eos_token_id if hasattr(self, "model") else scripted_model(CONFIG).eos_token_id
        return ZmqEngineClient(
            self.url, handshake_address=self.handshake, dp_size=self.dp_size, model_id="qwen3",
            eos_token_ids=(eos,), tokenizer_path=QWEN, health_timeout_secs=2.0, client_index=index,
            client_count=self.count, facts_dir=self.run_dir,
        )  # fmt: skip

    async def start(self) -> None:
        for client in self.clients:
            await client.start()
        self.clients[0].bind_handshake()  # the leader's health checks bind it
        await self.group.start()
        for client in self.clients:
            await client.wait_ready(10)

    async def stop(self) -> None:
        await self.group.stop()
        for client in self.clients:
            await client.close()

    def prompt(self) -> tuple[int, ...]:
        return self.model.encode(QWEN_TURN)


@pytest.fixture
async def gateway(ipc_dir: Path) -> AsyncIterator[Gateway]:
    g = Gateway(ipc_dir, 2)
    await g.start()
    yield g
    await g.stop()


async def _until(condition: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def test_client_zero_keeps_the_addresses_of_one_process_and_the_others_get_their_own() -> None:
    alone = zmq_addresses("ipc:///tmp/w")
    assert (alone.input, alone.output) == ("ipc:///tmp/w-in.sock", "ipc:///tmp/w-out.sock")
    assert (alone.inputs, alone.outputs) == (("ipc:///tmp/w-in.sock",), ("ipc:///tmp/w-out.sock",))
    first, second = (zmq_addresses("ipc:///tmp/w", None, index, 3) for index in (0, 2))
    assert (first.input, first.output) == (alone.input, alone.output)
    assert (second.input, second.output) == ("ipc:///tmp/w-in-2.sock", "ipc:///tmp/w-out-2.sock")
    assert first.inputs == second.inputs == ("ipc:///tmp/w-in.sock", "ipc:///tmp/w-in-1.sock", "ipc:///tmp/w-in-2.sock")
    assert first.handshake == second.handshake == alone.handshake
    with pytest.raises(ValueError):
        zmq_addresses("ipc:///tmp/w", None, 3, 3)


async def test_init_lists_every_client_and_each_request_is_answered_to_its_client(gateway: Gateway) -> None:
    engine = gateway.group.engines[0]
    addresses = engine.state.inits[0]["addresses"]
    assert addresses["inputs"] == list(gateway.clients[0].addresses.inputs)
    assert addresses["outputs"] == [client.addresses.output for client in gateway.clients]
    assert gateway.clients[0].binds_handshake and not gateway.clients[1].binds_handshake

    async def run(client: ZmqEngineClient, request_id: str) -> list[Any]:
        return [o async for o in client.generate(EngineRequest(request_id, gateway.prompt(), stream=True))]

    answers = await asyncio.gather(*(run(gateway.clients[i % 2], f"r{i}") for i in range(6)))
    expected = list(gateway.model.reply_ids("text", gateway.model.thinking_of(QWEN_TURN)))
    for outputs in answers:
        assert [t for o in outputs for t in o.token_ids] == [*expected, gateway.model.eos_token_id]
        assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.STOP
    assert engine.state.adds_by_client == {0: 3, 1: 3}
    # Each client's index after the request id (two processes' requests never share one) and in client_index.
    assert {(add[0], add[11]) for add in engine.state.adds} == {(f"r{i}-c{i % 2}", i % 2) for i in range(6)}


async def test_utility_calls_come_back_to_the_caller(gateway: Gateway) -> None:
    healths = await asyncio.gather(*(client.health() for client in gateway.clients))
    assert all(health.healthy for health in healths)
    calls = gateway.group.engines[0].state.utility_calls
    assert sorted(call[0] for call in calls) == [0, 1]  # each call names its client, answered on its socket


async def test_the_engines_facts_reach_a_client_that_heard_nothing_of_them(gateway: Gateway) -> None:
    info = await gateway.clients[1].server_info()
    assert info["client_index"] == 1 and info["client_count"] == 2
    assert gateway.clients[1].max_model_len == 4096
    await gateway.clients[1].close()
    restarted = gateway.clients[1] = gateway.client(1)  # the serving process restarted: same addresses
    assert await restarted.open(10)  # the engine's sockets reconnect and say nothing: found by a probe
    assert restarted.max_model_len == 4096  # its ready response, from what the binder shared
    assert restarted.ranks[0].num_gpu_blocks == 777  # READY's, heard by the binder only
    outputs = [o async for o in restarted.generate(EngineRequest("after", gateway.prompt()))]
    assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.STOP
    assert gateway.group.engines[0].state.adds_by_client[1] == 1


async def test_abort_from_a_client_that_does_not_bind_the_handshake(ipc_dir: Path) -> None:
    g = Gateway(ipc_dir, 2)
    slow = ZmqEngineConfig(tokenizer=QWEN, delay_ms=50, chunk_tokens=1)
    g.group = ZmqEngineGroup(slow, g.handshake)
    await g.start()
    try:
        engine = g.group.engines[0]
        request = EngineRequest("gone", g.prompt(), SamplingParams(max_new_tokens=200), stream=True)
        async with aclosing(g.clients[1].generate(request)) as stream:
            async for _ in stream:
                break
        await _until(lambda: engine.state.abort_messages == [["gone-c1"]] and not engine.state.running)
    finally:
        await g.stop()


async def test_engine_death_reaches_every_client_and_a_new_engine_serves_both(gateway: Gateway) -> None:
    await gateway.group.engines[0].die()
    await _until(lambda: not any(client.ready for client in gateway.clients))
    gateway.group = ZmqEngineGroup(CONFIG, gateway.handshake)
    await gateway.group.start()
    for client in gateway.clients:
        await client.wait_ready(10)
        outputs = [o async for o in client.generate(EngineRequest(f"c{client.client_index}", gateway.prompt()))]
        assert outputs[-1].finish is not None
    assert gateway.group.engines[0].state.adds_by_client == {0: 1, 1: 1}


async def test_another_process_takes_the_handshake_when_the_binder_is_gone(gateway: Gateway) -> None:
    await gateway.clients[0].close()  # the leader died
    assert await gateway.clients[1].open(5, handshake=True)  # the next leader's health check binds it
    assert gateway.clients[1].binds_handshake
    await gateway.group.stop()  # an engine restarts: it handshakes with the new binder
    gateway.group = ZmqEngineGroup(CONFIG, gateway.handshake)
    await gateway.group.start()
    await gateway.group.ready()
    assert gateway.group.engines[0].state.inits[0]["addresses"]["outputs"] == list(gateway.clients[1].addresses.outputs)
    gateway.clients[0] = gateway.client(0)  # the old leader, restarted, serves without the handshake
    assert await gateway.clients[0].open(10)
    assert not gateway.clients[0].binds_handshake
    for client in gateway.clients:
        await client.wait_ready(10)
        outputs = [o async for o in client.generate(EngineRequest(f"n{client.client_index}", gateway.prompt()))]
        assert outputs[-1].finish is not None


async def test_the_same_request_id_from_two_processes_is_two_engine_requests(gateway: Gateway) -> None:
    request = EngineRequest("rid", gateway.prompt(), SamplingParams(max_new_tokens=4))

    async def run(client: ZmqEngineClient) -> list[Any]:
        return [o async for o in client.generate(request)]

    answers = await asyncio.gather(*(run(client) for client in gateway.clients))
    assert all(outputs[-1].finish is not None and outputs[-1].completion_tokens == 4 for outputs in answers)
    assert sorted(add[0] for add in gateway.group.engines[0].state.adds) == ["rid-c0", "rid-c1"]


async def test_abort_by_the_gateway_request_id(ipc_dir: Path) -> None:
    g = Gateway(ipc_dir, 2)
    g.group = ZmqEngineGroup(ZmqEngineConfig(tokenizer=QWEN, delay_ms=50, chunk_tokens=1), g.handshake)
    await g.start()
    try:
        request = EngineRequest("mine", g.prompt(), SamplingParams(max_new_tokens=200, n=2), stream=True)
        async with aclosing(g.clients[1].generate(request)) as stream:
            await anext(stream)
            await g.clients[1].abort("mine")
            finishes = [o.finish.reason async for o in stream if o.finish is not None]
        assert finishes == [FinishReason.ABORT, FinishReason.ABORT]
        engine = g.group.engines[0]
        await _until(lambda: [sorted(ids) for ids in engine.state.abort_messages] == [["0_mine-c1", "1_mine-c1"]])
    finally:
        await g.stop()


async def test_the_leaders_loads_include_stats_another_process_received(gateway: Gateway) -> None:
    """vLLM gives a step's scheduler stats to one client: those of client 1's requests reach client
    0 (the leader, whose load monitor reports for the host) through the run directory."""
    gateway.group.engines[0].state.stats = {"num_waiting_reqs": 7, "num_running_reqs": 2, "kv_cache_usage": 0.25}
    outputs = [o async for o in gateway.clients[1].generate(EngineRequest("busy", gateway.prompt()))]
    assert outputs[-1].finish is not None
    assert gateway.clients[0].ranks[0].raw_stats is None  # client 0 got none itself
    assert (await gateway.clients[1].loads())[0]["num_waiting_reqs"] == 7

    async def shared() -> bool:
        return (await gateway.clients[0].loads())[0]["num_waiting_reqs"] == 7

    async with asyncio.timeout(10):
        while not await shared():
            await asyncio.sleep(0.05)
    load = (await gateway.clients[0].loads())[0]
    assert load["num_running_reqs"] == 2 and load["token_usage"] == 0.25
    assert load["max_total_num_tokens"] == 777 * 16  # the capacity from the handshake's facts
    # Stats of its own that are newer win again.
    gateway.group.engines[0].state.stats = {"num_waiting_reqs": 1}
    assert [o async for o in gateway.clients[0].generate(EngineRequest("own", gateway.prompt()))][-1].finish
    assert (await gateway.clients[0].loads())[0]["num_waiting_reqs"] == 1


async def test_dp_size_two_from_a_client_that_hears_no_wave_complete(ipc_dir: Path) -> None:
    g = Gateway(ipc_dir, 2, dp_size=2)
    await g.start()
    try:
        for i in range(2):
            request = EngineRequest(f"w{i}", g.prompt(), SamplingParams(max_new_tokens=2), data_parallel_rank=0)
            outputs = [o async for o in g.clients[1].generate(request)]
            assert outputs[-1].finish is not None
        other = g.group.engines[1]
        await _until(lambda: len(other.state.waves) == 2)  # woken with each request: client 1 cannot know they paused
        assert all(wave[1] == 0 for wave in other.state.waves)
        assert not g.clients[1].ranks[0].in_flight
    finally:
        await g.stop()


async def test_a_busy_handshake_address_is_taken_once_it_is_free(gateway: Gateway) -> None:
    with pytest.raises(ZmqAddressError, match="already bound"):
        gateway.clients[1].bind_handshake()  # still held by client 0 (the old leader closing)
    health = await gateway.clients[1].health()
    assert health.healthy and not gateway.clients[1].binds_handshake  # the engines in service need none
    await gateway.clients[0].close()
    assert (await gateway.clients[1].health()).healthy
    assert gateway.clients[1].binds_handshake


@pytest.mark.parametrize(("count", "expected"), [(None, (0, 1, False)), ("1", (0, 1, False)), ("3", (2, 3, True))])
def test_a_serving_process_is_the_client_its_place_says(
    monkeypatch: pytest.MonkeyPatch, ipc_dir: Path, count: str | None, expected: tuple[int, int, bool]
) -> None:
    if count is not None:  # what the supervisor gives each serving process
        monkeypatch.setenv("GW_RUN_DIR", str(ipc_dir))
        monkeypatch.setenv("GW_SERVING_INDEX", str(int(count) - 1))
        monkeypatch.setenv("GW_SERVING_PROCESSES", count)
    else:
        monkeypatch.delenv("GW_RUN_DIR", raising=False)
    record = WorkerRecord(id="w", url=f"ipc://{ipc_dir}/engine", model_id="qwen3", runtime_type="vllm",
                          status="ready", engine=EngineSpec(tokenizer=QWEN))  # type: ignore[arg-type]  # fmt: skip
    client = ZmqEngineClient.for_worker(record)
    assert (client.client_index, client.client_count, client.shared) == expected
    assert (client.facts_path is not None and client.facts_path.parent == ipc_dir) is expected[2]
    assert client.addresses.input == (f"ipc://{ipc_dir}/engine-in-2.sock" if expected[2] else f"ipc://{ipc_dir}/engine-in.sock")


async def test_a_restarted_gateway_of_one_process_finds_its_running_engine(ipc_dir: Path) -> None:
    """One serving process (no run directory): the gateway restarts while its engine keeps running.
    The engine's sockets reconnect by themselves and it says nothing (no HELLO, no first message):
    the new client finds it by a probe and serves it (without the handshake's facts)."""
    g = Gateway(ipc_dir, 1)
    g.clients = [ZmqEngineClient(g.url, handshake_address=g.handshake, eos_token_ids=(g.model.eos_token_id,))]
    await g.start()
    try:
        await g.clients[0].close()
        again = g.clients[0] = ZmqEngineClient(g.url, handshake_address=g.handshake, eos_token_ids=(g.model.eos_token_id,))
        assert await again.open(10, handshake=True)
        assert again.max_model_len is None  # nobody kept the ready response
        outputs = [o async for o in again.generate(EngineRequest("again", g.prompt()))]
        assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.STOP
        assert len(g.group.engines[0].state.inits) == 1  # no second handshake
    finally:
        await g.stop()
