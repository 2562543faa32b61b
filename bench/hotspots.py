"""Where the gateway's time goes: the uvicorn gateway under cProfile while it is loaded.

``.venv/bin/python bench/hotspots.py [--mode chat|stream|both] [--seconds 8] [--top 30] [--api-key]
[--profiler cprofile|py-spy] [--native]``

``chat`` drives POST /v1/chat/completions with wrk at c=64 through the gateway to the nginx worker;
``stream`` drives bursts of 32 concurrent streams through it to the mock worker; health checks every
5 s; ``--api-key`` (chat): the gateway authenticates clients, wrk sends the key. With ``cprofile``
(the default) the gateway runs pinned to core 0 under ``python -m cProfile``; on SIGINT uvicorn exits
cleanly and the profile is written to ``bench/results/profile-<mode>.prof`` and summarised (own time
and cumulative time). cProfile roughly doubles per-call cost, so read the shares, not the absolute
numbers. With ``py-spy`` (``.venv/bin/pip install py-spy``) the gateway runs as it is and is sampled
from outside at 250 Hz (``--native``: with the C frames of uvloop, httptools, aiohttp's parser, the
interpreter; py-spy then stops the process for each sample, which slows it and counts idle threads), to ``bench/results/profile-<mode>.txt``, summarised by own and inclusive samples.
"""

from __future__ import annotations

import argparse
import io
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gateway import PYTHON, REPO, start_gateway, start_mock_worker  # noqa: E402
from bench.loadgen import run_wrk, write_script  # noqa: E402
from bench.nginx import start_nginx_worker  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, free_port  # noqa: E402
from bench.streaming import run_streams  # noqa: E402

RESULTS = REPO / "bench" / "results"
PY_SPY = Path(PYTHON).parent / "py-spy"
API_KEY = "bench-hotspots-key"


def stop_profiled(
    group: ProcessGroup, gateway: ManagedProcess, sampler: subprocess.Popen[bytes] | None, spy: bool
) -> None:
    """Stop a profiled gateway: py-spy's ``sampler`` if still running; then the gateway, sampled by
    py-spy (``spy``) as any process, or run under cProfile with SIGINT so that the profile is written
    (uvicorn shuts down, then re-raises it as KeyboardInterrupt; cProfile writes the file on the way out)."""
    if sampler is not None and sampler.poll() is None:
        sampler.kill()
    if spy:
        group.stop(gateway)
    else:
        gateway.stop(grace=30, sig=signal.SIGINT)
        group.processes.remove(gateway)


def profile_mode(
    mode: str, seconds: float, top: int, work: Path, group: ProcessGroup, api_key: bool = False,
    profiler: str = "cprofile", native: bool = False,
) -> str:
    spy = profiler == "py-spy"
    out = RESULTS / f"profile-{mode}.{'txt' if spy else 'prof'}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    worker_port = free_port()
    if mode == "chat":
        worker = start_nginx_worker(group, work / f"nginx-{mode}", worker_port, core=1)
    else:
        worker = start_mock_worker(group, port=worker_port, tokens=64, delay_ms=5, core=1)
    port = free_port()
    gateway = start_gateway(
        group,
        f"profiled-{mode}",
        port=port,
        worker_url=f"http://{LOOPBACK}:{worker_port}",
        server="uvicorn",
        core=0,
        data_dir=work / f"data-{mode}",
        wrap=() if spy else ["-m", "cProfile", "-o", str(out)],
        extra=["--health-check-interval-secs", "5"],
        api_key=API_KEY if api_key and mode == "chat" else None,
    )
    url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
    key = API_KEY if api_key and mode == "chat" else None
    sampler: subprocess.Popen[bytes] | None = None
    script = write_script(work / "chat.lua", api_key=key)
    try:
        if spy:  # warm, then sample the gateway as it runs
            if mode == "chat":
                run_wrk(url, script, connections=64, threads=1, duration=1, core=1)
            argv = [str(PY_SPY), "record", "-p", str(gateway.popen.pid), "-d", f"{seconds:g}", "-r", "250",
                    "-f", "raw", "-o", str(out), *(["--native"] if native else ["--nonblocking"])]  # fmt: skip
            sampler = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if mode == "chat":
            point = run_wrk(url, script, connections=64, threads=1, duration=seconds + (1 if spy else 0), core=1)
            load = f"wrk c=64 {seconds:g} s: {point.rps:,.0f} req/s under the profiler ({point.requests} requests)"
        else:
            rounds = max(3, round(seconds / 0.4))
            result = run_streams(url, streams=32, rounds=rounds, warmup_rounds=1, core=1)
            load = f"{rounds} rounds x 32 streams: TTFB p50 {result.ttfb_p50_ms:.2f} ms under the profiler"
        if sampler is not None:
            sampler.wait(timeout=60)
    finally:
        stop_profiled(group, gateway, sampler, spy)
        group.stop(worker)
    if not out.exists():
        return f"{mode}: no profile written (see {gateway.log_path})"
    from bench.grpc_pipeline import pyspy_summary  # that module takes this one's summary: imported here

    return f"== {mode}: {load}\n{pyspy_summary(out, top) if spy else _summary(out, top)}"


def _summary(path: Path, top: int) -> str:
    buf = io.StringIO()
    stats = pstats.Stats(str(path), stream=buf)
    stats.strip_dirs()
    buf.write("--- by own time (tottime)\n")
    stats.sort_stats("tottime").print_stats(top)
    buf.write("--- by cumulative time\n")
    stats.sort_stats("cumulative").print_stats(top)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("chat", "stream", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--api-key", action="store_true", help="the gateway with --api-key (the load sends it)")
    parser.add_argument("--profiler", choices=("cprofile", "py-spy"), default="cprofile")
    parser.add_argument("--native", action="store_true", help="py-spy: with the C frames")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gw-hotspots-"))
    try:
        with ProcessGroup(work / "logs") as group:
            for mode in ("chat", "stream") if args.mode == "both" else (args.mode,):
                print(profile_mode(mode, args.seconds, args.top, work, group, args.api_key, args.profiler, args.native),
                      flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
