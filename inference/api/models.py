"""GET /v1/models (spec 1, Model list): public; each self-hosted model once, aliases not listed.

A caller that sends a bearer token or an x-api-key that is not one of the gateway's keys sends its
own provider key: the registered external providers' model lists are asked with it (each in its own
way: :mod:`inference.upstreams.provider_models`), all at once, and the first non-empty one in
registration order is the answer, its models ``owned_by`` the provider; with none, the self-hosted
list. A gateway key is never sent to a provider. The path reads only the registry snapshot (no
database); each listing passes the SSRF guard, is bounded in size and, like the whole wait, in time.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from common.secrets import bearer_token
from common.ssrf import SsrfPolicy
from inference import errors
from inference.asgi_io import Receive, Scope, Send, header, request_id_for, send_error, send_json, send_response
from inference.auth import KeyRing
from inference.dataplane import DataPlane, data_plane
from inference.routing.workers import WorkerRecord
from inference.upstreams.provider_models import LISTING_TIMEOUT_SECS, ProviderListing, fetch_provider_models

__all__ = ["list_models", "provider_key_of"]

log = logging.getLogger(__name__)

_NO_MODELS = b"No models available"
_SENDABLE_KEY = re.compile(rb"[\x21-\x7e]{1,4096}")  # a key a provider's header can carry as it is


def provider_key_of(scope: Scope, keys: KeyRing) -> str | None:
    """The caller's own provider key: its bearer token, else its x-api-key, whichever is not a
    gateway key (and can be sent as a header value); None when it sent neither."""
    for presented in (bearer_token(header(scope, b"authorization")), header(scope, b"x-api-key")):
        if presented and _SENDABLE_KEY.fullmatch(presented) and (not keys.enabled or keys.find(presented) is None):
            return presented.decode("ascii")
    return None


def _providers(dp: DataPlane) -> list[WorkerRecord]:
    """The ready external workers, one per provider URL, in registration order."""
    seen: set[tuple[str, str | None]] = set()
    found = []
    for handle in dp.registry.snapshot.routable:
        record = handle.record
        if record.external and (record.url, record.provider) not in seen:
            seen.add((record.url, record.provider))
            found.append(record)
    return found


async def _provider_list(dp: DataPlane, key: str) -> list[dict[str, Any]]:
    """The first non-empty model list the providers give for ``key``, as list entries; [] for none."""
    providers = _providers(dp)
    if not providers:
        return []
    policy = SsrfPolicy.from_config(dp.config)
    timeout = min(LISTING_TIMEOUT_SECS, dp.config.request_timeout_secs)
    answers = await asyncio.gather(
        *(fetch_provider_models(record.url, record.provider, key, policy, timeout) for record in providers),
        return_exceptions=True,
    )
    for record, answer in zip(providers, answers):
        if isinstance(answer, ProviderListing) and answer.models:
            owner = record.provider or "external"
            return [{"id": model, "object": "model", "created": 0, "owned_by": owner} for model in answer.models]
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer
            log.info("provider %s gave no model list for a caller's key (%s)", record.url, type(answer).__name__)
    return []


async def list_models(scope: Scope, receive: Receive, send: Send) -> None:
    request_id = request_id_for(scope)
    if scope["method"] not in ("GET", "HEAD"):
        await send_error(send, errors.method_not_allowed(scope["method"], scope["path"], "GET"), request_id)
        return
    dp = data_plane()
    key = provider_key_of(scope, dp.keys)
    if key is not None:
        listed = await _provider_list(dp, key)
        if listed:
            await send_json(send, 200, {"object": "list", "data": listed}, request_id)
            return
    models = dp.registry.snapshot.routable_models
    if not models:
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"x-request-id", request_id)]
        await send_response(send, 503, _NO_MODELS, headers)
        return
    data = [{"id": model, "object": "model", "created": 0, "owned_by": "self_hosted"} for model in models]
    await send_json(send, 200, {"object": "list", "data": data}, request_id)
