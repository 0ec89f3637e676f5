"""The whole MMRL stack as local processes: Redis (if none is reachable), env, rollout, learner and
coordinator, each waited for until healthy, logs under `<state_dir>/logs/`, stopped cleanly.

Used by `mmrl up`, `mmrl demo`, `mmrl eval`, `mmrl bench e2e` and the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

from mmrl.cli.run import ApiClient
from services.common.grpc_server import check_health
from services.common.procs import free_port, port_open, start_redis, stop_process
from services.rollout.config import RolloutConfig, lora_slot_rank

STARTUP_TIMEOUT_S = {"env": 60.0, "rollout": 420.0, "learner": 300.0, "coordinator": 60.0}


def learner_names(pools: int) -> tuple[str, ...]:
    """The stack's learner services, one per pool: `learner`, then `learner-2`, `learner-3`..."""
    return ("learner", *(f"learner-{i}" for i in range(2, pools + 1)))


def kind(service: str) -> str:
    """The service a stack process runs: `learner-2` is a learner."""
    return "learner" if service.startswith("learner") else service


class StackError(RuntimeError):
    """A service (or Redis) that could not be started; the message says which and why (log tail)."""


@dataclass
class StackConfig:
    model: Path
    state_dir: Path = Path(".mmrl")
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)  # missing -> a free port
    redis_url: str = ""  # "" -> start a redis-server under state_dir
    learner_nproc: int = 1
    api_token: str = field(default_factory=lambda: os.environ.get("MMRL_API_TOKEN", ""))  # "" -> no auth
    resume_runs: bool = True  # the coordinator resumes runs left running in Redis
    rollout_args: list[str] = field(default_factory=list)
    learner_model: Path | None = None  # defaults to `model`
    lora_rank: int = 0  # the largest LoRA rank the rollout must serve (vLLM sizes its slots at start); 0: default
    tower_lora: bool = False  # the rollout serves adapters on the vision tower too (runs whose LoRA targets it)
    env_name: str = ""  # the environment `mmrl serve env` serves: registered or a Gymnasium preset ("" = default)
    env_addr: str = ""  # host:port of an env server already running: the stack starts none and uses it
    learner_pools: int = 1  # learner services, each a pool holding one run; every pool shares the rollout

    @property
    def shared_root(self) -> Path:
        return self.state_dir / "shared"


def env_flags(name: str) -> list[str]:
    """`mmrl serve env`'s flags that serve `name`: a Gymnasium preset's, else a registered env's."""
    from services.env.gym.presets import PRESETS

    return ["--gymnasium", name] if name in PRESETS else ["--env", name]


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.learners = learner_names(config.learner_pools)
        self.services = ("env", "rollout", *self.learners, "coordinator")
        self.ports = {name: config.ports.get(name) or free_port() for name in self.services}
        # Prometheus /metrics of the gRPC services (the coordinator serves it on its REST port).
        self.metrics_ports = {name: free_port() for name in self.services if name != "coordinator"}
        self.redis_url = config.redis_url

    @property
    def api_url(self) -> str:
        return f"http://{self.config.host}:{self.ports['coordinator']}"

    def client(self) -> ApiClient:
        """A REST client of this stack's coordinator (with its token, if it has one)."""
        return ApiClient(self.api_url, self.config.api_token)

    def metrics_url(self, service: str) -> str:
        """Where `service`'s Prometheus text is served."""
        if service == "coordinator":
            return f"{self.api_url}/metrics"
        return f"http://{self.config.host}:{self.metrics_ports[service]}/metrics"

    def address(self, service: str) -> str:
        if service == "env" and self.config.env_addr:
            return self.config.env_addr
        return f"{self.config.host}:{self.ports[service]}"

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        models = {str(self.config.model.resolve()), str((self.config.learner_model or self.config.model).resolve())}
        allowed = [a for a in os.environ.get("MMRL_ALLOWED_MODELS", "").split(",") if a.strip()]
        env.update({
            "MMRL_ALLOWED_MODELS": ",".join([*allowed, *sorted(models)]),  # runs may name the stack's model
            "MMRL_SHARED_ROOT": str(self.config.shared_root.resolve()),
            "MMRL_REDIS_URL": self.redis_url,
            "MMRL_ENV_ADDR": self.address("env"),
            "MMRL_ROLLOUT_ADDRS": self.address("rollout"),
            "MMRL_LEARNER_ADDRS": ",".join(self.address(name) for name in self.learners),
            "MMRL_API_TOKEN": self.config.api_token,
            "MMRL_RESUME_RUNS": "true" if self.config.resume_runs else "false",
            "PYTHONUNBUFFERED": "1",
            **{f"MMRL_{name.upper()}_METRICS_PORT": str(self.metrics_ports[name])
               for name in ("env", "rollout", "learner")},
        })
        return env

    def service_environment(self, service: str) -> dict[str, str]:
        """`environment()` with `service`'s own metrics port (each learner pool serves its own)."""
        env = self.environment()
        if service in self.metrics_ports:
            env[f"MMRL_{kind(service).upper()}_METRICS_PORT"] = str(self.metrics_ports[service])
        return env

    def command(self, service: str) -> list[str]:
        cli = [sys.executable, "-m", "mmrl.cli.main", "serve", kind(service),
               "--host", self.config.host, "--port", str(self.ports[service])]
        shared = ["--shared-root", str(self.config.shared_root.resolve())]
        if service == "rollout":
            tower = ["--tower-lora"] if self.config.tower_lora else []
            return (cli + ["--model", str(self.config.model)] + shared + self._lora_slots() + self._adapter_runs()
                    + tower + self.config.rollout_args)
        if kind(service) == "learner":
            model = self.config.learner_model or self.config.model
            return cli + ["--model", str(model), "--nproc", str(self.config.learner_nproc)] + shared
        if service == "env" and self.config.env_name:
            return cli + env_flags(self.config.env_name)
        return cli

    def _lora_slots(self) -> list[str]:
        default = RolloutConfig.model_fields["max_lora_rank"].default
        if self.config.lora_rank <= default:
            return []
        return ["--max-lora-rank", str(lora_slot_rank(self.config.lora_rank))]

    def _adapter_runs(self) -> list[str]:
        """Room on the shared replica for every pool's run at once (vLLM slots and kept runs)."""
        pools = self.config.learner_pools
        if pools <= min(RolloutConfig.model_fields[f].default for f in ("max_loras", "max_adapter_runs")):
            return []
        return ["--max-loras", str(pools), "--max-adapter-runs", str(pools)]

    def start(self, services: tuple[str, ...] | None = None, log: bool = True) -> None:
        """Starts Redis (if needed) and `services` (None: all of them, every learner pool), in
        parallel, and waits until all are healthy."""
        if services is None:
            services = self.services
        _sigterm_raises_keyboard_interrupt()
        logs = self.config.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.config.shared_root.mkdir(parents=True, exist_ok=True)
        if "coordinator" in services:
            self._ensure_redis(logs)
        if "env" in services and self.config.env_addr:  # someone else's env server: wait for it, start none
            services = tuple(s for s in services if s != "env")
            self._wait_external_env()
            if log:
                print(f"env at {self.config.env_addr} is healthy (not started here)", flush=True)
        for service in services:
            handle = open(logs / f"{service}.log", "ab")  # noqa: SIM115 - owned by the child process
            self.procs[service] = subprocess.Popen(self.command(service), stdout=handle,
                                                   stderr=subprocess.STDOUT, env=self.service_environment(service),
                                                   start_new_session=True)
            if log:
                print(f"started {service:<11} pid {self.procs[service].pid:<7} "
                      f"port {self.ports[service]} (log: {logs / (service + '.log')})", flush=True)
        for service in services:
            self.wait_healthy(service)
            if log:
                print(f"{service} is healthy", flush=True)

    def _ensure_redis(self, logs: Path) -> None:
        if self.redis_url:
            parsed = urlparse(self.redis_url)
            if port_open(parsed.hostname or "127.0.0.1", parsed.port or 6379):
                return
            raise StackError(f"no Redis reachable at {self.redis_url}")
        port = self.ports.get("redis") or free_port()
        self.ports["redis"] = port
        self.procs["redis"] = start_redis(port, data_dir=self.config.state_dir / "redis",
                                          log_path=logs / "redis.log")
        self.redis_url = f"redis://127.0.0.1:{port}/0"

    def _wait_external_env(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S["env"]
        while not asyncio.run(check_health(self.config.env_addr)):
            if time.monotonic() > deadline:
                raise StackError(f"no env server is healthy at {self.config.env_addr} "
                                 f"(waited {STARTUP_TIMEOUT_S['env']:.0f} s)")
            time.sleep(0.5)

    def wait_healthy(self, service: str) -> None:
        timeout_s = STARTUP_TIMEOUT_S[kind(service)]
        deadline = time.monotonic() + timeout_s
        proc = self.procs[service]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = self._log_tail(service)
                raise StackError(f"{service} exited with code {proc.returncode} while starting:\n{tail}")
            if self.is_healthy(service):
                return
            time.sleep(0.5)
        raise StackError(f"{service} was not healthy within {timeout_s:.0f} s:\n"
                           f"{self._log_tail(service)}")

    def is_healthy(self, service: str) -> bool:
        if service == "coordinator":
            try:
                return httpx.get(f"{self.api_url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        return asyncio.run(check_health(self.address(service)))

    def _log_tail(self, service: str, lines: int = 30) -> str:
        path = self.config.state_dir / "logs" / f"{service}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def restart(self, service: str) -> None:
        self.stop_service(service)
        self.start((service,), log=False)

    def kill(self, service: str) -> None:
        """SIGKILL of the service's whole process group, as a crash would (no graceful shutdown)."""
        proc = self.procs.pop(service)
        os.killpg(proc.pid, 9)
        proc.wait()

    def start_again(self, service: str) -> None:
        """Starts a killed service again on its address, as a supervisor would (Redis from its
        append-only file), and waits until it is healthy."""
        if service == "redis":
            self.procs["redis"] = start_redis(self.ports["redis"], data_dir=self.config.state_dir / "redis",
                                              log_path=self.config.state_dir / "logs" / "redis.log")
            return
        self.start((service,), log=False)

    def stop_service(self, service: str) -> None:
        proc = self.procs.pop(service, None)
        if proc is not None:
            stop_process(proc, timeout_s=30)
            try:  # children (vLLM engine core, torchrun ranks) that outlived their parent
                os.killpg(proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self) -> None:
        """Stops every process, the coordinator first and Redis last. A further Ctrl-C meanwhile is
        ignored: the services run in their own sessions and would outlive an interrupted stop."""
        with _sigint_ignored():
            for service in ("coordinator", *self.learners, "rollout", "env", "redis"):
                self.stop_service(service)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _sigterm_raises_keyboard_interrupt() -> None:
    """SIGTERM unwinds like Ctrl-C, so `finally: stack.stop()` stops the child processes too."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.default_int_handler)
