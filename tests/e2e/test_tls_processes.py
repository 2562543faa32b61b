"""TLS as an operator runs it (D75): rungateway serving HTTPS under uvicorn and under daphne (two
serving processes on the supervisor's socket), relaying to an https:// worker that requires a client
certificate, driven by the openai SDK; the listener's certificate files replaced while it serves and
new connections given the new one, without a restart."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import httpx
import openai
import pytest
from aiohttp import web

from standins.mock_worker import MockWorkerConfig, build_app
from tests.common.test_tls import Authority, Issued, serial_of
from tests.e2e.conftest import Process, free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.embedded]

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path)


@pytest.fixture
def mtls_worker(ca: Authority) -> Iterator[str]:
    """The mock worker over TLS in a thread of the test, refusing clients without a certificate of the CA."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(build_app(MockWorkerConfig(model="mock-model", tokens=6)), access_log=None)
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ca.server_context(ca.issue("worker")))
        loop.run_until_complete(site.start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    yield f"https://localhost:{runner.addresses[0][1]}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _presented_serial(port: int, ca: Authority) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ca.client_context().wrap_socket(raw, server_hostname="localhost") as tls:
            return serial_of(tls.getpeercert(binary_form=True))


def _start(
    spawn: Callable[..., Process], ca: Authority, worker: str, server: str, workers: int, *flags: str
) -> tuple[Process, int, Issued]:
    listener = ca.issue("gateway")
    client = ca.issue("gateway-client", client=True)
    port = free_port()
    gateway = spawn(
        f"gateway-tls-{server}",
        ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--server", server, "--workers", str(workers),
         "--tls-cert-path", str(listener.cert), "--tls-key-path", str(listener.key),
         "--client-cert-path", str(client.cert), "--client-key-path", str(client.key), "--ca-cert-paths", str(ca.path),
         "--worker-urls", worker, *flags],
        port, wait=False,
    )  # fmt: skip
    trusting = httpx.Client(verify=ca.client_context(), timeout=5)
    wait_for(lambda: trusting.get(f"https://localhost:{port}/readiness").status_code == 200, 90, "/readiness over TLS", gateway)
    trusting.close()
    answered: list[int] = []

    def every_process_routes() -> bool:  # each new connection may reach another serving process
        with httpx.Client(verify=ca.client_context(), timeout=10) as fresh:
            body = {"model": "mock-model", "messages": MESSAGES, "max_tokens": 1}
            answered.append(fresh.post(f"https://localhost:{port}/v1/chat/completions", json=body).status_code)
        return answered[-4 * workers:] == [200] * 4 * workers

    wait_for(every_process_routes, 60, "the https:// worker routed by every serving process", gateway)
    return gateway, port, listener


def _sdk_round(port: int, ca: Authority) -> None:
    http_client = httpx.Client(verify=ca.client_context())
    client = openai.OpenAI(
        base_url=f"https://localhost:{port}/v1", api_key="none", http_client=http_client,
        _strict_response_validation=True, max_retries=0,
    )  # fmt: skip
    chat = client.chat.completions.create(model="mock-model", messages=MESSAGES, max_completion_tokens=4)
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 4
    chunks = list(client.chat.completions.create(model="mock-model", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    http_client.close()


def _rotate_and_see_it(gateway: Process, port: int, ca: Authority, listener: Issued, consecutive: int) -> None:
    """Replace the listener's files; new connections get the new certificate (every serving process:
    ``consecutive`` new connections in a row show it)."""
    assert _presented_serial(port, ca) == listener.serial
    renewed = ca.issue("gateway-renewed", cert=listener.cert, key=listener.key)
    seen: list[int] = []

    def renewed_everywhere() -> bool:
        seen.append(_presented_serial(port, ca))
        return seen[-consecutive:] == [renewed.serial] * consecutive

    wait_for(renewed_everywhere, 60, "the renewed certificate on new connections", gateway)
    assert "listener certificate reloaded" in gateway.log()


def test_uvicorn_serves_https_relays_with_a_client_certificate_and_reloads(spawn, ca: Authority, mtls_worker: str) -> None:
    probes = free_port()
    gateway, port, listener = _start(spawn, ca, mtls_worker, "uvicorn", 1, "--health-check-port", str(probes))
    _sdk_round(port, ca)
    # The probe listener stays plain HTTP (kubelet probes and scrapers inside the cluster, D75).
    assert httpx.get(f"http://127.0.0.1:{probes}/readiness", timeout=5).status_code == 200
    with pytest.raises(openai.APIConnectionError):  # a client that does not trust the gateway's CA
        openai.OpenAI(base_url=f"https://localhost:{port}/v1", api_key="none", max_retries=0).models.list()
    _rotate_and_see_it(gateway, port, ca, listener, consecutive=1)
    _sdk_round(port, ca)  # served with the new certificate


def test_daphne_serving_processes_serve_https_and_reload(spawn, ca: Authority, mtls_worker: str) -> None:
    gateway, port, listener = _start(spawn, ca, mtls_worker, "daphne", workers=2)
    _sdk_round(port, ca)
    _rotate_and_see_it(gateway, port, ca, listener, consecutive=8)
    _sdk_round(port, ca)
