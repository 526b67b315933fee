"""ufp4-megatron."""
