"""Prefill/decode/encode and ZMQ workers in the admin API reads, the console (list, detail, add form,
PD pairs) and the fleet page's per-role figures (spec 3: worker fields, pd_pairing, GET /workers'
stats, loads per dp_rank)."""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest
from django.test import Client

from administration.console import pd_groups
from administration.fleet_page import fleet_state, role_totals
from administration.models import JobState, Worker, WorkerStatus
from inference.routing.pd import PdTraits, pd_pairing
from inference.routing.registry import REGISTRY
from inference.routing.workers import WorkerRecord
from inference.upstreams.zmq.addresses import zmq_addresses
from tests.administration.test_fleet_page import record_of

pytestmark = pytest.mark.django_db

LIST = "/admin/administration/worker/"
ADD = f"{LIST}add/"
DATA = f"{LIST}fleet/data/"
PAGE = f"{LIST}fleet/"
SECRET = "sk-pd-console-secret-31c7"


@pytest.fixture(autouse=True)
def empty_registry() -> Iterator[None]:
    REGISTRY.publish([], {})
    yield
    REGISTRY.publish([], {})


def make_worker(url: str, **fields: Any) -> Worker:
    values: dict[str, Any] = {"registered": True, "status": WorkerStatus.READY, "model_id": "llama-3",
                              "runtime_type": "sglang", "api_key": SECRET}
    values.update(fields)
    return Worker.objects.create(url=url, **values)


def pd_fleet() -> dict[str, Worker]:
    """A regular HTTP worker, an explicit-key PD pair over HTTP, a default-key gRPC pair (dp 2), an
    unpaired prefill worker of another model, an encode worker and a ZMQ engine group."""
    return {
        "regular": make_worker("http://10.0.0.1:8000"),
        "prefill": make_worker("http://10.0.0.2:8000", worker_type="prefill", labels={"pairing_protocol": "mooncake-a"},
                               settings={"bootstrap_port": 8998, "kv_connector": "mooncake"}),
        "decode": make_worker("http://10.0.0.3:8000", worker_type="decode", labels={"pairing_protocol": "mooncake-a",
                                                                                      "kv_connector": "mooncake"}),
        "grpc_prefill": make_worker("grpc://10.0.0.4:30000", worker_type="prefill",
                                    settings={"dp_size": 2, "bootstrap_port": 9001}),
        "grpc_decode": make_worker("grpc://10.0.0.5:30000", worker_type="decode", status=WorkerStatus.NOT_READY,
                                   settings={"dp_size": 2}, labels={"kv_engine_id": "from-label"}),
        "lonely": make_worker("http://10.0.0.6:8000", worker_type="prefill", model_id="qwen-2"),
        "encode": make_worker("http://10.0.0.7:8000", worker_type="encode", settings={"bootstrap_port": 8100}),
        "zmq": make_worker("ipc:///tmp/gw-pd-console-engine", runtime_type="vllm", settings={"dp_size": 2}),
    }


# --- the REST reads ----------------------------------------------------------------------------------------


def test_get_workers_gives_every_pd_and_zmq_field(client: Client) -> None:
    workers = pd_fleet()
    body = client.get("/workers").json()
    by_url = {worker["url"]: worker for worker in body["workers"]}

    assert body["total"] == 8  # encode workers count in the total only
    assert body["stats"] == {"prefill_count": 3, "decode_count": 2, "regular_count": 2}
    prefill, decode = by_url["http://10.0.0.2:8000"], by_url["http://10.0.0.3:8000"]
    assert (prefill["worker_type"], prefill["bootstrap_port"], prefill["kv_connector"], prefill["pd_pairing"]) == (
        "prefill", 8998, "mooncake", "mooncake-a"
    )
    assert (decode["worker_type"], decode["kv_connector"], decode["pd_pairing"]) == ("decode", "mooncake", "mooncake-a")
    assert decode["labels"] == {"pairing_protocol": "mooncake-a", "kv_connector": "mooncake"}
    grpc_prefill, grpc_decode = by_url["grpc://10.0.0.4:30000"], by_url["grpc://10.0.0.5:30000"]
    assert (grpc_prefill["connection_mode"], grpc_prefill["dp_size"], grpc_prefill["pd_pairing"]) == (
        "grpc", 2, "sglang/grpc/dp2"
    )
    assert (grpc_decode["pd_pairing"], grpc_decode["kv_engine_id"]) == ("sglang/grpc/dp2", "from-label")
    assert by_url["http://10.0.0.6:8000"]["pd_pairing"] == "sglang/http/single"
    encode = by_url["http://10.0.0.7:8000"]
    assert (encode["worker_type"], encode["bootstrap_port"]) == ("encode", 8100) and "pd_pairing" not in encode
    zmq = by_url["ipc:///tmp/gw-pd-console-engine"]
    derived = zmq_addresses("ipc:///tmp/gw-pd-console-engine").handshake
    assert re.fullmatch(r"tcp://127\.0\.0\.1:2\d{4}", derived)
    assert (zmq["connection_mode"], zmq["runtime_type"], zmq["dp_size"], zmq["zmq_handshake_address"]) == (
        "zmq", "vllm", 2, derived
    )
    assert "pd_pairing" not in zmq and "pd_pairing" not in by_url["http://10.0.0.1:8000"]
    assert client.get(f"/workers/{workers['grpc_prefill'].pk}").json()["pd_pairing"] == "sglang/grpc/dp2"
    assert SECRET not in str(body)


def test_a_field_wins_over_the_same_named_label(client: Client) -> None:
    worker = make_worker("http://10.0.0.9:8000", worker_type="decode", labels={"kv_engine_id": "label"},
                         settings={"kv_engine_id": "field", "zmq_handshake_address": "tcp://127.0.0.1:21000"})
    shown = client.get(f"/workers/{worker.pk}").json()
    assert shown["kv_engine_id"] == "field"
    assert shown["zmq_handshake_address"] == "tcp://127.0.0.1:21000"  # stored (registration refuses it) is shown


def test_the_api_pairing_is_the_key_routing_pairs_by(client: Client) -> None:
    workers = pd_fleet()
    for name in ("prefill", "grpc_decode", "lonely"):
        worker = workers[name]
        record = WorkerRecord(id=str(worker.pk), url=worker.url, model_id=worker.model_id,
                              runtime_type=worker.runtime_type, status=WorkerStatus(worker.status))
        traits = PdTraits(pairing_protocol=worker.labels.get("pairing_protocol"), dp_size=worker.setting("dp_size"))
        assert client.get(f"/workers/{worker.pk}").json()["pd_pairing"] == pd_pairing(record, traits)


# --- the console -------------------------------------------------------------------------------------------


def test_list_shows_role_transport_pairing_and_dp(admin_client: Client) -> None:
    workers = pd_fleet()
    REGISTRY.publish([record_of(workers["zmq"])], {})
    REGISTRY.snapshot.workers[0].load.engine_load = ({"dp_rank": 0}, {"dp_rank": 1})
    page = admin_client.get(LIST).content.decode()

    for role in ("regular", "prefill", "decode", "encode"):
        assert f'<span class="gw-badge gw-role-{role}">{role}</span>' in page
    for transport in ("HTTP", "GRPC", "ZMQ"):
        assert f'<td class="field-transport_column">{transport}</td>' in page
    assert '<code class="gw-pairing">mooncake-a</code> <span class="gw-port">bootstrap 8998</span>' in page
    assert '<code class="gw-pairing">sglang/grpc/dp2</code> <span class="gw-port">bootstrap 9001</span>' in page
    assert '<td class="field-pairing_column"><span class="gw-port">bootstrap 8100</span></td>' in page  # encode
    assert ">2 · 2 ranks</span>" in page  # the ZMQ group: dp_size 2, two ranks reporting
    assert SECRET not in page


def test_list_shows_the_pd_pairs(admin_client: Client) -> None:
    pd_fleet()
    page = admin_client.get(LIST).content.decode()
    section = page.split('<div class="module" id="gw-pd-pairs">')[1].split("</table>")[0]
    rows = re.findall(r'<tr class="row\d" data-pairing="([^"]+)" data-model="([^"]*)">(.*?)</tr>', section, re.S)
    shown = {(pairing, model): cells for pairing, model, cells in rows}
    assert set(shown) == {("mooncake-a", "llama-3"), ("sglang/grpc/dp2", "llama-3"), ("sglang/http/single", "qwen-2")}
    paired = shown[("mooncake-a", "llama-3")]
    assert "http://10.0.0.2:8000</a>" in paired.split('class="gw-pd-decode"')[0]
    assert "http://10.0.0.3:8000</a>" in paired.split('class="gw-pd-decode"')[1]
    assert '<span class="gw-badge gw-status-ready">paired</span>' in paired
    assert "no ready decode worker" in shown[("sglang/grpc/dp2", "llama-3")]  # its decode worker is not ready
    assert "no ready decode worker" in shown[("sglang/http/single", "qwen-2")]
    filtered = admin_client.get(f"{LIST}?worker_type__exact=regular").content.decode()
    assert 'id="gw-pd-pairs"' not in filtered  # the section follows the list's filters


def test_no_pd_section_without_prefill_or_decode_workers(admin_client: Client) -> None:
    make_worker("http://10.0.0.1:8000")
    assert 'id="gw-pd-pairs"' not in admin_client.get(LIST).content.decode()


def test_detail_shows_pairing_partners_ports_and_dp_ranks(admin_client: Client) -> None:
    workers = pd_fleet()
    prefill = workers["prefill"]
    REGISTRY.publish([record_of(prefill)], {})
    REGISTRY.snapshot.workers[0].load.engine_load = (
        {"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1, "token_usage": 0.5},
        {"dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 0, "token_usage": 0.25},
    )
    page = admin_client.get(f"{LIST}{prefill.pk}/change/").content.decode()

    def readonly(label: str) -> str:
        found = re.search(rf"<label>{re.escape(label)}:</label>\s*<div class=\"readonly\">(.*?)</div>\s*</div>", page, re.S)
        assert found, label
        return found.group(1)

    assert readonly("Bootstrap port") == "8998" and readonly("KV connector") == "mooncake"
    assert "mooncake-a" in readonly("Pairing")
    partners = readonly("Pairs with")
    assert f'<a href="{LIST}{workers["decode"].pk}/change/">http://10.0.0.3:8000</a>' in partners
    ranks = readonly("Engine load per dp rank")
    assert "<tr><td>0</td><td>3</td><td>1</td><td>50.0%</td></tr>" in ranks
    assert "<tr><td>1</td><td>2</td><td>0</td><td>25.0%</td></tr>" in ranks
    lonely = admin_client.get(f"{LIST}{workers['lonely'].pk}/change/").content.decode()
    assert "no decode worker with this pairing key" in lonely
    zmq = admin_client.get(f"{LIST}{workers['zmq'].pk}/change/").content.decode()
    assert zmq_addresses(workers["zmq"].url).handshake in zmq


def add_form(**fields: str) -> dict[str, str]:
    form = {"url": "grpc://10.0.0.9:30000", "model_id": "", "runtime_type": "sglang", "worker_type": "prefill",
            "api_key": "", "labels": "", "priority": "50", "cost": "1.0", "pairing_protocol": "",
            "bootstrap_port": "", "kv_connector": "", "kv_engine_id": "", "dp_size": "", "zmq_handshake_address": ""}
    form.update(fields)
    return form


def test_add_form_takes_the_pd_and_zmq_fields(admin_client: Client, django_capture_on_commit_callbacks: Any) -> None:
    page = admin_client.get(ADD).content.decode()
    for name in ("pairing_protocol", "bootstrap_port", "kv_connector", "kv_engine_id", "dp_size",
                 "zmq_handshake_address"):
        assert f'name="{name}"' in page
    with django_capture_on_commit_callbacks(execute=False):
        response = admin_client.post(ADD, add_form(pairing_protocol="nixl-b", bootstrap_port="9100",
                                                   kv_connector="nixl", kv_engine_id="engine-7", dp_size="4",
                                                   labels="zone=eu"))
    assert response.status_code == 302, response.content.decode()
    worker = Worker.objects.get()
    assert (worker.worker_type, worker.job_state) == ("prefill", JobState.PENDING)
    assert worker.labels == {"zone": "eu", "pairing_protocol": "nixl-b"}
    assert worker.settings == {"bootstrap_port": 9100, "kv_connector": "nixl", "kv_engine_id": "engine-7", "dp_size": 4}


@pytest.mark.parametrize(
    ("fields", "field", "error"),
    [
        ({"bootstrap_port": "-1"}, "bootstrap_port", "bootstrap_port: invalid type, expected an unsigned integer"),
        ({"dp_size": str(2**40)}, "dp_size", "dp_size: invalid value"),
        ({"bootstrap_port": "x"}, "bootstrap_port", "Enter a whole number."),
    ],
)
def test_add_form_refuses_what_the_api_refuses(
    admin_client: Client, client: Client, fields: dict[str, str], field: str, error: str
) -> None:
    response = admin_client.post(ADD, add_form(**fields))
    assert response.status_code == 200
    assert error in str(response.context["adminform"].form.errors[field])
    assert not Worker.objects.exists()
    if error.startswith(field):  # the API gives the same message (422, the type errors)
        body = {"url": "grpc://10.0.0.9:30000", field: int(fields[field])}
        answer = client.post("/workers", body, content_type="application/json")
        assert answer.status_code == 422 and error in answer.content.decode()


# --- the fleet page's split by role -----------------------------------------------------------------------


def test_fleet_data_by_role_sums_each_role(admin_client: Client) -> None:
    workers = pd_fleet()
    REGISTRY.publish([record_of(workers[name]) for name in ("prefill", "grpc_prefill", "decode")], {})
    loads = {handle.url: handle.load for handle in REGISTRY.snapshot.workers}
    loads["http://10.0.0.2:8000"].in_flight = 2
    loads["grpc://10.0.0.4:30000"].in_flight = 1
    loads["grpc://10.0.0.4:30000"].engine_load = (
        {"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1, "token_usage": 0.5},
        {"dp_rank": 1, "num_running_reqs": 1, "num_waiting_reqs": 1, "token_usage": 0.3},
    )
    loads["http://10.0.0.2:8000"].engine_load = ({"dp_rank": 0, "num_running_reqs": 2, "token_usage": 0.1},)

    plain = admin_client.get(DATA).json()
    assert "roles" not in plain  # the default answer is unchanged
    roles = admin_client.get(f"{DATA}?by=role").json()["roles"]

    assert list(roles) == ["regular", "prefill", "decode", "encode"]
    assert {role: (r["workers"], r["ready"]) for role, r in roles.items()} == {
        "regular": (2, 2), "prefill": (3, 3), "decode": (2, 1), "encode": (1, 1)
    }
    assert roles["prefill"]["in_flight"] == 3 and roles["decode"]["in_flight"] == 0
    assert roles["prefill"]["engine"] == {"running_requests": 6, "waiting_requests": 2, "token_usage": 0.3,
                                          "dp_ranks": 3}
    assert roles["decode"]["engine"] is None and roles["encode"]["engine"] is None


def test_role_totals_sum_the_request_counters() -> None:
    rows: list[Any] = [
        {"worker_type": "prefill", "healthy": True, "in_flight": None, "requests_total": 5, "failures_total": 1,
         "engine": None},
        {"worker_type": "prefill", "healthy": False, "in_flight": 4, "requests_total": 7, "failures_total": 0,
         "engine": None},
    ]
    totals = role_totals(rows)
    assert (totals["prefill"]["requests_total"], totals["prefill"]["failures_total"]) == (12, 1)
    assert totals["regular"] == {"workers": 0, "ready": 0, "in_flight": 0, "requests_total": 0, "failures_total": 0,
                                 "engine": None}


def test_fleet_page_splits_by_role_once_the_fleet_has_pd_workers(admin_client: Client) -> None:
    make_worker("http://10.0.0.1:8000")
    page = admin_client.get(PAGE).content.decode()
    assert 'data-split="worker"' in page and '<option value="worker" selected>' in page
    make_worker("http://10.0.0.2:8000", worker_type="prefill")
    page = admin_client.get(PAGE).content.decode()
    assert 'data-split="role"' in page and '"roles": {' in page
    assert 'data-split="worker"' in admin_client.get(f"{PAGE}?split=worker").content.decode()


def test_pd_groups_leave_out_regular_and_encode_workers() -> None:
    workers = pd_fleet()
    groups = pd_groups(Worker.objects.all())
    members = {w.url for group in groups for w in group.prefill + group.decode}
    assert workers["regular"].url not in members and workers["encode"].url not in members
    assert fleet_state([workers["encode"]], by_role=True)["roles"]["encode"]["workers"] == 1
