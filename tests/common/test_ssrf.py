"""The SSRF guard (common/ssrf.py, common/ssrf_http.py): the address table in its many spellings,
DNS with every answer judged, the operator's switches and allowlist, the pinned connection, redirects
and the answer cap, against small real HTTP servers on loopback."""

from __future__ import annotations

import ipaddress
from typing import AsyncIterator, Awaitable, Callable

import httpcore2
import httpx2
import pytest
from aiohttp import web

from common import ssrf
from common.config import ConfigError, parse_gateway_args
from common.ssrf import AddressKind, SsrfPolicy, SsrfRefused, check_url, classify_address, parse_ip_literal, target_of
from common.ssrf_http import GuardedNetworkBackend, ResponseBudget, ResponseTooLarge, guarded_http_client

TIMEOUT = httpx2.Timeout(5.0)

# --- the address table ----------------------------------------------------------------------------

KINDS = [
    ("8.8.8.8", AddressKind.PUBLIC),
    ("1.1.1.1", AddressKind.PUBLIC),
    ("2606:4700:4700::1111", AddressKind.PUBLIC),
    ("127.0.0.1", AddressKind.LOOPBACK),
    ("127.255.255.254", AddressKind.LOOPBACK),
    ("::1", AddressKind.LOOPBACK),
    ("10.1.2.3", AddressKind.PRIVATE),
    ("172.16.0.1", AddressKind.PRIVATE),
    ("172.31.255.255", AddressKind.PRIVATE),
    ("192.168.1.1", AddressKind.PRIVATE),
    ("fc00::1", AddressKind.PRIVATE),
    ("fd12:3456::1", AddressKind.PRIVATE),
    ("100.64.0.1", AddressKind.CGNAT),
    ("100.127.255.254", AddressKind.CGNAT),
    ("169.254.1.1", AddressKind.LINK_LOCAL),
    ("fe80::1", AddressKind.LINK_LOCAL),
    ("fe80::1%eth0", AddressKind.LINK_LOCAL),
    ("169.254.169.254", AddressKind.METADATA),
    ("fd00:ec2::254", AddressKind.METADATA),
    ("100.100.100.200", AddressKind.METADATA),
    ("0.0.0.0", AddressKind.UNSPECIFIED),
    ("0.1.2.3", AddressKind.UNSPECIFIED),
    ("::", AddressKind.UNSPECIFIED),
    ("224.0.0.1", AddressKind.MULTICAST),
    ("239.255.255.250", AddressKind.MULTICAST),
    ("ff02::1", AddressKind.MULTICAST),
    ("255.255.255.255", AddressKind.RESERVED),
    ("240.0.0.1", AddressKind.RESERVED),
    ("192.0.2.1", AddressKind.RESERVED),
    ("198.18.0.1", AddressKind.RESERVED),
    ("2001:db8::1", AddressKind.RESERVED),
    # IPv6 forms carrying an IPv4 address are judged by it
    ("::ffff:127.0.0.1", AddressKind.LOOPBACK),
    ("::ffff:7f00:1", AddressKind.LOOPBACK),
    ("::ffff:10.0.0.1", AddressKind.PRIVATE),
    ("::ffff:169.254.169.254", AddressKind.METADATA),
    ("::ffff:8.8.8.8", AddressKind.PUBLIC),
    ("::127.0.0.1", AddressKind.LOOPBACK),  # IPv4-compatible (deprecated)
    ("::8.8.8.8", AddressKind.RESERVED),
    ("64:ff9b::7f00:1", AddressKind.LOOPBACK),  # NAT64
    ("64:ff9b::808:808", AddressKind.PUBLIC),
    ("2002:7f00:1::", AddressKind.LOOPBACK),  # 6to4
    ("2002:a9fe:a9fe::1", AddressKind.METADATA),
]


@pytest.mark.parametrize(("text", "kind"), KINDS)
def test_address_table(text: str, kind: AddressKind) -> None:
    assert classify_address(ipaddress.ip_address(text)) is kind


LITERALS = [
    ("127.0.0.1", "127.0.0.1"),
    ("2130706433", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
    ("0X7F.0.0.1", "127.0.0.1"),
    ("017700000001", "127.0.0.1"),
    ("0177.0.0.01", "127.0.0.1"),
    ("127.1", "127.0.0.1"),
    ("127.0.1", "127.0.0.1"),
    ("0x7f.1", "127.0.0.1"),
    ("127.0.0.1.", "127.0.0.1"),
    ("0", "0.0.0.0"),
    ("3232235777", "192.168.1.1"),
    ("0xa9fea9fe", "169.254.169.254"),
    ("[::1]", "::1"),
    ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
    ("[fe80::1%25eth0]", "fe80::1%eth0"),
    ("localhost", None),
    ("example.com", None),
    ("1.2.3.4.5", None),
    ("256.1.1.1", None),
    ("4294967296", None),
    ("08.0.0.1", None),
    ("deadbeef", None),
]


@pytest.mark.parametrize(("host", "expected"), LITERALS)
def test_literal_forms_are_normalised(host: str, expected: str | None) -> None:
    parsed = parse_ip_literal(host)
    assert (str(parsed) if parsed is not None else None) == expected


REFUSED_URLS = [
    "http://127.0.0.1/",
    "http://2130706433/",
    "http://0x7f.1:8080/mcp",
    "http://017700000001/",
    "http://127.1/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/",
    "http://0xa9fea9fe/",
    "http://10.0.0.1/",
    "http://[fe80::1%25eth0]/",
    "http://0.0.0.0:8080/",
    "http://100.64.1.1/",
    "HTTP://127.0.0.1/",
]


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_literal_hosts_are_refused_before_any_network(url: str) -> None:
    with pytest.raises(SsrfRefused) as caught:
        target_of(url, SsrfPolicy())
    assert caught.value.kind is not None and caught.value.kind is not AddressKind.PUBLIC


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://example.com/", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("gopher://example.com/", "scheme"),
        ("example.com/mcp", "scheme"),
        ("http:///mcp", "no host"),
        ("http://user:pw@example.com/", "user or password"),
        ("http://[::1/", "not a valid URL"),
        ("http://example.com:99999/", "not a valid URL"),
    ],
)
def test_malformed_urls_are_refused(url: str, reason: str) -> None:
    with pytest.raises(SsrfRefused, match=reason):
        target_of(url, SsrfPolicy())


def test_public_literals_pass() -> None:
    target = target_of("https://8.8.8.8/mcp", SsrfPolicy())
    assert (target.scheme, target.host, target.port, target.origin) == ("https", "8.8.8.8", 443, "https://8.8.8.8")


# --- the operator's switches ----------------------------------------------------------------------

def test_switches_open_only_their_own_kinds() -> None:
    loopback, private = SsrfPolicy(allow_loopback=True), SsrfPolicy(allow_private=True)
    ip = ipaddress.ip_address
    assert loopback.refusal(ip("127.0.0.1")) is None and loopback.refusal(ip("::ffff:127.0.0.1")) is None
    assert loopback.refusal(ip("10.0.0.1")) is AddressKind.PRIVATE
    assert private.refusal(ip("10.0.0.1")) is None and private.refusal(ip("100.64.0.1")) is None
    assert private.refusal(ip("fd12::1")) is None
    assert private.refusal(ip("127.0.0.1")) is AddressKind.LOOPBACK
    both = SsrfPolicy(allow_loopback=True, allow_private=True)
    for never in ("169.254.169.254", "fd00:ec2::254", "169.254.1.1", "0.0.0.0", "224.0.0.1", "240.0.0.1"):
        assert both.refusal(ip(never)) is not None, never


def test_the_allowlist_admits_names_patterns_and_networks() -> None:
    policy = SsrfPolicy(allowed_hosts=("mcp.internal", "*.corp.example", "10.1.0.0/16", "169.254.169.254"))
    assert policy.host_is_allowed("MCP.internal.") and policy.host_is_allowed("a.b.corp.example")
    assert not policy.host_is_allowed("corp.example") and not policy.host_is_allowed("evil-mcp.internal")
    ip = ipaddress.ip_address
    assert policy.refusal(ip("10.1.2.3")) is None and policy.refusal(ip("10.2.0.1")) is AddressKind.PRIVATE
    assert policy.refusal(ip("169.254.169.254")) is None
    assert policy.allowing_host("extra.host").host_is_allowed("extra.host")


def test_flags_build_the_policy() -> None:
    config = parse_gateway_args(
        ["--ssrf-allow-loopback", "--ssrf-allowed-hosts", "MCP.Internal", "10.0.0.0/8", "*.corp.example"]
    )
    policy = SsrfPolicy.from_config(config)
    assert policy.allow_loopback and not policy.allow_private
    assert config.ssrf_allowed_hosts == ("mcp.internal", "10.0.0.0/8", "*.corp.example")
    assert not SsrfPolicy.from_config(parse_gateway_args([])).allow_loopback
    with pytest.raises(ConfigError):
        parse_gateway_args(["--ssrf-allowed-hosts", "not a host!"])


# --- DNS ------------------------------------------------------------------------------------------

def fake_dns(table: dict[str, list[str]]) -> Callable[[str, int], Awaitable[list[ssrf.IPAddress]]]:
    calls: list[str] = []

    async def resolve(host: str, port: int) -> list[ssrf.IPAddress]:
        calls.append(host)
        literal = parse_ip_literal(host)
        if literal is not None:
            return [literal]
        answers = table.get(host)
        if answers is None:
            raise OSError(f"{host} does not resolve")
        return [ipaddress.ip_address(a) for a in answers]

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


async def test_localhost_resolves_to_loopback_and_is_refused() -> None:
    with pytest.raises(SsrfRefused) as caught:
        await check_url("http://localhost:1234/mcp", SsrfPolicy())
    assert caught.value.kind is AddressKind.LOOPBACK and "resolves to" in caught.value.reason
    target = await check_url("http://localhost:1234/mcp", SsrfPolicy(allow_loopback=True))
    assert target.addresses and all(a.is_loopback for a in target.addresses)


async def test_every_answer_is_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        ssrf,
        "resolve_host",
        fake_dns(
            {
                "public.test": ["93.184.216.34", "2606:2800:220:1::1"],
                "mixed.test": ["93.184.216.34", "10.0.0.5"],
                "metadata.test": ["169.254.169.254"],
                "private.test": ["192.168.0.10"],
            }
        ),
    )
    target = await check_url("https://public.test/mcp", SsrfPolicy())
    assert [str(a) for a in target.addresses] == ["93.184.216.34", "2606:2800:220:1::1"]
    with pytest.raises(SsrfRefused, match="'mixed.test' resolves to a private address") as caught:
        await check_url("https://mixed.test/", SsrfPolicy())
    assert caught.value.address == "10.0.0.5" and "10.0.0.5" not in caught.value.reason
    with pytest.raises(SsrfRefused, match="cloud metadata"):
        await check_url("https://metadata.test/", SsrfPolicy(allow_private=True, allow_loopback=True))
    assert (await check_url("https://private.test/", SsrfPolicy(allow_private=True))).addresses
    assert (await check_url("https://private.test/", SsrfPolicy(allowed_hosts=("private.test",)))).addresses
    with pytest.raises(OSError):
        await check_url("https://nowhere.test/", SsrfPolicy())


# --- the guarded client against loopback servers ----------------------------------------------------

async def start(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


@pytest.fixture
async def servers() -> AsyncIterator[Callable[[web.Application], Awaitable[int]]]:
    runners: list[web.AppRunner] = []

    async def serve(app: web.Application) -> int:
        runner, port = await start(app)
        runners.append(runner)
        return port

    yield serve
    for runner in runners:
        await runner.cleanup()


def hello_app() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"hello {request.host}")

    async def big(request: web.Request) -> web.StreamResponse:
        if "chunked" in request.query:
            response = web.StreamResponse()
            await response.prepare(request)
            for _ in range(64):
                await response.write(b"y" * 1024)
            await response.write_eof()
            return response
        return web.Response(body=b"x" * 100_000)

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/big", big)
    return app


def redirect_app(location: str) -> web.Application:
    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(location)

    app = web.Application()
    app.router.add_get("/", redirect)
    return app


async def test_the_client_refuses_loopback_by_default_and_allows_it_when_told(servers) -> None:
    port = await servers(hello_app())
    async with guarded_http_client(SsrfPolicy(), timeout=TIMEOUT) as client:
        with pytest.raises(SsrfRefused, match="loopback"):
            await client.get(f"http://127.0.0.1:{port}/")
        with pytest.raises(SsrfRefused, match="loopback"):
            await client.get(f"http://localhost:{port}/")
        with pytest.raises(SsrfRefused, match="loopback"):
            await client.get(f"http://2130706433:{port}/")
    async with guarded_http_client(SsrfPolicy(allow_loopback=True), timeout=TIMEOUT) as client:
        response = await client.get(f"http://localhost:{port}/")
    assert response.status_code == 200 and response.text == f"hello localhost:{port}"


async def test_a_redirect_to_the_metadata_address_is_refused(servers) -> None:
    port = await servers(redirect_app("http://169.254.169.254/latest/meta-data/"))
    async with guarded_http_client(SsrfPolicy(allow_loopback=True), timeout=TIMEOUT) as client:
        first = await client.get(f"http://127.0.0.1:{port}/")
        assert first.status_code == 302 and first.next_request is not None  # the client does not follow
        with pytest.raises(SsrfRefused, match="cloud metadata"):
            await client.get(f"http://127.0.0.1:{port}/", follow_redirects=True)


async def test_a_redirect_to_another_loopback_server_is_refused_when_only_the_first_is_allowed(servers) -> None:
    target = await servers(hello_app())
    port = await servers(redirect_app(f"http://127.0.0.1:{target}/"))
    async with guarded_http_client(SsrfPolicy(allowed_hosts=("localhost",)), timeout=TIMEOUT) as client:
        with pytest.raises(SsrfRefused, match="'127.0.0.1' is a loopback address"):
            await client.get(f"http://localhost:{port}/", follow_redirects=True)


async def test_the_connection_is_pinned_to_the_checked_address(monkeypatch: pytest.MonkeyPatch, servers) -> None:
    port = await servers(hello_app())
    answers = iter([["127.0.0.1"], ["10.9.9.9"]])  # the second answer is a rebinding

    async def rebinding(host: str, _port: int) -> list[ssrf.IPAddress]:
        literal = parse_ip_literal(host)
        return [literal] if literal else [ipaddress.ip_address(a) for a in next(answers)]

    monkeypatch.setattr(ssrf, "resolve_host", rebinding)
    dialled: list[str] = []

    class Recording(httpcore2.AnyIOBackend):
        async def connect_tcp(self, host: str, port: int, **kwargs):  # type: ignore[no-untyped-def, override]
            dialled.append(host)
            return await super().connect_tcp(host, port, **kwargs)

    backend = GuardedNetworkBackend(SsrfPolicy(allow_loopback=True), inner=Recording())
    stream = await backend.connect_tcp("rebind.test", port, timeout=5)
    await stream.aclose()
    assert dialled == ["127.0.0.1"]  # the checked address, not the name
    with pytest.raises(SsrfRefused) as caught:  # a new connection resolves and checks again
        await backend.connect_tcp("rebind.test", port, timeout=5)
    assert caught.value.address == "10.9.9.9"
    assert dialled == ["127.0.0.1"]


async def test_host_header_and_url_keep_the_name(monkeypatch: pytest.MonkeyPatch, servers) -> None:
    port = await servers(hello_app())
    monkeypatch.setattr(ssrf, "resolve_host", fake_dns({"mcp.test": ["127.0.0.1"]}))
    async with guarded_http_client(SsrfPolicy(allow_loopback=True), timeout=TIMEOUT) as client:
        response = await client.get(f"http://mcp.test:{port}/")
    assert response.text == f"hello mcp.test:{port}"


async def test_answers_are_capped(servers) -> None:
    port = await servers(hello_app())
    budget = ResponseBudget(None)
    policy = SsrfPolicy(allow_loopback=True)
    async with guarded_http_client(policy, timeout=TIMEOUT, max_response_bytes=10_000, budget=budget) as client:
        assert (await client.get(f"http://127.0.0.1:{port}/")).status_code == 200
        with pytest.raises(ResponseTooLarge):  # declared too long
            await client.get(f"http://127.0.0.1:{port}/big")
        assert budget.exceeded
        budget.exceeded = False
        with pytest.raises(ResponseTooLarge):  # chunked, found too long while reading
            await client.get(f"http://127.0.0.1:{port}/big?chunked=1")
        assert budget.exceeded


async def test_other_schemes_and_unix_sockets_are_refused() -> None:
    backend = GuardedNetworkBackend(SsrfPolicy(allow_loopback=True))
    with pytest.raises(SsrfRefused, match="Unix"):
        await backend.connect_unix_socket("/var/run/docker.sock")
    async with guarded_http_client(SsrfPolicy(), timeout=TIMEOUT) as client:
        with pytest.raises((SsrfRefused, httpx2.UnsupportedProtocol)):
            await client.get("ftp://example.com/")


async def test_a_name_that_does_not_resolve_is_a_connect_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssrf, "resolve_host", fake_dns({}))
    async with guarded_http_client(SsrfPolicy(), timeout=TIMEOUT) as client:
        with pytest.raises(httpx2.ConnectError, match="does not resolve"):
            await client.get("http://nowhere.test/")
