#!/usr/bin/env bash
# Stage what an offline GPU machine needs into folders of one carry each: a piece of PIECE_MB MiB
# (default 48) beside the repository's own tree must fit one transfer of CARRY_LIMIT_MIB (default
# 64 MiB, the tree included), which is checked before anything is written:
#
#   src/gpu/stage_carry.sh PEX MODEL_CHUNKS_DIR DATA_DIR OUT_DIR [PIECE_MB]
#
# OUT_DIR/00/  checksums, the PEX's sha256 and DATA_DIR's train.parquet and test.parquet (validation),
#              and, when there, traces.parquet (`calcx data traces ... --exclude test.parquet`, the
#              warm-up's set), distilled-traces.parquet (an earlier machine's sample pass, the
#              self-distilled warm-up's set: docs/recipes.md), test-hard.parquet and train-hard.parquet (`calcx data harden`: the
#              hard-arithmetic split of each) and test-harder.parquet and train-harder.parquet (its
#              split of larger factors, source gsm8k-harder)
# OUT_DIR/NN/  one piece each: calcx-gpu.pex.NN, then model.gguf.NN (the GGUF of src/gpu/fetch_model.sh,
#              its chunks checked and cut again to PIECE_MB, whatever size they were fetched in)
#
# There, `src/gpu/h200_run.sh receive OUT_DIR/NN` for each folder in order, then `setup`.
set -euo pipefail
pex="${1:?usage: stage_carry.sh PEX MODEL_CHUNKS_DIR DATA_DIR OUT_DIR}"
model_chunks="${2:?MODEL_CHUNKS_DIR}"
data="${3:?DATA_DIR}"
out="${4:?OUT_DIR}"
piece_mb="${5:-48}"
limit_mib="${CARRY_LIMIT_MIB:-64}"
# what travels with every piece: the repository's tracked and untracked-not-ignored files
root="$(cd "$(dirname "$0")/../.." && pwd)"
git -C "$root" rev-parse --git-dir > /dev/null 2>&1 \
  || { echo "stage_carry.sh: run it from a checkout of the repository ($root is none): the tree's size is checked" >&2; exit 2; }
# (a tracked file deleted from the working tree does not travel: stat's complaint about it is no error)
tree_bytes="$(cd "$root" && { git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null || true; } \
  | awk '{s += $1} END {print s + 0}')"
tree_mib=$(( (tree_bytes + 1048575) / 1048576 ))
if (( piece_mb + tree_mib + 1 > limit_mib )); then
  echo "stage_carry.sh: a ${piece_mb} MiB piece beside the repository's ${tree_mib} MiB would pass a ${limit_mib} MiB" \
    "transfer; use PIECE_MB <= $(( limit_mib - tree_mib - 1 ))" >&2
  exit 2
fi
(cd "$model_chunks" && sha256sum -c --quiet SHA256SUMS)
rm -rf "$out"
mkdir -p "$out/00/gsm8k" "$out/pieces"
split -b "${piece_mb}M" -d -a 2 "$pex" "$out/pieces/calcx-gpu.pex."
(cd "$out/pieces" && sha256sum calcx-gpu.pex.* > ../00/SHA256SUMS.pex)
sha256sum "$pex" | cut -d' ' -f1 > "$out/00/calcx-gpu.pex.sha256"
cat "$model_chunks"/model.gguf.* | split -b "${piece_mb}M" -d -a 2 - "$out/pieces/model.gguf."
(cd "$out/pieces" && sha256sum model.gguf.* > ../00/SHA256SUMS.model)
cp "$data/train.parquet" "$data/test.parquet" "$out/00/gsm8k/"
# the warm-ups' traces and every other split beside the two (test-<tag>.parquet, train-<tag>.parquet:
# `calcx data harden --source gsm8k-<tag>`), which the machine validates or trains on by those names
for extra in "$data"/traces.parquet "$data"/distilled-traces.parquet "$data"/test-*.parquet "$data"/train-*.parquet; do
  if [[ -f "$extra" ]]; then cp "$extra" "$out/00/gsm8k/"; fi
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
