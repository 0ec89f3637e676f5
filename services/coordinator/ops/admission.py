"""What a run config may reach, checked before a run is recorded: its endpoints only among the
addresses the deployment configured, its model only under the shared root or an allowed directory,
or an allowed hub id, and colocated mode only where no other learner pool shares the rollout
replicas. Refusals are NotAllowed (HTTP 422 naming the field)."""

from __future__ import annotations

from pathlib import Path

from services.coordinator.config import CoordinatorSettings, RunConfig


class NotAllowed(ValueError):
    """The run config names something this deployment does not allow."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def allowed_addresses(settings: CoordinatorSettings) -> set[str]:
    return {*_split(settings.env_addr), *settings.pools, *_split(settings.rollout_addrs),
            *_split(settings.allowed_endpoints)}


def check_endpoints(config: RunConfig, settings: CoordinatorSettings) -> None:
    allowed = allowed_addresses(settings)
    named = [("endpoints.learner", config.endpoints.learner),
             *((f"endpoints.env[{i}]", a) for i, a in enumerate(config.endpoints.env)),
             *((f"endpoints.rollout[{i}]", a) for i, a in enumerate(config.endpoints.rollout))]
    for field, address in named:
        if address and address not in allowed:
            raise NotAllowed(field, f"{address!r} is not an address this coordinator is configured to use "
                                    "(MMRL_ENV_ADDR, MMRL_ROLLOUT_ADDRS, MMRL_LEARNER_ADDRS, MMRL_ALLOWED_ENDPOINTS)")


def check_model(config: RunConfig, settings: CoordinatorSettings) -> None:
    entries = _split(settings.allowed_models)
    if config.model in entries:
        return
    resolved = Path(config.model).expanduser().resolve()
    roots = [Path(settings.shared_root), *(Path(e) for e in entries)]
    for root in roots:
        if resolved.is_relative_to(root.expanduser().resolve()):
            return
    raise NotAllowed("model", f"{config.model!r} is neither under the shared root nor among the allowed "
                              "models (MMRL_ALLOWED_MODELS: directories or hub ids)")


def check_colocated(config: RunConfig, settings: CoordinatorSettings) -> None:
    """A colocated run puts the rollout engines to sleep while its learner trains on their GPUs. The
    replicas serve every pool's runs, so with more than one pool another run would sample from a
    sleeping engine (or wake it under a training learner)."""
    if config.colocated and len(settings.pools) > 1:
        raise NotAllowed("colocated", f"colocated mode sleeps the rollout replicas every run shares; this "
                                      f"coordinator has {len(settings.pools)} learner pools (MMRL_LEARNER_ADDRS), "
                                      "so set colocated: false (each pool on GPUs of its own) or use one pool")


def check_run_config(config: RunConfig, settings: CoordinatorSettings) -> None:
    """Raises NotAllowed for endpoints or a model outside what the deployment configured, or a
    colocated run where learner pools share the rollout replicas."""
    check_endpoints(config, settings)
    check_model(config, settings)
    check_colocated(config, settings)
