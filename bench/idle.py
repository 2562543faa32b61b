"""What an idle gateway costs: instructions and wake-ups a second with nothing to serve (issue 26/27).

``.venv/bin/python bench/idle.py [--repo PATH ...] [--no-gateway] [--smg] [--seconds 20] [--settle 10]``

One mock worker (outside the counts), health checks at the default interval. Every target (this
checkout's gateway, each ``--repo`` checkout's build run with this venv, smg 1.13.0 with ``--smg``)
runs twice, all targets of a pass at once:

- plain, for ``--seconds`` after ``--settle``: the wake-ups a second (voluntary context switches of
  every thread, from /proc: each is a sleep that ended), then ``strace -c -f`` over a second window of
  the same length (the system calls a second, the event-loop waits among them: epoll_wait/epoll_pwait/
  poll/select, which uvloop makes two of per wake-up), and the RSS at the end;
- under ``valgrind --tool=callgrind --instr-atstart=no``: counting on for ``--seconds`` once ready and
  settled (bench/instructions.py's switch), instructions a second.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gateway import REPO, gateway_argv, start_mock_worker  # noqa: E402
from bench.instructions import START_TIMEOUT_S, _callgrind, _control, _totals  # noqa: E402
from bench.peers import start_smg  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, child_env, free_port, http_get  # noqa: E402

_WAITS = ("epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select", "pselect6")


def _start(group: ProcessGroup, work: Path, tag: str, target: str, worker: str, wrap: list[str]) -> ManagedProcess:
    port = free_port()
    if target == "smg":
        return start_smg(group, work, port, worker, "0-1", wrap=wrap, timeout=START_TIMEOUT_S)
    data = work / f"data-{tag}"
    data.mkdir()
    argv = gateway_argv(port, worker, "uvicorn", repo=Path(target), extra=["--prometheus-port", str(free_port())])
    env = child_env({"GW_DATA_DIR": str(data), "DJANGO_SETTINGS_MODULE": "gateway_project.settings"})
    proc = group.start(tag, [*wrap, *argv], env=env, cwd=Path(target))
    proc.wait_ready(lambda: http_get(f"http://{LOOPBACK}:{port}/readiness", timeout=5.0)[0] == 200,
                    timeout=START_TIMEOUT_S)  # fmt: skip
    return proc


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _switches(pid: int) -> int:
    """Voluntary context switches of every thread of ``pid`` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except OSError:  # the thread ended
            continue
    return total


def _strace(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["timeout", "-s", "INT", str(seconds), "strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def _calls(out: Path) -> tuple[int, int]:
    """(all system calls, event-loop waits) from ``strace -c``'s table."""
    total = waits = 0
    for line in out.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and re.fullmatch(r"[\d.]+", fields[0]) and fields[-1] != "total":
            calls = int(fields[3])
            total += calls
            if fields[-1] in _WAITS:
                waits += calls
    return total, waits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, action="append", default=[])
    parser.add_argument("--no-gateway", action="store_true")
    parser.add_argument("--smg", action="store_true")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=10.0)
    args = parser.parse_args()
    targets = ([] if args.no_gateway else [str(REPO)]) + [str(path.resolve()) for path in args.repo]
    targets += ["smg"] if args.smg else []
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp, ProcessGroup(Path(tmp) / "logs") as group:
        work = Path(tmp)
        port = free_port()
        start_mock_worker(group, port=port, tokens=16, delay_ms=0.0, core="0-1")
        worker = f"http://{LOOPBACK}:{port}"
        names = {target: ("smg" if target == "smg" else f"gw-{i}") for i, target in enumerate(targets)}
        # Pass 1: plain processes, strace -c and RSS.
        procs = {target: _start(group, work, f"{names[target]}-plain", target, worker, []) for target in targets}
        time.sleep(args.settle)
        before = {target: _switches(proc.popen.pid) for target, proc in procs.items()}
        time.sleep(args.seconds)
        wakes = {target: (_switches(proc.popen.pid) - before[target]) / args.seconds for target, proc in procs.items()}
        traces = {t: _strace(p.popen.pid, args.seconds, work / f"{names[t]}.strace") for t, p in procs.items()}
        for trace in traces.values():
            trace.wait()
        plain = {}
        for target, proc in procs.items():
            total, waits = _calls(work / f"{names[target]}.strace")
            plain[target] = (total / args.seconds, waits / args.seconds, wakes[target], _rss_mib(proc.popen.pid))
            group.stop(proc)
        # Pass 2: callgrind.
        counted = {}
        for target in targets:
            counted[target] = _start(group, work, names[target], target, worker, _callgrind(work / f"{names[target]}.callgrind"))
        time.sleep(args.settle)
        for proc in counted.values():
            _control("-i", "on", str(proc.popen.pid))
        time.sleep(args.seconds)
        result = {}
        for target, proc in counted.items():
            pid = str(proc.popen.pid)
            _control("-i", "off", pid)
            _control("--dump=idle", pid)
            dumps = sorted(work.glob(f"{names[target]}.callgrind*"), key=lambda path: path.stat().st_mtime)
            result[target] = _totals(dumps[-1]) / args.seconds if dumps else float("nan")
        for target in targets:
            syscalls, waits, wake_ups, rss = plain[target]
            print(f"{names[target]:6} {target}\n       {result[target] / 1e6:8.2f}M instructions/s  "
                  f"{wake_ups:7.1f} wake-ups/s  {syscalls:7.1f} syscalls/s ({waits:.1f} loop waits)  "
                  f"RSS {rss:6.1f} MiB", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    if shutil.which("valgrind") is None or shutil.which("strace") is None:
        print("valgrind and strace are needed", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
