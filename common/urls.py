"""Rules for the URLs callers give the gateway (worker URLs from the API, the console, commands and
--worker-urls): one place, so every entry point refuses the same things."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import httpx
import yarl

__all__ = [
    "url_has_credentials", "redact_credentials", "WorkerUrlRefused", "check_worker_url", "WORKER_URL_MAX_LENGTH",
    "WORKER_SCHEMES", "CREDENTIALS_REFUSED",
]  # fmt: skip

WORKER_SCHEMES = ("http://", "https://", "grpc://", "grpcs://", "ipc://")
WORKER_URL_MAX_LENGTH = 2048
"""The longest worker URL: the length of the store's column (administration/models.py; a test holds
the two equal)."""
CREDENTIALS_REFUSED = (
    "url must not carry credentials (user:password@host); give the worker's key as api_key, which is never shown"
)


class WorkerUrlRefused(ValueError):
    """A worker URL the rules refuse (the reason is the message)."""


def check_worker_url(url: str) -> str:
    """A worker URL by the rules of every entry point (POST and PUT /workers, the console, add_worker,
    --worker-urls): a lowercase scheme we know, a host and a valid port, no credentials (refused
    before anything could echo them, docs/DECISIONS.md D25), no whitespace, and a path for ipc://;
    at most WORKER_URL_MAX_LENGTH characters. The URL without a trailing "/" (an ipc:// one as
    given). Raises :class:`WorkerUrlRefused`."""
    if not url:
        raise WorkerUrlRefused("url must not be empty")
    if len(url) > WORKER_URL_MAX_LENGTH:
        raise WorkerUrlRefused(f"url is longer than {WORKER_URL_MAX_LENGTH} characters")
    if url_has_credentials(url):
        raise WorkerUrlRefused(CREDENTIALS_REFUSED)
    if not url.startswith(WORKER_SCHEMES):
        raise WorkerUrlRefused("url must start with a lowercase http://, https://, grpc://, grpcs:// or ipc:// scheme")
    if url.startswith("ipc://"):
        if url[len("ipc://"):].strip() == "":
            raise WorkerUrlRefused("an ipc:// url needs a socket path")
        return url
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
        # And as the clients that will use it read it (registration and health checks through httpx,
        # the relay through aiohttp's yarl): a URL one of them refuses would fail a job after the 202.
        httpx.URL(url)
        yarl.URL(url).port  # noqa: B018
    except (ValueError, httpx.InvalidURL):
        raise WorkerUrlRefused(f"url is invalid: {url}") from None
    if not parts.hostname:
        raise WorkerUrlRefused("url has no host")
    if any(ch.isspace() for ch in url):
        raise WorkerUrlRefused(f"url is invalid: {url}")
    return url.rstrip("/")

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]*@")


def url_has_credentials(url: str) -> bool:
    """Whether a network URL names a user or password before its host (``scheme://user:pass@host``).
    Such URLs are refused wherever a worker URL comes in (docs/DECISIONS.md D25)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme == "ipc":
        return False
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    return "@" in authority


def redact_credentials(text: str) -> str:
    """``text`` with the user and password of every URL in it replaced by ``***`` (for log lines
    that quote a service's error, which may name its URL)."""
    return _USERINFO.sub(r"\1***@", text)
