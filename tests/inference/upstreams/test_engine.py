"""The engine-client seam: registry by runtime name, the generate contract, frozen value types."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from typing import Any, AsyncIterator, Iterator

import pytest

from inference.routing.load_report import EngineLoad, LoadEntry
from inference.routing.workers import Transport
from inference.upstreams.engine import (
    ENGINE_CLIENTS,
    ENGINE_CONNECTORS,
    ENGINE_OUTPUT_STEP,
    CommandResult,
    Constraint,
    ConstraintKind,
    DisaggregationParams,
    EngineClient,
    EngineHealth,
    EngineKey,
    EngineOutput,
    EngineRequest,
    Finish,
    FinishReason,
    ModelInfo,
    ProfileOptions,
    SamplingParams,
    TokenizerBundle,
    TokenLogprobs,
    connect_engine,
)
from inference.upstreams.grpc.detect import DETECTION_ORDER, connect
from inference.upstreams.registry import UnknownUpstream

EOS = 2
RUNTIME = "test-runtime"
KEY = EngineKey(Transport.GRPC, RUNTIME)


class ScriptedEngine(EngineClient):
    """An engine that answers each choice with tokens 100, 101, ... one per output, ending with EOS
    after ``eos_after`` tokens unless max_new_tokens comes first."""

    runtime = RUNTIME

    def __init__(self, url: str, *, api_key: str | None = None, eos_after: int = 3) -> None:
        super().__init__(url, api_key=api_key)
        self.eos_after = eos_after
        self.aborted: list[str] = []
        self.cancelled: list[str] = []
        self.step = asyncio.Event()

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        limit = request.sampling.max_new_tokens
        finished = False
        try:
            for index in range(request.sampling.n):
                produced = 0
                while True:
                    await asyncio.sleep(0)
                    at_eos = produced == self.eos_after
                    token = EOS if at_eos else 100 + produced
                    produced += 1
                    finish: Finish | None = None
                    if at_eos:
                        finish = Finish(FinishReason.STOP, matched_token_id=EOS)
                    elif limit is not None and produced >= limit:
                        finish = Finish(FinishReason.LENGTH)
                    yield EngineOutput(
                        index=index,
                        token_ids=(token,),
                        prompt_tokens=len(request.input_ids),
                        completion_tokens=produced,
                        finish=finish,
                    )
                    if finish is not None:
                        break
            finished = True
        finally:
            if not finished:
                self.cancelled.append(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def health(self) -> EngineHealth:
        return EngineHealth(healthy=True)

    async def model_info(self) -> ModelInfo:
        return ModelInfo(model_path="scripted", eos_token_ids=(EOS,))

    async def server_info(self) -> dict[str, Any]:
        return {"server_type": "scripted"}

    async def loads(self) -> tuple[EngineLoad, ...]:
        return ()

    async def flush_cache(self) -> CommandResult:
        return CommandResult(success=True)

    async def start_profile(self, options: ProfileOptions) -> CommandResult:
        return CommandResult(success=False, message="not supported")

    async def stop_profile(self) -> CommandResult:
        return CommandResult(success=False, message="not supported")

    async def tokenizer(self) -> TokenizerBundle:
        return TokenizerBundle(data=b"", sha256=hashlib.sha256(b"").hexdigest())


@pytest.fixture
def registered() -> Iterator[type[EngineClient]]:
    cls = ENGINE_CLIENTS.register(KEY)(ScriptedEngine)
    yield cls
    ENGINE_CLIENTS._by_name.pop(KEY, None)


def test_a_registered_client_is_found_by_its_runtime(registered: type[EngineClient]) -> None:
    assert registered is ScriptedEngine
    assert ENGINE_CLIENTS.get(KEY) is ScriptedEngine
    assert KEY in ENGINE_CLIENTS
    assert (KEY, ScriptedEngine) in ENGINE_CLIENTS.items()
    client = ENGINE_CLIENTS.get(KEY)("grpc://127.0.0.1:30000", api_key="secret")
    assert isinstance(client, ScriptedEngine)
    assert (client.url, client.api_key, client.runtime) == ("grpc://127.0.0.1:30000", "secret", RUNTIME)


def test_registering_the_same_class_again_is_harmless(registered: type[EngineClient]) -> None:
    assert ENGINE_CLIENTS.register(KEY)(ScriptedEngine) is ScriptedEngine
    assert ENGINE_CLIENTS.get(KEY) is ScriptedEngine


def test_a_second_class_under_a_taken_name_is_refused(registered: type[EngineClient]) -> None:
    class Impostor(ScriptedEngine):
        pass

    with pytest.raises(ValueError, match="already registered as ScriptedEngine"):
        ENGINE_CLIENTS.register(KEY)(Impostor)
    assert ENGINE_CLIENTS.get(KEY) is ScriptedEngine


def test_an_unknown_runtime_is_refused() -> None:
    assert KEY not in ENGINE_CLIENTS  # the fixture's teardown unregisters it
    with pytest.raises(UnknownUpstream, match="no engine client is registered for 'no-such-runtime'"):
        ENGINE_CLIENTS.get(EngineKey(Transport.GRPC, "no-such-runtime"))
    assert issubclass(UnknownUpstream, LookupError)


def test_detection_order() -> None:
    assert DETECTION_ORDER == ("sglang", "vllm", "trtllm", "tokenspeed", "mlx")


def test_a_runtime_has_a_client_per_transport(registered: type[EngineClient]) -> None:
    class OverZmq(ScriptedEngine):
        pass

    zmq_key = EngineKey(Transport.ZMQ, RUNTIME)
    try:
        assert ENGINE_CLIENTS.register(zmq_key)(OverZmq) is OverZmq
        assert ENGINE_CLIENTS.get(KEY) is ScriptedEngine and ENGINE_CLIENTS.get(zmq_key) is OverZmq
        assert RUNTIME in ENGINE_CLIENTS.runtimes(Transport.ZMQ) and RUNTIME in ENGINE_CLIENTS.runtimes(Transport.GRPC)
    finally:
        ENGINE_CLIENTS._by_name.pop(zmq_key, None)
    with pytest.raises(UnknownUpstream, match="no engine client is registered for 'test-runtime' over ZMQ"):
        ENGINE_CLIENTS.get(zmq_key)
    assert "vllm" in ENGINE_CLIENTS.runtimes(Transport.GRPC) and (Transport.GRPC, "vllm") in ENGINE_CLIENTS


async def test_connectors_are_found_by_the_urls_transport() -> None:
    assert ENGINE_CONNECTORS.get(Transport.GRPC) is connect
    with pytest.raises(UnknownUpstream, match="no engine connector for HTTP workers"):
        await connect_engine("http://127.0.0.1:1")


async def test_generate_streams_outputs_and_finishes_each_choice(registered: type[EngineClient]) -> None:
    client = registered("grpc://worker")
    request = EngineRequest(request_id="chatcmpl-1", input_ids=(1, 5, 6, 7), sampling=SamplingParams(n=2))

    outputs = [output async for output in client.generate(request)]

    for index in (0, 1):
        choice = [output for output in outputs if output.index == index]
        assert [token for output in choice for token in output.token_ids] == [100, 101, 102, EOS]
        assert [output.completion_tokens for output in choice] == [1, 2, 3, 4]
        assert all(output.prompt_tokens == 4 for output in choice)
        assert [output.finished for output in choice] == [False, False, False, True]
        assert choice[-1].finish == Finish(FinishReason.STOP, matched_token_id=EOS)
        assert all(output.finish is None for output in choice[:-1])


async def test_generate_stops_at_max_new_tokens(registered: type[EngineClient]) -> None:
    client = registered("grpc://worker")
    request = EngineRequest(request_id="r", input_ids=(1,), sampling=SamplingParams(max_new_tokens=2))
    outputs = [output async for output in client.generate(request)]
    assert [output.token_ids for output in outputs] == [(100,), (101,)]
    assert outputs[-1].finish == Finish(FinishReason.LENGTH)
    assert str(FinishReason.LENGTH) == "length"


async def test_a_cancelled_consumer_stops_the_stream_and_then_aborts() -> None:
    client = ScriptedEngine("grpc://worker", eos_after=10_000)
    request = EngineRequest(request_id="chatcmpl-gone", input_ids=(1,))
    seen: list[EngineOutput] = []
    first = asyncio.Event()

    async def consume() -> None:
        async for output in client.generate(request):
            seen.append(output)
            first.set()

    task = asyncio.create_task(consume())
    await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.abort(request.request_id)

    assert seen and seen[-1].finish is None
    assert client.cancelled == ["chatcmpl-gone"]  # the engine's stream was closed, not left running
    assert client.aborted == ["chatcmpl-gone"]


async def test_control_plane_answers_and_default_close(registered: type[EngineClient]) -> None:
    client = registered("grpc://worker")
    assert await client.health() == EngineHealth(healthy=True, message="")
    assert (await client.model_info()).eos_token_ids == (EOS,)
    assert (await client.tokenizer()).intact
    await client.close()  # the default close has nothing to release


def test_the_abstract_client_cannot_be_instantiated() -> None:
    with pytest.raises(TypeError, match="abstract"):
        EngineClient("grpc://worker")  # type: ignore[abstract]

    class HalfDone(EngineClient):
        runtime = "half"

        async def health(self) -> EngineHealth:
            return EngineHealth(healthy=True)

    with pytest.raises(TypeError, match="generate"):
        HalfDone("grpc://worker")  # type: ignore[abstract]


VALUES: list[Any] = [
    SamplingParams(),
    Constraint(ConstraintKind.REGEX, r"\d+"),
    DisaggregationParams(bootstrap_host="10.0.0.1", bootstrap_port=8998, bootstrap_room=7),
    EngineRequest(request_id="r", input_ids=(1, 2)),
    TokenLogprobs(token_id=5, logprob=-0.1, top=((5, -0.1), (6, -2.5))),
    EngineOutput(token_ids=(5,)),
    Finish(FinishReason.ABORT),
    ModelInfo(model_path="/models/m"),
    EngineHealth(healthy=False, message="starting"),
    CommandResult(success=True),
    ProfileOptions(num_steps=5),
    TokenizerBundle(data=b"zip", sha256="00"),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda value: type(value).__name__)
def test_value_types_are_frozen_slotted_and_hashable(value: Any) -> None:
    name = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, name, getattr(value, name))
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        value.extra = 1
    assert not hasattr(value, "__dict__")
    assert hash(value) == hash(dataclasses.replace(value))


def test_the_cheap_step_builder_makes_a_frozen_engine_output_equal_to_the_constructors() -> None:
    logprobs = (TokenLogprobs(7, -0.5),)
    built = ENGINE_OUTPUT_STEP(1, (7,), 10, 3, 4, 2, logprobs, (None,))
    expected = EngineOutput(1, (7,), 10, 3, 4, 2, logprobs, (None,))
    assert type(built) is EngineOutput
    # Every field read (a slot the builder left unset would raise here), each in its own place.
    assert [getattr(built, f.name) for f in dataclasses.fields(EngineOutput)] == [
        getattr(expected, f.name) for f in dataclasses.fields(EngineOutput)
    ]
    assert built == expected and hash(built) == hash(expected)
    assert dataclasses.replace(built, completion_tokens=5).completion_tokens == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.completion_tokens = 9  # type: ignore[misc]
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        built.extra = 1  # type: ignore[attr-defined]
    assert not hasattr(built, "__dict__") and not built.finished


def test_a_request_is_rebuilt_not_mutated() -> None:
    request = EngineRequest(request_id="r", input_ids=(1, 2, 3))
    assert request.sampling == SamplingParams()
    assert (request.sampling.temperature, request.sampling.top_p, request.sampling.top_k) == (1.0, 1.0, -1)
    pinned = dataclasses.replace(request, data_parallel_rank=1)
    assert (request.data_parallel_rank, pinned.data_parallel_rank) == (None, 1)
    assert pinned.input_ids == request.input_ids


def test_constraint_values_fit_their_kind() -> None:
    assert Constraint(ConstraintKind.CHOICE, ("yes", "no")).value == ("yes", "no")
    assert Constraint(ConstraintKind.JSON_OBJECT).value == ""
    assert ConstraintKind("grammar") is ConstraintKind.GRAMMAR
    with pytest.raises(ValueError, match="non-empty tuple"):
        Constraint(ConstraintKind.CHOICE, ())
    with pytest.raises(ValueError, match="non-empty tuple"):
        Constraint(ConstraintKind.CHOICE, ("yes", 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="string value"):
        Constraint(ConstraintKind.JSON_SCHEMA, ("a",))
    with pytest.raises(ValueError, match="no value"):
        Constraint(ConstraintKind.JSON_OBJECT, "{}")


def test_a_finish_matches_a_token_or_a_string_not_both() -> None:
    assert Finish(FinishReason.STOP, matched_stop_str="\n\n").matched_stop_str == "\n\n"
    with pytest.raises(ValueError):
        Finish(FinishReason.STOP, matched_token_id=2, matched_stop_str="</s>")


def test_a_tokenizer_bundle_checks_its_digest() -> None:
    data = b"PK\x03\x04 tokenizer files"
    assert TokenizerBundle(data=data, sha256=hashlib.sha256(data).hexdigest().upper()).intact
    assert not TokenizerBundle(data=data + b"!", sha256=hashlib.sha256(data).hexdigest()).intact


def test_an_engine_load_is_a_load_report_entry_without_its_worker() -> None:
    ours = EngineLoad.__required_keys__ | EngineLoad.__optional_keys__
    report = LoadEntry.__required_keys__ | LoadEntry.__optional_keys__
    assert report - ours == {"worker", "worker_type"}  # filled in by the gateway, not the engine
    assert "dp_rank" in EngineLoad.__required_keys__ and "worker" in LoadEntry.__required_keys__
