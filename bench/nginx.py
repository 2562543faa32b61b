"""The C worker: nginx answering the OpenAI routes with fixed bodies, so it is never the bottleneck."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence

from bench.procs import LOOPBACK, ManagedProcess, ProcessGroup, http_get, pinned

__all__ = ["CHAT_COMPLETION", "MODEL", "MODELS", "NGINX", "start_nginx_worker", "write_config"]

NGINX = "/usr/sbin/nginx"
MODEL = "bench-model"
MODELS = {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "sglang"}]}
CHAT_COMPLETION = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello! How can I help you today?"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 19, "completion_tokens": 9, "total_tokens": 28},
}
# Engines' other probe endpoints, in case a peer asks for them.
_EXTRA_GET = {
    "/health": {},
    "/model_info": {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True},
    "/health_generate": {},
    "/get_model_info": {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True},
    "/get_server_info": {"version": "0.0.0-bench"},
    "/server_info": {"version": "0.0.0-bench"},
}


def _literal(payload: object) -> str:
    """A JSON body as an nginx single-quoted string."""
    text = json.dumps(payload, separators=(",", ":"))
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def write_config(prefix: Path, port: int, extra_ports: Sequence[int] = (), extra_listens: Sequence[str] = ()) -> Path:
    for sub in ("logs", "tmp/body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    listens = "\n".join(
        [f"        listen {LOOPBACK}:{extra_port};" for extra_port in extra_ports]
        + [f"        listen {address};" for address in extra_listens]
    )
    extra = "\n".join(
        f"        location = {path} {{ return 200 {_literal(body)}; }}" for path, body in _EXTRA_GET.items()
    )
    # Every listening port takes a connection slot too; each worker URL may hold a probe's, a load
    # poll's and a relay's connection.
    connections = max(4096, 4 * (1 + len(extra_ports) + len(extra_listens)))
    conf = f"""\
daemon off;
master_process on;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
worker_rlimit_nofile {connections};
events {{
    worker_connections {connections};
    multi_accept on;
}}
http {{
    access_log off;
    default_type application/json;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    client_body_buffer_size 64k;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    server_tokens off;
    server {{
        listen {LOOPBACK}:{port} backlog=4096;
{listens}
        location = /v1/chat/completions {{ return 200 {_literal(CHAT_COMPLETION)}; }}
        location = /v1/models {{ return 200 {_literal(MODELS)}; }}
{extra}
        location / {{ return 404 '{{"error":{{"message":"not found","type":"not_found"}}}}'; }}
    }}
}}
"""
    path = prefix / "nginx.conf"
    path.write_text(conf)
    return path


def start_nginx_worker(
    group: ProcessGroup, prefix: Path, port: int, core: int | str, extra_ports: Sequence[int] = (),
    extra_listens: Sequence[str] = (),
) -> ManagedProcess:
    """nginx (one worker process, pinned to ``core``) on 127.0.0.1:port (and ``extra_ports``, and
    ``extra_listens``' ``address:port`` pairs, e.g. other loopback addresses as pod IPs: one worker
    seen as many); waits until it answers."""
    if shutil.which(NGINX) is None and not Path(NGINX).exists():
        raise FileNotFoundError(f"{NGINX} not found (apt-get install nginx-light)")
    conf = write_config(prefix, port, extra_ports, extra_listens)
    proc = group.start("nginx", pinned(core, [NGINX, "-p", str(prefix), "-c", str(conf)]))
    url = f"http://{LOOPBACK}:{port}/v1/models"
    proc.wait_ready(lambda: http_get(url)[0] == 200, timeout=10)
    return proc
