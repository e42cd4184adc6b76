"""calcx's agent loop is registered as verl's own are: `@register` at import, under the one name
that composition makes verl's `default_agent_loop`; and verl's AgentLoopWorker, a process that has
not imported calcx, finds it through the packaged `agent_loop_config_path` file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from calcx.trainer.config.compose import AGENT_LOOPS_FILE, CALCX_AGENT_LOOP, ComposeRequest, compose

REPO = Path(__file__).resolve().parents[3]
CLASS = "calcx.trainer.workers.calcx_agent_loop.CalcxAgentLoop"
# what verl's AgentLoopWorker does with the config, in a fresh process as a Ray worker is: import
# verl's agent loops, load `agent_loop_config_path` into the registry (its __init__), then import
# the registered target (`hydra.utils.instantiate` in `_run_agent_loop`)
WORKER_PROBE = """
import json, sys
import hydra
from omegaconf import OmegaConf
import verl.experimental.agent_loop  # verl's own loops, as the worker's module imports them
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.utils.import_utils import resolve_config_path

name, path = sys.argv[1], sys.argv[2]
seen = {"before_config": name in _agent_loop_registry}
for entry in OmegaConf.load(resolve_config_path(path)):
    _agent_loop_registry[entry.name] = entry
target = _agent_loop_registry[name]["_target_"]
cls = hydra.utils.get_class(target)
seen.update(target=target, cls=f"{cls.__module__}.{cls.__qualname__}",
            after_import=dict(_agent_loop_registry[name]),
            loaded="calcx.trainer.workers.calcx_agent_loop" in sys.modules)
print(json.dumps(seen))
"""


def test_importing_the_module_registers_the_loop_with_verl() -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, _agent_loop_registry

    from calcx.trainer.workers.calcx_agent_loop import CalcxAgentLoop

    assert _agent_loop_registry[CALCX_AGENT_LOOP] == {"_target_": CLASS}
    assert issubclass(CalcxAgentLoop, AgentLoopBase)


def test_composition_makes_the_registered_loop_the_default() -> None:
    agent = compose(ComposeRequest(gpu_memory_gib=0)).actor_rollout_ref.rollout.agent
    assert agent.default_agent_loop == CALCX_AGENT_LOOP
    assert agent.agent_loop_config_path == str(AGENT_LOOPS_FILE)


def test_a_fresh_verl_worker_process_finds_the_loop_through_the_config_file() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src" / "python")}
    done = subprocess.run(
        [sys.executable, "-c", WORKER_PROBE, CALCX_AGENT_LOOP, str(AGENT_LOOPS_FILE)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before_config"] is False  # verl's own modules do not know calcx's loop
    assert seen["target"] == seen["cls"] == CLASS and seen["loaded"] is True
    assert seen["after_import"] == {"_target_": CLASS}  # the import ran calcx's @register
