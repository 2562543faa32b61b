"""The MCP client: one session to one MCP server over Streamable HTTP (the ``mcp`` SDK), through the
SSRF guard (:mod:`common.ssrf_http`), with every resource a stranger's server could make us hold
bounded by a named limit.

Use, from a tool loop (one session per server per request; closed when the request ends)::

    connector = McpConnector.from_config(current_config())
    async with connector.session(McpServerParams(label, url, authorization=token)) as session:
        tools = await session.list_tools()                 # McpConnectError / McpListToolsError
        result = await session.call_tool("search", {...})  # never raises for a failed call

Several servers connect at once: each session runs the SDK in a task of its own (the SDK's task
groups must be entered and left in one task), so ``asyncio.gather(*(s.connect() for s in
sessions))`` is safe, and a request cancelled mid-call still closes every session.

Limits (flags, :class:`McpLimits`): connect + handshake + listing time, one call's time, one HTTP
answer's bytes (also the SDK's largest SSE event), a result text's bytes (truncated beyond), the
tools one server may list, and the sessions a process holds open at once. Fixed: the pages of a
tool listing (:data:`MAX_LIST_PAGES`), connections per session (:data:`CONNECTIONS_PER_SESSION`),
headers per server (:data:`MAX_HEADERS`, :data:`MAX_HEADER_BYTES`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import weakref
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, TypeVar
from urllib.parse import urlsplit

import httpx2
import orjson
from pydantic import ValidationError

from common.config import GatewayConfig
from common.ssrf import SYNTAX_ONLY, SsrfPolicy, SsrfRefused, target_of
from common.ssrf_http import ResponseBudget, ResponseTooLarge, guarded_http_client
from inference.mcp.errors import McpConnectError, McpListToolsError, McpServerParamsError

if TYPE_CHECKING:
    import mcp_types
    from mcp import Client
    from mcp.shared.exceptions import MCPError

# The ``mcp`` SDK (with its ``mcp_types`` models, ~1.4k pydantic classes) is imported by the code that
# opens a session or reads its answers, not at this module's import: every gateway imports this module
# (the Messages and Responses routes), and the SDK was the largest share of start-up (issue 26 item 5)
# for a gateway that never opens an MCP session.

__all__ = [
    "CONNECTIONS_PER_SESSION",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_LIST_PAGES",
    "McpConnector",
    "mcp_connector",
    "McpLimits",
    "McpServerParams",
    "McpSession",
    "McpTool",
    "McpToolResult",
    "safe_url",
]

log = logging.getLogger("inference.mcp")

MAX_LIST_PAGES = 64  # pages of one tools/list walk (a paginator that never ends cannot hang us)
CONNECTIONS_PER_SESSION = 8  # sockets one session may hold (the SSE stream and concurrent calls)
MAX_HEADERS = 32  # headers a caller may set for one server
MAX_HEADER_BYTES = 16 * 1024  # their names and values together


@cache
def _client_info() -> mcp_types.Implementation:
    import mcp_types

    return mcp_types.Implementation(name="inference-gateway", version="1")


def _mcp_error() -> type[MCPError]:
    from mcp.shared.exceptions import MCPError

    return MCPError

# Headers the transport owns: the caller may not set them (Authorization goes in ``authorization``).
_OWNED_HEADERS = frozenset(
    {
        "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
        "proxy-authorization", "proxy-connection", "accept", "content-type", "cache-control", "last-event-id",
        "mcp-session-id", "mcp-protocol-version", "authorization", "cookie",
    }
)
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")

T = TypeVar("T")


def safe_url(url: str) -> str:
    """``url`` for a message or a log line: scheme, host, port and path; never a user, password,
    query or fragment (any of which may carry a key)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an invalid URL)"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclass(frozen=True, slots=True)
class McpLimits:
    """What one MCP server may make us hold or wait for (the ``--mcp-*`` flags)."""

    connect_timeout_secs: float = 10.0
    tool_timeout_secs: float = 60.0
    max_response_bytes: int = 8 * 1024 * 1024
    max_tool_output_bytes: int = 1024 * 1024
    max_tools: int = 256

    @classmethod
    def from_config(cls, config: GatewayConfig) -> McpLimits:
        return cls(
            connect_timeout_secs=config.mcp_connect_timeout_secs,
            tool_timeout_secs=config.mcp_tool_timeout_secs,
            max_response_bytes=config.mcp_max_response_bytes,
            max_tool_output_bytes=config.mcp_max_tool_output_bytes,
            max_tools=config.mcp_max_tools,
        )


@dataclass(frozen=True, slots=True)
class McpServerParams:
    """One MCP server to connect to. ``authorization`` is the bearer token (sent as ``Authorization:
    Bearer <token>``; a value that already starts with ``Bearer `` is sent as it is); ``headers``
    are extra request headers. ``trusted``: the operator configured this server
    (``--mcp-config-path``), so its own host is allowed whatever its address; every other host (a
    redirect elsewhere) is still judged by the policy. Raises :class:`McpServerParamsError`."""

    label: str
    url: str
    authorization: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    trusted: bool = False

    def __post_init__(self) -> None:
        if not _LABEL.match(self.label):
            raise McpServerParamsError(
                f"MCP server label {self.label!r} must start with a letter and hold only letters, digits, - and _ "
                "(at most 64 characters)"
            )
        if isinstance(self.headers, Mapping):  # accept a mapping for convenience
            object.__setattr__(self, "headers", tuple(self.headers.items()))
        if len(self.headers) > MAX_HEADERS:
            raise McpServerParamsError(f"at most {MAX_HEADERS} headers may be sent to an MCP server")
        total = 0
        for name, value in self.headers:
            if not isinstance(name, str) or not isinstance(value, str) or not _TOKEN.match(name):
                raise McpServerParamsError(f"MCP header name {name!r} is not a valid header name")
            if name.lower() in _OWNED_HEADERS:
                raise McpServerParamsError(f"MCP header {name!r} is set by the gateway and may not be given")
            if any(ch in value for ch in "\r\n\0"):
                raise McpServerParamsError(f"MCP header {name!r} has a line break or NUL in its value")
            total += len(name) + len(value)
        if self.authorization is not None:
            if any(ch in self.authorization for ch in "\r\n\0"):
                raise McpServerParamsError("the MCP authorization token has a line break or NUL in it")
            total += len(self.authorization)
        if total > MAX_HEADER_BYTES:
            raise McpServerParamsError(f"MCP headers and token together exceed {MAX_HEADER_BYTES} bytes")

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.authorization:
            token = self.authorization
            headers["Authorization"] = token if token[:7].lower() == "bearer " else f"Bearer {token}"
        return headers


@dataclass(frozen=True, slots=True)
class McpTool:
    """One tool a server lists (what an ``mcp_list_tools`` item shows, plus the read-only hint the
    Responses API's ``allowed_tools: {read_only}`` filter reads)."""

    name: str
    description: str | None
    input_schema: dict[str, Any]
    read_only: bool = False

    def as_item(self) -> dict[str, Any]:
        """``{name, description, input_schema}`` as in ``mcp_list_tools.tools[]``."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


@dataclass(frozen=True, slots=True)
class McpToolResult:
    """One tool call's outcome. ``output``: the text for the model (text blocks joined with a
    newline, capped at ``max_tool_output_bytes`` with a note when cut); ``is_error``: the server
    reported a tool error or the call failed. ``error_kind`` says which: ``tool`` (the server's
    ``isError`` result), ``protocol`` (a JSON-RPC error; ``error_code`` holds its code),
    ``timeout``, ``too_large`` (an answer over ``max_response_bytes``), ``connection`` (the session
    broke). ``content``: the raw content blocks (images, resources) as JSON objects;
    ``structured``: the structured result when the server sent one."""

    output: str
    is_error: bool = False
    error_kind: str | None = None
    error_code: int | None = None
    truncated: bool = False
    content: tuple[dict[str, Any], ...] = ()
    structured: Any = None


def _failure(kind: str, message: str, code: int | None = None) -> McpToolResult:
    return McpToolResult(output=message, is_error=True, error_kind=kind, error_code=code)


def _cap_text(text: str, limit: int) -> tuple[str, bool]:
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text, False
    kept = encoded[:limit].decode("utf-8", errors="ignore")
    return f"{kept}\n[output truncated: the tool returned {len(encoded)} bytes; {limit} kept]", True


def _block_text(block: Any) -> str | None:
    import mcp_types

    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.EmbeddedResource) and isinstance(block.resource, mcp_types.TextResourceContents):
        return block.resource.text
    if isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
        return f"[{block.type} content: {block.mime_type}]"
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource: {block.uri}]"
    if isinstance(block, mcp_types.EmbeddedResource):
        return f"[resource: {block.resource.uri}]"
    return None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _find(exc: BaseException, kind: type[T]) -> T | None:
    for leaf in _leaves(exc):
        current: BaseException | None = leaf
        while current is not None:
            if isinstance(current, kind):
                return current
            current = current.__cause__ or current.__context__
    return None


class _SessionLost(Exception):
    """The session's task ended (the server went away, or a connection was refused)."""


class _Slots:
    """The sessions open at once in this process: one semaphore per event loop."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._by_loop.get(loop)
        if semaphore is None:
            semaphore = self._by_loop[loop] = asyncio.Semaphore(self.size)
        return semaphore


class McpSession:
    """One session with one MCP server. Enter it (``async with``) or call :meth:`connect` and
    :meth:`aclose`. Made by :meth:`McpConnector.session`."""

    def __init__(self, params: McpServerParams, policy: SsrfPolicy, limits: McpLimits, slots: _Slots) -> None:
        self.params = params
        self.limits = limits
        self.url = safe_url(params.url)
        self._policy = policy
        self._slots = slots
        self._budget = ResponseBudget(limits.max_response_bytes)
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._stop = asyncio.Event()
        self._lost = asyncio.Event()
        self._failure: BaseException | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self.tools: tuple[McpTool, ...] | None = None

    async def __aenter__(self) -> McpSession:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _error(self, reason: str, *, refused: SsrfRefused | None = None, listing: bool = False) -> McpConnectError:
        kind = McpListToolsError if listing else McpConnectError
        return kind(self.params.label, self.url, reason, refused=refused)

    def _connect_reason(self, exc: BaseException) -> McpConnectError:
        refused = _find(exc, SsrfRefused)
        if refused is not None:
            return self._error(refused.reason, refused=refused)
        if self._budget.exceeded or _find(exc, ResponseTooLarge) is not None:
            return self._error(f"an answer exceeded {self.limits.max_response_bytes} bytes")
        mcp_error = _find(exc, _mcp_error())
        if mcp_error is not None:
            return self._error(f"the server answered the handshake with an error ({mcp_error.code}: {mcp_error.message})")
        if _find(exc, httpx2.TimeoutException) is not None:
            return self._error("the connection timed out")
        connect_error = _find(exc, httpx2.TransportError)
        if connect_error is not None:
            return self._error(f"the connection failed ({type(connect_error).__name__}: {connect_error})")
        leaf = _leaves(exc)[0]
        return self._error(f"the handshake failed ({type(leaf).__name__}: {leaf})")

    async def connect(self) -> None:
        """Open the session: the guard's URL check, a session slot, the transport and the MCP
        handshake, all within ``connect_timeout_secs``. Raises :class:`McpConnectError`."""
        if self._ready is not None:
            raise RuntimeError("an MCP session connects once")
        policy = self._policy
        try:
            if self.params.trusted:  # the operator's server: its own host passes whatever its address
                policy = policy.allowing_host(target_of(self.params.url, SYNTAX_ONLY).host)
            target_of(self.params.url, policy)
        except SsrfRefused as refused:
            raise self._error(refused.reason, refused=refused) from None
        timeout = self.limits.connect_timeout_secs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        semaphore = self._slots.semaphore()
        if not await _acquire(semaphore, timeout):
            raise self._error(f"{self._slots.size} MCP sessions are open in this process (--mcp-max-open-sessions)")
        self._semaphore = semaphore
        self._ready = loop.create_future()
        self._task = loop.create_task(self._run(policy), name=f"mcp session {self.params.label}")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), max(0.0, deadline - loop.time()))
        except TimeoutError:
            await self.aclose()
            raise self._error(f"no handshake within {timeout:g}s (--mcp-connect-timeout-secs)") from None
        except asyncio.CancelledError:
            await self.aclose()
            raise
        except Exception as exc:
            await self.aclose()
            raise self._connect_reason(exc) from None

    async def _run(self, policy: SsrfPolicy) -> None:
        """The session's own task: holds the SDK's transport and session contexts open until
        :meth:`aclose` (or the server goes away)."""
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        assert self._ready is not None
        limits = self.limits
        http_timeout = httpx2.Timeout(
            limits.connect_timeout_secs,
            read=max(limits.tool_timeout_secs, limits.connect_timeout_secs),
        )
        try:
            async with guarded_http_client(
                policy,
                timeout=http_timeout,
                headers=self.params.request_headers(),
                max_response_bytes=limits.max_response_bytes,
                max_connections=CONNECTIONS_PER_SESSION,
                budget=self._budget,
            ) as http:
                transport = streamable_http_client(
                    self.params.url, http_client=http, max_sse_event_size=limits.max_response_bytes
                )
                async with Client(
                    transport, cache=None, client_info=_client_info(), read_timeout_seconds=limits.tool_timeout_secs
                ) as client:
                    self._client = client
                    self._ready.set_result(None)
                    await self._stop.wait()
        except asyncio.CancelledError:
            if not self._ready.done():
                self._ready.cancel()
            raise
        except Exception as exc:  # recorded: the session is lost, its callers are told
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                self._failure = exc
                log.info("MCP session %r to %s ended: %s", self.params.label, self.url, _leaves(exc)[0])
        finally:
            self._client = None
            self._lost.set()

    async def aclose(self) -> None:
        """Close the session: a connected one is told to stop (the SDK ends the server-side session
        with a DELETE), one still connecting is cancelled; either gets ``connect_timeout_secs`` to
        finish before it is cancelled (again). Safe to call more than once."""
        task, self._task = self._task, None
        try:
            if task is not None:
                connected = self._client is not None
                if connected:
                    self._stop.set()
                else:
                    task.cancel()
                try:
                    done, _ = await asyncio.wait({task}, timeout=self.limits.connect_timeout_secs)
                    if not done:
                        task.cancel()
                        done, _ = await asyncio.wait({task}, timeout=self.limits.connect_timeout_secs)
                        if not done:
                            log.warning("MCP session %r to %s did not close in time", self.params.label, self.url)
                except asyncio.CancelledError:
                    task.cancel()
                    raise
                if task.done() and not task.cancelled():
                    task.exception()  # the task records its own failure
            if self._ready is not None and self._ready.done() and not self._ready.cancelled():
                self._ready.exception()  # a failed handshake is reported by connect()
        finally:
            if self._semaphore is not None:
                self._semaphore.release()
                self._semaphore = None

    async def _race(self, work: Callable[[], Awaitable[T]], timeout: float) -> T:
        """``work()`` in a task of its own, raced against the session's end and ``timeout``.
        Raises TimeoutError, :class:`_SessionLost` or ``work``'s exception."""
        if self._client is None or self._lost.is_set():
            raise _SessionLost()
        job = asyncio.ensure_future(work())
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            done, _ = await asyncio.wait({job, lost}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (job, lost):
                if not future.done():
                    future.cancel()
            job.add_done_callback(_retrieve)
        if job in done:
            return job.result()
        if lost in done:
            raise _SessionLost()
        raise TimeoutError()

    def _client_or_lost(self) -> Client:
        if self._client is None:
            raise _SessionLost()
        return self._client

    async def list_tools(self) -> tuple[McpTool, ...]:
        """Every tool the server lists (all pages), within ``connect_timeout_secs``. Raises
        :class:`McpListToolsError` (a :class:`McpConnectError`) when it fails, times out or lists
        more than ``max_tools``."""
        client = self._client
        if client is None:
            raise self._error(self._lost_reason() if self._lost.is_set() else "the session is not open", listing=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.connect_timeout_secs
        tools: list[McpTool] = []
        cursor: str | None = None
        try:
            for _ in range(MAX_LIST_PAGES):
                page = await self._race(
                    lambda: client.list_tools(cursor=cursor), max(0.0, deadline - loop.time())
                )
                for tool in page.tools:
                    annotations = tool.annotations
                    tools.append(
                        McpTool(
                            name=tool.name,
                            description=tool.description,
                            input_schema=dict(tool.input_schema),
                            read_only=bool(annotations is not None and annotations.read_only_hint),
                        )
                    )
                if len(tools) > self.limits.max_tools:
                    raise self._error(
                        f"the server lists more than {self.limits.max_tools} tools (--mcp-max-tools)", listing=True
                    )
                cursor = page.next_cursor
                if not cursor:
                    break
            else:
                raise self._error(f"the tool listing did not end within {MAX_LIST_PAGES} pages", listing=True)
        except McpListToolsError:
            raise
        except TimeoutError:
            raise self._error(
                f"no tool listing within {self.limits.connect_timeout_secs:g}s (--mcp-connect-timeout-secs)", listing=True
            ) from None
        except _SessionLost:
            raise self._error(self._lost_reason(), listing=True) from None
        except _mcp_error() as exc:
            if self._budget.exceeded:
                raise self._error(f"an answer exceeded {self.limits.max_response_bytes} bytes", listing=True) from None
            raise self._error(f"tools/list failed ({exc.code}: {exc.message})", listing=True) from None
        except ValidationError:
            raise self._error("the server's tool listing is not valid MCP", listing=True) from None
        self.tools = tuple(tools)
        return self.tools

    def _lost_reason(self) -> str:
        if self._budget.exceeded:
            return f"an answer exceeded {self.limits.max_response_bytes} bytes"
        failure = self._failure
        if failure is not None:
            refused = _find(failure, SsrfRefused)
            if refused is not None:
                return refused.reason
            leaf = _leaves(failure)[0]
            return f"the connection to the MCP server was lost ({type(leaf).__name__}: {leaf})"
        return "the connection to the MCP server was lost"

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> McpToolResult:
        """Call one tool. Never raises for a failed call (only for cancellation): a tool error, a
        protocol error, a timeout (``tool_timeout_secs``), an oversized answer or a lost session
        come back as a result with ``is_error`` set and a message in ``output``."""
        limits = self.limits
        try:
            client = self._client_or_lost()
            result = await self._race(
                lambda: client.call_tool(name, dict(arguments or {}), read_timeout_seconds=limits.tool_timeout_secs),
                limits.tool_timeout_secs,
            )
        except TimeoutError:
            return _failure("timeout", f"the MCP tool call timed out after {limits.tool_timeout_secs:g}s")
        except _SessionLost:
            return _failure("connection", self._lost_reason())
        except _mcp_error() as exc:
            if self._budget.exceeded:
                self._budget.exceeded = False
                return _failure("too_large", f"the MCP server's answer exceeded {limits.max_response_bytes} bytes")
            from mcp_types import REQUEST_TIMEOUT

            if exc.code == REQUEST_TIMEOUT:
                return _failure("timeout", f"the MCP tool call timed out after {limits.tool_timeout_secs:g}s")
            return _failure("protocol", f"MCP error {exc.code}: {exc.message}", exc.code)
        except ValidationError:
            return _failure("protocol", "the MCP server's tool result is not valid MCP")
        except Exception as exc:  # a transport failure surfacing through the SDK
            if self._budget.exceeded or _find(exc, ResponseTooLarge) is not None:
                self._budget.exceeded = False
                return _failure("too_large", f"the MCP server's answer exceeded {limits.max_response_bytes} bytes")
            leaf = _leaves(exc)[0]
            return _failure("connection", f"the MCP tool call failed ({type(leaf).__name__}: {leaf})")
        return self._result(result)

    def _result(self, result: mcp_types.CallToolResult) -> McpToolResult:
        parts = [text for text in (_block_text(block) for block in result.content) if text is not None]
        text = "\n".join(parts)
        if not parts and result.structured_content is not None:
            text = orjson.dumps(result.structured_content).decode()
        output, truncated = _cap_text(text, self.limits.max_tool_output_bytes)
        return McpToolResult(
            output=output,
            is_error=bool(result.is_error),
            error_kind="tool" if result.is_error else None,
            truncated=truncated,
            content=tuple(block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content),
            structured=result.structured_content,
        )


async def _acquire(semaphore: asyncio.Semaphore, timeout: float) -> bool:
    """Take a permit within ``timeout``; False when none came. A permit taken just as the wait
    ended, or while the caller was being cancelled, is given back, never leaked."""
    if not semaphore.locked():
        await semaphore.acquire()  # free: returns at once
        return True
    waiter = asyncio.ensure_future(semaphore.acquire())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    except asyncio.CancelledError:
        waiter.cancel()
        waiter.add_done_callback(lambda w: semaphore.release() if not w.cancelled() else None)
        raise
    if done:
        return True
    waiter.cancel()
    try:
        await waiter
    except asyncio.CancelledError:
        return False
    return True  # acquired in the same turn as the timeout


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a raced job's outcome as seen (an abandoned job's exception must not be logged as
    never retrieved)."""
    if not future.cancelled():
        future.exception()


class McpConnector:
    """Makes sessions with one policy and one set of limits, and holds the process's session slots
    (``--mcp-max-open-sessions``)."""

    def __init__(self, policy: SsrfPolicy, limits: McpLimits, max_open_sessions: int = 512) -> None:
        self.policy = policy
        self.limits = limits
        self._slots = _Slots(max_open_sessions)

    @classmethod
    def from_config(cls, config: GatewayConfig) -> McpConnector:
        return cls(SsrfPolicy.from_config(config), McpLimits.from_config(config), config.mcp_max_open_sessions)

    def session(self, params: McpServerParams) -> McpSession:
        """A session to ``params``' server, not yet connected: ``async with connector.session(p)
        as session``."""
        return McpSession(params, self.policy, self.limits, self._slots)


_connectors: dict[GatewayConfig, McpConnector] = {}


def mcp_connector(config: GatewayConfig) -> McpConnector:
    """The process's connector for ``config`` (one per config, so ``--mcp-max-open-sessions``
    bounds the whole process): what the tool loops use, ``mcp_connector(current_config())``."""
    connector = _connectors.get(config)
    if connector is None:
        connector = _connectors[config] = McpConnector.from_config(config)
    return connector
