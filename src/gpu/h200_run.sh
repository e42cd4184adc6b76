#!/usr/bin/env bash
# Training on an offline GPU machine whose Python already has a CUDA torch (an H200 was used),
# from the one PEX Pants builds (`./pants package src/python/calcx:calcx-gpu`), in stages that each
# fit a bounded command. docs/gpu-run.md walks through it.
#
#   src/gpu/h200_run.sh receive DIR            # keep carried pieces (PEX, model, data) in $WORK/in
#   src/gpu/h200_run.sh setup                  # join + verify the PEX and the GGUF, convert the model
#   src/gpu/h200_run.sh pex                    # the PEX's half of setup (join, verify, build its venv),
#                                                # to run while the model's pieces are still coming
#   src/gpu/h200_run.sh profile                # `calcx profile-step` (random weights: no model needed)
#                                                # into $RESULTS/profile, e.g. in the background after `pex`
#   src/gpu/h200_run.sh warmup [KEY=VALUE...]     # `calcx warmup` on the carried traces.parquet into
#                                                # $RESULTS/warmup; its model is what the tooluse mode trains
#                                                # (TRACES= and WARMUP_DIR= name other ones)
#   src/gpu/h200_run.sh sample [KEY=VALUE...]     # the self-distilled warm-up's sample pass into
#                                                # $RESULTS/sample: SAMPLE_PROBLEMS training problems under
#                                                # SAMPLE_PROFILE (`calcx train --eval-only`), then
#                                                # `calcx runs traces` of its store: sample/traces.parquet;
#                                                # a campaign's pass is a process group of its own, which
#                                                # `stop sample` ends (by hand: start it with setsid)
#   src/gpu/h200_run.sh campaign STEPS MODE[:STEPS[:MAX_S]]...  # setup, then one run per MODE
#                                                # (sync|async|anchor|tooluse|tooluse-X|distilled), one after another, each
#                                                # to its end or for at most MAX_S seconds; start it with setsid
#                                                # nohup. tooluse: the warm-up, then calcx sync from its model
#                                                # with TOOLUSE_PROFILE (docs/gpu-run.md, "Tool use"); tooluse-X:
#                                                # the same warm-up (made once; one an earlier campaign
#                                                # left in $RESULTS/warmup is used as it is), with the
#                                                # run profile gsm8k-h200-tooluse-X; distilled: the sample
#                                                # pass (or traces an earlier one made, carried as
#                                                # gsm8k/distilled-traces.parquet), a warm-up on its traces,
#                                                # then RL from that model with DISTILLED_PROFILE
#                                                # (docs/recipes.md); sample: the sample pass alone
#   src/gpu/h200_run.sh start NAME STEPS [KEY=VALUE...]  # `calcx train` in the background; the
#                                                # overrides win over RUN_PROFILE; FLAGS="--async" adds flags;
#                                                # NAME anchor runs `calcx anchor train` (verl's
#                                                # ToolAgentLoop, run name toolagentloop) instead
#   src/gpu/h200_run.sh killresume NAME STEPS [KEY=VALUE...]  # `start`, checkpoints every SAVE_FREQ steps;
#                                                # SIGKILL to the driver once KILL_AFTER steps are logged; then
#                                                # the same command again, to its end; kill.log and ledger.md
#                                                # say what happened (docs/resume.md); mode `resume` of a campaign
#   src/gpu/h200_run.sh launch STEPS MODE...   # the campaign in the background (setsid nohup)
#                                                # e.g. `launch 20 anchor:10:600 async`; CAMPAIGN_OVERRIDES=
#                                                # "K=V ..." hands each of its runs these overrides
#   src/gpu/h200_run.sh watch SECONDS [OUT]    # the campaign's runs after it ends or SECONDS pass
#   src/gpu/h200_run.sh status NAME [OUT]      # progress and step tables (calcx runs table); OUT gets NAME.tar.gz and
#                                                # NAME-store.tar.gz (see pack: pieces when large)
#   src/gpu/h200_run.sh wait NAME SECONDS [OUT]  # status after the run ends or SECONDS pass, a run not yet
#                                                # started waited for within the same SECONDS (exit 3 if it
#                                                # did not start)
#   src/gpu/h200_run.sh stop NAME|campaign     # end the run (its whole process group), or all
#
# Pieces are made on the machine with network by src/gpu/stage_carry.sh. The machine's torch is
# found through its `python3` and handed to the PEX with PEX_EXTRA_SYS_PATH (the PEX leaves torch,
# torchvision and torchaudio out and appends that directory after its own packages).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$(mkdir -p "${WORK:-$HOME/calcx-gpu}" && cd "${WORK:-$HOME/calcx-gpu}" && pwd)"
RESULTS="${RESULTS:-$WORK/results}"
IN="$WORK/in"
PEX="$WORK/calcx-gpu.pex"
GGUF="$WORK/model.gguf"
MODEL="$WORK/models/qwen2.5-coder-1.5b-instruct"
GGUF_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
PYTHON="${PYTHON:-python3}"
mkdir -p "$IN" "$RESULTS"

export VLLM_USE_FLASHINFER_SAMPLER=0  # flashinfer's sampler needs its cubin package, not carried
# vLLM's INFO lines time its start (weights, torch.compile, CUDA graphs: `calcx runs startup`); verl
# sets WARN for its Ray workers only where the launching environment sets nothing
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-INFO}"
export PYTHONUNBUFFERED=1

torch_site() { "$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))'; }
calcx() { PEX_EXTRA_SYS_PATH="$(torch_site)" "$PYTHON" "$PEX" "$@"; }
# A machine with no network returns files of at most 16 MiB each: pack TARBALL DIR FILE... writes
# TARBALL, or, when it is larger than PIECE_MB, TARBALL.00, .01, ... (`cat TARBALL.* > TARBALL`)
PIECE_MB=15
pack() {
  local tarball dir="$2"
  mkdir -p "$(dirname "$1")"
  tarball="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; shift 2  # tar runs in DIR: an absolute path
  rm -f "$tarball" "$tarball".[0-9][0-9]  # an earlier status into the same OUT: no stale pieces
  (cd "$dir" && tar -czf "$tarball" --ignore-failed-read "$@")
  if (( $(stat -c %s "$tarball") > PIECE_MB * 1024 * 1024 )); then
    split -b "${PIECE_MB}M" -d "$tarball" "$tarball." && rm -f "$tarball"
  fi
}

# The settings every run shares (docs/gpu-run.md says why) are calcx.yaml's run profile of this
# name. What suits the GPU (recomputation, offload, micro-batch token budgets) comes from
# calcx.yaml's gpu_profiles, picked by its memory.
RUN_PROFILE=gsm8k-h200

# The runs a campaign knows; `anchor` is verl's own ToolAgentLoop on the same settings (docs/anchor.md);
# `tooluse` is the tool-use recipe: RL from the warm-up's model with the reward options below.
MODES=(sync async anchor tooluse distilled sample resume)
# the kill-and-resume run (docs/resume.md): a checkpoint every SAVE_FREQ steps, the driver killed
# once KILL_AFTER steps are logged (during the next step's rollouts), one whole checkpoint kept
SAVE_FREQ="${SAVE_FREQ:-5}"
KILL_AFTER="${KILL_AFTER:-7}"
WARMUP_DIR="${WARMUP_DIR:-$RESULTS/warmup}"
WARMUP_RUN_NAME=calcx-warmup
# the traces a warm-up trains on: GSM8K's annotations, made at home and carried (`calcx data traces`)
TRACES="${TRACES:-$IN/gsm8k/traces.parquet}"
# the self-distilled recipe (docs/recipes.md): a sample pass of the base model over SAMPLE_PROBLEMS
# training problems (a seeded draw by id; calcx.yaml's SAMPLE_PROFILE: sampled sessions under the
# calculator-first message), its right calculator answers as traces under the system message
# DISTILLED_PROFILE's RL runs with (its calcx.agent_prompt), a warm-up on them into DISTILLED_WARMUP_DIR,
# then RL from that model with DISTILLED_PROFILE, on GSM8K and its hard split as the calculator runs
SAMPLE_PROFILE=gsm8k-h200-sample
SAMPLE_PROBLEMS="${SAMPLE_PROBLEMS:-1000}"
SAMPLE_SEED=1
DISTILLED_PROFILE=gsm8k-h200-calculator-bonus
DISTILLED_WARMUP_DIR="$RESULTS/distilled-warmup"
# an earlier machine's sample pass, brought back and carried in with the data: no sample pass then
CARRIED_TRACES="$IN/gsm8k/distilled-traces.parquet"
is_distilled() { [[ "$1" == distilled ]]; }
# the tool-use recipe's RL settings: RUN_PROFILE's and its reward options (calcx.yaml's run_profiles)
TOOLUSE_PROFILE=gsm8k-h200-tooluse
# a run from the warm-up's model: `tooluse` with TOOLUSE_PROFILE, `tooluse-X` with the run profile TOOLUSE_PROFILE-X
# (another RL setting on the same warm-up; its results in $RESULTS/tooluse-X)
is_tooluse() { [[ "$1" == tooluse || "$1" == tooluse-* ]]; }
tooluse_profile() { echo "$TOOLUSE_PROFILE${1#tooluse}"; }
# the modes whose results a watch or stop reads: MODES, and the tooluse-X runs a campaign started
started_modes() {
  local mode
  for mode in "${MODES[@]}"; do echo "$mode"; done
  for mode in "$RESULTS"/tooluse-*/ "$RESULTS"/calculator*/ "$RESULTS"/sync-*/; do [[ -d "$mode" ]] && basename "$mode"; done
  return 0
}
# the calculator recipe (calcx.yaml's gsm8k-h200-calculator): RL from the base model, trained on GSM8K and
# its hard-arithmetic split; `calculator-X` runs the run profile gsm8k-h200-calculator-X the same way
CALCULATOR_PROFILE=gsm8k-h200-calculator
is_calculator() { [[ "$1" == calculator || "$1" == calculator-* ]]; }
calculator_profile() { echo "$CALCULATOR_PROFILE${1#calculator}"; }
# `sync-X`: a sync run of the base model on the run profile RUN_PROFILE-X (another setting of the default
# recipe beside it, e.g. sync-bypass: gsm8k-h200-bypass); its results in $RESULTS/sync-X
is_sync_variant() { [[ "$1" == sync-* ]]; }
sync_profile() { echo "$RUN_PROFILE${1#sync}"; }
# the data every run validates on: the held-out GSM8K rows and every other split carried beside them,
# test-<tag>.parquet (`calcx data harden --source gsm8k-<tag>`: accuracy by source, gsm8k-hard,
# gsm8k-harder, ...); the calculator runs train on GSM8K and the split HARD_TRAIN names
# (train-<tag>.parquet, default train-hard.parquet: GSM8K alone when that one was not carried;
# HARD_TRAIN=none: GSM8K alone, named)
HARD_TRAIN_NAMED="${HARD_TRAIN:-}"
HARD_TRAIN="${HARD_TRAIN:-train-hard.parquet}"
val_files() {
  local split
  echo "$IN/gsm8k/test.parquet"
  for split in "$IN"/gsm8k/test-*.parquet; do [[ -f "$split" ]] && echo "$split"; done
  return 0
}
train_files() {
  echo "$IN/gsm8k/train.parquet"
  if { is_calculator "$1" || is_distilled "$1"; } && [[ "$HARD_TRAIN" != none && -f "$IN/gsm8k/$HARD_TRAIN" ]]; then
    echo "$IN/gsm8k/$HARD_TRAIN"
  fi
  return 0
}
# a HARD_TRAIN named is a training split, and carried: otherwise a calculator run would train on
# GSM8K alone, or on held-out problems, without a word
check_hard_train() {
  [[ -z "$HARD_TRAIN_NAMED" || "$HARD_TRAIN_NAMED" == none ]] && return 0
  if [[ "$HARD_TRAIN_NAMED" != train-*.parquet || "$HARD_TRAIN_NAMED" == */* ]]; then
    echo "HARD_TRAIN=$HARD_TRAIN_NAMED is not a training split's file name (train-<tag>.parquet) or none" >&2; return 2
  fi
  if [[ ! -f "$IN/gsm8k/$HARD_TRAIN_NAMED" ]]; then
    echo "HARD_TRAIN=$HARD_TRAIN_NAMED was not carried into $IN/gsm8k" >&2; return 2
  fi
}
# a campaign's wait on run NAME (pid PID) to its end, stopping it after MAX_S seconds (none: no limit)
follow() {
  local t0; t0=$(date +%s)
  while kill -0 "$2" 2>/dev/null; do
    if [[ -n "$3" ]] && (( $(date +%s) - t0 >= $3 )); then
      echo "campaign: $1 still running after $3 s; stopping it and going on" >&2
      "$0" stop "$1"
    fi
    sleep 5
  done
}
# a campaign's sample pass, followed as a run is; the campaign's KEY=VALUE overrides are for training
# runs and not handed to it
sample_pass() {
  local child
  # its own process group, as a started run has, so that `stop sample` ends it and what it started
  setsid "$0" sample & child=$!
  follow sample "$child" "$1"
  wait "$child" || { local rc=$?; [[ -f "$RESULTS/sample/ended" ]] || date +%s > "$RESULTS/sample/ended"; return "$rc"; }
}
# KEY=VALUE overrides a campaign hands every run it starts, as $CAMPAIGN_OVERRIDES (space-separated,
# e.g. trainer.test_freq=20); the environment variable stays a string, so that `launch` passes it on
read -r -a campaign_overrides <<< "${CAMPAIGN_OVERRIDES:-}"
ANCHOR_RUN_NAME=toolagentloop
# The anchor is there for its step times: its profile validates once before training (its prompts
# against calcx's, by accuracy), not every 10 steps and at the end.
ANCHOR_PROFILE=gsm8k-h200-anchor

stage="${1:?stage: receive|setup|start|status|wait|stop}"; shift
case "$stage" in
  receive)
    cp -r "${1:?DIR}"/. "$IN/"
    du -sh "$IN"
    ;;
  pex)
    touch "$WORK/pex.running"; trap 'rm -f "$WORK/pex.running"' EXIT
    t0=$(date +%s)
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
      "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'
      ldd --version | sed -n 1p; } > "$RESULTS/machine.txt"
    (cd "$IN" && sha256sum -c --quiet SHA256SUMS.pex)
    cat "$IN"/calcx-gpu.pex.[0-9]* > "$PEX"
    echo "$(cat "$IN/calcx-gpu.pex.sha256")  $PEX" | sha256sum -c --quiet
    echo "calcx-gpu.pex: $(stat -c %s "$PEX") bytes, sha256 $(cat "$IN/calcx-gpu.pex.sha256") (as Pants built it)" \
      >> "$RESULTS/machine.txt"
    t1=$(date +%s)
    calcx --version >> "$RESULTS/machine.txt"
    t2=$(date +%s)
    echo "pex: join+verify $((t1 - t0)) s, first PEX start (venv) $((t2 - t1)) s" >> "$RESULTS/machine.txt"
    touch "$WORK/pex.ready"
    cat "$RESULTS/machine.txt"
    ;;
  profile)
    touch "$WORK/profile.running"; trap 'rm -f "$WORK/profile.running"' EXIT
    [[ -f "$WORK/pex.ready" ]] || "$0" pex
    calcx profile-step --out "$RESULTS/profile" 2>&1 | tee "$RESULTS/profile.log"
    ;;
  setup)
    while [[ -f "$WORK/pex.running" ]]; do sleep 2; done  # a `pex` started in the background
    [[ -f "$WORK/pex.ready" ]] || "$0" pex
    t2=$(date +%s)
    (cd "$IN" && sha256sum -c --quiet SHA256SUMS.model)
    cat "$IN"/model.gguf.[0-9]* > "$GGUF"
    # qwen2's weights straight from the GGUF (the default route); should that route fail on this
    # machine, the transformers route is taken and machine.txt says so, so a session's GPU time is not lost
    if ! calcx model from-gguf --gguf "$GGUF" --sha256 "$GGUF_SHA256" --out "$MODEL" --force 2>&1 | tee "$RESULTS/convert.log"; then
      echo "setup: the direct conversion failed (convert.log); converting through transformers" | tee -a "$RESULTS/machine.txt"
      calcx model from-gguf --gguf "$GGUF" --sha256 "$GGUF_SHA256" --out "$MODEL" --force --via transformers 2>&1 \
        | tee -a "$RESULTS/convert.log"
    fi
    t3=$(date +%s)
    echo "setup: join + verify + model conversion $((t3 - t2)) s" | tee -a "$RESULTS/machine.txt"
    ;;
  warmup)
    # verl's SFT trainer on the traces; the Hugging Face directory of its last step is the model
    mkdir -p "$WARMUP_DIR"
    date +%s > "$WARMUP_DIR/started"
    rc=0
    (cd "$WARMUP_DIR" && calcx warmup --model "$MODEL" --traces "$TRACES" \
      --run-name "$WARMUP_RUN_NAME" "$@") > "$WARMUP_DIR/train.log" 2>&1 || rc=$?
    date +%s > "$WARMUP_DIR/ended"
    cp "$WARMUP_DIR/runs/$WARMUP_RUN_NAME/warmup_metrics.jsonl" "$WARMUP_DIR/metrics.jsonl" 2>/dev/null || true
    hf="$(find "$WARMUP_DIR/runs/$WARMUP_RUN_NAME/checkpoints" -maxdepth 2 -path '*/global_step_*/huggingface' \
      2>/dev/null | sort -V | tail -n 1 || true)"  # none: the warm-up saved nothing (said below)
    echo "warmup: exit $rc, $(( $(cat "$WARMUP_DIR/ended") - $(cat "$WARMUP_DIR/started") )) s, model ${hf:-none}" \
      | tee -a "$WARMUP_DIR/train.log"
    if [[ $rc == 0 && -z "$hf" ]]; then echo "warmup: no Hugging Face model was saved" | tee -a "$WARMUP_DIR/train.log"; rc=1; fi
    [[ $rc == 0 ]] && ln -sfn "$hf" "$WARMUP_DIR/model"
    exit "$rc"
    ;;
  sample)
    dir="$RESULTS/sample"
    mkdir -p "$dir"
    date +%s > "$dir/started"; rm -f "$dir/ended"
    echo $$ > "$dir/pid"  # `wait sample` and `status sample` read it as a run's
    # an earlier pass's traces must not pass for this one's, nor its store mix into this one's
    rm -f "$dir/traces.parquet" "$dir/traces.log"
    if [[ -d "$dir/services" ]]; then mv "$dir/services" "$dir/services.before-$(cat "$dir/started")"; fi
    mapfile -t val < <(val_files)
    rc=0
    # training problems only: `calcx data import` of train.parquet draws SAMPLE_PROBLEMS of them by id
    calcx data import "$IN/gsm8k/train.parquet" --out "$WORK/sample-rows" --val-size "$SAMPLE_PROBLEMS" \
      --seed "$SAMPLE_SEED" --force > "$dir/rows.log" 2>&1 || rc=$?
    argv=(train --eval-only --model "$MODEL" --val-file "$WORK/sample-rows/test.parquet" --run-name calcx-sample
      --profile "$SAMPLE_PROFILE" "calcx.report_dir=$dir" "$@")
    printf '%q ' calcx-gpu.pex "${argv[@]}" > "$dir/command.txt"; echo >> "$dir/command.txt"
    if [[ $rc == 0 ]]; then (cd "$WORK" && calcx "${argv[@]}") > "$dir/train.log" 2>&1 || rc=$?; fi
    if [[ $rc == 0 ]]; then  # the profile's own message: an override of it in CAMPAIGN_OVERRIDES reaches RL, not this
      message="$(calcx train --profile "$DISTILLED_PROFILE" --print-key calcx.agent_prompt 2>>"$dir/traces.log")" || rc=$?
    fi
    if [[ $rc == 0 ]]; then
      calcx runs traces "$dir/services/calcx.db" --out "$dir/traces.parquet" --exclude "${val[@]}" \
        --system-message "$message" --force >> "$dir/traces.log" 2>&1 || rc=$?
    fi
    date +%s > "$dir/ended"
    echo "sample: exit $rc, $(( $(cat "$dir/ended") - $(cat "$dir/started") )) s; $(tail -n 2 "$dir/traces.log" 2>/dev/null | tr '\n' ' ')" \
      | tee -a "$dir/train.log"
    exit "$rc"
    ;;
  campaign)
    steps="${1:?STEPS}"; shift
    for spec in "$@"; do  # before setup's minutes
      mode="${spec%%:*}"
      [[ "$spec" =~ ^[a-z][a-z0-9.-]*(:[0-9]+(:[0-9]+)?)?$ ]] || { echo "campaign: $spec is not MODE[:STEPS[:MAX_S]]" >&2; exit 2; }
      [[ " ${MODES[*]} " == *" $mode "* ]] || is_tooluse "$mode" || is_calculator "$mode" || is_sync_variant "$mode" \
        || { echo "campaign: mode $mode is not one of: ${MODES[*]} sync-X tooluse-X calculator calculator-X" >&2; exit 2; }
      if [[ "$mode" == tooluse-* ]] && ! grep -qxF "  $(tooluse_profile "$mode"):" "$here/../python/calcx/trainer/config/calcx.yaml"; then
        echo "campaign: mode $mode needs the run profile $(tooluse_profile "$mode") in calcx.yaml" >&2; exit 2
      fi
      if is_calculator "$mode" && ! grep -qxF "  $(calculator_profile "$mode"):" "$here/../python/calcx/trainer/config/calcx.yaml"; then
        echo "campaign: mode $mode needs the run profile $(calculator_profile "$mode") in calcx.yaml" >&2; exit 2
      fi
      if is_calculator "$mode" || is_distilled "$mode"; then check_hard_train || exit 2; fi
      if is_sync_variant "$mode" && ! grep -qxF "  $(sync_profile "$mode"):" "$here/../python/calcx/trainer/config/calcx.yaml"; then
        echo "campaign: mode $mode needs the run profile $(sync_profile "$mode") in calcx.yaml" >&2; exit 2
      fi
    done
    "$0" setup
    while [[ -f "$WORK/profile.running" ]]; do sleep 2; done  # the GPU to itself for each run
    for spec in "$@"; do
      IFS=: read -r mode mode_steps max_s <<< "$spec"
      flags=""
      if [[ "$mode" == async ]]; then flags=--async; fi
      if [[ "$mode" == sample ]]; then
        if sample_pass "$max_s"; then sampled=1; else sample_failed=1
          echo "campaign: the sample pass failed or was stopped (sample/train.log); going on" >&2; fi
        continue
      fi
      if [[ "$mode" == resume ]]; then
        "$0" killresume resume "${mode_steps:-$steps}" || echo "campaign: the kill-and-resume run failed; going on" >&2
        continue
      fi
      if is_tooluse "$mode" && [[ ! -e "$WARMUP_DIR/model" ]]; then  # one warm-up for every tool-use run
        if [[ -n "${warmup_failed:-}" ]]; then echo "campaign: no warm-up model; $mode skipped" >&2; continue; fi
        "$0" warmup || { warmup_failed=1; echo "campaign: the warm-up failed (warmup/train.log says why); going on" >&2; continue; }
      elif is_tooluse "$mode"; then
        echo "campaign: $mode trains from the warm-up model already there: $(readlink -f "$WARMUP_DIR/model")" >&2
      fi
      if is_distilled "$mode" && [[ ! -e "$DISTILLED_WARMUP_DIR/model" ]]; then  # the sample pass and its warm-up
        traces="$RESULTS/sample/traces.parquet"
        # this campaign's own pass first, then carried traces; a pass that failed is not run again
        if [[ -n "${sample_failed:-}" ]]; then echo "campaign: no traces (the sample pass failed); $mode skipped" >&2; continue
        elif [[ -n "${sampled:-}" ]]; then echo "campaign: $mode warms up on this campaign's traces $traces" >&2
        elif [[ -f "$CARRIED_TRACES" ]]; then
          traces="$CARRIED_TRACES"; echo "campaign: $mode warms up on the carried traces $traces" >&2
        else
          if sample_pass ""; then sampled=1; else sample_failed=1  # MAX_S is the distilled run's
            echo "campaign: the sample pass failed (sample/train.log says why); $mode skipped" >&2; continue; fi
        fi
        TRACES="$traces" WARMUP_DIR="$DISTILLED_WARMUP_DIR" "$0" warmup \
          || { echo "campaign: the distilled warm-up failed (distilled-warmup/train.log); $mode skipped" >&2; continue; }
      fi
      FLAGS="$flags" "$0" start "$mode" "${mode_steps:-$steps}" "${campaign_overrides[@]}"
      follow "$mode" "$(cat "$RESULTS/$mode/pid")" "$max_s"
      date +%s > "$RESULTS/$mode/ended"
      # a run that logged no step (a broken start) leaves the machine's time to the runs after it
      grep -q '"timing_s/step"' "$RESULTS/$mode/metrics.jsonl" 2>/dev/null \
        || echo "campaign: $mode logged no step (its train.log says why); going on" >&2
    done
    ;;
  start)
    name="${1:?NAME}"; steps="${2:?STEPS}"; shift 2
    dir="$RESULTS/$name"
    mkdir -p "$dir"
    torch="$(torch_site)"
    date +%s > "$dir/started"
    rm -f "$dir/ended"  # an earlier run's: this one is going
    cmd=(train); run="$name"; profile="$RUN_PROFILE"; flags=()
    if [[ -n "${FLAGS:-}" ]]; then flags=("$FLAGS"); fi
    model="$MODEL"
    [[ "$name" == anchor ]] && { cmd=(anchor train); run="$ANCHOR_RUN_NAME"; profile="$ANCHOR_PROFILE"; }
    if is_tooluse "$name"; then model="$WARMUP_DIR/model"; profile="$(tooluse_profile "$name")"; fi
    if is_calculator "$name"; then profile="$(calculator_profile "$name")"; check_hard_train || exit 2; fi
    if is_distilled "$name"; then model="$DISTILLED_WARMUP_DIR/model"; profile="$DISTILLED_PROFILE"; check_hard_train || exit 2; fi
    if is_sync_variant "$name"; then profile="$(sync_profile "$name")"; fi
    mapfile -t train < <(train_files "$name"); mapfile -t val < <(val_files)
    # in $WORK, not in the checkout the script is run from: verl's checkpoints (checkpoints/PROJECT/RUN)
    # and the trainer's other working files stay out of a tree that may be refreshed during the run
    cd "$WORK"
    argv=("${cmd[@]}" --model "$model" --train-file "${train[@]}" --val-file "${val[@]}"
      --run-name "$run" --profile "$profile" "${flags[@]}" "calcx.report_dir=$dir"
      trainer.total_training_steps="$steps" "$@")
    printf '%q ' calcx-gpu.pex "${argv[@]}" > "$dir/command.txt"; echo >> "$dir/command.txt"  # the run record's command
    setsid nohup env PEX_EXTRA_SYS_PATH="$torch" "$PYTHON" "$PEX" "${argv[@]}" \
      >"$dir/train.log" 2>&1 </dev/null &
    echo $! > "$dir/pid"
    echo "started $name (pid $(cat "$dir/pid")): $dir/train.log"
    ;;
  killresume)
    name="${1:?NAME}"; steps="${2:?STEPS}"; shift 2
    dir="$RESULTS/$name"
    args=(trainer.save_freq="$SAVE_FREQ" calcx.keep_checkpoints=1 "$@")
    logged() { local n; n=$(grep -c '"timing_s/step"' "$dir/metrics.jsonl" 2>/dev/null) || true; echo "${n:-0}"; }
    note() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$dir/kill.log"; }
    # wait until the run logged step $1 (or ended); echoes the seconds since its start
    wait_step() {
      local t0; t0=$(cat "$dir/started")
      while (( $(logged) < $1 )) && kill -0 "$(cat "$dir/pid")" 2>/dev/null; do sleep 2; done
      echo $(( $(date +%s) - t0 ))
    }
    mkdir -p "$dir"; : > "$dir/kill.log"
    "$0" start "$name" "$steps" "${args[@]}"
    note "first start: step 1 logged $(wait_step 1) s after the start (validation before training included)"
    s=$(wait_step "$KILL_AFTER")
    (( $(logged) >= KILL_AFTER )) || { note "the run ended before step $KILL_AFTER (train.log says why)"; exit 1; }
    pid="$(cat "$dir/pid")"
    # the driver's descendants, recorded before the kill, so that survivors can be named and ended by id
    ps -e -o pid=,ppid= > "$dir/ps.before"
    tree="$(awk -v root="$pid" '{ kids[$2] = kids[$2] " " $1 }
      END { q[1] = root; n = 1; for (i = 1; i <= n; i++) { split(kids[q[i]], k, " "); for (j in k) q[++n] = k[j] }
            for (i = 2; i <= n; i++) print q[i] }' "$dir/ps.before" | tr '\n' ' ')"
    note "step $KILL_AFTER logged $s s after the start; SIGKILL to the driver (pid $pid) with $(wc -w <<< "$tree") descendant(s)"
    kill -KILL "$pid"
    sleep 20
    left=""; for p in $tree; do kill -0 "$p" 2>/dev/null && left="$left,$p"; done; left="${left#,}"
    note "20 s after the kill: $(wc -w <<< "${left//,/ }") descendant(s) alive${left:+ ($(ps -o comm= -p "$left" 2>/dev/null | sort | uniq -c | tr -s ' \n' ' '))}; GPU: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ';')"
    for p in ${left//,/ }; do kill -KILL "$p" 2>/dev/null || true; done
    for _ in $(seq 1 30); do [[ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ]] && break; sleep 2; done
    note "checkpoints on disk: $(find "$WORK/checkpoints" -mindepth 3 -maxdepth 3 -path "*/$name/global_step_*" -printf '%f ' 2>/dev/null)"
    mv "$dir/train.log" "$dir/train.before-kill.log"
    cp "$dir/started" "$dir/started.before-kill"
    "$0" start "$name" "$steps" "${args[@]}"
    # the steps the metrics file keeps are known once the start has set aside the rows after its checkpoint
    plan='calcx train: resuming\|calcx train: starting'
    while ! grep -q "$plan" "$dir/train.log" 2>/dev/null && kill -0 "$(cat "$dir/pid")" 2>/dev/null; do sleep 2; done
    grep -m1 "$plan" "$dir/train.log" | cut -c1-600 | tee -a "$dir/kill.log"
    next=$(( $(logged) + 1 ))
    note "second start (the same command): step $next logged $(wait_step "$next") s after the start (no validation before it)"
    while kill -0 "$(cat "$dir/pid")" 2>/dev/null; do sleep 5; done
    date +%s > "$dir/ended"
    note "ended: $(logged) steps in metrics.jsonl; $(grep -h "checkpoint of step" "$dir/train.before-kill.log" "$dir/train.log" | sed 's/.*calcx: //' | tr '\n' ';')"
    note "checkpoints on disk: $(du -sh "$WORK"/checkpoints/*/"$name"/global_step_* 2>/dev/null | tr '\t\n' ' ;'); disk: $(df -h "$WORK" | awk 'NR==2 {print $3 " used, " $4 " free"}')"
    calcx ledger --db "$dir/services/calcx.db" --run "$name" --batch-rollouts 128 --show-queries > "$dir/ledger.md" 2>&1 || true
    cat "$dir/ledger.md"
    ;;
  launch)
    # the campaign in its own session, so that it outlives the command that starts it
    setsid nohup "$0" campaign "$@" >"$RESULTS/campaign.log" 2>&1 </dev/null &
    echo $! > "$RESULTS/campaign.pid"
    echo "campaign started (pid $(cat "$RESULTS/campaign.pid")): $RESULTS/campaign.log"
    ;;
  watch)
    # status of the campaign's runs after it ends or SECONDS pass; OUT gets one tarball a run
    deadline=$(( $(date +%s) + ${1:?SECONDS} ))
    out="${2:-}"
    while kill -0 "$(cat "$RESULTS/campaign.pid")" 2>/dev/null && (( $(date +%s) < deadline )); do sleep 10; done
    kill -0 "$(cat "$RESULTS/campaign.pid")" 2>/dev/null && echo "campaign: running" || echo "campaign: ended"
    tail -n 5 "$RESULTS/campaign.log" | cut -c1-300
    for warmup in "$WARMUP_DIR" "$DISTILLED_WARMUP_DIR"; do
      [[ -f "$warmup/train.log" ]] || continue
      echo "$(basename "$warmup"): $(grep -c '"train/loss"' "$warmup/runs/$WARMUP_RUN_NAME/warmup_metrics.jsonl" 2>/dev/null || true) steps logged"
      grep -E "Traceback|Error|warmup: exit|step:[0-9]+ " "$warmup/train.log" | tail -n 4 | cut -c1-400 || true
      if [[ -n "$out" ]]; then
        pack "$out/$(basename "$warmup").tar.gz" "$warmup" started ended train.log metrics.jsonl "runs/$WARMUP_RUN_NAME/warmup_config.yaml"
      fi
    done
    for mode in $(started_modes); do
      if [[ -f "$RESULTS/$mode/pid" ]]; then "$0" status "$mode" ${out:+"$out"}; fi
    done
    if [[ -n "$out" && -d "$RESULTS/profile" ]]; then
      pack "$out/profile.tar.gz" "$RESULTS" profile profile.log machine.txt
    fi
    ;;
  status|wait)
    name="${1:?NAME}"
    dir="$RESULTS/$name"
    if [[ "$stage" == wait ]]; then
      # one deadline for a run not started yet (a campaign's setup, or the run before it) and for its
      # end, so that a wait called right after `launch` ends, and packs OUT, within the SECONDS given
      deadline=$(( $(date +%s) + ${2:?SECONDS} )); shift
      while [[ ! -f "$dir/pid" ]] && (( $(date +%s) < deadline )); do sleep 2; done
      while [[ -f "$dir/pid" ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null && (( $(date +%s) < deadline )); do sleep 10; done
    fi
    if [[ ! -f "$dir/pid" ]]; then
      echo "run $name: not started (no $dir/pid)"; tail -n 3 "$RESULTS/campaign.log" 2>/dev/null | cut -c1-300 || true
      exit 3
    fi
    out="${2:-}"
    alive=no; kill -0 "$(cat "$dir/pid")" 2>/dev/null && alive=yes
    echo "run $name: running=$alive, $(( $(date +%s) - $(cat "$dir/started") )) s since start"
    [[ -f "$dir/metrics.jsonl" ]] && echo "steps logged: $(grep -c '"timing_s/step"' "$dir/metrics.jsonl" || true)"
    grep -E "step:[0-9]+ |Traceback|Error|calcx (anchor )?train:" "$dir/train.log" | tail -n 6 | cut -c1-400 || true
    db="$dir/services/calcx.db"  # calcx's runs only: the anchor starts no calcx server
    if [[ -f "$dir/metrics.jsonl" ]]; then
      table_args=()
      if [[ -f "$db" ]]; then table_args+=(--calls "$db"); fi
      if [[ -f "$db" && -f "$dir/incomplete_groups.jsonl" ]]; then
        table_args+=(--incomplete "$dir/incomplete_groups.jsonl")
      fi
      if [[ -f "$db" && -f "$dir/session_times.jsonl" ]]; then
        table_args+=(--sessions "$dir/session_times.jsonl")
      fi
      if [[ -f "$dir/starts.jsonl" ]]; then table_args+=(--starts "$dir/starts.jsonl"); fi
      calcx runs table "$dir/metrics.jsonl" "${table_args[@]}" > "$dir/steps.md" 2>&1 || true
      cat "$dir/steps.md"
    fi
    if [[ -n "$out" ]]; then
      # two tarballs a run (what comes back is counted in files): metrics, log, tables, report, curves; the store
      cp "$RESULTS/machine.txt" "$RESULTS/convert.log" "$dir/" 2>/dev/null || true
      if [[ -f "$db" ]]; then
        # the store without its token ids and log-probs (the bulk of it): every row, clock and recorded
        # request and answer stays, so `calcx runs table --calls` can be run on it again at home
        rm -f "$dir/store-slim.db"
        "$PYTHON" - "$db" "$dir/store-slim.db" <<'PY'
import sqlite3, sys
sqlite3.connect(sys.argv[1]).execute("VACUUM INTO ?", (sys.argv[2],))
con = sqlite3.connect(sys.argv[2])
con.execute("UPDATE calls SET prompt_token_ids = x'', response_token_ids = x'', response_logprobs = x''")
con.commit()
con.execute("VACUUM")
PY
      fi
      kept=()
      for f in metrics.jsonl train.log steps.md eval.md report.md reward_curve.png incomplete_groups.jsonl \
               machine.txt convert.log started ended kill.log ledger.md train.before-kill.log started.before-kill \
               superseded session_times.jsonl starts.jsonl command.txt tool_use.jsonl rows.log traces.log; do
        if [[ -e "$dir/$f" ]]; then kept+=("$f"); fi
      done
      # the store apart from the rest, so a large store never holds back the metrics and logs
      pack "$out/$name.tar.gz" "$dir" "${kept[@]}"
      # a sample pass's traces (model output on training problems: brought back to be carried again, not committed)
      store_files=()
      for f in store-slim.db traces.parquet; do [[ -f "$dir/$f" ]] && store_files+=("$f"); done
      if (( ${#store_files[@]} )); then pack "$out/$name-store.tar.gz" "$dir" "${store_files[@]}"; fi
      ls -la "$out"
    fi
    ;;
  stop)
    name="${1:?NAME}"
    if [[ "$name" == campaign ]]; then  # the campaign first (so it starts nothing more), then its runs
      kill -TERM -- "-$(cat "$RESULTS/campaign.pid")" 2>/dev/null || true
      for mode in $(started_modes); do  # runs still going (an ended one's pid may be another process's now)
        if [[ -f "$RESULTS/$mode/pid" && ! -f "$RESULTS/$mode/ended" ]]; then "$0" stop "$mode"; fi
      done
      exit 0
    fi
    pid="$(cat "$RESULTS/$name/pid")"
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    echo "stopped $name"
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
