"""Time from exec to ``/liveness`` 200: the gateway's own start-up (issue 26 item 5, D118).

``.venv/bin/python bench/start_time.py [--rounds 5] [--store fresh|migrated|both] [--targets HEAD,PATH...]``

Each round starts ``manage.py rungateway`` (no worker URLs, log level warning) on a free port,
polls ``/liveness`` every 5 ms, and takes the wall time from the exec to the first 200 and the CPU
seconds of the process tree at that moment (and its RSS) (bench/cpu_cost.py's ``cpu_seconds``: every thread,
from /proc). ``fresh``: a new ``GW_DATA_DIR`` every round, so the embedded SQLite store is created
and migrated; ``migrated``: one data directory migrated before the first round. A target ``PATH``
is another checkout (``git archive REV | tar -x -C PATH``) run with this checkout's venv: the
targets alternate within each round, the order rotated, so an A/B shares the machine's load.
``--database-url postgres://...``: every start on that
Postgres store (migrated once before the rounds). Prints the median and min..max per target and store.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu_cost import cpu_seconds  # noqa: E402
from bench.machine import loadavg  # noqa: E402
from bench.procs import LOOPBACK, child_env, free_port  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PYTHON = str(REPO / ".venv" / "bin" / "python")


def _live(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/liveness", timeout=1) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_once(checkout: Path, data_dir: Path, extra: list[str], database_url: str = "",
               timeout: float = 60.0) -> tuple[float, float, float]:
    """Wall seconds from exec to /liveness 200, CPU seconds of the process tree by then and the
    process's RSS (MiB) then."""
    port = free_port()
    env = child_env({"GW_DATA_DIR": str(data_dir), **({"DATABASE_URL": database_url} if database_url else {})})
    argv = [PYTHON, str(checkout / "manage.py"), "rungateway", "--host", LOOPBACK, "--port", str(port),
            "--log-level", "warning", *extra]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        while not _live(port):
            if proc.poll() is not None:
                raise RuntimeError(f"{checkout}: exited {proc.returncode}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"{checkout}: no /liveness in {timeout} s")
            time.sleep(0.005)
        wall = time.monotonic() - started
        cpu = cpu_seconds(proc.pid)
        rss = _rss_mib(proc.pid)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
    return wall, cpu, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store", choices=("fresh", "migrated", "both"), default="both")
    parser.add_argument("--targets", default="HEAD", help="comma-separated: HEAD (this checkout) or a checkout's path")
    parser.add_argument("--args", default="", help="more rungateway flags, one string")
    parser.add_argument("--database-url", default="", help="a Postgres store (migrated before the rounds; --store migrated)")
    args = parser.parse_args()
    targets = [REPO if name == "HEAD" else Path(name).resolve() for name in args.targets.split(",")]
    stores = ("fresh", "migrated") if args.store == "both" and not args.database_url else (args.store,)
    if args.database_url:
        stores = ("migrated",)
        subprocess.run([PYTHON, str(REPO / "manage.py"), "migrate", "--verbosity", "0"], cwd=REPO, check=True,
                       env=child_env({"DATABASE_URL": args.database_url}))
    extra = args.args.split()
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    print(f"load average at start: {loadavg()}")
    with tempfile.TemporaryDirectory(prefix="gw-start-") as work:
        migrated = {target: Path(work) / f"migrated-{index}" for index, target in enumerate(targets)}
        for target, data_dir in migrated.items():
            start_once(target, data_dir, extra, args.database_url)  # migrates the store once; not counted
        for round_ in range(args.rounds):
            order = targets[round_ % len(targets):] + targets[:round_ % len(targets)]
            for store in stores:
                for target in order:
                    data_dir = migrated[target] if store == "migrated" else Path(work) / f"fresh-{round_}-{id(target)}"
                    results.setdefault((str(target), store), []).append(start_once(target, data_dir, extra, args.database_url))
    print(f"load average at end: {loadavg()}")
    for (target, store), samples in results.items():
        walls = [wall for wall, _, _ in samples]
        cpus = [cpu for _, cpu, _ in samples]
        rss = [mib for _, _, mib in samples]
        print(f"{target} {store}: to /liveness {statistics.median(walls):.3f} s ({min(walls):.3f}..{max(walls):.3f}), "
              f"CPU {statistics.median(cpus):.3f} s ({min(cpus):.3f}..{max(cpus):.3f}), "
              f"RSS {statistics.median(rss):.1f} MiB, {len(samples)} rounds")


if __name__ == "__main__":
    main()
