"""Child processes for the benchmark: pinned with taskset, logged to files, always torn down.

Every process is started in its own session (process group) so that stopping it also stops
anything it forked (nginx workers, uvicorn reloaders, LiteLLM's workers). :class:`ProcessGroup`
remembers each process it started and stops exactly those, by process-group id, on ``close()``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

__all__ = [
    "LOOPBACK",
    "ManagedProcess",
    "ProcessGroup",
    "StartError",
    "child_env",
    "free_port",
    "http_get",
    "http_post_json",
    "pinned",
    "wait_until",
]

LOOPBACK = "127.0.0.1"

# Settings that would change what the gateway or a peer talks to; never inherited by children.
_SCRUBBED_PREFIXES = ("GW_", "DATABASE_URL", "REDIS_URL", "CELERY_", "DJANGO_", "LITELLM_", "OPENAI_")
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


class StartError(RuntimeError):
    """A process that exited or never became ready."""


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def pinned(core: int | str, argv: Sequence[str]) -> list[str]:
    """``argv`` run under ``taskset -c core``."""
    return ["taskset", "-c", str(core), *argv]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's environment without proxy and deployment settings, plus ``extra``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _PROXY_VARS and not key.startswith(_SCRUBBED_PREFIXES)
    }
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def http_get(url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    """GET a loopback URL: (status, body); status 0 when the connection failed."""
    if not url.startswith(f"http://{LOOPBACK}:"):
        raise ValueError(f"refusing non-loopback URL {url!r}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (OSError, ValueError):
        return 0, b""


def http_post_json(url: str, payload: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    """POST a JSON body to a loopback URL: (status, body); status 0 when the connection failed."""
    if not url.startswith(f"http://{LOOPBACK}:"):
        raise ValueError(f"refusing non-loopback URL {url!r}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=payload, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with opener.open(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (OSError, ValueError):
        return 0, b""


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``check`` until it is true or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


@dataclass
class ManagedProcess:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, check: Callable[[], bool], timeout: float) -> None:
        """Poll ``check`` until true; raise :class:`StartError` if the process dies or time runs out."""

        def ready() -> bool:
            if not self.alive:
                raise StartError(f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}")
            return check()

        if not wait_until(ready, timeout, interval=0.1):
            raise StartError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, grace: float = 5.0, sig: signal.Signals = signal.SIGTERM) -> None:
        """Send ``sig`` to the process group, then SIGKILL what is left after ``grace`` seconds."""
        if self.popen.poll() is not None:
            self._reap_group()
            return
        pgid = self.popen.pid  # started with start_new_session: pgid == pid
        _signal_group(pgid, sig)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._reap_group()

    def _reap_group(self) -> None:
        # Children that outlived their leader (e.g. nginx workers) still carry its group id.
        _signal_group(self.popen.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class ProcessGroup:
    """Starts processes and stops all of them (newest first) on :meth:`close` or context exit."""

    log_dir: Path
    processes: list[ManagedProcess] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ManagedProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else child_env(),
                cwd=str(cwd) if cwd else None,
                start_new_session=True,
            )
        process = ManagedProcess(name, popen, log_path)
        self.processes.append(process)
        return process

    def stop(self, process: ManagedProcess) -> None:
        process.stop()
        if process in self.processes:
            self.processes.remove(process)

    def close(self) -> None:
        while self.processes:
            self.processes.pop().stop()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
