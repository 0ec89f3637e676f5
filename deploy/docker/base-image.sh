#!/usr/bin/env bash
# Makes the base image of every MMRL image, debian:bookworm-slim, available to the local Docker engine:
# already there, pulled from a registry, or, where no registry answers, built here from Debian's
# package archive with debootstrap (minbase, trimmed like the official -slim image) and `docker import`.
# The Dockerfile is the same either way: FROM debian:bookworm-slim.
# Usage: deploy/docker/base-image.sh [IMAGE]   (IMAGE defaults to debian:bookworm-slim)
set -euo pipefail
image="${1:-debian:bookworm-slim}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "base image $image: present"
  exit 0
fi
if timeout 300 docker pull "$image" >/dev/null 2>&1; then
  echo "base image $image: pulled"
  exit 0
fi
echo "base image $image: no registry answered; building it from $mirror with debootstrap"
command -v debootstrap >/dev/null || { echo "debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "debootstrap needs root" >&2; exit 1; }

rootfs="$(mktemp -d /var/tmp/mmrl-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
  || { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"

# As the official -slim image: no documentation, man pages or translations, now or in later installs.
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
CFG
cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
CFG
rm -f "$rootfs/etc/apt/sources.list"
cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<CFG
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
CFG
find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda,locale}/* \
  "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
  "$rootfs"/var/log/* "$rootfs"/tmp/* "$rootfs"/root/.bash_history
: >"$rootfs/etc/machine-id"
tar --numeric-owner -C "$rootfs" -c . \
  | docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change 'CMD ["bash"]' --message "debootstrap --variant=minbase bookworm $mirror" - "$image" >/dev/null
echo "base image $image: built ($(docker image inspect --format '{{.Size}}' "$image") bytes, Debian $(cat "$rootfs/etc/debian_version"))"
