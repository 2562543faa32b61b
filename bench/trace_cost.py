"""CPU per relayed request with tracing off and on (``--enable-trace``, docs/DECISIONS.md D74), at the
default sampling (parent-based always-on: every request traced), in-process as bench/handler_cost.py
measures the handler (the gateway's ASGI app called directly, the mock worker in the same process).

``taskset -c 0 .venv/bin/python bench/trace_cost.py [--requests 1000] [--rounds 5] [--stream]``

On: the request's spans (request, select_worker, attempt) go through the OTLP exporter's
BatchSpanProcessor to the stand-in collector (standins/otlp_receiver.py) in a process of its own, so
the exporter thread's CPU (encoding, gRPC) is counted in this process's CPU time and the collector's
is not. The garbage collector is set as a started gateway sets it. The machine is shared: off and on alternate, each round starting with the other one
(bench/rounds.py's rule), and the ratio is the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.handler_cost import measure  # noqa: E402  (sets Django up)
from administration.lifecycle import GC_THRESHOLDS  # noqa: E402
from common import tracing  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _case(traced: bool, endpoint: str, requests: int, stream: bool) -> float:
    if traced:
        tracing.configure(True, endpoint)
    try:
        return asyncio.run(measure(requests, stream))
    finally:
        tracing.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stream", action="store_true", help="one-token streams instead of chat")
    args = parser.parse_args()
    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        os.environ.pop(name, None)  # the default sampling
    # The collector as a started gateway has it (administration/lifecycle.py): what lives as long as
    # the process frozen, the young generation collected every 10,000 allocations.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    port = _free_port()
    collector = subprocess.Popen(
        [sys.executable, "-m", "standins.otlp_receiver", "--port", str(port)],
        cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(1.5)
        endpoint = f"127.0.0.1:{port}"
        off: list[float] = []
        on: list[float] = []
        for index in range(args.rounds):
            order = (False, True) if index % 2 == 0 else (True, False)
            for traced in order:
                cost = _case(traced, endpoint, args.requests, args.stream)
                (on if traced else off).append(cost)
                print(f"  round {index + 1} {'on ' if traced else 'off'}: {cost:.1f} us", flush=True)
    finally:
        collector.terminate()
        collector.wait(10)
    ratios = [b / a for a, b in zip(off, on)]
    kind = "stream" if args.stream else "chat"
    print(f"{kind}: off {statistics.median(off):.1f} us (min {min(off):.1f}), on {statistics.median(on):.1f} us "
          f"(min {min(on):.1f}) CPU per request; on/off {statistics.median(ratios):.3f} "
          f"(rounds {min(ratios):.3f}..{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
