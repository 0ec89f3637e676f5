#!/usr/bin/env bash
# `make compose-check`: the cpu profile of docker-compose.yml from nothing, as a user runs it, on this
# machine. Installs the engine when missing and starts it, makes the base image, builds every image,
# brings the stack up healthy, trains a short run through the published API, checks its adapters and
# checkpoints in the shared volume, restarts the stack (the run and the volume must survive), then
# removes the stack and its volumes. Idempotent; images are kept, so a second run skips the builds.
# Progress goes to stderr; the last line of stdout is one JSON object (phase times, image sizes, the
# run's final state), also on failure. Exit status non-zero on any failure.
# The stack runs as compose project `mmrl-check`, so a stack of the default project is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

export COMPOSE_PROJECT_NAME=mmrl-check COMPOSE_PROFILES=cpu
UP_TIMEOUT_S="${UP_TIMEOUT_S:-900}"
RUN_SETTINGS=(--set model=/shared/models/tiny --set steps=2 --set checkpoint_interval=1
  --set grpo.mazes_per_step=4 --set eval.max_tasks=4 --set eval.sampled_samples=0)
IMAGES=(debian:bookworm-slim mmrl-redis:0.1.0 mmrl-env:0.1.0 mmrl-coordinator:0.1.0
  mmrl-rollout:0.1.0-cpu mmrl-learner:0.1.0-cpu)

phase="start" phases="" run_json="null" started_dockerd=""
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
  printf '{"ok": %s, "failed_phase": %s, "phases_s": {%s}, "total_s": %d, "images_mb": %s, "run": %s}\n' \
    "$ok" "$([ "$ok" = true ] && echo null || echo "\"$phase\"")" "$phases" $((SECONDS - t0)) \
    "$(image_sizes 2>/dev/null || echo null)" "$run_json"
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

begin down "docker compose down -v"
docker compose down -v --remove-orphans >&2
done_phase
report true
