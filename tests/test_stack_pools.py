"""A local stack with several learner pools: one learner service per pool, each on its own port and
metrics port, all named to the coordinator in MMRL_LEARNER_ADDRS."""

from __future__ import annotations

from pathlib import Path

from mmrl.cli.stack import Stack, StackConfig


def test_each_pool_is_a_learner_service_of_its_own_named_to_the_coordinator(tmp_path: Path) -> None:
    stack = Stack(StackConfig(model=tmp_path, learner_pools=3))
    assert stack.learners == ("learner", "learner-2", "learner-3")
    assert stack.services == ("env", "rollout", "learner", "learner-2", "learner-3", "coordinator")
    addresses = stack.environment()["MMRL_LEARNER_ADDRS"].split(",")
    assert addresses == [stack.address(name) for name in stack.learners] and len(set(addresses)) == 3
    for name in stack.learners:
        command = stack.command(name)
        assert command[command.index("serve") + 1] == "learner"
        assert command[command.index("--port") + 1] == str(stack.ports[name])
    metrics = {stack.service_environment(name)["MMRL_LEARNER_METRICS_PORT"] for name in stack.learners}
    assert metrics == {str(stack.metrics_ports[name]) for name in stack.learners} and len(metrics) == 3


def test_one_pool_is_the_stack_as_before(tmp_path: Path) -> None:
    stack = Stack(StackConfig(model=tmp_path))
    assert stack.services == ("env", "rollout", "learner", "coordinator")
    assert stack.environment()["MMRL_LEARNER_ADDRS"] == stack.address("learner")


def test_the_rollout_keeps_room_for_every_pools_run(tmp_path: Path) -> None:
    assert "--max-adapter-runs" not in Stack(StackConfig(model=tmp_path, learner_pools=2)).command("rollout")
    command = Stack(StackConfig(model=tmp_path, learner_pools=4)).command("rollout")
    assert command[command.index("--max-loras") + 1] == command[command.index("--max-adapter-runs") + 1] == "4"
