"""Rules for the URLs callers give the gateway (worker URLs from the API, the console, commands and
--worker-urls): one place, so every entry point refuses the same things."""

from __future__ import annotations

import re

__all__ = ["url_has_credentials", "redact_credentials"]

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
