"""schemathesis, driven by the published description (GET /openapi.json), against the control plane
in-process (Django's WSGI handler: the same views, URLconf and middleware as under ASGI), with
control-plane auth configured, every check on: no answer is a 5xx, every answer's status, content type,
headers and body are the ones the description gives, a request the description allows is accepted
(2xx, or the 409 of a URL or name already taken, with the description's conflict body), one it forbids
is refused with a 4xx, and one without the credential with 401.

The jobs the requests start run for real (a registration, on a job thread as without a broker; a
tokenizer load): after each example every job has ended, completed or failed, and no row is left
pending or processing, holding its URL or name. A hook keeps the jobs on loopback: a registered http
URL that the description allows is turned onto a real mock worker (registrations complete, and later
POSTs meet the 409s), one of TLS or gRPC onto a loopback port nothing listens on (its scheme kept), and a
tokenizer source that would be fetched (a hub id, a gRPC worker) onto a fixture tokenizer. Nothing may
be logged as an escaped exception (the suite's log check, tests/conftest.py)."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

import jsonschema  # type: ignore[import-untyped]
import pytest
import schemathesis
from aiohttp import web
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import positive_data_acceptance

from administration.api.openapi import ADD_TOKENIZER, SCHEMA_PATH
from administration.api.tokenizers import NAME_MAX, PATH_FORMAT
from administration.control_auth import reset_control_plane_auth
from administration.jobs import wait_for_local_jobs
from administration.models import JobState, RegisteredTokenizer, TokenizerStatus, Worker
from administration.usage_read import UsageQueryError, parse_price, parse_usage_query
from administration.worker_spec import spec_schema
from common.config import GatewayConfig, current_config, install_config
from inference.pipeline.tokenizer_sources import SourceKind, source_kind
from standins.fixtures import FIXTURE_MODELS
from standins.mock_worker import MockWorkerConfig, build_app
from tests.conftest import free_port

KEY = "sk-cp-schemathesis"
JOB_WAIT_SECS = 30.0  # every job of one example ends within this (a failed probe gives up after 0.1 s)
FIXTURE_TOKENIZER = str(FIXTURE_MODELS / "mistral")
CLOSED = f"127.0.0.1:{free_port()}"  # where TLS and gRPC URLs go: nothing listens, the probe fails at once


def _file_name_parts() -> st.SearchStrategy[str]:
    """A path whose "/"-separated parts fit a file name (PATH_FORMAT): at most NAME_MAX bytes each."""
    # No lone surrogates: they have no UTF-8 form (the body could not carry them, and the schema
    # validator that checks a drawn value cannot encode them).
    part = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), max_size=NAME_MAX).filter(
        lambda text: len(text.encode("utf-8", "surrogatepass")) <= NAME_MAX
    )
    return st.lists(part, min_size=1, max_size=4).map("/".join)


schemathesis.openapi.format(PATH_FORMAT, _file_name_parts())
schema = schemathesis.openapi.from_wsgi(SCHEMA_PATH, get_wsgi_application())
URL_SCHEMA = spec_schema(("url",))["properties"]["url"]
SOURCE_SCHEMA = ADD_TOKENIZER["properties"]["source"]  # type: ignore[index]


@schema.auth()
class ControlPlaneKey:
    def get(self, case: schemathesis.Case, context: Any) -> str:
        return KEY

    def set(self, case: schemathesis.Case, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture
def control_plane() -> Iterator[None]:
    """Control-plane keys, and a registration that gives up at once on a worker that does not answer."""
    install_config(
        GatewayConfig(control_plane_api_keys=(("fuzz", "fuzzer", "admin", KEY),), worker_startup_timeout_secs=0.1,
                      worker_startup_check_interval=0.1),
        export=False,
    )  # fmt: skip
    reset_control_plane_auth()
    yield
    wait_for_local_jobs(JOB_WAIT_SECS)
    install_config(GatewayConfig(), export=False)
    reset_control_plane_auth()


@pytest.fixture
def mock_worker() -> Iterator[str]:
    """A real mock worker on loopback, served by its own event loop on a thread (the test is sync)."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(build_app(MockWorkerConfig(model="mock-model")), access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    thread = threading.Thread(target=loop.run_forever, name="fuzz-mock-worker", daemon=True)
    thread.start()
    yield f"127.0.0.1:{runner.addresses[0][1]}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _allowed(value: Any, property_schema: dict[str, Any]) -> bool:
    return jsonschema.Draft4Validator(property_schema).is_valid(value)


def _on_loopback(case: schemathesis.Case, worker: str) -> None:
    """The hook keeping jobs on loopback. Only values the description allows are turned (so a case
    built to break the description still breaks it), into values it allows too."""
    if not isinstance(case.body, dict) or case.method != "POST":
        return
    url, source = case.body.get("url"), case.body.get("source")
    if case.path == "/workers" and isinstance(url, str) and _allowed(url, URL_SCHEMA):
        scheme = url.split("://", 1)[0]
        if scheme != "ipc":  # refused by the job at once
            case.body["url"] = f"{scheme}://{worker if scheme == 'http' else CLOSED}"
    elif case.path == "/v1/tokenizers" and isinstance(source, str) and _allowed(source, SOURCE_SCHEMA) \
            and not _breaks_path_format(case):
        if source_kind(source) is not SourceKind.LOCAL:
            case.body["source"] = FIXTURE_TOKENIZER


def _breaks_path_format(case: schemathesis.Case) -> bool:
    """A tokenizer path in the body with a part longer than NAME_MAX bytes (PATH_FORMAT)."""
    if case.path != "/v1/tokenizers" or not isinstance(case.body, dict):
        return False
    paths = [case.body.get(name) for name in ("source", "chat_template_path")]
    return any(
        len(part.encode("utf-8", "surrogatepass")) > NAME_MAX
        for path in paths if isinstance(path, str) for part in path.split("/")
    )  # fmt: skip


def _breaks_a_usage_rule(case: schemathesis.Case) -> bool:
    """A /usage range the description cannot bound (ending before it starts, longer than
    --usage-max-range-days), or a price from a moment already past (a price never rewrites spend):
    the rules of the routes themselves, asked here."""
    now = datetime.now(timezone.utc)
    try:
        if case.path == "/usage" and case.method == "GET":
            query = {name: str(value[-1] if isinstance(value, list) and value else value)
                     for name, value in (case.query or {}).items()}  # the last of a repeated name, as Django
            parse_usage_query(query, today=now.date(), max_days=current_config().usage_max_range_days)
        elif case.path == "/prices" and case.method == "POST" and isinstance(case.body, dict):
            parse_price(case.body, now - timedelta(seconds=5))  # the request reaches the view a moment later
    except UsageQueryError:
        return True
    return False


def _every_job_ended() -> None:
    wait_for_local_jobs(JOB_WAIT_SECS)
    running = list(Worker.objects.filter(job_state__in=[JobState.PENDING, JobState.PROCESSING]).values("url", "job_type"))
    assert not running, f"worker jobs left unfinished: {running}"
    loading = list(RegisteredTokenizer.objects.filter(status__in=[TokenizerStatus.PENDING, TokenizerStatus.PROCESSING])
                   .values("name", "source"))  # fmt: skip
    assert not loading, f"tokenizer loads left unfinished: {loading}"


@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_control_plane_answers_as_described(
    case: schemathesis.Case, control_plane: None, mock_worker: str
) -> None:
    _on_loopback(case, mock_worker)
    response = case.call()
    if _breaks_path_format(case) or _breaks_a_usage_rule(case):
        # Not data the description allows (its PATH_FORMAT), though schemathesis's boundary values
        # ignore a format of our own; or a usage rule no schema states: refused by that rule, and
        # every other check holds.
        assert 400 <= response.status_code < 500, response.text
        case.validate_response(response, excluded_checks=[positive_data_acceptance])
    else:
        case.validate_response(response)
    _every_job_ended()
