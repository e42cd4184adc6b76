"""`calcx anchor train`: calcx train's config with verl's ToolAgentLoop in place of calcx's agent
loop, checked by verl itself; the GPU run's command lines (src/gpu/h200_run.sh) compose to the same
batch, samples, lengths and step-efficiency defaults for both runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from config_leaves import differing
from gpu_run_dirs import ended_run, store_path
from live_stack import alive
from omegaconf import DictConfig, OmegaConf

from calcx.anchor import cli as anchor_cli
from calcx.anchor.config import TOOLS_FILE, compose_anchor
from calcx.anchor.data import TOOL_AGENT
from calcx.trainer.config.compose import ComposeRequest, ConfigError, compose
from calcx.trainer.run import cli as trainer_cli

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src" / "python")}
RUN_SCRIPT = REPO / "src" / "gpu" / "h200_run.sh"
PROBE = (
    "import sys; from calcx.cli import main\n"
    "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
    "heavy = sorted(m for m in ('torch', 'verl', 'ray', 'vllm') if m in sys.modules)\n"
    "print('HEAVY=' + ','.join(heavy), file=sys.stderr); raise SystemExit(code)\n"
)

# what the two runs must share, key by key: batch and samples, learning rate, lengths, packing and
# token-budgeted micro-batches, attention, memory settings, engine, algorithm, trainer mode
SHARED = [
    "data.train_batch_size",
    "data.val_batch_size",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.val_kwargs.n",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.optim.lr",
    "data.max_prompt_length",
    "data.max_response_length",
    "actor_rollout_ref.rollout.prompt_length",
    "actor_rollout_ref.rollout.response_length",
    "actor_rollout_ref.rollout.max_model_len",
    "data.filter_overlong_prompts",
    "data.truncation",
    "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
    "actor_rollout_ref.model.override_config.attn_implementation",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.mode",
    "actor_rollout_ref.rollout.temperature",
    "actor_rollout_ref.rollout.val_kwargs.temperature",
    "actor_rollout_ref.rollout.calculate_log_probs",
    "actor_rollout_ref.rollout.engine_kwargs",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high",
    "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.actor.entropy_coeff",
    "algorithm.adv_estimator",
    "algorithm.use_kl_in_reward",
    "trainer.use_v1",
    "trainer.v1.trainer_mode",
    "trainer.v1.sampler.sync_refill_failed_groups",
    "trainer.n_gpus_per_node",
    "trainer.total_epochs",
    "trainer.total_training_steps",
    "trainer.val_before_train",
    "trainer.test_freq",
    "trainer.save_freq",
]
# all that the anchor changes (besides the run's name and report directory)
ANCHOR_SETTINGS = {
    "actor_rollout_ref.rollout.multi_turn.enable": True,
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(TOOLS_FILE),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 2,
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": 1,
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": 8,
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": 8192,
    "actor_rollout_ref.rollout.agent.default_agent_loop": TOOL_AGENT,
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": None,
    "actor_rollout_ref.rollout.agent.agent_loop_manager_class": None,
    "reward.custom_reward_function.path": "pkg://calcx.anchor.reward",
}


def assert_shared(calcx_cfg: DictConfig, anchor_cfg: DictConfig, *, besides: frozenset[str] = frozenset()) -> None:
    for key in set(SHARED) - besides:
        ours, theirs = OmegaConf.select(anchor_cfg, key), OmegaConf.select(calcx_cfg, key)
        assert ours == theirs, f"{key}: anchor {ours!r} != calcx train {theirs!r}"


def test_the_anchor_is_calcx_trains_config_with_verls_tool_loop() -> None:
    calcx_cfg, anchor_cfg = compose(ComposeRequest()), compose_anchor(ComposeRequest())
    assert_shared(calcx_cfg, anchor_cfg)
    assert differing(calcx_cfg, anchor_cfg) == set(ANCHOR_SETTINGS) | {"trainer.experiment_name"}
    for key, value in ANCHOR_SETTINGS.items():
        assert OmegaConf.select(anchor_cfg, key) == value, key
    assert anchor_cfg.trainer.experiment_name == "calcx-anchor"
    multi_turn = anchor_cfg.actor_rollout_ref.rollout.multi_turn
    assert multi_turn.format == "hermes" and TOOLS_FILE.is_file()
    assert OmegaConf.select(anchor_cfg, "data.tool_config_path") == str(
        TOOLS_FILE
    )  # verl's length filter sees the tool


def test_verl_checks_the_anchor_config_and_loads_its_parts() -> None:
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import RolloutConfig

    from calcx.trainer.run.launch import validate_with_verl

    cfg = compose_anchor(ComposeRequest(dotlist=["data.max_prompt_length=2048", "data.max_response_length=1024"]))
    validate_with_verl(cfg)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert isinstance(rollout, RolloutConfig) and rollout.multi_turn.enable and rollout.multi_turn.format == "hermes"
    assert rollout.agent.default_agent_loop == TOOL_AGENT and rollout.agent.agent_loop_manager_class is None
    import verl.experimental.agent_loop.tool_agent_loop  # noqa: F401  (registers verl's loops)

    assert _agent_loop_registry[TOOL_AGENT]["_target_"] == (
        "verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop"
    )
    score = get_custom_reward_fn(cfg)  # as verl's reward workers load it
    assert score is not None
    assert score(data_source="gsm8k", solution_str="### ANSWER: 12 ###", ground_truth="12", extra_info={}) == 1.0
    assert score(data_source="gsm8k", solution_str="### ANSWER: 13 ###", ground_truth="12", extra_info={}) == 0.0


def test_command_line_wins_over_the_anchor_settings() -> None:
    cfg = compose_anchor(
        ComposeRequest(
            run_name="mine",
            dotlist=[
                "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=3",
                "actor_rollout_ref.rollout.multi_turn." "tool_config_path=/elsewhere/tools.yaml",
            ],
        )
    )
    assert cfg.trainer.experiment_name == "mine"
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_parallel_calls == 3
    assert cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path == "/elsewhere/tools.yaml"


def test_the_anchors_turns_follow_the_agents_tool_rounds() -> None:
    """One fact: calcx.agent_tool_rounds sets calcx's agent and verl's ToolAgentLoop alike."""
    multi_turn = compose_anchor(
        ComposeRequest(dotlist=["calcx.agent_tool_rounds=4"])
    ).actor_rollout_ref.rollout.multi_turn
    assert (multi_turn.max_assistant_turns, multi_turn.max_user_turns) == (5, 4)
    agreeing = compose_anchor(
        ComposeRequest(
            dotlist=["calcx.agent_tool_rounds=2", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3"]
        )
    )
    assert agreeing.actor_rollout_ref.rollout.multi_turn.max_user_turns == 2
    with pytest.raises(ConfigError, match="max_assistant_turns=3 disagrees with calcx.agent_tool_rounds=1"):
        compose_anchor(ComposeRequest(dotlist=["actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3"]))
    with pytest.raises(ConfigError, match="max_user_turns=1 disagrees with calcx.agent_tool_rounds=3"):
        compose_anchor(
            ComposeRequest(
                dotlist=["calcx.agent_tool_rounds=3", "actor_rollout_ref.rollout.multi_turn.max_user_turns=1"]
            )
        )
    with pytest.raises(ConfigError, match="calcx.agent_tool_rounds=17 is out of range"):
        compose_anchor(ComposeRequest(dotlist=["calcx.agent_tool_rounds=17"]))


def test_the_anchors_prompts_open_with_the_system_message_calcx_agent_prompt_names() -> None:
    from calcx.agent.answer import SYSTEM_MESSAGES
    from calcx.anchor.data import anchor_records

    rows = [{"id": "a", "question": "What is 2 + 2?", "chain": "", "result": "4", "source": "t"}]
    assert anchor_records(rows)[0]["prompt"][0]["content"] == SYSTEM_MESSAGES["plain"]
    assert anchor_records(rows, "calculator-first")[0]["prompt"][0]["content"] == SYSTEM_MESSAGES["calculator-first"]


def _calcx(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120, env=env or ENV, cwd=REPO
    )


def test_print_config_through_the_calcx_command_stays_light() -> None:
    done = _calcx("anchor", "train", "--print-config", "--run-name", "toolagentloop", "trainer.total_epochs=1")
    assert done.returncode == 0, done.stderr
    assert "HEAVY=\n" in done.stderr + "\n"
    shown = yaml.safe_load(done.stdout)
    arr = shown["actor_rollout_ref"]["rollout"]
    assert arr["agent"]["default_agent_loop"] == TOOL_AGENT and arr["multi_turn"]["enable"] is True
    assert arr["multi_turn"]["tool_config_path"] == str(TOOLS_FILE)
    assert shown["reward"]["custom_reward_function"]["path"] == "pkg://calcx.anchor.reward"
    assert shown["trainer"]["experiment_name"] == "toolagentloop" and shown["trainer"]["total_epochs"] == 1
    bad = _calcx("anchor", "train", "--print-config", "trainer.totl_epochs=1")
    assert bad.returncode == 2 and "trainer.totl_epochs" in bad.stderr


def test_help_lists_the_command_and_training_without_a_gpu_fails_fast(tmp_path: Path) -> None:
    listed = _calcx("--help")
    assert listed.returncode == 0 and "anchor" in listed.stdout
    helped = _calcx("anchor", "train", "--help")
    assert helped.returncode == 0
    for flag in ("--train-file", "--val-file", "--model", "--run-name", "--print-config", "KEY=VALUE"):
        assert flag in helped.stdout
    done = subprocess.run(
        [sys.executable, "-m", "calcx.anchor.cli", "train", "--train-file", str(tmp_path / "x.parquet")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**ENV, "CUDA_VISIBLE_DEVICES": ""},
        cwd=tmp_path,
    )
    assert done.returncode == 3 and "no CUDA GPU" in done.stderr
    assert not (tmp_path / "data").exists()


# -- the GPU run's command lines -----------------------------------------------------------------------
FAKE_PYTHON = """#!/bin/bash
# the machine's python3, as h200_run.sh calls it: its torch directory, a script on stdin, or the PEX
# (its `runs` and `data` commands, the step tables and data files, and a config's key read with
# --print-key, as the calcx command from the sources)
case "$1" in
  -c) echo /machine/torch/site-packages ;;
  -) exec "$REAL_PYTHON" "$@" ;;
  *) if [[ "$2" == runs || "$2" == data || " $* " == *" --print-key "* ]]; then shift; PYTHONPATH="$CALCX_SOURCES" exec "$REAL_PYTHON" -m calcx.cli "$@"; fi
     shift; printf '%s\\n' "$@" > "$ARGV_DIR/run.argv.tmp" && mv "$ARGV_DIR/run.argv.tmp" "$ARGV_DIR/run.argv"
     # a sample pass that runs on (FAKE_SAMPLE_S seconds), through a child of its own as the trainer's are
     if [[ -n "$FAKE_SAMPLE_S" && " $* " == *" --eval-only "* ]]; then sleep "$FAKE_SAMPLE_S" & echo $! > "$ARGV_DIR/train.child"; wait; fi ;;
esac
"""


def _script(work: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {
        **os.environ,
        "WORK": str(work),
        "PYTHON": str(work / "python3"),
        "REAL_PYTHON": sys.executable,
        "ARGV_DIR": str(work),
        "CALCX_SOURCES": ENV["PYTHONPATH"],
        **(env or {}),
    }
    return subprocess.run(["bash", str(RUN_SCRIPT), *args], capture_output=True, text=True, timeout=120, env=full)


def _fake_python(work: Path) -> None:
    """The machine's `python3` as the script finds it ($PYTHON): FAKE_PYTHON, recording the PEX's arguments."""
    fake = work / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)


def _train_config(argv: list[str]):
    """The config `calcx train` composes from the arguments the script handed the PEX."""
    return trainer_cli.compose_from_args(trainer_cli.build_parser().parse_args(argv[1:]))


def _started(work: Path, name: str) -> list[str]:
    """The arguments `h200_run.sh start NAME` hands the PEX (after the PEX's own path)."""
    (work / "run.argv").unlink(missing_ok=True)
    done = _script(work, "start", name, "20")
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 30
    while not (work / "run.argv").exists():
        assert time.monotonic() < deadline, f"h200_run.sh start {name} ran nothing"
        time.sleep(0.1)
    return (work / "run.argv").read_text().splitlines()


def test_the_gpu_run_starts_the_anchor_with_calcx_trains_settings(tmp_path: Path) -> None:
    _fake_python(tmp_path)
    calcx_argv, anchor_argv = _started(tmp_path, "sync"), _started(tmp_path, "anchor")
    assert calcx_argv[0] == "train" and anchor_argv[:2] == ["anchor", "train"]
    calcx_cfg = _train_config(calcx_argv)
    anchor_cfg = anchor_cli.compose_from_args(anchor_cli.build_parser().parse_args(anchor_argv[1:]))
    assert_shared(calcx_cfg, anchor_cfg, besides=frozenset({"trainer.test_freq"}))
    # and validates only before training (its run profile, gsm8k-h200-anchor): it is there for its step times
    assert differing(calcx_cfg, anchor_cfg) == set(ANCHOR_SETTINGS) | {
        "trainer.experiment_name",
        "calcx.report_dir",
        "trainer.test_freq",
        "calcx.run_profile_applied",
    }
    assert (calcx_cfg.calcx.run_profile_applied, anchor_cfg.calcx.run_profile_applied) == (
        "gsm8k-h200",
        "gsm8k-h200-anchor",
    )
    assert (calcx_cfg.trainer.test_freq, anchor_cfg.trainer.test_freq) == (10, -1)
    assert anchor_cfg.trainer.val_before_train is True
    assert (anchor_cfg.data.train_batch_size, anchor_cfg.actor_rollout_ref.rollout.n) == (32, 4)
    assert (anchor_cfg.data.max_prompt_length, anchor_cfg.data.max_response_length) == (2048, 1024)
    assert anchor_cfg.trainer.total_training_steps == 20 and anchor_cfg.trainer.v1.trainer_mode == "sync"
    assert anchor_cfg.trainer.experiment_name == "toolagentloop"
    assert anchor_cfg.calcx.report_dir == str(tmp_path / "results" / "anchor")
    from calcx.trainer.run.launch import validate_with_verl

    validate_with_verl(anchor_cfg)

    # status and watch read the anchor's metrics like the others' (no calcx server store: no --calls)
    run = tmp_path / "results" / "anchor"
    steps = [
        {"step": s, "data": {"timing_s/step": 20.0 + s, "timing_s/gen": 5.0, "critic/score/mean": 0.5}} for s in (1, 2)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in steps))
    status = _script(tmp_path, "status", "anchor")
    assert status.returncode == 0, status.stderr
    assert "run anchor:" in status.stdout and "steps logged: 2" in status.stdout
    rows = [line for line in status.stdout.splitlines() if line.startswith("| 2 |")]
    assert rows and rows[0].split("|")[2].strip() == "22.00" and "n/a" in rows[0]
    (tmp_path / "results" / "campaign.pid").write_text("999999999\n")
    (tmp_path / "results" / "campaign.log").write_text("")
    watched = _script(tmp_path, "watch", "1")
    assert "run sync:" in watched.stdout and "run anchor:" in watched.stdout, watched.stdout + watched.stderr
    _started(tmp_path, "tooluse-lr5e-6-joined")  # a tooluse-X run is watched too
    assert "run tooluse-lr5e-6-joined:" in _script(tmp_path, "watch", "1").stdout
    bogus = _script(tmp_path, "campaign", "20", "sync", "bogus")
    assert bogus.returncode == 2 and "mode bogus is not one of: sync async anchor" in bogus.stderr
    malformed = _script(tmp_path, "campaign", "20", "async", "anchor:ten")
    assert malformed.returncode == 2 and "anchor:ten is not MODE[:STEPS[:MAX_S]]" in malformed.stderr
    unknown = _script(tmp_path, "campaign", "20", "tooluse", "tooluse-lr9")  # a tooluse-X needs its run profile
    assert unknown.returncode == 2 and "needs the run profile gsm8k-h200-tooluse-lr9 in calcx.yaml" in unknown.stderr
    assert not (tmp_path / "results" / "machine.txt").exists()  # refused before setup
    known = _script(tmp_path, "campaign", "20", "tooluse", "tooluse-lr5e-6-joined")  # its profile is in calcx.yaml
    assert "campaign:" not in known.stderr, known.stderr
    assert (tmp_path / "results" / "machine.txt").exists()  # on to setup (which has no carried pieces here)
    (tmp_path / "results" / "machine.txt").unlink()
    lost = _script(tmp_path, "campaign", "20", "calculator", env={"HARD_TRAIN": "train-harder.parquet"})
    assert lost.returncode == 2 and "HARD_TRAIN=train-harder.parquet was not carried" in lost.stderr, lost.stderr
    held_out = _script(tmp_path, "campaign", "20", "calculator", env={"HARD_TRAIN": "test-harder.parquet"})
    assert held_out.returncode == 2 and "is not a training split's file name" in held_out.stderr, held_out.stderr
    (tmp_path / "run.argv").unlink(missing_ok=True)
    alone = _script(tmp_path, "start", "calculator", "20", env={"HARD_TRAIN": "train-harder.parquet"})  # no campaign
    assert alone.returncode == 2 and "was not carried" in alone.stderr and not (tmp_path / "run.argv").exists()
    assert not (tmp_path / "results" / "machine.txt").exists()  # refused before setup


@pytest.mark.parametrize("hard_train", [None, "train-harder.parquet", "none"])
def test_a_launched_campaign_hands_each_run_its_overrides_and_the_hard_split(
    tmp_path: Path, hard_train: str | None
) -> None:
    """`CAMPAIGN_OVERRIDES=... launch STEPS calculator`: setup, then the calculator recipe's run with
    the overrides, trained on GSM8K and the hard split HARD_TRAIN names (train-hard by default; none:
    GSM8K alone) and validated on GSM8K and every hard split carried."""
    import hashlib

    _fake_python(tmp_path)
    carried = tmp_path / "in"
    (carried / "gsm8k").mkdir(parents=True)
    for name in ("train", "test", "train-hard", "test-hard", "train-harder", "test-harder"):
        (carried / "gsm8k" / f"{name}.parquet").write_bytes(b"")
    (carried / "model.gguf.00").write_bytes(b"gguf")
    (carried / "SHA256SUMS.model").write_text(f"{hashlib.sha256(b'gguf').hexdigest()}  model.gguf.00\n")
    (tmp_path / "pex.ready").write_text("")
    done = subprocess.run(
        ["bash", str(RUN_SCRIPT), "launch", "20", "calculator"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "WORK": str(tmp_path),
            "PYTHON": str(tmp_path / "python3"),
            "REAL_PYTHON": sys.executable,
            "ARGV_DIR": str(tmp_path),
            "CAMPAIGN_OVERRIDES": "trainer.test_freq=20 trainer.save_freq=-1",
            **({"HARD_TRAIN": hard_train} if hard_train else {}),
        },
    )
    assert done.returncode == 0, done.stderr
    run = tmp_path / "results" / "calculator"
    deadline = time.monotonic() + 60
    while not (run / "ended").exists():
        assert time.monotonic() < deadline, (tmp_path / "results" / "campaign.log").read_text()
        time.sleep(0.2)
    argv = (tmp_path / "run.argv").read_text().splitlines()
    assert argv[-2:] == ["trainer.test_freq=20", "trainer.save_freq=-1"], argv
    cfg = _train_config(argv)
    assert cfg.calcx.run_profile_applied == "gsm8k-h200-calculator" and cfg.trainer.test_freq == 20
    hard = [] if hard_train == "none" else [str(carried / "gsm8k" / (hard_train or "train-hard.parquet"))]
    train_files = cfg.data.train_files  # one file composes as a path, several as a list
    assert ([train_files] if isinstance(train_files, str) else list(train_files)) == [
        str(carried / "gsm8k" / "train.parquet"),
        *hard,
    ]
    assert list(cfg.data.val_files) == [
        str(carried / "gsm8k" / name) for name in ("test.parquet", "test-hard.parquet", "test-harder.parquet")
    ]
    assert (run / "command.txt").read_text().startswith("calcx-gpu.pex train --model ")


def test_the_distilled_recipe_samples_training_problems_and_trains_from_their_warm_up(tmp_path: Path) -> None:
    """`sample`: SAMPLE_PROBLEMS training problems drawn by id (never a validation one), sampled by
    `calcx train --eval-only` under the sample profile, then `calcx runs traces` of its store, a
    failure named in its logs; `start distilled`: RL from the distilled warm-up's model with the
    calculator-bonus settings, on GSM8K and its hard split."""
    import pyarrow.parquet as pq

    from calcx.data.generator import generate_split
    from calcx.data.io import write_parquet

    _fake_python(tmp_path)
    data = tmp_path / "in" / "gsm8k"
    data.mkdir(parents=True)
    train, test = generate_split("train", 12, seed=3), generate_split("test", 4, seed=4)
    write_parquet(train, data / "train.parquet")
    write_parquet(test, data / "test.parquet")
    (data / "train-hard.parquet").write_bytes(b"")
    sample = tmp_path / "results" / "sample"
    # an earlier pass's output: its traces must not pass for this one's, its store is moved aside
    (sample / "services").mkdir(parents=True)
    (sample / "services" / "calcx.db").write_bytes(b"earlier")
    (sample / "traces.parquet").write_bytes(b"earlier")
    done = _script(tmp_path, "sample", env={"SAMPLE_PROBLEMS": "5"})
    assert not (sample / "traces.parquet").exists()
    assert [p.name for p in sample.glob("services.before-*/calcx.db")] == ["calcx.db"]
    # the fake PEX trained nothing, so there is no store to make traces of: the pass fails, and says where
    assert done.returncode != 0 and "sample: exit" in (sample / "train.log").read_text()
    assert "no store file" in (sample / "traces.log").read_text()
    assert (sample / "ended").exists() and (sample / "command.txt").read_text().startswith(
        "calcx-gpu.pex train --eval-only"
    )
    rows = pq.read_table(tmp_path / "sample-rows" / "test.parquet").to_pylist()
    assert len(rows) == 5 and {r["id"] for r in rows} <= {r["id"] for r in train}
    argv = (tmp_path / "run.argv").read_text().splitlines()
    assert argv[:2] == ["train", "--eval-only"]
    cfg = _train_config(argv)
    assert cfg.calcx.run_profile_applied == "gsm8k-h200-sample" and cfg.calcx.agent_prompt == "calculator-first"
    assert cfg.data.val_files == str(tmp_path / "sample-rows" / "test.parquet")
    sampling = cfg.actor_rollout_ref.rollout.val_kwargs
    assert (sampling.do_sample, sampling.temperature, sampling.n) == (True, 0.8, 4)
    # the sessions are told from training by their temperature (calcx.trainer.rollouts.session)
    assert sampling.temperature != cfg.actor_rollout_ref.rollout.temperature

    cfg = _train_config(_started(tmp_path, "distilled"))
    assert cfg.calcx.run_profile_applied == "gsm8k-h200-calculator-bonus"
    assert cfg.actor_rollout_ref.model.path == str(tmp_path / "results" / "distilled-warmup" / "model")
    assert list(cfg.data.train_files) == [str(data / "train.parquet"), str(data / "train-hard.parquet")]


def test_a_campaigns_sample_pass_is_stopped_with_what_it_started_after_its_max_s(tmp_path: Path) -> None:
    """`launch 20 sample:20:MAX_S`: a sample pass still running after MAX_S seconds is stopped, its
    process group with it (the trainer's children too), and marked ended and failed."""
    import hashlib

    from calcx.data.generator import generate_split
    from calcx.data.io import write_parquet

    _fake_python(tmp_path)
    carried = tmp_path / "in"
    (carried / "gsm8k").mkdir(parents=True)
    write_parquet(generate_split("train", 12, seed=3), carried / "gsm8k" / "train.parquet")
    write_parquet(generate_split("test", 4, seed=4), carried / "gsm8k" / "test.parquet")
    (carried / "model.gguf.00").write_bytes(b"gguf")
    (carried / "SHA256SUMS.model").write_text(f"{hashlib.sha256(b'gguf').hexdigest()}  model.gguf.00\n")
    (tmp_path / "pex.ready").write_text("")
    done = _script(tmp_path, "launch", "20", "sample:20:2", env={"SAMPLE_PROBLEMS": "5", "FAKE_SAMPLE_S": "300"})
    assert done.returncode == 0, done.stderr
    try:
        campaign_pid = int((tmp_path / "results" / "campaign.pid").read_text())
        deadline = time.monotonic() + 90
        while alive(campaign_pid):
            assert time.monotonic() < deadline, (tmp_path / "results" / "campaign.log").read_text()
            time.sleep(0.2)
        said = (tmp_path / "results" / "campaign.log").read_text()
        assert "sample still running after 2 s; stopping it" in said and "sample pass failed or was stopped" in said
        assert not alive(int((tmp_path / "train.child").read_text()))
        assert (tmp_path / "results" / "sample" / "ended").exists()
    finally:  # a failure leaves no campaign or pass running
        _script(tmp_path, "stop", "campaign")
        child = tmp_path / "train.child"
        if child.exists() and alive(int(child.read_text())):
            os.kill(int(child.read_text()), signal.SIGKILL)


def test_the_distilled_recipe_warms_up_on_an_earlier_machines_carried_traces(tmp_path: Path) -> None:
    """With gsm8k/distilled-traces.parquet carried in, `distilled` makes no sample pass: the warm-up
    trains on those traces, and a warm-up that saved no model stops the run before RL."""
    import hashlib

    _fake_python(tmp_path)
    carried = tmp_path / "in"
    (carried / "gsm8k").mkdir(parents=True)
    for name in ("train", "test", "train-hard", "distilled-traces"):
        (carried / "gsm8k" / f"{name}.parquet").write_bytes(b"")
    (carried / "model.gguf.00").write_bytes(b"gguf")
    (carried / "SHA256SUMS.model").write_text(f"{hashlib.sha256(b'gguf').hexdigest()}  model.gguf.00\n")
    (tmp_path / "pex.ready").write_text("")
    done = _script(tmp_path, "launch", "20", "distilled")
    assert done.returncode == 0, done.stderr
    log = tmp_path / "results" / "campaign.log"
    deadline = time.monotonic() + 60
    while "$ skipped" not in log.read_text().replace("distilled skipped", "$ skipped"):
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    said = log.read_text()
    assert f"distilled warms up on the carried traces {carried / 'gsm8k' / 'distilled-traces.parquet'}" in said
    assert "the distilled warm-up failed" in said, said
    argv = (tmp_path / "run.argv").read_text().splitlines()
    assert argv[0] == "warmup" and argv[argv.index("--traces") + 1] == str(
        carried / "gsm8k" / "distilled-traces.parquet"
    )
    assert (
        "warmup: no Hugging Face model was saved"
        in (tmp_path / "results" / "distilled-warmup" / "train.log").read_text()
    )
    assert not (tmp_path / "results" / "sample").exists() and not (tmp_path / "results" / "distilled").exists()


def test_a_runs_status_brings_back_its_store_without_token_ids(tmp_path: Path) -> None:
    """`status NAME OUT` packs the server's store with every row and clock but without the token ids
    and log-probs (the bulk of it), and the step tables split the GPU's wait from the store."""
    import sqlite3
    import tarfile

    _fake_python(tmp_path)
    run = ended_run(tmp_path, "sync")
    (run / "metrics.jsonl").write_text(
        "".join(  # step 2, the first after the restart, pays start-up again
            json.dumps({"step": step, "data": {"timing_s/step": 30.0 if step == 2 else 10.0, "timing_s/gen": 4.0}})
            + "\n"
            for step in (1, 2, 3)
        )
    )
    # the run was restarted from step 1's checkpoint: its step 2 paid the start-up again
    (run / "starts.jsonl").write_text('{"first_step": 1}\n{"first_step": 2}\n')
    schema_path = Path("src/python/calcx/server/store/schema.py")
    namespace: dict = {}
    exec(compile(schema_path.read_text(), str(schema_path), "exec"), namespace)
    con = sqlite3.connect(store_path(run))
    con.executescript(namespace["SCHEMA"])
    con.execute(
        "insert into rollouts (rollout_id, spec, state, latest_attempt, created_at) "
        "values ('calcx-train-s1-g-0', '{}', 'SUCCEEDED', 1, 100)"
    )
    con.execute(
        "insert into attempts (rollout_id, attempt_no, state, created_at, finished_at) "
        "values ('calcx-train-s1-g-0', 1, 'SUCCEEDED', 100, 103.5)"
    )
    con.execute(
        "insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
        "response_token_ids, response_logprobs, latency_s, status_code, created_at) "
        "values ('calcx-train-s1-g-0', 1, 0, '{\"messages\": []}', '{}', ?, ?, ?, 2.0, 200, 103)",
        (b"p" * 4096, b"r" * 4096, b"l" * 8192),
    )
    for step, wait in ((2, 3.0), (3, 1.0)):  # one call of 4 - wait s in each later step's 4 s generation
        con.execute(
            f"insert into rollouts (rollout_id, spec, state, latest_attempt, created_at) "
            f"values ('calcx-train-s{step}-g-0', '{{}}', 'SUCCEEDED', 1, {step * 100})"
        )
        con.execute(
            f"insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
            f"response_token_ids, response_logprobs, latency_s, status_code, created_at) "
            f"values ('calcx-train-s{step}-g-0', 1, 0, '{{}}', '{{}}', x'', x'', x'', {4 - wait}, 200, "
            f"{step * 100 + 4})"
        )
    con.commit()
    con.close()
    out = tmp_path / "out"
    status = _script(tmp_path, "status", "sync", str(out))
    assert (
        "GPU idle waiting for agents: mean 10.0% of a step over 1 step after the first and step 2, the first "
        "after a restart (largest 10.0%, step 3)"
    ) in status.stdout, status.stdout
    assert (
        "mean step time after the first, nor the first after a restart: 10.00 s (median 10.00 s over 1 steps)"
        in status.stdout
    ), status.stdout
    assert status.returncode == 0, status.stderr
    waits = [line for line in status.stdout.splitlines() if line.startswith("| 1 | 4.00 |")]
    assert waits == ["| 1 | 4.00 | 2.00 | 1.00 | 0.00 | 0.50 | 0.50 | 20% |"], status.stdout
    with tarfile.open(out / "sync-store.tar.gz") as tar:  # the store apart from the run's other files
        tar.extract("store-slim.db", tmp_path / "back", filter="data")
    slim = sqlite3.connect(tmp_path / "back" / "store-slim.db")
    assert slim.execute(
        "select request, length(prompt_token_ids) + length(response_token_ids) "
        "+ length(response_logprobs), latency_s, created_at from calls order by created_at"
    ).fetchall() == [('{"messages": []}', 0, 2.0, 103.0), ("{}", 0, 1.0, 204.0), ("{}", 0, 3.0, 304.0)]
    assert slim.execute("select count(*) from attempts").fetchone() == (1,)


def test_the_gpu_run_starts_the_tool_use_recipe_from_its_run_profile(tmp_path: Path) -> None:
    _fake_python(tmp_path)
    argv = _started(tmp_path, "tooluse")
    assert argv[argv.index("--profile") + 1] == "gsm8k-h200-tooluse"
    cfg = _train_config(argv)
    assert cfg.calcx.run_profile_applied == "gsm8k-h200-tooluse" and cfg.calcx.reward.tool_bonus == 0.1
    assert cfg.calcx.agent_tool_rounds == 8  # the agent calls the calculator one step at a time
    assert cfg.actor_rollout_ref.model.path.endswith("warmup/model")  # RL from the warm-up's model
    assert cfg.calcx.join_calls is True  # a rollout's calls as one sequence
    # lr 2e-6 (at 5e-6 RL lowered the warm-up's accuracy), the rest of the GSM8K run's settings
    assert (cfg.actor_rollout_ref.actor.optim.lr, cfg.calcx.controller_concurrency) == (2e-6, 128)


def test_a_second_tool_use_run_starts_from_the_same_warm_up_with_its_own_profile(tmp_path: Path) -> None:
    _fake_python(tmp_path)
    argv = _started(tmp_path, "tooluse-lr5e-6-joined")
    assert argv[argv.index("--profile") + 1] == "gsm8k-h200-tooluse-lr5e-6-joined"
    cfg = _train_config(argv)
    assert cfg.actor_rollout_ref.model.path.endswith("warmup/model")
    assert cfg.calcx.report_dir == str(tmp_path / "results" / "tooluse-lr5e-6-joined")
    assert (cfg.actor_rollout_ref.actor.optim.lr, cfg.calcx.join_calls, cfg.calcx.agent_tool_rounds) == (5e-6, True, 8)


def test_a_sync_variant_runs_the_default_recipe_on_its_own_run_profile(tmp_path: Path) -> None:
    """`sync-X` runs the run profile gsm8k-h200-X beside `sync` (`launch 20 sync sync-bypass`), from the
    base model on GSM8K alone; a sync-X without its profile stops the campaign before setup."""
    _fake_python(tmp_path)
    argv = _started(tmp_path, "sync-bypass")
    assert argv[0] == "train" and argv[argv.index("--profile") + 1] == "gsm8k-h200-bypass"
    cfg = _train_config(argv)
    assert cfg.calcx.run_profile_applied == "gsm8k-h200-bypass"
    assert cfg.algorithm.rollout_correction.bypass_mode is True
    assert cfg.calcx.report_dir == str(tmp_path / "results" / "sync-bypass")
    assert str(cfg.data.train_files).endswith("train.parquet") and "hard" not in str(cfg.data.train_files)
    assert not cfg.actor_rollout_ref.model.path.endswith("warmup/model")
    unknown = _script(tmp_path, "campaign", "20", "sync", "sync-bogus")
    assert unknown.returncode == 2 and "needs the run profile gsm8k-h200-bogus in calcx.yaml" in unknown.stderr
    assert not (tmp_path / "results" / "machine.txt").exists()  # refused before setup
    (tmp_path / "results" / "campaign.pid").write_text("999999999\n")
    (tmp_path / "results" / "campaign.log").write_text("")
    assert "run sync-bypass:" in _script(tmp_path, "watch", "1").stdout  # watched like the others
