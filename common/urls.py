"""Rules for the URLs callers give the gateway (worker URLs from the API, the console, commands and
--worker-urls): one place, so every entry point refuses the same things."""

from __future__ import annotations

__all__ = ["url_has_credentials"]


def url_has_credentials(url: str) -> bool:
    """Whether a network URL names a user or password before its host (``scheme://user:pass@host``).
    Such URLs are refused wherever a worker URL comes in (docs/DECISIONS.md D25)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme == "ipc":
        return False
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    return "@" in authority
