#!/usr/bin/env bash
# Build the agent and controller images from their PEXes with calcx.image (no `docker build`):
# the same commit and base image give the same image IDs on any machine. Prints one line per
# image: `<name> <image id>`.
#
# Usage: src/docker/build-images.sh [--check] [agent] [controller]   (default: both)
#   --check  build each image a second time, untagged, and fail unless both IDs are equal
# Env:   BASE_IMAGE (default calcx/base:bookworm-py311, made by src/docker/base/build-base.sh),
#        SOURCE_DATE_EPOCH (default: the commit time of HEAD).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

CHECK=0
names=()
for arg in "$@"; do
  case "$arg" in
    --check) CHECK=1 ;;
    agent|controller) names+=("$arg") ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-images: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
(( ${#names[@]} )) || names=(agent controller)

declare -A target=([agent]=src/python/calcx/agent:agent [controller]=src/python/calcx:calcx)
declare -A pex=([agent]=dist/src.python.calcx.agent/agent.pex [controller]=dist/src.python.calcx/calcx.pex)
targets=()
for name in "${names[@]}"; do targets+=("${target[$name]}"); done
./pants package "${targets[@]}" >&2

image() { PYTHONPATH=src/python python3 -m calcx.image "$@"; }
status=0
for name in "${names[@]}"; do
  id="$(image "$name" --pex "${pex[$name]}")"
  echo "$name $id"
  if (( CHECK )); then
    again="$(image "$name" --pex "${pex[$name]}" --no-tag)"
    if [[ "$again" == "$id" ]]; then
      echo "build-images: $name rebuilt to the same image id" >&2
    else
      echo "build-images: $name is NOT reproducible: $id, then $again" >&2
      status=1
    fi
  fi
done
exit "$status"
