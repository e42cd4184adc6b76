#!/usr/bin/env bash
# Download everything an offline H200 machine (Python 3.12, torch 2.11 + CUDA preinstalled) needs
# to run calcx's trainer, and split it into chunks small enough to carry over one at a time.
#
#   src/gpu/fetch_wheels.sh OUT_DIR [CHUNK_MB]
#
# OUT_DIR/trainer/  the pinned verl + vLLM + Ray closure (trainer-wheels-cp312.txt, --no-deps)
# OUT_DIR/agent/    the agent's own closure for cp312 (3rdparty/python/agent-requirements.txt),
#                   installed apart from the trainer's: it needs mcp<2, vLLM brings mcp 2.x
# OUT_DIR/chunks/   wheels.tar split into CHUNK_MB pieces (default 58) + SHA256SUMS
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:?usage: fetch_wheels.sh OUT_DIR [CHUNK_MB]}"
chunk_mb="${2:-58}"
mkdir -p "$out/trainer" "$out/agent" "$out/chunks"

export PIP_CONFIG_FILE=/dev/null
[[ -f /etc/ssl/certs/ca-certificates.crt ]] && export PIP_CERT="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
py="${PYTHON:-python3}"
platforms=()
for n in 17 24 26 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
target=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none "${platforms[@]}")

echo "[1/4] antlr4-python3-runtime 4.9.3 is sdist-only: building its wheel here"
if ! ls "$out/trainer"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
  "$py" -m pip wheel -q --no-deps -w "$out/trainer" antlr4-python3-runtime==4.9.3
fi

echo "[2/4] trainer closure (--no-deps, exact pins)"
grep -vE '^\s*(#|$)|^antlr4-python3-runtime' "$here/trainer-wheels-cp312.txt" > "$out/trainer.req"
"$py" -m pip download -q --no-deps "${target[@]}" -d "$out/trainer" -r "$out/trainer.req"

echo "[3/4] agent closure for cp312 (with dependencies)"
"$py" -m pip download -q "${target[@]}" -d "$out/agent" -r "$root/3rdparty/python/agent-requirements.txt"

echo "[4/4] packing into ${chunk_mb} MB chunks"
rm -f "$out/chunks"/wheels.tar.*
(cd "$out" && tar -cf - trainer agent | split -b "${chunk_mb}M" -d -a 2 - chunks/wheels.tar.)
(cd "$out/chunks" && sha256sum wheels.tar.* > SHA256SUMS)
echo "trainer wheels: $(ls "$out/trainer" | wc -l)  agent wheels: $(ls "$out/agent" | wc -l)"
du -sh "$out/trainer" "$out/agent"
ls -la "$out/chunks"
