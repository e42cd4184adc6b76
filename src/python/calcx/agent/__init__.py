"""The Calc-X agent: AutoGen AssistantAgent + MCP calculator, scored by :mod:`calcx.agent.reward`.

Importing this package is cheap; AutoGen is imported only when a rollout runs.
"""
