"""Probes (spec 3, Probes and metrics): /health and /liveness say the process is alive; /readiness
says it can take traffic: at least one routable worker or a ready prefill/decode pair (same pairing
key; as the reference answers for a PD deployment), not shutting down, and a request for each
ready model would be served (the tokenizer of every ready engine worker loaded; relayed HTTP workers
need none). Readiness reads in-process state only (the registry snapshot, the tokenizer cache); a
tokenizer not loaded yet starts loading on its thread, and the answer is 503 until it is. A process
that started while its store did not answer has no snapshot yet: 503, and ``waiting_for`` names what
it waits for ("store") until the first snapshot is loaded."""

from __future__ import annotations

from inference import errors
from inference.asgi_io import Receive, Scope, Send, send_error, send_json
from inference.dataplane import data_plane
from inference.served.base import models_without_tokenizer

__all__ = ["liveness", "readiness"]


async def _only_get(scope: Scope, send: Send) -> bool:
    if scope["method"] in ("GET", "HEAD"):
        return True
    await send_error(send, errors.method_not_allowed(scope["method"], scope["path"], "GET"))
    return False


async def liveness(scope: Scope, receive: Receive, send: Send) -> None:
    if await _only_get(scope, send):
        await send_json(send, 200, {"status": "ok"})


async def readiness(scope: Scope, receive: Receive, send: Send) -> None:
    if not await _only_get(scope, send):
        return
    dp = data_plane()
    snapshot = dp.registry.snapshot
    prefills, decodes = snapshot.pd.members(None)
    ready = len(snapshot.routable) + len(prefills) + len(decodes)
    servable = bool(snapshot.routable) or snapshot.pd.has_pair()
    waiting = models_without_tokenizer(snapshot) if servable and not dp.draining else ()
    loaded = dp.waiting_for is None
    status = "draining" if dp.draining else "ready" if servable and not waiting and loaded else "not_ready"
    body: dict[str, object] = {"status": status, "workers": {"ready": ready, "total": len(snapshot.workers)}}
    if not loaded and not dp.draining:
        body["waiting_for"] = dp.waiting_for
    if waiting:
        body["models_without_tokenizer"] = list(waiting)
    await send_json(send, 200 if status == "ready" else 503, body)
