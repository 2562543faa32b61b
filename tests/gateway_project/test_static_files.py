"""Static files: the console's CSS and JS are served; a path that climbs out of the static roots, in
any spelling, is the 404 envelope, never a SuspiciousFileOperation's 500. Through the whole ASGI app
(the in-process transport hands the path over as a server does, percent-decoded)."""

from __future__ import annotations

from email.utils import formatdate

import httpx
import pytest

from gateway_project.asgi import application
from gateway_project.static_files import safe_relative_path
from tests.conftest import GatewayFactory
from tests.hostile.asgi_call import Answer, call_asgi

CSS = "/static/admin/css/base.css"

TRAVERSALS = [
    "/static/../settings.py",
    "/static/../../../../etc/passwd",
    "/static/admin/../../gateway_project/settings.py",
    "/static/admin/css/../../../../../gateway_project/settings.py",
    "/static/./admin/css/base.css",
    "/static//etc/passwd",
    "/static/admin//css/base.css",
    "/static/..\\..\\settings.py",
    "/static/admin\\css\\base.css",
    "/static/admin/css/base.css\x00.png",
    "/static/\x00",
    "/static/..",
    "/static/.",
    "/static/",
    "/static/admin/css/",
    "/static/admin/css",
    "/static/no-such-file.css",
    "/static/C:/Windows/win.ini",
]


@pytest.fixture
async def client(make_gateway: GatewayFactory) -> httpx.AsyncClient:
    return make_gateway()


async def _get(path: str, method: str = "GET") -> Answer:
    """``path`` as the app's ASGI path, byte for byte (httpx would normalise ".." and refuse a NUL)."""
    return await call_asgi(application, method, path)


async def test_the_console_css_is_served(client: httpx.AsyncClient) -> None:
    answer = await client.get(CSS)
    assert answer.status_code == 200 and answer.headers["content-type"] == "text/css"
    assert int(answer.headers["content-length"]) == len(answer.content) > 1000
    head = await client.head(CSS)
    assert head.status_code == 200 and head.content == b""
    again = await client.get(CSS, headers={"If-Modified-Since": answer.headers["last-modified"]})
    assert again.status_code == 304 and again.content == b""
    older = await client.get(CSS, headers={"If-Modified-Since": formatdate(0, usegmt=True)})
    assert older.status_code == 200


@pytest.mark.parametrize("path", TRAVERSALS)
async def test_traversal_and_missing_files_are_the_404_envelope(client: httpx.AsyncClient, path: str) -> None:
    answer = await _get(path)
    assert answer.status == 404, (path, answer.body[:200])
    assert answer.json()["error"]["code"] == "endpoint_not_found"
    assert answer.headers[b"x-gw-error-code"] == b"endpoint_not_found"


@pytest.mark.parametrize("encoded", ["/static/%2e%2e/settings.py", "/static/%2E%2E%2Fsettings.py",
                                     "/static/admin%5c..%5c..%5csettings.py", "/static/a%00b"])
async def test_percent_encoded_traversal_is_404(client: httpx.AsyncClient, encoded: str) -> None:
    """What a server hands over for these request lines: the decoded path."""
    from urllib.parse import unquote

    answer = await _get(unquote(encoded))
    assert answer.status == 404 and answer.json()["error"]["code"] == "endpoint_not_found"


async def test_other_methods_are_405(client: httpx.AsyncClient) -> None:
    answer = await client.post(CSS)
    assert answer.status_code == 405 and answer.headers["allow"] == "GET, HEAD"
    assert answer.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("relative", "safe"),
    [("admin/css/base.css", True), ("../x", False), ("a/../b", False), ("a//b", False), ("/abs", False),
     ("a\\b", False), ("a\x00", False), ("", False), (".", False), ("a/.", False), ("..a/b..", True)],
)
def test_safe_relative_path(relative: str, safe: bool) -> None:
    assert (safe_relative_path(relative) is not None) is safe
