"""CPU per relayed request with tracing off and on (``--enable-trace``, docs/DECISIONS.md D74), at the
default sampling (parent-based always-on: every request traced), in-process as bench/handler_cost.py
measures the handler (the gateway's ASGI app called directly, the mock worker in the same process).

``taskset -c 0 .venv/bin/python bench/trace_cost.py [--requests 1000] [--rounds 5] [--stream]``
``.venv/bin/python bench/trace_cost.py --callgrind [--requests 1000] [--keep DIR]``

``taskset -c 0`` puts the exporter's thread on the serving loop's core; ``taskset -c 0,1`` gives it a
spare one (a host with more cores than serving processes). The CPU counted is the process's, every
thread's, either way.

``--callgrind``: instructions per request instead of CPU time, which the machine's load does not
change: each case (off, on) in a process of its own under ``valgrind --tool=callgrind``, counted over
one window of ``--requests`` requests after the warm-up (instrumentation switched on and the counts
zeroed at its start, dumped at its end; spans pending at either edge flushed first, so the window's
own spans are encoded and sent inside it). The exporter's thread and gRPC's are counted as well.
The batch processor's schedule delay is set to an hour in the children (``OTEL_BSP_SCHEDULE_DELAY``,
unless given): callgrind runs the process ~50x slower, so the default 5 s timer would fire ~50x as
often per request as in a served process and add an export of a part-batch (~0.5M instructions
each) as often as the machine's load stretches the window, 9 to 20 times in 1,000 requests (D98);
with it, the window's exports are its full batches (512 spans) and the flush at its end, as in a
process serving above ~100 traced requests a second.

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
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

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


def _callgrind(command: str) -> None:
    """``callgrind_control`` on this process (run under callgrind): ``-i on``, ``-z``, ``-d``."""
    subprocess.run(["callgrind_control", *command.split(), str(os.getpid())], check=True, capture_output=True)


def _window() -> Callable[[], float]:
    """A clock for :func:`measure` that opens the callgrind window at its first reading and dumps it
    at its second, the spans pending at each flushed first (their export counted where it belongs)."""
    readings: list[int] = []

    def clock() -> float:
        tracing.flush()
        if not readings:
            _callgrind("-i on")
            _callgrind("-z")
        else:
            _callgrind("-d window")
        readings.append(1)
        return 0.0

    return clock


def _instructions(traced: bool, endpoint: str, requests: int, stream: bool, work: Path, keep: Path | None) -> float:
    """Instructions per request of one case, counted in a process of its own under callgrind (its
    window's dump copied into ``keep`` as ``callgrind.on``/``callgrind.off``, for callgrind_annotate)."""
    out = work / f"callgrind.{'on' if traced else 'off'}"
    env = {"OTEL_BSP_SCHEDULE_DELAY": "3600000", **os.environ}
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable,
         __file__, "--callgrind-child", "on" if traced else "off", "--endpoint", endpoint, "--requests",
         str(requests)] + (["--stream"] if stream else []),
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    [dump] = [path for path in work.glob(f"{out.name}.*")]  # the window's dump (the rest: the program's end)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(dump, keep / out.name)
    summary = next(line for line in dump.read_text().splitlines() if line.startswith("summary:"))
    return int(summary.split()[1]) / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stream", action="store_true", help="one-token streams instead of chat")
    parser.add_argument("--callgrind", action="store_true", help="instructions per request under callgrind")
    parser.add_argument("--keep", type=Path, help="with --callgrind: copy the windows' dumps into this directory")
    parser.add_argument("--callgrind-child", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        os.environ.pop(name, None)  # the default sampling
    # The collector as a started gateway has it (administration/lifecycle.py): what lives as long as
    # the process frozen, the young generation collected every 10,000 allocations.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    if args.callgrind_child:
        if args.callgrind_child == "on":
            tracing.configure(True, args.endpoint)
        try:
            asyncio.run(measure(args.requests, args.stream, rounds=1, clock=_window()))
        finally:
            tracing.shutdown()
        return 0
    port = _free_port()
    collector = subprocess.Popen(
        [sys.executable, "-m", "standins.otlp_receiver", "--port", str(port)],
        cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(1.5)
        endpoint = f"127.0.0.1:{port}"
        if args.callgrind:
            with tempfile.TemporaryDirectory() as work:
                counts = {traced: _instructions(traced, endpoint, args.requests, args.stream, Path(work), args.keep)
                          for traced in (False, True)}  # fmt: skip
            kind = "stream" if args.stream else "chat"
            print(f"{kind}: off {counts[False] / 1e3:.0f}k, on {counts[True] / 1e3:.0f}k instructions per request "
                  f"(callgrind, {args.requests} requests); on/off {counts[True] / counts[False]:.3f}")
            return 0
        print(f"load average {os.getloadavg()[0]:.1f}, cores {sorted(os.sched_getaffinity(0))}", flush=True)
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
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{kind}: off {statistics.median(off):.1f} us (min {min(off):.1f}), on {statistics.median(on):.1f} us "
          f"(min {min(on):.1f}) CPU per request; on/off {statistics.median(ratios):.3f} "
          f"(rounds {min(ratios):.3f}..{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
