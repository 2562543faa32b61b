"""CPU the gateway spends per request: a steadier measure than latency on a shared machine.

``.venv/bin/python bench/cpu_cost.py [--server uvicorn] [--requests 2000] [--repeat 3]``

Starts the gateway pinned to core 0 and, on core 1, the nginx worker (non-streaming) and the mock
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
from bench.procs import LOOPBACK, ProcessGroup, free_port  # noqa: E402
from bench.streaming import run_streams  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU seconds of every thread of a process, to the nanosecond (schedstat), else clock ticks."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
        return total / 1e9
    except (OSError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK


def _server_pid(launcher_pid: int) -> int:
    """taskset execs the interpreter, so the launcher's pid is the gateway's."""
    return launcher_pid


def measure(server: str, requests: int, repeat: int) -> dict[str, list[float]]:
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
            proc = start_gateway(
                group, f"gw-{name}", port=port, worker_url=f"http://{LOOPBACK}:{worker_port}",
                server=server, core=0, data_dir=work / f"data-{name}",
            )
            gateways[name] = (port, _server_pid(proc.popen.pid))
        script = write_script(work / "chat.lua")
        for _ in range(repeat):
            port, pid = gateways["chat"]
            url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
            run_wrk(url, script, connections=32, threads=1, duration=1.0, core=1)  # warm
            before = cpu_seconds(pid)
            point = run_wrk(url, script, connections=32, threads=1, duration=3.0, core=1)
            results["chat"].append((cpu_seconds(pid) - before) / max(point.requests, 1) * 1e6)
            rounds = max(1, requests // 32)
            for name in ("stream-1", "stream-64"):
                port, pid = gateways[name]
                url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
                run_streams(url, streams=32, rounds=2, warmup_rounds=0, core=1)  # warm
                before = cpu_seconds(pid)
                done = run_streams(url, streams=32, rounds=rounds, warmup_rounds=0, core=1)
                results[name].append((cpu_seconds(pid) - before) / max(done.samples, 1) * 1e6)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="uvicorn", choices=("uvicorn", "daphne"))
    parser.add_argument("--requests", type=int, default=640, help="streams per streaming measurement")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    results = measure(args.server, args.requests, args.repeat)
    for name, values in results.items():
        print(f"{name:10s} CPU per request: median {statistics.median(values):7.1f} us  ({', '.join(f'{v:.1f}' for v in values)})")
    chunk = (statistics.median(results["stream-64"]) - statistics.median(results["stream-1"])) / 63
    print(f"per relayed SSE chunk: {chunk:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
