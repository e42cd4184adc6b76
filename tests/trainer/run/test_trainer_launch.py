"""`calcx train`'s launcher: Ray worker environment, chat template, model directory, local services,
and `--eval-only` end to end (server + controller started by the command itself, the stub as model)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from live_stack import eval_only, needs_services, start_stub
from omegaconf import OmegaConf

from calcx.trainer.config.compose import ComposeRequest, ConfigError, compose, resolve_model_path
from calcx.trainer.run.services import CALCX_SRC, ServicesConfig, as_path_list, portable_sys_path

REPO = Path(__file__).resolve().parents[3]


def test_ray_workers_get_calcx_on_their_path_and_the_metrics_file(tmp_path: Path, monkeypatch) -> None:
    from calcx.trainer.run.run_settings import prepare_run

    monkeypatch.setenv("PYTHONPATH", "src/python" + os.pathsep + "/site/trainer")
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)  # prepare_run sets it for verl's driver
    monkeypatch.chdir(REPO)
    rows = [
        {"id": "r1", "source": "gsm8k", "question": "What is 2 + 3?", "chain": "<gadget>2+3</gadget>", "result": "5"}
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(rows[0]) + "\n")
    cfg = compose(
        ComposeRequest(dotlist=["+ray_kwargs.ray_init.runtime_env.env_vars.KEEP=1", f"calcx.report_dir={tmp_path}"])
    )
    settings = prepare_run(cfg, train_src=data, val_src=data)
    settings.apply(cfg)
    metrics = settings.metrics_path
    env = OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env.env_vars)
    assert isinstance(env, dict)  # the container of a DictConfig
    assert env["PYTHONPATH"].split(os.pathsep) == [str(CALCX_SRC), "/site/trainer"]
    assert env["VERL_FILE_LOGGER_PATH"] == str(metrics) and env["KEEP"] == 1
    assert "file" in cfg.trainer.logger and Path(cfg.data.val_files).exists()
    # verl merges this over its defaults the way main_ppo.run_ppo does
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    merged = OmegaConf.merge(get_ppo_ray_runtime_env(cfg), cfg.ray_kwargs.ray_init.runtime_env)
    assert merged.env_vars.PYTHONPATH == env["PYTHONPATH"] and "TOKENIZERS_PARALLELISM" in merged.env_vars


def test_chat_template_goes_to_vllm_and_to_verl_tokenizer() -> None:
    cfg = compose(ComposeRequest(chat_template="hermes"))
    path = Path(cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.chat_template)
    assert path.is_absolute() and path.name == "hermes_tool_chat.jinja"
    assert cfg.actor_rollout_ref.model.custom_chat_template == path.read_text()
    from verl.utils.config import omega_conf_to_dataclass

    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # verl still accepts the rollout section
    assert compose(ComposeRequest()).actor_rollout_ref.model.custom_chat_template is None
    with pytest.raises(ConfigError, match="no such file"):
        compose(ComposeRequest(chat_template="/nonexistent/t.jinja"))


def test_model_may_be_a_local_directory_or_a_hub_id(tmp_path: Path, monkeypatch) -> None:
    assert resolve_model_path("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    model = tmp_path / "smollm2"
    model.mkdir()
    with pytest.raises(ConfigError, match="config.json"):
        resolve_model_path(str(model))
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("./smollm2") == str(model)
    with pytest.raises(ConfigError, match="no such directory"):
        resolve_model_path("./missing-model")


def test_interpreter_paths_and_agent_path_settings() -> None:
    path = portable_sys_path()
    assert path[0] == str(CALCX_SRC) and not any("site-packages" in p for p in path)
    assert as_path_list("a" + os.pathsep + "/b", what="x") == [str(Path("a").resolve()), "/b"]
    with pytest.raises(ValueError, match="empty"):
        as_path_list([], what="calcx.agent_pythonpath")
    cfg = OmegaConf.create({"services_python": "/nonexistent/python3"})
    with pytest.raises(ValueError, match="calcx.services_python"):
        ServicesConfig.from_calcx_section(cfg, Path("/tmp/x"))


def test_the_controller_hands_its_agents_the_configured_tool_rounds_and_prompt() -> None:
    assert ServicesConfig.from_calcx_section(OmegaConf.create({}), Path("/tmp/x")).agent_settings() == {
        "CALCX_AGENT_TOOL_ROUNDS": "1",
        "CALCX_AGENT_PROMPT": "plain",
    }
    three = ServicesConfig.from_calcx_section(
        OmegaConf.create({"agent_tool_rounds": 3, "agent_prompt": "calculator-first"}), Path("/tmp/x")
    )
    assert three.tool_rounds == 3 and three.agent_settings() == {
        "CALCX_AGENT_TOOL_ROUNDS": "3",
        "CALCX_AGENT_PROMPT": "calculator-first",
    }
    for bad in (0, 17, "many", 2.5):
        with pytest.raises(ValueError, match="calcx.agent_tool_rounds"):
            ServicesConfig.from_calcx_section(OmegaConf.create({"agent_tool_rounds": bad}), Path("/tmp/x"))
    with pytest.raises(ValueError, match="calcx.agent_prompt must name one of"):
        ServicesConfig.from_calcx_section(OmegaConf.create({"agent_prompt": "terse"}), Path("/tmp/x"))


def test_the_started_server_gets_the_runs_ceiling_and_tool_call_parser() -> None:
    # (the server accepting these flags is checked by the eval-only test below, which starts one)
    from calcx.trainer.run.launch import server_args

    cfg = compose(ComposeRequest(gpu_memory_gib=0))
    ceiling = str(int(cfg.actor_rollout_ref.rollout.response_length))
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser == "hermes"
    assert server_args(cfg, ["--lease-s", "9"]) == [
        "--lease-s",
        "9",
        "--max-tokens-ceiling",
        ceiling,
        "--tool-call-parser",
        "hermes",
    ]
    mine = ["--tool-call-parser", "other", "--max-tokens-ceiling", "7"]
    assert server_args(cfg, mine) == mine  # calcx.server_args win
    cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser = None
    assert server_args(cfg, []) == ["--max-tokens-ceiling", ceiling]


def _port_open(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].split(":") if "//" not in url else url.split("//")[1].split(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port.split("/")[0]))) == 0


@needs_services
@pytest.mark.timeout(300)
def test_eval_only_starts_and_ends_its_own_services(tmp_path: Path) -> None:
    from calcx.data.generator import generate_split

    rows = generate_split("test", 3, seed=5)
    rows[2] = {**rows[2], "question": "[stub:wrong] " + rows[2]["question"]}
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(x) + "\n" for x in rows))
    stub, url = start_stub(tmp_path, rows)
    try:
        done = eval_only(tmp_path, url, val)
    finally:
        stub.stop()
    report = tmp_path / "run"
    assert done.returncode == 0, done.stderr[-3000:]
    table = (report / "eval.md").read_text()
    assert "| **all** | 3 | 2 | 66.7% |" in table and "Validation step 0: 3 scored" in table
    assert (report / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert (report / "services" / "calcx.db").exists()
    server_out = (report / "services" / "server.out").read_text()
    url = server_out.split("listening on ")[1].split()[0]
    assert not _port_open(url)  # the server it started is gone
    assert "calcx-run-" not in done.stdout + done.stderr  # the run's key is never printed
    for path in report.rglob("*"):  # nor written: config, logs, report, metrics, the database
        assert not path.is_file() or b"calcx-run-" not in path.read_bytes(), path
