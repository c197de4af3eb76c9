"""Inference engines: `hf` (transformers forward passes, runs anywhere) and `vllm` (GPU)."""
