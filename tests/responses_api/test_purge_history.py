"""manage.py purge_history: responses and conversations idle longer than the retention are deleted
with the items nothing else holds; counts are printed; 0 days keeps everything."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.utils import timezone

from common.config import GatewayConfig, install_config
from responses_api.models import Conversation, ConversationItem, Item, StoredResponse
from responses_api.storage.base import ItemReference
from responses_api.storage.db import DatabaseHistoryStore
from tests.responses_api.test_storage import message, response_object

pytestmark = pytest.mark.django_db(transaction=True)

A = "tenant:acme"
STORE = DatabaseHistoryStore()


def age(days: int, *models: type[StoredResponse] | type[Conversation], pk: str) -> None:
    moment = timezone.now() - timedelta(days=days)
    for model in models:
        model.objects.filter(pk=pk).update(updated_at=moment)


def purge(*args: str) -> str:
    out = StringIO()
    call_command("purge_history", *args, stdout=out)
    return out.getvalue()


def test_old_records_are_purged_with_their_orphaned_items() -> None:
    old = response_object([message("old out", "assistant")])
    async_to_sync(STORE.asave_response)(A, old, [message("old in", item_id="msg_old_in")])
    recent = response_object([message("recent out", "assistant")])
    async_to_sync(STORE.asave_response)(A, recent, [message("recent in")])
    stale = async_to_sync(STORE.acreate_conversation)(A, {}, [message("stale", item_id="msg_stale"),
                                                               ItemReference("msg_old_in")])
    live = async_to_sync(STORE.acreate_conversation)(A, {}, [ItemReference("msg_stale")])
    age(31, StoredResponse, pk=old["id"])
    age(40, Conversation, pk=stale.id)
    items_before = Item.objects.count()

    output = purge()
    assert "Purged 1 response(s), 1 conversation(s) and 2 item(s)" in output and "(30 days)" in output
    assert list(StoredResponse.objects.values_list("pk", flat=True)) == [recent["id"]]
    assert list(Conversation.objects.values_list("pk", flat=True)) == [live.id]
    # Gone: the old response's output and input (held by nothing now); kept: msg_stale (the live
    # conversation holds it) and the recent response's items.
    assert Item.objects.count() == items_before - 2
    assert set(ConversationItem.objects.values_list("item__item_id", flat=True)) == {"msg_stale"}
    assert not Item.objects.filter(item_id="msg_old_in").exists()


def test_activity_keeps_a_conversation() -> None:
    conversation = async_to_sync(STORE.acreate_conversation)(A, {})
    age(60, Conversation, pk=conversation.id)
    async_to_sync(STORE.aadd_items)(A, conversation.id, [message("new activity")])
    assert "0 conversation(s)" in purge()
    assert Conversation.objects.filter(pk=conversation.id).exists()


def test_the_retention_flag_and_the_days_option() -> None:
    response = response_object()
    async_to_sync(STORE.asave_response)(A, response, [message("x")])
    age(10, StoredResponse, pk=response["id"])
    install_config(GatewayConfig(history_retention_days=0), export=False)
    try:
        assert "kept forever" in purge()
        assert StoredResponse.objects.exists()
        install_config(GatewayConfig(history_retention_days=7), export=False)
        assert "Purged 1 response(s)" in purge()
    finally:
        install_config(GatewayConfig(), export=False)
    with pytest.raises(CommandError):
        purge("--days", "-1")
    assert "Purged 0 response(s)" in purge("--days", "1")


def test_unstored_background_results_go_ten_minutes_after_they_end_whatever_the_retention() -> None:
    ended = response_object([message("done", "assistant")], background=True, store=False)
    running = response_object(background=True, store=False, status="in_progress")
    fresh = response_object(background=True, store=False)
    stored = response_object(background=True, store=True)
    for response in (ended, running, fresh, stored):
        async_to_sync(STORE.asave_response)(A, response, [message("in")])
    moment = timezone.now() - timedelta(minutes=11)
    StoredResponse.objects.exclude(pk=fresh["id"]).update(updated_at=moment)

    output = purge("--days", "0")  # retention off: only the unstored results go
    assert "Purged 1 unstored background response(s)" in output
    assert set(StoredResponse.objects.values_list("pk", flat=True)) == {running["id"], fresh["id"], stored["id"]}
