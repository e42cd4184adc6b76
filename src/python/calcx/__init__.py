"""calcx: train a tool-using math agent with reinforcement learning (Calc-X, verl GRPO)."""

__version__ = "0.1.0"
