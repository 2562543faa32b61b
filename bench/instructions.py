"""Instructions per relayed request, counted by callgrind: the gateway beside smg, figures a loaded
machine does not change (CPU time per request swings with the load of other work on shared hosts).

``.venv/bin/python bench/instructions.py [--requests 1000] [--targets gateway,smg] [--api-key KEY]``
``[--repo PATH]`` (another checkout's build of the gateway, run with this venv, as ``gateway@PATH``)
``[--gateway-args '...']`` (more ``rungateway`` arguments for every gateway build)
``[--stream]`` (streamed chats of ``--stream-tokens`` tokens from the Python mock worker instead)

Each target runs under ``valgrind --tool=callgrind --instr-atstart=no`` in front of one nginx worker
answering a fixed ``chat.completion`` (bench/nginx.py), health checks on as deployed. Once it is ready
the bench sends a warm-up of requests, turns counting on (``callgrind_control -i on``), sends
``--requests`` non-streamed chat requests ``--concurrency`` at a time from this process, turns it off
and dumps: the count covers every thread of the target's process (the gateway's serving loop and its
helper threads; smg's runtime) for exactly those requests, and the background work (health checks,
samplers) of that window. The client's work is not counted.

With ``--stream`` the worker is ``standins/mock_worker.py`` (one event per token, ``--stream-delay-ms``
apart, so they come one by one; with none it sends them at once and they arrive as one chunk) and every
request asks for a stream without ``stream_options``: the case where the gateway asks the worker for
usage and takes its usage-only event out (docs/DECISIONS.md D66, D85). The worker is not counted.

Instructions are not CPU time: an interpreter and compiled code retire instructions at different
rates, and callgrind does not count the kernel. Use them beside ``bench/cpu_cost.py --relay`` (CPU
time from /proc, rounds alternated) to tell a change's own cost from the machine's noise, and for
the share of one component (``bench/accounting_cost.py`` and its callgrind counterpart) in the whole.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402

from bench.gateway import REPO, gateway_argv, start_mock_worker  # noqa: E402
from bench.nginx import start_nginx_worker  # noqa: E402
from bench.peers import PEERS, start_smg  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, child_env, free_port, http_get  # noqa: E402

START_TIMEOUT_S = 600.0  # Django and uvicorn start slowly under valgrind
WARM_UP = 200
ALL_CORES = f"0-{(os.cpu_count() or 1) - 1}"  # counted, not timed: no pinning needed
BODY = json.dumps(
    {"model": "bench-model", "messages": [{"role": "system", "content": "You are terse."},
                                         {"role": "user", "content": "hello"}]}
).encode()
STREAM_BODY = json.dumps({**json.loads(BODY), "stream": True}).encode()


def _callgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]


async def _send(url: str, count: int, concurrency: int, api_key: str | None, body: bytes = BODY) -> None:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    remaining = count
    async with aiohttp.ClientSession() as session:

        async def one_lane() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{url}: {response.status}")

        await asyncio.gather(*(one_lane() for _ in range(concurrency)))


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], capture_output=True, check=False, timeout=120)


def _totals(dump: Path) -> int:
    """The dump's event total (its ``totals:`` line; ``summary:`` is not always filled in)."""
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"{dump}: no totals")


def count(name: str, proc: ManagedProcess, port: int, work: Path, args: argparse.Namespace) -> float:
    """Instructions per request of one target started under callgrind: warmed up, then counted."""
    url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
    body = STREAM_BODY if args.stream else BODY
    asyncio.run(_send(url, WARM_UP, args.concurrency, args.api_key, body))
    pid = str(proc.popen.pid)
    _control("-i", "on", pid)
    started = time.monotonic()
    asyncio.run(_send(url, args.requests, args.concurrency, args.api_key, body))
    _control("-i", "off", pid)
    _control(f"--dump=counted-{args.requests}", pid)
    dumps = sorted(work.glob(f"{name}.callgrind.*"), key=lambda path: path.stat().st_mtime)
    if not dumps:
        raise RuntimeError(f"{name}: callgrind wrote no dump")
    per_request = _totals(dumps[-1]) / args.requests
    print(f"{name:24} {per_request:12,.0f} instructions per request "
          f"({args.requests} requests in {time.monotonic() - started:.0f} s under callgrind)", flush=True)  # fmt: skip
    return per_request


def start_counted(
    group: ProcessGroup, work: Path, number: int, repo: Path, worker_url: str, extra: list[str],
    api_key: str | None = None,
) -> tuple[str, ManagedProcess, int]:
    """The gateway of the checkout at ``repo`` started under callgrind (counting off) in front of
    ``worker_url``, its data in ``work``/data-``number``; waits for /readiness. Its tag (the dump's
    name in ``work``), its process and its port."""
    port = free_port()
    data = work / f"data-{number}"
    data.mkdir()
    argv = gateway_argv(port, worker_url, "uvicorn", api_key=api_key, repo=repo, extra=extra)
    env = child_env({"GW_DATA_DIR": str(data), "DJANGO_SETTINGS_MODULE": "gateway_project.settings"})
    tag = f"gateway-{number}"
    proc = group.start(tag, [*_callgrind(work / f"{tag}.callgrind"), *argv], env=env, cwd=repo)
    proc.wait_ready(lambda: http_get(f"http://{LOOPBACK}:{port}/readiness", timeout=5.0)[0] == 200,
                    timeout=START_TIMEOUT_S)  # fmt: skip
    return tag, proc, port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--targets", default="gateway,smg")
    parser.add_argument("--api-key", default=None, help="turn client authentication on in every target")
    parser.add_argument("--gateway-args", default="", help="more rungateway arguments for every gateway build "
                        "(e.g. '--request-log-max-rows 0')")  # fmt: skip
    parser.add_argument("--repo", type=Path, action="append", default=[],
                        help="also measure the gateway of this checkout (run with this venv)")  # fmt: skip
    parser.add_argument("--stream", action="store_true",
                        help="streamed chats from the Python mock worker (the gateway asks it for usage)")  # fmt: skip
    parser.add_argument("--stream-tokens", type=int, default=16)
    parser.add_argument("--stream-delay-ms", type=float, default=1.0,
                        help="the mock worker's pause before each event (its events then come one by one)")  # fmt: skip
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (callgrind) is needed: apt-get install valgrind", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gw-instructions-"))
    results: dict[str, float] = {}
    with ProcessGroup(work / "logs") as group:
        worker_port = free_port()
        if args.stream:
            start_mock_worker(group, port=worker_port, tokens=args.stream_tokens, delay_ms=args.stream_delay_ms,
                              core=ALL_CORES)  # fmt: skip
        else:
            start_nginx_worker(group, work / "nginx", worker_port, core=ALL_CORES)
        worker_url = f"http://{LOOPBACK}:{worker_port}"
        builds = [("gateway", REPO)] if "gateway" in args.targets.split(",") else []
        builds += [(f"gateway@{repo}", repo.resolve()) for repo in args.repo]
        for number, (name, repo) in enumerate(builds):
            tag, proc, port = start_counted(group, work, number, repo, worker_url, args.gateway_args.split(),
                                            args.api_key)  # fmt: skip
            results[name] = count(tag, proc, port, work, args)
            group.stop(proc)
        if "smg" in args.targets.split(","):
            if not PEERS["smg"].installed:
                print("smg is not installed (bench/run.py --install-peers): skipped", file=sys.stderr)
            else:
                port = free_port()
                extra = ["--api-key", args.api_key] if args.api_key else []
                proc = start_smg(group, work, port, worker_url, ALL_CORES, extra=extra,
                                 wrap=_callgrind(work / "smg.callgrind"), timeout=START_TIMEOUT_S)  # fmt: skip
                results["smg"] = count("smg", proc, port, work, args)
                group.stop(proc)
    if "smg" in results:
        for name, value in results.items():
            if name != "smg":
                print(f"{name} / smg: x{value / results['smg']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
