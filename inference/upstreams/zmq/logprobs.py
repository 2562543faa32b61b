"""An EngineCoreOutput's logprobs, as neutral :class:`TokenLogprobs`.

vLLM (``vllm/v1/outputs.py``) sends a request's sample logprobs as ``new_logprobs``, a
``LogprobsLists`` of numpy arrays, and its prompt logprobs as ``new_prompt_logprobs_tensors``, a
``LogprobsTensors`` of torch tensors; both NamedTuples, so msgpack arrays in this order:

- ``logprob_token_ids`` ``[positions, max_num_logprobs + 1]`` (int32): per position the sampled
  (or prompt) token first, then the top-k token ids, most likely first;
- ``logprobs`` ``[positions, max_num_logprobs + 1]`` (float32), the same layout;
- ``sampled_token_ranks`` / ``selected_token_ranks`` ``[positions]`` (int64): the first token's
  rank in the vocabulary;
- ``cu_num_generated_tokens``: None once the scheduler sliced the batch per request (it always has
  by the time an output is sent; anything else is refused).

The width is the batch's largest request plus one, so a row may carry more alternatives than this
request asked for: only the first ``top`` are kept, as vLLM's front end does. Sample logprobs have
one row per new token. Prompt logprobs have one row per prompt token after the first (the first
has no context to be scored in), possibly split over several outputs (chunked prefill), with an
empty array once the prompt is done; the first chunk is preceded by None for the first token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inference.upstreams.engine import TokenLogprobs
from inference.upstreams.zmq.codec import EngineCoreOutput
from inference.upstreams.zmq.tensors import TensorError, decode_array

__all__ = ["ChoiceLogprobs", "TensorError", "prompt_logprobs", "sample_logprobs"]


def _entries(wire: Any, field: str, top: int) -> list[TokenLogprobs]:
    if not isinstance(wire, (list, tuple)) or len(wire) not in (3, 4):
        raise TensorError(f"{field}: expected (logprob_token_ids, logprobs, ranks[, cu_num_generated_tokens])")
    if len(wire) == 4 and wire[3] is not None:
        raise TensorError(f"{field}: cu_num_generated_tokens is set in a per-request output")
    ids = decode_array(wire[0], f"{field}.logprob_token_ids")
    values = decode_array(wire[1], f"{field}.logprobs")
    ranks = decode_array(wire[2], f"{field}.ranks")
    if len(ids.shape) != 2 or ids.shape != values.shape:
        raise TensorError(f"{field}: token ids of shape {list(ids.shape)} and logprobs of shape {list(values.shape)}")
    if ranks.shape != ids.shape[:1]:
        raise TensorError(f"{field}: ranks of shape {list(ranks.shape)} for {ids.shape[0]} positions")
    if ids.shape[0] and not ids.shape[1]:
        raise TensorError(f"{field}: {ids.shape[0]} positions without a token")
    if any(isinstance(v, float) for v in ids.values):
        raise TensorError(f"{field}.logprob_token_ids: token ids of a float dtype")
    entries = []
    for id_row, value_row in zip(ids.rows(), values.rows(), strict=True):
        top_pairs = tuple((int(t), float(v)) for t, v in zip(id_row[1 : top + 1], value_row[1 : top + 1], strict=True))
        entries.append(TokenLogprobs(int(id_row[0]), float(value_row[0]), top_pairs))
    return entries


def sample_logprobs(wire: Any, new_token_ids: list[int], top: int) -> tuple[TokenLogprobs, ...]:
    """``new_logprobs`` (aux frames inlined) with ``top`` alternatives: one entry per new token.
    :class:`TensorError` when it does not decode or does not match the new tokens."""
    entries = _entries(wire, "new_logprobs", max(0, top))
    if len(entries) != len(new_token_ids):
        raise TensorError(f"new_logprobs: {len(entries)} positions for {len(new_token_ids)} new tokens")
    return tuple(entries)


def prompt_logprobs(wire: Any, top: int, *, first_chunk: bool) -> tuple[TokenLogprobs | None, ...]:
    """``new_prompt_logprobs_tensors`` (aux frames inlined) with ``top`` alternatives; None first
    when this is the prompt's first chunk. An empty chunk (the prompt is done) is ``()``."""
    entries = _entries(wire, "new_prompt_logprobs_tensors", max(0, top))
    if not entries:
        return ()
    return ((None,) if first_chunk else ()) + tuple(entries)


@dataclass(slots=True)
class ChoiceLogprobs:
    """One choice's logprobs as its outputs arrive: :meth:`take` decodes an output's (its sample
    logprobs are returned, its prompt logprobs kept until :meth:`pop_prompt`, as a prompt chunk may
    come with an output that carries no token)."""

    top: int
    _prompt: list[TokenLogprobs | None] = field(default_factory=list)
    _prompt_started: bool = False

    def take(self, output: EngineCoreOutput) -> tuple[TokenLogprobs, ...] | None:
        """The output's sample logprobs (None without any); :class:`TensorError` when its tensors
        do not decode."""
        if output.new_prompt_logprobs_tensors is not None:
            chunk = prompt_logprobs(output.new_prompt_logprobs_tensors, self.top, first_chunk=not self._prompt_started)
            self._prompt_started = self._prompt_started or bool(chunk)
            self._prompt.extend(chunk)
        if output.new_logprobs is None:
            return None
        return sample_logprobs(output.new_logprobs, output.new_token_ids, self.top) or None

    def pop_prompt(self) -> tuple[TokenLogprobs | None, ...] | None:
        """The prompt logprobs received since the last call (None when there are none)."""
        if not self._prompt:
            return None
        chunk, self._prompt = tuple(self._prompt), []
        return chunk
