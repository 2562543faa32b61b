"""Registration probes reuse their job thread's httpx client (D84): kept between jobs, one per
thread, and made again (the old one closed) once the worker TLS context is remade."""

from __future__ import annotations

import threading

import httpx

from administration.registration import _probe_client
from common import tls


def test_a_job_thread_keeps_its_probe_client_until_the_tls_context_changes() -> None:
    first = _probe_client()
    assert _probe_client() is first and not first.is_closed
    others: list[httpx.Client] = []
    thread = threading.Thread(target=lambda: others.append(_probe_client()))
    thread.start()
    thread.join()
    assert others[0] is not first  # each job thread its own (a small pool, scanned per request)
    tls.reset()  # the worker TLS files reloaded: the next probe uses a client of the new context
    renewed = _probe_client()
    assert renewed is not first and first.is_closed and not renewed.is_closed
    assert _probe_client() is renewed
