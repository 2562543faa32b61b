"""What an HTTP worker serves and which engine it runs, asked over HTTP (control plane: httpx,
sync: it runs inside registration jobs, in Celery or on a job thread); and what an external
provider serves, through the SSRF guard's client.

DataPlane detection (docs ENGINES.md): /v1/models ``owned_by`` sglang or vllm; else /version answering
means vllm; else /server_info answering means sglang; else generic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generator, Mapping

import httpx
import httpx2

from common.ssrf import SsrfPolicy, SsrfRefused
from inference.routing.workers import RuntimeType
from inference.upstreams.provider_models import LISTING_TIMEOUT_SECS, fetch_provider_models, listing_request

__all__ = [
    "Discovery", "WorkerUnreachable", "WorkerRefused", "discover_http_worker", "adiscover_http_worker", "json_answer",
    "probe_headers", "discover_provider", "http_server_info",
]


class WorkerUnreachable(Exception):
    """The worker did not answer (not up yet, or gone)."""


class WorkerRefused(Exception):
    """The worker answered 401 or 403: the key it was given (or none) is not one it accepts. Waiting
    does not help, and registering it anyway would route requests it refuses."""


@dataclass(frozen=True, slots=True)
class Discovery:
    runtime_type: str
    model_ids: tuple[str, ...]
    labels: dict[str, str]

    @property
    def model_id(self) -> str | None:
        return self.model_ids[0] if self.model_ids else None


def _why(exc: Exception) -> str:
    """A connection error as the log and the job show it: its kind and its text (the OS's reason,
    such as "[Errno 111] Connection refused"); never a header, so never a key."""
    text = str(exc)
    return f"{type(exc).__name__} ({text})" if text else type(exc).__name__


_OWNED_BY = {"sglang": RuntimeType.SGLANG, "vllm": RuntimeType.VLLM}


def _get_json(client: httpx.Client, url: str, headers: dict[str, str]) -> Any | None:
    """The JSON answer of a GET, None for a non-2xx or non-JSON answer; unreachable and refused raise."""
    try:
        response = client.get(url, headers=headers)
    except httpx.TransportError as exc:
        raise WorkerUnreachable(f"{_why(exc)} for {url}") from None
    return json_answer(response.status_code, response.json, url, headers)


def json_answer(status: int, parse: Callable[[], Any], url: str, headers: Mapping[str, str]) -> Any | None:
    """What a probe makes of an answer, whichever client asked: refused (401, 403) raises
    WorkerRefused, another non-2xx is None, a body that is not JSON is ``{}``."""
    if status in (401, 403):
        given = "the API key given" if headers else "no API key"
        raise WorkerRefused(f"worker refused {given}: HTTP {status} for {url}")
    if not 200 <= status < 300:
        return None
    try:
        return parse()
    except ValueError:
        return {}


def probe_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def discover_http_worker(
    client: httpx.Client, base_url: str, api_key: str | None, runtime_type: str = RuntimeType.UNSPECIFIED
) -> Discovery:
    headers = probe_headers(api_key)
    steps = _discovery_steps(base_url, runtime_type)
    try:
        url = next(steps)
        while True:
            url = steps.send(_get_json(client, url, headers))
    except StopIteration as done:
        return done.value


async def adiscover_http_worker(
    get_json: Callable[[str], Awaitable[Any | None]], base_url: str, runtime_type: str = RuntimeType.UNSPECIFIED
) -> Discovery:
    """:func:`discover_http_worker` over another client: ``get_json(url)`` answers each GET as
    :func:`json_answer` does (and raises WorkerUnreachable when it gets no answer)."""
    steps = _discovery_steps(base_url, runtime_type)
    try:
        url = next(steps)
        while True:
            url = steps.send(await get_json(url))
    except StopIteration as done:
        return done.value


def _discovery_steps(base_url: str, runtime_type: str) -> Generator[str, Any | None, Discovery]:
    """What discovery asks a worker, one URL at a time (each GET's JSON answer, or None, is sent
    back), and what it makes of the answers: the same steps whichever client asks."""
    listing = yield f"{base_url}/v1/models"
    model_ids: list[str] = []
    owned_by = ""
    if isinstance(listing, dict) and isinstance(listing.get("data"), list):
        for entry in listing["data"]:
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                model_ids.append(entry["id"])
                owned_by = owned_by or str(entry.get("owned_by") or "")
    if runtime_type == RuntimeType.UNSPECIFIED:
        runtime_type = _OWNED_BY.get(owned_by.lower(), "")
        if not runtime_type:
            if (yield f"{base_url}/version") is not None:
                runtime_type = RuntimeType.VLLM
            elif (yield f"{base_url}/server_info") is not None:
                runtime_type = RuntimeType.SGLANG
            else:
                runtime_type = RuntimeType.GENERIC
    labels: dict[str, str] = {}
    info = yield f"{base_url}/get_model_info"
    if isinstance(info, dict):
        for key in ("model_path", "tokenizer_path", "served_model_name"):
            if isinstance(info.get(key), str) and info[key]:
                labels[key] = info[key]
    if model_ids:
        labels.setdefault("served_model_name", model_ids[0])
    return Discovery(runtime_type=str(runtime_type), model_ids=tuple(model_ids), labels=labels)


def http_server_info(client: httpx.Client, base_url: str, api_key: str | None) -> dict[str, Any] | None:
    """The worker's server information (SGLang: /server_info, older releases /get_server_info, with
    its server arguments such as dp_size at the top); None when it answers neither."""
    headers = probe_headers(api_key)
    for route in ("/server_info", "/get_server_info"):
        info = _get_json(client, f"{base_url}{route}", headers)
        if isinstance(info, dict) and info:
            return info
    return None


async def discover_provider(url: str, api_key: str | None, provider: str | None, policy: SsrfPolicy) -> Discovery:
    """An external provider's models, from its own model list (read in its own shape:
    :mod:`inference.upstreams.provider_models`), over a connection the SSRF guard checked and pinned
    (a provider URL is a URL a caller gave). Raises WorkerRefused for a refused key or address,
    WorkerUnreachable while it does not answer; a listing it does not give is no models (the worker
    then takes any model)."""
    listing_url = url + listing_request(provider, api_key)[0]
    try:
        listing = await fetch_provider_models(url, provider, api_key, policy)
    except SsrfRefused as exc:
        raise WorkerRefused(f"provider URL {exc.reason}") from None
    except httpx2.HTTPError as exc:
        raise WorkerUnreachable(f"{_why(exc)} for {listing_url}") from None
    except TimeoutError:
        raise WorkerUnreachable(f"no answer within {LISTING_TIMEOUT_SECS:g} s for {listing_url}") from None
    if listing.refused and api_key:
        raise WorkerRefused(f"provider refused the API key given: HTTP {listing.status} for {listing_url}")
    # Without a key of its own the worker relays its callers' keys (open mode), so a listing refused
    # for want of one says nothing against it: it then takes any model.
    labels = {"provider": provider} if provider else {}
    return Discovery(runtime_type=RuntimeType.EXTERNAL, model_ids=listing.models, labels=labels)
