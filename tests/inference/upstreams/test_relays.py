"""Relays are registered by transport with a decorator; the data plane builds one of each from the
registry, and a transport without a relay is the spec's 501."""

from __future__ import annotations

import pytest

from common.config import GatewayConfig
from inference.dataplane import DataPlane
from inference.errors import GatewayError
from inference.routing.workers import Transport, transport_of
from inference.upstreams import RELAYS
from inference.upstreams.http import HttpRelay
from inference.upstreams.registry import NamedRegistry, UnknownUpstream


def test_the_http_relay_is_registered_and_built_per_data_plane() -> None:
    assert RELAYS.get(Transport.HTTP) is HttpRelay
    dp = DataPlane.build(GatewayConfig())
    assert isinstance(dp.relay_for(Transport.HTTP, "/v1/chat/completions"), HttpRelay)


def test_a_transport_without_a_relay_is_501() -> None:
    dp = DataPlane.build(GatewayConfig())
    with pytest.raises(GatewayError) as raised:
        dp.relay_for(Transport.GRPC, "/v1/embeddings")
    assert raised.value.status == 501 and raised.value.code == "endpoint_not_supported"


def test_names_are_registered_once() -> None:
    registry: NamedRegistry[object] = NamedRegistry("thing")

    @registry.register("a")
    class A:
        pass

    with pytest.raises(ValueError):

        @registry.register("a")
        class B:
            pass

    assert registry.get("a") is A and "a" in registry and list(registry) == ["a"]
    with pytest.raises(UnknownUpstream):
        registry.get("b")


@pytest.mark.parametrize(
    ("url", "transport"),
    [("http://h:1", Transport.HTTP), ("https://h", Transport.HTTP), ("grpc://h:1", Transport.GRPC),
     ("grpcs://h:1", Transport.GRPC), ("ipc:///tmp/engine", Transport.ZMQ)],
)
def test_a_worker_url_names_its_transport(url: str, transport: Transport) -> None:
    assert transport_of(url) is transport and transport_of(url) == transport.value
