"""``--mcp-config-path``: the MCP servers the operator runs for the gateway, chiefly the ones behind
the built-in tools (``web_search_preview``, ``code_interpreter``, ``file_search``,
``image_generation``; spec 2, Tools). Read and validated at start-up: a bad file stops the gateway
with a message naming the file and the field.

The file is JSON (no extra dependency; the ``//`` notes below are for the reader, JSON has no
comments)::

    {
      "servers": [
        {
          "name": "search",                          // required: letters, digits, - and _, from a letter
          "url": "https://search.internal/mcp",      // required: http(s), Streamable HTTP, no user:password@
          "builtin": "web_search_preview",           // optional: the built-in tool type it backs (one server each)
          "tool": "web_search",                      // optional, with builtin: the server's tool that serves it
          "description": "Company web search",       // optional
          "authorization_env": "SEARCH_MCP_TOKEN",   // optional: bearer token from this environment variable,
          "authorization": "...",                    //   or the token itself (not both)
          "headers": {"X-Team": "infra"}             // optional: extra headers (not the ones the gateway owns)
        }
      ]
    }

Unknown keys are errors (a typo must not silently drop a setting). Names are unique ignoring case.
The servers are the operator's: each one's own host is allowed whatever its address (a sidecar on
loopback, a service on a private network), while any other host it redirects to is judged by the
SSRF policy as usual.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from common.config import GatewayConfig
from common.ssrf import SYNTAX_ONLY, SsrfRefused, target_of
from inference.mcp.client import McpServerParams
from inference.mcp.errors import McpConfigError, McpServerParamsError

__all__ = [
    "BUILTIN_TOOL_TYPES",
    "MAX_CONFIG_BYTES",
    "McpConfig",
    "McpServerSpec",
    "load_mcp_config",
    "mcp_config_of",
    "parse_mcp_config",
]

BUILTIN_TOOL_TYPES = ("web_search_preview", "code_interpreter", "file_search", "image_generation")
MAX_CONFIG_BYTES = 1024 * 1024
_SERVER_KEYS = frozenset({"name", "url", "builtin", "tool", "description", "authorization", "authorization_env", "headers"})


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """One configured server: how to connect (``params``, trusted) and what it backs."""

    params: McpServerParams
    builtin: str | None = None
    tool: str | None = None
    description: str | None = None

    @property
    def name(self) -> str:
        return self.params.label


@dataclass(frozen=True, slots=True)
class McpConfig:
    """The configured servers, looked up by name (case-insensitive) or by built-in tool type."""

    servers: tuple[McpServerSpec, ...] = ()

    def server(self, name: str) -> McpServerSpec | None:
        wanted = name.lower()
        return next((spec for spec in self.servers if spec.name.lower() == wanted), None)

    def for_builtin(self, tool_type: str) -> McpServerSpec | None:
        """The server backing built-in tool ``tool_type`` (``web_search_preview``, ...), or None."""
        return next((spec for spec in self.servers if spec.builtin == tool_type), None)


def _string(entry: dict[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
    value = entry.get(key)
    if value is None:
        if required:
            raise McpConfigError(f"{where}.{key}: required")
        return None
    if not isinstance(value, str) or not value:
        raise McpConfigError(f"{where}.{key}: must be a non-empty string")
    return value


def _server(entry: Any, where: str) -> McpServerSpec:
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where}: must be an object")
    unknown = sorted(set(entry) - _SERVER_KEYS)
    if unknown:
        raise McpConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_SERVER_KEYS))})")
    name = _string(entry, "name", where, required=True)
    url = _string(entry, "url", where, required=True)
    assert name is not None and url is not None
    try:
        target_of(url, SYNTAX_ONLY)  # its form only: the operator's servers may be anywhere
    except SsrfRefused as exc:
        raise McpConfigError(f"{where}.url: {exc.reason.removeprefix('refused: ')}") from None
    builtin = _string(entry, "builtin", where)
    if builtin is not None and builtin not in BUILTIN_TOOL_TYPES:
        raise McpConfigError(f"{where}.builtin: {builtin!r} is not one of {', '.join(BUILTIN_TOOL_TYPES)}")
    tool = _string(entry, "tool", where)
    if tool is not None and builtin is None:
        raise McpConfigError(f"{where}.tool: only meaningful with builtin")
    token = _string(entry, "authorization", where)
    env_name = _string(entry, "authorization_env", where)
    if token is not None and env_name is not None:
        raise McpConfigError(f"{where}: give authorization or authorization_env, not both")
    if env_name is not None:
        token = os.environ.get(env_name)
        if not token:
            raise McpConfigError(f"{where}.authorization_env: the environment variable {env_name} is not set")
    headers = entry.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise McpConfigError(f"{where}.headers: must be an object of strings")
    try:
        params = McpServerParams(name, url, authorization=token, headers=tuple(headers.items()), trusted=True)
    except McpServerParamsError as exc:
        raise McpConfigError(f"{where}: {exc}") from None
    return McpServerSpec(params, builtin=builtin, tool=tool, description=_string(entry, "description", where))


def parse_mcp_config(raw: bytes, source: str = "MCP config") -> McpConfig:
    """Parse and validate the file's bytes. Raises :class:`McpConfigError` naming ``source``."""
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise McpConfigError(f"{source}: not valid JSON ({exc})") from None
    try:
        if not isinstance(document, dict) or set(document) - {"servers"}:
            raise McpConfigError('the top level must be an object with the one key "servers"')
        entries = document.get("servers", [])
        if not isinstance(entries, list):
            raise McpConfigError("servers: must be an array")
        servers = tuple(_server(entry, f"servers[{index}]") for index, entry in enumerate(entries))
        names: dict[str, int] = {}
        builtins: dict[str, int] = {}
        for index, spec in enumerate(servers):
            if spec.name.lower() in names:
                raise McpConfigError(f"servers[{index}].name: {spec.name!r} is already servers[{names[spec.name.lower()]}]")
            names[spec.name.lower()] = index
            if spec.builtin is not None:
                if spec.builtin in builtins:
                    raise McpConfigError(
                        f"servers[{index}].builtin: {spec.builtin} is already backed by servers[{builtins[spec.builtin]}]"
                    )
                builtins[spec.builtin] = index
    except McpConfigError as exc:
        raise McpConfigError(f"{source}: {exc}") from None
    return McpConfig(servers)


def load_mcp_config(path: str | os.PathLike[str]) -> McpConfig:
    """Read ``path`` (at most :data:`MAX_CONFIG_BYTES`) and validate it. Raises
    :class:`McpConfigError`."""
    file = Path(path)
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise McpConfigError(f"--mcp-config-path {file}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise McpConfigError(f"--mcp-config-path {file}: larger than {MAX_CONFIG_BYTES} bytes")
    return parse_mcp_config(raw, f"--mcp-config-path {file}")


_loaded: dict[str, McpConfig] = {}


def mcp_config_of(config: GatewayConfig) -> McpConfig:
    """The configured servers of ``config`` (empty without ``--mcp-config-path``), read once per
    process and path. Start-up calls it so a bad file stops the gateway (rungateway); a serving
    process started later reads the same file on first use. Raises :class:`McpConfigError`."""
    path = config.mcp_config_path
    if not path:
        return McpConfig()
    loaded = _loaded.get(path)
    if loaded is None:
        loaded = _loaded[path] = load_mcp_config(path)
    return loaded
