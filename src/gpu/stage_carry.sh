#!/usr/bin/env bash
# Stage what an offline GPU machine needs into folders of one carry each (a piece of PIECE_MB
# MiB, default 54, so that a piece and the repository's ~6 MiB fit a 64 MiB transfer):
#
#   src/gpu/stage_carry.sh PEX MODEL_CHUNKS_DIR DATA_DIR OUT_DIR [PIECE_MB]
#
# OUT_DIR/00/  checksums, the PEX's sha256 and DATA_DIR's train.parquet and test.parquet (validation),
#              and, when there, traces.parquet (`calcx data traces ... --exclude test.parquet`, the
#              warm-up's set), test-hard.parquet and train-hard.parquet (`calcx data harden`: the
#              hard-arithmetic split of each)
# OUT_DIR/NN/  one piece each: calcx-gpu.pex.NN, then model.gguf.NN (from src/gpu/fetch_model.sh)
#
# There, `src/gpu/h200_run.sh receive OUT_DIR/NN` for each folder in order, then `setup`.
set -euo pipefail
pex="${1:?usage: stage_carry.sh PEX MODEL_CHUNKS_DIR DATA_DIR OUT_DIR}"
model_chunks="${2:?MODEL_CHUNKS_DIR}"
data="${3:?DATA_DIR}"
out="${4:?OUT_DIR}"
piece_mb="${5:-54}"
rm -rf "$out"
mkdir -p "$out/00/gsm8k" "$out/pieces"
split -b "${piece_mb}M" -d -a 2 "$pex" "$out/pieces/calcx-gpu.pex."
(cd "$out/pieces" && sha256sum calcx-gpu.pex.* > ../00/SHA256SUMS.pex)
sha256sum "$pex" | cut -d' ' -f1 > "$out/00/calcx-gpu.pex.sha256"
cp "$model_chunks"/model.gguf.* "$out/pieces/"
cp "$model_chunks/SHA256SUMS" "$out/00/SHA256SUMS.model"
cp "$data/train.parquet" "$data/test.parquet" "$out/00/gsm8k/"
for extra in traces.parquet test-hard.parquet train-hard.parquet; do
  if [[ -f "$data/$extra" ]]; then cp "$data/$extra" "$out/00/gsm8k/"; fi
done
n=1
for piece in "$out"/pieces/calcx-gpu.pex.* "$out"/pieces/model.gguf.*; do
  dir="$(printf '%s/%02d' "$out" "$n")"
  mkdir -p "$dir" && mv "$piece" "$dir/"
  n=$((n + 1))
done
rmdir "$out/pieces"
echo "staged $((n - 1)) pieces after $out/00 (PEX sha256 $(cat "$out/00/calcx-gpu.pex.sha256"))"
du -sh "$out"/00 "$out"
