"""Prefill and decode stand-ins: the mock worker (:mod:`standins.mock_worker`) in an SGLang
prefill/decode disaggregation role, for tests of the gateway's PD dispatch.

Start one with ``manage.py runmockworker --role prefill|decode [--bootstrap-port N]`` or in-process
with :func:`build_pd_app`. What a real SGLang PD server does that the gateway depends on:

* every generation request (chat, completions, generate, responses, messages) must carry
  ``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` (lists of equal length for a batch:
  ``bootstrap_room`` a list); without them, or with values of the wrong type, the worker answers
  400 as SGLang does;
* the two sides meet by ``bootstrap_room``: the prefill worker announces each room's KV as ready
  on its bootstrap server (``GET /_pd/bootstrap/{room}?wait=S`` on its own port and on
  ``--bootstrap-port``); the decode worker asks ``http://bootstrap_host:bootstrap_port`` (8998,
  SGLang's default, when the port is null) for every room before it answers, and fails with 500
  when the KV does not come within ``kv_timeout_s`` or the prefill side failed (a KV transfer that
  never arrives);
* faults on command, per request in the body's ``"mock": {"pd_fault": NAME or [NAMES]}`` (the same
  body reaches both sides) or for every request with ``--pd-fault``: ``prefill_fail`` (prefill
  answers 500), ``prefill_drop`` (prefill closes the connection without an answer), ``prefill_hang``
  (prefill never answers), and ``decode_fail``, ``decode_drop``, ``decode_hang`` likewise; and the
  failures a real SGLang PD engine reports, each a 500 with SGLang's own abort message:
  ``prefill_bootstrap_fail`` ("Prefill bootstrap failed for request ..."), ``prefill_transfer_fail``
  ("Prefill transfer failed ..."), ``decode_bootstrap_fail`` ("Decode handshake failed ...") and
  ``decode_transfer_fail`` ("Decode transfer failed ..."). A decode whose KV does not come answers
  SGLang's messages too: "Decode handshake failed" when the bootstrap server cannot be reached,
  "Decode transfer failed" when the prefill failed or the KV timed out.

Introspection: ``GET /_mock/pd`` gives ``{role, bootstrap_port, received[] (path and the bootstrap
fields of every generation request), ready, failed, cancelled, kv_waits, kv_failures}``;
``cancelled`` counts requests whose caller went away before the answer ended (the gateway aborting
this side). ``DELETE /_mock/pd`` resets them.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson
from aiohttp import web

from standins import mock_responses as mr
from standins.mock_worker import MockWorkerConfig, build_app

__all__ = [
    "DEFAULT_BOOTSTRAP_PORT",
    "PD_FAULTS",
    "PD_ROLES",
    "PdState",
    "PdWorkerConfig",
    "build_pd_app",
    "pd_state",
    "run_pd_worker",
    "wait_for_kv",
    "bootstrap_app",
    "engine_report",
    "kv_problem_report",
    "reported_fault",
]

PdRole = Literal["prefill", "decode"]
PD_ROLES: tuple[PdRole, ...] = ("prefill", "decode")
PD_FAULTS = (
    "prefill_fail", "prefill_drop", "prefill_hang", "decode_fail", "decode_drop", "decode_hang",
    "prefill_bootstrap_fail", "prefill_transfer_fail", "decode_bootstrap_fail", "decode_transfer_fail",
)
# SGLang's abort messages for a failed PD rendezvous or KV transfer, per side and stage (its
# scheduler's prepare_abort texts; the request ends with status 500).
_SGLANG_REPORTS = {
    ("prefill", "bootstrap"): "Prefill bootstrap failed",
    ("prefill", "transfer"): "Prefill transfer failed",
    ("decode", "bootstrap"): "Decode handshake failed",
    ("decode", "transfer"): "Decode transfer failed",
}
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's disaggregation bootstrap port when none is given
MAX_ROOM = 2**63 - 1
GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses", "/v1/messages"}
)
_ROOMS_KEPT = 4096
_RECEIVED_KEPT = 200
_JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class PdWorkerConfig:
    role: PdRole
    bootstrap_port: int | None = None  # the prefill's extra bootstrap listener (its own port serves it too)
    kv_timeout_s: float = 30.0  # how long a decode waits for a room's KV
    faults: tuple[str, ...] = ()  # faults applied to every request (--pd-fault)

    def __post_init__(self) -> None:
        if self.role not in PD_ROLES:
            raise ValueError(f"role must be one of {', '.join(PD_ROLES)}")
        if self.kv_timeout_s <= 0:
            raise ValueError("kv_timeout_s must be > 0")
        unknown = [fault for fault in self.faults if fault not in PD_FAULTS]
        if unknown:
            raise ValueError(f"unknown PD fault {unknown[0]!r} (one of {', '.join(PD_FAULTS)})")


@dataclass
class PdState:
    config: PdWorkerConfig
    received: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=_RECEIVED_KEPT))
    # The prefill side's rooms: True once its KV is ready, False when the prefill failed.
    rooms: OrderedDict[int, asyncio.Future[bool]] = field(default_factory=OrderedDict)
    ready: int = 0
    failed: int = 0
    cancelled: int = 0
    kv_waits: int = 0
    kv_failures: int = 0
    session: aiohttp.ClientSession | None = None
    # Set by a test: a commanded failure waits for this event before it is answered, so the test can
    # order it after the other side's request has arrived.
    failure_gate: asyncio.Event | None = None

    def room(self, room: int) -> asyncio.Future[bool]:
        future = self.rooms.get(room)
        if future is None:
            future = self.rooms[room] = asyncio.get_running_loop().create_future()
            while len(self.rooms) > _ROOMS_KEPT:
                _, old = self.rooms.popitem(last=False)
                if not old.done():
                    old.set_result(False)
        return future

    def settle(self, rooms: list[int], ready: bool) -> None:
        for room in rooms:
            future = self.room(room)
            if not future.done():
                future.set_result(ready)

    def summary(self) -> dict[str, Any]:
        return {
            "role": self.config.role,
            "bootstrap_port": self.config.bootstrap_port,
            "received": list(self.received),
            "ready": self.ready,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "kv_waits": self.kv_waits,
            "kv_failures": self.kv_failures,
        }

    def reset(self) -> None:
        self.received.clear()
        self.ready = self.failed = self.cancelled = self.kv_waits = self.kv_failures = 0


_STATE = web.AppKey("pd_state", PdState)


def pd_state(app: web.Application) -> PdState:
    """The PD state of an app made by :func:`build_pd_app`."""
    return app[_STATE]


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.Response(body=mr.error_body(status, message, param), status=status, headers=_JSON_HEADERS)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class _Bootstrap:
    hosts: list[str]
    ports: list[int | None]
    rooms: list[int]


def _bootstrap(body: Any) -> _Bootstrap:
    """The request's bootstrap fields, checked as SGLang checks them. Raises MockError(400)."""
    if not isinstance(body, dict):
        raise mr.MockError(400, "Request body must be a JSON object")
    missing = [name for name in ("bootstrap_host", "bootstrap_port", "bootstrap_room") if name not in body]
    if missing or body.get("bootstrap_room") is None or body.get("bootstrap_host") is None:
        name = missing[0] if missing else ("bootstrap_room" if body.get("bootstrap_room") is None else "bootstrap_host")
        raise mr.MockError(400, f"Disaggregated request requires {name} (bootstrap_host, bootstrap_port, bootstrap_room)", name)
    host, port, room = body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"]
    if isinstance(room, list):
        if not room or not isinstance(host, list) or not isinstance(port, list) or not len(host) == len(port) == len(room):
            raise mr.MockError(400, "bootstrap_host, bootstrap_port and bootstrap_room must be lists of one length", "bootstrap_room")
        hosts, ports, rooms = host, port, room
    else:
        hosts, ports, rooms = [host], [port], [room]
    for item in hosts:
        if not isinstance(item, str) or not item:
            raise mr.MockError(400, "bootstrap_host must be a non-empty string", "bootstrap_host")
    for item in ports:
        if item is not None and (not _is_int(item) or not 0 < item < 65536):
            raise mr.MockError(400, "bootstrap_port must be a port number or null", "bootstrap_port")
    for item in rooms:
        if not _is_int(item) or not 0 <= item <= MAX_ROOM:
            raise mr.MockError(400, f"bootstrap_room must be an integer in [0, {MAX_ROOM}]", "bootstrap_room")
    return _Bootstrap(hosts, ports, rooms)


def _faults(body: dict[str, Any], config: PdWorkerConfig) -> frozenset[str]:
    mock = body.get("mock")
    named: Any = mock.get("pd_fault") if isinstance(mock, dict) else None
    if named is None:
        named = []
    elif isinstance(named, str):
        named = [named]
    if not isinstance(named, list) or any(fault not in PD_FAULTS for fault in named):
        raise mr.MockError(400, f"mock.pd_fault must be one of {', '.join(PD_FAULTS)} or a list of them", "mock.pd_fault")
    role = config.role
    return frozenset(fault[len(role) + 1:] for fault in (*config.faults, *named) if fault.startswith(role + "_"))


async def _hang() -> None:
    await asyncio.Event().wait()


def _drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()


def engine_report(role: str, stage: str, room: int, reason: str) -> str:
    """SGLang's message for a failed PD ``stage`` (bootstrap or transfer) on the ``role`` side."""
    return (
        f"{_SGLANG_REPORTS[(role, stage)]} for request rank=0 bootstrap_room={room} "
        f"with exception KVTransferError(bootstrap_room={room}): {reason}"
    )


def kv_problem_report(room: int, problem: str) -> str:
    """A decode's message when :func:`wait_for_kv` gave ``problem``: a bootstrap server out of reach
    is a failed handshake, a prefill that failed or a KV that never came a failed transfer."""
    stage = "bootstrap" if problem.startswith("bootstrap server") else "transfer"
    return engine_report("decode", stage, room, f"KV transfer failed for bootstrap_room {room}: {problem}")


def reported_fault(role: str, faults: frozenset[str], room: int) -> str | None:
    """The engine's message when ``faults`` (this side's, role prefix removed) name a reported
    bootstrap or transfer failure, else None."""
    for stage in ("bootstrap", "transfer"):
        if f"{stage}_fail" in faults:
            return engine_report(role, stage, room, "failed on command (pd_fault)")
    return None


async def wait_for_kv(state: PdState, host: str, port: int | None, room: int) -> str | None:
    """None when the prefill side announced the room's KV as ready, else why not."""
    assert state.session is not None
    url = f"http://{host}:{port or DEFAULT_BOOTSTRAP_PORT}/_pd/bootstrap/{room}"
    timeout = state.config.kv_timeout_s
    try:
        async with state.session.get(
            url, params={"wait": f"{timeout:g}"}, timeout=aiohttp.ClientTimeout(total=timeout + 5)
        ) as response:
            answer = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return f"bootstrap server {host}:{port} unreachable ({type(exc).__name__})"
    status = answer.get("state") if isinstance(answer, dict) else None
    return None if status == "ready" else f"prefill side {status or 'unknown'}"


def _pd_middleware(state: PdState) -> Any:
    config = state.config

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method != "POST" or request.path not in GENERATION_PATHS:
            return await handler(request)
        try:
            body = orjson.loads(await request.read())  # read once already: aiohttp keeps the bytes
        except orjson.JSONDecodeError:
            return await handler(request)  # the mock worker's own 400
        try:
            boot = _bootstrap(body)
            assert isinstance(body, dict)
            faults = _faults(body, config)
        except mr.MockError as exc:
            return _error(exc.status, exc.message, exc.param)
        state.received.append(
            {
                "path": request.path,
                "bootstrap_host": body["bootstrap_host"],
                "bootstrap_port": body["bootstrap_port"],
                "bootstrap_room": body["bootstrap_room"],
            }
        )
        try:
            if config.role == "prefill":
                return await _prefill(request, handler, state, boot, faults)
            return await _decode(request, handler, state, boot, faults)
        except asyncio.CancelledError:
            state.cancelled += 1
            if config.role == "prefill":
                state.settle(boot.rooms, False)
            raise

    return middleware


async def _prefill(
    request: web.Request, handler: Any, state: PdState, boot: _Bootstrap, faults: frozenset[str]
) -> web.StreamResponse:
    if "hang" in faults:
        await _hang()
    reported = reported_fault("prefill", faults, boot.rooms[0])
    if "drop" in faults or "fail" in faults or reported is not None:
        state.failed += 1
        state.settle(boot.rooms, False)
        if "drop" in faults:
            _drop(request)
            raise web.HTTPServiceUnavailable()  # never sent: the connection is closed
        return _error(500, reported or "prefill failed on command (mock.pd_fault)")
    # The prefill is computed: its KV is ready for the decode side, then the prefill's own answer.
    state.ready += 1
    state.settle(boot.rooms, True)
    response: web.StreamResponse = await handler(request)
    return response


async def _decode(
    request: web.Request, handler: Any, state: PdState, boot: _Bootstrap, faults: frozenset[str]
) -> web.StreamResponse:
    if "hang" in faults:
        await _hang()
    if "drop" in faults:
        _drop(request)
        raise web.HTTPServiceUnavailable()
    if "fail" in faults:
        return _error(500, "decode failed on command (mock.pd_fault)")
    reported = reported_fault("decode", faults, boot.rooms[0])
    if reported is not None:
        state.kv_failures += 1
        return _error(500, reported)
    state.kv_waits += 1
    problems = await asyncio.gather(
        *(wait_for_kv(state, host, port, room) for host, port, room in zip(boot.hosts, boot.ports, boot.rooms))
    )
    for room, problem in zip(boot.rooms, problems):
        if problem is not None:
            state.kv_failures += 1
            return _error(500, kv_problem_report(room, problem))
    response: web.StreamResponse = await handler(request)
    return response


def _bootstrap_route(state: PdState) -> web.RouteDef:
    async def bootstrap(request: web.Request) -> web.Response:
        if state.config.role != "prefill":
            return _error(404, "not a prefill worker")
        try:
            room = int(request.match_info["room"])
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            return _error(400, "room must be an integer and wait a number")
        future = state.room(room)
        try:
            ready = await asyncio.wait_for(asyncio.shield(future), timeout=max(wait, 0.0)) if wait > 0 or future.done() else None
        except asyncio.TimeoutError:
            ready = None
        label = "pending" if ready is None else ("ready" if ready else "failed")
        return web.json_response({"room": room, "state": label})

    return web.get("/_pd/bootstrap/{room}", bootstrap)


def bootstrap_app(state: PdState) -> web.Application:
    """A prefill side's bootstrap server alone (for a gRPC prefill stand-in): where decode workers
    learn that a room's KV is ready; it also opens and closes the state's client session."""
    app = web.Application()
    app.add_routes([_bootstrap_route(state)])
    _own_session(app, state)
    return app


def _own_session(app: web.Application, state: PdState) -> None:
    async def open_session(_app: web.Application) -> None:
        state.session = aiohttp.ClientSession()

    async def close_session(_app: web.Application) -> None:
        if state.session is not None:
            await state.session.close()

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)


def _pd_routes(state: PdState) -> list[web.RouteDef]:
    async def summary(_request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(state.summary()), headers=_JSON_HEADERS)

    async def reset(_request: web.Request) -> web.Response:
        state.reset()
        return web.Response(body=orjson.dumps(state.summary()), headers=_JSON_HEADERS)

    return [
        _bootstrap_route(state),
        web.get("/_mock/pd", summary),
        web.delete("/_mock/pd", reset),
    ]


def build_pd_app(config: MockWorkerConfig, pd: PdWorkerConfig) -> web.Application:
    """The mock worker in a PD role (serve it with ``handler_cancellation=True``, as
    :func:`run_pd_worker` does, so a caller going away cancels the request at once)."""
    app = build_app(config)
    state = PdState(pd)
    app[_STATE] = state
    app.middlewares.append(_pd_middleware(state))
    app.add_routes(_pd_routes(state))
    _own_session(app, state)
    return app


async def _serve(app: web.Application, socks: list[socket.socket], line: str) -> None:
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    for sock in socks:
        await web.SockSite(runner, sock).start()
    sys.stdout.write(line)
    sys.stdout.flush()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def run_pd_worker(config: MockWorkerConfig, pd: PdWorkerConfig, host: str, port: int) -> None:
    """Serves until SIGINT/SIGTERM; prints ``mock ROLE worker serving MODEL on http://HOST:PORT``
    (with `` (bootstrap port N)`` for a prefill worker given one) once listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks = [socket.create_server((host, port), family=family, backlog=1024)]
    if pd.role == "prefill" and pd.bootstrap_port is not None:
        socks.append(socket.create_server((host, pd.bootstrap_port), family=family, backlog=1024))
    url_host = f"[{host}]" if family == socket.AF_INET6 else host
    line = f"mock {pd.role} worker serving {config.model} on http://{url_host}:{socks[0].getsockname()[1]}"
    if len(socks) > 1:
        line += f" (bootstrap port {socks[1].getsockname()[1]})"
    try:
        asyncio.run(_serve(build_pd_app(config, pd), socks, line + "\n"))
    except KeyboardInterrupt:
        pass
