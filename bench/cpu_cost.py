"""CPU the gateway spends per request: a steadier measure than latency on a shared machine.

``.venv/bin/python bench/cpu_cost.py [--target uvicorn|daphne|smg] [--requests 640] [--repeat 3]``

Starts the gateway (or a reference peer) pinned to core 0 and, on core 1, the nginx worker (non-streaming) and the mock
worker (streaming, 1 and 64 tokens). Reads the gateway's user+system CPU time from /proc before and
after a fixed number of requests and prints microseconds of gateway CPU per request:

- ``chat``: non-streaming chat at concurrency 32 (wrk) to nginx;
- ``stream-1``: streams of one token, bursts of 32 (the per-request cost of a stream);
- ``stream-64``: streams of 64 tokens, bursts of 32; ``(stream-64 - stream-1) / 63`` is the cost of
  relaying one SSE chunk.

Latency on a busy machine swings by tens of percent; CPU time per request moves by a few. Use this
to compare changes to the request path, and ``bench/run.py`` for the targets.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gateway import start_gateway, start_mock_worker  # noqa: E402
from bench.loadgen import run_wrk, write_script  # noqa: E402
from bench.nginx import start_nginx_worker  # noqa: E402
from bench.peers import PEERS  # noqa: E402
from bench.procs import LOOPBACK, ProcessGroup, free_port  # noqa: E402
from bench.streaming import run_streams  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a peer may run its server in a child process)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                queue.extend(int(child) for child in task.read_text().split())
            except OSError:
                pass
    return found


def cpu_seconds(pid: int) -> float:
    """CPU seconds of every thread of a process and its descendants, to the nanosecond (schedstat),
    else in clock ticks."""
    total = 0.0
    for member in _process_tree(pid):
        try:
            for task in Path(f"/proc/{member}/task").iterdir():
                total += int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError):
            try:
                fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / _TICK
            except OSError:
                pass
    return total


def _start_target(
    target: str, group: ProcessGroup, work: Path, name: str, port: int, worker_url: str, workers: int = 1
) -> int:
    """Start the gateway (``uvicorn``/``daphne``, ``workers`` serving processes) or an installed peer
    (``smg``) on core 0; its pid (the CPU of its whole process tree is counted)."""
    if target in ("uvicorn", "daphne"):
        proc = start_gateway(
            group, f"gw-{name}", port=port, worker_url=worker_url, server=target, core=0,
            data_dir=work / f"data-{name}", workers=workers,
        )
    else:
        peer = PEERS[target]
        if not peer.installed:
            raise SystemExit(f"{target} is not installed: bench/run.py --install-peers")
        where = work / f"{target}-{name}"
        where.mkdir(parents=True, exist_ok=True)
        proc = peer.start(group, where, port, worker_url, 0)
    return proc.popen.pid  # taskset execs the program, so the launcher's pid is the server's


def measure(target: str, requests: int, repeat: int, workers: int = 1) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"chat": [], "stream-1": [], "stream-64": []}
    with tempfile.TemporaryDirectory(prefix="gw-cpu-") as tmp, ProcessGroup(Path(tmp) / "logs") as group:
        work = Path(tmp)
        nginx_port, mock1_port, mock64_port = free_port(), free_port(), free_port()
        start_nginx_worker(group, work / "nginx", nginx_port, core=1)
        start_mock_worker(group, port=mock1_port, tokens=1, delay_ms=5, core=1)
        start_mock_worker(group, port=mock64_port, tokens=64, delay_ms=5, core=1)
        gateways = {}
        for name, worker_port in (("chat", nginx_port), ("stream-1", mock1_port), ("stream-64", mock64_port)):
            port = free_port()
            pid = _start_target(target, group, work, name, port, f"http://{LOOPBACK}:{worker_port}", workers)
            gateways[name] = (port, pid)
        script = write_script(work / "chat.lua")
        for _ in range(repeat):
            port, pid = gateways["chat"]
            url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
            run_wrk(url, script, connections=32, threads=1, duration=1.0, core=1)  # warm
            before = cpu_seconds(pid)
            point = run_wrk(url, script, connections=32, threads=1, duration=3.0, core=1)
            results["chat"].append((cpu_seconds(pid) - before) / max(point.requests, 1) * 1e6)
            for name in ("stream-1", "stream-64"):
                # One-token streams take ~10 ms a round: five times as many keep the gateway's
                # background work (health checks, registry refresh) a small share of the window.
                rounds = max(1, requests // 32) * (5 if name == "stream-1" else 1)
                port, pid = gateways[name]
                url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
                run_streams(url, streams=32, rounds=2, warmup_rounds=0, core=1)  # warm
                before = cpu_seconds(pid)
                done = run_streams(url, streams=32, rounds=rounds, warmup_rounds=0, core=1)
                results[name].append((cpu_seconds(pid) - before) / max(done.samples, 1) * 1e6)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="uvicorn", choices=("uvicorn", "daphne", *PEERS),
                        help="the gateway under uvicorn or daphne, or an installed reference peer")
    parser.add_argument("--requests", type=int, default=640, help="streams per streaming measurement")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gateway-workers", type=int, default=1,
                        help="the gateway's --workers N, all on core 0 (the cost of running as several processes)")
    args = parser.parse_args(argv)
    results = measure(args.target, args.requests, args.repeat, args.gateway_workers)
    for name, values in results.items():
        print(f"{name:10s} CPU per request: median {statistics.median(values):7.1f} us  ({', '.join(f'{v:.1f}' for v in values)})")
    chunk = (statistics.median(results["stream-64"]) - statistics.median(results["stream-1"])) / 63
    print(f"per relayed SSE chunk: {chunk:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
