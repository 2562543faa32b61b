"""Kubernetes worker discovery (--service-discovery or --discovery-provider kubernetes; D73).

Pods are read with kubernetes_asyncio (the official client's asyncio edition, on the serving loop):
a list of the pods matching the selectors (``limit=500`` pages), then a watch from the list's
resourceVersion (``timeoutSeconds=290``, bookmarks on). A watch that ends or breaks is resumed from
the last resourceVersion seen; one the API server no longer has (410 Gone) is answered by a new list.
API errors and unreachable servers are tried again after a pause that doubles up to 30 s.

A pod is a worker when its phase is Running, its Ready condition is "True", it has a pod IP and it
is not being deleted: ``http://<podIP>:<--service-discovery-port>``, discovery id
``<uid>:<port>``, labelled with the pod's name and uid. It must match every ``--selector`` pair;
with --pd-disaggregation a pod matching ``--prefill-selector`` is a prefill worker (its
``sglang.ai/bootstrap-port`` annotation gives the bootstrap port) and one matching
``--decode-selector`` a decode worker. ``--model-id-from`` takes the worker's model id from the
pod's namespace, a label or an annotation. A pod that stops being ready or goes away leaves the set
and administration/discovery_reconcile.py drains and removes its worker.

Credentials: in a pod (``KUBERNETES_SERVICE_HOST`` set) its service account's token and CA;
elsewhere the kubeconfig (``KUBECONFIG`` or ~/.kube/config). The RBAC it needs: get, list and watch
on pods (README, "Worker discovery").
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import functools
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Mapping

import aiohttp
import orjson

from administration.discovery_reconcile import DiscoveredWorker, Publish
from administration.models import WorkerType
from common.config import GatewayConfig

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient, CoreV1Api

__all__ = ["PodDiscovery", "worker_of_pod", "list_selector", "BOOTSTRAP_PORT_ANNOTATION"]

log = logging.getLogger(__name__)

BOOTSTRAP_PORT_ANNOTATION = "sglang.ai/bootstrap-port"
LIST_PAGE = 500
WATCH_TIMEOUT_SECS = 290
CONNECT_TIMEOUT_SECS = 10.0
LIST_READ_TIMEOUT_SECS = 60.0
FIRST_PAUSE_SECS = 0.5
MAX_PAUSE_SECS = 30.0


def _matches(labels: Mapping[str, str], selector: tuple[tuple[str, str], ...]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector)


def list_selector(config: GatewayConfig) -> str:
    """The labelSelector of the list and the watch: the pairs every selector in use shares (empty:
    every pod of the namespace is read and matched here)."""
    selectors = [set(s) for s in (config.selector, config.prefill_selector, config.decode_selector) if s]
    common = set.intersection(*selectors) if selectors else set()
    return ",".join(f"{key}={value}" for key, value in sorted(common))


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    return status.get("phase") == "Running" and any(
        condition.get("type") == "Ready" and condition.get("status") == "True" for condition in conditions
    )


def _model_id(pod: Mapping[str, Any], source: str | None) -> str | None:
    if source is None:
        return None
    metadata = pod.get("metadata") or {}
    if source == "namespace":
        return metadata.get("namespace") or None
    kind, _, key = source.partition(":")
    found = (metadata.get("labels" if kind == "label" else "annotations") or {}).get(key)
    return str(found) if found else None


def _worker_type(labels: Mapping[str, str], config: GatewayConfig) -> str | None:
    """The worker type a pod's labels give, or None when the pod is not one of the gateway's."""
    if config.pd_disaggregation:
        if _matches(labels, config.prefill_selector):
            return WorkerType.PREFILL
        if _matches(labels, config.decode_selector):
            return WorkerType.DECODE
    if _matches(labels, config.selector):
        return WorkerType.REGULAR
    return None


def _bootstrap_port(pod: Mapping[str, Any]) -> int | None:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(BOOTSTRAP_PORT_ANNOTATION)
    if raw is None:
        return None
    try:
        port = int(raw)
    except (TypeError, ValueError):
        port = 0
    if not 0 < port < 65536:
        log.warning("pod %s: %s %r is not a port; ignored", pod["metadata"].get("name"), BOOTSTRAP_PORT_ANNOTATION, raw)
        return None
    return port


def worker_of_pod(pod: Mapping[str, Any], config: GatewayConfig) -> DiscoveredWorker | None:
    """The worker a pod is (None: it does not match, is not ready, has no IP or is being deleted)."""
    metadata = pod.get("metadata") or {}
    uid, ip = metadata.get("uid"), (pod.get("status") or {}).get("podIP")
    worker_type = _worker_type(metadata.get("labels") or {}, config)
    if worker_type is None or not uid or not ip or metadata.get("deletionTimestamp") or not _ready(pod):
        return None
    port = config.service_discovery_port
    host = f"[{ip}]" if ":" in ip else ip
    return DiscoveredWorker(
        discovery_id=f"{uid}:{port}",
        url=f"http://{host}:{port}",
        worker_type=worker_type,
        bootstrap_port=_bootstrap_port(pod) if worker_type == WorkerType.PREFILL else None,
        model_id=_model_id(pod, config.model_id_from),
        labels={"pod_name": str(metadata.get("name") or ""), "pod_uid": str(uid)},
    )


class _Pause:
    """Doubling pauses between failed attempts, with jitter, reset by a success."""

    def __init__(self) -> None:
        self.secs = FIRST_PAUSE_SECS

    def reset(self) -> None:
        self.secs = FIRST_PAUSE_SECS

    async def sleep(self) -> None:
        await asyncio.sleep(self.secs * random.uniform(0.8, 1.2))
        self.secs = min(self.secs * 2, MAX_PAUSE_SECS)


@functools.cache
def _kubernetes() -> SimpleNamespace:
    """kubernetes_asyncio, imported when the provider first runs rather than with this module: the
    providers' module is imported at every gateway start, and most gateways run no Kubernetes
    discovery (issue 26 item 5, start-up's imports)."""
    from kubernetes_asyncio import config, watch
    from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
    from kubernetes_asyncio.client.exceptions import ApiException

    return SimpleNamespace(
        config=config, watch=watch, ApiClient=ApiClient, Configuration=Configuration, CoreV1Api=CoreV1Api,
        ApiException=ApiException,
        api_errors=(ApiException, aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError),
    )


class PodDiscovery:
    """Lists and watches the pods, publishing the workers they are after every change."""

    name = "kubernetes"

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.selector = list_selector(config)
        self.pods: dict[str, Mapping[str, Any]] = {}  # uid -> the pod as last seen
        self.workers: dict[str, DiscoveredWorker] = {}  # uid -> the worker the pod is, for those that are one
        self.resource_version: str | None = None
        self.lists = 0  # lists made (a first one, then one per 410 Gone)
        self.watches = 0  # watches started
        self._published: dict[str, DiscoveredWorker] | None = None
        self._pause = _Pause()

    async def _client(self) -> ApiClient:
        kube = _kubernetes()
        configuration = kube.Configuration()
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube.config.load_incluster_config(client_configuration=configuration)
        else:
            await kube.config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration,
                persist_config=False,
            )
        api_client: ApiClient = kube.ApiClient(configuration=configuration)
        return api_client

    def _call(self, api: CoreV1Api, **query: Any) -> Any:
        namespace = self.config.service_discovery_namespace
        if self.selector:
            query["label_selector"] = self.selector
        if namespace:
            return api.list_namespaced_pod(namespace, **query)
        return api.list_pod_for_all_namespaces(**query)

    def _publish(self, publish: Publish) -> None:
        """After a list: the workers every pod is, published if the set changed."""
        found: dict[str, DiscoveredWorker] = {}
        self.workers = {}
        for uid, pod in self.pods.items():
            worker = worker_of_pod(pod, self.config)
            if worker is not None:
                found[worker.discovery_id] = self.workers[uid] = worker
        if found != self._published:
            self._published = found
            publish(dict(found))

    def _publish_pod(self, uid: str, pod: Mapping[str, Any] | None, publish: Publish) -> None:
        """After a watch event: the set changed by that one pod (None: deleted), published if it
        changed. Per event the cost is the pod's, not the fleet's: a thousand pods scaled up
        (several events each) are not a thousand passes over every pod (D117)."""
        before = self.workers.pop(uid, None)
        after = worker_of_pod(pod, self.config) if pod is not None else None
        if after is not None:
            self.workers[uid] = after
        if after == before:
            return
        found = self._published if self._published is not None else {}
        if before is not None:
            found.pop(before.discovery_id, None)
        if after is not None:
            found[after.discovery_id] = after
        self._published = found
        publish(dict(found))

    async def run(self, publish: Publish) -> None:
        pause = self._pause
        kube = _kubernetes()
        api_client: ApiClient | None = None
        try:
            while True:
                try:
                    if api_client is None:
                        api_client = await self._client()
                    api = kube.CoreV1Api(api_client)
                    if self.resource_version is None:
                        await self._list(api)
                        self._publish(publish)
                        pause.reset()
                    if await self._watch(api, publish):
                        pause.reset()
                    else:  # ended before any event: do not spin on a server that closes at once
                        await pause.sleep()
                except kube.ApiException as exc:
                    if exc.status == 410:
                        log.info("discovery: the pods' resourceVersion %s expired (410 Gone); listing again",
                                 self.resource_version)
                        self.resource_version = None
                        continue
                    log.warning("discovery: Kubernetes API error %s %s; retrying in %.1f s",
                                exc.status, exc.reason, pause.secs)
                    await pause.sleep()
                except kube.config.ConfigException as exc:
                    log.warning("discovery: no Kubernetes credentials (%s); retrying in %.1f s", exc, pause.secs)
                    await pause.sleep()
                except kube.api_errors as exc:
                    log.warning("discovery: Kubernetes API unreachable (%s: %s); retrying in %.1f s",
                                type(exc).__name__, exc, pause.secs)
                    await pause.sleep()
        finally:
            if api_client is not None:
                await api_client.close()

    async def _list(self, api: CoreV1Api) -> None:
        pods: dict[str, Mapping[str, Any]] = {}
        token: str | None = None
        version: str | None = None
        while True:
            query: dict[str, Any] = {"limit": LIST_PAGE}
            if token:
                query["_continue"] = token
            response = await self._call(
                api, _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(connect=CONNECT_TIMEOUT_SECS, sock_read=LIST_READ_TIMEOUT_SECS),
                **query,
            )
            try:
                body = await response.read()
            finally:
                response.release()
            if not 200 <= response.status <= 299:
                raise _kubernetes().ApiException(status=response.status, reason=body[:200].decode(errors="replace"))
            page = orjson.loads(body)
            metadata = page.get("metadata") or {}
            version = version or metadata.get("resourceVersion")
            for pod in page.get("items") or []:
                uid = (pod.get("metadata") or {}).get("uid")
                if uid:
                    pods[uid] = pod
            token = metadata.get("continue")
            if not token:
                break
        self.lists += 1
        self.pods = pods
        self.resource_version = version
        log.info("discovery: %d pod(s) listed at resourceVersion %s", len(pods), version)

    async def _watch(self, api: CoreV1Api, publish: Publish) -> bool:
        """One watch from the current resourceVersion until it ends; whether any event came."""
        self.watches += 1
        seen = False
        timeout = aiohttp.ClientTimeout(connect=CONNECT_TIMEOUT_SECS, sock_read=WATCH_TIMEOUT_SECS + 30)
        async with _kubernetes().watch.Watch(return_type="object") as stream:
            events = stream.stream(
                self._call, api, resource_version=self.resource_version, timeout_seconds=WATCH_TIMEOUT_SECS,
                allow_watch_bookmarks=True, _request_timeout=timeout,
            )
            async for event in events:
                if not seen:  # the API answers again: the next failure starts from the first pause
                    seen = True
                    self._pause.reset()
                kind, pod = event["type"], event["raw_object"]
                metadata = pod.get("metadata") or {}
                if metadata.get("resourceVersion"):
                    self.resource_version = metadata["resourceVersion"]
                if kind == "BOOKMARK" or not metadata.get("uid"):
                    continue
                if kind == "DELETED":
                    self.pods.pop(metadata["uid"], None)
                    self._publish_pod(metadata["uid"], None, publish)
                else:  # ADDED, MODIFIED
                    self.pods[metadata["uid"]] = pod
                    self._publish_pod(metadata["uid"], pod, publish)
        return seen
