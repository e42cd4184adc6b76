"""The anchor's config: calcx train's composition (verl defaults < calcx.yaml) with
config/anchor.yaml on top, under the same flags and command line, so every setting the two runs
share (batch, samples per prompt, lengths, learning rate, packing, micro-batches, engine) is
calcx train's by construction.

Like calcx.trainer.config, this never imports verl (`--print-config` stays light).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from calcx.trainer.config import ComposeRequest, compose

CONFIG_DIR = Path(__file__).resolve().parent / "config"
ANCHOR_OVERRIDES = CONFIG_DIR / "anchor.yaml"
TOOLS_FILE = CONFIG_DIR / "tools.yaml"
TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


def compose_anchor(request: ComposeRequest) -> DictConfig:
    """calcx train's config for `request` (sync), then the anchor's overrides; the packaged tool
    config unless the command line names another."""
    cfg = compose(dataclasses.replace(request, async_mode=False, overlays=[*request.overlays, ANCHOR_OVERRIDES]))
    if OmegaConf.select(cfg, TOOL_CONFIG_KEY) is None:
        OmegaConf.update(cfg, TOOL_CONFIG_KEY, str(TOOLS_FILE), merge=False)
    return cfg
