"""Our protos against the published smg-grpc-proto package, fact by fact: every package, service,
RPC (with its streaming), message, field (number, type, label: singular, repeated, proto3
optional, oneof membership, map<key,value>), oneof, enum value and reserved number. Equal both ways:
what we declare must be theirs, and everything they declare must be ours."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.protos.descriptor_facts import diff_facts, wire_facts
from tests.protos.sources import (
    PROTO_STEMS,
    ROOT,
    compiled_descriptors,
    generated_descriptors,
    pinned_version,
    published_descriptors,
    published_version,
)


@pytest.fixture(scope="module")
def published() -> dict[str, str]:
    return wire_facts(published_descriptors())


def test_the_published_package_is_the_pinned_version() -> None:
    assert published_version() == pinned_version()


def test_both_sides_declare_the_same_files_and_packages(published: dict[str, str]) -> None:
    ours = wire_facts(generated_descriptors())
    files = {key: value for key, value in ours.items() if key.startswith("file ")}
    assert files == {key: value for key, value in published.items() if key.startswith("file ")}
    assert sorted(key.removeprefix("file ") for key in files) == sorted(PROTO_STEMS)
    assert files["file sglang_scheduler"] == "package=sglang.grpc.scheduler syntax=proto3"
    assert files["file common"] == "package=smg.grpc.common syntax=proto3"


def test_the_generated_modules_match_the_published_descriptors(published: dict[str, str]) -> None:
    ours = wire_facts(generated_descriptors())
    # Both sides really were read: well over a thousand facts, and the ones the gateway lives on.
    assert len(published) > 1000
    assert ours["rpc /sglang.grpc.scheduler.SglangScheduler/Generate"] == (
        "sglang.grpc.scheduler.GenerateRequest -> stream sglang.grpc.scheduler.GenerateResponse"
    )
    assert ours["rpc /vllm.grpc.engine.VllmEngine/GetTokenizer"] == (
        "smg.grpc.common.GetTokenizerRequest -> stream smg.grpc.common.GetTokenizerChunk"
    )
    assert ours["field sglang.grpc.scheduler.SamplingParams.max_new_tokens"] == (
        "number=8 type=uint32 label=optional"
    )
    assert ours["field vllm.grpc.engine.SamplingParams.logit_bias"] == (
        "number=26 type=message:vllm.grpc.engine.SamplingParams.LogitBiasEntry label=map<int32,float>"
    )
    assert ours["oneof sglang.grpc.scheduler.GenerateComplete.matched_stop"] == (
        "fields=matched_stop_str,matched_token_id"
    )
    difference = diff_facts(ours, published)
    assert not difference, "\n" + difference.render("ours", "published")


def test_the_proto_sources_match_the_published_descriptors(published: dict[str, str]) -> None:
    difference = diff_facts(wire_facts(compiled_descriptors()), published)
    assert not difference, "\n" + difference.render("protos/*.proto", "published")


# Each mutation is one small edit to a copy of our sources, and the one fact it must show up as.
MUTATIONS = [
    pytest.param(
        "sglang_scheduler.proto",
        "  uint32 n = 17;\n",
        "  uint32 n = 30;\n",
        "field sglang.grpc.scheduler.SamplingParams.n",
        id="field-number",
    ),
    pytest.param(
        "vllm_engine.proto",
        "  uint32 top_k = 3;\n",
        "  int32 top_k = 3;\n",
        "field vllm.grpc.engine.SamplingParams.top_k",
        id="field-type",
    ),
    pytest.param(
        "sglang_scheduler.proto",
        "  optional uint32 max_new_tokens = 8;\n",
        "  uint32 max_new_tokens = 8;\n",
        "field sglang.grpc.scheduler.SamplingParams.max_new_tokens",
        id="optional-dropped",
    ),
    pytest.param(
        "sglang_scheduler.proto",
        "  repeated uint32 stop_token_ids = 10;\n",
        "  uint32 stop_token_ids = 10;\n",
        "field sglang.grpc.scheduler.SamplingParams.stop_token_ids",
        id="repeated-dropped",
    ),
    pytest.param(
        "vllm_engine.proto",
        "  map<int32, float> logit_bias = 26;\n",
        "  map<string, float> logit_bias = 26;\n",
        "field vllm.grpc.engine.SamplingParams.logit_bias",
        id="map-key",
    ),
    pytest.param(
        "common.proto",
        "  KV_CACHE_TIER_DISK = 3;\n",
        "  KV_CACHE_TIER_DISK = 5;\n",
        "enum value smg.grpc.common.KvCacheTier.KV_CACHE_TIER_DISK",
        id="enum-value",
    ),
    pytest.param(
        "sglang_scheduler.proto",
        "  rpc Generate(GenerateRequest) returns (stream GenerateResponse);\n",
        "  rpc Generate(GenerateRequest) returns (GenerateResponse);\n",
        "rpc /sglang.grpc.scheduler.SglangScheduler/Generate",
        id="rpc-streaming",
    ),
    pytest.param(
        "sglang_scheduler.proto",
        "message EmbedResponse {\n  reserved 1, 2, 3;\n",
        "message EmbedResponse {\n  reserved 1, 2;\n",
        "message sglang.grpc.scheduler.EmbedResponse",
        id="reserved-number",
    ),
    pytest.param(
        "mlx_engine.proto",
        "package mlx.grpc.engine;\n",
        "package mlx.engine;\n",
        "file mlx_engine",
        id="package",
    ),
]


@pytest.mark.parametrize(("file", "before", "after", "fact"), MUTATIONS)
def test_a_changed_wire_fact_fails_the_contract(
    tmp_path: Path, published: dict[str, str], file: str, before: str, after: str, fact: str
) -> None:
    copy = tmp_path / "protos"
    copy.mkdir()
    for source in (ROOT / "protos").glob("*.proto"):
        shutil.copy(source, copy / source.name)
    text = (copy / file).read_text()
    assert text.count(before) == 1, f"the mutation's anchor is not unique in {file}"
    (copy / file).write_text(text.replace(before, after))

    difference = diff_facts(wire_facts(compiled_descriptors(tmp_path)), published)

    assert fact in difference.changed, "\n" + difference.render("mutated", "published")
    ours, theirs = difference.changed[fact]
    assert theirs == published[fact]
    assert ours != theirs


def test_a_field_number_change_is_the_one_difference_reported(tmp_path: Path, published: dict[str, str]) -> None:
    copy = tmp_path / "protos"
    shutil.copytree(ROOT / "protos", copy, ignore=shutil.ignore_patterns("*.py", "*.pyi", "*.md", "__pycache__"))
    path = copy / "vllm_engine.proto"
    text = path.read_text()
    assert text.count("  int32 max_num_seqs = 20;\n") == 1
    path.write_text(text.replace("  int32 max_num_seqs = 20;\n", "  int32 max_num_seqs = 29;\n"))

    difference = diff_facts(wire_facts(compiled_descriptors(tmp_path)), published)

    assert difference.only_left == {}
    assert difference.only_right == {}
    assert difference.changed == {
        "field vllm.grpc.engine.GetServerInfoResponse.max_num_seqs": (
            "number=29 type=int32 label=singular",
            "number=20 type=int32 label=singular",
        )
    }
    assert difference.render("ours", "published") == (
        "differs: field vllm.grpc.engine.GetServerInfoResponse.max_num_seqs: "
        "ours [number=29 type=int32 label=singular] != published [number=20 type=int32 label=singular]"
    )


def test_the_compiled_set_is_exactly_our_files() -> None:
    names = sorted(file.name for file in compiled_descriptors())
    assert names == sorted(f"protos/{stem}.proto" for stem in PROTO_STEMS)
