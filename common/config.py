"""The gateway's runtime flags, each also read from an environment variable.

One table (:data:`FLAGS`) declares every flag: its option, its environment variable (``GW_`` plus the
field name in capitals unless given), how one value parses, and its help. Defaults live on
:class:`GatewayConfig`. Precedence: command line, then environment, then default.

``rungateway`` parses argv into a :class:`GatewayConfig`, installs it for this process and exports it
as ``GW_CONFIG`` so a server started in another process (``uvicorn gateway_project.asgi:application``,
``manage.py runserver``) sees the same values. Without ``GW_CONFIG`` the flags' environment variables
apply.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

import orjson

from common.ssrf import parse_allowed_host
from common.urls import WorkerUrlRefused, check_worker_url, url_has_credentials

__all__ = [
    "GatewayConfig",
    "ConfigError",
    "Flag",
    "FLAGS",
    "POLICIES",
    "SERVERS",
    "HISTORY_BACKENDS",
    "BUDGET_PERIODS",
    "add_gateway_arguments",
    "config_from_namespace",
    "parse_gateway_args",
    "current_config",
    "install_config",
]

POLICIES = ("round_robin", "random", "power_of_two", "least_load", "cache_aware", "consistent_hashing", "manual")
SERVERS = ("uvicorn", "daphne")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
CONTROL_PLANE_ROLES = ("admin", "user")
HISTORY_BACKENDS = ("db", "memory", "none")
BUDGET_PERIODS = ("day", "month")  # a token budget's period: the UTC day or the calendar month (UTC)
# --backend: what the --worker-urls are. An engine name skips runtime detection; a provider name
# makes them external providers (their models read from the provider, only their own keys sent).
ENGINE_BACKENDS = ("sglang", "vllm", "trtllm", "mlx", "tokenspeed")
PROVIDER_BACKENDS = ("openai", "anthropic", "gemini", "xai")
BACKENDS = ("auto", *ENGINE_BACKENDS, *PROVIDER_BACKENDS)
GRPC_STREAM_READERS = ("native", "grpcio")
DISCOVERY_PROVIDERS = ("kubernetes", "file")
DEFAULT_MAX_PAYLOAD = 512 * 1024 * 1024


class ConfigError(ValueError):
    """A flag or environment value that does not parse."""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    # Listener and server
    host: str = "0.0.0.0"
    port: int = 30000
    server: str = "uvicorn"
    log_level: str = "info"
    workers: int = 1  # serving processes; more than 1: a supervisor runs them on the one port
    shutdown_grace_period_secs: float = 180.0  # in-flight requests and streams may finish this long
    # TLS (common/tls.py, D75): the listener's certificate, and what the gateway shows and trusts towards
    # https:// and grpcs:// workers; every file is reread when it changes
    tls_cert_path: str | None = None  # the listener's certificate chain (PEM); with --tls-key-path: HTTPS
    tls_key_path: str | None = None  # its private key (PEM)
    client_cert_path: str | None = None  # the client certificate chain shown to workers (mTLS)
    client_key_path: str | None = None  # its private key
    ca_cert_paths: tuple[str, ...] = ()  # CA bundles trusted for workers, besides the public roots
    # Request receipt (administration/receipt.py): what a client may make a serving process hold
    max_request_head_bytes: int = 64 * 1024  # request target plus header lines (Envoy: 60 KiB)
    max_request_headers: int = 100  # header fields per request (Envoy's default)
    request_head_timeout_secs: float = 30.0  # a whole head must arrive in this long (Kestrel: 30 s)
    request_body_timeout_secs: float = 30.0  # longest gap inside a body, and the rate rule's grace
    min_request_body_rate: int = 1024  # bytes/s a body must average after its grace; 0: no rate rule
    # Workers and models
    worker_urls: tuple[str, ...] = ()
    backend: str = "auto"  # what the --worker-urls are (BACKENDS): auto-detected, an engine, or a provider
    # Prefill/decode disaggregation: --prefill URL [BOOTSTRAP_PORT] and --decode URL workers
    pd_disaggregation: bool = False
    prefill_urls: tuple[tuple[str, int | None], ...] = ()
    decode_urls: tuple[str, ...] = ()
    # How Generate streams of grpc:// workers are read: on the event loop (native, D44) or by grpc.aio
    grpc_stream_reader: str = "native"
    grpc_stream_window_bytes: int = 1 << 20  # native reader: what one engine stream may have unread
    model_aliases: tuple[tuple[str, str], ...] = ()
    worker_startup_check_interval: float = 30.0
    worker_startup_timeout_secs: float = 1800.0
    # Worker discovery (administration/pod_discovery.py, file_discovery.py; D73): the reference's flags
    service_discovery: bool = False  # the older spelling of --discovery-provider kubernetes
    discovery_provider: str | None = None  # kubernetes or file; None: no discovery
    discovery_file: str | None = None  # the file provider's manifest of workers
    selector: tuple[tuple[str, str], ...] = ()  # pod labels that must all match (key, value)
    prefill_selector: tuple[tuple[str, str], ...] = ()  # PD: pods matching these are prefill workers
    decode_selector: tuple[tuple[str, str], ...] = ()  # PD: pods matching these are decode workers
    service_discovery_port: int = 80  # the worker's port on a discovered pod's IP
    service_discovery_namespace: str | None = None  # None: pods of every namespace
    model_id_from: str | None = None  # namespace, label:<key> or annotation:<key>: the worker's model id
    discovery_check_interval_secs: float = 30.0  # file provider: how often the manifest is reread
    # Tokenizers (gRPC workers: the gateway renders, tokenizes and detokenizes)
    model_path: str | None = None  # hub id or local path: the tokenizer when no --tokenizer-path
    tokenizer_path: str | None = None  # hub id, local directory or tokenizer.json, or grpc://worker
    chat_template: str | None = None  # a template file or the template text, over the model's own
    disable_tokenizer_autoload: bool = False  # only registered or configured tokenizers are used
    tokenizer_cache_l0_max_bytes: int = 64 * 1024 * 1024  # whole prompts encoded before (0: off)
    tokenizer_cache_l1_max_bytes: int = 64 * 1024 * 1024  # prompt prefixes up to a special token (0: off)
    tool_call_parser: str | None = None  # gRPC workers' tool-call parser when card and labels name none
    reasoning_parser: str | None = None  # gRPC workers' reasoning parser when card and labels name none
    # Client authentication
    api_key: str | None = field(default=None, repr=False)
    tenant_api_keys: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # Control-plane authentication: (id, name, role, key)
    control_plane_api_keys: tuple[tuple[str, str, str, str], ...] = field(default=(), repr=False)
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_jwks_uri: str | None = None
    jwt_role_claim: str = "role"
    # Routing
    policy: str = "round_robin"
    dp_aware: bool = False  # data-parallel aware routing (a rank per request); refuses ZMQ dp_size above 1
    prefill_policy: str | None = None  # PD: the prefill side's policy (default: --policy)
    decode_policy: str | None = None  # PD: the decode side's policy (default: --policy)
    pd_admission_wait_secs: float = 30.0  # PD: how long a request waits for an overloaded pair to be freed
    model_policies: tuple[tuple[str, str], ...] = ()
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_secs: float = 120.0
    max_tree_size: int = 2**26
    # Requests
    request_timeout_secs: float = 1800.0
    # How long an idle upstream keep-alive connection is reused (0: until the worker closes it); under
    # the 5 s after which engines' HTTP servers (uvicorn) close idle connections. Workers' http_pool
    # blocks override it (pool_idle_timeout_secs).
    upstream_pool_idle_timeout_secs: float = 3.0
    # Registration probes an http:// worker whose http_pool.http2 is unset for HTTP/2 with prior
    # knowledge and uses it when it answers (spec 3; D111); off: HTTP/1.1 unless the block says true.
    upstream_http2: bool = False
    max_payload_size: int = DEFAULT_MAX_PAYLOAD
    max_buffered_request_bytes: int = 16 * 1024 * 1024
    # The most of an upstream answer held for one request where it must be read whole (a provider's
    # Responses event or object; a relayed answer is held up to 256 KiB, then relayed through): D53.
    max_buffered_response_bytes: int = 4 * 1024 * 1024
    max_worker_answer_bytes: int = 16 * 1024 * 1024  # health and load answers read into memory
    # Health checks (defaults of every worker's health block)
    health_check_timeout_secs: float = 5.0
    health_check_interval_secs: float = 60.0
    health_success_threshold: int = 2
    health_failure_threshold: int = 3
    disable_health_check: bool = False
    health_check_endpoint: str = "/health"
    drain_settle_secs: float = 5.0
    # Circuit breaker (defaults of every worker's resilience block)
    cb_failure_threshold: int = 10
    cb_success_threshold: int = 3
    cb_timeout_duration_secs: float = 60.0
    cb_window_duration_secs: float = 120.0
    disable_circuit_breaker: bool = False
    # Retries
    retry_max_retries: int = 5
    retry_initial_backoff_ms: int = 50
    retry_max_backoff_ms: int = 30000
    retry_backoff_multiplier: float = 1.5
    retry_jitter_factor: float = 0.2
    disable_retries: bool = False
    # Admission and traffic control (0 means no limit)
    max_concurrent_requests: int = 0
    queue_size: int = 100
    queue_timeout_secs: float = 60.0
    multimodal_max_inflight_bytes: int = 0
    multimodal_max_image_pixels: int = 8192 * 8192  # an EPD image's width x height (0: no limit)
    default_tenant_rate_limit: int = 0  # requests per minute per tenant key
    tenant_rate_limits: tuple[tuple[str, str], ...] = ()  # (tenant_id, requests per minute)
    default_tenant_budget: str = "0/day"  # TOKENS/day|month per tenant key (0: no budget)
    tenant_budgets: tuple[tuple[str, str], ...] = ()  # (tenant_id, TOKENS/day|month)
    # Load monitor and worker overload protection
    load_monitor_interval: float = 10.0
    worker_overload_protection: bool = False
    worker_overload_waiting_requests: int = 0  # 0: not used unless a worker's overload block sets it
    worker_overload_token_usage: float = 0.9
    # Observability
    prometheus_host: str = "0.0.0.0"
    prometheus_port: int = 29000
    prometheus_duration_buckets: tuple[float, ...] = ()
    usage_metrics_tenant_label: bool = False  # gw_usage_tokens_total by tenant too (cardinality: off by default)
    enable_trace: bool = False  # OpenTelemetry spans per inference request (common/tracing.py, D74)
    otlp_traces_endpoint: str | None = None  # OTLP/gRPC collector host:port; None: OTEL_EXPORTER_OTLP_* or localhost:4317
    health_check_port: int = 0  # 0: probes only on the main listener
    # Outbound URLs a caller can influence (common/ssrf.py): MCP servers now, external providers later
    ssrf_allow_loopback: bool = False  # let them reach 127.0.0.0/8 and ::1
    ssrf_allow_private: bool = False  # let them reach RFC 1918, fc00::/7 and CGNAT 100.64/10
    ssrf_allowed_hosts: tuple[str, ...] = ()  # names, *.suffix patterns, addresses, CIDR networks
    # MCP client (inference/mcp/): servers for built-in tools, and what one server may make us hold
    mcp_config_path: str | None = None  # JSON file naming the MCP servers behind built-in tools
    mcp_connect_timeout_secs: float = 10.0  # connect, handshake and tool listing of one server
    mcp_tool_timeout_secs: float = 60.0  # one tool call
    mcp_max_response_bytes: int = 8 * 1024 * 1024  # one HTTP answer (or SSE event) of an MCP server
    mcp_max_tool_output_bytes: int = 1024 * 1024  # a tool result's text kept (longer: truncated)
    mcp_max_tools: int = 256  # tools one server may list (more: the listing fails)
    mcp_max_open_sessions: int = 512  # MCP sessions open at once in this process
    # Responses and conversations storage (responses_api/storage)
    history_backend: str = "db"  # db (the Django store), memory (this process, bounded) or none
    history_memory_max_entries: int = 10000  # memory backend: responses + conversations + items kept
    history_retention_days: int = 30  # manage.py purge_history deletes records idle longer (0: keep)
    max_background_responses: int = 1024  # background Responses runs at once per process (0: none)
    # Usage accounting (administration/usage_flush.py, D67): each process's sums written this often
    usage_flush_interval_secs: float = 5.0
    request_log_max_rows: int = 100_000  # the request log keeps the newest this many rows (0: no log)
    request_log_retention_days: int = 30  # and none older than this (0: kept until the row cap)
    usage_max_range_days: int = 366  # GET /usage and the usage console read at most this many days at once (D71)
    # Not flags: set by share() in each serving process of a supervised gateway
    media_request_limit: int = 0  # the whole gateway's media budget: the most one request may hold (0: the budget)
    rate_limit_share: int = 1  # tenant limits (flags and console rows) are divided by it, rounded up

    @property
    def discovery(self) -> bool:
        """Whether workers are discovered (--discovery-provider or --service-discovery)."""
        return bool(self.discovery_provider or self.service_discovery)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_key or self.tenant_api_keys)

    @property
    def control_plane_auth_enabled(self) -> bool:
        return bool(self.control_plane_api_keys or (self.jwt_issuer and self.jwt_audience))

    def share(self, index: int, count: int, shared_rate_counts: bool) -> GatewayConfig:
        """The limits serving process ``index`` of ``count`` enforces, so that together they keep the
        gateway's: concurrency permits, queue places and media bytes are split as evenly as whole
        numbers allow (the first processes take the remainder; a process gets at least one permit
        and one byte of a limit that is on; a request's media may use the whole budget while its
        process holds no other). A tenant's requests per minute stay whole when the
        processes count them together (``shared_rate_counts``: Redis); counted in each process, each
        gets its share rounded up, so the gateway admits at most limit + count - 1 a minute.
        """
        if count <= 1:
            return self

        def split(total: int, floor: int) -> int:
            if total <= 0:
                return total
            return max(floor, total // count + (1 if index < total % count else 0))

        return replace(
            self,
            max_concurrent_requests=split(self.max_concurrent_requests, 1),
            queue_size=split(self.queue_size, 0),
            multimodal_max_inflight_bytes=split(self.multimodal_max_inflight_bytes, 1),
            media_request_limit=self.multimodal_max_inflight_bytes,
            rate_limit_share=1 if shared_rate_counts else count,
        )

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_json(cls, raw: str) -> GatewayConfig:
        data: dict[str, Any] = orjson.loads(raw)
        for f in fields(cls):
            if isinstance(data.get(f.name), list):
                data[f.name] = tuple(tuple(item) if isinstance(item, list) else item for item in data[f.name])
        return cls(**data)


# --- value parsers (argparse types) ---------------------------------------------------------------


def _number(cast: Callable[[str], Any], what: str, low: float, high: float | None = None) -> Callable[[str], Any]:
    """``cast(text)`` within [low, high] (low exclusive when it is 0)."""

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
_count = _number(int, "an integer", -0.5)  # 0 or more
_non_negative_float = _number(float, "a number", -1e-12)
_port = _number(int, "a port number", 1, 65535)
_fraction = _number(float, "a number", -1e-12, 1.0)


def usable_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use, at least 1: its CPU affinity, narrowed by a cgroup CPU quota
    (a container's CPU limit, which affinity does not show: a 2-CPU pod on a 64-core node is 2)."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = max(1, os.cpu_count() or 1)
    quota = cgroup_cpu_quota(cgroup_root)
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def cgroup_cpu_quota(root: Path) -> float | None:
    """CPUs allowed by the cgroup's quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), None without one."""
    try:
        fields = (root / "cpu.max").read_text().split()
        if len(fields) == 2 and fields[0] != "max":
            return int(fields[0]) / int(fields[1])
        return None
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def _workers(text: str) -> int:
    """A number of serving processes, or ``auto``: one per usable core."""
    if text.strip().lower() == "auto":
        return usable_cores()
    return int(_number(int, "an integer or auto", 1, 1024)(text))


def _choice(options: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise argparse.ArgumentTypeError(f"invalid choice {text!r} (choose from {', '.join(options)})")
        return text

    return parse


def _text(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _path(text: str) -> str:
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"must start with '/', got {text!r}")
    return text


def _digits(text: str) -> str:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return text


def _budget(text: str) -> str:
    """A token budget, ``TOKENS/day`` or ``TOKENS/month`` (inference/admission/budgets.py reads it)."""
    tokens, sep, period = text.partition("/")
    if not sep or not tokens.isdigit() or period not in BUDGET_PERIODS:
        raise argparse.ArgumentTypeError(f"expected TOKENS/day or TOKENS/month, got {text!r}")
    return f"{int(tokens)}/{period}"


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _worker_url(text: str) -> str:
    """A --worker-urls entry: the worker URL rules of every entry point (common/urls.py)."""
    if url_has_credentials(text):
        raise argparse.ArgumentTypeError(
            "a worker URL must not carry credentials (user:password@host); give the key with --api-key"
        )
    try:
        return check_worker_url(text)
    except WorkerUrlRefused as refused:
        raise argparse.ArgumentTypeError(f"{refused}, got {text!r}") from None


def _issuer_url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"must be an http(s) URL, got {text!r}")
    return text.rstrip("/")


def _allowed_host(text: str) -> str:
    try:
        return parse_allowed_host(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _pair(separator: str, what: str, right: Callable[[str], str] = _text) -> Callable[[str], tuple[str, str]]:
    def parse(text: str) -> tuple[str, str]:
        left, sep, rest = text.partition(separator)
        if not sep or not left or not rest:
            raise argparse.ArgumentTypeError(f"expected {what}, got a malformed value")
        return (left, right(rest))

    return parse


def _prefill_worker(text: str) -> tuple[str, int | None]:
    """A --prefill entry, ``URL [BOOTSTRAP_PORT]``: the worker URL and, optionally, its KV bootstrap port."""
    values = text.split()
    if not 1 <= len(values) <= 2:
        raise argparse.ArgumentTypeError("expected --prefill URL [BOOTSTRAP_PORT]")
    url = _worker_url(values[0])
    if len(values) == 1 or values[1].lower() in ("none", "null", ""):
        return (url, None)
    try:
        port = int(values[1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"bootstrap port must be a number, got {values[1]!r}") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"bootstrap port must be between 1 and 65535, got {port}")
    return (url, port)


def _model_id_from(text: str) -> str:
    """A --model-id-from value: ``namespace``, ``label:<key>`` or ``annotation:<key>``."""
    if text == "namespace":
        return text
    source, sep, key = text.partition(":")
    if not sep or source not in ("label", "annotation") or not key:
        raise argparse.ArgumentTypeError(f"expected namespace, label:<key> or annotation:<key>, got {text!r}")
    return text


def _control_plane_key(text: str) -> tuple[str, str, str, str]:
    parts = text.split(":", 3)
    if len(parts) != 4 or not all(parts):
        raise argparse.ArgumentTypeError("expected id:name:role:key, got a malformed value")
    key_id, name, role, key = parts
    if role not in CONTROL_PLANE_ROLES:
        raise argparse.ArgumentTypeError(f"role must be one of {', '.join(CONTROL_PLANE_ROLES)}, got {role!r}")
    return (key_id, name, role, key)


# --- the flag table -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag. ``kind``: "value" (one value), "list" (``--flag A B``), "append" (repeatable),
    "extend" (``--flag A B``, repeatable), "switch" (``--flag`` alone means true)."""

    field: str
    parse: Callable[[str], Any]
    help: str
    kind: str = "value"
    option: str | None = None
    env: str | None = None
    metavar: str | None = None

    @property
    def option_name(self) -> str:
        return self.option or "--" + self.field.replace("_", "-")

    @property
    def env_name(self) -> str:
        return self.env or "GW_" + self.field.upper()


FLAGS: tuple[Flag, ...] = (
    Flag("host", _text, "listen address"),
    Flag("port", _port, "listen port"),
    Flag("server", _choice(SERVERS), "ASGI server: uvicorn (uvloop + httptools) or daphne"),
    Flag("log_level", _choice(LOG_LEVELS), "log level"),
    Flag("workers", _workers, "serving processes on the one port (auto: one per usable core); above 1 the "
         "command supervises them", metavar="N|auto"),
    Flag("tls_cert_path", _text, "serve HTTPS with this certificate chain (PEM; with --tls-key-path); reread "
         "when the file changes"),
    Flag("tls_key_path", _text, "the private key of --tls-cert-path (PEM)"),
    Flag("client_cert_path", _text, "client certificate chain (PEM) shown to https:// and grpcs:// workers (mTLS; "
         "with --client-key-path); reread when the file changes"),
    Flag("client_key_path", _text, "the private key of --client-cert-path (PEM)"),
    Flag("ca_cert_paths", _text, "CA bundle(s) (PEM) trusted for https:// and grpcs:// workers besides the public "
         "roots; repeatable", kind="extend", metavar="PATH"),
    Flag("shutdown_grace_period_secs", _non_negative_float,
         "on SIGTERM, how long requests and streams in flight may take to finish"),
    Flag("max_request_head_bytes", _positive_int,
         "largest request head (target plus header lines, bytes; larger: 431 and the connection closed)"),
    Flag("max_request_headers", _positive_int, "most header fields in a request (more: 431 and a close)"),
    Flag("request_head_timeout_secs", _positive_float,
         "a request head must arrive within this long of its first byte or of the connection (else 408, close)"),
    Flag("request_body_timeout_secs", _positive_float,
         "longest pause inside a request body, and the grace before --min-request-body-rate applies"),
    Flag("min_request_body_rate", _count,
         "bytes per second a request body must average after its grace (0: no rate rule)"),
    Flag("worker_urls", _worker_url,
         "worker URLs: HTTP (http://, https://), gRPC engines (grpc://, grpcs://) or ZMQ engines (ipc://PATH)",
         kind="list", metavar="URL"),
    Flag("pd_disaggregation", _bool, "prefill/decode disaggregation: route through --prefill and --decode workers",
         kind="switch"),
    Flag("prefill_urls", _prefill_worker, "a prefill worker and its KV bootstrap port (PD), repeatable",
         kind="append_args", option="--prefill", metavar="URL [BOOTSTRAP_PORT]"),
    Flag("decode_urls", _worker_url, "a decode worker (PD), repeatable", kind="append", option="--decode",
         metavar="URL"),
    Flag("backend", _choice(BACKENDS),
         "what --worker-urls are: auto (detected), an engine (sglang, vllm, trtllm, mlx, tokenspeed) or an "
         "external OpenAI-compatible provider (openai, anthropic, gemini, xai: its models read from it)"),
    Flag("grpc_stream_reader", _choice(GRPC_STREAM_READERS),
         "how gRPC generation streams of grpc:// workers are read: native (HTTP/2 on the event loop) or grpcio "
         "(grpc.aio, as grpcs:// workers and every control call always are)"),
    Flag("grpc_stream_window_bytes", _count,
         "native reader: bytes of one generation stream the engine may send ahead of what the gateway has "
         "taken (HTTP/2 stream window; 65535 to 2147483647)"),
    Flag("model_aliases", _pair("=", "alias=model"), "model alias, repeatable", kind="append",
         option="--model-alias", metavar="ALIAS=MODEL"),
    Flag("worker_startup_check_interval", _positive_float,
         "longest pause between discovery attempts of a worker that is not up yet (seconds)"),
    Flag("worker_startup_timeout_secs", _positive_float, "give up registering a worker after this long"),
    Flag("service_discovery", _bool, "discover workers as Kubernetes pods (the same as --discovery-provider "
         "kubernetes)", kind="switch"),
    Flag("discovery_provider", _choice(DISCOVERY_PROVIDERS), "discover workers: kubernetes (pods matching "
         "--selector, Running and Ready) or file (the --discovery-file manifest)"),
    Flag("discovery_file", _text, "file provider: JSON manifest of workers, reread when it changes"),
    Flag("selector", _pair("=", "key=value"), "discovery: pod labels that must all match", kind="list",
         metavar="KEY=VALUE"),
    Flag("prefill_selector", _pair("=", "key=value"), "discovery with --pd-disaggregation: pod labels of prefill "
         "workers", kind="list", metavar="KEY=VALUE"),
    Flag("decode_selector", _pair("=", "key=value"), "discovery with --pd-disaggregation: pod labels of decode "
         "workers", kind="list", metavar="KEY=VALUE"),
    Flag("service_discovery_port", _port, "discovery: the workers' port on their pod IP"),
    Flag("service_discovery_namespace", _text, "discovery: the namespace whose pods are watched (default: all)"),
    Flag("model_id_from", _model_id_from, "discovery: a pod's model id from its namespace, a label or an "
         "annotation (the engine's own model name stays an alias)", metavar="namespace|label:KEY|annotation:KEY"),
    Flag("discovery_check_interval_secs", _positive_float, "file provider: seconds between rereads of the manifest"),
    Flag("model_path", _text, "model hub id or local path whose tokenizer serves gRPC workers "
         "(after a worker's tokenizer_path/model_path labels)"),
    Flag("tokenizer_path", _text, "tokenizer location over --model-path: a local directory or tokenizer.json, a hub "
         "id, or grpc://worker (its GetTokenizer)"),
    Flag("chat_template", _text, "chat template file (or template text) used over the model's own"),
    Flag("disable_tokenizer_autoload", _bool, "never load a tokenizer that is not registered or configured: "
         "a model without one answers 500 tokenizer_not_found", kind="switch"),
    Flag("tokenizer_cache_l0_max_bytes", _count,
         "bytes of whole prompts' token ids kept for prompts seen again (0: no L0 cache)"),
    Flag("tokenizer_cache_l1_max_bytes", _count,
         "bytes of prompt prefixes' token ids kept, cut after a special token (0: no L1 cache)"),
    Flag("tool_call_parser", _text, "tool-call parser of gRPC workers whose model card and labels name none "
         "(qwen, llama, mistral, deepseek_r1, kimik2, glm45, pythonic, ...; unknown: the gateway does not start)"),
    Flag("reasoning_parser", _text, "reasoning parser of gRPC workers whose model card and labels name none "
         "(qwen3, deepseek_r1, ...; unknown: the gateway does not start)"),
    Flag("api_key", _text, "shared client API key (Bearer)"),
    Flag("tenant_api_keys", _pair(":", "tenant_id:key"), "per-tenant API key, repeatable", kind="append",
         option="--tenant-api-key", metavar="TENANT:KEY"),
    Flag("control_plane_api_keys", _control_plane_key, "control-plane API keys", kind="list",
         metavar="ID:NAME:ROLE:KEY"),
    Flag("jwt_issuer", _issuer_url, "JWT issuer for control-plane tokens (JWKS discovered from it)"),
    Flag("jwt_audience", _text, "JWT audience for control-plane tokens"),
    Flag("jwt_jwks_uri", _issuer_url, "JWKS URL (default: discovered from the issuer)"),
    Flag("jwt_role_claim", _text, "JWT claim holding the role (a string or a list of strings)"),
    Flag("policy", _choice(POLICIES), "worker selection policy"),
    Flag("dp_aware", _bool, "data-parallel aware routing: a rank chosen per request (ZMQ workers of dp_size "
         "above 1 are refused)", kind="switch"),
    Flag("prefill_policy", _choice(POLICIES), "PD: the prefill side's worker selection policy (default: --policy)"),
    Flag("decode_policy", _choice(POLICIES), "PD: the decode side's worker selection policy (default: --policy)"),
    Flag("pd_admission_wait_secs", _non_negative_float,
         "PD: longest wait for a load report that frees an overloaded prefill or decode side (0: shed at once)"),
    Flag("model_policies", _pair("=", "model=policy", _choice(POLICIES)), "policy for one model, repeatable",
         kind="append", option="--model-policy", metavar="MODEL=POLICY"),
    Flag("cache_threshold", _fraction, "cache_aware: prefix match ratio above which the matching worker is used"),
    Flag("balance_abs_threshold", _count, "cache_aware: load difference that counts as imbalance"),
    Flag("balance_rel_threshold", _positive_float, "cache_aware: load ratio that counts as imbalance"),
    Flag("eviction_interval_secs", _positive_float, "cache_aware: how often the prefix trees are trimmed"),
    Flag("max_tree_size", _positive_int, "cache_aware: characters kept per model's prefix tree"),
    Flag("request_timeout_secs", _positive_float, "upstream request timeout (seconds)"),
    Flag("upstream_pool_idle_timeout_secs", _non_negative_float,
         "how long an idle keep-alive connection to an HTTP worker is reused (0: until the worker closes it); "
         "a worker's http_pool.pool_idle_timeout_secs overrides it"),
    Flag("upstream_http2", _bool, "probe http:// workers whose http_pool.http2 is unset for HTTP/2 (prior knowledge) "
         "at registration and prefer it; without it they are reached over HTTP/1.1", kind="switch"),
    Flag("max_payload_size", _positive_int, "largest accepted request body (bytes)"),
    Flag("max_buffered_request_bytes", _count, "largest body kept replayable for retries (bytes)"),
    Flag("max_buffered_response_bytes", _positive_int,
         "most of an upstream answer held in memory where it must be read whole (bytes; a provider's "
         "Responses event or object larger fails with 502); relayed answers are not held"),
    Flag("max_worker_answer_bytes", _positive_int,
         "largest answer read from a worker's health or load route (bytes; longer counts as a failure)"),
    Flag("health_check_timeout_secs", _positive_float, "health probe timeout"),
    Flag("health_check_interval_secs", _positive_float, "seconds between health probes"),
    Flag("health_success_threshold", _positive_int, "consecutive successes that make a worker ready"),
    Flag("health_failure_threshold", _positive_int, "consecutive failures that make a worker not ready"),
    Flag("disable_health_check", _bool, "no health probes: workers are routable once registered", kind="switch"),
    Flag("health_check_endpoint", _path, "worker route probed for health"),
    Flag("drain_settle_secs", _non_negative_float, "how long a deleted ready worker drains (0 removes at once)"),
    Flag("cb_failure_threshold", _positive_int, "consecutive failures that open a worker's circuit breaker"),
    Flag("cb_success_threshold", _positive_int, "successes in half-open that close the breaker"),
    Flag("cb_timeout_duration_secs", _positive_float, "how long a breaker stays open before half-open"),
    Flag("cb_window_duration_secs", _positive_float, "accepted for compatibility; the breaker counts consecutive failures"),
    Flag("disable_circuit_breaker", _bool, "never open circuit breakers", kind="switch"),
    Flag("retry_max_retries", _count, "retries of a failed request on another worker"),
    Flag("retry_initial_backoff_ms", _count, "first retry backoff (ms)"),
    Flag("retry_max_backoff_ms", _count, "largest retry backoff (ms)"),
    Flag("retry_backoff_multiplier", _positive_float, "backoff growth per retry"),
    Flag("retry_jitter_factor", _fraction, "random share of the backoff (0-1)"),
    Flag("disable_retries", _bool, "never retry", kind="switch"),
    Flag("max_concurrent_requests", _count, "inference requests served at once (0: no limit)"),
    Flag("queue_size", _count, "requests waiting for a permit, FIFO (0: no queue)"),
    Flag("queue_timeout_secs", _positive_float, "longest wait in the admission queue"),
    Flag("multimodal_max_inflight_bytes", _count, "media bytes in flight across requests (0: no limit)"),
    Flag("multimodal_max_image_pixels", _count,
         "largest image (width x height) the gateway decodes for EPD encode workers; larger: 413 (0: no limit)"),
    Flag("default_tenant_rate_limit", _count,
         "requests per minute of each tenant with no limit of its own (flag or console row; 0: no limit)"),
    Flag("tenant_rate_limits", _pair("=", "tenant=requests_per_minute", _digits),
         "requests per minute of one tenant, repeatable (a row in the admin console overrides it)",
         kind="append", option="--tenant-rate-limit", metavar="TENANT=RPM"),
    Flag("default_tenant_budget", _budget,
         "tokens (prompt plus completion) per UTC day or calendar month of each tenant with no budget of its own "
         "(flag or console row; 0: no budget)", metavar="TOKENS/day|month"),
    Flag("tenant_budgets", _pair("=", "tenant=TOKENS/day|month", _budget),
         "tokens per UTC day or calendar month of one tenant, repeatable (a row in the admin console overrides it)",
         kind="append", option="--tenant-budget", metavar="TENANT=TOKENS/day|month"),
    Flag("load_monitor_interval", _positive_float, "seconds between worker load polls"),
    Flag("worker_overload_protection", _bool, "shed workers whose load report crosses the thresholds", kind="switch"),
    Flag("worker_overload_waiting_requests", _count, "waiting requests at which a worker leaves routing (0: unset)"),
    Flag("worker_overload_token_usage", _fraction, "KV token usage at which a worker leaves routing"),
    Flag("prometheus_host", _text, "metrics listener address"),
    Flag("prometheus_port", _port, "metrics listener port"),
    Flag("prometheus_duration_buckets", _positive_float, "histogram buckets for durations (seconds)", kind="list",
         metavar="SECONDS"),
    Flag("usage_metrics_tenant_label", _bool, "label gw_usage_tokens_total by tenant too (one series per tenant, "
         "model and token type)", kind="switch"),
    Flag("enable_trace", _bool, "OpenTelemetry tracing: a span per inference request (admission, selection, each "
         "upstream attempt), W3C traceparent continued and passed to workers; OTEL_* variables honoured",
         kind="switch"),
    Flag("otlp_traces_endpoint", _text, "OTLP/gRPC collector the spans are exported to, host:port (plaintext) or "
         "http(s)://host:port (default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT, "
         "localhost:4317)", metavar="HOST:PORT"),
    Flag("health_check_port", _count, "a separate listener for the probes (0: none)"),
    Flag("ssrf_allow_loopback", _bool, "let URLs callers give (MCP servers) reach loopback addresses",
         kind="switch"),
    Flag("ssrf_allow_private", _bool, "let URLs callers give (MCP servers) reach private networks (RFC 1918, "
         "fc00::/7, CGNAT 100.64/10)", kind="switch"),
    Flag("ssrf_allowed_hosts", _allowed_host, "hosts URLs callers give may reach whatever their addresses: names, "
         "*.suffix patterns, addresses, CIDR networks (the only way to link-local or metadata addresses)",
         kind="list", metavar="HOST|CIDR"),
    Flag("mcp_config_path", _text, "JSON file naming the MCP servers behind the built-in tools (web_search_preview, "
         "code_interpreter, file_search, image_generation); a bad file stops start-up"),
    Flag("mcp_connect_timeout_secs", _positive_float, "connecting to an MCP server, its handshake and tool listing"),
    Flag("mcp_tool_timeout_secs", _positive_float, "one MCP tool call (longer: the call fails)"),
    Flag("mcp_max_response_bytes", _positive_int,
         "largest HTTP answer or SSE event read from an MCP server (bytes; larger: that call fails)"),
    Flag("mcp_max_tool_output_bytes", _positive_int,
         "largest tool result text kept (bytes of UTF-8; longer: truncated with a note)"),
    Flag("mcp_max_tools", _positive_int, "most tools one MCP server may list (more: the listing fails)"),
    Flag("mcp_max_open_sessions", _positive_int,
         "MCP server sessions open at once in a serving process (more wait, up to the connect timeout)"),
    Flag("history_backend", _choice(HISTORY_BACKENDS),
         "where responses and conversations are stored: db (the gateway's database, shared by every process), "
         "memory (this process only, bounded by --history-memory-max-entries, lost on restart) or none "
         "(nothing stored: reads answer 404)"),
    Flag("history_memory_max_entries", _positive_int,
         "memory history backend: most responses, conversations and items kept together; the oldest "
         "responses and conversations are evicted first"),
    Flag("max_background_responses", _count,
         "background Responses runs at once in a serving process (more: 429 background_responses_limit_reached; "
         "0 turns background mode off: requests run in the foreground)"),
    Flag("history_retention_days", _count,
         "manage.py purge_history deletes stored responses and conversations with no activity for this many "
         "days (0: keep forever)"),
    Flag("usage_flush_interval_secs", _positive_float,
         "how often each serving process writes its usage sums and request log rows to the store in one "
         "transaction (a crash loses at most this long of accounting)"),
    Flag("request_log_max_rows", _count,
         "the request log keeps the newest this many requests (0: no request log; usage sums are kept)"),
    Flag("request_log_retention_days", _count,
         "request log rows older than this many days are pruned (0: only --request-log-max-rows prunes)"),
    Flag("usage_max_range_days", _positive_int,
         "the most days one GET /usage (or the console's usage page) sums at once; a longer range is refused"),
)



def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every flag. Unset flags stay None so the environment and the defaults can fill them."""
    defaults = GatewayConfig()
    for flag in FLAGS:
        default = getattr(defaults, flag.field)
        shown = "" if flag.kind != "value" or default is None or "key" in flag.field else f", default {default}"
        help_text = f"{flag.help} ({flag.env_name}{shown})"
        common: dict[str, Any] = {"dest": flag.field, "default": None, "help": help_text}
        if flag.kind == "switch":
            parser.add_argument(flag.option_name, action="store_const", const=True, **common)
        elif flag.kind == "list":
            parser.add_argument(flag.option_name, nargs="*", type=flag.parse, metavar=flag.metavar, **common)
        elif flag.kind == "append":
            parser.add_argument(flag.option_name, action="append", type=flag.parse, metavar=flag.metavar, **common)
        elif flag.kind == "extend":  # --flag A B, repeatable: every occurrence's values together
            parser.add_argument(flag.option_name, action="extend", nargs="+", type=flag.parse, metavar=flag.metavar,
                                **common)
        elif flag.kind == "append_args":  # repeatable, each time one or more words parsed together
            parser.add_argument(flag.option_name, action="append", nargs="+", metavar=flag.metavar, **common)
        else:
            parser.add_argument(flag.option_name, type=flag.parse, metavar=flag.metavar, **common)


def _from_env(flag: Flag) -> Any:
    raw = os.environ.get(flag.env_name)
    if raw is None:
        return None
    try:
        if flag.kind in ("list", "append", "extend"):
            return [flag.parse(item) for item in raw.replace(",", " ").split() if item]
        if flag.kind == "append_args":  # entries separated by commas, an entry's words by spaces
            return [flag.parse(entry) for entry in raw.split(",") if entry.strip()]
        return flag.parse(raw)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"{flag.env_name}: {exc}") from None


def config_from_namespace(ns: argparse.Namespace) -> GatewayConfig:
    """The config from parsed flags, filling unset ones from the environment, then the defaults."""
    values: dict[str, Any] = {}
    for flag in FLAGS:
        value = getattr(ns, flag.field, None)
        if value is None:
            value = _from_env(flag)
        if value is None:
            continue
        if flag.kind == "append_args" and getattr(ns, flag.field, None) is not None:
            try:
                value = [flag.parse(" ".join(words)) for words in value]
            except argparse.ArgumentTypeError as exc:
                raise ConfigError(f"{flag.option_name}: {exc}") from None
        if flag.kind in ("list", "append", "append_args", "extend"):
            value = tuple(dict.fromkeys(value))
        values[flag.field] = value
    config = GatewayConfig(**values)
    if bool(config.jwt_issuer) != bool(config.jwt_audience):
        raise ConfigError("--jwt-issuer and --jwt-audience go together")
    if bool(config.tls_cert_path) != bool(config.tls_key_path):
        raise ConfigError("--tls-cert-path and --tls-key-path go together")
    if bool(config.client_cert_path) != bool(config.client_key_path):
        raise ConfigError("--client-cert-path and --client-key-path go together")
    if (config.prefill_urls or config.decode_urls) and not config.pd_disaggregation:
        raise ConfigError("--prefill and --decode need --pd-disaggregation")
    config = _check_discovery(config)
    if config.pd_disaggregation and not (config.prefill_urls and config.decode_urls) and not config.discovery:
        raise ConfigError("--pd-disaggregation needs at least one --prefill and one --decode worker")
    return config


def _check_discovery(config: GatewayConfig) -> GatewayConfig:
    """The discovery flags together: --service-discovery is --discovery-provider kubernetes."""
    provider = config.discovery_provider
    if config.service_discovery:
        if provider not in (None, "kubernetes"):
            raise ConfigError("--service-discovery is --discovery-provider kubernetes: give one or the other")
        config = replace(config, discovery_provider="kubernetes")
        provider = "kubernetes"
    if (config.prefill_selector or config.decode_selector) and not config.pd_disaggregation:
        raise ConfigError("--prefill-selector and --decode-selector need --pd-disaggregation")
    if provider == "kubernetes" and not (config.selector or config.prefill_selector or config.decode_selector):
        raise ConfigError("Kubernetes discovery needs --selector (or, with --pd-disaggregation, --prefill-selector "
                          "or --decode-selector)")
    if provider == "file" and not config.discovery_file:
        raise ConfigError("--discovery-provider file needs --discovery-file")
    return config


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
