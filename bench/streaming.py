"""Streaming TTFB: runs :mod:`bench.ttfb_client` pinned to a core and summarises its samples."""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from bench.gateway import PYTHON
from bench.nginx import MODEL
from bench.procs import LOOPBACK, child_env, pinned

__all__ = ["StreamResult", "percentile", "run_streams", "run_streams_multi"]

CLIENT = str(Path(__file__).resolve().parent / "ttfb_client.py")


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (``pct`` in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * pct / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class StreamResult:
    streams: int
    rounds: int
    samples: int
    errors: int
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    headers_p50_ms: float
    total_p50_ms: float
    error_samples: tuple[str, ...] = ()
    elapsed_s: float = 0.0  # wall time of the measured rounds
    events_per_stream: float = 0.0  # mean SSE events a stream carried ([DONE] included)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["error_samples"] = list(self.error_samples)
        return data


def _summarize(raw: dict[str, Any], streams: int, rounds: int) -> StreamResult:
    ttfb: list[float] = raw["ttfb_ms"]
    if not ttfb:
        raise RuntimeError(f"no successful streams from {raw['url']}; errors: {raw['error_samples']}")
    return StreamResult(
        streams=streams,
        rounds=rounds,
        samples=len(ttfb),
        errors=int(raw["errors"]),
        ttfb_p50_ms=round(percentile(ttfb, 50), 3),
        ttfb_p99_ms=round(percentile(ttfb, 99), 3),
        headers_p50_ms=round(percentile(raw["headers_ms"], 50), 3),
        total_p50_ms=round(percentile(raw["total_ms"], 50), 3),
        error_samples=tuple(raw["error_samples"]),
        events_per_stream=round(sum(raw.get("events") or [0]) / max(len(raw.get("events") or []), 1), 1),
        elapsed_s=round(float(raw.get("elapsed_s", 0.0)), 4),
    )


def run_streams_multi(
    urls: Sequence[str],
    *,
    streams: int,
    rounds: int,
    warmup_rounds: int,
    core: int | str,
    timeout_s: float = 30.0,
    body: Path | None = None,
    unique_marker: str | None = None,
    unique_base: int = 0,
) -> list[StreamResult]:
    """``streams`` concurrent streaming chat requests per round, rounds alternating over ``urls``;
    ``body`` a JSON file sent instead of the client's default, ``unique_marker`` a string in it that
    every request replaces with a new number (after ``unique_base``)."""
    for url in urls:
        if not url.startswith(f"http://{LOOPBACK}:"):
            raise ValueError(f"refusing non-loopback URL {url!r}")
    argv = [PYTHON, CLIENT, "--model", MODEL, "--streams", str(streams), "--rounds", str(rounds)]
    argv += ["--warmup-rounds", str(warmup_rounds), "--timeout", f"{timeout_s:g}"]
    for url in urls:
        argv += ["--url", url]
    if body is not None:
        argv += ["--body", str(body)]
    if unique_marker:
        argv += ["--unique-marker", unique_marker, "--unique-base", str(unique_base)]
    budget = (rounds + warmup_rounds) * len(urls) * (timeout_s + 1) + 30
    done = subprocess.run(
        pinned(core, argv), capture_output=True, text=True, timeout=budget, env=child_env(), check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"stream client failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    raws = json.loads(done.stdout.strip().splitlines()[-1])
    return [_summarize(raw, streams, rounds) for raw in raws]


def run_streams(
    url: str,
    *,
    streams: int,
    rounds: int,
    warmup_rounds: int,
    core: int | str,
    timeout_s: float = 30.0,
    body: Path | None = None,
    unique_marker: str | None = None,
    unique_base: int = 0,
) -> StreamResult:
    """``streams`` concurrent streaming chat requests per round against one URL."""
    return run_streams_multi(
        [url], streams=streams, rounds=rounds, warmup_rounds=warmup_rounds, core=core, timeout_s=timeout_s,
        body=body, unique_marker=unique_marker, unique_base=unique_base,
    )[0]  # fmt: skip
