"""Instructions per served chat and per output token of the gRPC pipeline, counted by callgrind:
before/after figures a loaded machine does not change.

``.venv/bin/python bench/served_instructions.py [--repo PATH ...] [--no-gateway] [--smg]``
``[--whole 200] [--streams 4] [--tokens 16,64] [--parsers on|off] [--thinking off|on] [--delay-ms 150]``
``[--in-process] [--runtime sglang|vllm|tokenspeed|mlx|trtllm] [--loop asyncio|uvloop]``

The lean engine stand-in (bench/lean_engine.py, Qwen3's fixture tokenizer, one message per token,
paced ``--delay-ms`` before each so no stream's messages pile up behind the slowed gateway: the
count is the cost of one engine message, as a GPU engine sends them during decode; whole answers
unpaced) runs outside callgrind. Each target (this checkout's gateway, ``--repo`` checkouts' builds run with this venv,
smg 1.13.0 with ``--smg``) runs under ``valgrind --tool=callgrind --instr-atstart=no`` with a Qwen3
deployment's settings (``--reasoning-parser qwen3 --tool-call-parser qwen`` unless ``--parsers off``,
requests with ``chat_template_kwargs.enable_thinking`` false unless ``--thinking on``), a new number
in every prompt. Warmed up, then three counted windows (bench/instructions.py's ``callgrind_control``
switch, every thread of the process): ``--whole`` non-streamed chats of 16 tokens, 8 at a time
(instructions per request); ``--streams`` concurrent streams of each ``--tokens`` length: the slope
between the two lengths is the instructions per output token, what is left at the short length the
fixed cost per stream. Each window's count less the background's: an idle window
(``--idle-seconds``, no request) first gives the target's instructions per second with nothing to
serve, subtracted for each window's length (a paced stream's window lasts seconds). The client's
work is not counted.

The gateway's process idles at 3-4M instructions a second under callgrind (smg 0.7M), which buries
the per-token slope of paced streams. ``--in-process`` counts each build with the ASGI application
called directly instead (bench/served_inprocess.py run under callgrind in the build's tree: no
server, no background tasks; the Qwen3 parsers, thinking off): the figures for a before/after per
output token. Keep the streams from folding (the events per stream near tokens + 4; a gateway slowed
by valgrind on a busy machine falls behind a fast engine): few streams, a long ``--delay-ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402

from bench.gateway import PYTHON, REPO, grpc_engine_argv  # noqa: E402
from bench.grpc_pipeline import MARKER, MODELS, QWEN3_PARSERS, chat_body, prompt_text  # noqa: E402
from bench.instructions import ALL_CORES, START_TIMEOUT_S, _callgrind, _control, _totals, start_counted  # noqa: E402
from bench.peers import PEERS, start_smg  # noqa: E402
from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, child_env, free_port  # noqa: E402

WHOLE_TOKENS, WHOLE_CONCURRENCY, WARM_UP = 16, 8, 24
_numbers = itertools.count(10**8)


def _body(template: dict[str, Any]) -> bytes:
    return json.dumps(template).replace(MARKER, str(next(_numbers))).encode()


async def _send(url: str, template: dict[str, Any], count: int, concurrency: int) -> int:
    """``count`` requests ``concurrency`` at a time, each body read whole; the SSE events read."""
    remaining, events = count, 0
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def lane() -> None:
            nonlocal remaining, events
            while remaining > 0:
                remaining -= 1
                async with session.post(url, data=_body(template),
                                        headers={"Content-Type": "application/json"}) as response:  # fmt: skip
                    answer = await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{url}: {response.status} {answer[:300]!r}")
                    events += answer.count(b"\ndata:") + answer.startswith(b"data:")

        await asyncio.gather(*(lane() for _ in range(concurrency)))
    return events


def _counted(name: str, proc: ManagedProcess, work: Path, label: str, send: Any) -> tuple[float, Any]:
    """The instructions of ``send()``'s window less the background's (``_IDLE`` per second of the
    window: health checks, samplers, the store's jobs; a paced stream's window is long)."""
    pid = str(proc.popen.pid)
    _control("-i", "on", pid)
    started = time.monotonic()
    result = send()
    elapsed = time.monotonic() - started
    _control("-i", "off", pid)
    _control(f"--dump={label}", pid)
    dumps = sorted(work.glob(f"{name}.callgrind.*"), key=lambda path: path.stat().st_mtime)
    if not dumps:
        raise RuntimeError(f"{name}: callgrind wrote no dump")
    return _totals(dumps[-1]) - _IDLE.get(name, 0.0) * elapsed, result


_IDLE: dict[str, float] = {}  # per target: instructions per second with no request


def measure(name: str, proc: ManagedProcess, port: int, work: Path, args: argparse.Namespace) -> dict[str, float]:
    url = f"http://{LOOPBACK}:{port}/v1/chat/completions"
    prompt = prompt_text(MODELS["qwen3"].folder / "tokenizer.json", 35)
    thinking = args.thinking == "on"
    whole = chat_body(prompt, True, WHOLE_TOKENS, False, thinking)
    deadline = time.monotonic() + 120
    while True:  # the gateway answers 503 while it loads the tokenizer
        try:
            asyncio.run(_send(url, whole, 1, 1))
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    asyncio.run(_send(url, whole, WARM_UP, WHOLE_CONCURRENCY))
    low, high = args.tokens
    streams = {tokens: chat_body(prompt, True, tokens, True, thinking) for tokens in (low, high)}
    asyncio.run(_send(url, streams[low], args.streams, args.streams))
    _IDLE[name] = 0.0
    idle, _ = _counted(name, proc, work, "idle", lambda: time.sleep(args.idle_seconds))
    _IDLE[name] = idle / args.idle_seconds
    started = time.monotonic()
    total, _ = _counted(name, proc, work, "whole", lambda: asyncio.run(_send(url, whole, args.whole, WHOLE_CONCURRENCY)))
    out: dict[str, float] = {"per_request": total / args.whole, "idle_per_s": _IDLE[name]}
    for tokens, body in streams.items():
        total, events = _counted(name, proc, work, f"stream-{tokens}",
                                 lambda body=body: asyncio.run(_send(url, body, args.streams, args.streams)))  # fmt: skip
        out[f"per_stream_{tokens}"] = total / args.streams
        out[f"events_per_stream_{tokens}"] = events / args.streams
    return _sloped(name, out, low, high, f"{time.monotonic() - started:.0f} s")


def _sloped(name: str, out: dict[str, float], low: int, high: int, note: str) -> dict[str, float]:
    """``out`` with the per-token slope between the ``low`` and ``high`` token streams and the fixed
    cost per stream it leaves, printed in one line."""
    out["per_token"] = (out[f"per_stream_{high}"] - out[f"per_stream_{low}"]) / (high - low)
    out["fixed_per_stream"] = out[f"per_stream_{low}"] - low * out["per_token"]
    print(f"{name:32} {out['per_request']:12,.0f} /request {out['per_token']:10,.0f} /output token "
          f"{out['fixed_per_stream']:12,.0f} fixed /stream  events/stream {out[f'events_per_stream_{high}']:.1f} "
          f"({note})", flush=True)  # fmt: skip
    return out


def _trigger(dump: Path) -> str:
    """The name a dump was made with (``callgrind_control -d NAME``: its ``desc: Trigger: dump NAME``)."""
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("desc: Trigger:"):
            return line.rsplit(" ", 1)[-1]
    return ""


def in_process(name: str, number: int, repo: Path, engine_url: str, work: Path, args: argparse.Namespace
               ) -> dict[str, float]:  # fmt: skip
    """The build at ``repo`` counted in-process (bench/served_inprocess.py under callgrind: the ASGI
    app called directly, none of a started gateway's background work; always the Qwen3 parsers,
    thinking off)."""
    out_file = work / f"inprocess-{number}.callgrind"
    low, high = args.tokens
    argv = [*_callgrind(out_file), PYTHON, str(REPO / "bench" / "served_inprocess.py"), engine_url,
            "--streams", str(args.streams), "--tokens", f"{low},{high}", "--whole", str(args.whole),
            "--runtime", args.runtime, "--loop", args.loop]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, cwd=repo, env=child_env(), capture_output=True, text=True, timeout=3600, check=True)
    events = json.loads(done.stdout.strip().splitlines()[-1])
    counts = {_trigger(path): _totals(path) for path in work.glob(f"inprocess-{number}.callgrind.*")}
    out = {"per_request": counts["whole"] / args.whole, **events}
    for tokens in (low, high):
        out[f"per_stream_{tokens}"] = counts[f"stream-{tokens}"] / args.streams
    return _sloped(name, out, low, high, f"in-process, {time.monotonic() - started:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, action="append", default=[],
                        help="also measure the gateway of this checkout (run with this venv)")  # fmt: skip
    parser.add_argument("--no-gateway", action="store_true", help="skip this checkout's gateway")
    parser.add_argument("--smg", action="store_true", help="also count smg 1.13.0")
    parser.add_argument("--whole", type=int, default=200)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=lambda s: tuple(int(x) for x in s.split(",")), default=(16, 64))
    parser.add_argument("--parsers", choices=("on", "off"), default="on")
    parser.add_argument("--thinking", choices=("on", "off"), default="off")
    parser.add_argument("--delay-ms", type=float, default=150.0)
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="the background's window (subtracted)")
    parser.add_argument("--in-process", action="store_true",
                        help="count each build in-process (bench/served_inprocess.py: the ASGI app called directly); "
                             "smg as a process beside it with --smg")  # fmt: skip
    parser.add_argument("--runtime", default="sglang",
                        help="the lean engine's gRPC runtime (bench/lean_engine.py --runtime), the gateway's worker's with "
                             "--in-process (a started gateway detects it)")  # fmt: skip
    parser.add_argument("--gateway-args", default="", help="more rungateway arguments for every gateway build")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="--in-process: the event loop the ASGI app runs on (asyncio's stock loop, whose "
                             "wake-ups are Python, or uvloop, as a served gateway runs)")  # fmt: skip
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (callgrind) is needed: apt-get install valgrind", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="served-instructions-"))
    model = MODELS["qwen3"]
    flags = QWEN3_PARSERS if args.parsers == "on" else []
    results: dict[str, dict[str, float]] = {}
    with ProcessGroup(work / "logs") as group:
        engine_port = free_port()
        argv = [*grpc_engine_argv(engine_port, model.folder, runtime=args.runtime, lean=True, to_max_tokens=True,
                                 delay_ms=args.delay_ms),
                "--stream-delay-only"]  # fmt: skip
        engine = group.start(f"grpc-engine-{engine_port}", argv, env=child_env(), cwd=REPO)
        engine.wait_ready(lambda: f"on grpc://{LOOPBACK}:{engine_port}" in engine.log_path.read_text(errors="replace"),
                          timeout=START_TIMEOUT_S)  # fmt: skip
        engine_url = f"grpc://{LOOPBACK}:{engine_port}"
        builds = [] if args.no_gateway else [("gateway", REPO)]
        builds += [(f"gateway@{repo}", repo.resolve()) for repo in args.repo]
        for number, (name, repo) in enumerate(builds):
            if args.in_process:
                results[name] = in_process(name, number, repo, engine_url, work, args)
                continue
            tag, proc, port = start_counted(group, work, number, repo, engine_url, [*flags, *args.gateway_args.split()])
            results[name] = measure(tag, proc, port, work, args)
            group.stop(proc)
        if args.smg:
            if not PEERS["smg"].installed:
                print("smg is not installed (bench/run.py --install-peers): skipped", file=sys.stderr)
            else:
                port = free_port()
                where = work / "smg"
                where.mkdir()
                extra = ["--model-path", str(model.folder), "--tokenizer-cache-enable-l0",
                         "--tokenizer-cache-enable-l1", *flags]  # fmt: skip
                proc = start_smg(group, where, port, engine_url, ALL_CORES, extra=extra,
                                 wrap=_callgrind(work / "smg.callgrind"), timeout=START_TIMEOUT_S)  # fmt: skip
                results["smg"] = measure("smg", proc, port, work, args)
                group.stop(proc)
    if "smg" in results:
        for name, value in results.items():
            if name != "smg":
                print(f"{name} / smg: per request x{value['per_request'] / results['smg']['per_request']:.2f}, "
                      f"per output token x{value['per_token'] / results['smg']['per_token']:.2f}")  # fmt: skip
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
