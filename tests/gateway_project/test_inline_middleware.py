"""Django's security, common, CSRF and frame-options middleware run their hooks on the event loop
under ASGI (administration/inline_middleware.py, D109): the same headers and refusals as Django's
own classes, without a thread hop per hook."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from asgiref import sync
from django.conf import settings
from django.test import AsyncClient, Client

from administration import inline_middleware

pytestmark = pytest.mark.django_db(transaction=True)

_INLINE = {
    "django.middleware.security.SecurityMiddleware": "administration.inline_middleware.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware": "administration.inline_middleware.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware": "administration.inline_middleware.CsrfViewMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware": "administration.inline_middleware.XFrameOptionsMiddleware",
}


def test_each_inline_class_wraps_the_django_class_it_replaces() -> None:
    for django_path, ours in _INLINE.items():
        assert ours in settings.MIDDLEWARE and django_path not in settings.MIDDLEWARE
        wrapped = getattr(inline_middleware, ours.rsplit(".", 1)[1]).wrapped
        assert f"{wrapped.__module__}.{wrapped.__qualname__}" == django_path


# What Django's own classes set on the login page (the sync test client runs them unchanged).
_EXPECTED = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
             "Cross-Origin-Opener-Policy": "same-origin"}


def _headers(response: Any) -> dict[str, str]:
    return {name: response.headers.get(name) for name in _EXPECTED}


def test_under_wsgi_django_s_own_classes_answer() -> None:
    response = Client().get("/admin/login/")
    assert response.status_code == 200 and _headers(response) == _EXPECTED
    assert Client(enforce_csrf_checks=True).post("/admin/login/", {"username": "a"}).status_code == 403


async def test_under_asgi_the_hooks_run_in_place_with_the_same_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    hops: Counter[str] = Counter()
    call = sync.SyncToAsync.__call__

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        hops[getattr(self.func, "__qualname__", "")] += 1
        return call(self, *args, **kwargs)

    monkeypatch.setattr(sync.SyncToAsync, "__call__", counted)
    asgi = await AsyncClient().get("/admin/login/")
    refused = await AsyncClient(enforce_csrf_checks=True).post("/admin/login/", {"username": "a", "password": "b"})

    assert asgi.status_code == 200 and _headers(asgi) == _EXPECTED
    assert refused.status_code == 403  # CSRF still refuses a form without its token
    assert not [name for name in hops if name.split(".")[0] in
                ("SecurityMiddleware", "CommonMiddleware", "CsrfViewMiddleware", "XFrameOptionsMiddleware")]
    assert hops["SessionMiddleware.process_request"] >= 1  # the rest still hop as Django makes them
