#!/usr/bin/env bash
# Build the agent image from an agent PEX outside Pants (Pants' docker_image does the same with
# its own build context). Makes a minimal context: the PEX + src/docker/agent.
#
# Usage: build-image.sh --pex PATH [--tag TAG] [--base IMAGE]
#   default tag calcx/agent:dev, default base calcx/base:bookworm-py311 (see ../base/build-base.sh)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PEX=""; TAG="calcx/agent:dev"; BASE="calcx/base:bookworm-py311"
while [ $# -gt 0 ]; do
  case "$1" in
    --pex) PEX="$2"; shift ;;
    --tag) TAG="$2"; shift ;;
    --base) BASE="$2"; shift ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -f "$PEX" ] || { echo "build-image: --pex must name the agent PEX file (got '${PEX}')" >&2; exit 2; }
docker image inspect "$BASE" >/dev/null 2>&1 || {
  echo "build-image: base image $BASE not found; run src/docker/base/build-base.sh (or pass --base python:3.11-slim-bookworm)" >&2; exit 1; }
CTX="$(mktemp -d /tmp/calcx-agent-ctx.XXXXXX)"
trap 'rm -rf "$CTX"' EXIT
mkdir -p "$CTX/src/docker/agent"
cp "$HERE/Dockerfile" "$HERE/selftest.py" "$CTX/src/docker/agent/"
cp "$PEX" "$CTX/agent.pex"
START=$(date +%s)
docker build -f "$CTX/src/docker/agent/Dockerfile" --build-arg "BASE_IMAGE=$BASE" \
  --build-arg AGENT_PEX=agent.pex -t "$TAG" "$CTX"
SIZE=$(docker image inspect --format '{{.Size}}' "$TAG")
echo "build-image: built $TAG from $BASE in $(( $(date +%s) - START )) s, size $SIZE bytes ($(( SIZE / 1000000 )) MB)" >&2
