"""The per-token text chunk chat and completions write from bytes made once per stream (D106) is
byte for byte the chunk their general path builds as an object, whatever the text, id and model."""

from __future__ import annotations

import orjson
import pytest

from inference.served.chat import _CONTENT_KEY, _TEXT_TAIL as CHAT_TAIL, ServedChat
from inference.served.completions import _TEXT_TAIL as COMPLETION_TAIL, ServedCompletion

TEXTS = ["Hello", " world", "", 'quote " and \\ backslash', "line\nbreak\ttab", "ünïcödé 漢字 🙂", "\u2028\x00\x1f"]


@pytest.mark.parametrize("model", ["qwen3", 'odd "model"/name ü'])
@pytest.mark.parametrize("index", [0, 3])
def test_the_text_chunks_bytes_are_the_general_paths(model: str, index: int) -> None:
    chat = ServedChat.__new__(ServedChat)
    chat.id, chat.created, chat.model, chat._head = "chatcmpl-1\u00e9", 1_764_000_000, model, None
    chat.usage_on_finish, chat.continuous_usage, chat.include_usage = False, False, True
    completion = ServedCompletion.__new__(ServedCompletion)
    completion.id, completion.created, completion.model = "cmpl-2", 1_764_000_001, model
    chat_head = b"%s%d%s" % (chat._chunk_head(), index, _CONTENT_KEY)
    for text in TEXTS:
        general = chat._event_chunk(index, {"content": text}, None, False)  # type: ignore[arg-type]
        assert chat_head + orjson.dumps(text) + CHAT_TAIL == general
        assert completion._text_head(index) + orjson.dumps(text) + COMPLETION_TAIL == completion._choice_chunk(index, text)
