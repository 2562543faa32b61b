from protos import tokenspeed_scheduler_pb2 as _tokenspeed_scheduler_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EncodeRequest(_message.Message):
    __slots__ = ("request_id", "mm_inputs", "items")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MM_INPUTS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    mm_inputs: _tokenspeed_scheduler_pb2.MultimodalInputs
    items: _containers.RepeatedCompositeFieldContainer[EncodeItemAssignment]
    def __init__(self, request_id: _Optional[str] = ..., mm_inputs: _Optional[_Union[_tokenspeed_scheduler_pb2.MultimodalInputs, _Mapping]] = ..., items: _Optional[_Iterable[_Union[EncodeItemAssignment, _Mapping]]] = ...) -> None: ...

class EncodeItemAssignment(_message.Message):
    __slots__ = ("bootstrap_room",)
    BOOTSTRAP_ROOM_FIELD_NUMBER: _ClassVar[int]
    bootstrap_room: int
    def __init__(self, bootstrap_room: _Optional[int] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...
