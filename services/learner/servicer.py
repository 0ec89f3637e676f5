"""gRPC `LearnerService` on rank 0: request -> `LearnerDriver` call -> reply.

Driver calls run one at a time on a single worker thread (they hold collectives with the other
ranks and the model), so the event loop keeps serving health checks during a training step.
Error mapping: ValueError -> INVALID_ARGUMENT (the message names the trajectory), StateError, an
altered checkpoint or adapter directory (ManifestError) and a version directory that is already there
(FileExistsError) -> FAILED_PRECONDITION, FileNotFoundError -> NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc

from mmrl_proto.v1 import learner_pb2, learner_pb2_grpc
from services.common import storage
from services.common.trajectory import Trajectory
from services.learner import metrics
from services.learner.driver import LearnerDriver, StateError
from services.learner.engine import LearnerState

SERVICE_NAME = "mmrl.v1.LearnerService"
log = logging.getLogger("mmrl.learner")
T = TypeVar("T")


def _state_reply(state: LearnerState) -> learner_pb2.LearnerState:
    return learner_pb2.LearnerState(
        run_id=state.run_id,
        step=state.step,
        adapter_version=state.adapter_version,
        restored_from=state.restored_from,
        train_steps=state.train_steps,
    )


class LearnerServicer(learner_pb2_grpc.LearnerServiceServicer):
    def __init__(self, driver: LearnerDriver) -> None:
        self.driver = driver
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="learner")

    async def _call(self, context: grpc.aio.ServicerContext, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except (StateError, storage.ManifestError, FileExistsError) as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except FileNotFoundError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        raise AssertionError("unreachable: abort raises")

    async def close(self) -> None:
        """Releases the other ranks, then the worker thread."""
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.driver.shutdown)
        except Exception:  # the other ranks may already be gone (torchrun stops them too)
            log.warning("could not release the other ranks", exc_info=True)
        self._executor.shutdown(wait=True)

    async def ConfigureRun(
        self, request: learner_pb2.ConfigureRunRequest, context: grpc.aio.ServicerContext
    ) -> learner_pb2.LearnerState:
        state = await self._call(context, lambda: self.driver.configure(request.run_id, request.config_json))
        return _state_reply(state)

    async def TrainStep(
        self, request: learner_pb2.TrainStepRequest, context: grpc.aio.ServicerContext
    ) -> learner_pb2.TrainStepResponse:
        trajectories = [Trajectory.from_proto(t) for t in request.trajectories]
        result = await self._call(context, lambda: self.driver.train_step(request.run_id, trajectories))
        metrics.trained(result.metrics)
        return learner_pb2.TrainStepResponse(step=result.step, metrics=result.metrics, skipped=result.skipped)

    async def PublishAdapter(
        self, request: learner_pb2.PublishAdapterRequest, context: grpc.aio.ServicerContext
    ) -> learner_pb2.PublishAdapterResponse:
        published = await self._call(context, lambda: self.driver.publish(request.run_id))
        metrics.published(published.publish_ms)
        return learner_pb2.PublishAdapterResponse(
            version=published.version,
            path=str(published.path),
            manifest_sha256=published.manifest_sha256,
            publish_ms=published.publish_ms,
        )

    async def SaveCheckpoint(
        self, request: learner_pb2.SaveCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> learner_pb2.SaveCheckpointResponse:
        step, path, ms = await self._call(context, lambda: self.driver.save_checkpoint(request.run_id))
        metrics.checkpointed(ms)
        return learner_pb2.SaveCheckpointResponse(step=step, path=str(path), checkpoint_ms=ms)

    async def LoadCheckpoint(
        self, request: learner_pb2.LoadCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> learner_pb2.LearnerState:
        state = await self._call(context, lambda: self.driver.load_checkpoint(request.run_id, request.path))
        return _state_reply(state)

    async def GetState(
        self, request: learner_pb2.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> learner_pb2.LearnerState:
        state = await self._call(context, lambda: self.driver.state(request.run_id))
        return _state_reply(state)
