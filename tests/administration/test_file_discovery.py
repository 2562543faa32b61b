"""File worker discovery (issue 26 item 1; D73): the manifest's workers are registered by the path
of POST /workers, a line changed is a removal plus a registration, a line removed drains and removes
its worker; a manifest of another version or with an unknown key is refused and the last good one
kept; the file may appear after start-up."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from administration.discovery_reconcile import ID_LABEL, PROVIDER_LABEL, DiscoveredWorker, DiscoveryRunner
from administration.file_discovery import FileDiscovery, ManifestRefused, parse_manifest
from administration.jobs import wait_for_local_jobs
from administration.lifecycle import GatewayLifecycle
from administration.models import Worker
from common.config import GatewayConfig, install_config, parse_gateway_args
from inference.dataplane import reset_data_plane
from inference.routing.registry import REGISTRY
from tests.administration.fleet import running_fleet
from tests.conftest import WorkerFactory, until


def manifest(*workers: dict[str, Any], version: object = 1) -> bytes:
    return orjson.dumps({"version": version, "workers": list(workers)})


def test_a_manifest_names_workers_by_id_and_refuses_what_it_cannot_read() -> None:
    found = parse_manifest(manifest(
        {"url": "http://10.0.0.1:8000"},
        {"url": "http://10.0.0.2:8000", "id": "p0", "worker_type": "prefill", "bootstrap_port": 8998,
         "model_id": "m", "kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_engine_id": "e0"},
    ))
    assert found == {
        "http://10.0.0.1:8000": DiscoveredWorker("http://10.0.0.1:8000", "http://10.0.0.1:8000"),
        "p0": DiscoveredWorker("p0", "http://10.0.0.2:8000", "prefill", 8998, "m", "NixlConnector", "kv_producer", "e0"),
    }
    body = found["p0"].spec_body("file")
    assert body["labels"]["served_model_name"] == "m" and body["labels"]["kv_role"] == "kv_producer"
    assert (body["labels"][PROVIDER_LABEL], body["labels"][ID_LABEL]) == ("file", "p0")
    for bad, why in [
        (manifest({"url": "http://a:1"}, version=2), "version 2"),
        (orjson.dumps({"version": 1, "workers": [], "extra": 1}), "unknown key"),
        (manifest({"url": "http://a:1", "weight": 3}), "unknown key"),
        (manifest({"id": "x"}), "url"),
        (manifest({"url": "http://a:1", "worker_type": "encoder"}), "worker_type"),
        (manifest({"url": "http://a:1", "bootstrap_port": 70000}), "bootstrap_port"),
        (manifest({"url": "http://a:1"}, {"url": "http://a:1", "id": "b"}), "appears twice"),
        (b"{not json", "not JSON"),
    ]:
        with pytest.raises(ManifestRefused, match=why):
            parse_manifest(bad)


def write(path: Path, data: bytes) -> None:
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    os.replace(partial, path)  # as a ConfigMap update or an editor's save replaces the file


def stored() -> dict[str, Worker]:
    return {worker.url: worker for worker in Worker.objects.filter(registered=True)}


@pytest.mark.django_db(transaction=True)
async def test_manifest_lines_added_changed_and_removed(tmp_path: Path, start_worker: WorkerFactory) -> None:
    one, two, three = [await start_worker(model) for model in ("mock-model", "engine-name", "mock-model")]
    path = tmp_path / "workers.json"
    config = GatewayConfig(
        discovery_provider="file", discovery_file=str(path), discovery_check_interval_secs=60.0,
        health_check_interval_secs=0.2, health_success_threshold=1, drain_settle_secs=0.1,
    )
    async with running_fleet(config) as fleet:
        provider = FileDiscovery(config)
        runner = DiscoveryRunner(provider, lambda: fleet.leading)
        runner.start()
        try:
            # Not there yet: nothing is reconciled (the fleet stays as it is) until it appears.
            await until(lambda: asyncio.sleep(0, provider.missing))
            assert runner.passes == 0 and runner.found is None
            write(path, manifest({"url": one.url, "id": "w1"}, {"url": two.url, "id": "w2", "model_id": "served"}))
            await until(lambda: asyncio.to_thread(lambda: set(stored()) == {one.url, two.url}), timeout=20)
            rows = await asyncio.to_thread(stored)
            assert rows[two.url].model_id == "served" and rows[one.url].model_id == "mock-model"
            # The manifest's model_id is the worker's; the name its engine reports stays an alias of it.
            assert rows[two.url].model_cards[0]["aliases"] == ["engine-name"] and not rows[one.url].model_cards
            await until(lambda: asyncio.sleep(0, REGISTRY.snapshot.canonical_model("engine-name") == "served"))
            assert rows[one.url].labels[ID_LABEL] == "w1" and rows[one.url].source == "api"

            # A line added (noticed as the file changes, long before the 60 s interval).
            write(path, manifest({"url": one.url, "id": "w1"}, {"url": two.url, "id": "w2", "model_id": "served"},
                                 {"url": three.url, "id": "w3"}))
            await until(lambda: asyncio.to_thread(lambda: three.url in stored()), timeout=20)

            # A changed id is a removal plus a registration; a removed line drains and removes.
            first = (await asyncio.to_thread(stored))[one.url].pk
            write(path, manifest({"url": one.url, "id": "w1-renamed"}, {"url": three.url, "id": "w3"}))

            def changed() -> bool:
                rows = stored()
                return set(rows) == {one.url, three.url} and rows[one.url].pk != first

            await until(lambda: asyncio.to_thread(changed), timeout=20)
            assert (await asyncio.to_thread(stored))[one.url].labels[ID_LABEL] == "w1-renamed"

            # Refused (another version, an unknown key): the last good manifest stays.
            refusals = provider.refusals
            write(path, manifest({"url": one.url}, version=2))
            await until(lambda: asyncio.sleep(0, provider.refusals == refusals + 1), timeout=20)
            write(path, manifest({"url": one.url, "id": "w1-renamed", "colour": "red"}))
            await until(lambda: asyncio.sleep(0, provider.refusals == refusals + 2), timeout=20)
            assert runner.found is not None and set(runner.found) == {"w1-renamed", "w3"}
            result = await runner.reconcile_now()
            assert result is not None and (result.registered, result.removed) == (0, 0)
            assert set(await asyncio.to_thread(stored)) == {one.url, three.url}
        finally:
            await runner.astop()
            await asyncio.to_thread(wait_for_local_jobs)


@pytest.mark.django_db(transaction=True)
async def test_the_gateway_runs_discovery_from_its_flags(tmp_path: Path, start_worker: WorkerFactory) -> None:
    """A gateway started with --discovery-provider file runs discovery in the process that leads
    (here the only one) and stops it with the gateway."""
    worker = await start_worker()
    path = tmp_path / "workers.json"
    write(path, manifest({"url": worker.url}))
    config = parse_gateway_args([
        "--discovery-provider", "file", "--discovery-file", str(path), "--health-check-interval-secs", "0.2",
        "--health-success-threshold", "1",
    ])
    config = dataclasses.replace(config, prometheus_port=0)
    install_config(config, export=False)
    lifecycle = GatewayLifecycle()
    thresholds = gc.get_threshold()
    try:
        await lifecycle.astart()
        assert lifecycle.discovery is not None and lifecycle.discovery.provider.name == "file"
        await until(lambda: asyncio.sleep(0, worker.url in {h.record.url for h in REGISTRY.snapshot.routable}))
        await lifecycle.astop()
        assert lifecycle.discovery is None
    finally:
        gc.unfreeze()  # what a serving process does once, undone for the rest of the suite
        gc.set_threshold(*thresholds)
        await asyncio.to_thread(wait_for_local_jobs)
        REGISTRY.publish([], {})
        install_config(GatewayConfig(), export=False)
        reset_data_plane(GatewayConfig())
