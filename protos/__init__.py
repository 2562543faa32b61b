"""The engines' gRPC services as the project declares them (sglang, vllm, trtllm, tokenspeed, mlx and
the shared ``smg.grpc.common`` messages), with generated modules imported as
``from protos import sglang_scheduler_pb2, sglang_scheduler_pb2_grpc``.

The .proto packages and names are the engines' own (the wire path is the full service name, e.g.
``/sglang.grpc.scheduler.SglangScheduler/Generate``); the Python modules are ours. They declare the
same full names as the published ``smg-grpc-proto`` package, so the two must never be imported into
one process: the default descriptor pool would refuse the second. See protos/README.md.

This package is a leaf of the import graph (.importlinter): it imports nothing of ours.
"""

from __future__ import annotations

__all__: list[str] = []
