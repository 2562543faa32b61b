"""Kubernetes worker discovery (issue 26 item 1; D73) against the stand-in API server
(standins/kube_api.py) through the real client library: pods that match and are Running and Ready
become workers by the registration path of POST /workers (then health checks make them ready); a
pod that stops being ready or is deleted is drained and removed; the PD selectors give prefill and
decode workers; a broken watch resumes from its resourceVersion, a 410 Gone relists, API errors are
retried; only the process that leads the host runs discovery; several hosts on one store register a
worker once.

The pods' IPs are loopback addresses (127.0.0.2, 127.0.0.3, ...), where the project's mock workers
listen on the one --service-discovery-port, so each pod's URL is composed as for a cluster."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import AsyncIterator

import pytest
from aiohttp import web

from administration.discovery_reconcile import ID_LABEL, PROVIDER_LABEL, DiscoveredWorker, DiscoveryRunner, reconcile
from administration.host import HostPeers
from administration.jobs import wait_for_local_jobs
from administration.models import Worker, WorkerStatus
from administration.pod_discovery import PodDiscovery, list_selector, worker_of_pod
from administration.registry_sync import RegistrySync
from common import telemetry
from common.config import ConfigError, GatewayConfig, install_config, parse_gateway_args
from inference.routing.registry import REGISTRY
from standins.kube_api import KubeApi, serve_kube_api
from standins.mock_worker import MockWorkerConfig, build_app
from tests.administration.fleet import running_fleet
from tests.conftest import free_port, until

SELECTOR = (("app", "llm"),)


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: stand-in, cluster: {{server: \"{server}\"}}}}]\n"
        "users: [{name: gateway, user: {token: stand-in-token}}]\n"
        "contexts: [{name: stand-in, context: {cluster: stand-in, user: gateway}}]\n"
        "current-context: stand-in\n"
    )
    return path


@pytest.fixture
async def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubeApi]:
    """The stand-in API server, named by a kubeconfig in KUBECONFIG (as outside a cluster)."""
    api = KubeApi()
    url, runner = await serve_kube_api(api)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", url)))
    yield api
    await runner.cleanup()


@pytest.fixture
async def pod_port() -> AsyncIterator[tuple[int, list[str]]]:
    """The discovery port, and the loopback addresses of the mock workers listening on it."""
    port = free_port()
    runners: list[web.AppRunner] = []
    hosts = [f"127.0.0.{n}" for n in range(2, 6)]
    for host in hosts:
        runner = web.AppRunner(build_app(MockWorkerConfig(model="mock-model")), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
    yield port, hosts
    for runner in runners:
        await runner.cleanup()


def discovery_config(port: int, **changes: object) -> GatewayConfig:
    base = GatewayConfig(
        discovery_provider="kubernetes", selector=SELECTOR, service_discovery_port=port,
        health_check_interval_secs=0.2, health_success_threshold=1, drain_settle_secs=0.2,
        worker_startup_check_interval=0.2, worker_startup_timeout_secs=10.0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def ready_urls() -> set[str]:
    return {handle.record.url for handle in REGISTRY.snapshot.workers if handle.record.status == WorkerStatus.READY}


def stored() -> dict[str, Worker]:
    return {worker.url: worker for worker in Worker.objects.all()}


def sample(name: str, **labels: str) -> float:
    return telemetry.REGISTRY.get_sample_value(name, labels) or 0.0


# --- the flags ------------------------------------------------------------------------------------


def test_the_reference_flags_parse_and_refuse_what_cannot_work() -> None:
    config = parse_gateway_args([
        "--service-discovery", "--selector", "app=llm", "tier=gpu", "--service-discovery-port", "8000",
        "--service-discovery-namespace", "inference", "--model-id-from", "label:model",
    ])
    assert (config.discovery_provider, config.selector) == ("kubernetes", (("app", "llm"), ("tier", "gpu")))
    assert (config.service_discovery_port, config.service_discovery_namespace) == (8000, "inference")
    assert config.model_id_from == "label:model" and config.discovery_check_interval_secs == 30.0
    assert parse_gateway_args(["--selector", "app=x"]).service_discovery_port == 80  # the reference's default
    pd = parse_gateway_args([
        "--discovery-provider", "kubernetes", "--pd-disaggregation",
        "--prefill-selector", "app=llm", "role=prefill", "--decode-selector", "app=llm", "role=decode",
    ])  # no --prefill/--decode workers needed: discovery brings them
    assert list_selector(pd) == "app=llm"  # the list reads the pods every selector shares
    assert parse_gateway_args(["--discovery-provider", "file", "--discovery-file", "/x.json"]).discovery
    for argv, refused in [
        (["--service-discovery"], "needs --selector"),
        (["--discovery-provider", "file"], "needs --discovery-file"),
        (["--service-discovery", "--discovery-provider", "file", "--discovery-file", "/x"], "one or the other"),
        (["--selector", "app=x", "--prefill-selector", "role=p", "--service-discovery"], "need --pd-disaggregation"),
        (["--model-id-from", "pod"], "namespace, label:<key> or annotation:<key>"),
        (["--selector", "app"], "key=value"),
    ]:
        with pytest.raises(ConfigError, match=refused):
            parse_gateway_args(argv)


def test_a_pod_is_a_worker_when_it_matches_runs_and_is_ready() -> None:
    api = KubeApi()
    config = discovery_config(8000, model_id_from="annotation:model")
    pod = api.add_pod("a", "10.1.2.3", {"app": "llm", "x": "y"}, annotations={"model": "llama-3"})
    worker = worker_of_pod(pod, config)
    uid = pod["metadata"]["uid"]
    assert worker == DiscoveredWorker(
        discovery_id=f"{uid}:8000", url="http://10.1.2.3:8000", model_id="llama-3",
        labels={"pod_name": "a", "pod_uid": uid},
    )
    assert worker_of_pod(api.add_pod("v6", "fd00::5", {"app": "llm"}), config).url == "http://[fd00::5]:8000"  # type: ignore[union-attr]
    assert worker_of_pod(api.add_pod("b", "10.1.2.4", {"app": "other"}), config) is None
    assert worker_of_pod(api.add_pod("c", "10.1.2.5", {"app": "llm"}, ready=False), config) is None
    assert worker_of_pod(api.add_pod("d", "10.1.2.6", {"app": "llm"}, phase="Pending"), config) is None
    assert worker_of_pod(api.add_pod("e", None, {"app": "llm"}), config) is None
    terminating = api.add_pod("f", "10.1.2.7", {"app": "llm"})
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert worker_of_pod(terminating, config) is None
    by_namespace = dataclasses.replace(config, model_id_from="namespace")
    assert worker_of_pod(api.add_pod("g", "10.1.2.8", {"app": "llm"}, namespace="qwen"), by_namespace).model_id == "qwen"  # type: ignore[union-attr]


def test_a_watch_event_changes_the_published_set_by_its_pod_alone() -> None:
    """Each event updates the set by the one pod it names (D117); the set is what reading every pod
    again would give, and an event that changes no worker publishes nothing."""
    api = KubeApi()
    config = discovery_config(8000)
    provider = PodDiscovery(config)
    published: list[dict[str, DiscoveredWorker]] = []
    pods = [api.add_pod(name, f"10.1.2.{n}", {"app": "llm"}, ready=False) for n, name in enumerate("abc", 1)]
    provider.pods = {pod["metadata"]["uid"]: pod for pod in pods}
    provider._publish(lambda found: published.append(dict(found)))  # the list: no worker yet
    assert published == [{}]

    def event(uid: str, pod: dict[str, object] | None) -> None:
        if pod is None:
            provider.pods.pop(uid, None)
        else:
            provider.pods[uid] = pod
        provider._publish_pod(uid, pod, lambda found: published.append(dict(found)))

    def uid(name: str) -> str:
        return str(api.pods[("default", name)]["metadata"]["uid"])

    for name in "abc":
        api.set_ready(name, True)
        event(uid(name), api.pods[("default", name)])
    assert len(published) == 4 and len(published[-1]) == 3
    api.relabel("a", {"app": "llm", "extra": "label"})  # still the same worker: nothing published
    event(uid("a"), api.pods[("default", "a")])
    assert len(published) == 4
    api.set_ready("b", False)
    event(uid("b"), api.pods[("default", "b")])
    gone = uid("c")
    api.delete_pod("c")
    event(gone, None)
    expected = {w.discovery_id: w for w in (worker_of_pod(pod, config) for pod in provider.pods.values()) if w}
    assert published[-1] == expected and [w.labels["pod_name"] for w in expected.values()] == ["a"]


# --- against the stand-in API server --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_pods_become_workers_and_leave_when_not_ready_or_deleted(
    kube: KubeApi, pod_port: tuple[int, list[str]]
) -> None:
    port, (ip_a, ip_b, ip_c, ip_d) = pod_port
    url_a, url_b, url_c = (f"http://{ip}:{port}" for ip in (ip_a, ip_b, ip_c))
    a = kube.add_pod("a", ip_a, {"app": "llm"})
    kube.add_pod("b", ip_b, {"app": "llm"})
    kube.add_pod("c", ip_c, {"app": "llm"}, ready=False)
    kube.add_pod("d", ip_d, {"app": "something-else"})
    kube.fail_next(503, 2)  # the API server is not answering at first: retried after a pause
    registrations = sample("gw_discovery_registrations_total", source="kubernetes", result="success")
    removals = sample("gw_discovery_deregistrations_total", source="kubernetes", reason="reconciled")
    config = discovery_config(port)
    async with running_fleet(config) as fleet:
        provider = PodDiscovery(config)
        runner = DiscoveryRunner(provider, lambda: fleet.leading)
        runner.start()
        try:
            await until(lambda: asyncio.sleep(0, ready_urls() == {url_a, url_b}), timeout=20)
            rows = await asyncio.to_thread(stored)
            assert set(rows) == {url_a, url_b}  # c is not ready, d does not match
            labels = rows[url_a].labels
            assert labels["pod_name"] == "a" and labels["pod_uid"] == a["metadata"]["uid"]
            assert (labels[PROVIDER_LABEL], labels[ID_LABEL]) == ("kubernetes", f"{a['metadata']['uid']}:{port}")
            assert rows[url_a].source == "api"  # the POST /workers path: listed, checked and routed alike
            assert len(kube.list_requests()) == 3  # two refused, then the list

            # A broken watch resumes from the last resourceVersion it saw (no new list).
            seen = provider.resource_version
            kube.break_watches()
            kube.set_ready("c", True)
            await until(lambda: asyncio.sleep(0, url_c in ready_urls()), timeout=20)
            assert seen in [query.get("resourceVersion") for query in kube.watch_requests()[1:]]
            assert provider.lists == 1

            # Its history gone (410 Gone), the watch is answered by a new list, then a new watch.
            kube.compact()
            kube.break_watches()
            kube.delete_pod("b")
            await until(lambda: asyncio.sleep(0, url_b not in ready_urls()), timeout=20)
            assert provider.lists == 2

            # A pod that stops being ready is drained and removed.
            kube.set_ready("a", False)
            await until(lambda: asyncio.sleep(0, ready_urls() == {url_c}), timeout=20)
            await until(lambda: asyncio.to_thread(lambda: set(stored()) == {url_c}), timeout=20)
            assert runner.last is not None and runner.last.discovered == 1
        finally:
            await runner.astop()
            await asyncio.to_thread(wait_for_local_jobs)
    assert sample("gw_discovery_workers_discovered", source="kubernetes") == 1
    assert sample("gw_discovery_registrations_total", source="kubernetes", result="success") - registrations == 3
    assert sample("gw_discovery_deregistrations_total", source="kubernetes", reason="reconciled") - removals == 2
    assert sample("gw_discovery_sync_duration_seconds_count", source="kubernetes") >= runner.passes > 0


@pytest.mark.django_db(transaction=True)
async def test_the_prefill_and_decode_selectors_give_pd_roles(kube: KubeApi, pod_port: tuple[int, list[str]]) -> None:
    port, (ip_p, ip_d, ip_x, _) = pod_port
    config = discovery_config(
        port, selector=(), pd_disaggregation=True,
        prefill_selector=(("app", "llm"), ("role", "prefill")), decode_selector=(("app", "llm"), ("role", "decode")),
    )
    kube.add_pod("p", ip_p, {"app": "llm", "role": "prefill"}, annotations={"sglang.ai/bootstrap-port": "8998"})
    kube.add_pod("d", ip_d, {"app": "llm", "role": "decode"})
    kube.add_pod("x", ip_x, {"app": "llm", "role": "router"})  # matches neither: not a worker
    async with running_fleet(config) as fleet:
        runner = DiscoveryRunner(PodDiscovery(config), lambda: fleet.leading)
        runner.start()
        try:
            await until(lambda: asyncio.to_thread(lambda: {w.registered for w in stored().values()} == {True}
                                                  and len(stored()) == 2), timeout=20)
        finally:
            await runner.astop()
            await asyncio.to_thread(wait_for_local_jobs)
    rows = await asyncio.to_thread(stored)
    prefill, decode = rows[f"http://{ip_p}:{port}"], rows[f"http://{ip_d}:{port}"]
    assert (prefill.worker_type, prefill.setting("bootstrap_port")) == ("prefill", 8998)
    assert (decode.worker_type, decode.setting("bootstrap_port")) == ("decode", None)
    assert all(entry["query"].get("labelSelector") == "app=llm" for entry in kube.requests)


@pytest.mark.django_db(transaction=True)
async def test_only_the_process_that_leads_the_host_runs_discovery(
    kube: KubeApi, pod_port: tuple[int, list[str]], tmp_path: Path
) -> None:
    port, (ip_a, *_) = pod_port
    kube.add_pod("a", ip_a, {"app": "llm"})
    config = discovery_config(port)
    install_config(config, export=False)
    leader, follower = RegistrySync(config, HostPeers(tmp_path, 0, 2)), RegistrySync(config, HostPeers(tmp_path, 1, 2))
    await leader.astart()
    await follower.astart()
    runners = [DiscoveryRunner(PodDiscovery(config), lambda: leader.leading),
               DiscoveryRunner(PodDiscovery(config), lambda: follower.leading)]
    for runner in runners:
        runner.start()
    try:
        await until(lambda: asyncio.sleep(0, runners[0].passes > 0), timeout=20)
        assert (leader.leading, follower.leading) == (True, False)
        assert runners[1].passes == 0 and len(kube.list_requests()) == 1  # the follower never asked
        await runners[0].astop()
        await leader.astop()  # the leader goes: the other process is elected and takes discovery over
        await until(lambda: asyncio.sleep(0, runners[1].passes > 0), timeout=20)
        assert follower.leading and len(kube.list_requests()) == 2
        assert runners[1].last is not None and runners[1].last.registered == 0  # already in the store
    finally:
        for runner in runners:
            await runner.astop()
        await follower.astop()
        await asyncio.to_thread(wait_for_local_jobs)
        REGISTRY.publish([], {})
        install_config(GatewayConfig(), export=False)


@pytest.mark.django_db(transaction=True)
async def test_gateway_hosts_sharing_a_store_register_and_remove_each_worker_once(
    pod_port: tuple[int, list[str]]
) -> None:
    """Each host's leader reconciles the same pods at once: one registration per URL (the others'
    are refused by the store and taken as done), one removal per pod gone (a removal running is not
    started again)."""
    port, hosts = pod_port
    found = {f"uid-{n}:{port}": DiscoveredWorker(f"uid-{n}:{port}", f"http://{ip}:{port}") for n, ip in enumerate(hosts)}
    async with running_fleet(discovery_config(port, drain_settle_secs=3.0)):
        results = await asyncio.gather(*(asyncio.to_thread(reconcile, "kubernetes", found) for _ in range(3)))
        assert sum(result.registered for result in results) == len(hosts)
        assert sum(result.failed for result in results) == 0
        want = {worker.url for worker in found.values()}
        await until(lambda: asyncio.sleep(0, ready_urls() == want), timeout=20)
        assert sorted(row.url for row in await asyncio.to_thread(lambda: list(Worker.objects.all()))) == sorted(want)
        gone = found.pop("uid-0:" + str(port))
        results = await asyncio.gather(*(asyncio.to_thread(reconcile, "kubernetes", found) for _ in range(3)))
        assert sum(result.removed for result in results) == 1
        draining = await asyncio.to_thread(lambda: Worker.objects.get(url=gone.url))
        assert draining.job_type == "RemoveWorker"  # still draining (3 s): a later pass leaves it to its job
        assert (await asyncio.to_thread(reconcile, "kubernetes", found)).removed == 0
        await asyncio.to_thread(wait_for_local_jobs)
        assert not await asyncio.to_thread(lambda: Worker.objects.filter(url=gone.url).exists())
