"""The MCP client against a real MCP server (the SDK's MCPServer over Streamable HTTP on loopback):
listing, calls, tool errors, timeouts, oversized answers, the SSRF guard at connect, limits."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Iterator

import pytest

from common.config import parse_gateway_args
from common.ssrf import AddressKind, SsrfPolicy
from inference.mcp import (
    McpConnectError,
    McpConnector,
    McpLimits,
    McpListToolsError,
    McpServerParams,
    McpServerParamsError,
    mcp_connector,
)
from tests.inference.mcp.servers import build_server, serving

LOOPBACK = SsrfPolicy(allow_loopback=True)
FAST = McpLimits(connect_timeout_secs=5.0, tool_timeout_secs=5.0)


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    with serving(build_server()) as url:
        yield url


def connector(policy: SsrfPolicy = LOOPBACK, limits: McpLimits = FAST, sessions: int = 16) -> McpConnector:
    return McpConnector(policy, limits, sessions)


async def test_lists_tools_with_schema_and_read_only_hint(mcp_url: str) -> None:
    async with connector().session(McpServerParams("tools", mcp_url)) as session:
        tools = {tool.name: tool for tool in await session.list_tools()}
    assert {"echo", "fail", "slow", "big", "whoami"} <= set(tools)
    echo = tools["echo"]
    assert echo.description == "Echo the text back."
    assert echo.input_schema["properties"]["text"]["type"] == "string"
    assert echo.input_schema["required"] == ["text"]
    assert echo.read_only and not tools["fail"].read_only
    assert echo.as_item() == {"name": "echo", "description": echo.description, "input_schema": echo.input_schema}


async def test_calls_a_tool_and_reports_tool_errors(mcp_url: str) -> None:
    async with connector().session(McpServerParams("tools", mcp_url)) as session:
        ok = await session.call_tool("echo", {"text": "hi"})
        failed = await session.call_tool("fail", {"reason": "disk full"})
        unknown = await session.call_tool("no_such_tool", {})
    assert (ok.output, ok.is_error, ok.error_kind, ok.truncated) == ("echo: hi", False, None, False)
    assert ok.content == ({"type": "text", "text": "echo: hi"},)
    assert failed.is_error and failed.error_kind == "tool" and "disk full" in failed.output
    assert unknown.is_error and "no_such_tool" in unknown.output


async def test_sends_the_bearer_token_and_headers(mcp_url: str) -> None:
    params = McpServerParams("tools", mcp_url, authorization="sekret", headers=(("X-Team", "infra"),))
    assert "sekret" not in repr(params)
    async with connector().session(params) as session:
        result = await session.call_tool("whoami", {})
    assert result.output == "Bearer sekret|infra"


async def test_a_slow_tool_times_out_and_the_session_stays_usable(mcp_url: str) -> None:
    limits = McpLimits(connect_timeout_secs=5.0, tool_timeout_secs=0.3)
    async with connector(limits=limits).session(McpServerParams("tools", mcp_url)) as session:
        started = time.monotonic()
        slow = await session.call_tool("slow", {"seconds": 5})
        assert time.monotonic() - started < 2
        after = await session.call_tool("echo", {"text": "still here"})
    assert slow.is_error and slow.error_kind == "timeout" and "0.3s" in slow.output
    assert after.output == "echo: still here"


async def test_an_oversized_answer_fails_that_call_only(mcp_url: str) -> None:
    limits = McpLimits(connect_timeout_secs=5.0, tool_timeout_secs=5.0, max_response_bytes=64 * 1024)
    async with connector(limits=limits).session(McpServerParams("tools", mcp_url)) as session:
        await session.list_tools()
        huge = await session.call_tool("big", {"n": 200_000})
        small = await session.call_tool("big", {"n": 10})
    assert huge.is_error and huge.error_kind == "too_large" and "65536 bytes" in huge.output
    assert small.output == "x" * 10 and not small.is_error


async def test_json_answers_are_capped_too() -> None:
    limits = McpLimits(connect_timeout_secs=5.0, tool_timeout_secs=5.0, max_response_bytes=64 * 1024)
    with serving(build_server(), json_response=True) as url:
        async with connector(limits=limits).session(McpServerParams("tools", url)) as session:
            huge = await session.call_tool("big", {"n": 200_000})
            small = await session.call_tool("echo", {"text": "json"})
    assert huge.is_error and huge.error_kind == "too_large"
    assert small.output == "echo: json"


async def test_a_server_that_goes_away_fails_calls_without_hanging() -> None:
    with serving(build_server()) as url:
        session = connector().session(McpServerParams("tools", url))
        await session.connect()
        assert (await session.call_tool("echo", {"text": "up"})).output == "echo: up"
    started = time.monotonic()
    try:
        result = await session.call_tool("echo", {"text": "down"})
    finally:
        await session.aclose()
    assert result.is_error and result.error_kind in ("connection", "protocol")
    assert time.monotonic() - started < 3


async def test_a_long_result_text_is_truncated_with_a_note(mcp_url: str) -> None:
    limits = McpLimits(connect_timeout_secs=5.0, tool_timeout_secs=5.0, max_tool_output_bytes=1000)
    async with connector(limits=limits).session(McpServerParams("tools", mcp_url)) as session:
        result = await session.call_tool("big", {"n": 5000})
    assert result.truncated and not result.is_error
    assert result.output.startswith("x" * 1000) and "5000 bytes; 1000 kept" in result.output


async def test_too_many_tools_fail_the_listing() -> None:
    with serving(build_server(extra_tools=10)) as url:
        limits = McpLimits(connect_timeout_secs=5.0, max_tools=8)
        async with connector(limits=limits).session(McpServerParams("tools", url)) as session:
            with pytest.raises(McpListToolsError, match="more than 8 tools"):
                await session.list_tools()


async def test_loopback_is_refused_by_default(mcp_url: str) -> None:
    with pytest.raises(McpConnectError) as caught:
        async with connector(SsrfPolicy()).session(McpServerParams("tools", mcp_url)):
            pass
    error = caught.value
    assert error.refused is not None and error.refused.kind is AddressKind.LOOPBACK
    assert (error.responses_status, error.responses_code) == (424, "connect_mcp_server_failed")
    assert (error.messages_status, error.messages_code) == (502, "mcp_connection_failed")
    assert "--ssrf-allow-loopback" in error.message and "'tools'" in error.message


async def test_a_name_resolving_to_loopback_is_refused_after_dns(mcp_url: str) -> None:
    url = mcp_url.replace("127.0.0.1", "localhost")
    with pytest.raises(McpConnectError) as caught:
        async with connector(SsrfPolicy()).session(McpServerParams("tools", url)):
            pass
    assert caught.value.refused is not None and caught.value.refused.kind is AddressKind.LOOPBACK
    async with connector().session(McpServerParams("tools", url)) as session:  # allowed explicitly
        assert (await session.call_tool("echo", {"text": "ok"})).output == "echo: ok"


async def test_an_operator_configured_server_may_be_on_loopback(mcp_url: str) -> None:
    async with connector(SsrfPolicy()).session(McpServerParams("tools", mcp_url, trusted=True)) as session:
        assert (await session.call_tool("echo", {"text": "ok"})).output == "echo: ok"


async def test_the_query_and_credentials_never_reach_the_message(mcp_url: str) -> None:
    with pytest.raises(McpConnectError) as caught:
        async with connector(SsrfPolicy()).session(McpServerParams("tools", mcp_url + "?key=sekret")):
            pass
    assert "sekret" not in str(caught.value)
    with pytest.raises(McpConnectError, match="user or password"):
        async with connector().session(McpServerParams("tools", "http://me:pw@127.0.0.1:1/mcp")):
            pass


async def test_nothing_listening_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(McpConnectError, match="connection failed"):
        async with connector().session(McpServerParams("down", f"http://127.0.0.1:{port}/mcp")):
            pass


async def test_a_server_that_never_answers_hits_the_connect_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        limits = McpLimits(connect_timeout_secs=0.5)
        started = time.monotonic()
        with pytest.raises(McpConnectError, match="0.5s|timed out"):
            async with connector(limits=limits).session(McpServerParams("mute", f"http://127.0.0.1:{port}/mcp")):
                pass
        assert time.monotonic() - started < 3


async def test_a_server_that_does_not_speak_mcp_is_a_connect_error(mcp_url: str) -> None:
    with pytest.raises(McpConnectError, match="handshake"):
        async with connector().session(McpServerParams("wrong", mcp_url.replace("/mcp", "/nothing-here"))):
            pass


async def test_sessions_connect_concurrently_and_are_bounded(mcp_url: str) -> None:
    shared = connector(sessions=2, limits=McpLimits(connect_timeout_secs=0.5))
    first, second, third = (shared.session(McpServerParams(f"s{i}", mcp_url)) for i in range(3))
    await asyncio.gather(first.connect(), second.connect())
    try:
        with pytest.raises(McpConnectError, match="2 MCP sessions are open"):
            await third.connect()
        results = await asyncio.gather(*(s.call_tool("echo", {"text": s.params.label}) for s in (first, second)))
        assert [r.output for r in results] == ["echo: s0", "echo: s1"]
    finally:
        await asyncio.gather(first.aclose(), second.aclose())
    async with shared.session(McpServerParams("again", mcp_url)) as session:  # the slots came back
        assert not (await session.call_tool("echo", {"text": "x"})).is_error


async def test_a_cancelled_call_closes_cleanly(mcp_url: str) -> None:
    session = connector().session(McpServerParams("tools", mcp_url))
    await session.connect()
    call = asyncio.create_task(session.call_tool("slow", {"seconds": 10}))
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    started = time.monotonic()
    await session.aclose()
    await session.aclose()  # twice is fine
    assert time.monotonic() - started < 3
    result = await session.call_tool("echo", {"text": "closed"})
    assert result.is_error and result.error_kind == "connection"


def test_server_params_are_validated() -> None:
    with pytest.raises(McpServerParamsError, match="label"):
        McpServerParams("1bad", "http://x/mcp")
    with pytest.raises(McpServerParamsError, match="set by the gateway"):
        McpServerParams("ok", "http://x/mcp", headers=(("Host", "evil"),))
    with pytest.raises(McpServerParamsError, match="line break"):
        McpServerParams("ok", "http://x/mcp", headers=(("X-A", "1\r\nX-B: 2"),))
    with pytest.raises(McpServerParamsError, match="at most"):
        McpServerParams("ok", "http://x/mcp", headers=tuple((f"X-{i}", "v") for i in range(40)))
    assert McpServerParams("ok", "http://x", authorization="Bearer t").request_headers() == {"Authorization": "Bearer t"}


def test_the_process_has_one_connector_per_config() -> None:
    config = parse_gateway_args(["--mcp-max-open-sessions", "3", "--mcp-tool-timeout-secs", "7"])
    connector = mcp_connector(config)
    assert connector is mcp_connector(config)
    assert connector.limits.tool_timeout_secs == 7 and connector.policy == SsrfPolicy()
