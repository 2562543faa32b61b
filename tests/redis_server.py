"""A Redis server of the test's own, on a free port, that the test can kill and start again.

The machine's Redis on 6379 is shared by everyone working on it; an outage is made here with a
``redis-server`` started for the test (nothing saved to disk, so a restart comes back empty, as a
Redis without persistence does), killed, and started again on the same port.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import redis

from tests.conftest import free_port

__all__ = ["RedisServer", "needs_redis_server"]

READY_WITHIN = 10.0  # seconds for a started server to answer PING

needs_redis_server = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server binary")


class RedisServer:
    """``redis-server`` on 127.0.0.1:``port``; :meth:`kill` and :meth:`start` keep the port."""

    def __init__(self) -> None:
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> RedisServer:
        """Start the server and return once it answers PING."""
        assert self._process is None, "already running"
        self._process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + READY_WITHIN
        try:
            while True:
                if self._process.poll() is not None:
                    raise AssertionError(f"redis-server on port {self.port} exited ({self._process.returncode})")
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"redis-server on port {self.port} not up in {READY_WITHIN} s") from None
                    time.sleep(0.02)  # a poll interval: the server gives nothing to wait on
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL, as a crashed or cut-off server: every connection drops, nothing is saved."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
        if process is not None:
            process.wait(timeout=10)
