"""The composed training config: `compose.py` beside the YAML files it reads (calcx.yaml,
async.yaml, agent_loops.yaml, warmup.yaml) and the packaged chat templates."""
