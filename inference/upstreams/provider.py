"""External providers (OpenAI, Anthropic, Gemini, xAI, or any OpenAI-compatible third-party API): the
HTTP relay, with what a third party changes.

- **Only the worker's own key goes upstream**, never the gateway's: Anthropic's as ``x-api-key``,
  everyone else's as a Bearer token. A worker registered without a key relays its caller's
  Authorization header instead, and only in open mode (no gateway keys: the token is then the
  caller's own provider key, never one of ours).
- **Every connection passes the SSRF guard** (:mod:`common.ssrf`): a provider URL is one a caller
  gave. The connector resolves names through :class:`GuardedResolver`, which refuses a name any of
  whose addresses the policy refuses (so a DNS answer that changed since registration is judged
  again, and the connection dials only the addresses that passed); a URL whose host is an address
  literal is judged when its route is prepared.

Everything else (pooling, deadlines, bounded answers, disconnects) is the HTTP relay's.
"""

from __future__ import annotations

import ipaddress
import socket

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from common.config import GatewayConfig
from common.ssrf import SsrfPolicy, SsrfRefused, target_of
from inference.routing.workers import WorkerRecord
from inference.upstreams.base import RELAYS, RelayRequest
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.http import KEEPALIVE_SECS, HttpRelay, _header_line, _Target
from inference.upstreams.usage_scan import NullUsageStream

__all__ = [
    "EXTERNAL", "PROVIDER_KEY_HEADERS", "STREAM_USAGE_PROVIDERS", "GuardedResolver", "ProviderRelay",
    "provider_key_headers",
]  # fmt: skip

EXTERNAL = "external"
"""The relay's name: external workers are relayed by it, whatever their URL's scheme says."""


PROVIDER_KEY_HEADERS: dict[str, str] = {
    "openai": "Authorization",
    "xai": "Authorization",
    "gemini": "Authorization",  # its OpenAI-compatible API takes the key as a Bearer token
    "anthropic": "x-api-key",
}
"""The header each known provider takes its key in (docs ENGINES.md, "External providers"); any
other OpenAI-compatible API takes it as OpenAI does."""


STREAM_USAGE_PROVIDERS = frozenset({"openai"})
"""The providers a chat or completions stream whose client did not ask for usage is sent with
``stream_options.include_usage`` added, to account it (docs/DECISIONS.md D80): OpenAI, which then
adds a usage-only event and ``"usage":null`` to every other chunk, both taken out of what the client
receives (:class:`~inference.upstreams.usage_scan.NullUsageStream`). Not the others: Gemini's
OpenAI-compatible API reports usage in its last chunk unasked; xAI, asked, puts it on the finish
chunk, which the client would then receive changed; an unnamed OpenAI-compatible API may refuse the
option (a 400 for a stream that works today). Their streams are counted from the usage they send,
else estimated (D80)."""


def provider_key_headers(provider: str | None, api_key: str | None) -> tuple[tuple[str, str], ...]:
    """How a provider is given a key: in its header of :data:`PROVIDER_KEY_HEADERS`, as the bare key
    (x-api-key) or a Bearer token (Authorization)."""
    if not api_key:
        return ()
    name = PROVIDER_KEY_HEADERS.get(provider or "", "Authorization")
    return ((name, f"Bearer {api_key}" if name == "Authorization" else api_key),)


class GuardedResolver(AbstractResolver):
    """The system resolver, with every answer judged by the SSRF policy: one refused address
    refuses the name (an OSError, which the connector reports as a failed connect)."""

    def __init__(self, policy: SsrfPolicy) -> None:
        self._policy = policy
        self._inner = ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        if not self._policy.host_is_allowed(host):
            for answer in answers:
                kind = self._policy.refusal(ipaddress.ip_address(answer["host"]))
                if kind is not None:
                    raise OSError(f"refused: {host!r} resolves to a {kind.value} address")
        return answers

    async def close(self) -> None:
        await self._inner.close()


@RELAYS.register(EXTERNAL)
class ProviderRelay(HttpRelay):
    """The relay of external workers (see the module's docstring)."""

    asked_usage_scan = NullUsageStream

    @classmethod
    def from_config(cls, config: GatewayConfig) -> ProviderRelay:
        return cls(
            config.request_timeout_secs, config.upstream_pool_idle_timeout_secs,
            max_answer_bytes=config.max_buffered_response_bytes, policy=SsrfPolicy.from_config(config),
        )  # fmt: skip

    def __init__(
        self, request_timeout_secs: float, keepalive_secs: float = KEEPALIVE_SECS, max_answer_bytes: int = 2**28,
        *, policy: SsrfPolicy = SsrfPolicy(),
    ) -> None:  # fmt: skip
        super().__init__(request_timeout_secs, keepalive_secs, max_answer_bytes)
        self.policy = policy

    def _connector(self) -> aiohttp.TCPConnector:
        return aiohttp.TCPConnector(
            limit=0, limit_per_host=0, keepalive_timeout=self._keepalive_secs or None, enable_cleanup_closed=True,
            resolver=GuardedResolver(self.policy),
        )  # fmt: skip

    def _target(self, record: WorkerRecord, path: str) -> _Target:
        try:
            target_of(record.url, self.policy)  # an address literal never reaches the resolver
        except SsrfRefused as refused:
            raise UpstreamFailure(FailureKind.CONNECT, refused.reason) from None
        return super()._target(record, path)

    def _key_lines(self, provider: str | None, api_key: str | None) -> bytes:
        return b"".join(_header_line(name, value) for name, value in provider_key_headers(provider, api_key))

    def _caller_key_lines(self, request: RelayRequest) -> bytes:
        """The caller's own key, for a worker registered without one (open mode only: see above)."""
        if request.worker.record.api_key or not request.caller_key:
            return b""
        return self._key_lines(request.worker.record.provider, request.caller_key)
