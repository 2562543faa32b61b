"""Item normalization and ids, the tenant scope rule, the history flags, and a store outage answered
503 on the conversation routes."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError

from common.config import ConfigError, parse_gateway_args
from inference.auth import ANONYMOUS, SHARED, Identity, IdentityKind
from responses_api.ids import ITEM_PREFIXES, new_item_id
from responses_api.items import ItemError, parse_item, with_id
from responses_api.scope import OPEN_SCOPE, SHARED_SCOPE, scope_of, tenant_scope
from responses_api.storage import install_history_store
from responses_api.storage.base import ConversationRecord, ItemReference
from responses_api.storage.memory import MemoryHistoryStore
from tests.conftest import ALICE, GatewayFactory
from tests.responses_api.conftest import TENANT_KEYS


def test_scopes() -> None:
    assert scope_of(Identity(IdentityKind.TENANT, "acme")) == "tenant:acme"
    assert scope_of(SHARED) == SHARED_SCOPE == "shared"
    assert scope_of(ANONYMOUS) == OPEN_SCOPE == "open"
    long_id = "t" * 400
    assert tenant_scope(long_id).startswith("tenant#") and len(tenant_scope(long_id)) <= 300
    assert tenant_scope(long_id) != tenant_scope(long_id + "x")


def test_generated_ids_carry_their_type_prefix() -> None:
    assert new_item_id("message").startswith("msg_") and len(new_item_id("message")) == 4 + 48
    assert ITEM_PREFIXES["function_call"] == "fc_" and ITEM_PREFIXES["mcp_call"] == "mcp_"
    assert ITEM_PREFIXES["reasoning"] == "rs_" and new_item_id("something_new").startswith("item_")
    assert new_item_id("message") != new_item_id("message")


def test_items_are_normalized_with_id_and_type_first() -> None:
    item = parse_item({"role": "user", "content": "hi"}, "items[0]")
    assert isinstance(item, dict) and list(item)[:2] == ["id", "type"]
    assert item["content"] == [{"type": "input_text", "text": "hi"}] and item["status"] == "completed"
    kept = parse_item({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "x",
                                                                          "extra": 1}], "id": "msg_mine"}, "i")
    assert isinstance(kept, dict) and kept["id"] == "msg_mine" and kept["content"][0]["extra"] == 1
    assert parse_item({"type": "item_reference", "id": "msg_x"}, "i") == ItemReference("msg_x")
    image = parse_item({"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}, "i")
    assert isinstance(image, dict) and image["content"][0]["detail"] == "auto"
    assert with_id({"type": "reasoning", "summary": []})["id"].startswith("rs_")
    with pytest.raises(ItemError, match=r"items\[3\]\.role"):
        parse_item({"type": "message", "content": "x"}, "items[3]")


def test_history_flags() -> None:
    config = parse_gateway_args(["--history-backend", "memory", "--history-memory-max-entries", "50",
                                 "--history-retention-days", "0"])
    assert (config.history_backend, config.history_memory_max_entries, config.history_retention_days) == (
        "memory", 50, 0)
    defaults = parse_gateway_args([])
    assert (defaults.history_backend, defaults.history_memory_max_entries, defaults.history_retention_days) == (
        "db", 10000, 30)
    for bad in (["--history-backend", "redis"], ["--history-memory-max-entries", "0"],
                ["--history-retention-days", "-1"]):
        with pytest.raises(ConfigError):
            parse_gateway_args(bad)


def test_history_flags_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_HISTORY_BACKEND", "none")
    monkeypatch.setenv("GW_HISTORY_RETENTION_DAYS", "7")
    config = parse_gateway_args([])
    assert (config.history_backend, config.history_retention_days) == ("none", 7)


class Down(MemoryHistoryStore):
    async def aget_conversation(self, scope: str, conversation_id: str) -> ConversationRecord | None:
        raise OperationalError("connection refused")


async def test_a_store_outage_is_503_with_retry_after(make_gateway: GatewayFactory) -> None:
    api = make_gateway(tenant_api_keys=TENANT_KEYS)
    install_history_store(Down(max_entries=10))
    answer = await api.get("/v1/conversations/conv_x", headers=ALICE.headers)
    assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
    body: dict[str, Any] = answer.json()
    assert set(body) == {"error"} and "unavailable" in body["error"]
