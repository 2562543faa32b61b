"""System calls per relayed request, counted by strace: the gateway beside smg (issue 27, D86).

``.venv/bin/python bench/syscalls.py [--requests 2000] [--targets gateway,smg] [--api-key KEY]``
``[--repo PATH]`` (another checkout's build, as ``gateway@PATH``) ``[--gateway-args '...']``

Instructions (bench/instructions.py) do not count the kernel: a system call costs the process CPU
time that no instruction count shows (on Python 3.11 every ``asyncio.get_running_loop()`` was a
``getpid()``; uvicorn wrote a response's head and body in two writes). Each target runs in front of
one nginx worker (bench/nginx.py); after a warm-up, ``strace -c -f`` is attached to the process (every
thread) for ``--requests`` non-streamed chat requests sent ``--concurrency`` at a time, and the
summary's calls are divided by the requests. The window also holds the background work of its
seconds (health checks, samplers), as bench/instructions.py's does. strace slows the target: read
the counts, not the time.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gateway import REPO, gateway_argv  # noqa: E402
from bench.instructions import _send  # noqa: E402
from bench.nginx import start_nginx_worker  # noqa: E402
from bench.peers import PEERS, start_smg  # noqa: E402
from bench.procs import LOOPBACK, ProcessGroup, child_env, free_port, http_get  # noqa: E402

WARM_UP = 300
ALL_CORES = "0-1"


def count(name: str, pid: int, port: int, work: Path, args: argparse.Namespace) -> float:
    """System calls per request of the running target ``pid``, with the summary's top lines printed."""
    url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
    asyncio.run(_send(url, WARM_UP, args.concurrency, args.api_key))
    out = work / f"strace-{name.replace('/', '_')}.txt"
    tracer = subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(pid)], stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached to every thread before the window opens
    asyncio.run(_send(url, args.requests, args.concurrency, args.api_key))
    tracer.send_signal(signal.SIGINT)
    tracer.wait(timeout=60)
    lines = out.read_text().splitlines()
    total = next(line for line in lines if line.rstrip().endswith("total"))
    calls = int(total.split()[3])  # % time, seconds, usecs/call, calls, [errors,] total
    print(f"== {name}: {calls / args.requests:.2f} system calls per request ({args.requests} requests)")
    for line in lines[2:12]:
        if not line.startswith("-"):
            print("   " + line)
    return calls / args.requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--targets", default="gateway,smg")
    parser.add_argument("--api-key", default=None, help="turn client authentication on in every target")
    parser.add_argument("--gateway-args", default="", help="more rungateway arguments for every gateway build")
    parser.add_argument("--repo", type=Path, action="append", default=[],
                        help="also measure the gateway of this checkout (run with this venv)")  # fmt: skip
    args = parser.parse_args()
    if shutil.which("strace") is None:
        print("strace is needed: apt-get install strace", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gw-syscalls-"))
    with ProcessGroup(work / "logs") as group:
        worker_port = free_port()
        start_nginx_worker(group, work / "nginx", worker_port, core=ALL_CORES)
        worker_url = f"http://{LOOPBACK}:{worker_port}"
        builds = [("gateway", REPO)] if "gateway" in args.targets.split(",") else []
        builds += [(f"gateway@{repo}", repo.resolve()) for repo in args.repo]
        for number, (name, repo) in enumerate(builds):
            port = free_port()
            data = work / f"data-{number}"
            data.mkdir()
            argv = gateway_argv(port, worker_url, "uvicorn", api_key=args.api_key, repo=repo,
                                extra=args.gateway_args.split())  # fmt: skip
            env = child_env({"GW_DATA_DIR": str(data), "DJANGO_SETTINGS_MODULE": "gateway_project.settings"})
            proc = group.start(f"gateway-{number}", argv, env=env, cwd=repo)
            proc.wait_ready(lambda: http_get(f"http://{LOOPBACK}:{port}/readiness", timeout=5.0)[0] == 200,
                            timeout=120)  # fmt: skip
            count(name, proc.popen.pid, port, work, args)
            group.stop(proc)
        if "smg" in args.targets.split(","):
            if not PEERS["smg"].installed:
                print("smg is not installed (bench/run.py --install-peers): skipped", file=sys.stderr)
            else:
                port = free_port()
                extra = ["--api-key", args.api_key] if args.api_key else []
                proc = start_smg(group, work, port, worker_url, ALL_CORES, extra=extra)
                count("smg", proc.popen.pid, port, work, args)
                group.stop(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
