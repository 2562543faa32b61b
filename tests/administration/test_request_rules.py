"""What the body alone decides is refused at the request (issue 22, item 2): a worker spec's rules are
400 BAD_REQUEST before any job starts, through the one parser every entry point uses (POST and PUT
/workers, PATCH, the console, manage.py add_worker, --worker-urls), so no row is written and the
URL stays free; a tokenizer source that can name no file is 400 bad_request before its load is
queued. Every case here would have been accepted (202) and then failed, or crashed, in its job."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from hypothesis import given, settings
from hypothesis import strategies as st

from administration.models import RegisteredTokenizer, Worker
from administration.worker_spec import URL_PATTERN, SpecRuleError, check_url, parse_worker_spec
from administration.workers import sync_cli_workers
from common.config import ConfigError, parse_gateway_args
from common.urls import WORKER_URL_MAX_LENGTH

pytestmark = pytest.mark.django_db  # in a test transaction: a 202 here starts no job

URL = "http://127.0.0.1:9"
UNSENDABLE_KEYS = ["sk-clé", "sk key", "sk-key\n", "sk-key\r\nX-Injected: 1", "sk-\x00", "k" * 513]


def post(client: Client, body: Any) -> Any:
    return client.post("/workers", body, content_type="application/json")


@pytest.mark.parametrize("key", UNSENDABLE_KEYS, ids=["non-ascii", "space", "newline", "header-injection", "nul", "too-long"])
def test_a_key_that_cannot_be_sent_as_a_header_is_400_and_the_url_stays_free(client: Client, key: str) -> None:
    refused = post(client, {"url": URL, "api_key": key})
    assert refused.status_code == 400 and refused.json()["code"] == "BAD_REQUEST"
    assert "api_key" in refused.json()["error"] and key not in refused.json()["error"]  # the key is never echoed
    assert not Worker.objects.exists()

    accepted = post(client, {"url": URL, "api_key": "sk-printable-ascii_KEY.0~"})
    assert accepted.status_code == 202, accepted.content  # nothing holds the URL

    patched = client.patch(f"/workers/{accepted.json()['worker_id']}", {"api_key": key}, content_type="application/json")
    assert patched.status_code == 400 and patched.json()["code"] == "BAD_REQUEST"
    assert Worker.objects.get().api_key == "sk-printable-ascii_KEY.0~"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"overload": {"waiting_requests": 0}}, "overload.waiting_requests must be at least 1"),
        ({"overload": {"token_usage": 0}}, "overload.token_usage must be in (0.0, 1.0]"),
        ({"overload": {"token_usage": 1.5}}, "overload.token_usage must be in (0.0, 1.0]"),
        ({"models": [{"id": "m", "tool_parser": "no_such_parser"}]}, "models[0].tool_parser: unknown tool parser"),
        ({"models": [{"id": "m", "reasoning_parser": "nope"}]}, "models[0].reasoning_parser: unknown reasoning parser"),
        ({"labels": {"tool_parser": "no_such_parser"}}, "labels.tool_parser: unknown tool parser"),
        ({"runtime_type": "external", "url": "grpc://127.0.0.1:9"}, "external provider is reached over http"),
        ({"url": "http://h/" + "p" * WORKER_URL_MAX_LENGTH}, f"longer than {WORKER_URL_MAX_LENGTH}"),
    ],
)
def test_rules_the_job_checked_after_202_are_400_at_the_request(client: Client, body: dict[str, Any], said: str) -> None:
    refused = post(client, {"url": URL, **body})
    assert refused.status_code == 400 and refused.json()["code"] == "BAD_REQUEST"
    assert said in refused.json()["error"]
    assert not Worker.objects.exists()
    put = client.put(f"/workers/{uuid.uuid4()}", {"url": URL, **body}, content_type="application/json")
    assert put.status_code == 400 and said in put.json()["error"]  # refused before the worker is looked up


def test_rules_within_range_and_known_parser_names_in_any_spelling_are_accepted(client: Client) -> None:
    body = {
        "url": URL, "overload": {"waiting_requests": 1, "token_usage": 1.0}, "http_pool": {"http2": False},
        "models": [{"id": "m", "tool_parser": "Qwen25", "reasoning_parser": "deepseek-r1"}],
        "labels": {"tool_parser": "llama3_json", "zone": "anything"},
    }
    assert post(client, body).status_code == 202


def test_http2_true_is_accepted_at_the_request(client: Client) -> None:
    """http_pool.http2 true is the job's to check (spec 3: a worker speaking only HTTP/1.1 fails its
    registration; D111), no longer refused at the request (D49 refused it while the relay spoke HTTP/1.1 only)."""
    assert post(client, {"url": URL, "http_pool": {"http2": True}}).status_code == 202


def test_a_wrong_type_is_still_422_before_any_rule(client: Client) -> None:
    answer = post(client, {"url": URL, "overload": {"waiting_requests": 0}, "priority": "high"})
    assert answer.status_code == 422 and answer["Content-Type"].startswith("text/plain")


def test_the_add_worker_command_refuses_what_the_api_refuses() -> None:
    with pytest.raises(CommandError, match="api_key must be printable ASCII"):
        call_command("add_worker", URL, "--api-key", "sk-clé", "--wait", "0")
    with pytest.raises(CommandError, match="labels.tool_parser: unknown tool parser"):
        call_command("add_worker", URL, "--label", "tool_parser=no_such_parser", "--wait", "0")
    assert not Worker.objects.exists()


def test_worker_urls_take_the_same_url_rules() -> None:
    for bad in ("http://bad host:1", "http://x:99999", "http://h/" + "p" * WORKER_URL_MAX_LENGTH):
        with pytest.raises(SpecRuleError):
            check_url(bad)
        with pytest.raises(ConfigError):
            parse_gateway_args(["--worker-urls", bad])
    with pytest.raises(SpecRuleError, match="external provider"):
        parse_worker_spec({"url": "grpc://127.0.0.1:9", "runtime_type": "external"})
    workers = sync_cli_workers([URL])  # the flag's workers are parsed as specs too
    assert [worker.url for worker in workers] == [URL]


def test_the_url_length_is_the_store_columns() -> None:
    assert Worker._meta.get_field("url").max_length == WORKER_URL_MAX_LENGTH


@settings(max_examples=300, deadline=None)
@given(st.from_regex(URL_PATTERN, fullmatch=True).filter(lambda url: len(url) <= WORKER_URL_MAX_LENGTH))
def test_every_url_the_published_pattern_allows_is_accepted(url: str) -> None:
    check_url(url)


@pytest.mark.parametrize(
    "url", ["", "HTTP://a:1", "ftp://x:1", "http://", "ipc://", "http://bad host:1", "http://x:99999", "localhost:8000",
            "http://user:pw@h:1", "http://[::g]:1"],
)
def test_urls_the_rules_refuse_are_outside_the_published_pattern(url: str) -> None:
    assert re.fullmatch(URL_PATTERN, url) is None


@pytest.mark.parametrize("field", ["source", "chat_template_path"])
@pytest.mark.parametrize("value", ["a" * 300, "org/" + "b" * 256, "/models/" + "é" * 128])
def test_a_tokenizer_path_no_file_system_holds_is_400_at_the_request(client: Client, field: str, value: str) -> None:
    body = {"name": "long", "source": "org/model", field: value}
    answer = client.post("/v1/tokenizers", body, content_type="application/json")
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "bad_request"
    assert "path component longer than 255 bytes" in answer.json()["error"]["message"]
    assert not RegisteredTokenizer.objects.exists()  # the name is free
    long_path = "/models/" + "/".join(["c" * 200] * 5)  # long, each part a file name: the load judges it
    assert client.post("/v1/tokenizers", {"name": "long", "source": long_path}, content_type="application/json").status_code == 202
