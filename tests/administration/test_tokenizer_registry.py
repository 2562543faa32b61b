"""The tokenizer registry (spec 3, /v1/tokenizers): the lifecycle through the API with real load jobs
on the gateway's job threads, every source kind (a local fixture directory, a model-hub id through
huggingface_hub offline from a local cache, a gRPC worker's GetTokenizer from the stand-in engine),
the failed status kept about five minutes (by a moved clock, not by sleeping), the console listing,
and the data plane's view: the registry snapshot, 503 tokenizer_not_ready while a tokenizer loads,
500 tokenizer_not_found with --disable-tokenizer-autoload."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import huggingface_hub.constants
import pytest
from django.test import AsyncClient, Client
from django.utils import timezone

from administration import tokenizer_jobs
from administration.control_auth import reset_control_plane_auth
from administration.jobs import wait_for_local_jobs
from administration.models import RegisteredTokenizer, TokenizerStatus
from administration.registry_sync import RegistrySync
from common.config import GatewayConfig, install_config, parse_gateway_args
from inference import errors
from inference.errors import GatewayError
from inference.pipeline import tokenizer_registry
from inference.pipeline.tokenizer_registry import TOKENIZERS, TokenizerEntry, TokenizerResolver
from inference.pipeline.tokenizers import ModelTokenizer, load_tokenizer
from inference.routing.registry import REGISTRY
from standins.grpc_engine import GrpcEngineConfig, GrpcEngineServer
from tests.conftest import until
from standins.fixtures import FIXTURE_MODELS as FIXTURES

pytestmark = pytest.mark.django_db(transaction=True)

MISTRAL = FIXTURES / "mistral"  # the smallest fixture tokenizer (~2 MB)
MISTRAL_VOCAB = load_tokenizer(MISTRAL).vocab_size
CP_KEY = "sk-cp-admin-tokenizers"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    install_config(GatewayConfig(), export=False)
    TOKENIZERS.publish([])
    TOKENIZERS.clear()
    yield
    wait_for_local_jobs()
    TOKENIZERS.publish([])
    TOKENIZERS.clear()
    install_config(GatewayConfig(), export=False)
    reset_control_plane_auth()


@pytest.fixture
def api() -> AsyncClient:
    return AsyncClient()


@pytest.fixture
def work_dir(settings: Any, tmp_path: Path) -> Path:
    """Fetched tokenizers go under the test's own directory, not the repository's data/."""
    settings.DATA_DIR = tmp_path / "data"
    return Path(settings.DATA_DIR) / "tokenizers"


class Gate:
    """Holds every load job at its fetch until opened (to watch the processing status)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
        self.opened = threading.Event()
        real: Callable[..., Any] = module.resolve_tokenizer_source

        def gated(*args: Any, **kwargs: Any) -> Any:
            self.opened.wait(10)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, "resolve_tokenizer_source", gated)

    def open(self) -> None:
        self.opened.set()


async def add(api: AsyncClient, body: Any) -> Any:
    return await api.post("/v1/tokenizers", body, content_type="application/json")


async def status_of(api: AsyncClient, key: str) -> Any:
    return await api.get(f"/v1/tokenizers/{key}/status")


async def reaches(api: AsyncClient, tokenizer_id: str, status: str) -> dict[str, Any]:
    async def check() -> bool:
        answer = await status_of(api, tokenizer_id)
        return answer.status_code == 200 and answer.json()["status"] == status

    await until(check)
    body: dict[str, Any] = (await status_of(api, tokenizer_id)).json()
    return body


async def test_lifecycle_pending_processing_completed_lookup_duplicate_delete(
    api: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch, tokenizer_jobs)
    created = await add(api, {"name": "mistral-7b", "source": str(MISTRAL)})
    assert created.status_code == 202
    body = created.json()
    assert body["status"] == "pending" and body["message"] and set(body) == {"id", "status", "message"}
    tokenizer_id = body["id"]

    processing = await reaches(api, tokenizer_id, "processing")
    assert processing == {"id": tokenizer_id, "status": "processing", "message": processing["message"]}
    # While it loads: its status only by the id from the add call; no record yet.
    assert (await status_of(api, "mistral-7b")).json() == {
        "error": {"message": "No tokenizer or tokenizer job 'mistral-7b'", "type": "not_found"}
    }
    assert (await api.get(f"/v1/tokenizers/{tokenizer_id}")).status_code == 404
    # A duplicate name while the first loads: 409 naming the existing one.
    duplicate = await add(api, {"name": "mistral-7b", "source": str(MISTRAL)})
    assert duplicate.status_code == 409
    assert duplicate.json()["id"] == tokenizer_id and duplicate.json()["status"] == "failed"

    gate.open()
    completed = await reaches(api, tokenizer_id, "completed")
    assert completed["vocab_size"] == MISTRAL_VOCAB
    record = {"id": tokenizer_id, "name": "mistral-7b", "source": str(MISTRAL), "vocab_size": MISTRAL_VOCAB}
    for key in (tokenizer_id, "mistral-7b"):
        assert (await api.get(f"/v1/tokenizers/{key}")).json() == record
        assert (await status_of(api, key)).json() == completed
    assert (await api.get("/v1/tokenizers")).json() == {"tokenizers": [record]}
    again = await add(api, {"name": "mistral-7b", "source": "elsewhere"})
    assert again.status_code == 409 and again.json()["id"] == tokenizer_id

    removed = await api.delete("/v1/tokenizers/mistral-7b")
    assert removed.status_code == 200 and removed.json()["success"] is True and removed.json()["message"]
    gone = await api.delete(f"/v1/tokenizers/{tokenizer_id}")
    assert gone.status_code == 404 and gone.json()["success"] is False and gone.json()["message"]
    missing = await api.get(f"/v1/tokenizers/{tokenizer_id}")
    assert missing.status_code == 404
    assert missing.json() == {"error": {"message": f"Tokenizer '{tokenizer_id}' not found", "type": "tokenizer_not_found"}}
    assert (await api.get("/v1/tokenizers")).json() == {"tokenizers": []}


async def test_a_failed_load_is_kept_about_five_minutes(api: AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    created = await add(api, {"name": "broken", "source": "/nonexistent/tokenizer/dir"})
    assert created.status_code == 202
    tokenizer_id = created.json()["id"]
    failed = await reaches(api, tokenizer_id, "failed")
    assert "no tokenizer.json" in failed["message"] and "vocab_size" not in failed
    assert (await status_of(api, "broken")).status_code == 404  # a failed job only by its id
    assert (await api.get(f"/v1/tokenizers/{tokenizer_id}")).json()["error"]["type"] == "tokenizer_not_found"

    later = timezone.now() + timedelta(minutes=4)
    monkeypatch.setattr(tokenizer_jobs, "clock", lambda: later)
    assert (await status_of(api, tokenizer_id)).json()["status"] == "failed"
    later = timezone.now() + timedelta(minutes=5, seconds=1)
    monkeypatch.setattr(tokenizer_jobs, "clock", lambda: later)
    expired = await status_of(api, tokenizer_id)
    assert expired.status_code == 404 and expired.json()["error"]["type"] == "not_found"
    assert not await RegisteredTokenizer.objects.filter(pk=tokenizer_id).aexists()


async def test_a_failed_name_can_be_added_again(api: AsyncClient) -> None:
    first = (await add(api, {"name": "retry-me", "source": "/nonexistent/one"})).json()["id"]
    await reaches(api, first, "failed")
    second = await add(api, {"name": "retry-me", "source": str(MISTRAL)})
    assert second.status_code == 202 and second.json()["id"] != first
    await reaches(api, second.json()["id"], "completed")
    assert (await status_of(api, first)).json()["status"] == "failed"  # still there for its retention


async def test_a_chat_template_that_is_not_there_fails_the_load(api: AsyncClient) -> None:
    created = await add(api, {"name": "t", "source": str(MISTRAL), "chat_template_path": "/no/such/template.jinja"})
    failed = await reaches(api, created.json()["id"], "failed")
    assert "neither a file nor a template" in failed["message"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "not valid JSON"),
        (b"[]", "JSON object"),
        (b"{}", "'name' is required"),
        (b'{"name": "x"}', "'source' is required"),
        (b'{"name": "", "source": "s"}', "must not be empty"),
        (b'{"name": "x", "source": 3}', "must be a string"),
        (b'{"name": "x", "source": "s", "chat_template_path": 1}', "must be a string"),
    ],
)
async def test_a_bad_add_request_is_400_bad_request(api: AsyncClient, body: bytes, reason: str) -> None:
    answer = await api.post("/v1/tokenizers", body, content_type="application/json")
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "bad_request" and reason in answer.json()["error"]["message"]
    assert not await RegisteredTokenizer.objects.aexists()


def test_the_routes_take_control_plane_auth() -> None:
    install_config(GatewayConfig(api_key="sk-data-plane", control_plane_api_keys=(("k", "ops", "admin", CP_KEY),)),
                   export=False)
    reset_control_plane_auth()
    client = Client()
    for method, path in (("get", "/v1/tokenizers"), ("post", "/v1/tokenizers"), ("get", "/v1/tokenizers/x"),
                         ("get", "/v1/tokenizers/x/status"), ("delete", "/v1/tokenizers/x")):
        for key in (None, "sk-data-plane"):
            headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
            denied = getattr(client, method)(path, **headers)
            assert denied.status_code == 401 and denied.json()["error"]["type"] == "unauthorized", (method, path, key)
    allowed = client.get("/v1/tokenizers", HTTP_AUTHORIZATION=f"Bearer {CP_KEY}")
    assert allowed.status_code == 200 and allowed.json() == {"tokenizers": []}


async def test_a_model_hub_id_loads_through_the_hub_client_offline(
    api: AsyncClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """huggingface_hub's snapshot_download, offline, from a local hub cache holding the fixture."""
    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = cache / "models--acme--tiny-mistral" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (snapshot / name).symlink_to(MISTRAL / name)
    (cache / "models--acme--tiny-mistral" / "refs").mkdir()
    (cache / "models--acme--tiny-mistral" / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    created = await add(api, {"name": "tiny", "source": "acme/tiny-mistral"})
    completed = await reaches(api, created.json()["id"], "completed")
    assert completed["vocab_size"] == MISTRAL_VOCAB
    assert (await RegisteredTokenizer.objects.aget(name="tiny")).location == str(snapshot.resolve())

    absent = await add(api, {"name": "absent", "source": "acme/not-cached"})
    failed = await reaches(api, absent.json()["id"], "failed")
    assert "model hub" in failed["message"]


@pytest.fixture
async def grpc_engine() -> AsyncIterator[GrpcEngineServer]:
    server = GrpcEngineServer(GrpcEngineConfig(runtime="vllm", tokenizer=str(MISTRAL)))
    await server.start()
    yield server
    await server.stop()


async def test_a_grpc_worker_source_loads_through_get_tokenizer(
    api: AsyncClient, grpc_engine: GrpcEngineServer, work_dir: Path
) -> None:
    created = await add(api, {"name": "from-worker", "source": grpc_engine.url})
    completed = await reaches(api, created.json()["id"], "completed")
    assert completed["vocab_size"] == MISTRAL_VOCAB
    location = Path((await RegisteredTokenizer.objects.aget(name="from-worker")).location)
    assert location.parent == work_dir / "workers"
    assert (location / "tokenizer.json").read_bytes() == (MISTRAL / "tokenizer.json").read_bytes()

    grpc_engine.state.tokenizer_sha256 = "0" * 64  # the archive no longer matches its digest
    tampered = await add(api, {"name": "tampered", "source": grpc_engine.url})
    failed = await reaches(api, tampered.json()["id"], "failed")
    assert "sha256" in failed["message"]


def test_the_console_lists_the_tokenizers(admin_client: Client) -> None:
    now = timezone.now()
    loaded = RegisteredTokenizer.objects.create(name="qwen3", source="Qwen/Qwen3-8B", status=TokenizerStatus.COMPLETED,
                                       vocab_size=151669, updated_at=now, message="Tokenizer loaded")
    RegisteredTokenizer.objects.create(name="bad", source="/nowhere", status=TokenizerStatus.FAILED,
                                       updated_at=now, message="Failed to load the tokenizer: no tokenizer.json")
    page = admin_client.get("/admin/administration/registeredtokenizer/")
    assert page.status_code == 200
    text = page.content.decode()
    for shown in ("qwen3", "Qwen/Qwen3-8B", "151669", "Completed (ready)", "bad", "no tokenizer.json"):
        assert shown in text, shown
    assert admin_client.get("/admin/administration/registeredtokenizer/add/").status_code == 403
    detail = admin_client.get(f"/admin/administration/registeredtokenizer/{loaded.pk}/change/")
    assert detail.status_code == 200 and "Qwen/Qwen3-8B" in detail.content.decode()


# --- the data plane -----------------------------------------------------------------------------------


def _raised(call: Callable[[], object]) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        call()
    return caught.value


async def test_503_tokenizer_not_ready_while_it_loads_then_the_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate(monkeypatch, tokenizer_registry)
    resolver = TokenizerResolver()
    resolver.publish([TokenizerEntry(id="t1", name="mistral-7b", location=str(MISTRAL))])
    for _ in range(2):  # the request that starts the load, and one while it runs
        error = _raised(lambda: resolver.tokenizer_for("mistral-7b"))
        assert (error.status, error.code, error.error_type) == (503, "tokenizer_not_ready", "service_unavailable")
        headers, _ = errors.render_json(error)
        assert (b"retry-after", b"1") in headers
    assert resolver.cache.loading(str(MISTRAL))
    gate.open()

    async def loaded() -> bool:
        try:
            return isinstance(resolver.tokenizer_for("mistral-7b"), ModelTokenizer)
        except GatewayError as still:
            assert still.code == "tokenizer_not_ready"
            return False

    await until(loaded)
    assert resolver.tokenizer_for("mistral-7b").vocab_size == MISTRAL_VOCAB


def test_500_tokenizer_not_found_with_autoload_disabled() -> None:
    install_config(GatewayConfig(disable_tokenizer_autoload=True), export=False)
    resolver = TokenizerResolver()
    error = _raised(lambda: resolver.tokenizer_for("unregistered-model"))
    assert (error.status, error.code, error.error_type) == (500, "tokenizer_not_found", "internal_error")
    assert error.to_dict()["error"]["param"] is None


async def test_with_autoload_a_source_that_fails_is_500_for_a_while() -> None:
    resolver = TokenizerResolver()
    assert _raised(lambda: resolver.tokenizer_for("m", location="/no/such/dir")).code == "tokenizer_not_ready"

    async def failed() -> bool:
        return _raised(lambda: resolver.tokenizer_for("m", location="/no/such/dir")).code == "tokenizer_not_found"

    await until(failed)
    assert "no tokenizer.json" in _raised(lambda: resolver.tokenizer_for("m", location="/no/such/dir")).message


async def test_flags_choose_the_tokenizer_of_unregistered_models() -> None:
    config = parse_gateway_args(["--model-path", "acme/model", "--tokenizer-path", str(MISTRAL),
                                 "--chat-template", "{{ messages }}", "--disable-tokenizer-autoload"])
    assert (config.model_path, config.tokenizer_path, config.chat_template, config.disable_tokenizer_autoload) == (
        "acme/model", str(MISTRAL), "{{ messages }}", True
    )
    install_config(config, export=False)
    resolver = TokenizerResolver()
    assert _raised(lambda: resolver.tokenizer_for("any-model")).code == "tokenizer_not_ready"

    async def ready() -> bool:
        try:
            tokenizer = resolver.tokenizer_for("any-model")
        except GatewayError:
            return False
        return tokenizer.chat_template is not None and tokenizer.vocab_size == MISTRAL_VOCAB

    await until(ready)


@pytest.fixture
async def fleet() -> AsyncIterator[RegistrySync]:
    running = RegistrySync(GatewayConfig())
    await running.astart()
    yield running
    await running.astop()
    REGISTRY.publish([], {})


async def test_every_process_sees_the_registry_through_its_snapshot(api: AsyncClient, fleet: RegistrySync) -> None:
    created = await add(api, {"name": "mistral-7b", "source": str(MISTRAL)})
    await reaches(api, created.json()["id"], "completed")

    async def listed() -> bool:
        return TOKENIZERS.directory.by_name("mistral-7b") is not None

    await until(listed)
    entry = TOKENIZERS.directory.by_name("mistral-7b")
    assert entry is not None and entry.location == str(MISTRAL) and entry.vocab_size == MISTRAL_VOCAB

    async def served() -> bool:
        try:
            return tokenizer_registry.tokenizer_for("mistral-7b").vocab_size == MISTRAL_VOCAB
        except GatewayError as error:
            assert error.code == "tokenizer_not_ready"
            return False

    await until(served)
    assert (await api.delete("/v1/tokenizers/mistral-7b")).status_code == 200

    async def dropped() -> bool:
        return TOKENIZERS.directory.by_name("mistral-7b") is None

    await until(dropped)


@pytest.mark.parametrize("key", ["a%0Ab", "org%2Fname", "%20", "x%00y"])
async def test_any_key_gets_the_routes_own_404(api: AsyncClient, key: str) -> None:
    """Names may hold "/" (hub ids), line breaks or NUL: still the tokenizer routes' own 404 bodies."""
    got = await api.get(f"/v1/tokenizers/{key}")
    assert got.status_code == 404 and got.json()["error"]["type"] == "tokenizer_not_found"
    status = await status_of(api, key)
    assert status.status_code == 404 and status.json()["error"]["type"] == "not_found"
    removed = await api.delete(f"/v1/tokenizers/{key}")
    assert removed.status_code == 404 and removed.json()["success"] is False
