"""Typed readers for settings from the environment. A value that does not parse fails loudly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "env_str", "env_bool", "env_int", "env_list", "env_secret", "database_from_url", "channel_layer_from_url",
]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None else value


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {value!r}")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return list(default or [])
    return [item for item in value.replace(",", " ").split() if item]


def env_secret(name: str, default: str | None = None) -> str | None:
    """Read NAME, or the contents of the file named by NAME_FILE (Docker/K8s secrets)."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {file_name}: {exc.strerror}") from None
    return env_str(name, default)


# While Postgres is down, a request that needs it waits at most this long for a pooled connection
# (psycopg's default is 30 s) and a new connection at most CONNECT_TIMEOUT_SECS, then answers 503
# (administration/store_outage.py). DATABASE_URL's ?pool_timeout= and ?connect_timeout= change them.
POOL_TIMEOUT_SECS = 3.0
CONNECT_TIMEOUT_SECS = 3


def _positive_seconds(name: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number of seconds, got {value!r}") from None
    if not seconds > 0:
        raise ImproperlyConfigured(f"{name} must be above 0, got {value!r}")
    return seconds


def database_from_url(url: str, *, base_dir: Path) -> dict[str, Any]:
    """A Django DATABASES entry from sqlite:///path or postgres://user:pass@host:port/name."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        raw_path = unquote(parts.path)
        if raw_path.startswith("//"):  # sqlite:////abs/path
            name = raw_path[1:]
        elif raw_path in ("", "/"):
            raise ImproperlyConfigured("DATABASE_URL: sqlite URL needs a file path")
        else:  # sqlite:///relative/path
            name = str(base_dir / raw_path.lstrip("/"))
        if name == "/:memory:":
            name = ":memory:"
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name,
            "OPTIONS": {
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    if scheme in ("postgres", "postgresql", "pgsql"):
        if not parts.path or parts.path == "/":
            raise ImproperlyConfigured("DATABASE_URL: postgres URL needs a database name")
        pool: dict[str, Any] = {"min_size": 1, "max_size": 10, "timeout": POOL_TIMEOUT_SECS}
        options: dict[str, Any] = {"pool": pool, "connect_timeout": CONNECT_TIMEOUT_SECS}
        for key, values in parse_qs(parts.query).items():
            if key == "pool_timeout":
                pool["timeout"] = _positive_seconds("DATABASE_URL: pool_timeout", values[-1])
            else:  # libpq parameters (sslmode, connect_timeout, ...)
                options[key] = values[-1]
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "CONN_MAX_AGE": 0,
            # The pool checks a connection before handing it out: one Postgres dropped (a restart, a
            # failover, a cut network) is replaced instead of failing the request that drew it.
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": options,
        }
    raise ImproperlyConfigured(f"DATABASE_URL: unsupported scheme {scheme!r} (use sqlite:// or postgres://)")


# channels_redis waits up to 5 s per blocking read (BZPOPMIN). redis-py's default 5 s socket timeout
# would cut every idle wait: the receiving loop errors, rejoins its groups a second later, and a
# notice sent in between is lost. The socket timeout must stay above that wait.
LAYER_SOCKET_TIMEOUT_SECS = 15


def channel_layer_from_url(redis_url: str | None) -> dict[str, Any]:
    """The Channels layer: Redis (shared by every gateway process) when a URL is given, else in-memory."""
    if not redis_url:
        return {"BACKEND": "channels.layers.InMemoryChannelLayer"}
    host = {"address": redis_url, "socket_timeout": LAYER_SOCKET_TIMEOUT_SECS, "socket_connect_timeout": 5}
    return {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [host]}}
