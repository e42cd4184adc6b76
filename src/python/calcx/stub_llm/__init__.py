"""The stub LLM: a scripted, deterministic OpenAI-compatible chat server (``calcx stub-llm``)."""
