"""Every console list asked with NUL in its query (Postgres text cannot hold one) answers the list,
unfiltered and flagged, never a 500 (administration/console_query.py); on SQLite alike."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import Client

pytestmark = pytest.mark.django_db

CHANGELISTS = sorted(f"/admin/{model._meta.app_label}/{model._meta.model_name}/" for model in admin.site._registry)
QUERIES = ["q=%00", "tenant_id=%00", "status__exact=%00", "%00=1", "o=1&model=a%00b"]


def test_every_registered_model_is_covered() -> None:
    assert "/admin/administration/worker/" in CHANGELISTS and "/admin/responses_api/storedresponse/" in CHANGELISTS


@pytest.mark.parametrize("path", CHANGELISTS)
@pytest.mark.parametrize("query", QUERIES)
def test_a_nul_in_a_list_query_is_the_flagged_list(admin_client: Client, path: str, query: str) -> None:
    answer = admin_client.get(f"{path}?{query}")
    assert answer.status_code == 302 and answer["Location"] == f"{path}?e=1"
    assert admin_client.get(answer["Location"]).status_code == 200


def test_other_console_pages_and_clean_queries_pass(admin_client: Client) -> None:
    assert admin_client.get("/admin/administration/worker/?q=abc").status_code == 200
    assert admin_client.get("/admin/administration/usageminute/usage/", {"tenant": "a\x00b"}).status_code == 200
