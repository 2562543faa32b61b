"""The worker spec (spec 3: body of POST /workers and PUT /workers/{id}): parsing and its two kinds of
failure.

- :class:`SpecTypeError`: a known field with the wrong type or an unknown enum value, an integer
  past the range of the store column that holds it, or no url. Answered 422 in plain text, before
  any other check (the spec's deserialisation failure).
- :class:`SpecRuleError`: a well-typed value the rules refuse (the URL's scheme, host or path; an
  api_key that cannot be sent as a header; overload values out of range; an unknown parser name;
  an external provider off HTTP). Answered 400 BAD_REQUEST, at the request:
  every rule the body alone decides is checked here, once all fields are typed, so no job starts
  for a spec it would refuse (docs/DECISIONS.md D49). The job checks only what needs the worker.

Each reader carries the rules of its value and their JSON Schema with its type's, so the published
OpenAPI description marks what the request is refused for (a generated client makes valid requests).

Unknown fields are ignored. Nested blocks are partial: omitted fields keep gateway defaults, which
are applied where the block is used (health checks, breakers), so a stored block holds only what
the operator said.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from django.db import models

from common.json_text import NO_NUL, storable
from administration.models import Worker
from administration.store_ranges import column_range
from common.urls import WORKER_URL_MAX_LENGTH, WorkerUrlRefused, check_worker_url
from inference.pipeline.parsers import UnknownParser, check_parser_names
from inference.pipeline.reasoning import REASONING_PARSERS
from inference.pipeline.tools import TOOL_PARSERS
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
    "URL_PATTERN",
    "check_url",
]

WORKER_TYPES = tuple(WorkerType.values)
CONNECTION_MODES = ("http", "grpc")
MODEL_TYPES = (
    "chat", "completions", "responses", "embeddings", "rerank", "generate", "vision", "tools",
    "reasoning", "image_gen", "audio", "moderation",
)
DEFAULT_MODEL_TYPES = ["chat", "completions", "responses", "tools"]


class SpecTypeError(ValueError):
    """A field of the wrong type or an unknown enum value (422)."""


class SpecRuleError(ValueError):
    """A value the rules refuse (400 BAD_REQUEST)."""


# --- typed readers --------------------------------------------------------------------------------
#
# Each reader checks one value's type (raising SpecTypeError), then, once every field is typed, its
# rules (``check``, raising SpecRuleError), and carries the JSON Schema of what it accepts: the
# published OpenAPI description of the control plane (administration/api/openapi.py) is built from
# these, so the spec's fields, types, ranges and rules are declared once.


def _no_rule(value: Any, name: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Reader:
    read: Callable[[Any, str], Any]
    schema: Mapping[str, Any]
    check: Callable[[Any, str], None] = _no_rule  # the rules of a typed value (SpecRuleError)

    def __call__(self, value: Any, name: str) -> Any:
        return self.read(value, name)


def _ruled(reader: Reader, rule: Callable[[Any, str], None], schema: Mapping[str, Any]) -> Reader:
    """``reader`` with a rule of its value, and the rule's JSON Schema over its type's."""
    return Reader(reader.read, {**reader.schema, **schema}, rule)


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


def _read_free_object(value: Any, name: str) -> dict[str, Any]:
    """A free-form object (metadata), as the store can hold it (a U+0000 in it becomes U+FFFD)."""
    return storable(_read_object(value, name))


def _read_string_map(value: Any, name: str) -> dict[str, str]:
    """Free-form strings by name (labels, id2label), as the store can hold them, like metadata."""
    mapping = _read_free_object(value, name)
    for key, item in mapping.items():
        _read_string(item, f"{name}.{key}")
    return dict(mapping)


def _no_nul(value: str, name: str) -> None:
    """A named string (an id, a name, a path) the store must hold as given: no U+0000 (Postgres
    refuses it in text), refused rather than altered."""
    if "\x00" in value:
        raise SpecRuleError(f"{name} must not contain the NUL character (\\u0000)")


_string = Reader(_read_string, {"type": "string", "pattern": NO_NUL}, _no_nul)
_number = Reader(_read_number, {"type": "number"})
_boolean = Reader(_read_boolean, {"type": "boolean"})
_object = Reader(_read_free_object, {"type": "object"})
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

    def check(value: list[Any], name: str) -> None:
        for i, item in enumerate(value):
            reader.check(item, f"{name}[{i}]")

    return Reader(read, {"type": "array", "items": dict(reader.schema)}, check)


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

    def check(value: Any, name: str) -> None:
        if value is not None:
            reader.check(value, name)

    return Reader(read, _null_allowed(reader.schema), check)


def _null_allowed(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` that also allows null (an enum names it: OpenAPI 3.0.3's reading of nullable)."""
    allowed = {**schema, "nullable": True}
    if "enum" in schema:
        allowed["enum"] = [*schema["enum"], None]
    return allowed


def _nullable(readers: Mapping[str, Reader]) -> dict[str, Any]:
    """The properties of an object whose fields may each be null (null means "not given")."""
    return {key: _null_allowed(reader.schema) for key, reader in readers.items()}


def _check_each(readers: Mapping[str, Reader], value: Mapping[str, Any], name: str) -> None:
    for key, item in value.items():
        if key in readers:
            readers[key].check(item, f"{name}.{key}")


def _block(readers: Mapping[str, Reader]) -> Reader:
    def read(value: Any, name: str) -> dict[str, Any]:
        given = _read_object(value, name)
        return {key: readers[key](item, f"{name}.{key}") for key, item in given.items() if key in readers and item is not None}

    def check(value: dict[str, Any], name: str) -> None:
        _check_each(readers, value, name)

    return Reader(read, {"type": "object", "properties": _nullable(readers)}, check)


# --- rules -----------------------------------------------------------------------------------------


def _parser_name(kind: str, names: tuple[str, ...]) -> Reader:
    """A tool-call or reasoning parser name the gateway knows (case and - / _ ignored)."""

    def check(value: str, name: str) -> None:
        try:
            check_parser_names(**{kind: value})
        except UnknownParser as unknown:
            raise SpecRuleError(f"{name}: {unknown}") from None

    return _ruled(_string, check, {"enum": list(names)})


_tool_parser = _parser_name("tool_parser", TOOL_PARSERS.names())
_reasoning_parser = _parser_name("reasoning_parser", REASONING_PARSERS.names())
_PARSER_LABELS = {"tool_parser": _tool_parser, "reasoning_parser": _reasoning_parser}


def _check_labels(value: dict[str, str], name: str) -> None:
    _check_each(_PARSER_LABELS, value, name)


# Labels are any strings; the ones naming a parser must name one the gateway has.
_labels = Reader(
    _read_string_map,
    {
        "type": "object",
        "properties": {key: dict(reader.schema) for key, reader in _PARSER_LABELS.items()},
        "additionalProperties": {"type": "string"},
    },
    _check_labels,
)

_API_KEY_LENGTH = Worker._meta.get_field("api_key").max_length or 0


def _check_api_key(value: str, name: str) -> None:
    """The key is sent to the worker as an HTTP header value (Bearer, x-api-key) or gRPC metadata:
    visible ASCII only (no space, no line break, nothing the header encoders refuse). The message
    never repeats the key."""
    if len(value) > _API_KEY_LENGTH:
        raise SpecRuleError(f"{name} is longer than {_API_KEY_LENGTH} characters")
    if not all("!" <= char <= "~" for char in value):
        raise SpecRuleError(
            f"{name} must be printable ASCII without spaces: it is sent to the worker as a header value"
        )


_api_key = _ruled(_string, _check_api_key, {"pattern": "^[!-~]*$", "maxLength": _API_KEY_LENGTH})


def _check_waiting_requests(value: int, name: str) -> None:
    if value < 1:
        raise SpecRuleError(f"{name} must be at least 1")


def _check_token_usage(value: float, name: str) -> None:
    if not 0.0 < value <= 1.0:
        raise SpecRuleError(f"{name} must be in (0.0, 1.0]")


_CARD_FIELDS: dict[str, Reader] = {
    "id": _string,
    "aliases": _list_of(_string),
    "model_type": _list_of(_enum(MODEL_TYPES)),
    "context_length": _unsigned,
    "chat_template": _string,
    "tool_parser": _tool_parser,
    "reasoning_parser": _reasoning_parser,
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


def _check_model_card(value: dict[str, Any], name: str) -> None:
    _check_each(_CARD_FIELDS, value, name)


_model_card = Reader(
    _read_model_card,
    {"type": "object", "required": ["id"], "properties": {**_nullable(_CARD_FIELDS), "id": dict(_string.schema)}},
    _check_model_card,
)

HEALTH_FIELDS: dict[str, Reader] = {
    "timeout_secs": _unsigned,
    "check_interval_secs": _unsigned,
    "success_threshold": _unsigned,
    "failure_threshold": _unsigned,
    "disable_health_check": _boolean,
    "drain_settle_secs": _unsigned,
}
OVERLOAD_FIELDS: dict[str, Reader] = {
    "waiting_requests": _ruled(_unsigned, _check_waiting_requests, {"minimum": 1}),
    "token_usage": _ruled(_number, _check_token_usage, {"minimum": 0, "exclusiveMinimum": True, "maximum": 1}),
}
HTTP_POOL_FIELDS: dict[str, Reader] = {
    # true: HTTP/2 with prior knowledge, and a worker speaking only HTTP/1.1 fails its registration job
    # (spec 3: a problem found in the job, it needs the worker; D111).
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

_H16 = "[0-9A-Fa-f]{1,4}"
_IPV6 = "|".join([
    f"(?:{_H16}:){{7}}{_H16}",
    f"(?:{_H16}:){{1,7}}:",
    *(f"(?:{_H16}:){{1,{7 - n}}}(?::{_H16}){{1,{n}}}" for n in range(1, 7)),
    f":(?:(?::{_H16}){{1,7}}|:)",
])  # without zone ids or an embedded IPv4 address
_PORT = "6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}"
URL_PATTERN = (
    rf"^(?:(?:https?|grpcs?)://(?:\[(?:{_IPV6})\]|[A-Za-z0-9._~!$&'()*+,;=%-]+)(?::(?:{_PORT}))?(?:[/?#][!-~]*)?"
    r"|ipc://[!-~]+)$"
)
"""What :func:`check_url` accepts, as a regular expression (a subset of it: printable ASCII, no IPv6
zone), published in the OpenAPI description so a generated client sends URLs the gateway takes."""

_url = Reader(_read_string, {"type": "string", "minLength": 1, "maxLength": WORKER_URL_MAX_LENGTH, "pattern": URL_PATTERN})

# Every known top-level field and how it reads (runtime is an alias of runtime_type).
_FIELDS: dict[str, Reader] = {
    "url": _url,
    "runtime_type": _runtime,
    "worker_type": _enum(WORKER_TYPES),
    "connection_mode": _enum(CONNECTION_MODES),
    "api_key": _optional(_api_key),
    "models": _list_of(_model_card),
    "labels": _labels,
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
# What a PATCH changes (spec 3): any other field of its body (url, overload, http_pool, resilience,
# models, ...) is ignored, neither typed nor applied; PUT replaces those.
PATCH_FIELDS = ("priority", "cost", "labels", "api_key", "health")


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
    if fields is None:
        schema["anyOf"] = _EXTERNAL_OVER_HTTP
    return schema


# The rule between fields of a full spec (parse_worker_spec), as JSON Schema: the URL is http(s), or
# neither spelling of the runtime names an external provider.
_EXTERNAL_OVER_HTTP = [
    {"properties": {"url": {"pattern": "^https?://"}}},
    {"properties": {name: {"enum": [runtime for runtime in RUNTIME_NAMES if runtime != RuntimeType.EXTERNAL]}
                    for name in ("runtime_type", "runtime")}},
]


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
    """Every known field typed (SpecTypeError), before any rule is looked at."""
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


def _check_rules(values: Mapping[str, Any]) -> None:
    """The rules of every typed field (SpecRuleError); the url's are :func:`check_url`'s."""
    for name, value in values.items():
        if name != "url":
            _FIELDS[name].check(value, name)


def check_url(url: str) -> str:
    """The URL rules (common/urls.py, shared with --worker-urls) as the spec's 400."""
    try:
        return check_worker_url(url)
    except WorkerUrlRefused as refused:
        raise SpecRuleError(str(refused)) from None


def parse_worker_spec(body: Any) -> WorkerSpec:
    """A full spec (POST, PUT, the console, add_worker, --worker-urls). Raises SpecTypeError (422) or
    SpecRuleError (400)."""
    values = _read_fields(body)
    if "url" not in values:
        raise SpecTypeError("missing field `url`")
    values["url"] = check_url(values["url"])
    _check_rules(values)
    if "models" in values:
        values["models"] = tuple(values["models"])
    transport = transport_of(values["url"])
    if transport is Transport.ZMQ and values.get("runtime_type", RuntimeType.UNSPECIFIED) == RuntimeType.UNSPECIFIED:
        values["runtime_type"] = RuntimeType.SGLANG
    spec = WorkerSpec(**values)
    if spec.provider is not None and spec.runtime_type in (RuntimeType.UNSPECIFIED, RuntimeType.EXTERNAL):
        spec = replace(spec, runtime_type=RuntimeType.EXTERNAL)
    if spec.runtime_type == RuntimeType.EXTERNAL and spec.transport is not Transport.HTTP:
        raise SpecRuleError("an external provider is reached over http:// or https://")
    return spec


def parse_worker_patch(body: Any) -> dict[str, Any]:
    """The fields a PATCH changes (PATCH_FIELDS), typed and checked like a spec's (422, 400); every
    other field of the body is ignored, as spec 3 says (use PUT to change those)."""
    if isinstance(body, dict):
        body = {name: raw for name, raw in body.items() if name in PATCH_FIELDS}
    values = _read_fields(body)
    _check_rules(values)
    return values

