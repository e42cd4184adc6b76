#!/usr/bin/env bash
# The GPU run on an offline single-GPU machine (an H200 was used), in stages, so each fits a
# bounded command:
#
#   src/gpu/h200_run.sh receive CHUNK_DIR     # append carried wheel chunks to $WORK/chunks
#   src/gpu/h200_run.sh setup                 # install wheels, convert SmolLM2, generate data
#   src/gpu/h200_run.sh anchor STEPS          # verl's own single-turn GRPO (the anchor)
#   src/gpu/h200_run.sh calcx STEPS           # calcx train: agents, gateway, local runner
#   src/gpu/h200_run.sh stop-ray              # end what Ray left running
#   src/gpu/h200_run.sh pack OUT_DIR          # results.tar.gz of logs, metrics, report
#
# Logs and metrics go to $RESULTS (default $WORK/results). Shared sizes for both runs: batch 16
# prompts x n=4, prompt <= 1024 tokens, response <= 256 tokens per model call.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
WORK="${WORK:-$HOME/calcx-gpu}"
RESULTS="${RESULTS:-$WORK/results}"
SITE="$WORK/site"
MODEL="$WORK/models/smollm2-135m"
DATA="$WORK/data"
BATCH="${BATCH:-16}"
N="${N:-4}"
PROMPT_LEN="${PROMPT_LEN:-1024}"
RESPONSE_LEN="${RESPONSE_LEN:-256}"
mkdir -p "$WORK/chunks" "$RESULTS"

export VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONUNBUFFERED=1
trainer_env() { export PYTHONPATH="$root/src/python:$SITE/trainer"; }

stage="${1:?stage: receive|setup|anchor|calcx}"; shift
case "$stage" in
  receive)
    cp -v "${1:?CHUNK_DIR}"/* "$WORK/chunks/"
    du -sh "$WORK/chunks"
    ;;
  setup)
    t0=$(date +%s)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RESULTS/gpu.txt"
    python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$RESULTS/gpu.txt"
    bash "$here/install_wheels.sh" "$WORK/chunks" "$SITE"
    trainer_env
    python3 -c 'import verl, vllm, ray; print("verl", verl.__version__, "vllm", vllm.__version__, "ray", ray.__version__)' | tee -a "$RESULTS/gpu.txt"
    PYTHONPATH="$root/src/python:$SITE/agent" python3 -c 'import autogen_agentchat, mcp; print("agent site ok: mcp", mcp.__version__ if hasattr(mcp, "__version__") else "?")' | tee -a "$RESULTS/gpu.txt"
    gguf="$(find "$SITE/trainer" -name '*.gguf' | head -1)"
    python3 "$here/convert_smollm2.py" --gguf "$gguf" --out "$MODEL" 2>&1 | tail -3
    python3 -m calcx.data generate --out "$DATA"
    python3 "$here/anchor.py" data --src "$DATA/train.parquet" --out "$DATA/anchor_train.parquet"
    python3 "$here/anchor.py" data --src "$DATA/test_mini.parquet" --out "$DATA/anchor_val.parquet"
    echo "setup took $(( $(date +%s) - t0 )) s" | tee -a "$RESULTS/gpu.txt"
    ;;
  anchor)
    steps="${1:-10}"
    trainer_env
    export VERL_FILE_LOGGER_PATH="$RESULTS/anchor_metrics.jsonl"
    rm -f "$VERL_FILE_LOGGER_PATH"
    python3 -m verl.trainer.main_ppo \
      algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False \
      data.train_files="$DATA/anchor_train.parquet" data.val_files="$DATA/anchor_val.parquet" \
      data.train_batch_size="$BATCH" data.max_prompt_length="$PROMPT_LEN" data.max_response_length="$RESPONSE_LEN" \
      actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.model.use_remove_padding=False \
      +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
      actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH" \
      actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 actor_rollout_ref.actor.use_kl_loss=False \
      actor_rollout_ref.actor.entropy_coeff=0 \
      actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n="$N" \
      actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
      actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
      actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
      actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
      reward.custom_reward_function.path="$here/anchor.py" reward.custom_reward_function.name=compute_score \
      trainer.logger='[console,file]' trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1 \
      trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps="$steps" \
      trainer.project_name=calcx trainer.experiment_name=anchor 2>&1 | tee "$RESULTS/anchor.log"
    ;;
  calcx)
    steps="${1:-10}"
    trainer_env
    # The agent runs under the same python3 with its own site (mcp<2; vLLM brings mcp 2.x).
    python3 -m calcx.trainer.cli --model "$MODEL" --chat-template hermes \
      --train-file "$DATA/train.parquet" --val-file "$DATA/test_mini.parquet" --run-name gpu-run \
      "calcx.report_dir=$RESULTS/calcx-run" \
      "calcx.agent_python=python3" "calcx.agent_pythonpath=[$root/src/python,$SITE/agent]" \
      data.train_batch_size="$BATCH" data.max_prompt_length="$PROMPT_LEN" data.max_response_length="$RESPONSE_LEN" \
      actor_rollout_ref.rollout.n="$N" actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH" \
      actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
      actor_rollout_ref.rollout.max_model_len=2048 actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
      actor_rollout_ref.model.use_remove_padding=false \
      +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
      actor_rollout_ref.actor.fsdp_config.param_offload=false actor_rollout_ref.actor.fsdp_config.optimizer_offload=false \
      trainer.total_training_steps="$steps" trainer.total_epochs=1 trainer.save_freq=-1 \
      trainer.test_freq="${TEST_FREQ:-5}" \
      2>&1 | tee "$RESULTS/calcx.log"
    ;;
  stop-ray)
    trainer_env
    python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true
    ;;
  pack)
    out="${1:?OUT_DIR}"
    tar -czf "$out/results.tar.gz" -C "$WORK" results
    ls -la "$out"
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
