"""An external provider as a user runs it: `manage.py runmockprovider` (our stand-in of an
OpenAI-compatible provider) behind `manage.py rungateway --backend openai --worker-urls URL`, in open
mode, where each caller's bearer token is its own provider key. The gateway reads the provider's
models, drives its /v1/responses and stores the responses, read with the openai SDK in strict mode."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import free_port

pytestmark = pytest.mark.e2e

PROVIDER_KEY = "sk-e2e-provider"


@pytest.mark.parametrize("server", ["uvicorn"])
def test_backend_openai_runs_responses_on_the_provider_and_stores_them(start_gateway, spawn) -> None:
    port = free_port()
    provider = spawn(
        "mockprovider",
        ["runmockprovider", "--host", "127.0.0.1", "--port", str(port), "--model", "gpt-4o-mini", "--api-key", PROVIDER_KEY],
        port, ready_path="/_provider/requests",
    )  # fmt: skip
    gateway = start_gateway("--backend", "openai", "--worker-urls", provider.url, "--ssrf-allow-loopback")
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=PROVIDER_KEY, _strict_response_validation=True, max_retries=0)

    first = client.responses.create(model="gpt-4o-mini", input="hello")
    assert first.status == "completed" and first.output_text == "heard: hello"
    second = client.responses.create(model="gpt-4o-mini", input="again", previous_response_id=first.id)
    assert second.output_text == "heard: hello | again"
    assert client.responses.retrieve(second.id).output_text == second.output_text

    chat = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content == "heard: hi"
    with pytest.raises(openai.AuthenticationError):  # the provider's own 401 for a key it does not know
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-wrong", max_retries=0).responses.create(
            model="gpt-4o-mini", input="x"
        )
