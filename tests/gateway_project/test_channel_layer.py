"""The Channels layer settings: in-memory without Redis; with Redis, an idle receive (how every
gateway process waits for registry notices) outlasts channels_redis's 5 s blocking read."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer

from common.envconf import channel_layer_from_url

REDIS = "redis://127.0.0.1:6379/0"


def test_without_redis_the_layer_is_in_memory() -> None:
    assert channel_layer_from_url(None)["BACKEND"] == "channels.layers.InMemoryChannelLayer"
    assert InMemoryChannelLayer  # the backend named exists


async def test_an_idle_receive_survives_the_blocking_read_and_gets_the_next_group_message() -> None:
    config = channel_layer_from_url(REDIS)
    layer = RedisChannelLayer(**config["CONFIG"], prefix=f"gwtest-{uuid.uuid4().hex[:8]}")
    try:
        await layer.connection(0).ping()
    except OSError:
        pytest.skip("Redis is not running on 127.0.0.1:6379")
    channel = await layer.new_channel()
    group = "gateway.registry.test"
    await layer.group_add(group, channel)
    try:
        waiting = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(6.5)  # past the 5 s blocking read: with a 5 s socket timeout this raised
        assert not waiting.done(), waiting.exception() if waiting.done() else None
        await layer.group_send(group, {"type": "registry.changed"})
        message = await asyncio.wait_for(waiting, 10)
        assert message == {"type": "registry.changed"}
    finally:
        await layer.group_discard(group, channel)
        await layer.flush()
        await layer.close_pools()
