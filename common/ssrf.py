"""The one SSRF guard: every URL a caller can influence (MCP servers now, external providers later)
is checked here before the gateway connects to it.

Rules (docs/DECISIONS.md, "One SSRF guard"):

* Only ``http`` and ``https``; no user or password in the URL (credentials travel in headers).
* A host that is an address literal is normalised first, in every form ``inet_aton`` and browsers
  accept (``2130706433``, ``0x7f.1``, ``017700000001``, ``127.1``, bracketed IPv6 with a zone) and
  IPv6 forms that carry an IPv4 address (mapped ``::ffff:a.b.c.d``, compatible ``::a.b.c.d``, NAT64
  ``64:ff9b::/96``, 6to4 ``2002::/16``) are judged by the IPv4 address inside.
* A host name is resolved (``getaddrinfo`` in the loop's executor: the event loop never blocks) and
  **every** A/AAAA answer must pass; one bad answer refuses the host.
* Refused kinds: loopback, private (RFC 1918, unique-local ``fc00::/7``), CGNAT ``100.64/10``,
  link-local (``169.254/16``, ``fe80::/10``), cloud metadata addresses (``169.254.169.254``,
  ``fd00:ec2::254``, ...), unspecified, multicast, and reserved (documentation, benchmarking,
  ``240/4``, broadcast, anything ``ipaddress`` does not call global).
* The operator opens it: ``--ssrf-allow-loopback`` (loopback), ``--ssrf-allow-private`` (private and
  CGNAT), ``--ssrf-allowed-hosts`` (host names, ``*.suffix`` patterns, addresses and CIDR networks;
  a listed name skips the address check, a listed network admits its addresses of any kind). Link-local,
  metadata, unspecified, multicast and reserved addresses are reachable only through the allowlist.

This module holds the rules and the checks (standard library only, cheap to import: the flags'
parser uses it). Connections go through :mod:`common.ssrf_http`, whose client checks every new
connection again and pins it to the checked address: :func:`check_url` alone cannot stop a DNS
answer that changes between the check and the connect.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import socket
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit


__all__ = [
    "AddressKind",
    "CheckedTarget",
    "SsrfPolicy",
    "SYNTAX_ONLY",
    "SsrfRefused",
    "check_url",
    "check_host",
    "classify_address",
    "parse_ip_literal",
    "parse_allowed_host",
    "resolve_host",
    "target_of",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = ("http", "https")


class AddressKind(str, enum.Enum):
    PUBLIC = "public"
    LOOPBACK = "loopback"
    PRIVATE = "private"
    CGNAT = "cgnat"
    LINK_LOCAL = "link-local"
    METADATA = "cloud metadata"
    UNSPECIFIED = "unspecified"
    MULTICAST = "multicast"
    RESERVED = "reserved"


class SsrfRefused(Exception):
    """The guard refused a URL or one of the addresses its host resolves to. ``reason`` is safe to
    show a client (it names the host and the kind of address, never credentials or the query)."""

    def __init__(self, reason: str, *, host: str = "", address: str | None = None, kind: AddressKind | None = None):
        super().__init__(reason)
        self.reason = reason
        self.host = host
        self.address = address
        self.kind = kind


# --- the address table ----------------------------------------------------------------------------

def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(cidr) for cidr in cidrs)


# Cloud metadata and credential endpoints: AWS/GCP/Azure/OpenStack IMDS, ECS task metadata, EKS pod
# identity, AWS IMDS over IPv6, Alibaba Cloud. Refused even with --ssrf-allow-private.
_METADATA = frozenset(
    ipaddress.ip_address(text)
    for text in ("169.254.169.254", "169.254.170.2", "169.254.170.23", "fd00:ec2::254", "fd00:ec2::23", "100.100.100.200")
)

_V4_TABLE: tuple[tuple[tuple[IPNetwork, ...], AddressKind], ...] = (
    (_nets("0.0.0.0/8"), AddressKind.UNSPECIFIED),
    (_nets("127.0.0.0/8"), AddressKind.LOOPBACK),
    (_nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"), AddressKind.PRIVATE),
    (_nets("100.64.0.0/10"), AddressKind.CGNAT),
    (_nets("169.254.0.0/16"), AddressKind.LINK_LOCAL),
    (_nets("224.0.0.0/4"), AddressKind.MULTICAST),
    (
        _nets(
            "192.0.0.0/24", "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "198.18.0.0/15",
            "192.88.99.0/24", "240.0.0.0/4",  # 240/4 includes the broadcast address
        ),
        AddressKind.RESERVED,
    ),
)

_V6_TABLE: tuple[tuple[tuple[IPNetwork, ...], AddressKind], ...] = (
    (_nets("::/128"), AddressKind.UNSPECIFIED),
    (_nets("::1/128"), AddressKind.LOOPBACK),
    (_nets("fc00::/7", "fec0::/10", "64:ff9b:1::/48"), AddressKind.PRIVATE),  # ULA, old site-local, local NAT64
    (_nets("fe80::/10"), AddressKind.LINK_LOCAL),
    (_nets("ff00::/8"), AddressKind.MULTICAST),
    (_nets("100::/64", "2001::/23", "2001:db8::/32", "3fff::/20", "5f00::/16"), AddressKind.RESERVED),
)

_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")


def _embedded_v4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, bool] | None:
    """The IPv4 address an IPv6 address carries, and whether the IPv6 form itself is routable."""
    if address in _MAPPED:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), True
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), True
    if address in _SIX_TO_FOUR:
        return ipaddress.IPv4Address((int(address) >> 80) & 0xFFFFFFFF), True
    if address in _COMPATIBLE and int(address) > 1:  # :: and ::1 are themselves
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), False
    return None


def classify_address(address: IPAddress) -> AddressKind:
    """What kind of address this is, for the guard. IPv6 forms carrying an IPv4 address are judged
    by that address (a deprecated IPv4-compatible form of a public address is reserved)."""
    if address in _METADATA:
        return AddressKind.METADATA
    if isinstance(address, ipaddress.IPv6Address):
        address = ipaddress.IPv6Address(int(address))  # drop a zone (scope id)
        if address in _METADATA:
            return AddressKind.METADATA
        embedded = _embedded_v4(address)
        if embedded is not None:
            v4, routable = embedded
            kind = classify_address(v4)
            return kind if kind is not AddressKind.PUBLIC or routable else AddressKind.RESERVED
        table = _V6_TABLE
    else:
        table = _V4_TABLE
    for networks, kind in table:
        if any(address in network for network in networks):
            return kind
    return AddressKind.PUBLIC if address.is_global and not address.is_multicast else AddressKind.RESERVED


def _v4_part(text: str) -> int | None:
    if not text:
        return None
    try:
        if text[:2].lower() == "0x":
            return int(text[2:], 16) if text[2:] else 0
        if len(text) > 1 and text[0] == "0":
            return int(text[1:], 8)
        return int(text, 10) if text.isdigit() else None
    except ValueError:
        return None


def _parse_v4_numbers(host: str) -> ipaddress.IPv4Address | None:
    """``inet_aton``'s forms: one to four parts, each decimal, octal (leading 0) or hex (0x);
    the last part fills the remaining bytes."""
    parts = host.split(".")
    if len(parts) > 4:
        return None
    numbers = [_v4_part(part) for part in parts]
    if any(number is None for number in numbers):
        return None
    values = [number for number in numbers if number is not None]
    *head, last = values
    if any(value > 255 for value in head) or last >= 256 ** (4 - len(head)):
        return None
    total = 0
    for value in head:
        total = total * 256 + value
    total = total * 256 ** (4 - len(head)) + last
    return ipaddress.IPv4Address(total)


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address a URL host denotes when it is an address literal (any form), else None."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.replace("%25", "%")
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            return None
    if text.endswith("."):
        text = text[:-1]
    return _parse_v4_numbers(text) if text else None


# --- the policy -----------------------------------------------------------------------------------

def parse_allowed_host(text: str) -> str:
    """One ``--ssrf-allowed-hosts`` entry, normalised: a host name (``mcp.internal``), a pattern for
    its subdomains (``*.corp.example``), an address or a CIDR network. Raises ValueError."""
    entry = text.strip().lower().rstrip(".")
    if entry.startswith("[") and entry.endswith("]"):
        entry = entry[1:-1]
    if not entry:
        raise ValueError("an allowed host must not be empty")
    try:
        return str(ipaddress.ip_network(entry, strict=False))
    except ValueError:
        pass
    name = entry[2:] if entry.startswith("*.") else entry
    labels = name.split(".")
    if not all(label and len(label) <= 63 and all(c.isascii() and (c.isalnum() or c in "-_") for c in label) for label in labels):
        raise ValueError(f"not a host name (ASCII; IDNA names in their xn-- form), address or CIDR network: {text!r}")
    return entry


@dataclass(frozen=True, slots=True)
class SsrfPolicy:
    """What the operator lets callers reach. The default refuses every non-public address."""

    allow_loopback: bool = False
    allow_private: bool = False
    allowed_hosts: tuple[str, ...] = ()
    _names: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)
    _suffixes: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    _networks: tuple[IPNetwork, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names: set[str] = set()
        suffixes: list[str] = []
        networks: list[IPNetwork] = []
        for raw in self.allowed_hosts:
            entry = parse_allowed_host(raw)
            try:
                networks.append(ipaddress.ip_network(entry))
            except ValueError:
                if entry.startswith("*."):
                    suffixes.append(entry[1:])  # ".corp.example"
                else:
                    names.add(entry)
        object.__setattr__(self, "_names", frozenset(names))
        object.__setattr__(self, "_suffixes", tuple(suffixes))
        object.__setattr__(self, "_networks", tuple(networks))

    @classmethod
    def from_config(cls, config: Any) -> SsrfPolicy:
        """The policy of the gateway's flags (a :class:`common.config.GatewayConfig`)."""
        return cls(
            allow_loopback=bool(config.ssrf_allow_loopback),
            allow_private=bool(config.ssrf_allow_private),
            allowed_hosts=tuple(config.ssrf_allowed_hosts),
        )

    def allowing_host(self, host: str) -> SsrfPolicy:
        """This policy with ``host`` added to the allowlist (servers the operator configured)."""
        entry = parse_allowed_host(host)
        return self if entry in self.allowed_hosts else replace(self, allowed_hosts=(*self.allowed_hosts, entry))

    def host_is_allowed(self, host: str) -> bool:
        name = host.strip().lower().rstrip(".")
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        return name in self._names or any(name.endswith(suffix) for suffix in self._suffixes)

    def refusal(self, address: IPAddress) -> AddressKind | None:
        """The kind that makes ``address`` refused under this policy, or None when it may be dialled."""
        bare: IPAddress = ipaddress.IPv6Address(int(address)) if isinstance(address, ipaddress.IPv6Address) else address
        if any(bare.version == net.version and bare in net for net in self._networks):
            return None
        kind = classify_address(address)
        if kind is AddressKind.PUBLIC:
            return None
        if kind is AddressKind.LOOPBACK and self.allow_loopback:
            return None
        if kind in (AddressKind.PRIVATE, AddressKind.CGNAT) and self.allow_private:
            return None
        return kind


# Admits every address: for checking a URL's form only (scheme, host, credentials), e.g. of servers
# the operator configured. Never connect with it.
SYNTAX_ONLY = SsrfPolicy(allowed_hosts=("0.0.0.0/0", "::/0"))

_FLAG_HINT = {
    AddressKind.LOOPBACK: " (the operator may allow it with --ssrf-allow-loopback)",
    AddressKind.PRIVATE: " (the operator may allow it with --ssrf-allow-private)",
    AddressKind.CGNAT: " (the operator may allow it with --ssrf-allow-private)",
}


def _refuse(host: str, address: IPAddress, kind: AddressKind) -> SsrfRefused:
    # The reason goes back to API clients: it names the kind, never the address a name resolved to
    # (that would map the operator's internal DNS for a stranger); ``address`` keeps it for logs.
    hint = _FLAG_HINT.get(kind, " (only --ssrf-allowed-hosts can admit it)")
    literal = parse_ip_literal(host)
    where = f"{host!r} is" if literal is not None else f"{host!r} resolves to"
    return SsrfRefused(f"refused: {where} a {kind.value} address{hint}", host=host, address=str(address), kind=kind)


# --- URLs and hosts -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CheckedTarget:
    """A URL the guard let through: its scheme, host (as written, lower-case), port, and, once
    resolved, the addresses that passed (empty from :func:`target_of`, which does not resolve)."""

    scheme: str
    host: str
    port: int
    addresses: tuple[IPAddress, ...] = ()

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return f"{self.scheme}://{host}" + ("" if self.port == default else f":{self.port}")


def target_of(url: str, policy: SsrfPolicy) -> CheckedTarget:
    """Check what can be checked without the network: the scheme, credentials, a host at all, and
    a host that is an address literal (any form). Raises :class:`SsrfRefused`."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
        raw_host = parts.hostname or ""
    except ValueError as exc:
        raise SsrfRefused(f"refused: not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise SsrfRefused(f"refused: the scheme must be http or https, not {scheme or 'none'!r}")
    if not raw_host:
        raise SsrfRefused("refused: the URL has no host")
    try:
        host = raw_host if raw_host.isascii() else raw_host.encode("idna").decode("ascii")
    except UnicodeError:
        raise SsrfRefused(f"refused: {raw_host!r} is not a valid host name") from None
    if parts.username is not None or parts.password is not None:
        raise SsrfRefused(f"refused: the URL for {host!r} carries a user or password (send credentials as headers)", host=host)
    if not policy.host_is_allowed(host):
        literal = parse_ip_literal(host)
        if literal is not None:
            kind = policy.refusal(literal)
            if kind is not None:
                raise _refuse(host, literal, kind)
    return CheckedTarget(scheme, host, port or (443 if scheme == "https" else 80))


async def resolve_host(host: str, port: int) -> list[IPAddress]:
    """Every address (A and AAAA) ``host`` resolves to, in the resolver's order, without blocking
    the event loop. Raises OSError (socket.gaierror) when it does not resolve. Tests replace it."""
    literal = parse_ip_literal(host)
    if literal is not None:
        return [literal]
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[IPAddress, None] = {}
    for _family, _type, _proto, _canon, sockaddr in infos:
        seen.setdefault(ipaddress.ip_address(str(sockaddr[0])), None)
    return list(seen)


async def check_host(host: str, port: int, policy: SsrfPolicy) -> list[IPAddress]:
    """Resolve ``host`` and return its addresses when every one passes ``policy``; else raise
    :class:`SsrfRefused` naming the first that does not. An allowlisted name is resolved but not
    judged. A name that does not resolve raises OSError."""
    addresses = await resolve_host(host, port)
    if not addresses:
        raise OSError(f"{host!r} resolved to no address")
    if not policy.host_is_allowed(host):
        for address in addresses:
            kind = policy.refusal(address)
            if kind is not None:
                raise _refuse(host, address, kind)
    return addresses


async def check_url(url: str, policy: SsrfPolicy) -> CheckedTarget:
    """The full check of one URL: :func:`target_of`, then DNS with every answer judged. Raises
    :class:`SsrfRefused` (or OSError when the host does not resolve). A connection made later must
    still go through :func:`common.ssrf_http.guarded_http_client`: only that pins it to the checked
    addresses."""
    target = target_of(url, policy)
    addresses = await check_host(target.host, target.port, policy)
    return replace(target, addresses=tuple(addresses))


