"""The ZMQ engine client against the project's EngineCore stand-in (:mod:`standins.zmq_engine`),
both in the test's event loop on ipc:// sockets in a temporary folder: the handshake, generation
with the fixture tokenizer's real token ids, EOS and stop ids, aborts, engine death, dp_size 2,
loads from the scheduler stats."""

from __future__ import annotations

import asyncio
import struct
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from inference.upstreams.engine import EngineOutput, EngineRequest, FinishReason, SamplingParams
from inference.upstreams.failures import FailureKind, UpstreamFailure
from inference.upstreams.zmq.addresses import handshake_port
from inference.upstreams.zmq.client import ZmqEngineClient
from standins.fixtures import FIXTURE_MODELS
from standins.scripted_engine import Thinking
from standins.zmq_engine import ZmqEngineConfig, ZmqEngineGroup, scripted_model

QWEN = str(FIXTURE_MODELS / "qwen3")
QWEN_TURN = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def ipc_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="zmq", dir="/tmp") as folder:  # ipc paths must stay short
        yield Path(folder)


class Worker:
    """A client and its stand-in engines, started and handshaken."""

    def __init__(self, client: ZmqEngineClient, group: ZmqEngineGroup) -> None:
        self.client, self.group = client, group
        self.model = group.engines[0].engine.model

    @property
    def engine(self) -> Any:
        return self.group.engines[0]

    def prompt(self, text: str = QWEN_TURN) -> tuple[int, ...]:
        return self.model.encode(text)

    def reply(self, text: str = QWEN_TURN) -> list[int]:
        return list(self.model.reply_ids("text", self.model.thinking_of(text)))

    async def collect(self, request: EngineRequest) -> list[EngineOutput]:
        return [output async for output in self.client.generate(request)]


async def _worker(ipc_dir: Path, dp_size: int = 1, eos: tuple[int, ...] | None = None, **config: Any) -> Worker:
    engine_config = ZmqEngineConfig(tokenizer=QWEN, **config)
    group_model = scripted_model(engine_config)
    client = ZmqEngineClient(
        f"ipc://{ipc_dir}/worker", handshake_address="tcp://127.0.0.1:*", dp_size=dp_size, model_id="qwen3",
        eos_token_ids=(group_model.eos_token_id,) if eos is None else eos, tokenizer_path=QWEN,
        health_timeout_secs=2.0,
    )  # fmt: skip
    await client.start()
    group = ZmqEngineGroup(engine_config, client.handshake_endpoint, dp_size)
    await group.start()
    await client.wait_ready(10)
    return Worker(client, group)


@pytest.fixture
async def worker(ipc_dir: Path) -> AsyncIterator[Worker]:
    w = await _worker(ipc_dir)
    yield w
    await w.group.stop()
    await w.client.close()


@pytest.fixture
async def slow_worker(ipc_dir: Path) -> AsyncIterator[Worker]:
    w = await _worker(ipc_dir, delay_ms=20, chunk_tokens=1)
    yield w
    await w.group.stop()
    await w.client.close()


async def test_handshake_init_and_ready_response(worker: Worker) -> None:
    init = worker.engine.state.inits[0]
    assert init["addresses"]["inputs"] == [f"{worker.client.addresses.input}"]
    assert init["addresses"]["outputs"] == [f"{worker.client.addresses.output}"]
    assert init["addresses"]["input" + "s"][0].endswith("/worker-in.sock")
    assert init["parallel_config"]["data_parallel_size"] == 1
    info = await worker.client.model_info()
    assert info.max_context_length == 32768  # from the engine's ready response
    assert info.model_path == "qwen3" and info.tokenizer_path == QWEN
    assert info.eos_token_ids == (worker.model.eos_token_id,)
    server = await worker.client.server_info()
    assert server["engines"][0]["block_size"] == 16 and server["engines"][0]["data_parallel_rank"] == 0
    assert (await worker.client.health()).healthy
    assert worker.engine.state.utility_calls[0][2] == "is_sleeping"


async def test_the_smaller_context_window_wins(ipc_dir: Path) -> None:
    w = await _worker(ipc_dir, max_model_len=4096)
    try:
        assert (await w.client.model_info()).max_context_length == 4096
        with pytest.raises(UpstreamFailure) as refused:
            await w.collect(EngineRequest("long", (1,) * 4096))
        assert refused.value.rejected and not w.engine.state.adds  # refused before it was sent
    finally:
        await w.group.stop()
        await w.client.close()


async def test_generate_streams_the_reply_and_ends_at_eos(worker: Worker) -> None:
    ids = worker.prompt()
    outputs = await worker.collect(EngineRequest("chatcmpl-1", ids))
    tokens = [t for o in outputs for t in o.token_ids]
    eos = worker.model.eos_token_id
    assert tokens == worker.reply() + [eos]
    assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.STOP
    assert outputs[-1].finish.matched_token_id == eos
    assert all(o.finish is None for o in outputs[:-1])
    assert outputs[-1].prompt_tokens == len(ids)
    assert [o.completion_tokens for o in outputs] == [sum(len(p.token_ids) for p in outputs[: i + 1]) for i in range(len(outputs))]
    served = worker.engine.state.request("chatcmpl-1")
    assert served.input_ids == ids and served.thinking is Thinking.MODEL
    add = worker.engine.state.adds[0]
    assert add[0] == "chatcmpl-1" and add[1] == list(ids) and add[5] == eos  # eos_token_id, position 5
    assert add[3]["_eos_token_id"] == eos and add[3]["max_tokens"] == 32768 - len(ids)


async def test_max_new_tokens_ends_with_length(worker: Worker) -> None:
    outputs = await worker.collect(EngineRequest("r", worker.prompt(), SamplingParams(max_new_tokens=4)))
    assert [t for o in outputs for t in o.token_ids] == worker.reply()[:4]
    assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.LENGTH
    assert worker.engine.state.adds[0][3]["max_tokens"] == 4


async def test_a_stop_token_id_ends_the_choice_and_is_the_stop_reason(worker: Worker) -> None:
    reply = worker.reply()
    stop = reply[5]
    outputs = await worker.collect(EngineRequest("r", worker.prompt(), SamplingParams(stop_token_ids=(stop,))))
    assert [t for o in outputs for t in o.token_ids] == reply[: reply.index(stop) + 1]
    assert outputs[-1].finish is not None and outputs[-1].finish.matched_token_id == stop
    assert worker.engine.state.adds[0][3]["stop_token_ids"] == [stop]


async def test_without_eos_ids_the_engine_runs_past_eos_to_max_tokens(ipc_dir: Path) -> None:
    w = await _worker(ipc_dir, eos=())
    try:
        outputs = await w.collect(EngineRequest("r", w.prompt(), SamplingParams(max_new_tokens=60)))
        tokens = [t for o in outputs for t in o.token_ids]
        assert len(tokens) == 60 and w.model.eos_token_id not in tokens
        assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.LENGTH
        assert w.engine.state.adds[0][5] is None
    finally:
        await w.group.stop()
        await w.client.close()


async def test_more_eos_ids_go_into_the_stop_token_ids(ipc_dir: Path) -> None:
    probe = scripted_model(ZmqEngineConfig(tokenizer=QWEN))
    eos = probe.eos_token_id
    other = probe.encode("<|endoftext|>")[0]
    w = await _worker(ipc_dir, eos=(eos, other))
    try:
        await w.collect(EngineRequest("r", w.prompt(), SamplingParams(stop_token_ids=(7,))))
        add = w.engine.state.adds[0]
        assert add[5] == eos
        assert add[3]["stop_token_ids"] == [7, other]
        assert sorted(add[3]["_all_stop_token_ids"]) == sorted({7, other, eos})
        await w.collect(EngineRequest("r2", w.prompt(), SamplingParams(ignore_eos=True, max_new_tokens=5)))
        ignoring = w.engine.state.adds[1][3]
        assert ignoring["ignore_eos"] is True and "stop_token_ids" not in ignoring
    finally:
        await w.group.stop()
        await w.client.close()


async def test_ignore_eos_runs_to_max_tokens(worker: Worker) -> None:
    outputs = await worker.collect(EngineRequest("r", worker.prompt(), SamplingParams(ignore_eos=True, max_new_tokens=80)))
    assert sum(len(o.token_ids) for o in outputs) == 80
    assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.LENGTH


async def test_n_choices_are_engine_requests_told_apart_by_index(worker: Worker) -> None:
    outputs = await worker.collect(EngineRequest("r", worker.prompt(), SamplingParams(n=2, max_new_tokens=3)))
    assert {o.index for o in outputs} == {0, 1}
    assert sorted(a[0] for a in worker.engine.state.adds) == ["0_r", "1_r"]
    assert all(a[3].get("n", 1) == 1 for a in worker.engine.state.adds)
    assert [o.finish.reason for o in outputs if o.finish] == [FinishReason.LENGTH, FinishReason.LENGTH]


async def test_closing_the_generator_sends_abort(slow_worker: Worker) -> None:
    stream = slow_worker.client.generate(EngineRequest("r-abort", slow_worker.prompt()))
    async with aclosing(stream):
        first = await anext(stream)
        assert first.token_ids
    state = slow_worker.engine.state
    await _until(lambda: state.aborts)
    assert state.abort_messages == [["r-abort"]]
    assert state.aborted_ids() == ["r-abort"]
    assert not slow_worker.client._flights


async def test_cancelling_the_consumer_sends_abort(slow_worker: Worker) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in slow_worker.client.generate(EngineRequest("r-cancel", slow_worker.prompt())):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until(lambda: slow_worker.engine.state.abort_messages)
    assert slow_worker.engine.state.abort_messages == [["r-cancel"]]


async def test_abort_ends_the_stream_with_finish_abort(slow_worker: Worker) -> None:
    stream = slow_worker.client.generate(EngineRequest("r-stop", slow_worker.prompt()))
    async with aclosing(stream):
        outputs = [await anext(stream)]
        await slow_worker.client.abort("r-stop")
        outputs += [output async for output in stream]
    assert outputs[-1].finish is not None and outputs[-1].finish.reason is FinishReason.ABORT
    assert sum(len(o.token_ids) for o in outputs) < len(slow_worker.reply())
    await _until(lambda: slow_worker.engine.state.aborts)
    assert slow_worker.engine.state.abort_messages == [["r-stop"]]  # once: the stream ended, nothing more to abort


async def test_a_finished_request_sends_no_abort(worker: Worker) -> None:
    await worker.collect(EngineRequest("r", worker.prompt()))
    await worker.client.abort("unknown")  # harmless
    assert (await worker.client.health()).healthy  # a round trip: an ABORT would have arrived first
    assert worker.engine.state.abort_messages == []


async def _start_two(w: Worker) -> tuple[AsyncIterator[EngineOutput], AsyncIterator[EngineOutput]]:
    a = w.client.generate(EngineRequest("a", w.prompt()))
    b = w.client.generate(EngineRequest("b", w.prompt()))
    assert (await anext(a)).token_ids and (await anext(b)).token_ids
    return a, b


async def _drain(stream: AsyncIterator[EngineOutput]) -> None:
    async for _ in stream:
        pass


async def test_engine_death_ends_every_request_in_flight(slow_worker: Worker) -> None:
    a, b = await _start_two(slow_worker)
    await slow_worker.engine.die()
    failures = []
    for stream in (a, b):
        with pytest.raises(UpstreamFailure) as failure:
            await _drain(stream)
        failures.append(failure.value)
    assert all(f.kind is FailureKind.BROKEN and "ENGINE_CORE_DEAD" in f.detail for f in failures)
    assert not (await slow_worker.client.health()).healthy
    with pytest.raises(UpstreamFailure) as refused:
        await slow_worker.collect(EngineRequest("c", slow_worker.prompt()))
    assert refused.value.kind is FailureKind.CONNECT


async def test_an_engine_vanishing_ends_every_request_in_flight(slow_worker: Worker) -> None:
    a, b = await _start_two(slow_worker)
    await slow_worker.group.stop()  # no ENGINE_CORE_DEAD: the process is just gone
    for stream in (a, b):
        with pytest.raises(UpstreamFailure) as failure:
            await _drain(stream)
        assert failure.value.kind is FailureKind.BROKEN


async def test_a_health_timeout_ends_every_request_in_flight(slow_worker: Worker) -> None:
    slow_worker.client.health_timeout_secs = 0.2
    a, b = await _start_two(slow_worker)
    slow_worker.engine.state.healthy = False  # it stops answering utility calls
    assert not (await slow_worker.client.health()).healthy
    for stream in (a, b):
        with pytest.raises(UpstreamFailure):
            await _drain(stream)


async def test_a_restarted_engine_serves_again(ipc_dir: Path) -> None:
    w = await _worker(ipc_dir)
    try:
        await w.engine.die()
        await _until(lambda: not w.client.ready)
        again = ZmqEngineGroup(ZmqEngineConfig(tokenizer=QWEN), w.client.handshake_endpoint)
        await again.start()
        await w.client.wait_ready(10)
        outputs = await w.collect(EngineRequest("after", w.prompt()))
        assert outputs[-1].finish is not None
        await again.stop()
    finally:
        await w.group.stop()
        await w.client.close()


async def test_dp_size_two_uses_both_ranks(ipc_dir: Path) -> None:
    w = await _worker(ipc_dir, dp_size=2, delay_ms=10, chunk_tokens=1)
    try:
        first, second = w.group.engines
        assert [e.state.inits[0]["parallel_config"]["data_parallel_size"] for e in (first, second)] == [2, 2]
        a, b = await _start_two(w)
        await _drain(a)
        await _drain(b)
        assert [len(first.state.adds), len(second.state.adds)] == [1, 1]
        assert first.state.waves or second.state.waves  # the other engine was woken for the wave
        wave = (first.state.waves or second.state.waves)[0]
        assert wave[1] in (0, 1)
        pinned = await w.collect(EngineRequest("pinned", w.prompt(), SamplingParams(max_new_tokens=2), data_parallel_rank=1))
        assert pinned[-1].finish is not None
        assert second.state.adds[-1][0] == "pinned" and second.state.adds[-1][9] == 1
        assert [info["data_parallel_rank"] for info in (await w.client.server_info())["engines"]] == [0, 1]
        with pytest.raises(UpstreamFailure) as refused:
            await w.collect(EngineRequest("x", w.prompt(), data_parallel_rank=2))
        assert refused.value.rejected
    finally:
        await w.group.stop()
        await w.client.close()


async def test_loads_come_from_the_scheduler_stats(ipc_dir: Path) -> None:
    w = await _worker(ipc_dir, dp_size=2)
    try:
        w.group.engines[1].state.stats = {"num_waiting_reqs": 3, "kv_cache_usage": 0.5, "num_running_reqs": 2}
        await w.collect(EngineRequest("r", w.prompt(), SamplingParams(max_new_tokens=2), data_parallel_rank=1))
        loads = await w.client.loads()
        assert [load["dp_rank"] for load in loads] == [0, 1]
        assert loads[1]["num_waiting_reqs"] == 3 and loads[1]["num_running_reqs"] == 2
        assert loads[1]["num_total_reqs"] == 5 and loads[1]["token_usage"] == 0.5
        assert loads[1]["max_total_num_tokens"] == 4096 * 16
        assert loads[0]["num_running_reqs"] == 0 and loads[0]["token_usage"] == 0.0
    finally:
        await w.group.stop()
        await w.client.close()


async def test_the_derived_handshake_port(ipc_dir: Path) -> None:
    url = f"ipc://{ipc_dir}/derived"
    client = ZmqEngineClient(url, eos_token_ids=(1,))
    assert client.addresses.handshake == f"tcp://127.0.0.1:{handshake_port(f'{ipc_dir}/derived')}"
    await client.start()
    group = ZmqEngineGroup(ZmqEngineConfig(tokenizer=QWEN), client.addresses.handshake)
    try:
        await group.start()
        await client.wait_ready(10)
        assert client.ready
    finally:
        await group.stop()
        await client.close()


async def test_no_engine_no_service(ipc_dir: Path) -> None:
    client = ZmqEngineClient(f"ipc://{ipc_dir}/w", handshake_address="tcp://127.0.0.1:*")
    await client.start()
    try:
        assert not (await client.health()).healthy
        with pytest.raises(UpstreamFailure) as failure:
            await anext(client.generate(EngineRequest("r", (1, 2))))
        assert failure.value.kind is FailureKind.CONNECT
        with pytest.raises(UpstreamFailure) as timeout:
            await client.wait_ready(0.05)
        assert timeout.value.timed_out
    finally:
        await client.close()


async def test_what_a_zmq_worker_does_not_offer(worker: Worker) -> None:
    for call in (worker.client.flush_cache(), worker.client.tokenizer(), worker.client.stop_profile()):
        with pytest.raises(UpstreamFailure):
            await call
    assert not ZmqEngineClient.offers("FlushCache")
    assert ZmqEngineClient.runtime == "vllm" and ZmqEngineClient.transport == "zmq"


async def _until(condition: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


# Logprobs: vLLM's tensors (LogprobsLists, LogprobsTensors) on the wire, decoded to TokenLogprobs.


def _f32(value: float) -> float:
    """A value as it crosses the wire (float32)."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _expected(model: Any, tokens: list[int], top: int) -> list[tuple[int, float, tuple[tuple[int, float], ...]]]:
    values, top_ids, top_values = model.logprobs(tokens, top)
    return [
        (token, _f32(values[i]), tuple((t, _f32(v)) for t, v in zip(top_ids[i], top_values[i], strict=True)) if top else ())
        for i, token in enumerate(tokens)
    ]


def _per_output(model: Any, outputs: list[EngineOutput], top: int) -> list[tuple[int, float, tuple[tuple[int, float], ...]]]:
    """What the stand-in computed: the scripted model's logprobs of each output's new tokens."""
    return [entry for o in outputs for entry in _expected(model, list(o.token_ids), top)]


def _entries(items: Any) -> list[tuple[int, float, tuple[tuple[int, float], ...]]]:
    return [(item.token_id, item.logprob, item.top) for item in items]


@pytest.mark.parametrize("threshold", [256, 0], ids=["inline", "aux-frames"])
async def test_logprobs_and_top_alternatives(ipc_dir: Path, threshold: int) -> None:
    w = await _worker(ipc_dir, zero_copy_threshold=threshold)
    try:
        sampling = SamplingParams(logprobs=True, top_logprobs=2, max_new_tokens=7)
        outputs = await w.collect(EngineRequest("lp", w.prompt(), sampling))
        assert w.engine.state.adds[0][3]["logprobs"] == 2  # SamplingParams.logprobs: N alternatives
        assert "prompt_logprobs" not in w.engine.state.adds[0][3]
        assert all(o.logprobs is not None and len(o.logprobs) == len(o.token_ids) for o in outputs)
        assert _entries(item for o in outputs for item in o.logprobs or ()) == _per_output(w.model, outputs, 2)
        assert all(o.prompt_logprobs is None for o in outputs)
        assert (w.engine.state.aux_frames_sent > 0) == (threshold == 0)  # vLLM's 256-byte threshold
    finally:
        await w.group.stop()
        await w.client.close()


async def test_only_the_alternatives_asked_for_are_kept(worker: Worker) -> None:
    worker.engine.state.logprob_columns = 5  # a wider request in the engine's batch widens every row
    outputs = await worker.collect(EngineRequest("lp", worker.prompt(), SamplingParams(logprobs=True, top_logprobs=1, max_new_tokens=4)))
    assert _entries(item for o in outputs for item in o.logprobs or ()) == _per_output(worker.model, outputs, 1)


async def test_the_sampled_token_alone(worker: Worker) -> None:
    outputs = await worker.collect(EngineRequest("lp", worker.prompt(), SamplingParams(logprobs=True, max_new_tokens=4)))
    assert worker.engine.state.adds[0][3]["logprobs"] == 0  # vLLM: 0 is the sampled token's logprob only
    assert _entries(item for o in outputs for item in o.logprobs or ()) == _per_output(worker.model, outputs, 0)


async def test_no_logprobs_unless_asked(worker: Worker) -> None:
    outputs = await worker.collect(EngineRequest("plain", worker.prompt(), SamplingParams(max_new_tokens=4)))
    assert "logprobs" not in worker.engine.state.adds[0][3]
    assert all(o.logprobs is None and o.prompt_logprobs is None for o in outputs)


@pytest.mark.parametrize("threshold", [256, 0], ids=["inline", "aux-frames"])
async def test_prompt_logprobs(ipc_dir: Path, threshold: int) -> None:
    w = await _worker(ipc_dir, zero_copy_threshold=threshold)
    try:
        ids = w.prompt()
        request = EngineRequest("plp", ids, SamplingParams(top_logprobs=2, max_new_tokens=4), return_prompt_logprobs=True)
        outputs = await w.collect(request)
        assert w.engine.state.adds[0][3]["prompt_logprobs"] == 2
        prompt = outputs[0].prompt_logprobs
        assert prompt is not None and len(prompt) == len(ids)  # one per prompt token
        assert prompt[0] is None  # the first prompt token is not scored
        assert _entries(prompt[1:]) == _expected(w.model, list(ids[1:]), 2)
        assert all(o.prompt_logprobs is None for o in outputs[1:])
        assert (w.engine.state.aux_frames_sent > 0) == (threshold == 0)
    finally:
        await w.group.stop()
        await w.client.close()


async def test_a_non_streamed_request_gets_one_output_per_choice_at_its_end(worker: Worker) -> None:
    sampling = SamplingParams(n=2, logprobs=True, top_logprobs=1, max_new_tokens=5)
    ids = worker.prompt()
    streamed = await worker.collect(EngineRequest("s", ids, sampling, return_prompt_logprobs=True))
    whole = await worker.collect(EngineRequest("w", ids, sampling, stream=False, return_prompt_logprobs=True))
    assert sorted(o.index for o in whole) == [0, 1]  # one each, nothing before it
    for output in whole:
        steps = [o for o in streamed if o.index == output.index]
        assert len(steps) > 1  # the engine sent every step
        assert output.token_ids == tuple(t for o in steps for t in o.token_ids)
        assert output.completion_tokens == len(output.token_ids) == 5 and output.prompt_tokens == len(ids)
        assert output.finish == steps[-1].finish and output.finish is not None
        assert _entries(output.logprobs or ()) == _entries(item for o in steps for item in o.logprobs or ())
        assert output.prompt_logprobs == steps[0].prompt_logprobs and output.prompt_logprobs is not None


async def test_a_non_streamed_request_without_logprobs_is_folded_by_the_reader(ipc_dir: Path) -> None:
    # Plain steps (tokens only) of a request that is not streamed are folded as they arrive, before
    # the generator sees them: still one output per choice, with every token, count and cached count.
    worker = await _worker(ipc_dir, chunk_tokens=1)
    try:
        sampling = SamplingParams(n=2, max_new_tokens=6)
        ids = worker.prompt()
        streamed = await worker.collect(EngineRequest("s", ids, sampling))
        sent = worker.engine.state.outputs_sent
        whole = await worker.collect(EngineRequest("w", ids, sampling, stream=False))
        assert worker.engine.state.outputs_sent - sent == 2 * 6  # the engine sent a step per token and choice
        assert sorted(o.index for o in whole) == [0, 1]
        for output in whole:
            steps = [o for o in streamed if o.index == output.index]
            assert output.token_ids == tuple(t for o in steps for t in o.token_ids) and len(output.token_ids) == 6
            assert output.completion_tokens == 6 and output.prompt_tokens == len(ids)
            assert output.cached_tokens > 0  # the same prompt again: the engine reported a cached prefix
            assert output.finish is not None and output.finish.reason is FinishReason.LENGTH
            assert output.logprobs is None and output.prompt_logprobs is None
        assert not worker.client._flights
    finally:
        await worker.group.stop()
        await worker.client.close()


async def test_aborting_a_non_streamed_request_gives_the_tokens_folded_so_far(slow_worker: Worker) -> None:
    reply = slow_worker.reply()
    stream = slow_worker.client.generate(EngineRequest("w-stop", slow_worker.prompt(), stream=False))
    async with aclosing(stream):
        waiting = asyncio.ensure_future(anext(stream))
        flights = slow_worker.client._flights

        def folded() -> int:
            return sum(len(o.new_token_ids) for flight in flights.values() for o in flight.early.values())

        await _until(lambda: folded() >= 3)  # three steps folded by the reader, none given
        assert not waiting.done()
        await slow_worker.client.abort("w-stop")
        output = await waiting
        assert [o async for o in stream] == []
    assert output.finish is not None and output.finish.reason is FinishReason.ABORT
    assert 3 <= len(output.token_ids) < len(reply) and output.token_ids == tuple(reply[: len(output.token_ids)])
    assert output.completion_tokens == len(output.token_ids)


async def test_a_malformed_tensor_is_an_upstream_failure(worker: Worker) -> None:
    worker.engine.state.malformed_logprobs = True
    with pytest.raises(UpstreamFailure) as failed:
        await worker.collect(EngineRequest("bad", worker.prompt(), SamplingParams(logprobs=True, top_logprobs=2)))
    assert failed.value.kind is FailureKind.BROKEN and "logprob_token_ids" in failed.value.detail
    worker.engine.state.malformed_logprobs = False  # the worker still serves
    outputs = await worker.collect(EngineRequest("good", worker.prompt(), SamplingParams(logprobs=True, max_new_tokens=3)))
    assert sum(len(o.logprobs or ()) for o in outputs) == 3
