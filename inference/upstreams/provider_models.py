"""What an external provider lists as its models, asked of its own model-list route with a key (spec 3,
registration of external workers; spec 1, GET /v1/models with a caller's own provider key).

Each provider is asked as its API wants (docs ENGINES.md, "External providers") and read in its own
list shape:

- OpenAI and xAI: ``GET /v1/models`` with ``Authorization: Bearer``; ``{"object": "list", "data":
  [{"id", "object": "model", "created", "owned_by"}]}``.
- Anthropic: ``GET /v1/models?limit=1000`` with ``x-api-key`` and ``anthropic-version`` (its pages
  hold 20 models unless asked for more, at most 1000); ``{"data": [{"type": "model", "id",
  "display_name", "created_at"}], "has_more", "first_id", "last_id"}``.
- Gemini, through its OpenAI-compatible API: ``GET /v1/models`` with ``Authorization: Bearer``;
  ``data[].id`` (or, in its native shape, ``models[].name``) names a model as ``models/<id>``, and the
  id its requests take is the part after ``models/``.

The key is given by :func:`~inference.upstreams.provider.provider_key_headers`, the one place that
says how a provider takes a key. Every connection passes the SSRF guard (a provider URL is one a
caller gave), the answer is bounded in size and the exchange in time.
"""

from __future__ import annotations

import asyncio

import httpx2
import orjson

from common.ssrf import SsrfPolicy
from common.ssrf_http import guarded_http_client
from inference.upstreams.provider import provider_key_headers

__all__ = [
    "ANTHROPIC_VERSION", "LISTING_MAX_BYTES", "LISTING_TIMEOUT_SECS", "ProviderListing", "fetch_provider_models",
    "listing_request", "parse_model_list",
]  # fmt: skip

ANTHROPIC_VERSION = "2023-06-01"
"""The anthropic-version the gateway sends on requests of its own (Anthropic asks every request for one)."""

LISTING_TIMEOUT_SECS = 10.0  # one listing, connect to last byte
_CONNECT_TIMEOUT_SECS = 5.0
LISTING_MAX_BYTES = 8 * 2**20  # a provider's model list (OpenAI's is about 20 kB)
_GEMINI_PREFIX = "models/"


def listing_request(provider: str | None, api_key: str | None) -> tuple[str, dict[str, str]]:
    """The path (under the worker URL) and the headers of ``provider``'s model list, asked with ``api_key``."""
    headers = dict(provider_key_headers(provider, api_key))
    if provider == "anthropic":
        headers["anthropic-version"] = ANTHROPIC_VERSION
        return "/v1/models?limit=1000", headers
    return "/v1/models", headers


def _ids(entries: object, field: str) -> list[str]:
    if not isinstance(entries, list):
        return []
    return [entry[field] for entry in entries if isinstance(entry, dict) and isinstance(entry.get(field), str)]


def parse_model_list(provider: str | None, body: bytes) -> tuple[str, ...]:
    """The model ids in ``provider``'s list answer, each once, in its order; () for anything else."""
    try:
        listing = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ()
    if not isinstance(listing, dict):
        return ()
    ids = _ids(listing.get("data"), "id")
    if provider == "gemini":
        ids = [name.removeprefix(_GEMINI_PREFIX) for name in ids or _ids(listing.get("models"), "name")]
    return tuple(dict.fromkeys(model for model in ids if model))


class ProviderListing:
    """One provider's answer to its model-list request: its status and the models it listed."""

    __slots__ = ("status", "models")

    def __init__(self, status: int, models: tuple[str, ...]) -> None:
        self.status = status
        self.models = models

    @property
    def refused(self) -> bool:
        """The provider refused the key (or its absence)."""
        return self.status in (401, 403)


async def fetch_provider_models(
    url: str, provider: str | None, api_key: str | None, policy: SsrfPolicy, timeout_secs: float = LISTING_TIMEOUT_SECS
) -> ProviderListing:
    """``provider``'s models at ``url``, asked with ``api_key`` over a connection the SSRF guard checked
    and pinned, within ``timeout_secs`` and :data:`LISTING_MAX_BYTES`. A non-2xx answer lists nothing.
    Raises :class:`common.ssrf.SsrfRefused` for a refused address, ``httpx2.HTTPError`` when the
    provider does not answer (or answers too much), TimeoutError past ``timeout_secs``."""
    path, headers = listing_request(provider, api_key)
    timeout = httpx2.Timeout(timeout_secs, connect=min(_CONNECT_TIMEOUT_SECS, timeout_secs))
    async with asyncio.timeout(timeout_secs):
        async with guarded_http_client(policy, timeout=timeout, headers=headers, max_response_bytes=LISTING_MAX_BYTES) as client:
            response = await client.get(url.rstrip("/") + path)
    models = parse_model_list(provider, response.content) if response.is_success else ()
    return ProviderListing(response.status_code, models)
