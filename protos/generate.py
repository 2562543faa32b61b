"""Regenerate the checked-in Python modules from protos/*.proto (``make protos``).

protoc runs with the repository root as its only import root for our files, so each file is named
``protos/<name>.proto`` and the generated code imports its neighbours as ``from protos import
common_pb2``: no rewriting afterwards. For each .proto it writes ``<name>_pb2.py`` (messages),
``<name>_pb2.pyi`` (their types, protoc's own), ``<name>_pb2_grpc.py`` (client stubs and server
bases) and ``<name>_pb2_grpc.pyi`` (their types, sync and grpc.aio, from mypy-protobuf's plugin). The
output depends only on the .proto files and the pinned grpcio-tools and mypy-protobuf, so
regenerating is byte-for-byte reproducible; tests/protos/test_generated_current.py holds the
checked-in files to it.

grpcio-tools and mypy-protobuf are development dependencies: the gateway itself needs only grpcio
and protobuf.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

__all__ = ["GENERATED_SUFFIXES", "generate", "generated_files", "grpc_types_plugin", "proto_sources"]

PACKAGE_DIR = Path(__file__).resolve().parent
ROOT = PACKAGE_DIR.parent
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
GRPC_TYPES_PLUGIN = "protoc-gen-mypy_grpc"


def proto_sources(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Every .proto file of the package, in a fixed order."""
    return sorted(package_dir.glob("*.proto"))


def generated_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Every generated module now present in ``package_dir``."""
    return sorted(path for suffix in GENERATED_SUFFIXES for path in package_dir.glob(f"*{suffix}"))


def grpc_types_plugin() -> Path:
    """mypy-protobuf's plugin for typed gRPC stubs, installed beside this interpreter."""
    beside = Path(sys.executable).parent / GRPC_TYPES_PLUGIN
    found = str(beside) if beside.exists() else shutil.which(GRPC_TYPES_PLUGIN)
    if found is None:
        raise FileNotFoundError(f"{GRPC_TYPES_PLUGIN} not found: pip install -r requirements-dev.txt")
    return Path(found)


def generate(out_root: Path = ROOT, source_root: Path = ROOT) -> list[Path]:
    """Compile ``source_root``/protos/*.proto into ``out_root``/protos/ and return the files written.

    Generated modules in the target that no .proto produces any more are removed.
    """
    package_dir = source_root / PACKAGE_DIR.name
    sources = proto_sources(package_dir)
    if not sources:
        raise FileNotFoundError(f"no .proto files in {package_dir}")
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory(prefix="protos-") as scratch:
        arguments = [
            "grpc_tools.protoc",
            f"--proto_path={source_root}",
            f"--proto_path={well_known}",
            f"--python_out={scratch}",
            f"--pyi_out={scratch}",
            f"--grpc_python_out={scratch}",
            f"--plugin={GRPC_TYPES_PLUGIN}={grpc_types_plugin()}",
            f"--mypy_grpc_out={scratch}",
            *(path.relative_to(source_root).as_posix() for path in sources),
        ]
        status = protoc.main(arguments)
        if status != 0:
            raise RuntimeError(f"protoc failed with exit status {status}")
        target = out_root / PACKAGE_DIR.name
        target.mkdir(parents=True, exist_ok=True)
        for stale in generated_files(target):
            stale.unlink()
        written = []
        for produced in generated_files(Path(scratch) / PACKAGE_DIR.name):
            destination = target / produced.name
            shutil.copyfile(produced, destination)
            written.append(destination)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m protos.generate", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT,
        help="root to write <root>/protos/*_pb2*.py into (default: this checkout, replacing the checked-in files)",
    )
    options = parser.parse_args(argv)
    written = generate(out_root=options.out.resolve())
    print(f"wrote {len(written)} files into {options.out.resolve() / PACKAGE_DIR.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
