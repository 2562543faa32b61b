"""The gateway's runtime flags (spec: command-line options), each also read from an environment variable.

``rungateway`` parses argv into a :class:`GatewayConfig`, installs it for this process and exports it
as ``GW_CONFIG`` so a server started in another process (``uvicorn gateway_project.asgi:application``,
``manage.py runserver``) sees the same values. Without ``GW_CONFIG`` the flags' environment variables
(``GW_PORT``, ``GW_WORKER_URLS``...) apply.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, NoReturn, Sequence

import orjson

__all__ = [
    "GatewayConfig",
    "ConfigError",
    "POLICIES",
    "SERVERS",
    "add_gateway_arguments",
    "config_from_namespace",
    "parse_gateway_args",
    "current_config",
    "install_config",
]

POLICIES = ("round_robin", "random", "power_of_two", "least_load")
SERVERS = ("uvicorn", "daphne")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_MAX_PAYLOAD = 512 * 1024 * 1024


class ConfigError(ValueError):
    """A flag or environment value that does not parse."""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "0.0.0.0"
    port: int = 30000
    worker_urls: tuple[str, ...] = ()
    api_key: str | None = field(default=None, repr=False)
    tenant_api_keys: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    model_aliases: tuple[tuple[str, str], ...] = ()
    policy: str = "round_robin"
    request_timeout_secs: float = 1800.0
    max_payload_size: int = DEFAULT_MAX_PAYLOAD
    log_level: str = "info"
    server: str = "uvicorn"
    worker_startup_check_interval: float = 30.0
    worker_startup_timeout_secs: float = 1800.0

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_key or self.tenant_api_keys)

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_json(cls, raw: str) -> GatewayConfig:
        data: dict[str, Any] = orjson.loads(raw)
        data["worker_urls"] = tuple(data.get("worker_urls", ()))
        data["tenant_api_keys"] = tuple(tuple(pair) for pair in data.get("tenant_api_keys", ()))
        data["model_aliases"] = tuple(tuple(pair) for pair in data.get("model_aliases", ()))
        return cls(**data)


def _env(name: str, default: Any) -> Any:
    return os.environ.get(name, default)


def _env_list(name: str) -> list[str]:
    return [item for item in os.environ.get(name, "").replace(",", " ").split() if item]


def _number(cast: Callable[[str], Any], what: str, low: float, high: float | None = None) -> Callable[[str], Any]:
    """An argparse type: ``cast(text)`` within [low, high] (low exclusive when it is 0)."""

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        too_low = value <= low if low == 0 else value < low
        if too_low or (high is not None and value > high):
            bounds = f"greater than {low:g}" if high is None else f"{low:g}-{high:g}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text!r}")
        return value

    return parse


_positive_float = _number(float, "a number", 0)
_positive_int = _number(int, "an integer", 0)
_port = _number(int, "a port number", 1, 65535)


def _worker_url(text: str) -> str:
    lowered = text.split("://", 1)[0] if "://" in text else ""
    if lowered not in ("http", "https"):
        raise argparse.ArgumentTypeError(
            f"worker URL must start with http:// or https:// (gRPC and ZMQ workers come later), got {text!r}"
        )
    if len(text) <= len(lowered) + 3:
        raise argparse.ArgumentTypeError(f"worker URL has no host: {text!r}")
    return text.rstrip("/")


def _pair(separator: str, what: str) -> Any:
    def parse(text: str) -> tuple[str, str]:
        left, sep, right = text.partition(separator)
        if not sep or not left or not right:
            raise argparse.ArgumentTypeError(f"expected {what}, got a malformed value")
        return (left, right)

    return parse


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """The gateway's flags. Defaults come from GW_* environment variables, then the spec's defaults."""
    add = parser.add_argument
    add("--host", default=_env("GW_HOST", "0.0.0.0"), help="listen address (GW_HOST, default 0.0.0.0)")
    add("--port", type=_port, default=_env("GW_PORT", "30000"), help="listen port (GW_PORT, default 30000)")
    add(
        "--worker-urls",
        nargs="*",
        type=_worker_url,
        default=_env_list("GW_WORKER_URLS"),
        metavar="URL",
        help="HTTP worker base URLs (GW_WORKER_URLS, space or comma separated)",
    )
    add("--api-key", default=_env("GW_API_KEY", None), help="shared client API key (GW_API_KEY)")
    add(
        "--tenant-api-key",
        action="append",
        type=_pair(":", "tenant_id:key"),
        default=None,
        metavar="TENANT:KEY",
        help="per-tenant API key, repeatable (GW_TENANT_API_KEYS, space separated)",
    )
    add(
        "--model-alias",
        action="append",
        type=_pair("=", "alias=model"),
        default=None,
        metavar="ALIAS=MODEL",
        help="model alias, repeatable (GW_MODEL_ALIASES, space separated)",
    )
    add("--policy", choices=POLICIES, default=_env("GW_POLICY", "round_robin"), help="worker selection policy")
    add(
        "--request-timeout-secs",
        type=_positive_float,
        default=_env("GW_REQUEST_TIMEOUT_SECS", "1800"),
        help="upstream request timeout in seconds (default 1800)",
    )
    add(
        "--max-payload-size",
        type=_positive_int,
        default=_env("GW_MAX_PAYLOAD_SIZE", str(DEFAULT_MAX_PAYLOAD)),
        help="largest accepted request body in bytes (default 512 MiB)",
    )
    add("--log-level", choices=LOG_LEVELS, default=_env("GW_LOG_LEVEL", "info"))
    add("--server", choices=SERVERS, default=_env("GW_SERVER", "uvicorn"), help="ASGI server (default uvicorn)")
    add(
        "--worker-startup-check-interval",
        type=_positive_float,
        default=_env("GW_WORKER_STARTUP_CHECK_INTERVAL", "30"),
        help="longest wait between discovery attempts for a worker that is not up yet (default 30 s)",
    )
    add(
        "--worker-startup-timeout-secs",
        type=_positive_float,
        default=_env("GW_WORKER_STARTUP_TIMEOUT_SECS", "1800"),
        help="give up discovering a worker after this long (default 1800 s)",
    )


def _env_pairs(name: str, separator: str, what: str) -> list[tuple[str, str]]:
    parse = _pair(separator, what)
    pairs = []
    for item in _env_list(name):
        try:
            pairs.append(parse(item))
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return pairs


def config_from_namespace(ns: argparse.Namespace) -> GatewayConfig:
    """Build the config from parsed flags (string defaults from the environment are converted here)."""
    try:
        port = _port(str(ns.port))
        timeout = _positive_float(str(ns.request_timeout_secs))
        max_payload = _positive_int(str(ns.max_payload_size))
        check_interval = _positive_float(str(ns.worker_startup_check_interval))
        startup_timeout = _positive_float(str(ns.worker_startup_timeout_secs))
        worker_urls = [_worker_url(url) for url in ns.worker_urls]
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(str(exc)) from None
    if ns.policy not in POLICIES:
        raise ConfigError(f"unknown policy {ns.policy!r}; choose one of {', '.join(POLICIES)}")
    if ns.server not in SERVERS:
        raise ConfigError(f"unknown server {ns.server!r}; choose one of {', '.join(SERVERS)}")
    tenants = ns.tenant_api_key if ns.tenant_api_key is not None else _env_pairs(
        "GW_TENANT_API_KEYS", ":", "tenant_id:key"
    )
    aliases = ns.model_alias if ns.model_alias is not None else _env_pairs("GW_MODEL_ALIASES", "=", "alias=model")
    return GatewayConfig(
        host=ns.host,
        port=port,
        worker_urls=tuple(dict.fromkeys(worker_urls)),
        api_key=ns.api_key or None,
        tenant_api_keys=tuple(tenants),
        model_aliases=tuple(aliases),
        policy=ns.policy,
        request_timeout_secs=timeout,
        max_payload_size=max_payload,
        log_level=ns.log_level,
        server=ns.server,
        worker_startup_check_interval=check_interval,
        worker_startup_timeout_secs=startup_timeout,
    )


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def parse_gateway_args(argv: Sequence[str] = ()) -> GatewayConfig:
    """Parse flags outside of manage.py (tests, the ASGI module). Raises ConfigError."""
    parser = _RaisingParser(prog="gateway", exit_on_error=False)
    add_gateway_arguments(parser)
    try:
        ns = parser.parse_args(list(argv))
    except argparse.ArgumentError as exc:
        raise ConfigError(str(exc)) from None
    return config_from_namespace(ns)


_installed: GatewayConfig | None = None


def install_config(config: GatewayConfig, *, export: bool = True) -> None:
    """Make ``config`` this process's configuration (and, exported, that of servers it starts)."""
    global _installed
    _installed = config
    if export:
        os.environ["GW_CONFIG"] = config.to_json()


def current_config() -> GatewayConfig:
    global _installed
    if _installed is None:
        raw = os.environ.get("GW_CONFIG")
        _installed = GatewayConfig.from_json(raw) if raw else parse_gateway_args(())
    return _installed
