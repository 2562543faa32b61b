"""Our processes under test: the gateway (uvicorn or daphne) and the project's mock streaming worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Sequence

from bench.nginx import MODEL
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, child_env, http_get, pinned

__all__ = [
    "REPO", "PYTHON", "gateway_argv", "grpc_engine_argv", "mock_worker_argv", "start_gateway", "start_grpc_engine",
    "start_mock_worker",
]  # fmt: skip

REPO = Path(__file__).resolve().parent.parent
PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
MANAGE = str(REPO / "manage.py")
START_TIMEOUT_S = 60.0


def gateway_argv(
    port: int, worker_url: str, server: str, api_key: str | None = None, workers: int = 1, extra: Sequence[str] = (),
    repo: Path = REPO,
) -> list[str]:
    """``manage.py rungateway ...`` of the checkout at ``repo`` (another build: a worktree, run with
    this checkout's venv)."""
    argv = [
        PYTHON,
        str(repo / "manage.py"),
        "rungateway",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--worker-urls",
        worker_url,
        "--server",
        server,
        "--log-level",
        "warning",
        "--worker-startup-check-interval",
        "1",
    ]
    if api_key:
        argv += ["--api-key", api_key]
    if workers > 1:
        argv += ["--workers", str(workers)]
    return argv + list(extra)


def start_gateway(
    group: ProcessGroup,
    name: str,
    *,
    port: int,
    worker_url: str,
    server: str,
    core: int | str,
    data_dir: Path,
    wrap: Sequence[str] = (),
    workers: int = 1,
    extra: Sequence[str] = (),
    api_key: str | None = None,
    repo: Path = REPO,
) -> ManagedProcess:
    """The gateway pinned to ``core`` (a core or a taskset list, e.g. ``0-7``), with its SQLite file
    in ``data_dir`` and ``workers`` serving processes; waits for /readiness 200.

    ``wrap`` goes between taskset and the interpreter's arguments (e.g. ``-m cProfile -o FILE``);
    ``extra`` is appended to ``rungateway``'s arguments; ``api_key`` turns client authentication on
    (``--api-key``); ``repo``: the checkout whose build runs (default this one).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = gateway_argv(port, worker_url, server, api_key=api_key, workers=workers, extra=extra, repo=repo)
    if wrap:
        argv = [argv[0], *wrap, *argv[1:]]
    env = child_env({"GW_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "gateway_project.settings"})
    proc = group.start(name, pinned(core, argv), env=env, cwd=repo)
    url = f"http://{LOOPBACK}:{port}/readiness"
    proc.wait_ready(lambda: http_get(url)[0] == 200, timeout=START_TIMEOUT_S)
    return proc


def _has_runmockworker() -> bool:
    if not (REPO / "standins" / "management" / "commands" / "runmockworker.py").exists():
        return False
    done = subprocess.run(
        [PYTHON, MANAGE, "help", "runmockworker"],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0


def mock_worker_argv(port: int, tokens: int, delay_ms: float) -> list[str]:
    """``manage.py runmockworker ...``; until that command lands, the module's own entry point."""
    if _has_runmockworker():
        return [
            PYTHON,
            MANAGE,
            "runmockworker",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--model",
            MODEL,
            "--tokens",
            str(tokens),
            "--delay-ms",
            f"{delay_ms:g}",
        ]
    code = (
        "from standins.mock_worker import MockWorkerConfig, run_mock_worker; "
        f"run_mock_worker(MockWorkerConfig(model={MODEL!r}, tokens={tokens}, delay_ms={delay_ms!r}), "
        f"{LOOPBACK!r}, {port})"
    )
    return [PYTHON, "-c", code]


def start_mock_worker(
    group: ProcessGroup, *, port: int, tokens: int, delay_ms: float, core: int | str
) -> ManagedProcess:
    if not (REPO / "standins" / "mock_worker.py").exists():
        raise FileNotFoundError("standins/mock_worker.py is missing")
    env = child_env({"DJANGO_SETTINGS_MODULE": "gateway_project.settings"})
    proc = group.start("mockworker", pinned(core, mock_worker_argv(port, tokens, delay_ms)), env=env, cwd=REPO)
    url = f"http://{LOOPBACK}:{port}/v1/models"
    proc.wait_ready(lambda: http_get(url)[0] == 200, timeout=START_TIMEOUT_S)
    return proc


def grpc_engine_argv(
    port: int, tokenizer: Path, runtime: str = "sglang", chunk_tokens: int = 1, lean: bool = False,
    to_max_tokens: bool = False, delay_ms: float = 0.0,
) -> list[str]:
    """``manage.py runmockworker --grpc``: the gRPC engine stand-in serving ``MODEL`` with ``tokenizer``;
    ``lean``: bench/lean_engine.py, the same service without its prompt-length bookkeeping
    (``to_max_tokens``: every request runs to its token limit; ``delay_ms``: a pause before each
    streamed chunk; both lean only)."""
    common = ["--tokenizer", str(tokenizer), "--host", LOOPBACK, "--port", str(port), "--model", MODEL,
              "--runtime", runtime, "--chunk-tokens", str(chunk_tokens)]  # fmt: skip
    if lean:
        lean_only = ["--to-max-tokens"] if to_max_tokens else []
        lean_only += ["--delay-ms", f"{delay_ms:g}"] if delay_ms else []
        return [PYTHON, str(REPO / "bench" / "lean_engine.py"), *common, *lean_only]
    return [PYTHON, MANAGE, "runmockworker", "--grpc", *common]


def start_grpc_engine(
    group: ProcessGroup,
    *,
    port: int,
    tokenizer: Path,
    core: int | str,
    runtime: str = "sglang",
    chunk_tokens: int = 1,
    lean: bool = False,
    to_max_tokens: bool = False,
    delay_ms: float = 0.0,
) -> ManagedProcess:
    """The gRPC engine stand-in pinned to ``core``; waits for its "serving ... on grpc://" line."""
    env = child_env({"DJANGO_SETTINGS_MODULE": "gateway_project.settings"})
    argv = grpc_engine_argv(port, tokenizer, runtime, chunk_tokens, lean, to_max_tokens, delay_ms)
    proc = group.start(f"grpc-engine-{port}", pinned(core, argv), env=env, cwd=REPO)
    needle = f"on grpc://{LOOPBACK}:{port}"
    proc.wait_ready(lambda: needle in proc.log_path.read_text(errors="replace"), timeout=START_TIMEOUT_S)
    return proc
