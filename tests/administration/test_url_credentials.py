"""A worker URL with credentials (http://user:password@host) is refused at every way in (the API's
POST and PUT, the console's form, manage.py add_worker, --worker-urls) with the spec's 400, and the
password appears in no answer, form, error or stored row (docs/DECISIONS.md D25)."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from administration.models import Worker, WorkerStatus
from common.config import ConfigError, parse_gateway_args
from common.urls import url_has_credentials

PASSWORD = "hunter2-secret-9c1"
URL = f"http://admin:{PASSWORD}@10.0.0.7:8000"


@pytest.mark.parametrize(
    ("url", "has"),
    [
        (URL, True),
        ("https://token@gpu-1:8443/v1", True),
        ("grpc://user:pw@gpu-2:50051", True),
        ("http://10.0.0.7:8000", False),
        ("http://10.0.0.7:8000/path@with-at", False),
        ("http://10.0.0.7:8000/?next=a@b", False),
        ("ipc:///tmp/engine@0.sock", False),
    ],
)
def test_credentials_are_told_from_an_at_sign_elsewhere(url: str, has: bool) -> None:
    assert url_has_credentials(url) is has


@pytest.mark.django_db
def test_the_api_refuses_them_with_400_and_echoes_nothing() -> None:
    client = Client()
    answer = client.post("/workers", json.dumps({"url": URL}), content_type="application/json")
    assert answer.status_code == 400 and answer.json()["code"] == "BAD_REQUEST"
    assert PASSWORD not in answer.content.decode() and "api_key" in answer.json()["error"]
    assert not Worker.objects.exists()

    worker = Worker.objects.create(url="http://10.0.0.8:8000", registered=True, status=WorkerStatus.READY)
    answer = client.put(f"/workers/{worker.pk}", json.dumps({"url": URL}), content_type="application/json")
    assert answer.status_code == 400 and PASSWORD not in answer.content.decode()
    assert list(Worker.objects.values_list("url", flat=True)) == ["http://10.0.0.8:8000"]


@pytest.mark.django_db
def test_the_console_form_refuses_them_without_showing_the_password(admin_client: Client) -> None:
    form = {"url": URL, "model_id": "", "runtime_type": "unspecified", "worker_type": "regular", "api_key": "",
            "labels": "", "priority": "50", "cost": "1.0"}
    page = admin_client.post("/admin/administration/worker/add/", form)
    assert page.status_code == 200  # the form again, with the error
    body = page.content.decode()
    assert "must not carry credentials" in body and PASSWORD not in body
    assert not Worker.objects.exists()


@pytest.mark.django_db
def test_add_worker_and_the_flag_refuse_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CommandError) as refused:
        call_command("add_worker", URL)
    assert PASSWORD not in str(refused.value) and not Worker.objects.exists()
    with pytest.raises(ConfigError) as bad_flag:
        parse_gateway_args(["--worker-urls", URL])
    assert "credentials" in str(bad_flag.value) and PASSWORD not in str(bad_flag.value)
    captured = capsys.readouterr()
    assert PASSWORD not in captured.out + captured.err
