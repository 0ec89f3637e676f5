#!/usr/bin/env bash
# `make compose-check`: the cpu profile of docker-compose.yml from nothing, as a user runs it, on this
# machine. Installs the engine when missing and starts it, makes the base image, builds every image,
# brings the stack up healthy, trains a short run through the published API, checks its adapters and
# checkpoints in the shared volume, restarts the stack (the run and the volume must survive), brings
# it up again with MMRL_TRACING=otlp and the observability profile (every service must stay healthy
# and one GRPO step's trace must reach the collector with spans of all four services), then removes
# the stack and its volumes. Where no registry serves the observability profile's images (Prometheus,
# Grafana, Jaeger), deploy/docker/compose-trace-sink.yml stands in for Jaeger, and the JSON says so. Idempotent; images are kept, so a second run skips the builds.
# Progress goes to stderr; the last line of stdout is one JSON object (phase times, image sizes, the
# run's final state, the trace), also on failure. Exit status non-zero on any failure.
# The stack runs as compose project `mmrl-check`, so a stack of the default project is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

export COMPOSE_PROJECT_NAME=mmrl-check COMPOSE_PROFILES=cpu
UP_TIMEOUT_S="${UP_TIMEOUT_S:-900}"
RUN_SETTINGS=(--set model=/shared/models/tiny --set steps=2 --set checkpoint_interval=1
  --set grpo.tasks_per_step=4 --set eval.max_tasks=4 --set eval.sampled_samples=0)
TRACE_SETTINGS=(--set model=/shared/models/tiny --set steps=1 --set checkpoint_interval=1
  --set grpo.tasks_per_step=4 --set eval.max_tasks=4 --set eval.sampled_samples=0)
# Each of these must be in the traced step's trace (their OpenTelemetry service.name).
TRACED_SERVICES="mmrl-coordinator mmrl-env mmrl-rollout mmrl-learner"
IMAGES=(debian:bookworm-slim mmrl-redis:0.1.0 mmrl-env:0.1.0 mmrl-coordinator:0.1.0
  mmrl-rollout:0.1.0-cpu mmrl-learner:0.1.0-cpu)

phase="start" phases="" run_json="null" trace_json="null" started_dockerd=""
t0=$SECONDS t_phase=$SECONDS
log() { echo "[compose-check $(date +%H:%M:%S)] $*" >&2; }
begin() { phase="$1" t_phase=$SECONDS; log "$phase: $2"; }
done_phase() { phases="$phases${phases:+, }\"$phase\": $((SECONDS - t_phase))"; }
image_sizes() {
  local out="" image size
  for image in "${IMAGES[@]}"; do
    size=$(docker image inspect --format '{{.Size}}' "$image" 2>/dev/null) || continue
    out="$out${out:+, }\"$image\": $((size / 1000000))"
  done
  echo "{$out}"
}
report() {
  local ok="$1"
  printf '{"ok": %s, "failed_phase": %s, "phases_s": {%s}, "total_s": %d, "images_mb": %s, "run": %s, "trace": %s}\n' \
    "$ok" "$([ "$ok" = true ] && echo null || echo "\"$phase\"")" "$phases" $((SECONDS - t0)) \
    "$(image_sizes 2>/dev/null || echo null)" "$run_json" "$trace_json"
}
on_exit() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    log "FAILED in phase $phase (exit $rc)"
    if docker info >/dev/null 2>&1; then
      docker compose ps -a >&2 || true
      docker compose logs --no-color --tail 40 >&2 || true
      docker compose down -v --remove-orphans >/dev/null 2>&1 || true
    fi
    report false
  fi
  [ -z "$started_dockerd" ] || kill "$started_dockerd" 2>/dev/null || true
  exit $rc
}
trap on_exit EXIT

compose_up() {
  docker compose up -d --wait --wait-timeout "$UP_TIMEOUT_S" >&2
  local init
  init=$(docker compose ps -a --format '{{.Service}} {{.State}} {{.ExitCode}}' init-model)
  [ "$init" = "init-model exited 0" ] || { log "init-model: $init"; return 1; }
}
mmrl_cli() {  # the mmrl CLI from the coordinator image, on the host's network: as `mmrl` run here
  docker run --rm --network host --env-file .env -v "$PWD/configs:/configs:ro" mmrl-coordinator:0.1.0 "$@"
}
in_volume() { docker compose exec -T learner sh -c "$1"; }
expect() { [ "$1" = "$2" ] || { log "expected $3 $2, found $1"; exit 1; }; }
run_field() { python3 -c "import json, sys; print(json.load(sys.stdin)['$1'])"; }

begin engine "Docker engine, Compose v2, buildx, debootstrap"
bash scripts/install-docker.sh --engine >&2
if ! docker info >/dev/null 2>&1; then
  log "starting dockerd (log: /var/log/mmrl-dockerd.log)"
  dockerd >/var/log/mmrl-dockerd.log 2>&1 &
  started_dockerd=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null
fi
done_phase

begin base "debian:bookworm-slim"
bash deploy/docker/base-image.sh >&2
done_phase

begin build "docker compose build (cpu profile)"
if [ ! -f .env ]; then
  log ".env: made from .env.example with a new API token"
  sed "s/^MMRL_API_TOKEN=.*/MMRL_API_TOKEN=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')/" .env.example >.env
fi
if [ -z "${MMRL_PACKAGE_CA:-}" ] && ! grep -q '^MMRL_PACKAGE_CA=' .env; then
  ca="${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}"
  if [ -n "$ca" ] && [ -s "$ca" ]; then
    export MMRL_PACKAGE_CA="$ca"
    log "pip here trusts $ca: builds get it as the package-ca secret"
  fi
fi
docker compose build >&2
done_phase

begin up "docker compose up -d --wait (from empty volumes)"
docker compose down -v --remove-orphans >&2
compose_up
in_volume 'test -f /shared/models/tiny/config.json'
done_phase

begin run "a 2-step run through http://localhost:8000"
watch_log="$(mktemp)"
mmrl_cli run --api http://localhost:8000 start --config /configs/maze-tiny-cpu.yaml \
  "${RUN_SETTINGS[@]}" --watch | tee "$watch_log" >&2
run_id=$(head -1 "$watch_log") && rm -f "$watch_log"
status=$(mmrl_cli run --api http://localhost:8000 status "$run_id")
state=$(run_field state <<<"$status") step=$(run_field step <<<"$status")
count() { in_volume "ls -d /shared/runs/$run_id/$1/*/manifest.json 2>/dev/null | wc -l"; }
adapters=$(count adapters) checkpoints=$(count checkpoints)
run_json="{\"id\": \"$run_id\", \"state\": \"$state\", \"step\": $step, \"adapters\": $adapters, \"checkpoints\": $checkpoints}"
log "run $run_json"
expect "$state" succeeded "run state"
[ "$adapters" -ge 1 ] && [ "$checkpoints" -ge 1 ] || { log "no adapter or no checkpoint in the volume"; exit 1; }
done_phase

begin restart "docker compose down, up: the run (Redis) and the shared volume are kept"
docker compose down >&2
compose_up
kept=$(mmrl_cli run --api http://localhost:8000 status "$run_id" | run_field state)
log "after the restart: run $run_id $kept, $(count adapters) adapters, $(count checkpoints) checkpoints"
expect "$kept" "$state" "run state after the restart"
expect "$(count adapters)" "$adapters" "adapters after the restart"
expect "$(count checkpoints)" "$checkpoints" "checkpoints after the restart"
done_phase

begin tracing "MMRL_TRACING=otlp with the observability profile: healthy services, a step's trace collected"
docker compose down >&2
export MMRL_TRACING=otlp
if docker compose --profile observability pull --quiet prometheus grafana jaeger >&2; then
  export COMPOSE_PROFILES=cpu,observability
  collector="jaeger"
else
  log "the observability profile's images cannot be pulled here: deploy/docker/otlp-sink.py answers as jaeger:4317"
  export COMPOSE_FILE="docker-compose.yml:deploy/docker/compose-trace-sink.yml"
  collector="otlp-sink (observability images not pullable)"
fi
compose_up
watch_log="$(mktemp)"
mmrl_cli run --api http://localhost:8000 start --config /configs/maze-tiny-cpu.yaml \
  "${TRACE_SETTINGS[@]}" --watch | tee "$watch_log" >&2
traced_run=$(head -1 "$watch_log") && rm -f "$watch_log"
expect "$(mmrl_cli run --api http://localhost:8000 status "$traced_run" | run_field state)" succeeded "traced run state"
for service in redis env rollout learner coordinator; do
  id=$(docker compose ps -q "$service")
  health=$(docker inspect --format '{{.State.Health.Status}} {{.RestartCount}}' "$id")
  expect "$health" "healthy 0" "$service health and restarts"
done
traces() {  # every trace the collector holds, as {trace_id: {"services": [...], ...}}
  if [ "$collector" = jaeger ]; then
    python3 -c "import json, urllib.request
reply = json.load(urllib.request.urlopen('http://127.0.0.1:16686/api/traces?service=mmrl-coordinator&limit=50', timeout=10))
print(json.dumps({t['traceID']: {'services': sorted({p['serviceName'] for p in t['processes'].values()}),
                                 'spans': [s['operationName'] for s in t['spans']]} for t in reply['data']}))"
  else
    docker compose exec -T trace-sink cat /tmp/traces.json 2>/dev/null || echo '{}'
  fi
}
step_trace() {  # the first trace rooted at a grpo.step with every traced service in it, as JSON
  python3 -c "import json, sys
wanted = set(sys.argv[1].split())
hits = [(tid, t) for tid, t in json.load(sys.stdin).items()
        if wanted <= set(t['services']) and any(s.endswith('grpo.step') for s in t['spans'])]
if hits:
    tid, t = hits[0]
    print(json.dumps({'collector': sys.argv[2], 'trace_id': tid, 'services': t['services'], 'spans': len(t['spans'])}))" \
    "$TRACED_SERVICES" "$collector"
}
for _ in $(seq 24); do  # exporters send their batches every 5 s
  trace_json=$(traces | step_trace)
  [ -z "$trace_json" ] || break
  sleep 5
done
[ -n "$trace_json" ] || { trace_json="null"; log "no trace of a step with spans of $TRACED_SERVICES reached $collector"; exit 1; }
log "trace $trace_json"
done_phase

begin down "docker compose down -v"
docker compose down -v --remove-orphans >&2
done_phase
report true
