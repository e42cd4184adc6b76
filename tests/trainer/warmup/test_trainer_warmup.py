"""`calcx warmup`: verl's own SFT trainer config over `calcx data traces` output, composed and
checked on CPU (no training): verl's config classes accept it, Hydra reads the written file back as
the trainer's `--config-name`, and verl's multi-turn SFT dataset turns a trace into tokens whose
loss covers exactly the agent's own turns."""

from __future__ import annotations

from pathlib import Path

import pytest
from byte_tokenizer import byte_tokenizer
from omegaconf import OmegaConf

from calcx.data.importers import gsm8k_row
from calcx.data.traces import build_traces, write_traces
from calcx.trainer.config.compose import ConfigError
from calcx.trainer.warmup.sft import (
    GPU_PROFILE_KEY,
    SFT_MODULE,
    WarmupRequest,
    compose_warmup,
    main,
    prepare_run,
    warmup_command,
)

ROW = {
    "question": "Ana sold 48 clips in April and half as many in May. How many in all?",
    "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72 clips.\n#### 72",
}


@pytest.fixture()
def traces(tmp_path: Path) -> Path:
    row = gsm8k_row(ROW, file="train.jsonl", stem="train", number=1)
    result = build_traces([row], ["train.jsonl: line 1"])
    assert not result.skipped
    return write_traces(result.traces, tmp_path / "traces.parquet")


def test_config_is_verls_sft_trainer_with_calcx_values(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from verl.utils.config import omega_conf_to_dataclass

    monkeypatch.chdir(tmp_path)
    cfg = compose_warmup(
        WarmupRequest(
            model="Qwen/Qwen2.5-1.5B-Instruct",
            traces=str(traces),
            run_name="w1",
            chat_template="hermes",
            dotlist=["optim.lr=2e-5"],
        )
    )
    assert (cfg.data.messages_key, cfg.data.tools_key, cfg.data.train_files) == ("messages", "tools", str(traces))
    assert cfg.optim.lr == 2e-5 and cfg.trainer.experiment_name == "w1" and cfg.trainer.n_gpus_per_node == 1
    assert list(cfg.checkpoint.save_contents) == ["hf_model"]
    assert cfg.model.override_config.attn_implementation == "calcx_varlen"
    assert cfg.model.external_lib == "calcx.trainer.workers.packed_attention"
    # log-probs from the hidden state in chunks (verl's torch backend), as calcx train's actor
    assert cfg.model.use_fused_kernels is True and cfg.model.fused_kernel_options.impl_backend == "torch"
    assert cfg.data.train_max_samples == -1  # every trace
    assert cfg.model.custom_chat_template.startswith("{#- calcx's Hermes-style")
    for section in ("optim", "engine", "checkpoint"):
        omega_conf_to_dataclass(cfg[section])  # verl's own config classes take the values
    with pytest.raises(ConfigError, match="'optim.learning_rate' is not a key of verl's sft_trainer_engine config"):
        compose_warmup(WarmupRequest(dotlist=["optim.learning_rate=1e-5"]))

    composed, env = prepare_run(cfg)
    assert composed == tmp_path / "runs" / "w1" / "warmup_config.yaml"
    assert env == {"VERL_FILE_LOGGER_PATH": str(tmp_path / "runs" / "w1" / "warmup_metrics.jsonl")}
    assert cfg.trainer.default_local_dir == str(tmp_path / "runs" / "w1" / "checkpoints")
    command = warmup_command(composed, 1, python="/py")
    assert command[:3] == ["/py", "-m", "torch.distributed.run"] and command[command.index("-m", 3) + 1] == SFT_MODULE
    config_path, config_name = command[command.index("--config-path") + 1], command[command.index("--config-name") + 1]
    # what verl's `@hydra.main` will load from those two arguments
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_path, version_base=None):
        loaded = compose(config_name=config_name)
    GlobalHydra.instance().clear()
    assert OmegaConf.to_container(loaded) == OmegaConf.to_container(cfg, resolve=True)

    with pytest.raises(ConfigError, match="does not exist; make it with `calcx data traces`"):
        prepare_run(compose_warmup(WarmupRequest(traces=str(tmp_path / "missing.parquet"))))


def test_the_gpu_profile_of_calcx_train_sets_the_warmups_recomputation(traces: Path) -> None:
    """An H200-sized GPU takes calcx.yaml's `large` profile and its `warmup` settings (no
    recomputation); an 80 GB one or none keeps warmup.yaml's; the command line wins over the profile."""

    def composed(memory: float, *dotlist: str, profile: str = "auto"):  # type: ignore[no-untyped-def]
        return compose_warmup(
            WarmupRequest(traces=str(traces), dotlist=list(dotlist), gpu_profile=profile, gpu_memory_gib=memory)
        )

    h200 = composed(139.8)
    assert h200.model.enable_gradient_checkpointing is False and h200[GPU_PROFILE_KEY] == "large"
    for memory, profile in ((79.6, "medium"), (0.0, "none")):
        cfg = composed(memory)
        assert cfg.model.enable_gradient_checkpointing is True and cfg[GPU_PROFILE_KEY] == profile
    assert composed(139.8, profile="none").model.enable_gradient_checkpointing is True
    assert composed(0.0, profile="large").model.enable_gradient_checkpointing is False
    assert composed(139.8, "model.enable_gradient_checkpointing=true").model.enable_gradient_checkpointing is True
    with pytest.raises(ConfigError, match="--gpu-profile='huge': no such profile"):
        composed(139.8, profile="huge")


def test_without_a_gpu_profile_flag_the_warmup_takes_calcx_yamls_as_calcx_train_does(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import calcx.trainer.config.compose as config

    shipped = config.CALCX_OVERRIDES.read_text(encoding="utf-8")
    assert shipped.count("    gpu_profile: auto\n") == 1

    def with_calcx_yaml(text: str) -> None:
        path = tmp_path / "calcx.yaml"
        path.write_text(text, encoding="utf-8")
        monkeypatch.setattr(config, "CALCX_OVERRIDES", path)

    def composed(memory: float):  # type: ignore[no-untyped-def]
        return compose_warmup(WarmupRequest(traces=str(traces), gpu_memory_gib=memory))

    with_calcx_yaml(shipped)
    assert composed(139.8)[GPU_PROFILE_KEY] == "large"  # auto, by the memory
    with_calcx_yaml(shipped.replace("    gpu_profile: auto\n", "    gpu_profile: none\n"))
    cfg = composed(139.8)
    assert cfg[GPU_PROFILE_KEY] == "none" and cfg.model.enable_gradient_checkpointing is True
    with_calcx_yaml(shipped.replace("    gpu_profile: auto\n", "    gpu_profile: large\n"))
    assert composed(0.0)[GPU_PROFILE_KEY] == "large"
    with_calcx_yaml(shipped.replace("    gpu_profile: auto\n", "    gpu_profile: huge\n"))
    with pytest.raises(ConfigError, match="calcx.yaml calcx.gpu_profile='huge': no such profile"):
        composed(139.8)


def test_a_misspelt_key_in_a_profiles_warmup_says_where_new_keys_go(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import calcx.trainer.config.compose as config

    shipped = config.CALCX_OVERRIDES.read_text(encoding="utf-8")
    right = "    warmup:\n      model:\n        enable_gradient_checkpointing: false\n"
    assert shipped.count(right) == 1
    path = tmp_path / "calcx.yaml"
    path.write_text(shipped.replace(right, right.replace("checkpointing", "chekpointing")), encoding="utf-8")
    monkeypatch.setattr(config, "CALCX_OVERRIDES", path)
    with pytest.raises(ConfigError) as info:
        compose_warmup(WarmupRequest(traces=str(traces), gpu_memory_gib=139.8))
    message = str(info.value)
    assert message.startswith("calcx.yaml gpu_profiles.large.warmup: 'model.enable_gradient_chekpointing' is not a key")
    # a file's value cannot be written `+key=...`; the place for a new key is the warm-up's file
    assert "warmup.yaml's 'additions'" in message and "'+" not in message


def test_verls_sft_trainer_loads_calcxs_dataset_and_trains_the_agents_turns_only(traces: Path) -> None:
    from verl.trainer.sft_trainer import create_sft_dataset

    from calcx.trainer.warmup.dataset import AgentTraceDataset

    cfg = compose_warmup(WarmupRequest(traces=str(traces)))
    tokenizer = byte_tokenizer()
    # verl's own loader, reading data.custom_cls from the composed config
    dataset = create_sft_dataset(str(traces), cfg.data, tokenizer, None, max_samples=cfg.data.train_max_samples)
    assert isinstance(dataset, AgentTraceDataset)
    item = dataset[0]
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    whole = tokenizer.decode(ids)
    assert '"name": "calculate"' in whole and "48+24" in whole  # the tools entry and the calls
    # both calls and the closing turn are trained, each whole from its first token ...
    assert trained.startswith('<tool_call>\n{"name": "calculate", "arguments": {"expression": "48/2"}}')
    assert '{"expression": "48+24"}}' in trained
    assert "In May she sold" in trained and "In all 48+24 = 72 clips.\n\n### ANSWER: 72 ###" in trained
    # ... the tool answers and the question are not
    assert "<tool_response>" not in trained and "Ana sold 48 clips" not in trained and "24.0" not in trained


def test_print_config_needs_no_gpu_and_training_refuses_without_one(traces: Path, capsys) -> None:
    assert main(["--traces", str(traces), "--print-config", "trainer.total_epochs=2"]) == 0
    assert "total_epochs: 2" in capsys.readouterr().out
    import torch

    if torch.cuda.is_available():
        pytest.skip(reason="this machine has a GPU: `calcx warmup` would train")
    assert main(["--traces", str(traces)]) == 3
    assert "no CUDA GPU" in capsys.readouterr().err
