"""The checked-in generated modules are exactly what `make protos` writes from protos/*.proto, they
resolve inside our own package, and the pinned runtimes satisfy the versions they were generated for."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import google.protobuf
import grpc

from protos import generate
from tests.protos.sources import PROTO_STEMS, ROOT, pinned_version


def _header(path: Path, pattern: str) -> str:
    found = re.search(pattern, path.read_text(), flags=re.MULTILINE)
    assert found is not None, f"{path.name} has no line matching {pattern!r}"
    return found.group(1)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_regenerating_writes_the_checked_in_files_byte_for_byte(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "protos.generate", "--out", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    fresh = {path.name: path.read_bytes() for path in generate.generated_files(tmp_path / "protos")}
    checked_in = {path.name: path.read_bytes() for path in generate.generated_files()}
    assert sorted(fresh) == sorted(checked_in)
    assert len(fresh) == 4 * len(PROTO_STEMS)
    stale = sorted(name for name in fresh if fresh[name] != checked_in[name])
    assert stale == [], f"run `make protos`: {stale} differ from what protos/*.proto generate"


def test_every_proto_has_its_four_generated_modules() -> None:
    assert [path.stem for path in generate.proto_sources()] == sorted(PROTO_STEMS)
    names = {path.name for path in generate.generated_files()}
    for stem in PROTO_STEMS:
        assert {f"{stem}{suffix}" for suffix in generate.GENERATED_SUFFIXES} <= names


def test_generated_modules_import_each_other_inside_our_package() -> None:
    for stem in PROTO_STEMS:
        for path in (ROOT / "protos" / f"{stem}_pb2.py", ROOT / "protos" / f"{stem}_pb2_grpc.py"):
            imports = set(re.findall(r"^(?:from|import) (\S+)", path.read_text(), flags=re.MULTILINE))
            foreign = imports - {"google.protobuf", "google.protobuf.internal", "grpc", "warnings", "protos"}
            assert foreign == set(), f"{path.name} imports {foreign}"
        module = importlib.import_module(f"protos.{stem}_pb2")
        assert module.DESCRIPTOR.name == f"protos/{stem}.proto"
    assert "from protos import common_pb2 as " in (ROOT / "protos" / "sglang_scheduler_pb2.py").read_text()
    scheduler = importlib.import_module("protos.sglang_scheduler_pb2")
    assert scheduler.DESCRIPTOR.package == "sglang.grpc.scheduler"
    assert scheduler.DESCRIPTOR.services_by_name["SglangScheduler"].full_name == "sglang.grpc.scheduler.SglangScheduler"
    assert "smg_grpc_proto" not in sys.modules


def test_the_pinned_protobuf_runtime_accepts_the_generated_code() -> None:
    headers = {_header(path, r"^# Protobuf Python Version: (\S+)$") for path in (ROOT / "protos").glob("*_pb2.py")}
    assert len(headers) == 1
    (gencode,) = headers
    pinned = pinned_version("protobuf", "requirements.txt")
    assert google.protobuf.__version__ == pinned
    # protobuf's rule: the runtime is the gencode's major version and no older than the gencode.
    assert _version(pinned)[0] == _version(gencode)[0]
    assert _version(pinned) >= _version(gencode)


def test_the_pinned_grpcio_runtime_accepts_the_generated_stubs() -> None:
    versions = {
        _header(path, r"^GRPC_GENERATED_VERSION = '(\S+)'$") for path in (ROOT / "protos").glob("*_pb2_grpc.py")
    }
    assert versions == {pinned_version("grpcio-tools")}
    pinned = pinned_version("grpcio", "requirements.txt")
    assert grpc.__version__ == pinned
    assert _version(pinned) >= _version(versions.pop())
