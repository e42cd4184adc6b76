"""Config composition: verl defaults < calcx.yaml < flags < dotlist, validated by verl itself."""

from __future__ import annotations

import stat

import pytest
from omegaconf import OmegaConf

from calcx.trainer.config.compose import (
    AGENT_LOOPS_FILE,
    ComposeRequest,
    ConfigError,
    choose_gpu_profile,
    compose,
    config_value,
    redacted_yaml,
    run_profile_overrides,
)
from calcx.trainer.run_dir.server_key import key_dir, remove_key_file, server_key, write_key_file


@pytest.fixture(scope="module")
def cfg():
    # a machine without a GPU: calcx.yaml's own settings, no gpu_profiles entry
    return compose(ComposeRequest(gpu_memory_gib=0))


def test_calcx_overrides_land_where_verl_reads_them(cfg) -> None:
    arr = cfg.actor_rollout_ref
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.algorithm.use_kl_in_reward is False
    assert cfg.data.train_batch_size == 32
    # rollout lengths are interpolated by verl from data.*: our values must flow through
    assert arr.rollout.prompt_length == 4096 and arr.rollout.response_length == 2048
    assert arr.rollout.name == "vllm" and arr.rollout.n == 4
    assert arr.rollout.tensor_model_parallel_size == 1
    assert arr.rollout.gpu_memory_utilization == 0.6
    assert dict(arr.rollout.engine_kwargs.vllm) == {
        "enable_auto_tool_choice": True,
        "tool_call_parser": "hermes",
        "distributed_executor_backend": "mp",
    }
    assert arr.rollout.agent.default_agent_loop == "calcx_agent"
    assert arr.rollout.agent.agent_loop_config_path == str(AGENT_LOOPS_FILE)
    assert arr.rollout.agent.agent_loop_manager_class == "calcx.trainer.workers.manager.CalcxAgentLoopManager"
    actor = arr.actor
    assert actor.optim.lr == 1e-6 and actor.ppo_mini_batch_size == 32
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.3)
    assert actor.use_kl_loss is False and actor.entropy_coeff == 0
    assert actor.fsdp_config.param_offload is True and actor.fsdp_config.optimizer_offload is True
    assert arr.model.use_remove_padding is True and arr.model.enable_gradient_checkpointing is True
    assert arr.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
    t = cfg.trainer
    assert (t.n_gpus_per_node, t.nnodes, t.total_epochs, t.save_freq, t.test_freq) == (1, 1, 2, 50, 10)
    assert list(t.logger) == ["console"]
    assert t.use_v1 is True and t.v1.trainer_mode == "sync"
    assert t.v1.sampler.sync_refill_failed_groups is True


def test_verl_validation_accepts_the_composed_config(cfg) -> None:
    from verl.trainer.config import AlgoConfig
    from verl.workers.config import FSDPActorConfig, RolloutConfig

    from calcx.trainer.run.launch import validate_with_verl

    validate_with_verl(cfg)  # raises on any inconsistency verl checks for
    from verl.utils.config import omega_conf_to_dataclass

    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    algo = omega_conf_to_dataclass(cfg.algorithm)
    assert isinstance(actor, FSDPActorConfig) and actor.clip_ratio_high == 0.3
    assert isinstance(rollout, RolloutConfig) and rollout.engine_kwargs["vllm"]["tool_call_parser"] == "hermes"
    assert rollout.agent.default_agent_loop == "calcx_agent"
    assert isinstance(algo, AlgoConfig) and algo.adv_estimator == "grpo"


def test_verl_validation_rejects_a_bad_batch_split() -> None:
    from calcx.trainer.run.launch import validate_with_verl

    bad = compose(ComposeRequest(dotlist=["actor_rollout_ref.actor.ppo_mini_batch_size=64"]))
    with pytest.raises((AssertionError, ValueError)):
        validate_with_verl(bad)  # mini batch larger than the train batch


def test_step_efficiency_defaults_compose_and_validate(cfg) -> None:
    """Packed rows with attention inside each row, token-budgeted micro-batches and chunked
    log-probs are what a user gets without flags (results/runs/2026-12-02-tuned measures them), and verl's
    log-prob passes follow them."""
    from verl.utils.config import omega_conf_to_dataclass

    from calcx.trainer.run.launch import validate_with_verl

    arr = cfg.actor_rollout_ref
    assert arr.model.use_remove_padding is True
    assert arr.model.override_config.attn_implementation == "calcx_varlen"
    assert arr.model.external_lib == "calcx.trainer.workers.packed_attention"
    assert arr.model.use_fused_kernels is True and arr.model.fused_kernel_options.impl_backend == "torch"
    assert arr.actor.use_dynamic_bsz is True and arr.actor.ppo_max_token_len_per_gpu == 8192
    assert arr.rollout.log_prob_use_dynamic_bsz is True and arr.rollout.log_prob_max_token_len_per_gpu == 8192
    assert cfg.data.max_prompt_length + cfg.data.max_response_length <= arr.actor.ppo_max_token_len_per_gpu
    validate_with_verl(cfg)
    actor = omega_conf_to_dataclass(arr.actor)
    assert actor.use_dynamic_bsz is True and actor.ppo_max_token_len_per_gpu == 8192


def test_token_budget_must_hold_the_longest_row() -> None:
    from calcx.trainer.run.launch import validate_with_verl

    short = compose(ComposeRequest(dotlist=["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096"]))
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu \\(4096\\) must hold the longest row.*6144"):
        validate_with_verl(short)
    fixed = compose(
        ComposeRequest(
            dotlist=[
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
                "actor_rollout_ref.actor.use_dynamic_bsz=false",
            ]
        )
    )
    validate_with_verl(fixed)  # fixed micro-batches have no token budget to respect


def test_command_line_wins_over_calcx_and_flags() -> None:
    cfg = compose(
        ComposeRequest(
            model="/models/tiny",
            run_name="r1",
            server_url="http://127.0.0.1:9",
            dotlist=[
                "data.train_batch_size=16",
                "actor_rollout_ref.model.path=/models/other",
                "trainer.logger=[console,wandb]",
                "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs=8",
            ],
        )
    )
    assert cfg.data.train_batch_size == 16
    assert cfg.actor_rollout_ref.model.path == "/models/other"  # dotlist after --model
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    assert cfg.trainer.experiment_name == "r1" and cfg.calcx.server_url == "http://127.0.0.1:9"
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs == 8
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser == "hermes"


def test_unknown_key_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="trainer.total_epoch'"):
        compose(ComposeRequest(dotlist=["trainer.total_epoch=1"]))
    with pytest.raises(ConfigError, match="key=value"):
        compose(ComposeRequest(dotlist=["trainer.total_epochs"]))


def test_agent_tool_rounds_default_to_one_and_are_bounded_at_composition() -> None:
    assert compose(ComposeRequest()).calcx.agent_tool_rounds == 1
    assert compose(ComposeRequest(dotlist=["calcx.agent_tool_rounds=16"])).calcx.agent_tool_rounds == 16
    for bad, message in (("0", "=0 is out of range"), ("17", "=17 is out of range"), ("two", "whole number")):
        with pytest.raises(ConfigError, match=f"calcx.agent_tool_rounds{message}" if "=" in message else message):
            compose(ComposeRequest(dotlist=[f"calcx.agent_tool_rounds={bad}"]))


def test_agent_prompt_defaults_to_plain_and_is_checked_at_composition() -> None:
    assert compose(ComposeRequest()).calcx.agent_prompt == "plain"
    cfg = compose(ComposeRequest(dotlist=["calcx.agent_prompt=calculator-first"]))
    assert cfg.calcx.agent_prompt == "calculator-first"
    with pytest.raises(
        ConfigError,
        match="calcx.agent_prompt must name one of the agent's system messages "
        r"\(plain, calculator-first, calculator-steps\), got 'loud'",
    ):
        compose(ComposeRequest(dotlist=["calcx.agent_prompt=loud"]))


def test_async_sets_verl_v1_colocate_async_knobs() -> None:
    cfg = compose(ComposeRequest(async_mode=True))
    v1 = cfg.trainer.v1
    assert v1.trainer_mode == "colocate_async"
    assert v1.colocate_async.num_warmup_batches == 1
    assert v1.sampler.max_off_policy_threshold == 2 and v1.sampler.max_off_policy_strategy == "drop"
    assert cfg.data.train_batch_size == 32  # calcx values still underneath


SECRET = "s3cret-value-0123456789-abcdefghij"


def test_the_server_key_is_never_in_the_composed_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl prints the resolved config and sends it to wandb/mlflow: the key must not be in it,
    resolved or not; the config names only the owner-only file that holds it."""
    monkeypatch.setenv("CALCX_KEY", SECRET)
    cfg = compose(ComposeRequest())
    for text in (OmegaConf.to_yaml(cfg, resolve=True), OmegaConf.to_yaml(cfg), redacted_yaml(cfg)):
        assert SECRET not in text and "CALCX_KEY" not in text
    assert cfg.calcx.key_file is None and server_key(cfg.calcx) == ""


def test_the_key_file_is_owner_only_and_read_back(tmp_path) -> None:
    path = write_key_file(SECRET)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        cfg = compose(ComposeRequest(dotlist=[f"calcx.key_file={path}"]))
        assert server_key(cfg.calcx) == SECRET and SECRET not in OmegaConf.to_yaml(cfg, resolve=True)
    finally:
        remove_key_file(path)
    assert not path.parent.exists()


def test_a_key_a_user_adds_to_the_config_is_masked_in_printed_config() -> None:
    cfg = compose(ComposeRequest(dotlist=[f"+calcx.key={SECRET}"]))
    text = redacted_yaml(cfg)
    assert SECRET not in text and "key: '***'" in text
    assert OmegaConf.create(text).algorithm.adv_estimator == "grpo"


def test_one_key_of_the_config_is_read_resolved_and_a_secret_stays_masked() -> None:
    cfg = compose(ComposeRequest(dotlist=[f"+calcx.key={SECRET}", "trainer.experiment_name=exp7"]))
    assert config_value(cfg, "calcx.report_dir") == "runs/exp7\n"  # its interpolation resolved
    assert OmegaConf.create(config_value(cfg, "calcx.reward")).tool_bonus == 0.0  # a section as YAML
    assert OmegaConf.create(config_value(cfg, "calcx")).report_dir == "runs/exp7"  # resolved in it too
    assert config_value(cfg, "calcx.key") == "***\n"
    assert SECRET not in config_value(cfg, "calcx")
    with pytest.raises(ConfigError, match="'calcx.nope' is not a key"):
        config_value(cfg, "calcx.nope")


# (GPU memory in GiB as nvidia-smi reports it, the profile it gets, update budget, log-prob budget)
GPU_CASES = [
    (140.4, "large", 16384, 65536),  # H200 141 GB
    (79.6, "medium", 8192, 32768),  # H100 80 GB
    (80.0, "medium", 8192, 32768),  # A100 80 GB
    (23.6, "none", 8192, 8192),  # a 24 GB card keeps calcx.yaml's own settings
]


@pytest.mark.parametrize("memory,profile,update_budget,logprob_budget", GPU_CASES)
def test_gpu_profile_follows_the_gpu_memory(memory, profile, update_budget, logprob_budget) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    from calcx.trainer.run.launch import validate_with_verl

    cfg = compose(ComposeRequest(gpu_memory_gib=memory))
    arr = cfg.actor_rollout_ref
    assert cfg.calcx.gpu_profile == "auto" and cfg.calcx.gpu_profile_applied == profile
    assert arr.actor.ppo_max_token_len_per_gpu == update_budget
    assert arr.rollout.log_prob_max_token_len_per_gpu == logprob_budget
    assert arr.ref.log_prob_max_token_len_per_gpu == logprob_budget
    large_card = profile != "none"
    # a large card holds a micro-batch's activations: nothing recomputed, nothing offloaded
    assert arr.model.enable_gradient_checkpointing is not large_card
    assert arr.actor.fsdp_config.param_offload is not large_card
    assert arr.actor.fsdp_config.optimizer_offload is not large_card
    # the profile changes budgets and memory, never the recipe
    base = compose(ComposeRequest(gpu_memory_gib=0))
    for key in (
        "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.actor.clip_ratio_low",
        "actor_rollout_ref.actor.clip_ratio_high",
        "data.train_batch_size",
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.model.override_config",
        "actor_rollout_ref.model.use_fused_kernels",
    ):
        assert OmegaConf.select(cfg, key) == OmegaConf.select(base, key), key
    validate_with_verl(cfg)
    actor = omega_conf_to_dataclass(arr.actor)
    assert actor.ppo_max_token_len_per_gpu == update_budget


def test_gpu_profile_named_or_turned_off_on_the_command_line() -> None:
    named = compose(ComposeRequest(gpu_memory_gib=0, dotlist=["calcx.gpu_profile=large"]))
    assert named.calcx.gpu_profile_applied == "large"
    assert named.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 16384
    off = compose(ComposeRequest(gpu_memory_gib=140.4, dotlist=["calcx.gpu_profile=none"]))
    assert off.calcx.gpu_profile_applied == "none"
    assert off.actor_rollout_ref.model.enable_gradient_checkpointing is True
    # the command line still wins over the profile it picked
    mine = compose(
        ComposeRequest(gpu_memory_gib=140.4, dotlist=["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576"])
    )
    assert mine.calcx.gpu_profile_applied == "large" and mine.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 24576
    with pytest.raises(ConfigError, match="calcx.gpu_profile='huge': no such profile"):
        compose(ComposeRequest(gpu_memory_gib=0, dotlist=["calcx.gpu_profile=huge"]))


def test_a_gpu_profile_entry_with_a_misspelt_section_is_refused() -> None:
    """A profile whose `overrides` (or `warmup`) is misspelt would otherwise apply nothing, silently."""
    good = {"large": {"min_gib": 120, "overrides": {}, "warmup": {}}, "medium": {"min_gib": 70}}
    assert choose_gpu_profile(good, "auto", 140.0) == "large" and choose_gpu_profile(good, "auto", 80.0) == "medium"
    misspelt: tuple[object, ...] = (
        {"min_gib": 120, "overides": {}},
        {"min_gib": 120, "warmpu": {}},
        {"overrides": {}},
        120,
    )
    for entry in misspelt:
        with pytest.raises(ConfigError, match="gpu_profiles.large: expected a mapping with 'min_gib'"):
            choose_gpu_profile({"large": entry}, "none", 0.0)


# -- run profiles ---------------------------------------------------------------------------------------
# what src/gpu/h200_run.sh passed on the command line (its RUN_ARGS) before calcx.yaml's
# run_profiles held the documented run's settings
H200_RUN_ARGS = {
    "data.train_batch_size": 32,
    "actor_rollout_ref.rollout.n": 4,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.actor.optim.lr": 5e-6,
    "data.max_prompt_length": 2048,
    "data.max_response_length": 1024,
    "actor_rollout_ref.rollout.max_model_len": 4096,
    "calcx.controller_concurrency": 128,
    "trainer.val_before_train": True,
    "trainer.test_freq": 10,
    "trainer.save_freq": -1,
    "trainer.total_epochs": 1,
}


def _without_profile_name(cfg) -> dict:
    data = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(data, dict) and isinstance(data["calcx"], dict)
    data["calcx"].pop("run_profile_applied")
    return data


@pytest.mark.parametrize(
    "profile,extra",
    [
        ("gsm8k-h200", {}),
        ("gsm8k-h200-anchor", {"trainer.test_freq": -1}),  # the script's ANCHOR_ARGS
        (
            "gsm8k-h200-tooluse",
            {"calcx.reward.tool_bonus": 0.1, "calcx.agent_tool_rounds": 8, "actor_rollout_ref.actor.optim.lr": 2e-6},
        ),
        (
            "gsm8k-h200-tooluse-lr5e-6",
            {"calcx.reward.tool_bonus": 0.1, "calcx.agent_tool_rounds": 8, "calcx.join_calls": False},
        ),
        ("gsm8k-h200-tooluse-lr5e-6-joined", {"calcx.reward.tool_bonus": 0.1, "calcx.agent_tool_rounds": 8}),
        # the first run's TOOLUSE_ARGS (one round: no call continues another, so join_calls does nothing)
        ("gsm8k-h200-tooluse-one-round", {"calcx.reward.tool_bonus": 0.1, "calcx.join_calls": False}),
        (
            "gsm8k-h200-calculator",
            {"calcx.reward.tool_bonus": 0.1, "calcx.agent_tool_rounds": 8, "calcx.reward.mask_void_turns": True},
        ),
        (
            "gsm8k-h200-calculator-filtered",
            {
                "calcx.reward.tool_bonus": 0.1,
                "calcx.agent_tool_rounds": 8,
                "calcx.reward.mask_void_turns": True,
                "algorithm.filter_groups.enable": True,
                "algorithm.filter_groups.metric": "reward",
                "algorithm.filter_groups.max_inflight_gen_batches": 2,
            },
        ),
        (
            "gsm8k-h200-calculator-first",
            {
                "calcx.reward.tool_bonus": 0.5,
                "calcx.agent_tool_rounds": 8,
                "calcx.reward.mask_void_turns": True,
                "calcx.agent_prompt": "calculator-first",
            },
        ),
        (
            "gsm8k-h200-graphs128",
            {"actor_rollout_ref.rollout.cudagraph_capture_sizes": [1, 2, 4, *range(8, 129, 8)]},
        ),
        ("gsm8k-h200-uni", {"actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend": "uni"}),
        (
            "gsm8k-h200-calculator-bonus",
            {
                "calcx.reward.tool_bonus": 0.5,
                "calcx.agent_tool_rounds": 8,
                "calcx.reward.mask_void_turns": True,
                "calcx.agent_prompt": "plain",
            },
        ),
        (
            "gsm8k-h200-calculator-bonus-steps",
            {
                "calcx.reward.tool_bonus": 0.5,
                "calcx.reward.tool_bonus_for": "steps",
                "calcx.agent_tool_rounds": 8,
                "calcx.reward.mask_void_turns": True,
            },
        ),
        (
            "gsm8k-h200-calculator-bonus-centred",
            {
                "calcx.reward.tool_bonus": 0.5,
                "calcx.agent_tool_rounds": 8,
                "calcx.reward.mask_void_turns": True,
                "algorithm.norm_adv_by_std_in_grpo": False,
            },
        ),
        (
            "gsm8k-h200-calculator-steps",
            {
                "calcx.reward.tool_bonus": 0.5,
                "calcx.agent_tool_rounds": 8,
                "calcx.reward.mask_void_turns": True,
                "calcx.agent_prompt": "calculator-steps",
            },
        ),
    ],
)
def test_a_run_profile_composes_to_what_the_gpu_script_passed(profile, extra) -> None:
    settings = {**H200_RUN_ARGS, **extra}
    by_profile = compose(ComposeRequest(gpu_memory_gib=140.4, run_profile=profile))
    by_dotlist = compose(ComposeRequest(gpu_memory_gib=140.4, dotlist=[f"{k}={v}" for k, v in settings.items()]))
    assert by_profile.calcx.run_profile_applied == profile and by_dotlist.calcx.run_profile_applied == "none"
    for key, value in settings.items():
        assert OmegaConf.select(by_profile, key) == value, key
    assert _without_profile_name(by_profile) == _without_profile_name(by_dotlist)


def test_the_calculator_recipes_pass_verls_checks() -> None:
    from calcx.trainer.run.launch import validate_with_verl

    for profile in ("gsm8k-h200-calculator", "gsm8k-h200-calculator-filtered", "gsm8k-h200-calculator-bonus-centred"):
        validate_with_verl(compose(ComposeRequest(gpu_memory_gib=140.4, run_profile=profile)))


def test_a_run_profile_wins_over_calcx_yaml_and_loses_to_the_command_line() -> None:
    plain = compose(ComposeRequest(gpu_memory_gib=0))
    assert plain.calcx.run_profile_applied == "none"
    assert (plain.actor_rollout_ref.actor.optim.lr, plain.calcx.controller_concurrency) == (1e-6, 32)
    cfg = compose(
        ComposeRequest(
            gpu_memory_gib=0,
            run_profile="gsm8k-h200-tooluse",
            dotlist=["actor_rollout_ref.actor.optim.lr=3e-6", "calcx.reward.tool_bonus=0.2"],
        )
    )
    assert cfg.actor_rollout_ref.actor.optim.lr == 3e-6 and cfg.calcx.reward.tool_bonus == 0.2
    assert cfg.calcx.controller_concurrency == 128 and cfg.data.max_response_length == 1024
    # over async.yaml and the GPU profile, which it leaves alone where it says nothing
    both = compose(ComposeRequest(gpu_memory_gib=140.4, async_mode=True, run_profile="gsm8k-h200"))
    assert both.calcx.gpu_profile_applied == "large" and both.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 16384
    assert both.trainer.v1.trainer_mode == "colocate_async" and both.data.train_batch_size == 32


def test_an_unknown_run_profile_is_refused_with_the_known_ones() -> None:
    import yaml

    from calcx.trainer.config.compose import CALCX_OVERRIDES

    profiles = yaml.safe_load(CALCX_OVERRIDES.read_text())["run_profiles"]
    with pytest.raises(ConfigError, match="'gsm8k-h100'") as refused:
        compose(ComposeRequest(gpu_memory_gib=0, run_profile="gsm8k-h100"))
    assert str(refused.value).endswith("; known: " + ", ".join(sorted(profiles)))


def test_run_profiles_extend_base_first_and_refuse_a_loop() -> None:
    profiles = {
        "a": {"overrides": {"x": 1}},
        "b": {"extends": "a", "overrides": {"x": 2}},
        "c": {"extends": "d"},
        "d": {"extends": "c"},
        "e": {"extends": "gone"},
    }
    assert run_profile_overrides(profiles, "b") == [{"x": 1}, {"x": 2}]
    with pytest.raises(ConfigError, match="loops"):
        run_profile_overrides(profiles, "c")
    with pytest.raises(ConfigError, match="extends 'gone'"):
        run_profile_overrides(profiles, "e")


def test_both_train_commands_take_profile() -> None:
    from calcx.anchor import cli as anchor_cli
    from calcx.trainer.run import cli as trainer_cli

    calcx_cfg = trainer_cli.compose_from_args(trainer_cli.build_parser().parse_args(["--profile", "gsm8k-h200"]))
    anchor_cfg = anchor_cli.compose_from_args(
        anchor_cli.build_parser().parse_args(["train", "--profile", "gsm8k-h200-anchor"])
    )
    assert (calcx_cfg.calcx.run_profile_applied, anchor_cfg.calcx.run_profile_applied) == (
        "gsm8k-h200",
        "gsm8k-h200-anchor",
    )
    assert (calcx_cfg.trainer.test_freq, anchor_cfg.trainer.test_freq) == (10, -1)
    assert calcx_cfg.actor_rollout_ref.actor.optim.lr == anchor_cfg.actor_rollout_ref.actor.optim.lr == 5e-6


def test_a_runs_key_file_lives_in_its_report_directory_owner_only(tmp_path) -> None:
    report = tmp_path / "runs" / "exp"
    left = write_key_file("left-by-a-killed-run", key_dir(report))  # a run killed before its cleanup
    path = write_key_file(SECRET, key_dir(report))  # the next start of the run
    assert path == left and path.parent == report / ".server-key"
    assert path.read_text() == SECRET
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    remove_key_file(path)
    assert not path.parent.exists() and report.exists()
