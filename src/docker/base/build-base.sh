#!/usr/bin/env bash
# Build the agent image's base (Debian bookworm minbase + python3) without any container
# registry: debootstrap a root filesystem from a Debian mirror, normalise it, and
# `docker import` it as a single-layer image.
#
# Reproducible as far as a moving suite allows: the same mirror state and SOURCE_DATE_EPOCH
# give a byte-identical root filesystem tarball (sorted entries, numeric owners, clamped
# mtimes, no atime/ctime, no logs/caches/machine-id); its sha256 is printed. The image id
# still differs between builds because `docker import` stamps the creation time.
#
# Usage: build-base.sh [--force] [--tag TAG] [--mirror URL] [--keep-rootfs DIR]
# Env:   SOURCE_DATE_EPOCH (default 1704067200 = 2024-01-01T00:00:00Z), DEBIAN_MIRROR,
#        CALCX_BASE_TAG, DEBOOTSTRAP_EXTRA (extra comma-separated packages).
set -euo pipefail

TAG="${CALCX_BASE_TAG:-calcx/base:bookworm-py311}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="bookworm"
PACKAGES="python3,python3-venv,ca-certificates${DEBOOTSTRAP_EXTRA:+,$DEBOOTSTRAP_EXTRA}"
FORCE=0
KEEP_ROOTFS=""
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1704067200}"

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --tag) TAG="$2"; shift ;;
    --mirror) MIRROR="$2"; shift ;;
    --keep-rootfs) KEEP_ROOTFS="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build-base: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

log() { printf 'build-base: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v docker >/dev/null || die "docker CLI not found; install docker and start dockerd"
docker info >/dev/null 2>&1 || die "docker daemon not reachable (is dockerd running, are you allowed to use it?)"

if [ "$FORCE" -eq 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
  log "$TAG already exists; nothing to do (pass --force to rebuild)"
  docker image inspect --format 'build-base: size {{.Size}} bytes' "$TAG" >&2
  exit 0
fi

command -v debootstrap >/dev/null || die "debootstrap not found; apt-get install debootstrap"
[ "$(id -u)" -eq 0 ] || die "debootstrap needs root (run as root or under sudo)"

WORK="$(mktemp -d /tmp/calcx-base.XXXXXX)"
ROOTFS="$WORK/rootfs"
cleanup() {
  if [ -n "$KEEP_ROOTFS" ] && [ -d "$ROOTFS" ]; then
    rm -rf "$KEEP_ROOTFS"; mv "$ROOTFS" "$KEEP_ROOTFS"; log "root filesystem kept in $KEEP_ROOTFS"
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

START=$(date +%s)
log "debootstrap --variant=minbase $SUITE from $MIRROR (+ $PACKAGES)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" \
  > "$WORK/debootstrap.log" 2>&1 || { tail -n 30 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
log "debootstrap done in $(( $(date +%s) - START )) s"

log "normalising the root filesystem"
chroot "$ROOTFS" /usr/bin/python3 -c 'import sys, venv, ssl; assert sys.version_info[:2] == (3, 11), sys.version' \
  || die "python3 in the root filesystem is not a working 3.11"
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
  "$ROOTFS"/var/cache/apt/archives/partial/* "$ROOTFS"/var/cache/ldconfig/aux-cache \
  "$ROOTFS"/var/log/* "$ROOTFS"/tmp/* "$ROOTFS"/var/tmp/* "$ROOTFS"/debootstrap \
  "$ROOTFS"/var/lib/dpkg/*-old "$ROOTFS"/var/cache/debconf/*-old \
  "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/usr/share/locale/*
# Documentation goes, except each package's copyright file (its license terms travel with it).
find "$ROOTFS/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$ROOTFS/usr/share/doc" -mindepth 1 -type d -empty -delete
# Docker bind-mounts these at run time; keep them empty so builds do not leak host data.
: > "$ROOTFS/etc/machine-id"
: > "$ROOTFS/etc/hostname"
: > "$ROOTFS/etc/resolv.conf"
rm -f "$ROOTFS/var/lib/dbus/machine-id"
printf 'deb %s %s main\n' "$MIRROR" "$SUITE" > "$ROOTFS/etc/apt/sources.list"
# Byte-compiled files from postinst carry no timestamps beyond source mtimes, which we clamp.
find "$ROOTFS" -newermt "@$SOURCE_DATE_EPOCH" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +

TARBALL="$WORK/rootfs.tar"
tar --sort=name --numeric-owner --owner=0 --group=0 --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  --xattrs --xattrs-include='security.capability' \
  -C "$ROOTFS" -cf "$TARBALL" .
TAR_SHA="$(sha256sum "$TARBALL" | cut -d' ' -f1)"
log "root filesystem tarball sha256 $TAR_SHA ($(du -m "$TARBALL" | cut -f1) MB)"

log "docker import -> $TAG"
docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL org.opencontainers.image.title=calcx-base org.opencontainers.image.base.name=debian:$SUITE-minbase calcx.rootfs.sha256=$TAR_SHA calcx.source-date-epoch=$SOURCE_DATE_EPOCH" \
  --change 'CMD ["python3"]' \
  --message "calcx base: debootstrap minbase $SUITE + $PACKAGES" \
  "$TARBALL" "$TAG" >/dev/null

docker run --rm --network none "$TAG" python3 -c 'import ssl, venv, sys; print("build-base: python", sys.version.split()[0], "ok")' >&2 \
  || die "smoke test of $TAG failed"
SIZE=$(docker image inspect --format '{{.Size}}' "$TAG")
log "built $TAG: size $SIZE bytes ($(( SIZE / 1000000 )) MB) in $(( $(date +%s) - START )) s"
