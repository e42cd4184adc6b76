#!/usr/bin/env bash
# Build the agent and controller images with Pants (`./pants package src/docker:agent
# src/docker:controller`: docker-archives under dist/src.docker/, see src/docker/BUILD) and load
# them into the local Docker daemon, tagged calcx/<name>:<version> and :latest as the archives
# name them. Prints one line per archive: `<archive> <image id>`.
#
# Usage: src/docker/build-images.sh [--check] [agent] [controller]   (default: both)
#   --check  build the archives again (`./pants --no-pantsd --no-local-cache package`) and fail
#            unless each is the same bytes
# Needs: a Docker daemon holding the base image made by src/docker/base/build-base.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

CHECK=0
targets=()
for arg in "$@"; do
  case "$arg" in
    --check) CHECK=1 ;;
    agent|controller) targets+=("src/docker:$arg") ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-images: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
(( ${#targets[@]} )) || targets=(src/docker:agent src/docker:controller)

# the archives `package` wrote, from its own "Wrote dist/..." lines (src/docker/BUILD names them)
package() {
  local log
  log="$(mktemp)"
  if ! ./pants "$@" package "${targets[@]}" 2> >(tee "$log" >&2); then rm -f "$log"; return 1; fi
  sed -n 's/.*Wrote \(dist\/.*\.tar\)$/\1/p' "$log"
  rm -f "$log"
}

mapfile -t archives < <(package)
(( ${#archives[@]} == ${#targets[@]} )) || { echo "build-images: expected ${#targets[@]} archives, Pants wrote ${#archives[@]}" >&2; exit 1; }
for archive in "${archives[@]}"; do
  echo "$archive $(PYTHONPATH=src/python python3 -m calcx.image load "$archive")"
done
(( CHECK )) || exit 0

declare -A first
for archive in "${archives[@]}"; do first[$archive]="$(sha256sum "$archive" | cut -d' ' -f1)"; done
mapfile -t again < <(package --no-pantsd --no-local-cache)
status=0
for archive in "${again[@]}"; do
  now="$(sha256sum "$archive" | cut -d' ' -f1)"
  if [[ "$now" == "${first[$archive]:-}" ]]; then
    echo "build-images: $archive rebuilt to the same bytes (sha256 $now)" >&2
  else
    echo "build-images: $archive is NOT reproducible: sha256 ${first[$archive]:-none}, then $now" >&2
    status=1
  fi
done
exit "$status"
