from google.protobuf import struct_pb2 as _struct_pb2
from mmrl_proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EpisodeSpec(_message.Message):
    __slots__ = ("seed", "max_moves", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_MOVES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    seed: int
    max_moves: int
    options: _containers.ScalarMap[str, str]
    def __init__(self, seed: _Optional[int] = ..., max_moves: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("images", "text")
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[_common_pb2.Image]
    text: str
    def __init__(self, images: _Optional[_Iterable[_Union[_common_pb2.Image, _Mapping]]] = ..., text: _Optional[str] = ...) -> None: ...

class EpisodeState(_message.Message):
    __slots__ = ("episode_id", "observation", "reward", "done", "info", "state_key", "truncated")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    STATE_KEY_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    observation: Observation
    reward: float
    done: bool
    info: _struct_pb2.Struct
    state_key: str
    truncated: bool
    def __init__(self, episode_id: _Optional[str] = ..., observation: _Optional[_Union[Observation, _Mapping]] = ..., reward: _Optional[float] = ..., done: _Optional[bool] = ..., info: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., state_key: _Optional[str] = ..., truncated: _Optional[bool] = ...) -> None: ...

class CreateEpisodesRequest(_message.Message):
    __slots__ = ("specs",)
    SPECS_FIELD_NUMBER: _ClassVar[int]
    specs: _containers.RepeatedCompositeFieldContainer[EpisodeSpec]
    def __init__(self, specs: _Optional[_Iterable[_Union[EpisodeSpec, _Mapping]]] = ...) -> None: ...

class CreateEpisodesResponse(_message.Message):
    __slots__ = ("episodes",)
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    episodes: _containers.RepeatedCompositeFieldContainer[EpisodeState]
    def __init__(self, episodes: _Optional[_Iterable[_Union[EpisodeState, _Mapping]]] = ...) -> None: ...

class EpisodeAction(_message.Message):
    __slots__ = ("episode_id", "action")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    action: str
    def __init__(self, episode_id: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("actions",)
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[EpisodeAction]
    def __init__(self, actions: _Optional[_Iterable[_Union[EpisodeAction, _Mapping]]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("episodes",)
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    episodes: _containers.RepeatedCompositeFieldContainer[EpisodeState]
    def __init__(self, episodes: _Optional[_Iterable[_Union[EpisodeState, _Mapping]]] = ...) -> None: ...

class CloseEpisodesRequest(_message.Message):
    __slots__ = ("episode_ids",)
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, episode_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CloseEpisodesResponse(_message.Message):
    __slots__ = ("num_closed",)
    NUM_CLOSED_FIELD_NUMBER: _ClassVar[int]
    num_closed: int
    def __init__(self, num_closed: _Optional[int] = ...) -> None: ...

class GetEvalSetRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetEvalSetResponse(_message.Message):
    __slots__ = ("name", "version", "content_hash", "specs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    SPECS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    content_hash: str
    specs: _containers.RepeatedCompositeFieldContainer[EpisodeSpec]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., content_hash: _Optional[str] = ..., specs: _Optional[_Iterable[_Union[EpisodeSpec, _Mapping]]] = ...) -> None: ...

class GetEnvInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnvInfo(_message.Message):
    __slots__ = ("name", "actions", "capabilities", "eval_sets")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    EVAL_SETS_FIELD_NUMBER: _ClassVar[int]
    name: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    eval_sets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., capabilities: _Optional[_Iterable[str]] = ..., eval_sets: _Optional[_Iterable[str]] = ...) -> None: ...

class GetTrainingTasksRequest(_message.Message):
    __slots__ = ("seed", "count", "max_moves", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEED_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_MOVES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    seed: str
    count: int
    max_moves: int
    options: _containers.ScalarMap[str, str]
    def __init__(self, seed: _Optional[str] = ..., count: _Optional[int] = ..., max_moves: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetTrainingTasksResponse(_message.Message):
    __slots__ = ("specs",)
    SPECS_FIELD_NUMBER: _ClassVar[int]
    specs: _containers.RepeatedCompositeFieldContainer[EpisodeSpec]
    def __init__(self, specs: _Optional[_Iterable[_Union[EpisodeSpec, _Mapping]]] = ...) -> None: ...
