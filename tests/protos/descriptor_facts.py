"""Wire facts of a set of .proto files, read from their FileDescriptorProtos, in a form two sets can
be compared by: one entry per package, message, field, oneof, enum value, service and RPC, keyed by
full name, valued by everything about it that decides the bytes on the wire or the gRPC path.

File names are compared by stem (ours are ``protos/common.proto``, the published package's
``common.proto``); json_name, comments and file options (go_package and the like) are not wire facts
and are left out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from google.protobuf import descriptor_pb2

__all__ = ["FactDiff", "diff_facts", "wire_facts"]

_FDP = descriptor_pb2.FieldDescriptorProto
_SCALARS: dict[int, str] = {
    _FDP.TYPE_DOUBLE: "double",
    _FDP.TYPE_FLOAT: "float",
    _FDP.TYPE_INT64: "int64",
    _FDP.TYPE_UINT64: "uint64",
    _FDP.TYPE_INT32: "int32",
    _FDP.TYPE_FIXED64: "fixed64",
    _FDP.TYPE_FIXED32: "fixed32",
    _FDP.TYPE_BOOL: "bool",
    _FDP.TYPE_STRING: "string",
    _FDP.TYPE_BYTES: "bytes",
    _FDP.TYPE_UINT32: "uint32",
    _FDP.TYPE_SFIXED32: "sfixed32",
    _FDP.TYPE_SFIXED64: "sfixed64",
    _FDP.TYPE_SINT32: "sint32",
    _FDP.TYPE_SINT64: "sint64",
}
_GOOGLE_PREFIX = "google/protobuf/"


@dataclass(frozen=True, slots=True)
class FactDiff:
    """What one side declares that the other does not, and what both declare differently."""

    only_left: dict[str, str]
    only_right: dict[str, str]
    changed: dict[str, tuple[str, str]]

    def __bool__(self) -> bool:
        return bool(self.only_left or self.only_right or self.changed)

    def render(self, left: str, right: str) -> str:
        lines = [f"only in {left}: {key} [{value}]" for key, value in sorted(self.only_left.items())]
        lines += [f"only in {right}: {key} [{value}]" for key, value in sorted(self.only_right.items())]
        lines += [
            f"differs: {key}: {left} [{ours}] != {right} [{theirs}]"
            for key, (ours, theirs) in sorted(self.changed.items())
        ]
        return "\n".join(lines)


def diff_facts(left: dict[str, str], right: dict[str, str]) -> FactDiff:
    return FactDiff(
        only_left={key: left[key] for key in left.keys() - right.keys()},
        only_right={key: right[key] for key in right.keys() - left.keys()},
        changed={key: (left[key], right[key]) for key in left.keys() & right.keys() if left[key] != right[key]},
    )


def wire_facts(files: Iterable[descriptor_pb2.FileDescriptorProto]) -> dict[str, str]:
    """Facts of every file given, except the well-known google/protobuf ones they import."""
    facts: dict[str, str] = {}
    for file in files:
        if file.name.startswith(_GOOGLE_PREFIX):
            continue
        stem = PurePosixPath(file.name).stem
        _put(facts, f"file {stem}", f"package={file.package} syntax={file.syntax or 'proto2'}")
        scope = f"{file.package}." if file.package else ""
        for enum in file.enum_type:
            _enum_facts(facts, enum, scope, stem)
        for message in file.message_type:
            _message_facts(facts, message, scope, stem)
        for service in file.service:
            service_name = scope + service.name
            _put(facts, f"service {service_name}", f"file={stem}{_options(service.options)}")
            for method in service.method:
                request = ("stream " if method.client_streaming else "") + method.input_type.lstrip(".")
                response = ("stream " if method.server_streaming else "") + method.output_type.lstrip(".")
                _put(facts, f"rpc /{service_name}/{method.name}", f"{request} -> {response}{_options(method.options)}")
    return facts


def _put(facts: dict[str, str], key: str, value: str) -> None:
    if key in facts:
        raise ValueError(f"declared twice: {key}")
    facts[key] = value


def _options(options: descriptor_pb2.MessageOptions | descriptor_pb2.FieldOptions | descriptor_pb2.ServiceOptions
             | descriptor_pb2.MethodOptions | descriptor_pb2.EnumOptions | descriptor_pb2.EnumValueOptions) -> str:
    if not options.ByteSize():
        return ""
    text = " ".join(str(options).split())
    return f" options=({text})"


def _reserved(ranges: Iterable[descriptor_pb2.DescriptorProto.ReservedRange
                               | descriptor_pb2.EnumDescriptorProto.EnumReservedRange], names: Iterable[str]) -> str:
    """Reserved numbers as maximal runs, so ``reserved 7 to 10`` and ``reserved 7, 8, 9, 10`` (the same
    reservation written two ways) read alike. Message ranges are end-exclusive, enum ranges inclusive."""
    spans = sorted(
        (r.start, r.end if isinstance(r, descriptor_pb2.EnumDescriptorProto.EnumReservedRange) else r.end - 1)
        for r in ranges
    )
    runs: list[tuple[int, int]] = []
    for start, last in spans:
        if runs and start <= runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], max(runs[-1][1], last))
        else:
            runs.append((start, last))
    parts = []
    if runs:
        parts.append(" reserved=" + ",".join(str(a) if a == b else f"{a}..{b}" for a, b in runs))
    reserved_names = sorted(names)
    if reserved_names:
        parts.append(f" reserved_names={','.join(reserved_names)}")
    return "".join(parts)


def _enum_facts(facts: dict[str, str], enum: descriptor_pb2.EnumDescriptorProto, scope: str, stem: str) -> None:
    name = scope + enum.name
    extra = _reserved(enum.reserved_range, enum.reserved_name) + _options(enum.options)
    _put(facts, f"enum {name}", f"file={stem}{extra}")
    for value in enum.value:
        _put(facts, f"enum value {name}.{value.name}", f"number={value.number}{_options(value.options)}")


def _message_facts(facts: dict[str, str], message: descriptor_pb2.DescriptorProto, scope: str, stem: str) -> None:
    name = scope + message.name
    nested = {f".{name}.{inner.name}": inner for inner in message.nested_type}
    extra = _reserved(message.reserved_range, message.reserved_name) + _options(message.options)
    _put(facts, f"message {name}", f"file={stem}{extra}")
    if message.extension_range or message.extension:
        raise ValueError(f"{name}: extensions are not expected in these protos")
    real_oneofs: dict[int, list[str]] = {}
    for field in message.field:
        label = _label(field, message, nested)
        if field.HasField("oneof_index") and not field.proto3_optional:
            real_oneofs.setdefault(field.oneof_index, []).append(field.name)
        _put(
            facts,
            f"field {name}.{field.name}",
            f"number={field.number} type={_type(field)} label={label}{_options(field.options)}",
        )
    for index, members in sorted(real_oneofs.items()):
        oneof = message.oneof_decl[index]
        _put(facts, f"oneof {name}.{oneof.name}", f"fields={','.join(sorted(members))}")
    for enum in message.enum_type:
        _enum_facts(facts, enum, f"{name}.", stem)
    for inner in message.nested_type:
        _message_facts(facts, inner, f"{name}.", stem)


def _type(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.type == _FDP.TYPE_MESSAGE:
        return f"message:{field.type_name.lstrip('.')}"
    if field.type == _FDP.TYPE_ENUM:
        return f"enum:{field.type_name.lstrip('.')}"
    if field.type == _FDP.TYPE_GROUP:
        raise ValueError(f"{field.name}: groups are not expected in proto3")
    return _SCALARS[field.type]


def _label(field: descriptor_pb2.FieldDescriptorProto, message: descriptor_pb2.DescriptorProto,
           nested: dict[str, descriptor_pb2.DescriptorProto]) -> str:
    if field.label == _FDP.LABEL_REPEATED:
        entry = nested.get(field.type_name)
        if entry is not None and entry.options.map_entry:
            key, value = (_type(f) for f in sorted(entry.field, key=lambda f: f.number))
            return f"map<{key},{value}>"
        return "repeated"
    if field.proto3_optional:
        return "optional"
    if field.HasField("oneof_index"):
        return f"oneof:{message.oneof_decl[field.oneof_index].name}"
    if field.label == _FDP.LABEL_REQUIRED:
        return "required"
    return "singular"
