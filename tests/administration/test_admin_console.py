"""The worker console in the Django admin: login, the list with live columns, the add form (the same
registration job as POST /workers), the actions and buttons, and the api_key never shown."""

from __future__ import annotations

import enum
import re
import types
import uuid
from datetime import timedelta
from functools import partial
from typing import Any, Callable, Iterator

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from administration import console
from administration.api.workers import worker_object
from administration.console import stored_spec
from administration.models import JobState, JobType, Worker, WorkerSource, WorkerStatus
from inference.routing.registry import REGISTRY
from inference.routing.workers import WorkerLoad, WorkerRecord

pytestmark = pytest.mark.django_db

LIST = "/admin/administration/worker/"
ADD = "/admin/administration/worker/add/"
SECRET = "sk-worker-secret-7f3a"


def detail(worker: Worker) -> str:
    return f"{LIST}{worker.pk}/change/"


def make_worker(url: str = "http://10.0.0.5:8000", **fields: Any) -> Worker:
    values: dict[str, Any] = {
        "registered": True,
        "status": WorkerStatus.READY,
        "model_id": "llama-3",
        "runtime_type": "vllm",
        "api_key": SECRET,
        "labels": {"zone": "a"},
        "settings": {"health": {"timeout_secs": 3}},
    }
    values.update(fields)
    return Worker.objects.create(url=url, **values)


@pytest.fixture(autouse=True)
def empty_registry() -> Iterator[None]:
    REGISTRY.publish([], {})
    yield
    REGISTRY.publish([], {})


def publish(*workers: Worker) -> None:
    REGISTRY.publish(
        [
            WorkerRecord(id=str(w.pk), url=w.url, model_id=w.model_id or None, runtime_type=w.runtime_type,
                         status=w.status, api_key=w.api_key or None)
            for w in workers
        ],
        {},
    )


def add_form(**fields: Any) -> dict[str, Any]:
    body = {"url": "http://10.0.0.9:8000", "model_id": "", "runtime_type": "unspecified",
            "worker_type": "regular", "api_key": "", "labels": "", "priority": "50", "cost": "1.0"}
    body.update(fields)
    return body


# --- login ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [LIST, ADD])
def test_console_requires_a_staff_login(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    User.objects.create_user("carol", password="pw-not-staff-123")
    client.login(username="carol", password="pw-not-staff-123")
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_action_buttons_require_a_staff_login(client: Client) -> None:
    worker = make_worker()
    response = client.post(f"{LIST}{worker.pk}/drain/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.READY


# --- the list ------------------------------------------------------------------------------------------


def test_list_shows_workers_with_live_columns_and_never_the_api_key(admin_client: Client) -> None:
    ready = make_worker()
    pending = make_worker(
        "http://10.0.0.6:8000", status=WorkerStatus.PENDING, registered=False, model_id="",
        job_type=JobType.ADD, job_state=JobState.PROCESSING, job_updated_at=timezone.now() - timedelta(seconds=30),
    )
    publish(ready)
    REGISTRY.snapshot.workers[0].load.in_flight = 3

    page = admin_client.get(LIST).content.decode()

    assert ready.url in page and pending.url in page
    assert '<span class="gw-badge gw-status-ready">Ready</span>' in page
    assert '<span class="gw-badge gw-status-pending">Pending</span>' in page
    assert "llama-3" in page and "vLLM" in page and "Admin API" in page
    assert 'title="requests in flight from this gateway process">3</span>' in page
    assert '<span class="gw-badge gw-breaker-closed">closed</span>' in page  # no breaker on the handle yet
    assert "AddWorker" in page and "gw-job-processing" in page and "30 s ago" in page
    assert "window.location.reload()" in page  # auto-refresh
    assert SECRET not in page


def test_breaker_column_reads_the_handles_optional_breaker_state(admin_client: Client, monkeypatch) -> None:
    worker = make_worker()
    handle = types.SimpleNamespace(id=str(worker.pk), load=WorkerLoad(in_flight=1), breaker_state="half_open")
    monkeypatch.setattr(console, "_handles", lambda: {handle.id: handle})
    page = admin_client.get(LIST).content.decode()
    assert '<span class="gw-badge gw-breaker-half_open">half-open</span>' in page


class _State(str, enum.Enum):
    OPEN = "open"


def test_breaker_column_falls_back_to_the_breaker_kept_with_the_load(admin_client: Client, monkeypatch) -> None:
    worker = make_worker()
    load = types.SimpleNamespace(
        in_flight=0, breaker=types.SimpleNamespace(state=_State.OPEN), engine_load=None, overloaded=False
    )
    handle = types.SimpleNamespace(id=str(worker.pk), load=load)
    monkeypatch.setattr(console, "_handles", lambda: {handle.id: handle})
    page = admin_client.get(LIST).content.decode()
    assert '<span class="gw-badge gw-breaker-open">open</span>' in page


def test_failed_job_shows_its_message(admin_client: Client) -> None:
    make_worker(job_type=JobType.REMOVE, job_state=JobState.FAILED, job_message="worker refused: 500",
                job_updated_at=timezone.now())
    page = admin_client.get(LIST).content.decode()
    assert "RemoveWorker" in page and "gw-job-failed" in page and "worker refused: 500" in page


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status__exact=draining", ["http://drain:1"]),
        ("runtime_type__exact=sglang", ["http://sglang:1"]),
        ("worker_type__exact=prefill", ["http://prefill:1"]),
        ("q=qwen", ["http://sglang:1"]),
        ("q=drain:1", ["http://drain:1"]),
    ],
)
def test_list_filters_and_search(admin_client: Client, query: str, expected: list[str]) -> None:
    make_worker("http://drain:1", status=WorkerStatus.DRAINING)
    make_worker("http://sglang:1", runtime_type="sglang", model_id="qwen-2")
    make_worker("http://prefill:1", worker_type="prefill")
    page = admin_client.get(f"{LIST}?{query}").content.decode()
    shown = [url for url in ("http://drain:1", "http://sglang:1", "http://prefill:1") if f">{url}</a>" in page]
    assert shown == expected


def test_list_query_count_does_not_grow_with_workers(admin_client: Client, django_assert_max_num_queries) -> None:
    make_worker("http://one:1")
    admin_client.get(LIST)  # warm up (content types, session)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as one:
        admin_client.get(LIST)
    for n in range(2, 7):
        make_worker(f"http://w{n}:1", job_type=JobType.ADD, job_state=JobState.PENDING, job_updated_at=timezone.now())
    with django_assert_max_num_queries(len(one.captured_queries)):
        response = admin_client.get(LIST)
    assert response.content.decode().count('class="gw-badge gw-status-') == 6


# --- the detail page -------------------------------------------------------------------------------------


def test_detail_page_is_read_only_and_shows_the_spec_without_api_key(admin_client: Client) -> None:
    worker = make_worker(model_cards=[{"id": "llama-3", "aliases": ["fast"]}])
    page = admin_client.get(detail(worker)).content.decode()
    assert "View worker" in page
    assert '<pre class="gw-spec">' in page and "&quot;zone&quot;: &quot;a&quot;" in page
    assert "&quot;timeout_secs&quot;: 3" in page and "&quot;fast&quot;" in page
    assert 'name="url"' not in page and 'name="_save"' not in page  # nothing to edit
    for action in ("drain", "reregister", "remove"):
        assert f'formaction="{LIST}{worker.pk}/{action}/"' in page
    assert SECRET not in page and "api_key&quot;" not in page


@pytest.mark.parametrize(
    ("url", "connection_requested", "shown"),
    [("grpc://10.0.0.7:30001", "http", "grpc"), ("grpcs://10.0.0.8:443", "http", "grpc"),
     ("http://10.0.0.9:8000", "grpc", "http")],
)
def test_detail_page_shows_the_connection_mode_of_the_urls_transport(
    admin_client: Client, url: str, connection_requested: str, shown: str
) -> None:
    """The mode is the one the gateway speaks (the URL's scheme), whatever the spec's older
    connection_mode field said; the API shows the same."""
    worker = make_worker(url, connection_mode=connection_requested)
    page = admin_client.get(detail(worker)).content.decode()
    assert re.search(rf"<label>Connection mode:</label>\s*<div class=\"readonly\">{shown}</div>", page), page
    assert worker_object(worker)["connection_mode"] == shown
    assert stored_spec(worker)["connection_mode"] == shown


def test_a_viewer_without_change_permission_sees_no_buttons_and_cannot_act(client: Client) -> None:
    worker = make_worker()
    viewer = User.objects.create_user("vera", password="pw-viewer-123", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_worker"))
    client.login(username="vera", password="pw-viewer-123")
    page = client.get(detail(worker)).content.decode()
    assert worker.url in page and "formaction" not in page
    assert client.get(ADD).status_code == 403
    assert client.post(f"{LIST}{worker.pk}/drain/").status_code == 403
    listing = client.get(LIST).content.decode()
    assert "drain_selected" not in listing
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.READY


# --- the add form ------------------------------------------------------------------------------------------


def test_add_form_has_the_spec_fields_and_a_write_only_key(admin_client: Client) -> None:
    page = admin_client.get(ADD).content.decode()
    for name in ("url", "model_id", "runtime_type", "worker_type", "labels", "priority", "cost"):
        assert f'name="{name}"' in page
    assert '<input type="password" name="api_key"' in page
    assert 'name="_save"' in page and 'name="_continue"' not in page and 'name="_addanother"' not in page


def test_add_form_creates_the_worker_and_queues_registration(
    admin_client: Client, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = admin_client.post(
            ADD,
            add_form(model_id="llama-3", runtime_type="vllm", worker_type="prefill", api_key=SECRET,
                     labels="zone=eu\n\nrealtime = true", priority="7", cost="2.5"),
        )
    assert response.status_code == 302 and response["Location"] == LIST
    assert response.wsgi_request.sensitive_post_parameters == ("api_key",)  # kept out of error reports
    assert len(callbacks) == 1  # the registration job, queued on commit
    worker = Worker.objects.get()
    assert (worker.url, worker.model_id, worker.runtime_type, worker.worker_type) == (
        "http://10.0.0.9:8000", "llama-3", "vllm", "prefill"
    )
    assert worker.labels == {"zone": "eu", "realtime": "true"} and (worker.priority, worker.cost) == (7, 2.5)
    assert worker.api_key == SECRET and worker.source == WorkerSource.API
    assert (worker.job_type, worker.job_state, worker.registered) == (JobType.ADD, JobState.PENDING, False)
    listing = admin_client.get(LIST).content.decode()
    assert "registration job is queued" in listing and worker.url in listing and SECRET not in listing
    assert SECRET not in str(list(LogEntry.objects.values()))


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"url": "ftp://x:1"}, "url must start with a lowercase http://"),
        ({"url": "HTTP://upper:1"}, "url must start with a lowercase http://"),
        ({"url": "http://x:99999"}, "url is invalid"),
        ({"url": "http://"}, "url has no host"),
        ({"labels": "zone"}, "line 1: expected key=value"),
        ({"priority": "high"}, "Enter a whole number."),
        ({"runtime_type": "engine_z"}, "Select a valid choice."),
    ],
)
def test_spec_errors_are_form_errors(admin_client: Client, fields: dict[str, str], error: str) -> None:
    response = admin_client.post(ADD, add_form(api_key=SECRET, **fields))
    page = response.content.decode()
    assert response.status_code == 200
    assert "Please correct the error below." in page and error in page
    assert SECRET not in page  # the key is not echoed back into the form
    assert not Worker.objects.exists()


def test_a_url_already_registered_is_a_form_error(admin_client: Client) -> None:
    existing = make_worker("http://10.0.0.9:8000")
    page = admin_client.post(ADD, add_form()).content.decode()
    assert f"already exists with id {existing.pk}" in page
    assert Worker.objects.count() == 1


# --- actions -------------------------------------------------------------------------------------------------


def act(client: Client, action: str, *workers: Worker) -> Any:
    return client.post(LIST, {"action": action, "_selected_action": [str(w.pk) for w in workers]}, follow=True)


def test_drain_action_sets_draining(admin_client: Client) -> None:
    one, two = make_worker("http://one:1"), make_worker("http://two:1")
    response = act(admin_client, "drain_selected", one, two)
    assert "Draining http://one:1" in response.content.decode()
    assert set(Worker.objects.values_list("status", flat=True)) == {WorkerStatus.DRAINING}


def jobs(callbacks: list[Callable[[], object]]) -> list[Callable[[], object]]:
    """The on-commit callbacks that queue a job (a listed worker's job start is also published to
    the fleet, so GET /workers shows it)."""
    return [callback for callback in callbacks if not isinstance(callback, partial)]


def test_remove_action_queues_remove_worker(admin_client: Client, django_capture_on_commit_callbacks) -> None:
    worker = make_worker()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = act(admin_client, "remove_selected", worker)
    assert "Removal of http://10.0.0.5:8000 queued" in response.content.decode()
    assert len(jobs(callbacks)) == 1
    worker.refresh_from_db()
    assert (worker.job_type, worker.job_state) == (JobType.REMOVE, JobState.PENDING)


def test_reregister_action_queues_add_worker(admin_client: Client, django_capture_on_commit_callbacks) -> None:
    worker = make_worker(status=WorkerStatus.NOT_READY)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        act(admin_client, "reregister_selected", worker)
    assert len(jobs(callbacks)) == 1
    worker.refresh_from_db()
    assert (worker.job_type, worker.job_state, worker.status) == (JobType.ADD, JobState.PENDING, WorkerStatus.PENDING)


def test_delete_selected_is_not_offered(admin_client: Client) -> None:
    make_worker()
    page = admin_client.get(LIST).content.decode()
    assert "delete_selected" not in page
    for action in ("drain_selected", "remove_selected", "reregister_selected"):
        assert f'value="{action}"' in page


def test_detail_buttons_call_the_domain_functions(admin_client: Client, django_capture_on_commit_callbacks) -> None:
    worker = make_worker()
    assert admin_client.get(f"{LIST}{worker.pk}/drain/").status_code == 405
    response = admin_client.post(f"{LIST}{worker.pk}/drain/")
    assert response.status_code == 302 and response["Location"] == detail(worker)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = admin_client.post(f"{LIST}{worker.pk}/reregister/")
    worker.refresh_from_db()
    assert len(jobs(callbacks)) == 1 and (worker.job_type, worker.status) == (JobType.ADD, WorkerStatus.PENDING)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = admin_client.post(f"{LIST}{worker.pk}/remove/")
    assert response["Location"] == LIST
    worker.refresh_from_db()
    assert len(jobs(callbacks)) == 1 and worker.job_type == JobType.REMOVE
    assert LogEntry.objects.filter(object_id=str(worker.pk)).count() == 3


def test_button_on_a_missing_worker_reports_it(admin_client: Client) -> None:
    missing = uuid.uuid4()
    response = admin_client.post(f"{LIST}{missing}/drain/", follow=True)
    assert f"Worker {missing} not found." in response.content.decode()


# --- helpers and the ensure_admin command ----------------------------------------------------------------


def test_stored_spec_never_contains_the_api_key() -> None:
    worker = make_worker(settings={"dp_size": 2, "api_key": "leaked?"})
    spec = console.stored_spec(worker)
    assert spec["dp_size"] == 2 and "api_key" not in spec and SECRET not in str(spec)


def test_ensure_admin_creates_then_updates_a_staff_superuser(monkeypatch, capsys) -> None:
    monkeypatch.setenv("GW_ADMIN_USERNAME", "ops")
    monkeypatch.setenv("GW_ADMIN_PASSWORD", "first-Passw0rd-xyz")
    call_command("ensure_admin")
    user = User.objects.get(username="ops")
    assert user.is_staff and user.is_superuser and user.check_password("first-Passw0rd-xyz")
    user.is_active = False
    user.save()
    call_command("ensure_admin", "--password", "second-Passw0rd-xyz")
    user.refresh_from_db()
    assert user.is_active and user.check_password("second-Passw0rd-xyz")
    assert "first-Passw0rd" not in capsys.readouterr().out
    with pytest.raises(CommandError, match="password refused"):
        call_command("ensure_admin", "--password", "short")
    monkeypatch.delenv("GW_ADMIN_USERNAME")
    with pytest.raises(CommandError, match="no username"):
        call_command("ensure_admin")
