"""Training workers, one module per strategy (`fsdp2` here; `megatron` on GPUs)."""
