"""Models without a hub: turn a GGUF file into a Hugging Face model directory the trainer loads."""
