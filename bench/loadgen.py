"""Non-streaming load with wrk: a POST /v1/chat/completions lua script and its parsed results."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.nginx import MODEL
from bench.procs import LOOPBACK, child_env, pinned

__all__ = ["CHAT_REQUEST", "WRK", "LoadResult", "run_wrk", "write_script"]

WRK = "/usr/bin/wrk"
CHAT_REQUEST: dict[str, Any] = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Say hello in one short sentence."},
    ],
    "max_tokens": 16,
    "temperature": 0,
}
_MARKER = "BENCH_JSON "

_SCRIPT = """\
wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
{auth}
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{marker}{{"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d,' ..
    '"err_connect":%d,"err_read":%d,"err_write":%d,"err_status":%d,"err_timeout":%d}}\\n',
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


@dataclass(frozen=True)
class LoadResult:
    connections: int
    threads: int
    requests: int
    duration_s: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    errors: int
    non_2xx: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_UNIQUE = """\
local unique_head, unique_tail, unique_n = {head}, {tail}, {base}
function request()
  unique_n = unique_n + 1
  return wrk.format(nil, nil, nil, unique_head .. unique_n .. unique_tail)
end
"""


def write_script(
    path: Path,
    body: dict[str, Any] | None = None,
    api_key: str | None = None,
    unique_marker: str | None = None,
    unique_base: int = 0,
) -> Path:
    """The wrk script POSTing ``body``; with ``unique_marker`` (a string inside the body), every
    request replaces it with the next number after ``unique_base`` (use one thread: the counter is
    per wrk thread), so no two requests carry the same body."""
    auth = f'wrk.headers["Authorization"] = {_lua_string("Bearer " + api_key)}' if api_key else ""
    encoded = json.dumps(body or CHAT_REQUEST, separators=(",", ":"))
    text = _SCRIPT.format(body=_lua_string(encoded), auth=auth, marker=_MARKER)
    if unique_marker:
        head, found, tail = encoded.partition(unique_marker)
        if not found:
            raise ValueError(f"{unique_marker!r} is not in the body")
        text += _UNIQUE.format(head=_lua_string(head), tail=_lua_string(tail), base=int(unique_base))
    path.write_text(text)
    return path


def run_wrk(
    url: str,
    script: Path,
    *,
    connections: int,
    threads: int,
    duration: float,
    core: int | str,
    timeout_s: float = 10.0,
) -> LoadResult:
    """One wrk run (``--latency``) pinned to ``core``; raises RuntimeError if wrk fails."""
    if not url.startswith(f"http://{LOOPBACK}:"):
        raise ValueError(f"refusing non-loopback URL {url!r}")
    seconds = max(1, round(duration))
    argv = pinned(
        core,
        [
            WRK,
            f"-t{threads}",
            f"-c{connections}",
            f"-d{seconds}s",
            f"--timeout={timeout_s:g}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
    )
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=seconds + timeout_s + 30, env=child_env(), check=False
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(_MARKER)), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()[-500:]}")
    raw = json.loads(line[len(_MARKER) :])
    duration_s = raw["duration_us"] / 1e6
    errors = raw["err_connect"] + raw["err_read"] + raw["err_write"] + raw["err_timeout"]
    # Requests that failed at the socket level never got a response; rps counts answered ones.
    return LoadResult(
        connections=connections,
        threads=threads,
        requests=raw["requests"],
        duration_s=round(duration_s, 3),
        rps=round(raw["requests"] / duration_s, 1) if duration_s > 0 else 0.0,
        p50_ms=raw["p50_us"] / 1000,
        p90_ms=raw["p90_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        mean_ms=round(raw["mean_us"] / 1000, 3),
        max_ms=raw["max_us"] / 1000,
        errors=errors,
        non_2xx=raw["err_status"],
    )
