"""--pd-disaggregation: the --prefill and --decode workers stored as command-line workers of their
type, a prefill's bootstrap port kept as its spec field, and the PD traits the registry reads."""

from __future__ import annotations

from typing import Any

import pytest

from administration.models import Worker, WorkerSource, WorkerStatus
from administration.workers import cli_pd_workers, pd_traits, sync_cli_workers
from common.config import parse_gateway_args

pytestmark = pytest.mark.django_db


def test_prefill_and_decode_flags_store_typed_workers(django_capture_on_commit_callbacks: Any) -> None:
    config = parse_gateway_args([
        "--pd-disaggregation", "--prefill", "http://p1:30000", "9000", "--prefill", "http://p2:30000",
        "--decode", "http://d1:30001", "--worker-urls", "http://regular:1",
    ])
    entries = cli_pd_workers(config)
    assert entries == (("http://p1:30000", "prefill", 9000), ("http://p2:30000", "prefill", None), ("http://d1:30001", "decode", None))
    with django_capture_on_commit_callbacks() as queued:
        sync_cli_workers(config.worker_urls, config.backend, entries)
    workers = {w.url: w for w in Worker.objects.all()}
    assert {url: w.worker_type for url, w in workers.items()} == {
        "http://regular:1": "regular", "http://p1:30000": "prefill", "http://p2:30000": "prefill", "http://d1:30001": "decode",
    }
    assert all(w.source == WorkerSource.CLI and w.status == WorkerStatus.PENDING for w in workers.values())
    assert len(queued) == 4
    p1 = pd_traits(workers["http://p1:30000"])
    assert p1 is not None and p1.bootstrap_port == 9000
    p2 = pd_traits(workers["http://p2:30000"])
    assert p2 is not None and p2.bootstrap_port is None
    assert pd_traits(workers["http://regular:1"]) is None


def test_the_pairing_protocol_label_and_kv_fields_reach_the_traits() -> None:
    worker = Worker.objects.create(
        url="http://p:1", worker_type="prefill", labels={"pairing_protocol": "mooncake-v2", "kv_connector": "MooncakeConnector"},
        settings={"bootstrap_port": 8100, "kv_engine_id": "e1", "dp_size": 2},
    )
    traits = pd_traits(worker)
    assert traits is not None
    assert (traits.pairing_protocol, traits.kv_connector, traits.kv_engine_id, traits.bootstrap_port, traits.dp_size) == (
        "mooncake-v2", "MooncakeConnector", "e1", 8100, 2,
    )


def test_without_the_switch_no_pd_worker_is_registered() -> None:
    assert cli_pd_workers(parse_gateway_args([])) == ()
