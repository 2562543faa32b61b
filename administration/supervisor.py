"""``rungateway --workers N`` (N > 1): this process supervises N serving processes and serves nothing.

It binds the listening socket once and every serving process inherits it and accepts on it (the
kernel hands each new connection to one of them); a process that leaves does not take the socket or
its queued connections with it. Each serving process is ``manage.py rungateway`` again, told its
place through the environment (the socket's descriptor, its index, the run directory shared by the
processes: the leader lock, the leader's load reports, and the metrics directory when
``PROMETHEUS_MULTIPROC_DIR`` is not set). Its configuration, API keys included, comes over an
owner-only (0600) file in the run directory that has no name (unlinked as it is made) and that the
process reads and closes as it starts (its descriptor's number in ``GW_CONFIG_FD``), never through
the environment, which any process of the same user reads in ``/proc/<pid>/environ``: the serving
processes' environment has neither ``GW_CONFIG`` nor a flag's variable.

A serving process that dies is replaced (after a pause that grows while replacements keep dying
young). On SIGTERM or SIGINT the supervisor closes its copy of the socket at once and passes the
signal on; each serving process closes its own and drains (requests in flight may finish for
``--shutdown-grace-period-secs``), so the socket is gone, and new connections are refused, as soon
as every process stopped accepting. A second signal kills what is left. Nothing is lost or left
hanging: a connection is either accepted and served, or refused.

A serving process does not outlive its supervisor, however the supervisor ends (a SIGKILL, an
out-of-memory kill): each asks the kernel for SIGTERM on its parent's death (Linux
``PR_SET_PDEATHSIG``) as it starts, then checks its parent is still the supervisor that started it
(one that died before the request was made is seen there), so it drains and exits as on a stop.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from common.config import FLAGS, GatewayConfig, install_config
from administration.host import HostPeers

__all__ = ["Supervisor", "LISTEN_FD_ENV", "SUPERVISOR_PID_ENV", "inherited_socket", "end_with_supervisor",
           "received_config"]

log = logging.getLogger("administration.lifecycle")

LISTEN_FD_ENV = "GW_LISTEN_FD"
SUPERVISOR_PID_ENV = "GW_SUPERVISOR_PID"
CONFIG_FD_ENV = "GW_CONFIG_FD"
# Not handed to a serving process: its configuration comes over the handover file. GW_LOG_LEVEL
# stays (no secret; Django's settings read it as the process starts).
_NOT_INHERITED = frozenset({"GW_CONFIG", *(flag.env_name for flag in FLAGS)}) - {"GW_LOG_LEVEL"}
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_BACKLOG = 2048
_POLL_SECS = 0.1
_YOUNG_SECS = 10.0  # a process that dies younger than this is restarted after a growing pause
_MAX_PAUSE_SECS = 10.0
_KILL_AFTER_SECS = 15.0  # past the grace period, what is still running is killed


def inherited_socket() -> socket.socket | None:
    """The listening socket a supervisor handed to this serving process, if any."""
    fd = os.environ.get(LISTEN_FD_ENV)
    return socket.socket(fileno=int(fd)) if fd else None


def end_with_supervisor() -> None:
    """In a serving process, first thing: SIGTERM from the kernel when the supervisor dies (so it
    drains and exits as on a stop), and an exit now if the supervisor already died before that was
    asked (this process was handed to another parent). Off Linux only the parent check applies."""
    expected = os.environ.get(SUPERVISOR_PID_ENV)
    if not expected:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("PR_SET_PDEATHSIG failed (errno %d): this process may outlive its supervisor", ctypes.get_errno())
    if os.getppid() != int(expected):
        raise SystemExit(f"the supervisor (pid {expected}) is gone; this serving process exits")


def received_config() -> GatewayConfig:
    """In a serving process: the configuration its supervisor handed over (read, then closed, so no
    descriptor to it stays open), installed as this process's."""
    fd = int(os.environ[CONFIG_FD_ENV])
    chunks: list[bytes] = []
    try:
        while chunk := os.pread(fd, 1 << 16, sum(map(len, chunks))):
            chunks.append(chunk)
    finally:
        os.close(fd)
    config = GatewayConfig.from_json(b"".join(chunks).decode())
    install_config(config, export=False)
    return config


def _bind(host: str, port: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    sock = socket.create_server((host, port), family=family, backlog=_BACKLOG)
    sock.set_inheritable(True)
    return sock


@dataclass
class _Slot:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0  # consecutive deaths of young processes
    restart_at: float = 0.0


class Supervisor:
    def __init__(self, config: GatewayConfig, manage_py: Path, data_dir: Path) -> None:
        self.config = config
        self.manage_py = manage_py
        self.run_dir = data_dir / "run" / f"gateway-{config.port}"
        self.slots = [_Slot(index) for index in range(config.workers)]
        self._signals = 0
        self._socket: socket.socket | None = None

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT; returns the exit status."""
        self._prepare_run_dir()
        self._socket = _bind(self.config.host, self.config.port)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        log.info("supervising %d serving processes on %s:%d", len(self.slots), self.config.host, self.config.port)
        for slot in self.slots:
            self._spawn(slot)
        while not self._signals:
            self._replace_dead()
            time.sleep(_POLL_SECS)
        return self._stop()

    def _prepare_run_dir(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "loads.json").unlink(missing_ok=True)
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            metrics_dir = self.run_dir / "metrics"
            shutil.rmtree(metrics_dir, ignore_errors=True)
            metrics_dir.mkdir()
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1 and self._socket is not None:
            self._socket.close()  # stop accepting at once: only the serving processes still hold it
            self._socket = None
        if self._signals > 1:
            for slot in self.slots:
                if slot.process is not None and slot.process.poll() is None:
                    slot.process.kill()

    def _spawn(self, slot: _Slot) -> None:
        assert self._socket is not None
        fd = self._socket.fileno()
        peers = HostPeers(self.run_dir, slot.index, len(self.slots))
        inherited = {name: value for name, value in os.environ.items() if name not in _NOT_INHERITED}
        # mkstemp's 0600 file, unlinked at once: it has no name for anyone to open; the serving process
        # reads it through the descriptor it inherits, and it is gone when both have closed it.
        with tempfile.TemporaryFile(dir=self.run_dir) as handover:
            handover.write(self.config.to_json().encode())
            handover.flush()
            env = {**inherited, **peers.environment(), LISTEN_FD_ENV: str(fd), SUPERVISOR_PID_ENV: str(os.getpid()),
                   CONFIG_FD_ENV: str(handover.fileno())}
            # Its own process group: a Ctrl-C at the terminal reaches the supervisor alone, which passes
            # on exactly one SIGTERM (a second signal would make uvicorn give up draining).
            slot.process = subprocess.Popen(
                [sys.executable, str(self.manage_py), "rungateway"], env=env, pass_fds=(fd, handover.fileno()),
                process_group=0,
            )
        slot.started_at = time.monotonic()
        log.info("serving process %d started (pid %d)", slot.index, slot.process.pid)

    def _replace_dead(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            process = slot.process
            if process is None:
                if now >= slot.restart_at and self._socket is not None:
                    self._spawn(slot)
                continue
            code = process.poll()
            if code is None:
                continue
            young = now - slot.started_at < _YOUNG_SECS
            slot.restarts = slot.restarts + 1 if young else 0
            pause = min(_MAX_PAUSE_SECS, 0.5 * 2 ** (slot.restarts - 1)) if slot.restarts else 0.0
            log.warning("serving process %d (pid %d) exited with %s; replacing it in %.1fs",
                        slot.index, process.pid, code, pause)
            slot.process = None
            slot.restart_at = now + pause

    def _stop(self) -> int:
        live = [slot.process for slot in self.slots if slot.process is not None and slot.process.poll() is None]
        log.info("stopping: %d serving process(es) drain for up to %gs", len(live), self.config.shutdown_grace_period_secs)
        for process in live:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.config.shutdown_grace_period_secs + _KILL_AFTER_SECS
        for process in live:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("serving process %d did not stop in time; killing it", process.pid)
                process.kill()
                process.wait()
        log.info("gateway stopped")
        return 0
