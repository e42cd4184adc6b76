"""`calcx warmup`: verl's SFT trainer on the agent's tool-use traces (`sft`), with the traces'
dataset as vLLM tokenizes the agent's calls (`dataset`)."""
