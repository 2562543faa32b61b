"""``--mcp-config-path``: the file of MCP servers behind the built-in tools, validated at start-up."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from common.config import parse_gateway_args
from inference.mcp import BUILTIN_TOOL_TYPES, McpConfigError, load_mcp_config, mcp_config_of, parse_mcp_config

GOOD = {
    "servers": [
        {
            "name": "search",
            "url": "https://search.internal/mcp",
            "builtin": "web_search_preview",
            "tool": "web_search",
            "description": "Company web search",
            "authorization_env": "TEST_SEARCH_MCP_TOKEN",
            "headers": {"X-Team": "infra"},
        },
        {"name": "Sandbox", "url": "http://127.0.0.1:8931/mcp", "builtin": "code_interpreter", "authorization": "tok"},
        {"name": "plain", "url": "http://10.0.0.7:9000/mcp"},
    ]
}


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "mcp.json"
    path.write_bytes(document if isinstance(document, bytes) else orjson.dumps(document))
    return path


def test_a_good_file_parses_and_looks_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_SEARCH_MCP_TOKEN", "from-env")
    config = load_mcp_config(write(tmp_path, GOOD))
    search = config.for_builtin("web_search_preview")
    assert search is not None and search.name == "search" and search.tool == "web_search"
    assert search.params.trusted and search.params.request_headers() == {"X-Team": "infra", "Authorization": "Bearer from-env"}
    assert "from-env" not in repr(search)
    sandbox = config.for_builtin("code_interpreter")
    assert sandbox is not None and sandbox.name == "Sandbox" and sandbox.tool is None
    assert config.for_builtin("image_generation") is None and config.for_builtin("file_search") is None
    assert config.server("sandbox") is sandbox and config.server("PLAIN") is not None and config.server("x") is None
    assert set(BUILTIN_TOOL_TYPES) == {"web_search_preview", "code_interpreter", "file_search", "image_generation"}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b"{not json", "not valid JSON"),
        ([], "top level"),
        ({"servers": [], "extra": 1}, "top level"),
        ({"servers": {}}, "servers: must be an array"),
        ({"servers": ["x"]}, r"servers\[0\]: must be an object"),
        ({"servers": [{"url": "http://a/mcp"}]}, r"servers\[0\].name: required"),
        ({"servers": [{"name": "a"}]}, r"servers\[0\].url: required"),
        ({"servers": [{"name": "a", "url": "http://a/mcp", "tols": "x"}]}, "unknown key.*tols"),
        ({"servers": [{"name": "a", "url": "ftp://a/mcp"}]}, "scheme"),
        ({"servers": [{"name": "a", "url": "http://u:p@a/mcp"}]}, "user or password"),
        ({"servers": [{"name": "1a", "url": "http://a/mcp"}]}, "label"),
        ({"servers": [{"name": "a", "url": "http://a/mcp", "builtin": "web_search"}]}, "not one of"),
        ({"servers": [{"name": "a", "url": "http://a/mcp", "tool": "t"}]}, "only meaningful with builtin"),
        ({"servers": [{"name": "a", "url": "http://a/mcp", "authorization": "t", "authorization_env": "E"}]}, "not both"),
        ({"servers": [{"name": "a", "url": "http://a/mcp", "authorization_env": "TEST_UNSET_MCP_VAR"}]}, "is not set"),
        ({"servers": [{"name": "a", "url": "http://a/mcp", "headers": {"Host": "b"}}]}, "set by the gateway"),
        ({"servers": [{"name": "a", "url": "http://a/mcp", "headers": {"X": 1}}]}, "object of strings"),
        ({"servers": [{"name": "a", "url": "http://a/mcp"}, {"name": "A", "url": "http://b/mcp"}]}, "already servers"),
        (
            {
                "servers": [
                    {"name": "a", "url": "http://a/mcp", "builtin": "file_search"},
                    {"name": "b", "url": "http://b/mcp", "builtin": "file_search"},
                ]
            },
            r"servers\[1\].builtin: file_search is already backed",
        ),
    ],
)
def test_a_bad_file_names_the_file_and_the_field(tmp_path: Path, document: object, message: str) -> None:
    path = write(tmp_path, document)
    with pytest.raises(McpConfigError, match=message) as caught:
        load_mcp_config(path)
    assert str(path) in str(caught.value)


def test_a_missing_or_huge_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(McpConfigError, match="cannot be read"):
        load_mcp_config(tmp_path / "absent.json")
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (1024 * 1024 + 1))
    with pytest.raises(McpConfigError, match="larger than"):
        load_mcp_config(huge)


def test_the_flag_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, {"servers": [{"name": "a", "url": "http://a/mcp", "builtin": "image_generation"}]})
    config = parse_gateway_args(["--mcp-config-path", str(path)])
    servers = mcp_config_of(config)
    assert servers.for_builtin("image_generation") is not None
    assert mcp_config_of(config) is servers  # read once
    assert mcp_config_of(parse_gateway_args([])).servers == ()
    assert parse_mcp_config(b'{"servers": []}').servers == ()
