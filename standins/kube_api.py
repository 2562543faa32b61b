"""A stand-in Kubernetes API server for pods: what worker discovery reads, over real HTTP, so the
gateway's client library (kubernetes_asyncio) is driven as against a cluster.

Routes: ``GET /api/v1/pods`` and ``GET /api/v1/namespaces/{namespace}/pods``, as the API server
answers them:

* a list (``labelSelector`` of ``key=value`` pairs, all must match; ``limit`` and ``continue``
  pages) answers a PodList whose ``metadata.resourceVersion`` is the store's current one;
* ``watch=true`` streams one JSON event per line (ADDED, MODIFIED, DELETED; BOOKMARK before a
  watch's ``timeoutSeconds`` end when ``allowWatchBookmarks``) of every change after the given
  ``resourceVersion``; a pod whose change makes it match or stop matching the selector is ADDED or
  DELETED for that watch. A resourceVersion older than the kept history (see :meth:`KubeApi.compact`)
  is answered by an ERROR event with a 410 Gone Status, as the API server does.

Test controls: :meth:`KubeApi.add_pod`, :meth:`KubeApi.set_ready`, :meth:`KubeApi.delete_pod` change
the pods (each change a new resourceVersion); :meth:`KubeApi.break_watches` cuts every open watch's
connection mid-stream; :meth:`KubeApi.compact` forgets the history so resuming gets 410;
:meth:`KubeApi.fail_next` answers the next requests with an error status. ``requests`` records each
request's path and query.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

__all__ = ["KubeApi", "serve_kube_api"]


@dataclass
class _Event:
    version: int
    before: dict[str, Any] | None  # None: the pod was created
    after: dict[str, Any] | None  # None: the pod was deleted


def _selector(text: str) -> list[tuple[str, str]]:
    pairs = []
    for part in filter(None, text.split(",")):
        key, _, value = part.replace("==", "=").partition("=")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _matches(pod: dict[str, Any] | None, namespace: str | None, selector: list[tuple[str, str]]) -> bool:
    if pod is None:
        return False
    metadata = pod["metadata"]
    if namespace is not None and metadata["namespace"] != namespace:
        return False
    labels = metadata.get("labels") or {}
    return all(labels.get(key) == value for key, value in selector)


def _true(value: str | None) -> bool:
    """A boolean query parameter as the API server parses it (Go's ParseBool)."""
    return (value or "").lower() in ("1", "t", "true")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


@dataclass
class KubeApi:
    version: int = 1000
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[_Event] = field(default_factory=list)
    oldest: int = 1000  # watches may resume from this resourceVersion on; older: 410 Gone
    requests: list[dict[str, Any]] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)  # statuses the next requests are answered with
    _changed: asyncio.Condition | None = None
    _watches: set[asyncio.BaseTransport] = field(default_factory=set)  # open watches' connections

    # --- test controls ------------------------------------------------------------------------
    def add_pod(
        self, name: str, ip: str | None, labels: dict[str, str], *, namespace: str = "default", ready: bool = True,
        phase: str = "Running", annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        pod = {
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "labels": dict(labels),
                         "annotations": dict(annotations or {})},
            "spec": {"containers": [{"name": "engine"}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       **({"podIP": ip} if ip else {})},
        }
        self._change((namespace, name), pod)
        return pod

    def schedule(self, name: str, ip: str, *, namespace: str = "default") -> None:
        """A pending pod scheduled: Running with its IP, not yet Ready."""
        pod = copy.deepcopy(self.pods[(namespace, name)])
        pod["status"].update(phase="Running", podIP=ip)
        self._change((namespace, name), pod)

    def set_ready(self, name: str, ready: bool, *, namespace: str = "default") -> None:
        pod = copy.deepcopy(self.pods[(namespace, name)])
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        self._change((namespace, name), pod)

    def relabel(self, name: str, labels: dict[str, str], *, namespace: str = "default") -> None:
        pod = copy.deepcopy(self.pods[(namespace, name)])
        pod["metadata"]["labels"] = dict(labels)
        self._change((namespace, name), pod)

    def delete_pod(self, name: str, *, namespace: str = "default") -> None:
        self._change((namespace, name), None)

    def compact(self) -> None:
        """Forget the change history: a watch resuming from any resourceVersion given so far gets 410 Gone
        (as when the API server's watch cache moved past it)."""
        self.events.clear()
        self.oldest = self.version + 1

    def break_watches(self) -> None:
        """Cut every open watch's connection without ending its response."""
        for transport in list(self._watches):
            transport.abort()  # type: ignore[attr-defined]
        self._watches.clear()

    def fail_next(self, status: int, count: int = 1) -> None:
        self.failures.extend([status] * count)

    def watch_requests(self) -> list[dict[str, str]]:
        return [entry["query"] for entry in self.requests if _true(entry["query"].get("watch"))]

    def list_requests(self) -> list[dict[str, str]]:
        return [entry["query"] for entry in self.requests if not _true(entry["query"].get("watch"))]

    # --- the store ----------------------------------------------------------------------------
    def _change(self, key: tuple[str, str], pod: dict[str, Any] | None) -> None:
        self.version += 1
        before = self.pods.get(key)
        if pod is None:
            self.pods.pop(key, None)
            if before is None:
                return
            after = None
            before = copy.deepcopy(before)
            before["metadata"]["resourceVersion"] = str(self.version)
        else:
            pod["metadata"]["resourceVersion"] = str(self.version)
            self.pods[key] = after = pod
        self.events.append(_Event(self.version, before, copy.deepcopy(after) if after else None))
        if self._changed is not None:
            condition = self._changed

            async def wake() -> None:
                async with condition:
                    condition.notify_all()

            asyncio.ensure_future(wake())

    # --- HTTP ---------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/pods", self._pods)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._pods)
        return app

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append({"path": request.path, "query": query})
        if self.failures:
            code = self.failures.pop(0)
            return web.json_response(_status(code, "InternalError", "stand-in failure"), status=code)
        namespace = request.match_info.get("namespace")
        selector = _selector(query.get("labelSelector", ""))
        if _true(query.get("watch")):
            return await self._watch(request, namespace, selector, query)
        matching = sorted(
            (pod for pod in self.pods.values() if _matches(pod, namespace, selector)),
            key=lambda pod: (pod["metadata"]["namespace"], pod["metadata"]["name"]),
        )
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(matching) or 1
        page = matching[start:start + limit]
        metadata: dict[str, Any] = {"resourceVersion": str(self.version)}
        if start + limit < len(matching):
            metadata["continue"] = str(start + limit)
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": page},
                                 dumps=lambda value: orjson.dumps(value).decode())

    async def _watch(
        self, request: web.Request, namespace: str | None, selector: list[tuple[str, str]], query: dict[str, str]
    ) -> web.StreamResponse:
        if self._changed is None:
            self._changed = asyncio.Condition()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        transport = request.transport
        if transport is not None:
            self._watches.add(transport)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(query.get("timeoutSeconds") or 1800)
        given = query.get("resourceVersion")
        try:
            if given not in (None, "", "0") and int(given) < self.oldest:
                gone = _status(410, "Expired", f"too old resource version: {given} ({self.oldest})")
                await response.write(orjson.dumps({"type": "ERROR", "object": gone}) + b"\n")
                await response.write_eof()
                return response
            cursor = int(given) if given not in (None, "", "0") else self.version
            if given in (None, "", "0"):  # no version: the current pods first, as ADDED
                for pod in list(self.pods.values()):
                    if _matches(pod, namespace, selector):
                        await response.write(orjson.dumps({"type": "ADDED", "object": pod}) + b"\n")
            while True:
                for event in [event for event in self.events if event.version > cursor]:
                    cursor = event.version
                    line = self._event_line(event, namespace, selector)
                    if line is not None:
                        await response.write(line)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait(), remaining)
                    except TimeoutError:
                        pass
            if _true(query.get("allowWatchBookmarks")):
                bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(cursor)}}
                await response.write(orjson.dumps({"type": "BOOKMARK", "object": bookmark}) + b"\n")
            await response.write_eof()
        except (ConnectionResetError, RuntimeError):  # cut by break_watches or the client
            pass
        finally:
            if transport is not None:
                self._watches.discard(transport)
        return response

    @staticmethod
    def _event_line(event: _Event, namespace: str | None, selector: list[tuple[str, str]]) -> bytes | None:
        was, now = _matches(event.before, namespace, selector), _matches(event.after, namespace, selector)
        if was and now:
            kind, pod = "MODIFIED", event.after
        elif now:
            kind, pod = "ADDED", event.after
        elif was:
            kind, pod = "DELETED", event.after or event.before
        else:
            return None
        return orjson.dumps({"type": kind, "object": pod}) + b"\n"


async def serve_kube_api(api: KubeApi, host: str = "127.0.0.1") -> tuple[str, web.AppRunner]:
    """Serve ``api`` on a free port of ``host`` in the running loop: its base URL and the runner
    (``await runner.cleanup()`` stops it)."""
    runner = web.AppRunner(api.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    return f"http://{host}:{port}", runner


def main(argv: list[str] | None = None) -> None:
    """``python -m standins.kube_api --port N --pods FILE``: serve the pods listed in FILE (a JSON list
    of ``{"name", "ip", "labels"}``, every one Running and Ready) until stopped, in a process of its
    own (the fleet bench's API server for the gateway and smg alike). ``--scale-up``: none of them
    exists until the first watch; then they come as a Deployment scaled up brings them, in waves of
    ``--wave`` pods: each ADDED Pending, then Running with its IP, then Ready (three events a pod)."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description="stand-in Kubernetes API server (pods)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pods", default="", help="JSON list of {name, ip, labels[, namespace]}")
    parser.add_argument("--scale-up", action="store_true", help="the pods come after the first watch")
    parser.add_argument("--wave", type=int, default=100, help="pods a wave of --scale-up brings")
    args = parser.parse_args(argv)
    api = KubeApi()
    pods = json.loads(Path(args.pods).read_text()) if args.pods else []
    if not args.scale_up:
        for pod in pods:
            api.add_pod(pod["name"], pod["ip"], pod.get("labels") or {}, namespace=pod.get("namespace") or "default")
        api.events.clear()  # the pods exist from the start: no history to replay
        api.oldest = api.version

    async def scale_up() -> None:
        while not api.watch_requests():
            await asyncio.sleep(0.05)
        for start in range(0, len(pods), max(1, args.wave)):
            wave = pods[start:start + max(1, args.wave)]
            for pod in wave:
                api.add_pod(pod["name"], None, pod.get("labels") or {}, namespace=pod.get("namespace") or "default",
                            ready=False, phase="Pending")
            await asyncio.sleep(0.05)
            for pod in wave:
                api.schedule(pod["name"], pod["ip"], namespace=pod.get("namespace") or "default")
            await asyncio.sleep(0.05)
            for pod in wave:
                api.set_ready(pod["name"], True, namespace=pod.get("namespace") or "default")
            await asyncio.sleep(0.05)
        print(f"scaled up to {len(api.pods)} pod(s) in {api.version - 1000} event(s)", flush=True)

    async def serve() -> None:
        runner = web.AppRunner(api.app(), access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        print(f"kube api on http://{args.host}:{args.port} with {len(api.pods)} pod(s)", flush=True)
        if args.scale_up:
            await scale_up()
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
