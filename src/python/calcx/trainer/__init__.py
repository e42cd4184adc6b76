"""calcx.trainer: Hydra config over verl 0.9.1, the verl AgentLoop bridge to the calcx server, the run report.

Modules that import verl (agent_loop, manager, launch) are loaded only on the training path.
"""
