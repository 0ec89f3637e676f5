#!/usr/bin/env bash
# Installs the Debian packages MMRL needs on a developer machine or CI runner, when missing:
# redis-server (run state for the coordinator), `docker compose` v2 (offline parse of the compose
# file; scripts/install-docker.sh), where no kubectl is installed Debian's kubernetes-client (kubectl
# kustomize for the static checks of deploy/k8s), chromium (the browser the console's test drives
# through playwright) and prometheus (its promtool checks deploy/prometheus/prometheus.yml).
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing ${missing[*]} (Debian packages)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
bash "$(dirname "$0")/install-docker.sh" --cli
