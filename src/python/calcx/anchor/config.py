"""The anchor's config: calcx train's composition (verl defaults < calcx.yaml) with
config/anchor.yaml on top, under the same flags and command line, so every setting the two runs
share (batch, samples per prompt, lengths, learning rate, packing, micro-batches, engine) is
calcx train's by construction.

Like calcx.trainer.config.compose, this never imports verl (`--print-config` stays light).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from calcx.trainer.config.compose import ComposeRequest, ConfigError, agent_tool_rounds, compose

CONFIG_DIR = Path(__file__).resolve().parent / "config"
ANCHOR_OVERRIDES = CONFIG_DIR / "anchor.yaml"
TOOLS_FILE = CONFIG_DIR / "tools.yaml"
TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
ASSISTANT_TURNS_KEY = "actor_rollout_ref.rollout.multi_turn.max_assistant_turns"
USER_TURNS_KEY = "actor_rollout_ref.rollout.multi_turn.max_user_turns"


def turn_limits(tool_rounds: int) -> dict[str, int]:
    """verl's ToolAgentLoop limits for an agent of `tool_rounds` rounds: a model call per round and
    one to answer; each round's tool results are one user turn."""
    return {ASSISTANT_TURNS_KEY: tool_rounds + 1, USER_TURNS_KEY: tool_rounds}


def apply_turn_limits(cfg: DictConfig) -> None:
    """Set the turn limits from `calcx.agent_tool_rounds`; one given on the command line must agree
    with it (ConfigError otherwise: the two loops would play different agents)."""
    rounds = agent_tool_rounds(cfg)
    for key, value in turn_limits(rounds).items():
        given = OmegaConf.select(cfg, key)
        if given is None:
            OmegaConf.update(cfg, key, value, merge=False)
        elif given != value:
            raise ConfigError(
                f"{key}={given} disagrees with calcx.agent_tool_rounds={rounds} (which makes it "
                f"{value}); set calcx.agent_tool_rounds instead, so calcx's agent and the anchor "
                "play the same turns"
            )


def compose_anchor(request: ComposeRequest) -> DictConfig:
    """calcx train's config for `request` (sync), then the anchor's overrides; the packaged tool
    config unless the command line names another; the turn limits of calcx's agent."""
    cfg = compose(dataclasses.replace(request, async_mode=False, overlays=[*request.overlays, ANCHOR_OVERRIDES]))
    if OmegaConf.select(cfg, TOOL_CONFIG_KEY) is None:
        OmegaConf.update(cfg, TOOL_CONFIG_KEY, str(TOOLS_FILE), merge=False)
    apply_turn_limits(cfg)
    return cfg
