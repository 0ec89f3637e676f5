#!/usr/bin/env bash
# Installs what `docker compose` needs on a Debian machine, each part only when missing:
#   --cli     the docker CLI with Compose v2 and buildx as CLI plugins (enough for `docker compose config`)
#   --engine  also the engine (Debian's docker.io: dockerd, containerd, runc) and debootstrap, which
#             deploy/docker/base-image.sh uses where no registry answers
# Compose v2 and buildx are Debian 13's docker-compose and docker-buildx packages (Go programs that
# need only glibc 2.34, so they install on Debian 12 too); apt fetches them from a private package
# list, so the machine's apt sources stay as they are. Not a Debian machine: install Docker's own way.
set -euo pipefail
mode="${1:---cli}"
case "$mode" in --cli | --engine) ;; *) echo "usage: $0 [--cli|--engine]" >&2; exit 2 ;; esac
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
missing=()
if [ "$mode" = --engine ]; then
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
fi
command -v docker >/dev/null 2>&1 || missing+=(docker.io)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (Debian packages)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

plugins=()
docker compose version >/dev/null 2>&1 || plugins+=(docker-compose)
docker buildx version >/dev/null 2>&1 || plugins+=(docker-buildx)
[ ${#plugins[@]} -eq 0 ] && exit 0
echo "installing ${plugins[*]} (Debian 13 packages: Compose v2 and buildx as docker CLI plugins)"
state="$(mktemp -d)"
trap 'rm -rf "$state"' EXIT
mkdir -p "$state/lists/partial"
echo "deb $mirror trixie main" >"$state/sources.list"
apt_private=(-o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$state/lists" -o APT::Sandbox::User=root)
$sudo apt-get "${apt_private[@]}" update -qq
(cd "$state" && $sudo apt-get "${apt_private[@]}" download -qq "${plugins[@]}")
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$state"/*.deb >/dev/null
docker compose version
