"""Reference peers, each in its own venv under bench/.venvs: smg (Rust gateway) and the LiteLLM proxy.

Peers are optional. :func:`find_peers` reports which are installed; :func:`install_peers` creates the
venvs with pip. Starting a peer returns a process that answers a chat request, or raises
:class:`~bench.procs.StartError` so the caller can skip it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from bench.nginx import MODEL
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, child_env, free_port, http_get, pinned

__all__ = ["PEERS", "VENVS", "Peer", "find_peers", "install_peers", "peer_version", "start_smg"]

VENVS = Path(__file__).resolve().parent / ".venvs"
START_TIMEOUT_S = 90.0
# Any HTTP client in a peer that honours proxy variables is sent to a dead loopback port instead of
# the internet (NO_PROXY keeps 127.0.0.1 direct). Belt and braces on top of the peers' own flags.
_DEAD_PROXY = f"http://{LOOPBACK}:9"
_NO_EGRESS = {
    "HTTP_PROXY": _DEAD_PROXY,
    "HTTPS_PROXY": _DEAD_PROXY,
    "http_proxy": _DEAD_PROXY,
    "https_proxy": _DEAD_PROXY,
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


@dataclass(frozen=True)
class Peer:
    name: str
    requirement: str  # what pip installs
    executable: str  # console script inside the venv
    start: Callable[[ProcessGroup, Path, int, str, int | str], ManagedProcess]
    label: str

    @property
    def venv(self) -> Path:
        return VENVS / self.name

    @property
    def binary(self) -> Path:
        return self.venv / "bin" / self.executable

    @property
    def installed(self) -> bool:
        return self.binary.exists()


def _start_smg(group: ProcessGroup, work: Path, port: int, worker_url: str, core: int | str) -> ManagedProcess:
    return start_smg(group, work, port, worker_url, core)


def start_smg(
    group: ProcessGroup, work: Path, port: int, worker_url: str, core: int | str, extra: Sequence[str] = (),
    wrap: Sequence[str] = (), timeout: float = START_TIMEOUT_S,
) -> ManagedProcess:
    """smg pinned to ``core`` relaying to ``worker_url``, ``extra`` appended to ``smg launch``'s
    arguments (e.g. ``--model-path`` for a gRPC worker), ``wrap`` before its binary (e.g. valgrind);
    waits up to ``timeout`` seconds for /readiness 200."""
    argv = [
        *wrap,
        str(PEERS["smg"].binary),
        "launch",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--worker-urls",
        worker_url,
        "--policy",
        "round_robin",
        "--prometheus-host",
        LOOPBACK,
        "--prometheus-port",
        str(free_port()),
        "--log-level",
        "warn",
        *extra,
    ]
    proc = group.start("smg", pinned(core, argv), env=child_env(_NO_EGRESS), cwd=work)
    url = f"http://{LOOPBACK}:{port}/readiness"
    proc.wait_ready(lambda: http_get(url)[0] == 200, timeout=timeout)
    return proc


def _litellm_config(work: Path, worker_url: str) -> Path:
    path = work / "litellm.yaml"
    path.write_text(
        f"""\
model_list:
  - model_name: {MODEL}
    litellm_params:
      model: openai/{MODEL}
      api_base: {worker_url}/v1
      api_key: bench-not-a-secret
litellm_settings:
  telemetry: false
  drop_params: true
  set_verbose: false
  json_logs: false
general_settings:
  disable_spend_logs: true
  # Loopback-only throwaway process; the other targets run without auth too.
  dangerously_permit_weak_or_unset_master_key: true
"""
    )
    return path


def _start_litellm(group: ProcessGroup, work: Path, port: int, worker_url: str, core: int | str) -> ManagedProcess:
    config = _litellm_config(work, worker_url)
    argv = [
        str(PEERS["litellm"].binary),
        "--config",
        str(config),
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--num_workers",
        "1",
        "--telemetry",
        "False",
    ]
    env = child_env(
        {
            **_NO_EGRESS,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
            "LITELLM_MODE": "PRODUCTION",
            "DISABLE_SCHEMA_UPDATE": "True",
            "HOME": str(work),
        }
    )
    proc = group.start("litellm", pinned(core, argv), env=env, cwd=work)
    url = f"http://{LOOPBACK}:{port}/health/liveliness"
    proc.wait_ready(lambda: http_get(url)[0] == 200, timeout=START_TIMEOUT_S)
    return proc


PEERS: dict[str, Peer] = {
    "smg": Peer("smg", "smg==1.13.0", "smg", _start_smg, "smg (Rust)"),  # the release PERFORMANCE.md compares with
    "litellm": Peer("litellm", "litellm[proxy]", "litellm", _start_litellm, "LiteLLM proxy"),
}


def find_peers() -> dict[str, Peer]:
    """The installed peers by name."""
    return {name: peer for name, peer in PEERS.items() if peer.installed}


def peer_version(peer: Peer) -> str | None:
    """The installed distribution's version, read from the venv's metadata (no import of the package)."""
    dist = re.split(r"[\[=<>~!]", peer.requirement, maxsplit=1)[0]
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    try:
        done = subprocess.run(
            [str(peer.venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def install_peers(names: list[str] | None = None, timeout_s: float = 1500.0) -> dict[str, str]:
    """Create each peer's venv and ``pip install`` it; returns name -> "ok" or the failure."""
    outcome: dict[str, str] = {}
    for name in names or list(PEERS):
        peer = PEERS[name]
        if peer.installed:
            outcome[name] = "already installed"
            print(f"{name}: already installed in {peer.venv}", flush=True)
            continue
        print(f"installing {peer.requirement} into {peer.venv} ...", flush=True)
        python = peer.venv / "bin" / "python"
        steps = [
            [sys.executable, "-m", "venv", str(peer.venv)],
            [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
            [str(python), "-m", "pip", "install", "--quiet", peer.requirement],
        ]
        outcome[name] = "ok"
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                outcome[name] = f"timed out: {' '.join(step)}"
                break
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                outcome[name] = f"failed: {' '.join(step)}: {' | '.join(tail)}"
                break
        print(f"  {name}: {outcome[name]}", flush=True)
    return outcome
