#!/usr/bin/env bash
# Training on an offline GPU machine whose Python already has a CUDA torch (an H200 was used),
# from the one PEX Pants builds (`./pants package src/python/calcx:calcx-gpu`), in stages that each
# fit a bounded command. docs/gpu-run.md walks through it.
#
#   src/gpu/h200_run.sh receive DIR            # keep carried pieces (PEX, model, data) in $WORK/in
#   src/gpu/h200_run.sh setup                  # join + verify the PEX and the GGUF, convert the model
#   src/gpu/h200_run.sh start NAME STEPS [KEY=VALUE...]  # `calcx train` in the background; the
#                                                # overrides win over RUN_ARGS; FLAGS="--async" adds flags
#   src/gpu/h200_run.sh status NAME [OUT]      # progress; copies metrics, logs and report to OUT
#   src/gpu/h200_run.sh wait NAME SECONDS [OUT]  # status after the run ends or SECONDS pass
#   src/gpu/h200_run.sh stop NAME              # end the run (its whole process group)
#
# Pieces are made on the machine with network by src/gpu/stage_carry.sh. The machine's torch is
# found through its `python3` and handed to the PEX with PEX_EXTRA_SYS_PATH (the PEX leaves torch,
# torchvision and torchaudio out and appends that directory after its own packages).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="${WORK:-$HOME/calcx-gpu}"
RESULTS="${RESULTS:-$WORK/results}"
IN="$WORK/in"
PEX="$WORK/calcx-gpu.pex"
GGUF="$WORK/model.gguf"
MODEL="$WORK/models/qwen2.5-coder-1.5b-instruct"
GGUF_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
PYTHON="${PYTHON:-python3}"
mkdir -p "$IN" "$RESULTS"

export VLLM_USE_FLASHINFER_SAMPLER=0  # flashinfer's sampler needs its cubin package, not carried
export PYTHONUNBUFFERED=1

torch_site() { "$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))'; }
calcx() { PEX_EXTRA_SYS_PATH="$(torch_site)" "$PYTHON" "$PEX" "$@"; }

# The settings both runs share (docs/gpu-run.md says why): the reference batch 32 x 4, lr 5e-6,
# prompt <= 2048 and response <= 1024 tokens a model call, FSDP without offload, sdpa attention.
RUN_ARGS=(
  data.train_batch_size=32 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=32
  actor_rollout_ref.actor.optim.lr=5e-6
  data.max_prompt_length=2048 data.max_response_length=1024 actor_rollout_ref.rollout.max_model_len=4096
  actor_rollout_ref.actor.fsdp_config.param_offload=false actor_rollout_ref.actor.fsdp_config.optimizer_offload=false
  actor_rollout_ref.model.use_remove_padding=false +actor_rollout_ref.model.override_config.attn_implementation=sdpa
  calcx.controller_concurrency=128
  trainer.val_before_train=true trainer.test_freq=10 trainer.save_freq=-1 trainer.total_epochs=1
)

stage="${1:?stage: receive|setup|start|status|wait|stop}"; shift
case "$stage" in
  receive)
    cp -r "${1:?DIR}"/. "$IN/"
    du -sh "$IN"
    ;;
  setup)
    t0=$(date +%s)
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
      "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'
      ldd --version | sed -n 1p; } | tee "$RESULTS/machine.txt"
    (cd "$IN" && for sums in SHA256SUMS.*; do sha256sum -c --quiet "$sums"; done)
    cat "$IN"/calcx-gpu.pex.[0-9]* > "$PEX"
    echo "$(cat "$IN/calcx-gpu.pex.sha256")  $PEX" | sha256sum -c --quiet
    echo "calcx-gpu.pex: $(stat -c %s "$PEX") bytes, sha256 $(cat "$IN/calcx-gpu.pex.sha256") (as Pants built it)" \
      | tee -a "$RESULTS/machine.txt"
    cat "$IN"/model.gguf.[0-9]* > "$GGUF"
    t1=$(date +%s)
    calcx --version | tee -a "$RESULTS/machine.txt"
    t2=$(date +%s)
    calcx model from-gguf --gguf "$GGUF" --sha256 "$GGUF_SHA256" --out "$MODEL" --force 2>&1 | tee "$RESULTS/convert.log"
    t3=$(date +%s)
    echo "setup: join+verify $((t1 - t0)) s, first PEX start (venv) $((t2 - t1)) s, model conversion $((t3 - t2)) s" \
      | tee -a "$RESULTS/machine.txt"
    ;;
  start)
    name="${1:?NAME}"; steps="${2:?STEPS}"; shift 2
    dir="$RESULTS/$name"
    mkdir -p "$dir"
    torch="$(torch_site)"
    echo "$(date +%s)" > "$dir/started"
    setsid nohup env PEX_EXTRA_SYS_PATH="$torch" "$PYTHON" "$PEX" train \
      --model "$MODEL" --train-file "$IN/gsm8k/train.parquet" --val-file "$IN/gsm8k/test.parquet" \
      --run-name "$name" ${FLAGS:-} "calcx.report_dir=$dir" trainer.total_training_steps="$steps" "${RUN_ARGS[@]}" "$@" \
      >"$dir/train.log" 2>&1 </dev/null &
    echo $! > "$dir/pid"
    echo "started $name (pid $(cat "$dir/pid")): $dir/train.log"
    ;;
  status|wait)
    name="${1:?NAME}"
    dir="$RESULTS/$name"
    if [[ "$stage" == wait ]]; then
      deadline=$(( $(date +%s) + ${2:?SECONDS} )); shift
      while kill -0 "$(cat "$dir/pid")" 2>/dev/null && (( $(date +%s) < deadline )); do sleep 10; done
    fi
    out="${2:-}"
    alive=no; kill -0 "$(cat "$dir/pid")" 2>/dev/null && alive=yes
    echo "run $name: running=$alive, $(( $(date +%s) - $(cat "$dir/started") )) s since start"
    [[ -f "$dir/metrics.jsonl" ]] && echo "steps logged: $(grep -c '"timing_s/step"' "$dir/metrics.jsonl" || true)"
    grep -E "step:[0-9]+ |Traceback|Error|calcx train:" "$dir/train.log" | tail -n 6 | cut -c1-400 || true
    if [[ -n "$out" ]]; then
      mkdir -p "$out"
      for f in metrics.jsonl eval.md report.md reward_curve.png incomplete_groups.jsonl; do
        [[ -f "$dir/$f" ]] && cp "$dir/$f" "$out/$name-$f"
      done
      gzip -c "$dir/train.log" > "$out/$name-train.log.gz"
      db="$dir/services/calcx.db"
      if [[ -f "$dir/metrics.jsonl" ]]; then
        "$PYTHON" "$here/step_table.py" "$dir/metrics.jsonl" $([[ -f "$db" ]] && echo --calls "$db") \
          > "$out/$name-steps.md" 2>&1 || true
      fi
      cp "$RESULTS/machine.txt" "$out/" 2>/dev/null || true
      ls -la "$out"
    fi
    ;;
  stop)
    name="${1:?NAME}"
    pid="$(cat "$RESULTS/$name/pid")"
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    echo "stopped $name"
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
