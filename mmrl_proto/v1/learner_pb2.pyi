from mmrl_proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConfigureRunRequest(_message.Message):
    __slots__ = ("run_id", "config_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    config_json: str
    def __init__(self, run_id: _Optional[str] = ..., config_json: _Optional[str] = ...) -> None: ...

class LearnerState(_message.Message):
    __slots__ = ("run_id", "step", "adapter_version", "restored_from", "train_steps")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STEPS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    adapter_version: int
    restored_from: str
    train_steps: int
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., adapter_version: _Optional[int] = ..., restored_from: _Optional[str] = ..., train_steps: _Optional[int] = ...) -> None: ...

class TrainStepRequest(_message.Message):
    __slots__ = ("run_id", "trajectories")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    trajectories: _containers.RepeatedCompositeFieldContainer[_common_pb2.Trajectory]
    def __init__(self, run_id: _Optional[str] = ..., trajectories: _Optional[_Iterable[_Union[_common_pb2.Trajectory, _Mapping]]] = ...) -> None: ...

class TrainStepResponse(_message.Message):
    __slots__ = ("step", "metrics", "skipped")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    step: int
    metrics: _containers.ScalarMap[str, float]
    skipped: bool
    def __init__(self, step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., skipped: _Optional[bool] = ...) -> None: ...

class PublishAdapterRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class PublishAdapterResponse(_message.Message):
    __slots__ = ("version", "path", "manifest_sha256", "publish_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_MS_FIELD_NUMBER: _ClassVar[int]
    version: int
    path: str
    manifest_sha256: str
    publish_ms: float
    def __init__(self, version: _Optional[int] = ..., path: _Optional[str] = ..., manifest_sha256: _Optional[str] = ..., publish_ms: _Optional[float] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("step", "path", "checkpoint_ms")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_MS_FIELD_NUMBER: _ClassVar[int]
    step: int
    path: str
    checkpoint_ms: float
    def __init__(self, step: _Optional[int] = ..., path: _Optional[str] = ..., checkpoint_ms: _Optional[float] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ("run_id", "path")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    path: str
    def __init__(self, run_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...
