"""/v1/tokenizers (spec 3, Tokenizers; control-plane auth): DRF adapters over
administration/tokenizers.py.

Routed to Django although they start with /v1: the data plane's router (inference/api/routes.py)
takes fixed paths only, and these are not among them. Errors use the general admin body
``{"error": {"message", "type"}}``: 400 bad_request for a body that is not a JSON object with the
fields the spec names, 404 tokenizer_not_found (the record) or not_found (the status); the
duplicate-name 409 and the DELETE answers have the spec's own bodies.
"""

from __future__ import annotations

from typing import Any, TypedDict

import orjson
from django.db import models
from django.http import HttpResponse
from rest_framework.request import Request
from rest_framework.response import Response

from administration.api.errors import ErrorType, error_body
from administration.api.methods import ControlPlaneView
from administration.models import RegisteredTokenizer, TokenizerStatus
from administration.tokenizers import (
    TokenizerConflict,
    add_tokenizer,
    find_tokenizer,
    find_tokenizer_job,
    list_tokenizers,
    remove_tokenizer,
)

__all__ = [
    "TokenizersView", "TokenizerView", "TokenizerStatusView", "TokenizerRecord", "TokenizerStatusBody",
    "tokenizer_record", "tokenizer_status", "TOKENIZER_NOT_FOUND", "NAME_MAX", "NOT_BLANK", "NO_NUL", "PATH_FORMAT",
]  # fmt: skip

TOKENIZER_NOT_FOUND = "tokenizer_not_found"  # the record route's 404 type (spec 3, Errors)
NAME_MAX = 255
"""The longest file name (one path component, in bytes) the usual file systems hold: a source or
template path with a longer part can name no file, and the load would fail on it, so it is refused
at the request."""
NOT_BLANK = r"^[^\x00]*[^\s\x00][^\x00]*$"
"""A required text field as the description's pattern: no NUL, and a character that is not white space
(str.strip()'s white space is the regular expression's \\s)."""
NO_NUL = r"^[^\x00]*$"
"""An optional text field as the description's pattern: no NUL."""
PATH_FORMAT = "file-path"
"""The description's format of a source or template path: no "/"-separated part longer than NAME_MAX
bytes in UTF-8 (a byte count, which no pattern expresses; a pattern counting characters instead makes
schemathesis's generation from the description take minutes)."""


def _column_length(name: str) -> int:
    """The longest text the field's column holds (the model is the one place that says)."""
    field = RegisteredTokenizer._meta.get_field(name)
    assert isinstance(field, models.CharField) and field.max_length is not None
    return field.max_length


class TokenizerRecord(TypedDict):
    id: str
    name: str
    source: str
    vocab_size: int | None


class _StatusRequired(TypedDict):
    id: str
    status: str
    message: str


class TokenizerStatusBody(_StatusRequired, total=False):
    vocab_size: int


class BodyError(Exception):
    """The add request's body is not what the spec asks for (answered 400 bad_request)."""


def tokenizer_record(row: RegisteredTokenizer) -> TokenizerRecord:
    return {"id": str(row.pk), "name": row.name, "source": row.source, "vocab_size": row.vocab_size}


def tokenizer_status(row: RegisteredTokenizer) -> TokenizerStatusBody:
    body: TokenizerStatusBody = {"id": str(row.pk), "status": row.status, "message": row.message}
    if row.status == TokenizerStatus.COMPLETED and row.vocab_size is not None:
        body["vocab_size"] = row.vocab_size
    return body


def _check_path_parts(value: str, name: str) -> None:
    """Every "/"-separated part of a path (or hub id, or URL) fits a file name."""
    if any(len(part.encode("utf-8", "surrogatepass")) > NAME_MAX for part in value.split("/")):
        raise BodyError(f"'{name}' has a path component longer than {NAME_MAX} bytes")


def _text_field(body: dict[str, Any], name: str, *, required: bool, path: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise BodyError(f"'{name}' is required")
        return None
    if not isinstance(value, str):
        raise BodyError(f"'{name}' must be a string")
    if required and not value.strip():
        raise BodyError(f"'{name}' must not be empty")
    limit = _column_length(name)
    if len(value) > limit:
        raise BodyError(f"'{name}' is longer than {limit} characters")
    if "\x00" in value:
        raise BodyError(f"'{name}' must not contain NUL characters")
    if path:
        _check_path_parts(value, name)
    return value


def parse_add_request(raw: bytes) -> tuple[str, str, str | None]:
    """(name, source, chat_template_path) of an add request. Raises :class:`BodyError`."""
    try:
        body = orjson.loads(raw or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BodyError(f"The body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BodyError("The body must be a JSON object")
    name = _text_field(body, "name", required=True)
    source = _text_field(body, "source", required=True, path=True)
    assert name is not None and source is not None
    return name, source, _text_field(body, "chat_template_path", required=False, path=True) or None


class _TokenizerView(ControlPlaneView):
    def handle_exception(self, exc: Exception) -> Response | HttpResponse:  # type: ignore[override]  # 405 envelope
        if isinstance(exc, BodyError):
            return Response(error_body(str(exc), ErrorType.BAD_REQUEST), status=400)
        response: Response | HttpResponse = super().handle_exception(exc)
        return response


class TokenizersView(_TokenizerView):
    def get(self, request: Request) -> Response:
        return Response({"tokenizers": [tokenizer_record(row) for row in list_tokenizers()]})

    def post(self, request: Request) -> Response:
        name, source, chat_template_path = parse_add_request(request.body)
        try:
            row = add_tokenizer(name, source, chat_template_path)
        except TokenizerConflict as conflict:
            return Response({"id": str(conflict.existing), "status": "failed", "message": str(conflict)}, status=409)
        message = f"Tokenizer load queued; poll /v1/tokenizers/{row.pk}/status"
        return Response({"id": str(row.pk), "status": TokenizerStatus.PENDING.value, "message": message}, status=202)


class TokenizerView(_TokenizerView):
    def get(self, request: Request, tokenizer_id: str) -> Response:
        row = find_tokenizer(tokenizer_id)
        if row is None:
            return Response(error_body(f"Tokenizer '{tokenizer_id}' not found", TOKENIZER_NOT_FOUND), status=404)
        return Response(tokenizer_record(row))

    def delete(self, request: Request, tokenizer_id: str) -> Response:
        row = remove_tokenizer(tokenizer_id)
        if row is None:
            return Response({"success": False, "message": f"Tokenizer '{tokenizer_id}' not found"}, status=404)
        return Response({"success": True, "message": f"Tokenizer '{row.name}' removed"})


class TokenizerStatusView(_TokenizerView):
    def get(self, request: Request, tokenizer_id: str) -> Response:
        row = find_tokenizer_job(tokenizer_id)
        if row is None:
            return Response(
                error_body(f"No tokenizer or tokenizer job '{tokenizer_id}'", ErrorType.NOT_FOUND), status=404
            )
        return Response(tokenizer_status(row))
