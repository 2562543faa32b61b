"""Socket and handshake-port derivation of ZMQ workers, and the transport's registration failures."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from inference.upstreams.zmq.addresses import ZmqAddressError, fnv1a_64, handshake_port, ipc_path, zmq_addresses
from inference.upstreams.zmq.client import ZmqEngineClient


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="zmq", dir="/tmp") as folder:  # ipc paths must stay short
        yield Path(folder)


def test_fnv1a_64_known_vectors() -> None:
    assert fnv1a_64(b"") == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8


def test_handshake_port_is_derived_from_the_path_bytes() -> None:
    assert handshake_port("foobar") == 20000 + 0x85944171F73967E8 % 10000 == 26968
    assert handshake_port("/tmp/vllm-engine") == 27670
    assert all(20000 <= handshake_port(f"/run/engine-{i}") <= 29999 for i in range(200))


def test_socket_addresses_of_an_ipc_worker() -> None:
    addresses = zmq_addresses("ipc:///tmp/vllm-engine")
    assert addresses.input == "ipc:///tmp/vllm-engine-in.sock"
    assert addresses.output == "ipc:///tmp/vllm-engine-out.sock"
    assert addresses.handshake == "tcp://127.0.0.1:27670"
    given = zmq_addresses("ipc:///tmp/vllm-engine", "tcp://10.0.0.5:5555")
    assert given.handshake == "tcp://10.0.0.5:5555"
    assert given.input == "ipc:///tmp/vllm-engine-in.sock"


@pytest.mark.parametrize("address", ["ipc:///tmp/h", "http://127.0.0.1:5555", "127.0.0.1:5555", "tcp://"])
def test_a_handshake_address_that_is_not_tcp_fails(address: str) -> None:
    with pytest.raises(ZmqAddressError, match="tcp://"):
        zmq_addresses("ipc:///tmp/vllm-engine", address)
    with pytest.raises(ZmqAddressError):
        ZmqEngineClient("ipc:///tmp/vllm-engine", handshake_address=address)


@pytest.mark.parametrize("url", ["ipc://", "grpc://127.0.0.1:1", "IPC:///tmp/x"])
def test_only_ipc_urls_with_a_path(url: str) -> None:
    with pytest.raises(ZmqAddressError):
        ipc_path(url)


async def test_an_already_bound_handshake_address_fails(ipc_dir: Path) -> None:
    context = zmq.Context()
    taken = context.socket(zmq.ROUTER)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    client = ZmqEngineClient(f"ipc://{ipc_dir}/w", handshake_address=f"tcp://127.0.0.1:{port}")
    try:
        with pytest.raises(ZmqAddressError, match="already bound"):
            await client.start()
        assert not Path(f"{ipc_dir}/w-in.sock").exists()  # nothing left bound
    finally:
        await client.close()
        taken.close(linger=0)
        context.term()


async def test_two_workers_on_one_path_the_second_fails(ipc_dir: Path) -> None:
    first = ZmqEngineClient(f"ipc://{ipc_dir}/w", handshake_address="tcp://127.0.0.1:*")
    await first.start()
    second = ZmqEngineClient(f"ipc://{ipc_dir}/w", handshake_address=first.handshake_endpoint)
    try:
        with pytest.raises(ZmqAddressError, match="already bound"):
            await second.start()
    finally:
        await second.close()
        await first.close()
