"""Object and item ids, prefixed by kind the way OpenAI's are (resp_, conv_, msg_, fc_, mcp_, rs_, ...)."""

from __future__ import annotations

import secrets

__all__ = ["ITEM_PREFIXES", "new_response_id", "new_conversation_id", "new_item_id", "item_prefix"]

# The prefix of a generated id per item type; a type not listed gets "item_".
ITEM_PREFIXES: dict[str, str] = {
    "message": "msg_",
    "reasoning": "rs_",
    "function_call": "fc_",
    "function_call_output": "fco_",
    "custom_tool_call": "ctc_",
    "custom_tool_call_output": "ctco_",
    "mcp_list_tools": "mcpl_",
    "mcp_call": "mcp_",
    "mcp_approval_request": "mcpr_",
    "mcp_approval_response": "mcpa_",
    "web_search_call": "ws_",
    "file_search_call": "fs_",
    "code_interpreter_call": "ci_",
    "image_generation_call": "ig_",
}
_RANDOM_BYTES = 24  # 48 hex characters after the prefix


def _new(prefix: str) -> str:
    return prefix + secrets.token_hex(_RANDOM_BYTES)


def new_response_id() -> str:
    return _new("resp_")


def new_conversation_id() -> str:
    return _new("conv_")


def item_prefix(item_type: str) -> str:
    return ITEM_PREFIXES.get(item_type, "item_")


def new_item_id(item_type: str) -> str:
    """A fresh id for an item of ``item_type`` (msg_... for a message)."""
    return _new(item_prefix(item_type))
