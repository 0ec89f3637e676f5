"""Checks of what the server is and offers: health, reflection, GetEnvInfo, eval sets and training
tasks. Each takes the Context and returns a one-line detail, or raises CheckFailed."""

from __future__ import annotations

import hashlib

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mmrl.envcheck.probe import CHECK_SEED, KNOWN_CAPABILITIES, CheckFailed, Context, shown_spec, spec_key
from mmrl_proto.v1 import env_pb2

SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name  # mmrl.v1.EnvService
DISJOINT_DRAWS, DISJOINT_COUNT = 4, 256  # training tasks compared with the eval sets: draws x count


async def serving(ctx: Context) -> str:
    """grpc.health.v1 answers SERVING for the server ("") and for mmrl.v1.EnvService."""
    stub = health_pb2_grpc.HealthStub(ctx.probe.channel)
    for service in ("", SERVICE):
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=ctx.probe.timeout_s)
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            raise CheckFailed(f"health of {service or 'the server'!r} is {status}, not SERVING")
    return f"SERVING for '' and {SERVICE}"


async def reflection(ctx: Context) -> str:
    """Server reflection (grpc.reflection.v1alpha) lists mmrl.v1.EnvService."""
    stub = reflection_pb2_grpc.ServerReflectionStub(ctx.probe.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    services: list[str] = []
    async for reply in stub.ServerReflectionInfo(iter([request]), timeout=ctx.probe.timeout_s):
        services += [s.name for s in reply.list_services_response.service]
    if SERVICE not in services:
        raise CheckFailed(f"reflection lists {services or 'nothing'}, not {SERVICE}")
    return f"lists {', '.join(sorted(services))}"


async def env_info(ctx: Context) -> str:
    """GetEnvInfo: a name, distinct non-empty action words, known capabilities, at least one eval set."""
    info = await ctx.info()
    problems = []
    if not info.name.strip():
        problems.append("no name")
    if not info.actions or any(not a.strip() or a != a.strip() for a in info.actions):
        problems.append(f"actions {list(info.actions)} (non-empty words without surrounding space needed)")
    if len(set(info.actions)) != len(info.actions):
        problems.append(f"repeated actions {list(info.actions)}")
    unknown = [c for c in info.capabilities if c not in KNOWN_CAPABILITIES]
    if unknown:
        problems.append(f"unknown capabilities {unknown} (known: {', '.join(KNOWN_CAPABILITIES)})")
    if not info.eval_sets or len(set(info.eval_sets)) != len(info.eval_sets) or not all(info.eval_sets):
        problems.append(f"eval_sets {list(info.eval_sets)} (a run evaluates on the first: one or more names needed)")
    if problems:
        raise CheckFailed("; ".join(problems))
    return (f"name {info.name!r}, actions {', '.join(info.actions)}, capabilities "
            f"{', '.join(info.capabilities) or 'none'}, eval sets {', '.join(info.eval_sets)}")


async def eval_sets(ctx: Context) -> str:
    """Every named eval set (and "" = the first) answers, non-empty, with distinct specs, a content
    hash, and the same bytes when asked twice."""
    info = await ctx.info()
    shown = []
    for name in ["", *info.eval_sets]:
        first, second = await ctx.probe.eval_set(name), await ctx.probe.eval_set(name)
        label = name or "'' (default)"
        expected = name or (info.eval_sets[0] if info.eval_sets else "")
        if first.name != expected:
            raise CheckFailed(f"GetEvalSet({label}) answered the set named {first.name!r}, expected {expected!r}")
        if not first.specs:
            raise CheckFailed(f"eval set {label} has no tasks")
        if not first.content_hash:
            raise CheckFailed(f"eval set {label} has no content_hash")
        digests = [hashlib.sha256(r.SerializeToString(deterministic=True)).hexdigest()[:12] for r in (first, second)]
        if digests[0] != digests[1]:
            raise CheckFailed(f"eval set {label} differs between two calls (answer sha256 {digests[0]} vs {digests[1]})")
        keys = [spec_key(s) for s in first.specs]
        if len(set(keys)) != len(keys):
            raise CheckFailed(f"eval set {label} repeats a task ({len(keys) - len(set(keys))} repeated)")
        if name:
            shown.append(f"{name} {first.version or '(no version)'}: {len(first.specs)} tasks")
    return "; ".join(shown) + ", each the same twice"


async def training_tasks(ctx: Context) -> str:
    """GetTrainingTasks: the same request gives the same tasks, another seed others, `count` distinct
    tasks, each with the requested move budget."""
    probe = ctx.probe
    first, again = await probe.training_tasks(CHECK_SEED, 8), await probe.training_tasks(CHECK_SEED, 8)
    other = await probe.training_tasks(CHECK_SEED + "-other", 8)
    if [spec_key(s) for s in first] != [spec_key(s) for s in again]:
        raise CheckFailed("the same request (seed, count 8) gave other tasks the second time")
    if [spec_key(s) for s in first] == [spec_key(s) for s in other]:
        raise CheckFailed("two different seeds gave the same 8 tasks")
    for count in (0, 1, 8, 64):
        specs = first if count == 8 else await probe.training_tasks(CHECK_SEED, count)
        if len(specs) != count:
            raise CheckFailed(f"count {count} answered {len(specs)} tasks")
        if len({spec_key(s) for s in specs}) != count:
            raise CheckFailed(f"count {count}: the answer repeats a task")
    budgeted = await probe.training_tasks(CHECK_SEED, 4, max_moves=5)
    if any(s.max_moves != 5 for s in budgeted):
        raise CheckFailed(f"max_moves 5 asked, tasks have {sorted({s.max_moves for s in budgeted})}")
    return "same request same tasks, other seed other tasks, count 0/1/8/64 honoured, max_moves passed on"


async def training_not_eval(ctx: Context) -> str:
    """No training task is a task of an eval set: training tasks drawn with each eval set's options
    never share an eval task's seed and options."""
    info = await ctx.info()
    eval_keys: dict[tuple[object, ...], str] = {}
    option_sets: list[dict[str, str]] = [{}]
    for name in info.eval_sets:
        for spec in (await ctx.probe.eval_set(name)).specs:
            eval_keys[spec_key(spec, with_budget=False)] = name
            if dict(spec.options) not in option_sets:
                option_sets.append(dict(spec.options))
    option_sets = option_sets[:5]
    drawn = 0
    for options in option_sets:
        for draw in range(DISJOINT_DRAWS):
            specs = await ctx.probe.training_tasks(f"{CHECK_SEED}-disjoint-{draw}", DISJOINT_COUNT, 0, options)
            drawn += len(specs)
            for spec in specs:
                shared = eval_keys.get(spec_key(spec, with_budget=False))
                if shared is not None:
                    raise CheckFailed(f"training task {shown_spec(spec)} is a task of eval set {shared!r}")
    return (f"{drawn} training tasks ({len(option_sets)} option sets) vs {len(eval_keys)} eval tasks: "
            "none shared")
