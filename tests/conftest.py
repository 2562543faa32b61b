"""Shared fixtures: a real mock worker on loopback, the gateway's ASGI app in-process, and three
actors (an owner tenant, a teammate, a stranger) for auth and ownership checks."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Iterator

import httpx
import pytest
from aiohttp import web
from django.db import connections

from gateway_project.asgi import application
from administration.lifecycle import LIFECYCLE
from common.config import GatewayConfig, install_config
from inference.routing.breaker import Resilience
from inference.routing.registry import REGISTRY
from inference.routing.workers import WorkerRecord, WorkerStatus
from inference.dataplane import reset_data_plane
from standins.mock_provider import ProviderConfig, ProviderState, build_provider_app, provider_state
from standins.mock_worker import MockWorkerConfig, MockWorkerState, build_app, mock_state
from tests.log_watch import MARKER, describe, watching_escapes


@pytest.fixture(autouse=True)
def _no_unhandled_exceptions(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test during which an unhandled exception was logged (tests/log_watch.py), unless it is
    marked ``escapes_expected``."""
    if request.node.get_closest_marker(MARKER) is not None:
        yield
        return
    with watching_escapes() as watch:
        yield
    if watch.records:
        pytest.fail(f"unhandled exception logged during the test:\n{describe(watch.records)}", pytrace=False)


@pytest.fixture(autouse=True)
def _threads_give_back_their_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test's ``asyncio.to_thread`` call closes the Django connections its thread opened, as the
    product's :func:`common.db.arun_db` does. A thread's connection goes back to the Postgres
    pool only when closed: each test's event loop brings new executor threads, so ORM calls left
    open there held pooled connections past their test until the pool ran dry (PoolTimeout, the store
    marked down, every later test failing)."""
    original = asyncio.to_thread

    async def to_thread(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def closing() -> Any:
            try:
                return func(*args, **kwargs)
            finally:
                if connections["default"].vendor != "sqlite":
                    connections.close_all()

        return await original(closing)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on (for a process or server started next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post_scope(path: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> dict[str, Any]:
    """The ASGI scope of a JSON POST to ``path`` as a server hands it to the app (host ``gateway``, the
    client on loopback), for tests that drive the app's receive and send themselves (a client that
    leaves, a disconnect while queued)."""
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"gateway"), (b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 5000), "server": ("gateway", 80),
    }  # fmt: skip


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Poll an async condition every 50 ms; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached in time")


@dataclass(frozen=True)
class Actor:
    tenant_id: str
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


ALICE = Actor("acme", "sk-acme-alice-0001")  # the owner tenant
BOB = Actor("acme", "sk-acme-bob-0002")  # a teammate in the same tenant
CHARLIE = Actor("globex", "sk-globex-charlie-0003")  # a stranger
SHARED_KEY = "sk-shared-admin-key"


@pytest.fixture
def alice() -> Actor:
    return ALICE


@pytest.fixture
def bob() -> Actor:
    return BOB


@pytest.fixture
def charlie() -> Actor:
    return CHARLIE


@dataclass
class RunningWorker:
    url: str
    model: str
    app: web.Application

    @property
    def state(self) -> MockWorkerState:
        return mock_state(self.app)

    def requests(self) -> list[dict]:
        return list(self.state.requests)


WorkerFactory = Callable[..., Awaitable[RunningWorker]]


@pytest.fixture
async def start_worker() -> AsyncIterator[WorkerFactory]:
    """Start real mock workers on 127.0.0.1 (random ports) inside the test's event loop."""
    runners: list[web.AppRunner] = []

    async def start(model: str = "mock-model", **options: object) -> RunningWorker:
        app = build_app(MockWorkerConfig(model=model, **options))  # type: ignore[arg-type]
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return RunningWorker(url=f"http://127.0.0.1:{port}", model=model, app=app)

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def worker(start_worker: WorkerFactory) -> RunningWorker:
    return await start_worker()


PROVIDER_KEY = "sk-provider-test"


@dataclass
class Provider:
    """Our stand-in of an external OpenAI-compatible provider, running on loopback."""

    url: str
    app: web.Application

    @property
    def state(self) -> ProviderState:
        return provider_state(self.app)

    def calls(self, path: str = "/v1/responses") -> list[dict[str, Any]]:
        return [request for request in self.state.requests if request["path"] == path]


@contextlib.asynccontextmanager
async def serving_provider(config: ProviderConfig) -> AsyncIterator[Provider]:
    """The stand-in provider with ``config`` (its flavour, models and key), on loopback while inside."""
    app = build_provider_app(config)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield Provider(f"http://127.0.0.1:{runner.addresses[0][1]}", app)
    finally:
        await runner.cleanup()


@pytest.fixture
async def provider() -> AsyncIterator[Provider]:
    """The stand-in provider (models gpt-4o-mini and gpt-4.1, key :data:`PROVIDER_KEY`)."""
    async with serving_provider(ProviderConfig(api_key=PROVIDER_KEY)) as running:
        yield running


def record_for(worker: RunningWorker | str, model: str | None = None, status: str = "ready", api_key: str | None = None) -> WorkerRecord:
    url = worker if isinstance(worker, str) else worker.url
    model_id = model if model is not None or isinstance(worker, str) else worker.model
    return WorkerRecord(
        id=str(uuid.uuid4()), url=url, model_id=model_id, runtime_type="sglang", status=WorkerStatus(status), api_key=api_key
    )


GatewayFactory = Callable[..., httpx.AsyncClient]


def open_gateway(records: Iterable[WorkerRecord] = (), **config: object) -> httpx.AsyncClient:
    """The full ASGI application in-process, with a registry published from the given records
    (the control plane's discovery is tested on its own). Undo with :func:`close_gateways`."""
    gateway_config = GatewayConfig(**config)  # type: ignore[arg-type]
    install_config(gateway_config, export=False)
    reset_data_plane(gateway_config)
    resilience = Resilience.from_config(gateway_config)
    REGISTRY.publish([dataclasses.replace(r, resilience=resilience) for r in records], dict(gateway_config.model_aliases))
    LIFECYCLE.started = True
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://gateway", timeout=30)


async def close_gateways(clients: Iterable[httpx.AsyncClient]) -> None:
    """Close the clients and the runtime's upstream sessions; back to an empty, unconfigured gateway."""
    for client in clients:
        await client.aclose()
    from inference.dataplane import data_plane

    await data_plane().aclose()
    REGISTRY.publish([], {})
    LIFECYCLE.started = False
    install_config(GatewayConfig(), export=False)
    reset_data_plane(GatewayConfig())


@pytest.fixture
async def make_gateway() -> AsyncIterator[GatewayFactory]:
    """:func:`open_gateway` as a fixture: as many as the test makes, all closed after it."""
    clients: list[httpx.AsyncClient] = []

    def make(records: Iterable[WorkerRecord] = (), **config: object) -> httpx.AsyncClient:
        client = open_gateway(records, **config)
        clients.append(client)
        return client

    yield make
    await close_gateways(clients)


@pytest.fixture
async def gateway(make_gateway: GatewayFactory, worker: RunningWorker) -> httpx.AsyncClient:
    """A gateway with one ready worker serving mock-model and the alias ``fast``."""
    return make_gateway([record_for(worker)], model_aliases=(("fast", worker.model),))


@pytest.fixture(scope="session", autouse=True)
def _close_database_connections(django_db_setup: None) -> Iterator[None]:
    """Close every database connection the suite's threads left open (job threads, executor threads of
    finished event loops) before pytest-django drops the test database: Postgres refuses to drop a
    database "being accessed by other users". Connections are per thread, so they are found by type."""
    yield
    import gc

    from django.db import connections

    connections.close_all()
    for connection in connections.all(initialized_only=True):
        close_pool = getattr(connection, "close_pool", None)
        if close_pool is not None:
            close_pool()
    try:
        import psycopg
    except ImportError:
        return
    # By type: isinstance() of a dead weakref.proxy in the heap raises ReferenceError.
    for leftover in [o for o in gc.get_objects() if issubclass(type(o), psycopg.Connection)]:
        if not leftover.closed:
            leftover.close()
