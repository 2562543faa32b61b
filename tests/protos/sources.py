"""Where the descriptors under comparison come from.

- ``generated_descriptors()``: our checked-in ``protos/*_pb2`` modules, imported here.
- ``compiled_descriptors(root)``: ``root``/protos/*.proto compiled by protoc, in a subprocess.
- ``published_descriptors()``: the published smg-grpc-proto package's own ``_pb2`` modules, imported
  in a subprocess. Never in this process: they declare the same full names as ours, and one default
  descriptor pool cannot hold both.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
from importlib import metadata, resources
from pathlib import Path

from google.protobuf import descriptor_pb2

__all__ = [
    "PROTO_STEMS",
    "ROOT",
    "compiled_descriptors",
    "generated_descriptors",
    "pinned_version",
    "published_descriptors",
]

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = "smg-grpc-proto"
# Every file of the published package; ours carry the same stems under protos/.
PROTO_STEMS = (
    "common",
    "sglang_scheduler",
    "sglang_encoder",
    "vllm_engine",
    "trtllm_service",
    "tokenspeed_scheduler",
    "tokenspeed_encoder",
    "mlx_engine",
)

_DUMP_PUBLISHED = """
import importlib, sys
from google.protobuf import descriptor_pb2
found = descriptor_pb2.FileDescriptorSet()
for stem in sys.argv[1:]:
    module = importlib.import_module(f"smg_grpc_proto.generated.{stem}_pb2")
    module.DESCRIPTOR.CopyToProto(found.file.add())
sys.stdout.buffer.write(found.SerializeToString())
"""


def pinned_version(package: str = PUBLISHED, requirements: str = "requirements-dev.txt") -> str:
    """The version ``requirements`` (a file at the repository root) pins ``package`` to."""
    for line in (ROOT / requirements).read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if name.strip().lower() == package and version:
            return version.strip()
    raise LookupError(f"{package} is not pinned in {requirements}")


def published_version() -> str:
    return metadata.version(PUBLISHED)


def published_descriptors() -> list[descriptor_pb2.FileDescriptorProto]:
    result = subprocess.run(
        [sys.executable, "-c", _DUMP_PUBLISHED, *PROTO_STEMS], capture_output=True, check=True, timeout=60
    )
    return list(descriptor_pb2.FileDescriptorSet.FromString(result.stdout).file)


def generated_descriptors() -> list[descriptor_pb2.FileDescriptorProto]:
    files = []
    for stem in PROTO_STEMS:
        module = importlib.import_module(f"protos.{stem}_pb2")
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        files.append(proto)
    return files


def compiled_descriptors(root: Path = ROOT) -> list[descriptor_pb2.FileDescriptorProto]:
    """Compile ``root``/protos/*.proto (as `make protos` names them) and return their descriptors."""
    sources = sorted((root / "protos").glob("*.proto"))
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory(prefix="protos-set-") as scratch:
        out = Path(scratch) / "set.pb"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"--proto_path={root}",
                f"--proto_path={well_known}",
                f"--descriptor_set_out={out}",
                *(path.relative_to(root).as_posix() for path in sources),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode != 0:
            raise RuntimeError(f"protoc failed: {result.stderr}")
        return list(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file)
