#!/usr/bin/env bash
# On the offline GPU machine: reassemble the chunks made by fetch_wheels.sh and install them.
#
#   src/gpu/install_wheels.sh CHUNK_DIR SITE_DIR
#
# SITE_DIR/trainer holds verl + vLLM + Ray (use PYTHONPATH=SITE_DIR/trainer for the trainer);
# SITE_DIR/agent holds the agent's closure (the local runner's agent command uses it).
set -euo pipefail
chunks="${1:?usage: install_wheels.sh CHUNK_DIR SITE_DIR}"
site="${2:?usage: install_wheels.sh CHUNK_DIR SITE_DIR}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$chunks" && sha256sum -c --quiet SHA256SUMS)
cat "$chunks"/wheels.tar.* | tar -xf - -C "$work"
mkdir -p "$site/trainer" "$site/agent"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site/trainer" "$work"/trainer/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site/agent" "$work"/agent/*.whl
echo "installed $(ls "$work/trainer" | wc -l) trainer wheels into $site/trainer"
echo "installed $(ls "$work/agent" | wc -l) agent wheels into $site/agent"
