"""The ZMQ stand-in with several clients, as vLLM's EngineCore serves an API server scale-out
(``vllm/v1/engine/core.py``: ``process_input_sockets``, ``process_output_sockets``), against raw
sockets rather than the gateway's client: it connects to every input and output address the INIT
gives, registers on each input, and sends a request's outputs to its ADD's ``client_index``, a
utility answer to its caller, a data-parallel wave's end to client 0, ``ENGINE_CORE_DEAD`` to all."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from typing import Any

import pytest
import zmq
import zmq.asyncio

from inference.upstreams.zmq import codec
from standins.fixtures import FIXTURE_MODELS
from standins.zmq_engine import ZmqEngineConfig, ZmqEngineGroup, scripted_model
from tests.standins.test_zmq_engine_wire import _add, strict

QWEN = str(FIXTURE_MODELS / "qwen3")
CLIENTS = 3


class Clients:
    """The front ends' side, raw: one handshake ROUTER, and an input ROUTER and output PULL per client."""

    def __init__(self, folder: str) -> None:
        self.context = zmq.asyncio.Context()
        self.handshake = self.context.socket(zmq.ROUTER)
        self.handshake_address = f"tcp://127.0.0.1:{self.handshake.bind_to_random_port('tcp://127.0.0.1')}"
        self.input_addresses = [f"ipc://{folder}/in-{i}" for i in range(CLIENTS)]
        self.output_addresses = [f"ipc://{folder}/out-{i}" for i in range(CLIENTS)]
        self.inputs, self.outputs = [], []
        for address in self.input_addresses:
            socket = self.context.socket(zmq.ROUTER)
            socket.bind(address)
            self.inputs.append(socket)
        for address in self.output_addresses:
            socket = self.context.socket(zmq.PULL)
            socket.bind(address)
            self.outputs.append(socket)

    async def accept(self, dp_size: int) -> list[bytes]:
        identities, ready = [], 0
        while ready < dp_size:
            identity, payload = await self.handshake.recv_multipart()
            if codec.decode_handshake(payload)["status"] == "HELLO":
                init = codec.handshake_init(self.input_addresses, self.output_addresses, data_parallel_size=dp_size)
                await self.handshake.send_multipart([identity, init])
                identities.append(identity)
            else:
                ready += 1
        return identities

    async def send(self, client: int, identity: bytes, kind: codec.RequestType, message: Any) -> None:
        await self.inputs[client].send_multipart([identity, kind.value, codec.encode(message)])

    async def pending(self, client: int) -> int:
        return await self.outputs[client].poll(200)

    def close(self) -> None:
        self.context.destroy(linger=0)


@pytest.fixture
async def clients() -> AsyncIterator[Clients]:
    with tempfile.TemporaryDirectory(prefix="zmqcl", dir="/tmp") as folder:
        c = Clients(folder)
        yield c
        c.close()


def _from(client: int, request_id: str, prompt: list[int], eos: int | None, **sampling: Any) -> Any:
    request = _add(request_id, prompt, eos, **sampling)
    request.client_index = client
    return request


async def test_outputs_go_to_the_client_that_sent_the_request(clients: Clients) -> None:
    config = ZmqEngineConfig(tokenizer=QWEN, chunk_tokens=2)
    model = scripted_model(config)
    group = ZmqEngineGroup(config, clients.handshake_address)
    await group.start()
    try:
        (identity,) = await clients.accept(1)
        for client in range(CLIENTS):  # registered on every input with its ready response
            got_identity, response = await clients.inputs[client].recv_multipart()
            assert got_identity == identity and codec.decode_ready_response(response)["data_parallel_rank"] == 0
        prompt = list(model.tokenizer.encode("Hello there").ids)
        await clients.send(2, identity, codec.RequestType.ADD, _from(2, "from-2", prompt, model.eos_token_id, max_tokens=4))
        tokens = 0
        while True:
            message = strict(await clients.outputs[2].recv())
            tokens += sum(len(o.new_token_ids) for o in message.outputs)
            if any(o.finish_reason is not None for o in message.outputs):
                break
        assert tokens == 4
        assert not await clients.pending(0) and not await clients.pending(1)
        assert group.engines[0].state.adds_by_client == {2: 1}

        # A request sent on client 0's socket naming client 1 is answered to client 1, as vLLM routes
        # by the request's client_index, not by the socket it came in on.
        await clients.send(0, identity, codec.RequestType.ADD, _from(1, "to-1", prompt, model.eos_token_id, max_tokens=1))
        assert strict(await clients.outputs[1].recv()).outputs[0].request_id == "to-1"

        await clients.send(1, identity, codec.RequestType.UTILITY, [1, 9, "is_sleeping", []])
        utility = strict(await clients.outputs[1].recv())
        assert utility.utility_output is not None and utility.utility_output.call_id == 9
        assert not await clients.pending(0) and not await clients.pending(2)

        await group.engines[0].die()
        for client in range(CLIENTS):
            assert await clients.outputs[client].recv() == codec.ENGINE_CORE_DEAD
    finally:
        await group.stop()


async def test_a_waves_end_goes_to_client_zero(clients: Clients) -> None:
    config = ZmqEngineConfig(tokenizer=QWEN)
    model = scripted_model(config)
    group = ZmqEngineGroup(config, clients.handshake_address, dp_size=2)
    await group.start()
    try:
        identities = await clients.accept(2)
        for _ in identities:  # each engine's ready response on client 1's input: until then its ROUTER drops what it sends them
            await clients.inputs[1].recv_multipart()
        prompt = list(model.tokenizer.encode("Hello").ids)
        first = sorted(identities)[0]
        await clients.send(1, first, codec.RequestType.ADD, _from(1, "w", prompt, model.eos_token_id, max_tokens=1))
        step = strict(await clients.outputs[1].recv())
        assert step.outputs[0].request_id == "w" and step.finished_requests == ["w"]
        wave = strict(await clients.outputs[0].recv())  # no DP coordinator: to client 0
        assert wave.wave_complete == 0 and wave.outputs == []
        assert not await clients.pending(1)
    finally:
        await group.stop()
