"""Real processes on loopback: `manage.py rungateway` (uvicorn or daphne) and `manage.py runmockworker`.

The gateway processes use their own store: a fresh Postgres database when the suite runs on
Postgres (DATABASE_URL), else an SQLite file that rungateway migrates itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from tests.conftest import free_port
from tests.log_watch import MARKER, escape_lines

__all__ = ["ROOT", "Process", "free_port", "wait_for"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    group: bool = False  # started as its own process group (``make``): signals go to the whole group

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.terminate()
        self.reap()

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self._signal(signal.SIGTERM)

    def reap(self) -> None:
        """Wait for the exit :meth:`terminate` asked for (killed after 10 s)."""
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.popen.wait(timeout=5)

    def _signal(self, number: signal.Signals) -> None:
        if not self.group:
            self.popen.send_signal(number)
            return
        try:
            os.killpg(self.popen.pid, number)
        except ProcessLookupError:
            pass


def wait_for(check: Callable[[], bool], timeout: float, what: str, process: Process | None = None) -> None:
    """Poll ``check`` (HTTP errors count as not yet) until it holds; fail after ``timeout`` seconds,
    or at once when ``process`` exited, with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.popen.poll() is not None:
            raise AssertionError(f"{process.name} exited early ({process.popen.returncode}):\n{process.log()}")
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    if process is None:
        raise AssertionError(f"{what} not reached within {timeout}s")
    raise AssertionError(f"{process.name}: {what} not reached in {timeout}s:\n{process.log()}")


@pytest.fixture(scope="session")
def e2e_database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("DATABASE_URL", "")
    if not configured.startswith(("postgres://", "postgresql://")):
        yield f"sqlite:///{tmp_path_factory.mktemp('e2e-db') / 'gateway.sqlite3'}"
        return
    import psycopg

    name = f"gw_e2e_{uuid.uuid4().hex[:10]}"
    parts = urlsplit(configured)
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(parts._replace(path=f"/{name}"))
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "gateway_project.settings"}
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True, timeout=120)
    try:
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _clear_workers(database_url: str) -> None:
    """Each test starts with no stored workers (earlier tests' workers are gone processes)."""
    if database_url.startswith("sqlite:///"):
        import sqlite3

        path = database_url.removeprefix("sqlite:///")
        if not Path(path).exists():
            return
        with sqlite3.connect(path) as conn:
            if conn.execute("SELECT name FROM sqlite_master WHERE name='administration_worker'").fetchone():
                conn.execute("DELETE FROM administration_worker")
        return
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM administration_worker")


@pytest.fixture
def spawn(request: pytest.FixtureRequest, tmp_path: Path, e2e_database_url: str) -> Iterator[Callable[..., Process]]:
    """Start processes; after the test, stop them and fail it if any logged an unhandled exception
    (tests/log_watch.py), unless it is marked ``escapes_expected``."""
    _clear_workers(e2e_database_url)
    started: list[Process] = []

    def start(
        name: str,
        args: list[str],
        port: int | None,
        ready_path: str = "/health",
        wait: bool = True,
        env: dict[str, str] | None = None,
        argv: list[str] | None = None,
        group: bool = False,
    ) -> Process:
        """Start ``manage.py ARGS`` (or ``argv`` as given) with the suite's store; wait for ``ready_path``.
        ``group`` starts it as a process group of its own, stopped as a whole (a ``make`` target and
        the processes its recipe starts)."""
        log_path = tmp_path / f"{name}.log"
        extra = env or {}
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "DJANGO_SETTINGS_MODULE": "gateway_project.settings",
            "DATABASE_URL": e2e_database_url,
            "GW_DATA_DIR": str(tmp_path / "data"),
            "PYTHONUNBUFFERED": "1",
            **extra,
        }
        command = argv or [sys.executable, "manage.py", *args]
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=group
            )
        process = Process(name, popen, f"http://127.0.0.1:{port}", log_path, env, group)
        started.append(process)
        if wait and port is not None:
            wait_for(lambda: httpx.get(process.url + ready_path, timeout=2).status_code == 200, 60, ready_path, process)
        return process

    yield start
    for process in reversed(started):  # all asked to stop at once: their drains overlap
        process.terminate()
    for process in reversed(started):
        process.reap()
    if request.node.get_closest_marker(MARKER) is None:
        escapes = {process.name: lines for process in started if (lines := escape_lines(process.log()))}
        if escapes:
            pytest.fail(f"unhandled exception logged by a process the test started: {escapes}", pytrace=False)


@pytest.fixture
def mock_worker_process(spawn: Callable[..., Process]) -> Process:
    port = free_port()
    return spawn(
        "mockworker",
        ["runmockworker", "--host", "127.0.0.1", "--port", str(port), "--model", "mock-model", "--tokens", "8"],
        port,
    )


@pytest.fixture(params=["uvicorn", "daphne"])
def server(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def start_gateway(spawn: Callable[..., Process], server: str) -> Callable[..., Process]:
    def start(*flags: str, wait_ready: bool = True, env: dict[str, str] | None = None) -> Process:
        port = free_port()
        args = ["rungateway", "--host", "127.0.0.1", "--port", str(port), "--server", server, *flags]
        name = f"gateway-{server}-{port}"
        return spawn(name, args, port, ready_path="/readiness" if wait_ready else "/liveness", env=env)

    return start
