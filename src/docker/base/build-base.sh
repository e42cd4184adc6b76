#!/usr/bin/env bash
# Build the agent image's base (Debian bookworm minbase + python3) without any container
# registry: debootstrap a root filesystem from a Debian mirror, check its package set against
# packages.lock (beside this script), normalise it and load it as a one-layer image.
#
# Reproducible: the same package set and SOURCE_DATE_EPOCH give a byte-identical root filesystem
# tarball (sorted entries, numeric owners, clamped mtimes, no atime/ctime, no logs/caches/
# machine-id, .pyc files written with PYTHONHASHSEED=0) and the same image ID (the config is
# written by `python -m calcx.image base`, dated SOURCE_DATE_EPOCH, not by `docker import`).
# What still moves is Debian's archive: when the mirror resolves any other name=version than
# packages.lock records, the build stops and shows the difference; --update-lock records the new
# set (review it, commit it: the base image and every image on it change).
#
# Usage: build-base.sh [--force] [--update-lock] [--tag TAG] [--mirror URL] [--keep-rootfs DIR]
# Env:   SOURCE_DATE_EPOCH (default 1704067200 = 2024-01-01T00:00:00Z), DEBIAN_MIRROR,
#        CALCX_BASE_TAG, DEBOOTSTRAP_EXTRA (extra comma-separated packages; needs --update-lock).
set -euo pipefail

TAG="${CALCX_BASE_TAG:-calcx/base:bookworm-py311}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE="bookworm"
PACKAGES="python3,python3-venv,ca-certificates${DEBOOTSTRAP_EXTRA:+,$DEBOOTSTRAP_EXTRA}"
FORCE=0
UPDATE_LOCK=0
KEEP_ROOTFS=""
HERE="$(cd "$(dirname "$0")" && pwd)"
LOCK="$HERE/packages.lock"
PYTHONPATH_CALCX="$HERE/../../python"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1704067200}"
# Maintainer scripts byte-compile Python modules inside the chroot; a fixed hash seed marshals
# their sets in a fixed order.
export PYTHONHASHSEED=0

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --update-lock) UPDATE_LOCK=1 ;;
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
# The package set, name=version for every installed package, against the recorded one.
RESOLVED="$WORK/packages.resolved"
# shellcheck disable=SC2016  # dpkg-query's own format fields, not shell expansions
chroot "$ROOTFS" dpkg-query -W -f '${db:Status-Abbrev} ${Package}=${Version}\n' \
  | awk '$1 == "ii" { print $2 }' | LC_ALL=C sort > "$RESOLVED"
if [ "$UPDATE_LOCK" -eq 1 ]; then
  { echo "# The base image's Debian package set (name=version), checked by build-base.sh: a build"
    echo "# that resolves any other set stops. Refresh with build-base.sh --force --update-lock."
    echo "# suite=$SUITE packages=$PACKAGES"
    cat "$RESOLVED"; } > "$LOCK"
  log "recorded $(wc -l < "$RESOLVED") packages in $LOCK"
elif [ ! -f "$LOCK" ]; then
  die "$LOCK is missing; rerun with --update-lock to record the package set"
elif ! diff -u --label recorded --label "resolved now" <(grep -v '^#' "$LOCK") "$RESOLVED" > "$WORK/packages.diff"; then
  cat "$WORK/packages.diff" >&2
  die "the mirror resolves another package set than $LOCK records (above). Debian published new versions; review, then rerun with --force --update-lock and commit the file"
fi
log "package set: $(wc -l < "$RESOLVED") packages as $LOCK records"

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

LOCK_SHA="$(grep -v '^#' "$LOCK" | sha256sum | cut -d' ' -f1)"
log "loading $TAG (python -m calcx.image base)"
IMAGE_ID="$(PYTHONPATH="$PYTHONPATH_CALCX" python3 -m calcx.image base --rootfs-tar "$TARBALL" --tag "$TAG" \
  --epoch "$SOURCE_DATE_EPOCH" \
  --label org.opencontainers.image.title=calcx-base \
  --label "org.opencontainers.image.base.name=debian:$SUITE-minbase" \
  --label "calcx.rootfs.sha256=$TAR_SHA" \
  --label "calcx.packages.sha256=$LOCK_SHA" \
  --label "calcx.source-date-epoch=$SOURCE_DATE_EPOCH" \
  --history "calcx base: debootstrap minbase $SUITE + $PACKAGES")" || die "loading the image failed"
log "image id $IMAGE_ID"

docker run --rm --network none "$TAG" python3 -c 'import ssl, venv, sys; print("build-base: python", sys.version.split()[0], "ok")' >&2 \
  || die "smoke test of $TAG failed"
SIZE=$(docker image inspect --format '{{.Size}}' "$TAG")
log "built $TAG: size $SIZE bytes ($(( SIZE / 1000000 )) MB) in $(( $(date +%s) - START )) s"
