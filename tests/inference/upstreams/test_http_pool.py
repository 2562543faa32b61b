"""A worker's http_pool block in the HTTP relay (spec 3, docs/DECISIONS.md D102): its timeout_secs
bounds its own exchanges only, pool_idle_timeout_secs expires its idle connections (0 and the flag's
0 keep them), pool_max_idle_per_host caps the idle ones kept; and the block reaches the record."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from django.utils import timezone

from administration.models import Worker
from administration.workers import http_pool_defaults, worker_records
from common.config import ConfigError, GatewayConfig, parse_gateway_args
from inference import dataplane
from inference.routing.workers import HttpPool, Transport, WorkerRecord
from inference.upstreams import http
from tests.conftest import GatewayFactory, WorkerFactory, record_for, until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
ANSWER = b'{"id":"x","object":"chat.completion","choices":[]}'
DEFAULTS = http_pool_defaults(GatewayConfig())


class StandIn:
    """A keep-alive HTTP/1.1 worker that counts the connections it accepted and those the gateway
    closed; ``hold`` (when set) keeps each request until that many are in at once."""

    def __init__(self, hold: int = 0) -> None:
        self.accepted = 0
        self.closed = 0
        self.hold = hold
        self._waiting = 0
        self._all_in = asyncio.Event()
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                if self.hold:
                    self._waiting += 1
                    if self._waiting >= self.hold:
                        self._all_in.set()
                    await self._all_in.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed += 1
        finally:
            writer.close()


@asynccontextmanager
async def stand_in(hold: int = 0) -> AsyncIterator[StandIn]:
    worker = StandIn(hold)
    server = await asyncio.start_server(worker.handle, "127.0.0.1", 0)
    worker.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield worker
    finally:
        server.close()


def pooled(record: WorkerRecord, **fields: int) -> WorkerRecord:
    """The record with an http_pool block of these fields over the defaults, as the store gives it."""
    return dataclasses.replace(record, http_pool=HttpPool.of(fields, DEFAULTS))


def idle_pool() -> http._IdlePool:
    relay = dataplane.data_plane().relays[Transport.HTTP]
    assert isinstance(relay, http.HttpRelay)
    return relay._pools[asyncio.get_running_loop()]


async def test_a_workers_timeout_secs_bounds_its_exchanges_alone(make_gateway: GatewayFactory, start_worker: WorkerFactory) -> None:
    """A worker whose block says timeout_secs 1 times out (504 upstream_timeout, its own seconds
    named) on an answer that takes 1.5 s; another without a block answers it under the flag's 1800 s."""
    short, default = await start_worker("short"), await start_worker("default")
    client = make_gateway([pooled(record_for(short), timeout_secs=1), record_for(default)], retry_max_retries=0)
    slow = {"mock": {"tokens": 3, "delay_ms": 500}}
    timed_out = await client.post("/v1/chat/completions", json={**CHAT, **slow, "model": "short"})
    assert timed_out.status_code == 504
    assert timed_out.headers["x-gw-error-code"] == "upstream_timeout"
    assert "within 1 seconds" in timed_out.json()["error"]["message"]
    answered = await client.post("/v1/chat/completions", json={**CHAT, **slow, "model": "default"})
    assert answered.status_code == 200


async def test_pool_idle_timeout_secs_expires_a_workers_idle_connections(make_gateway: GatewayFactory) -> None:
    """Idle 0.2 s: the sweep closes the worker's idle connection once its time passed, and the next
    request opens a new one; a worker of block 0 keeps its connection, reused after the same wait."""
    async with stand_in() as expiring, stand_in() as kept:
        quick = dataclasses.replace(DEFAULTS, idle_secs=0.2)  # the block's whole seconds, shortened here
        client = make_gateway([
            dataclasses.replace(record_for(expiring.url, model="expiring"), http_pool=quick),
            pooled(record_for(kept.url, model="kept"), pool_idle_timeout_secs=0),
        ])  # fmt: skip
        for model in ("expiring", "expiring", "kept", "kept"):
            assert (await client.post("/v1/chat/completions", json={**CHAT, "model": model})).status_code == 200
        assert (expiring.accepted, kept.accepted) == (1, 1)
        await until(_async(lambda: expiring.closed == 1), timeout=5)
        await asyncio.sleep(0.3)
        for model in ("expiring", "kept"):
            assert (await client.post("/v1/chat/completions", json={**CHAT, "model": model})).status_code == 200
        assert (expiring.accepted, kept.accepted) == (2, 1)
        assert kept.closed == 0


async def test_idle_time_zero_keeps_connections_and_runs_no_sweep(make_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """--upstream-pool-idle-timeout-secs 0: no sweep is scheduled, and a connection idle an hour (the
    relay's clock moved on) is still reused; under the flag's default 3 s the same wait replaces it."""
    async with stand_in() as worker:
        client = make_gateway([record_for(worker.url, model="m")], upstream_pool_idle_timeout_secs=0)
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert idle_pool()._sweep is None
        now = http.monotonic()
        monkeypatch.setattr(http, "monotonic", lambda: now + 3600)
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert worker.accepted == 1 and idle_pool()._sweep is None
    monkeypatch.undo()
    async with stand_in() as worker:
        client = make_gateway([record_for(worker.url, model="m")])
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert idle_pool()._sweep is not None
        now = http.monotonic()
        monkeypatch.setattr(http, "monotonic", lambda: now + 3600)
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert worker.accepted == 2


async def test_pool_max_idle_per_host_one_keeps_one_of_two_connections(make_gateway: GatewayFactory) -> None:
    """Two requests at once open two connections; with pool_max_idle_per_host 1 the second to come
    back is closed, one stays idle and serves the next request."""
    async with stand_in(hold=2) as worker:
        client = make_gateway([pooled(record_for(worker.url, model="m"), pool_max_idle_per_host=1)])
        answers = await asyncio.gather(*(client.post("/v1/chat/completions", json=CHAT) for _ in range(2)))
        assert [answer.status_code for answer in answers] == [200, 200]
        assert worker.accepted == 2
        await until(_async(lambda: worker.closed == 1), timeout=5)
        assert sum(len(idle) for idle in idle_pool()._idle.values()) == 1
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (worker.accepted, worker.closed) == (2, 1)


def test_the_block_reaches_the_record_over_the_flags() -> None:
    """Omitted fields take the flags (idle 0: forever); a block of none of the four (http2 alone) is
    no block; engine workers carry none (their clients do not read it)."""
    config = GatewayConfig(request_timeout_secs=60, upstream_pool_idle_timeout_secs=0)
    rows = [
        Worker(url="http://a:1", runtime_type="sglang", created_at=timezone.now(),
               settings={"http_pool": {"timeout_secs": 5, "pool_max_idle_per_host": 1, "connect_timeout_secs": 2}}),
        Worker(url="http://a:2", runtime_type="sglang", created_at=timezone.now(),
               settings={"http_pool": {"http2": False}}),
        Worker(url="http://a:3", runtime_type="sglang", created_at=timezone.now(),
               settings={"http_pool": {"pool_idle_timeout_secs": 7}}),
        Worker(url="grpc://a:4", runtime_type="sglang", created_at=timezone.now(),
               settings={"http_pool": {"timeout_secs": 5}}),
    ]  # fmt: skip
    pools = [record.http_pool for record in worker_records(config, rows)]
    assert pools == [HttpPool(1, float("inf"), 5.0, 2.0), None, HttpPool(500, 7.0, 60.0, 10.0), None]


def test_the_idle_flag_is_parsed_defaulted_and_checked() -> None:
    assert parse_gateway_args([]).upstream_pool_idle_timeout_secs == 3.0 < 5.0
    assert parse_gateway_args(["--upstream-pool-idle-timeout-secs", "0"]).upstream_pool_idle_timeout_secs == 0
    assert parse_gateway_args(["--upstream-pool-idle-timeout-secs", "2.5"]).upstream_pool_idle_timeout_secs == 2.5
    with pytest.raises(ConfigError, match="--upstream-pool-idle-timeout-secs"):
        parse_gateway_args(["--upstream-pool-idle-timeout-secs", "-1"])
    relay = http.HttpRelay.from_config(GatewayConfig(upstream_pool_idle_timeout_secs=0, request_timeout_secs=9))
    assert relay.defaults == HttpPool(500, float("inf"), 9.0, 10.0)


def _async(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def checked() -> bool:
        return bool(check())

    return checked
