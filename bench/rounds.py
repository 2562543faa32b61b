"""What the comparison benches share: rounds on a shared machine, their medians and spread, the run's
work directory and its results file.

- :func:`no_heavy_load` and :class:`TestWatch`: wait while a pytest runs, and note whether one ran
  during a measurement (:func:`watched` measures again when it did);
- :func:`measure_rounds`: ``--rounds`` rounds over cases, each round starting one case later, so a busy
  moment of the machine falls on every case alike;
- :func:`spread`, :func:`summarize_cases`, :func:`round_ratios`, :func:`summarize_with_ratios`: a
  case's median and min..max over the rounds, and the ratio of two cases as the median of the
  per-round ratios;
- :func:`render_cpu_table`: the CPU per request / token / event table of such cases;
- :func:`bench_meta`, :func:`in_work_dir`, :func:`write_results`: the machine description, a
  temporary work directory whose logs are kept under bench/results/, and the JSON results file.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bench.gateway import REPO
from bench.loadgen import WRK
from bench.machine import describe, loadavg
from bench.nginx import NGINX
from bench.peers import PEERS, peer_version
from bench.procs import ProcessGroup

RESULTS = REPO / "bench" / "results"
CPU_METRICS = ("cpu_us_per_request", "cpu_us_per_token", "cpu_us_per_event")
CASE_METRICS = (*CPU_METRICS, "rps", "tokens_per_s", "events_per_stream")

T = TypeVar("T")


def tests_running() -> bool:
    return subprocess.run(["pgrep", "-f", "pytest"], capture_output=True, check=False).returncode == 0


def no_heavy_load(wait_s: float = 1800.0) -> None:
    """Wait while a test suite runs on the machine (it would share the cores)."""
    if wait_s <= 0:
        return
    deadline = time.monotonic() + wait_s
    while tests_running():
        if time.monotonic() > deadline:
            print("  note: pytest still running; measuring anyway", flush=True)
            return
        print("  waiting for a running pytest to finish ...", flush=True)
        time.sleep(20)


class TestWatch:
    """Notes whether a pytest ran at any time while the ``with`` block ran (polled every 0.5 s)."""

    def __init__(self) -> None:
        self.seen = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            self.seen = self.seen or tests_running()

    def __enter__(self) -> TestWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def watched(measure: Callable[[], dict[str, Any]], args: argparse.Namespace, label: str,
            **extra: Any) -> dict[str, Any]:  # fmt: skip
    """``measure()`` after :func:`no_heavy_load` (``--wait-for-tests``), again (up to ``--attempts``
    times in all) while a pytest ran meanwhile; the entry with ``extra``, the load average, whether a
    pytest ran (``disturbed``) and the attempt."""
    for attempt in range(1, args.attempts + 1):
        no_heavy_load(args.wait_for_tests)
        with TestWatch() as watch:
            entry = measure()
        entry.update(**extra, loadavg=loadavg(), disturbed=watch.seen, attempt=attempt)
        if not watch.seen or args.wait_for_tests <= 0:
            break
        print(f"  {label}: a pytest ran meanwhile; measuring again", flush=True)
    return entry


def rotations(items: Sequence[T], count: int) -> Iterator[tuple[int, list[T]]]:
    """``count`` rounds over ``items``, round ``n`` starting ``n`` items later: (n, that order)."""
    for number in range(count):
        shift = number % max(len(items), 1)
        yield number, list(items[shift:]) + list(items[:shift])


class RoundCase(Protocol):
    """A case measured once per round: CPU per request, and per token and per event where it streams
    (messages_vs_chat's Case; cpu_cost's RelayCase has requests only)."""

    rounds: list[dict[str, Any]]

    def measure(self, args: argparse.Namespace) -> dict[str, Any]: ...


def measure_rounds(cases: Sequence[RoundCase], args: argparse.Namespace, label: Callable[[Any], str]) -> None:
    """``--rounds`` rotated rounds over ``cases``, each measurement :func:`watched` and appended to its
    case's ``rounds`` with a progress line."""
    for number, order in rotations(cases, args.rounds):
        for case in order:
            entry = watched(lambda: case.measure(args), args, label(case), round=number)  # noqa: B023
            case.rounds.append(entry)
            tokens = (f", {entry['cpu_us_per_token']:.2f} µs CPU/token ({entry['tokens_per_s']:,.0f} tok/s)"
                      if "cpu_us_per_token" in entry else "")  # fmt: skip
            print(
                f"  round {number + 1} {label(case)}: {entry['cpu_us_per_request']:,.1f} µs CPU/req "
                f"({entry['rps']:,.0f} req/s){tokens}, errors {entry['errors']}"
                + ("; a pytest ran meanwhile" if entry["disturbed"] else ""),
                flush=True,
            )


def spread(values: Sequence[float], digits: int = 2, round_ends: bool = False) -> dict[str, float]:
    """The median (rounded to ``digits``) and min..max (rounded too with ``round_ends``) of ``values``."""
    low, high = min(values), max(values)
    if round_ends:
        low, high = round(low, digits), round(high, digits)
    return {"median": round(statistics.median(values), digits), "min": low, "max": high}


def summarize_cases(cases: Sequence[RoundCase], key: Callable[[Any], str]) -> dict[str, Any]:
    """Per measured case (by ``key``): each of :data:`CASE_METRICS` as a :func:`spread` over its rounds,
    its errors and the rounds a pytest ran in."""
    return {
        key(case): {metric: spread([r[metric] for r in case.rounds]) for metric in CASE_METRICS} | {
            "errors": sum(r["errors"] for r in case.rounds),
            "disturbed_rounds": sum(r["disturbed"] for r in case.rounds),
        }
        for case in cases
        if case.rounds
    }  # fmt: skip


def round_ratios(base: RoundCase | None, other: RoundCase | None) -> dict[str, Any] | None:
    """``other`` / ``base`` for each of :data:`CPU_METRICS`: the median and min..max of the per-round
    ratios (each round's two numbers were taken next to each other); None unless both were measured."""
    if not base or not other or not base.rounds or not other.rounds:
        return None
    ratios: dict[str, Any] = {}
    for metric in CPU_METRICS:
        per_round = [o[metric] / b[metric] for b, o in zip(base.rounds, other.rounds) if b[metric]]
        ratios[metric] = spread(per_round, 3, round_ends=True)
    return ratios


def summarize_with_ratios(cases: Sequence[RoundCase], key: Callable[[Any], str], targets: Sequence[str],
                          base: str, other: str, name: str) -> dict[str, Any]:  # fmt: skip
    """:func:`summarize_cases`, then per target measured both ways the :func:`round_ratios` of the
    case keyed ``{target}{other}`` over the one keyed ``{target}{base}``, as ``{target}/{name}``."""
    out = summarize_cases(cases, key)
    by_key = {key(case): case for case in cases}
    for target in targets:
        ratios = round_ratios(by_key.get(f"{target}{base}"), by_key.get(f"{target}{other}"))
        if ratios is not None:
            out[f"{target}/{name}"] = ratios
    return out


def failure_lines(failures: dict[str, str]) -> list[str]:
    return [f"\n{key}: not measured: {reason}" for key, reason in failures.items()]


def render_cpu_table(summary: dict[str, Any], failures: dict[str, str], column: str, separator: str,
                     ratio_suffix: str, ratio_label: str) -> str:  # fmt: skip
    """The cases of :func:`summarize_cases` (a key ``TARGET{separator}{column}`` gives two columns),
    then the ``*/{ratio_suffix}`` entries as ``{ratio_label}`` lines, then what was not measured."""
    rows = [
        f"| target | {column} | CPU µs/req median | min..max | CPU µs/tok median | min..max | CPU µs/event "
        "| events/stream | req/s c=64 | tok/s | errors | rounds with a pytest |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, entry in summary.items():
        if key.endswith(ratio_suffix):
            continue
        req, tok = entry["cpu_us_per_request"], entry["cpu_us_per_token"]
        rows.append(
            f"| {key.replace(separator, ' | ')} | {req['median']:,.0f} | {req['min']:,.0f}..{req['max']:,.0f} "
            f"| {tok['median']:.2f} | {tok['min']:.2f}..{tok['max']:.2f} | {entry['cpu_us_per_event']['median']:.2f} "
            f"| {entry['events_per_stream']['median']:.0f} | {entry['rps']['median']:,.0f} "
            f"| {entry['tokens_per_s']['median']:,.0f} | {entry['errors']} | {entry['disturbed_rounds']} |"
        )
    for key, ratios in summary.items():
        if key.endswith(ratio_suffix):
            req, tok, ev = ratios["cpu_us_per_request"], ratios["cpu_us_per_token"], ratios["cpu_us_per_event"]
            rows.append(
                f"\n{key.split('/')[0]}: {ratio_label} CPU per request x{req['median']:.3f} "
                f"(rounds {req['min']:.3f}..{req['max']:.3f}), per output token x{tok['median']:.3f} "
                f"(rounds {tok['min']:.3f}..{tok['max']:.3f}), per event x{ev['median']:.3f} "
                f"(rounds {ev['min']:.3f}..{ev['max']:.3f})"
            )
    rows += failure_lines(failures)
    return "\n".join(rows)


def add_round_options(add: Callable[..., Any], what: str, delay_help: str) -> None:
    """The rounds, load and pytest-watch options of a rotated-rounds bench (``what``: its case)."""
    add("--rounds", type=int, default=5, help=f"rounds over every {what} (default 5)")
    add("--duration", type=float, default=3.0, help="seconds of wrk c=64 per case and round (default 3)")
    add("--warmup", type=float, default=0.5, help="seconds of wrk warm-up before each measurement (default 0.5)")
    add("--stream-rounds", type=int, default=2, help="rounds of 32 streams per case and round (default 2)")
    add("--delay-ms", type=float, default=0.0, help=delay_help)
    add("--target-core", default="0")
    add("--load-core", default="1")
    add("--wait-for-tests", type=float, default=0.0,
        help="before each measurement, wait up to this many seconds while a pytest runs (default 0: do not wait)")
    add("--attempts", type=int, default=2,
        help="with --wait-for-tests, measure again (up to this many times) when a pytest ran meanwhile")  # fmt: skip


def without_missing_smg(targets: list[str]) -> list[str]:
    """``targets`` without smg (and a note) when smg is not installed."""
    if "smg" in targets and not PEERS["smg"].installed:
        print("smg is not installed (bench/run.py --install-peers): measuring the gateway alone", file=sys.stderr)
        return [t for t in targets if t != "smg"]
    return targets


def bench_meta() -> dict[str, Any]:
    """The machine, the tools and smg's version (None when not installed)."""
    meta = describe(REPO, NGINX, WRK)
    meta["smg_version"] = peer_version(PEERS["smg"]) if PEERS["smg"].installed else None
    return meta


def in_work_dir(prefix: str, logs: str, body: Callable[[ProcessGroup, Path], T]) -> T | None:
    """``body(group, work)`` in a new temporary directory ``work`` (its processes logging to
    ``work/logs``, all stopped after); the logs then replace bench/results/``logs`` and the directory
    is removed. None when interrupted (Ctrl-C, or SIGTERM through bench/run.py's handler)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with ProcessGroup(work / "logs") as group:
            return body(group, work)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping everything", file=sys.stderr)
        return None
    finally:
        kept = RESULTS / logs
        shutil.rmtree(kept, ignore_errors=True)
        if (work / "logs").is_dir():
            shutil.copytree(work / "logs", kept, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def write_results(args: argparse.Namespace, meta: dict[str, Any], report: str, **sections: Any) -> None:
    """Print ``report``, then write ``--output``: the meta (with the load average now), the options and
    ``sections``."""
    meta["loadavg_end"] = loadavg()
    print()
    print(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"meta": meta, "config": vars(args) | {"output": str(args.output)}, **sections},
                                      indent=2, default=str))  # fmt: skip
    print(f"\nwrote {args.output}")
