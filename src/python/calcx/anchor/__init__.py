"""The step-time anchor: verl 0.9.1's own ToolAgentLoop on calcx's problems, model and limits.

The calculator is the MCP calculator's own code in one child process (no server, gateway,
controller or agent process) and calcx's reward scores the answers, so a step of `calcx anchor
train` costs what verl's tool loop costs and calcx's step time can be read as a ratio to it
(docs/anchor.md).
"""
