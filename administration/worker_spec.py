"""The worker spec (spec 3: body of POST /workers and PUT /workers/{id}): parsing and its two kinds of
failure.

- :class:`SpecTypeError`: a known field with the wrong type or an unknown enum value, or no url.
  Answered 422 in plain text, before any other check (the spec's deserialisation failure).
- :class:`SpecRuleError`: a well-typed value the rules refuse (the URL's scheme, host or path).
  Answered 400 BAD_REQUEST.

Unknown fields are ignored. Nested blocks are partial: omitted fields keep gateway defaults, which
are applied where the block is used (health checks, breakers), so a stored block holds only what
the operator said.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from common.urls import url_has_credentials
from inference.routing.workers import RuntimeType, Transport, WorkerType, normalize_runtime_type, transport_of

__all__ = [
    "WorkerSpec",
    "SpecTypeError",
    "SpecRuleError",
    "parse_worker_spec",
    "parse_worker_patch",
    "transport_of",
    "MODEL_TYPES",
    "PROVIDER_HOSTS",
]

WORKER_TYPES = tuple(WorkerType.values)
CONNECTION_MODES = ("http", "grpc")
MODEL_TYPES = (
    "chat", "completions", "responses", "embeddings", "rerank", "generate", "vision", "tools",
    "reasoning", "image_gen", "audio", "moderation",
)
DEFAULT_MODEL_TYPES = ["chat", "completions", "responses", "tools"]
PROVIDER_HOSTS = {
    "api.openai.com": "openai",
    "api.x.ai": "xai",
    "api.anthropic.com": "anthropic",
    "generativelanguage.googleapis.com": "gemini",
}
_SCHEMES = ("http://", "https://", "grpc://", "grpcs://", "ipc://")


class SpecTypeError(ValueError):
    """A field of the wrong type or an unknown enum value (422)."""


class SpecRuleError(ValueError):
    """A value the rules refuse (400 BAD_REQUEST)."""


# --- typed readers --------------------------------------------------------------------------------

Reader = Callable[[Any, str], Any]


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise SpecTypeError(f"{name}: invalid type, expected a string")
    return value


def _unsigned(value: Any, name: str) -> int:
    if type(value) is not int or value < 0:
        raise SpecTypeError(f"{name}: invalid type, expected an unsigned integer")
    return value


def _integer(value: Any, name: str) -> int:
    if type(value) is not int:
        raise SpecTypeError(f"{name}: invalid type, expected an integer")
    return value


def _number(value: Any, name: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise SpecTypeError(f"{name}: invalid type, expected a number")
    return value


def _boolean(value: Any, name: str) -> bool:
    if type(value) is not bool:
        raise SpecTypeError(f"{name}: invalid type, expected a boolean")
    return value


def _object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecTypeError(f"{name}: invalid type, expected an object")
    return value


def _string_map(value: Any, name: str) -> dict[str, str]:
    mapping = _object(value, name)
    for key, item in mapping.items():
        _string(item, f"{name}.{key}")
    return dict(mapping)


def _list_of(reader: Reader) -> Reader:
    def read(value: Any, name: str) -> list[Any]:
        if not isinstance(value, list):
            raise SpecTypeError(f"{name}: invalid type, expected an array")
        return [reader(item, f"{name}[{i}]") for i, item in enumerate(value)]

    return read


def _enum(options: tuple[str, ...]) -> Reader:
    def read(value: Any, name: str) -> str:
        text = _string(value, name)
        if text not in options:
            raise SpecTypeError(f"{name}: unknown variant `{text}`, expected one of {', '.join(options)}")
        return text

    return read


def _runtime(value: Any, name: str) -> str:
    text = _string(value, name)
    try:
        return str(normalize_runtime_type(text))
    except ValueError:
        raise SpecTypeError(f"{name}: unknown variant `{text}`") from None


def _optional(reader: Reader) -> Reader:
    def read(value: Any, name: str) -> Any:
        return None if value is None else reader(value, name)

    return read


def _block(readers: Mapping[str, Reader]) -> Reader:
    def read(value: Any, name: str) -> dict[str, Any]:
        given = _object(value, name)
        return {key: readers[key](item, f"{name}.{key}") for key, item in given.items() if key in readers and item is not None}

    return read


_CARD_FIELDS: dict[str, Reader] = {
    "id": _string,
    "aliases": _list_of(_string),
    "model_type": _list_of(_enum(MODEL_TYPES)),
    "context_length": _unsigned,
    "chat_template": _string,
    "tool_parser": _string,
    "reasoning_parser": _string,
    "display_name": _string,
    "hf_model_type": _string,
    "architectures": _list_of(_string),
    "provider": _string,
    "tokenizer_path": _string,
    "metadata": _object,
    "id2label": _string_map,
    "num_labels": _unsigned,
}


def _model_card(value: Any, name: str) -> dict[str, Any]:
    given = _object(value, name)
    if "id" not in given or given["id"] is None:
        raise SpecTypeError(f"{name}: missing field `id`")
    card = {key: _CARD_FIELDS[key](item, f"{name}.{key}") for key, item in given.items() if key in _CARD_FIELDS and item is not None}
    card.setdefault("aliases", [])
    card.setdefault("model_type", list(DEFAULT_MODEL_TYPES))
    return card


HEALTH_FIELDS: dict[str, Reader] = {
    "timeout_secs": _unsigned,
    "check_interval_secs": _unsigned,
    "success_threshold": _unsigned,
    "failure_threshold": _unsigned,
    "disable_health_check": _boolean,
    "drain_settle_secs": _unsigned,
}
OVERLOAD_FIELDS: dict[str, Reader] = {"waiting_requests": _unsigned, "token_usage": _number}
HTTP_POOL_FIELDS: dict[str, Reader] = {
    "http2": _boolean,
    "pool_max_idle_per_host": _unsigned,
    "pool_idle_timeout_secs": _unsigned,
    "timeout_secs": _unsigned,
    "connect_timeout_secs": _unsigned,
}
RESILIENCE_FIELDS: dict[str, Reader] = {
    "cb_failure_threshold": _unsigned,
    "cb_success_threshold": _unsigned,
    "cb_timeout_secs": _unsigned,
    "cb_window_secs": _unsigned,
    "retryable_status_codes": _list_of(_unsigned),
    "capacity_status_codes": _list_of(_unsigned),
}

# Every known top-level field and how it reads (runtime is an alias of runtime_type).
_FIELDS: dict[str, Reader] = {
    "url": _string,
    "runtime_type": _runtime,
    "worker_type": _enum(WORKER_TYPES),
    "connection_mode": _enum(CONNECTION_MODES),
    "api_key": _optional(_string),
    "models": _list_of(_model_card),
    "labels": _string_map,
    "priority": _integer,
    "cost": _number,
    "dp_size": _optional(_unsigned),
    "zmq_handshake_address": _optional(_string),
    "bootstrap_port": _optional(_unsigned),
    "kv_connector": _optional(_string),
    "kv_engine_id": _optional(_string),
    "health": _block(HEALTH_FIELDS),
    "overload": _block(OVERLOAD_FIELDS),
    "http_pool": _block(HTTP_POOL_FIELDS),
    "resilience": _block(RESILIENCE_FIELDS),
}


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    url: str
    runtime_type: str = RuntimeType.UNSPECIFIED
    worker_type: str = WorkerType.REGULAR
    connection_mode: str = "http"
    api_key: str | None = field(default=None, repr=False)
    models: tuple[dict[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    priority: int = 50
    cost: float = 1.0
    dp_size: int | None = None
    zmq_handshake_address: str | None = None
    bootstrap_port: int | None = None
    kv_connector: str | None = None
    kv_engine_id: str | None = None
    health: Mapping[str, Any] = field(default_factory=dict)
    overload: Mapping[str, Any] = field(default_factory=dict)
    http_pool: Mapping[str, Any] = field(default_factory=dict)
    resilience: Mapping[str, Any] = field(default_factory=dict)

    @property
    def transport(self) -> str:
        return transport_of(self.url)

    @property
    def provider(self) -> str | None:
        return PROVIDER_HOSTS.get((urlsplit(self.url).hostname or "").lower())


def _read_fields(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise SpecTypeError("invalid type: expected a JSON object")
    values: dict[str, Any] = {}
    for key, raw in body.items():
        name = "runtime_type" if key == "runtime" else key
        if name not in _FIELDS:
            continue  # unknown fields are ignored
        if raw is None and name in ("url", "worker_type", "connection_mode", "runtime_type", "models", "labels", "priority", "cost"):
            raise SpecTypeError(f"{name}: invalid type: null")
        values[name] = _FIELDS[name](raw, name)
    return values


CREDENTIALS_REFUSED = (
    "url must not carry credentials (user:password@host); give the worker's key as api_key, which is never shown"
)


def check_url(url: str) -> str:
    """The URL rules (400): a lowercase scheme we know, a host, no credentials, and a path for
    ipc://. A URL with credentials is refused before anything could echo it (docs/DECISIONS.md D25)."""
    if not url:
        raise SpecRuleError("url must not be empty")
    if url_has_credentials(url):
        raise SpecRuleError(CREDENTIALS_REFUSED)
    if not url.startswith(_SCHEMES):
        raise SpecRuleError(
            "url must start with a lowercase http://, https://, grpc://, grpcs:// or ipc:// scheme"
        )
    if url.startswith("ipc://"):
        if len(url) <= len("ipc://") or url[len("ipc://"):].strip() == "":
            raise SpecRuleError("an ipc:// url needs a socket path")
        return url
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError:
        raise SpecRuleError(f"url is invalid: {url}") from None
    if not parts.hostname:
        raise SpecRuleError("url has no host")
    if any(ch.isspace() for ch in url):
        raise SpecRuleError(f"url is invalid: {url}")
    return url.rstrip("/")


def parse_worker_spec(body: Any) -> WorkerSpec:
    """A full spec (POST, PUT). Raises SpecTypeError (422) or SpecRuleError (400)."""
    values = _read_fields(body)
    if "url" not in values:
        raise SpecTypeError("missing field `url`")
    values["url"] = check_url(values["url"])
    if "models" in values:
        values["models"] = tuple(values["models"])
    transport = transport_of(values["url"])
    if transport is Transport.ZMQ and values.get("runtime_type", RuntimeType.UNSPECIFIED) == RuntimeType.UNSPECIFIED:
        values["runtime_type"] = RuntimeType.SGLANG
    spec = WorkerSpec(**values)
    if spec.provider is not None and spec.runtime_type in (RuntimeType.UNSPECIFIED, RuntimeType.EXTERNAL):
        spec = replace(spec, runtime_type=RuntimeType.EXTERNAL)
    return spec


def parse_worker_patch(body: Any) -> dict[str, Any]:
    """The fields a PATCH names, typed like a spec. url may be given only unchanged (checked by the
    caller); overload cannot be changed by PATCH."""
    values = _read_fields(body)
    if "url" in values:
        values["url"] = check_url(values["url"])
    if "overload" in values:
        raise SpecRuleError("PATCH cannot change the overload block; replace the worker with PUT")
    if "models" in values:
        values["models"] = tuple(values["models"])
    return values

