"""The worker spec (spec 3: body of POST /workers and PUT /workers/{id}): parsing and its two kinds of
failure.

- :class:`SpecTypeError`: a known field with the wrong type or an unknown enum value, an integer
  past the range of the store column that holds it, or no url. Answered 422 in plain text, before
  any other check (the spec's deserialisation failure).
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

from django.db import models

from administration.models import Worker
from administration.store_ranges import column_range
from common.urls import url_has_credentials
from inference.routing.workers import (
    RUNTIME_NAMES,
    RuntimeType,
    Transport,
    WorkerType,
    normalize_runtime_type,
    provider_of,
    transport_of,
)

__all__ = [
    "WorkerSpec",
    "SpecTypeError",
    "SpecRuleError",
    "parse_worker_spec",
    "parse_worker_patch",
    "transport_of",
    "MODEL_TYPES",
    "PATCH_FIELDS",
    "spec_schema",
]

WORKER_TYPES = tuple(WorkerType.values)
CONNECTION_MODES = ("http", "grpc")
MODEL_TYPES = (
    "chat", "completions", "responses", "embeddings", "rerank", "generate", "vision", "tools",
    "reasoning", "image_gen", "audio", "moderation",
)
DEFAULT_MODEL_TYPES = ["chat", "completions", "responses", "tools"]
_SCHEMES = ("http://", "https://", "grpc://", "grpcs://", "ipc://")


class SpecTypeError(ValueError):
    """A field of the wrong type or an unknown enum value (422)."""


class SpecRuleError(ValueError):
    """A value the rules refuse (400 BAD_REQUEST)."""


# --- typed readers --------------------------------------------------------------------------------
#
# Each reader checks one value (raising SpecTypeError) and carries the JSON Schema of what it accepts:
# the published OpenAPI description of the control plane (administration/api/openapi.py) is built
# from these, so the spec's fields, types and ranges are declared once.


@dataclass(frozen=True, slots=True)
class Reader:
    read: Callable[[Any, str], Any]
    schema: Mapping[str, Any]

    def __call__(self, value: Any, name: str) -> Any:
        return self.read(value, name)


def _read_string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise SpecTypeError(f"{name}: invalid type, expected a string")
    return value


def _integer_in(low: int, high: int, kind: str) -> Reader:
    """An integer from ``low`` to ``high``: the range of the store column that holds it, so no value
    can overflow the store (a value past it is the spec's 422, like a wrong type)."""

    def read(value: Any, name: str) -> int:
        if type(value) is not int or (low == 0 and value < 0):
            raise SpecTypeError(f"{name}: invalid type, expected {kind}")
        if not low <= value <= high:
            raise SpecTypeError(f"{name}: invalid value {value}, expected {kind} from {low} to {high}")
        return value

    return Reader(read, {"type": "integer", "minimum": low, "maximum": high})


def _read_number(value: Any, name: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise SpecTypeError(f"{name}: invalid type, expected a number")
    return value


def _read_boolean(value: Any, name: str) -> bool:
    if type(value) is not bool:
        raise SpecTypeError(f"{name}: invalid type, expected a boolean")
    return value


def _read_object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecTypeError(f"{name}: invalid type, expected an object")
    return value


def _read_string_map(value: Any, name: str) -> dict[str, str]:
    mapping = _read_object(value, name)
    for key, item in mapping.items():
        _read_string(item, f"{name}.{key}")
    return dict(mapping)


_string = Reader(_read_string, {"type": "string"})
_number = Reader(_read_number, {"type": "number"})
_boolean = Reader(_read_boolean, {"type": "boolean"})
_object = Reader(_read_object, {"type": "object"})
_string_map = Reader(_read_string_map, {"type": "object", "additionalProperties": {"type": "string"}})
# priority has a column of its own; the other integers live in the JSON settings column and get the
# range of an unsigned integer column, so each could move to a column and every consumer (timers,
# pools, counters) reads a value it can hold.
_integer = _integer_in(*column_range(Worker._meta.get_field("priority")), "an integer")
_unsigned = _integer_in(*column_range(models.PositiveIntegerField()), "an unsigned integer")


def _list_of(reader: Reader) -> Reader:
    def read(value: Any, name: str) -> list[Any]:
        if not isinstance(value, list):
            raise SpecTypeError(f"{name}: invalid type, expected an array")
        return [reader(item, f"{name}[{i}]") for i, item in enumerate(value)]

    return Reader(read, {"type": "array", "items": dict(reader.schema)})


def _enum(options: tuple[str, ...]) -> Reader:
    def read(value: Any, name: str) -> str:
        text = _read_string(value, name)
        if text not in options:
            raise SpecTypeError(f"{name}: unknown variant `{text}`, expected one of {', '.join(options)}")
        return text

    return Reader(read, {"type": "string", "enum": list(options)})


def _read_runtime(value: Any, name: str) -> str:
    text = _read_string(value, name)
    try:
        return str(normalize_runtime_type(text))
    except ValueError:
        raise SpecTypeError(f"{name}: unknown variant `{text}`") from None


_runtime = Reader(_read_runtime, {"type": "string", "enum": list(RUNTIME_NAMES)})


def _optional(reader: Reader) -> Reader:
    def read(value: Any, name: str) -> Any:
        return None if value is None else reader(value, name)

    return Reader(read, {**reader.schema, "nullable": True})


def _nullable(readers: Mapping[str, Reader]) -> dict[str, Any]:
    """The properties of an object whose fields may each be null (null means "not given")."""
    return {key: {**reader.schema, "nullable": True} for key, reader in readers.items()}


def _block(readers: Mapping[str, Reader]) -> Reader:
    def read(value: Any, name: str) -> dict[str, Any]:
        given = _read_object(value, name)
        return {key: readers[key](item, f"{name}.{key}") for key, item in given.items() if key in readers and item is not None}

    return Reader(read, {"type": "object", "properties": _nullable(readers)})


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


def _read_model_card(value: Any, name: str) -> dict[str, Any]:
    given = _read_object(value, name)
    if "id" not in given or given["id"] is None:
        raise SpecTypeError(f"{name}: missing field `id`")
    card = {key: _CARD_FIELDS[key](item, f"{name}.{key}") for key, item in given.items() if key in _CARD_FIELDS and item is not None}
    card.setdefault("aliases", [])
    card.setdefault("model_type", list(DEFAULT_MODEL_TYPES))
    return card


_model_card = Reader(
    _read_model_card,
    {"type": "object", "required": ["id"], "properties": {**_nullable(_CARD_FIELDS), "id": dict(_string.schema)}},
)

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
# What a PATCH body may name: every field but the overload block, which PATCH refuses.
PATCH_FIELDS = tuple(name for name in _FIELDS if name != "overload")


def spec_schema(fields: tuple[str, ...] | None = None, required: tuple[str, ...] = ("url",)) -> dict[str, Any]:
    """The JSON Schema (OpenAPI 3.0 dialect) of a spec body, or of the named fields of one: what
    :func:`parse_worker_spec` accepts, from the same readers."""
    names = fields or tuple(_FIELDS)
    properties = {name: dict(_FIELDS[name].schema) for name in names}
    if "runtime_type" in properties:
        properties["runtime"] = properties["runtime_type"]  # the alias
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


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
        return provider_of(self.url)


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

